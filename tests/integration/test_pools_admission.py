"""Admission into node pools on the real apiserver, black box with the session's reconciler
(docs/pools.md):

* two pools from two ElasticQuotaProfiles over nodes made through the API; a quota falling back
  between them (``koord-queue/pool-quotas``) fills the first pool up to its pool quota's cap, then
  the second, up to its own cap across both; each admission records ``status.pool`` and
  ``status.poolQuota``, ``kubectl get queueunit -o wide`` prints the pool, and the unit left
  waiting names both pools and why;
* a quota inside one pool's tree admits no more than the pool's nodes hold (its root's ``min``);
* a namespace user (``edit``) cannot write a unit's pool (the status subresource), cannot move an
  admitted unit by re-annotating it, and cannot reach a pool its quota does not list.

Bare QueueUnits: no job extension handles their kind, so nothing is released; placement at release
is proved in tests/integration/test_pool_placement.py and end to end in tests/e2e/test_pools.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_cli import plugin
from tests.integration.test_profiles import GPU, GROUP, PLURAL, VERSION, Nodes, profile_body
from tests.integration.test_profiles import nodes as nodes  # the fixture: nodes made for one test
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
ALICE = "alice"


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    tenancy.grant(integration_cluster, namespace_in, ALICE)
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


def gpu_unit(name: str, quota: str, gpus: str = "2", *, pools: str | None = None) -> Obj:
    body = s.unit(name, quota=quota)
    container = body["spec"]["podSet"][0]["template"]["spec"]["containers"][0]
    container["resources"]["requests"] = {"cpu": "1", GPU: gpus}
    body["spec"]["resource"] = body["spec"]["request"] = {"cpu": "1", GPU: gpus}
    if pools is not None:
        body["metadata"]["annotations"] = {names.POOLS_ANNOTATION: pools}
    return body


async def make_pool(sc: Scenario, nodes: Nodes, suffix: str, gpus: str) -> tuple[str, str]:
    """A pool of one node with ``gpus`` GPUs; returns (pool name, root quota name) once the root
    quota is sized and the scheduler knows the pool."""
    pool, root = sc.name(suffix), sc.name(f"{suffix}-root")
    label = f"{sc.ns}-{suffix}"
    nodes.add(
        f"{label}-node",
        {"cpu": "32", "memory": "128Gi", GPU: gpus, "pods": "110"},
        labels={"pool-test": label},
    )
    body = profile_body(pool, root, label, ratio=None)
    await sc.objects.create_namespaced_custom_object(GROUP, VERSION, sc.ns, PLURAL, body)

    async def sized() -> bool:
        found = await sc.objects.list_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, sc.ns, names.QUOTA_PLURAL
        )
        return any(
            q["metadata"]["name"] == root and (q["spec"].get("min") or {}).get(GPU) == gpus
            for q in found["items"]
        )

    await kube.eventually(sized, timeout=30, what=f"root quota {root} sized to {gpus} GPUs")
    await sc.wait_queue(root)
    return pool, root


def child(name: str, parent: str, gpus: str, annotations: dict[str, str] | None = None) -> Obj:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    return s.quota(name, resources={"cpu": "64", GPU: gpus}, labels=labels, annotations=annotations)


async def test_fallback_fills_pools_in_order_within_each_cap_and_names_the_pools_it_tried(
    sc: Scenario, nodes: Nodes
) -> None:
    h100, h100_root = await make_pool(sc, nodes, "h100", "8")
    a100, a100_root = await make_pool(sc, nodes, "a100", "8")
    team_h, team_a, team = sc.name("team-h"), sc.name("team-a"), sc.name("team")
    await sc.create_quota(child(team_h, h100_root, "4"))
    await sc.create_quota(child(team_a, a100_root, "8"))
    await sc.create_quota(child(team, "", "8", {names.POOL_QUOTAS_ANNOTATION: f"{team_h}, {team_a}"}))
    made = [f"{team}-{i}" for i in range(5)]
    for name in made:
        await sc.create_unit(gpu_unit(name, team))
        await sc.wait_unit(name, lambda u: bool(s.phase(u)) or bool(s.message(u)), what="decided")
    where = {}
    for name in made[:4]:
        unit = await sc.wait_phase(name)
        where[name] = (unit["status"].get("pool"), unit["status"].get("poolQuota"))
    assert where == {
        made[0]: (h100, team_h),
        made[1]: (h100, team_h),
        made[2]: (a100, team_a),
        made[3]: (a100, team_a),
    }
    waiting = await sc.wait_message(made[4], f"pool {h100}: ")
    text = s.message(waiting)
    assert f"; pool {a100}: " in text and f"limited quotaName:{team}" in text
    wide = sc.kubectl("get", "queueunit", made[0], "-n", sc.ns, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    assert "POOL" in header.split() and h100 in row.split()
    # the plugin: the pool of an admitted unit, each pool tried for a waiting one
    shown = plugin(sc.cluster, "explain", made[0], "-n", sc.ns)
    assert shown.returncode == 0, shown.stderr
    assert f"pool {h100} (through quota {team_h})" in shown.stdout
    shown = plugin(sc.cluster, "explain", made[4], "-n", sc.ns)
    assert shown.returncode == 0, shown.stderr
    assert f"1. pool {h100}: " in shown.stdout and f"2. pool {a100}: " in shown.stdout
    tree = plugin(sc.cluster, "quotas", "--tree", "-A")
    assert tree.returncode == 0, tree.stderr
    lines = [line.split() for line in tree.stdout.splitlines()]
    assert any(team_h in words and h100 in words for words in lines), tree.stdout
    assert any(team_a in words and a100 in words for words in lines), tree.stdout


async def test_a_quota_inside_a_pool_admits_what_the_pools_nodes_hold(sc: Scenario, nodes: Nodes) -> None:
    pool, root = await make_pool(sc, nodes, "l4", "4")
    inside = sc.name("inside")
    await sc.create_quota(child(inside, root, "16"))
    made = [f"{inside}-{i}" for i in range(3)]
    for name in made:
        await sc.create_unit(gpu_unit(name, inside))
    for name in made[:2]:
        assert (await sc.wait_phase(name))["status"].get("pool") == pool
    await sc.wait_message(made[2], f"limited quotaName:{root}")


async def test_a_namespace_user_can_neither_write_nor_move_nor_widen_a_units_pool(
    sc: Scenario, nodes: Nodes
) -> None:
    h100, h100_root = await make_pool(sc, nodes, "h1", "8")
    a100, a100_root = await make_pool(sc, nodes, "a1", "8")
    team_h, team_a, team = sc.name("th"), sc.name("ta"), sc.name("tm")
    await sc.create_quota(child(team_h, h100_root, "8"))
    await sc.create_quota(child(team_a, a100_root, "8"))
    await sc.create_quota(child(team, "", "16", {names.POOL_QUOTAS_ANNOTATION: team_h}))
    first = f"{team}-first"
    await sc.create_unit(gpu_unit(first, team))
    assert (await sc.wait_phase(first))["status"].get("pool") == h100

    # her own write of the pool: the status subresource is not hers
    patch = json.dumps({"status": {"pool": a100, "poolQuota": team_a}})
    done = tenancy.as_user(
        sc.cluster,
        ALICE,
        "-n",
        sc.ns,
        "patch",
        "queueunit",
        first,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    )
    assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
    # nor re-annotate the unit to another pool (a job's annotation only orders a new admission)
    done = tenancy.as_user(
        sc.cluster,
        ALICE,
        "-n",
        sc.ns,
        "annotate",
        "queueunit",
        first,
        f"{names.POOLS_ANNOTATION}={a100}",
        "--overwrite",
    )
    assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
    # a pool her quota does not list is never reached, whatever the job says
    wanted = f"{team}-wants-a100"
    await sc.create_unit(gpu_unit(wanted, team, pools=a100))
    await sc.wait_message(wanted, f"none of the job's pools ({a100}) is one its quota {team} admits to")
    assert s.phase(await sc.get_unit(wanted)) in s.WAITING
    assert (await sc.get_unit(first))["status"].get("pool") == h100

"""Node pools' root quotas on the real apiserver (docs/pools.md#the-tree-of-a-pool), black box with the
session's reconciler running as its ServiceAccount (RBAC and admission policies of ``manifests/``):

* a profile's root quota appears with Koordinator's labels, ``min`` (the matching nodes'
  allocatable times ``resourceRatio``, over the profile's resource keys), the unbounded ``max`` and
  the two annotations; the profile gets its tree id;
* the root follows its nodes as one joins, one's allocatable changes, one is cordoned and one is
  deleted, and an admin's edit of its ``min`` is put back, while labels others add stay;
* a second profile of the same name in another namespace is ignored with a Warning;
* the reconciler's identity may create and size a root quota only (policy
  ``koord-queue-reconciler-quota-writes``);
* a namespace user (``edit``) can neither create nor change ElasticQuotaProfiles or Nodes.

Nodes are made through the API (no kubelet here): their ``status`` is written through the status
subresource, Ready included; nothing else changes them. Each test's nodes carry a label of its own,
so only its profile selects them.
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from koord_queue.shared.core import profiles
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
GROUP, VERSION, PLURAL = profiles.PROFILE_GROUP, profiles.PROFILE_VERSION, profiles.PROFILE_PLURAL
UNBOUNDED = "4611686018427387"
MERGE = "application/merge-patch+json"


class Nodes:
    """Nodes made through the API for one test, deleted afterwards."""

    def __init__(self, cluster: LocalCluster, label: str) -> None:
        self.cluster = cluster
        self.label = label
        self.made: list[str] = []

    def add(
        self,
        name: str,
        allocatable: dict[str, str],
        *,
        taints: list[Obj] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {"pool-test": self.label}},
            "spec": {"taints": taints or []},
        }
        self.cluster.request("POST", "/api/v1/nodes", body)
        self.made.append(name)
        self.status(name, allocatable)

    def status(self, name: str, allocatable: dict[str, str], *, ready: str = "True") -> None:
        status = {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "KubeletReady" if ready == "True" else "KubeletNotReady",
                    "message": "set by the test",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
        self.cluster.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, content_type=MERGE)

    def patch(self, name: str, patch: Obj) -> None:
        self.cluster.request("PATCH", f"/api/v1/nodes/{name}", patch, content_type=MERGE)

    def delete(self, name: str) -> None:
        try:
            self.cluster.request("DELETE", f"/api/v1/nodes/{name}")
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


@pytest.fixture
def nodes(integration_cluster: LocalCluster, namespace_in: str) -> Iterator[Nodes]:
    made = Nodes(integration_cluster, namespace_in)
    try:
        yield made
    finally:
        for name in made.made:
            made.delete(name)


def profile_body(name: str, quota: str, label: str, *, ratio: str | None = "0.5") -> Obj:
    spec: Obj = {"quotaName": quota, "nodeSelector": {"matchLabels": {"pool-test": label}}}
    if ratio is not None:
        spec["resourceRatio"] = ratio
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": profiles.PROFILE_KIND,
        "metadata": {
            "name": name,
            "annotations": {profiles.RESOURCE_KEYS_ANNOTATION: json.dumps(["cpu", "memory", GPU])},
        },
        "spec": spec,
    }


async def get_quota(sc: Scenario, name: str, namespace: str | None = None) -> Obj | None:
    try:
        found: Obj = await sc.objects.get_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, namespace or sc.ns, names.QUOTA_PLURAL, name
        )
    except Exception as err:  # 404 while it does not exist yet
        if getattr(err, "status", None) == 404:
            return None
        raise
    return found


async def root_shows(
    sc: Scenario, quota: str, want_min: dict[str, str], unschedulable: Obj, what: str
) -> Obj:
    """Poll until the root quota's min and unschedulable annotation are these (by value)."""

    async def probe() -> Obj | None:
        got = await get_quota(sc, quota)
        if got is None:
            return None
        notes = got["metadata"].get("annotations") or {}
        shown = json.loads(notes.get(profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION, "null"))
        if got["spec"].get("min") == want_min and shown == unschedulable:
            return got
        return None

    result: Obj = await kube.eventually(probe, timeout=30, what=f"root quota {quota}: {what}")
    return result


async def test_the_root_quota_is_kept_sized_to_the_pools_nodes(sc: Scenario, nodes: Nodes) -> None:
    pool, quota = sc.name("pool"), sc.name("root")
    nodes.add(f"{sc.ns}-a", {"cpu": "8", "memory": "32Gi", GPU: "8", "pods": "110"})
    nodes.add(
        f"{sc.ns}-b",
        {"cpu": "4", "memory": "16Gi", GPU: "4"},
        taints=[{"key": "gpu", "value": "h100", "effect": "NoSchedule"}],
    )
    nodes.add(f"{sc.ns}-elsewhere", {"cpu": "64", GPU: "64"}, labels={"pool-test": "another"})
    await sc.objects.create_namespaced_custom_object(
        GROUP, VERSION, sc.ns, PLURAL, profile_body(pool, quota, sc.ns)
    )

    # 12 cpu, 48Gi, 12 GPUs, times 0.5
    root = await root_shows(sc, quota, {"cpu": "6", "memory": "24Gi", GPU: "6"}, {}, "created")
    tree = profiles.tree_id(sc.ns, pool)
    assert root["metadata"]["labels"] == {
        names.QUOTA_PROFILE_LABEL: pool,
        names.QUOTA_TREE_ID_LABEL: tree,
        names.QUOTA_IS_ROOT_LABEL: "true",
    }
    assert root["spec"]["max"] == {"cpu": UNBOUNDED, "memory": UNBOUNDED, GPU: UNBOUNDED}
    total = json.loads(root["metadata"]["annotations"][profiles.TOTAL_RESOURCE_ANNOTATION])
    assert total == {"cpu": "6", "memory": "24Gi", GPU: "6", "pods": "55"}
    got = await sc.objects.get_namespaced_custom_object(GROUP, VERSION, sc.ns, PLURAL, pool)
    assert got["metadata"]["labels"][names.QUOTA_TREE_ID_LABEL] == tree

    # Labels others add are kept through every update below.
    sc.kubectl("label", "-n", sc.ns, "elasticquota", quota, "team=ml")
    # A node joins (3 GPUs: 15 x 0.5 rounds down to 7).
    nodes.add(f"{sc.ns}-c", {"cpu": "2", "memory": "8Gi", GPU: "3"})
    await root_shows(sc, quota, {"cpu": "7", "memory": "28Gi", GPU: "7"}, {}, "a node joined")
    # A node's allocatable changes.
    nodes.status(f"{sc.ns}-a", {"cpu": "8", "memory": "32Gi", GPU: "5"})
    await root_shows(sc, quota, {"cpu": "7", "memory": "28Gi", GPU: "6"}, {}, "a node's allocatable changed")
    # A node is cordoned: still in min, and reported unschedulable; then one stops being Ready.
    nodes.patch(f"{sc.ns}-b", {"spec": {"unschedulable": True}})
    cordoned = {"cpu": "2", "memory": "8Gi", GPU: "2"}
    await root_shows(sc, quota, {"cpu": "7", "memory": "28Gi", GPU: "6"}, cordoned, "a node was cordoned")
    nodes.status(f"{sc.ns}-c", {"cpu": "2", "memory": "8Gi", GPU: "3"}, ready="False")
    both = {"cpu": "3", "memory": "12Gi", GPU: "3"}  # 2+1 cpu, 8+4Gi, (4+3) x 0.5 = 3
    await root_shows(sc, quota, {"cpu": "7", "memory": "28Gi", GPU: "6"}, both, "a node is not Ready")
    # A node is deleted (9 GPUs: 4).
    nodes.delete(f"{sc.ns}-c")
    await root_shows(sc, quota, {"cpu": "6", "memory": "24Gi", GPU: "4"}, cordoned, "a node was deleted")
    # An admin's edit of min is put back.
    sc.kubectl(
        "patch", "-n", sc.ns, "elasticquota", quota, "--type=merge", "-p", '{"spec":{"min":{"cpu":"100"}}}'
    )
    root = await root_shows(sc, quota, {"cpu": "6", "memory": "24Gi", GPU: "4"}, cordoned, "min put back")
    assert root["metadata"]["labels"]["team"] == "ml"

    out = sc.kubectl("get", "eqp", "-n", sc.ns).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "QUOTA", "RATIO", "AGE"], out
    assert row.split()[:3] == [pool, quota, "0.5"], out


async def test_a_second_profile_of_the_same_name_is_ignored_with_a_warning(
    sc: Scenario, nodes: Nodes, integration_cluster: LocalCluster
) -> None:
    pool = sc.name("pool")
    nodes.add(f"{sc.ns}-a", {"cpu": "4", "memory": "8Gi"})
    await sc.objects.create_namespaced_custom_object(
        GROUP, VERSION, sc.ns, PLURAL, profile_body(pool, sc.name("root"), sc.ns, ratio=None)
    )
    await root_shows(
        sc, sc.name("root"), {"cpu": "4", "memory": "8Gi", GPU: "0"}, {}, "the first profile's root"
    )
    other = f"{sc.ns}-x"
    async with kube.client(integration_cluster) as api:
        await kube.create_namespace(api, other)
        try:
            body = profile_body(pool, sc.name("other-root"), sc.ns)
            await sc.objects.create_namespaced_custom_object(GROUP, VERSION, other, PLURAL, body)
            event = await sc.wait_event(
                pool,
                profiles.DUPLICATE_PROFILE_REASON,
                type_="Warning",
                namespace=other,
                kind=profiles.PROFILE_KIND,
            )
            assert f"{sc.ns}/{pool}" in event.message and "older" in event.message
            assert await get_quota(sc, sc.name("other-root"), other) is None
        finally:
            await kube.delete_namespace(api, other)


async def test_the_reconciler_may_create_and_size_a_pools_root_only(sc: Scenario) -> None:
    """The quota-writes policy's exception for roots, and its limits there."""
    root_labels = {
        names.QUOTA_PROFILE_LABEL: "p",
        names.QUOTA_TREE_ID_LABEL: "1",
        names.QUOTA_IS_ROOT_LABEL: "true",
    }

    def as_reconciler(*args: str, body: Obj | None = None) -> Any:
        return sc.kubectl(
            f"--as={system.RECONCILER_USER}",
            "-n",
            sc.ns,
            *args,
            input_text=None if body is None else yaml.safe_dump(body),
            check=False,
        )

    def quota(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> Obj:
        return {
            "apiVersion": names.QUOTA_API_VERSION,
            "kind": "ElasticQuota",
            "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
            "spec": {"min": {"cpu": "1"}, "max": {"cpu": UNBOUNDED}},
        }

    plain, root = sc.name("plain"), sc.name("root")

    async def refused_plain() -> bool:
        done = as_reconciler("create", "-f", "-", body=quota(plain, {}))
        assert done.returncode != 0 and "root quota" in done.stderr, done.stderr
        return True

    await kube.eventually(refused_plain, what="the reconciler refused a quota that is no root")
    done = as_reconciler("create", "-f", "-", body=quota(root, root_labels, {"note": "x"}))
    assert done.returncode != 0, "a root carrying another annotation was created"
    done = as_reconciler("create", "-f", "-", body=quota(root, root_labels))
    assert done.returncode == 0, done.stderr

    def patch(p: Obj) -> Any:
        return as_reconciler("patch", "elasticquota", root, "--type=merge", "-p", json.dumps(p))

    sc.kubectl("annotate", "-n", sc.ns, "elasticquota", root, "admin-note=keep")
    sc.kubectl("label", "-n", sc.ns, "elasticquota", root, "team=ml")
    allowed = {
        "spec": {"min": {"cpu": "2"}},
        "metadata": {
            "labels": {names.QUOTA_PROFILE_LABEL: "q"},
            "annotations": {profiles.TOTAL_RESOURCE_ANNOTATION: '{"cpu":"4"}'},
        },
    }
    assert patch(allowed).returncode == 0
    for refused in (
        {"metadata": {"labels": {"team": None}}},
        {"metadata": {"annotations": {"admin-note": "changed"}}},
        {"metadata": {"annotations": {"new-note": "x"}}},
        {"metadata": {"labels": {names.QUOTA_IS_ROOT_LABEL: "false"}}, "spec": {"min": {"cpu": "3"}}},
    ):
        done = patch(refused)
        assert done.returncode != 0 and "root quota" in done.stderr, (refused, done.stderr)
    got = await get_quota(sc, root)
    assert got is not None and got["spec"]["min"] == {"cpu": "2"}
    assert got["metadata"]["labels"]["team"] == "ml"
    assert as_reconciler("delete", "elasticquota", root).returncode != 0


async def test_a_namespace_user_can_change_neither_profiles_nor_nodes(sc: Scenario, nodes: Nodes) -> None:
    tenancy.grant(sc.cluster, sc.ns)
    # Her rights are loaded (she can create a ConfigMap), so what follows is refused by RBAC itself.
    await tenancy.create_as(
        sc.cluster, sc.ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hers"}}
    )
    pool = sc.name("pool")
    nodes.add(f"{sc.ns}-a", {"cpu": "4", "memory": "8Gi"})
    await sc.objects.create_namespaced_custom_object(
        GROUP, VERSION, sc.ns, PLURAL, profile_body(pool, sc.name("root"), sc.ns)
    )
    mine = profile_body(sc.name("mine"), sc.name("mine-root"), sc.ns)
    attempts = {
        "create a profile": ("-n", sc.ns, "create", "-f", "-"),
        "widen a profile": (
            "-n",
            sc.ns,
            "patch",
            "eqp",
            pool,
            "--type=merge",
            "-p",
            '{"spec":{"nodeSelector":{}}}',
        ),
        "raise a ratio": (
            "-n",
            sc.ns,
            "patch",
            "eqp",
            pool,
            "--type=merge",
            "-p",
            '{"spec":{"resourceRatio":"1"}}',
        ),
        "delete a profile": ("-n", sc.ns, "delete", "eqp", pool),
        "label a node into a pool": ("label", "node", f"{sc.ns}-a", "pool-test=elsewhere", "--overwrite"),
        "cordon a node": ("cordon", f"{sc.ns}-a"),
        "create a node": ("create", "-f", "-"),
    }
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{sc.ns}-hers"}}
    for what, args in attempts.items():
        body = mine if what == "create a profile" else node if what == "create a node" else None
        done = tenancy.as_user(
            sc.cluster, tenancy.ALICE, *args, input_text=None if body is None else yaml.safe_dump(body)
        )
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (what, done.stderr)
    got = await sc.objects.get_namespaced_custom_object(GROUP, VERSION, sc.ns, PLURAL, pool)
    assert got["spec"]["nodeSelector"] == {"matchLabels": {"pool-test": sc.ns}}
    assert got["spec"]["resourceRatio"] == "0.5"

"""A pod released for a pool carries the pool's placement, written with the gate's removal in one
write the real kube-apiserver accepts for a gated pod, and keeps it: a namespace user cannot move a
released pod off its pool (docs/pools.md#placement).

The release is ``reconciler.job_pods.ungate`` itself, acting as the reconciler's ServiceAccount
(impersonated, with the RBAC and admission policies of ``manifests/`` that the running system
installs) on the pod as the pod informer keeps it (``job_pods.slim_pod``). ``alice`` holds only a
namespace user's rights (``tests/tenancy.py``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from koord_queue.reconciler import job_pods
from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement, Requirement
from koord_queue.shared.jobs import podplan
from testenv import system
from tests import kube, tenancy
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu.product"
AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
TOLERATION = {"key": "koord-queue.io/pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}
ZONES = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
POOL = PoolPlacement(
    "h100",
    "h100-root",
    match_labels={GPU: "h100"},
    match_expressions=(Requirement(ZONES["key"], "In", ("a", "b")),),
    tolerations=(TOLERATION,),
)


@pytest.fixture
async def env(alice_in: Scenario) -> Scenario:
    return alice_in


@pytest.fixture
async def reconciler(alice_in: Scenario) -> AsyncIterator[kq.Kube]:
    """A client acting as the reconciler's ServiceAccount, the only user that may remove the gate."""
    client = await kq.Kube.connect(
        kubeconfig=str(alice_in.cluster.kubeconfig), impersonate=system.RECONCILER_USER
    )
    try:
        yield client
    finally:
        await client.close()


def gated_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": names.ADMISSION_GATE}],
            "containers": [{"name": "main", "image": "busybox"}],
            **spec,
        },
    }


def get_pod(env: Scenario, name: str) -> dict[str, Any]:
    found = kube.kubectl(env.cluster, "get", "pod", "-n", env.ns, name, "-o", "json")
    pod: dict[str, Any] = json.loads(found.stdout)
    return pod


async def release(
    env: Scenario, client: kq.Kube, pod: dict[str, Any]
) -> tuple[str | None, list[dict[str, Any]]]:
    """Create ``pod`` gated, release it into the pool as the reconciler does, and answer the reason
    it stayed gated (None when released) with every version the apiserver stored of it."""
    name = pod["metadata"]["name"]
    async with kube.Recorder(env.cluster, kq.PODS, namespace=env.ns) as record:
        kube.kubectl(env.cluster, "create", "-n", env.ns, "-f", "-", input_text=yaml.safe_dump(pod))
        stored = job_pods.slim_pod(get_pod(env, name))
        store = {f"{env.ns}/{name}": stored}
        why = await job_pods.ungate(client, store, podplan.pod_view(stored, ""), POOL)
    return why, record.versions(name)


def placement_of(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    return {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations", "schedulingGates")}


async def test_a_pod_without_placement_gets_the_pools_in_the_write_that_removes_its_gate(
    env: Scenario, reconciler: kq.Kube
) -> None:
    why, versions = await release(env, reconciler, gated_pod("plain"))
    assert why is None
    created, released = versions  # one write: nothing in between, nothing after
    assert placement_of(created)["nodeSelector"] is None
    placed = placement_of(released)
    assert placed["nodeSelector"] == {GPU: "h100"}
    assert placed["affinity"] == {
        "nodeAffinity": {AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": [ZONES]}]}}
    }
    assert TOLERATION in placed["tolerations"]
    assert not placed["schedulingGates"]


async def test_a_pods_own_terms_are_each_narrowed_to_the_pool(env: Scenario, reconciler: kq.Kube) -> None:
    ssd = {"key": "disk", "operator": "In", "values": ["ssd"]}
    named = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
    own_toleration = {"key": "mine", "operator": "Exists", "effect": "NoSchedule"}
    pod = gated_pod(
        "own-terms",
        nodeSelector={"disk": "ssd"},
        tolerations=[own_toleration],
        affinity={
            "nodeAffinity": {
                AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": [ssd]}, {"matchFields": [named]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [ssd]}}
                ],
            }
        },
    )
    why, versions = await release(env, reconciler, pod)
    assert why is None
    _, released = versions
    placed = placement_of(released)
    assert placed["nodeSelector"] == {"disk": "ssd", GPU: "h100"}
    node_affinity = placed["affinity"]["nodeAffinity"]
    assert node_affinity[AFFINITY]["nodeSelectorTerms"] == [
        {"matchExpressions": [ssd, ZONES]},
        {"matchFields": [named], "matchExpressions": [ZONES]},
    ]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 1, "preference": {"matchExpressions": [ssd]}}
    ]
    assert own_toleration in placed["tolerations"] and TOLERATION in placed["tolerations"]
    assert not placed["schedulingGates"]


async def test_a_pod_whose_node_selector_contradicts_the_pool_stays_gated_untouched(
    env: Scenario, reconciler: kq.Kube
) -> None:
    why, versions = await release(env, reconciler, gated_pod("l4", nodeSelector={GPU: "l4"}))
    assert why == f"the job's nodeSelector asks for {GPU}=l4, the pool has {GPU}=h100"
    [created] = versions
    assert placement_of(get_pod(env, "l4")) == placement_of(created)
    assert placement_of(created)["schedulingGates"] == [{"name": names.ADMISSION_GATE}]


async def test_a_namespace_user_cannot_move_a_released_pod_off_its_pool(
    env: Scenario, reconciler: kq.Kube
) -> None:
    why, _ = await release(env, reconciler, gated_pod("placed"))
    assert why is None

    async def her_rights_apply() -> bool:  # RBAC takes a moment to load after the grant
        done = tenancy.as_user(
            env.cluster, tenancy.ALICE, "-n", env.ns, "label", "pod", "placed", "note=mine"
        )
        return done.returncode == 0

    await kube.eventually(her_rights_apply, what="alice labelling her pod")
    elsewhere = {
        "nodeAffinity": {
            AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": [{"key": GPU, "operator": "Exists"}]}]}
        }
    }
    for attack in (
        {"spec": {"nodeSelector": {GPU: "l4"}}},
        {"spec": {"nodeSelector": None}},
        {"spec": {"affinity": elsewhere}},
        {"spec": {"affinity": None}},
    ):
        done = tenancy.as_user(
            env.cluster,
            tenancy.ALICE,
            "-n",
            env.ns,
            "patch",
            "pod",
            "placed",
            "--type=merge",
            "-p",
            json.dumps(attack),
        )
        assert done.returncode != 0 and "Forbidden" in done.stderr, (attack, done.stderr)
    placed = placement_of(get_pod(env, "placed"))
    assert placed["nodeSelector"] == {GPU: "h100"}
    assert placed["affinity"]["nodeAffinity"][AFFINITY]["nodeSelectorTerms"] == [
        {"matchExpressions": [ZONES]}
    ]


async def test_a_pod_changed_after_it_was_read_is_not_released_on_the_stale_copy(
    env: Scenario, reconciler: kq.Kube
) -> None:
    """A gated pod's owner may still add to its placement: the release is conditional on the version
    its placement was read at, so a selector added in between is never overwritten or bypassed."""
    kube.kubectl(
        env.cluster, "create", "-n", env.ns, "-f", "-", input_text=yaml.safe_dump(gated_pod("raced"))
    )
    stale = job_pods.slim_pod(get_pod(env, "raced"))
    kube.kubectl(
        env.cluster,
        "patch",
        "pod",
        "raced",
        "-n",
        env.ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"nodeSelector": {GPU: "l4"}}}),
    )
    key = f"{env.ns}/raced"
    assert await job_pods.ungate(reconciler, {key: stale}, podplan.pod_view(stale, ""), POOL) is None
    after = get_pod(env, "raced")
    assert placement_of(after)["nodeSelector"] == {GPU: "l4"}
    assert placement_of(after)["schedulingGates"] == [{"name": names.ADMISSION_GATE}]
    # The next pass reads the fresh copy and finds the contradiction.
    fresh = job_pods.slim_pod(after)
    why = await job_pods.ungate(reconciler, {key: fresh}, podplan.pod_view(fresh, ""), POOL)
    assert why == f"the job's nodeSelector asks for {GPU}=l4, the pool has {GPU}=h100"

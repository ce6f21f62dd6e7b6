"""A namespace user cannot start the gated replacement of a preempted pod, nor take a released pod
out of its job (full control plane).

The first case only a real Job controller produces: a low-priority Job is admitted, its pod is released
but cannot be placed (its node selector matches no node), a high-priority Job takes the quota back,
and reclaim deletes the unbound pod. The Job controller creates a replacement from the template,
gated. Its owner ``alice``, bound in her namespace to the built-in ``edit`` role (aggregated by the
controller-manager as in a real cluster; ``tests/tenancy.py``), tries to remove the gate: the
admission policy refuses it, the pod stays gated and unbound, and the victim's unit holds nothing
(docs/architecture.md#trust-boundaries).

The second: alice relabels her released pod so that the Job controller lets go of it and makes a
gated replacement; the reconciler deletes the pod that left its job, so one admission never runs
two pods.

The third: alice keeps a deleted pod terminating; it counts until it is gone, and no replacement
runs beside it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube, tenancy

pytestmark = pytest.mark.e2e

ALICE = "alice"


@pytest.fixture
def priorities(e2e_cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    low, high = f"tenant-low-{suffix}", f"tenant-high-{suffix}"
    for name, value in ((low, 10), (high, 1000)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
        kube.kubectl(e2e_cluster, "create", "-f", "-", input_text=yaml.safe_dump({**body, "value": value}))
    yield low, high
    kube.kubectl(e2e_cluster, "delete", "priorityclass", low, high, "--ignore-not-found", "--wait=false")


def quota(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {
                names.ENABLE_PREEMPTION_ANNOTATION: "true",
                names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
            },
        },
        "spec": {"min": {"cpu": "2", "memory": "4Gi"}, "max": {"cpu": "2", "memory": "4Gi"}},
    }


def job(name: str, quota_name: str, priority_class: str, *, placeable: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}},
            }
        ],
    }
    if not placeable:
        spec["nodeSelector"] = {"example.com/no-such-node": "true"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota_name}},
        "spec": {"backoffLimit": 0, "template": {"spec": spec}},
    }


def pods_of(cluster: LocalCluster, namespace: str, job_name: str) -> list[dict[str, Any]]:
    out = kube.kubectl(cluster, "get", "pods", "-n", namespace, "-l", f"job-name={job_name}", "-o", "json")
    return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]


def gated(pod: dict[str, Any]) -> bool:
    return {"name": names.ADMISSION_GATE} in (pod["spec"].get("schedulingGates") or [])


async def alices_quota(cluster: LocalCluster, ns: str) -> str:
    """alice's namespace rights, and her team's quota (2 CPU) with its Queue ready."""
    tenancy.grant(cluster, ns, ALICE)
    quota_name = f"{ns}-q"
    kube.kubectl(cluster, "apply", "-f", "-", input_text=yaml.safe_dump(quota(quota_name, ns)))

    async def queue_ready() -> bool:
        found = kube.kubectl(
            cluster, "get", "queue", quota_name, "-n", names.COMPONENT_NAMESPACE, check=False
        )
        return found.returncode == 0

    await kube.eventually(queue_ready, what="the quota's Queue")
    return quota_name


async def test_the_gated_replacement_of_a_preempted_pod_cannot_be_released_by_its_owner(
    e2e_cluster: LocalCluster,
    system_e2e: system.Processes,
    namespace_in: str,
    priorities: tuple[str, str],
) -> None:
    cluster, ns = e2e_cluster, namespace_in
    low_class, high_class = priorities
    quota_name = await alices_quota(cluster, ns)
    try:
        submit = tenancy.as_user
        low = job("low", quota_name, low_class, placeable=False)
        done = submit(cluster, ALICE, "-n", ns, "create", "-f", "-", input_text=yaml.safe_dump(low))
        assert done.returncode == 0, done.stderr

        async def released() -> bool:
            return any(not gated(p) and not p["spec"].get("nodeName") for p in pods_of(cluster, ns, "low"))

        await kube.eventually(released, timeout=60, what="the low job's pod released but unplaceable")
        high = job("high", quota_name, high_class, placeable=True)
        done = submit(cluster, ALICE, "-n", ns, "create", "-f", "-", input_text=yaml.safe_dump(high))
        assert done.returncode == 0, done.stderr

        async def replacement() -> dict[str, Any] | None:
            live = pods_of(cluster, ns, "low")
            if len(live) == 1 and gated(live[0]):
                return live[0]
            units = kube.kubectl(cluster, "get", "queueunit", "-n", ns, "-o", "json").stdout
            states = [(u["metadata"]["name"], u.get("status")) for u in json.loads(units)["items"]]
            raise AssertionError(f"pods {[(p['metadata']['name'], p['spec']) for p in live]}; units {states}")

        pod = await kube.eventually(replacement, timeout=90, what="the low job's gated replacement pod")
        name = pod["metadata"]["name"]
        attack = json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}])
        done = submit(cluster, ALICE, "-n", ns, "patch", "pod", name, "--type=json", "-p", attack)
        assert done.returncode != 0, "alice removed the admission gate"
        assert names.ADMISSION_GATE in done.stderr and "denied" in done.stderr, done.stderr
        # Replacing the gate list with another gate is the same attack in other clothes.
        other = json.dumps({"spec": {"schedulingGates": [{"name": "example.com/mine"}]}})
        done = submit(cluster, ALICE, "-n", ns, "patch", "pod", name, "--type=merge", "-p", other)
        assert done.returncode != 0, "alice swapped the admission gate for another"

        stored = json.loads(kube.kubectl(cluster, "get", "pod", name, "-n", ns, "-o", "json").stdout)
        assert gated(stored) and not stored["spec"].get("nodeName"), stored["spec"]

        # The reclaim deletes the pod before it writes the unit: the replacement can come first.
        async def low_reclaimed() -> bool:
            got = kube.kubectl(cluster, "get", "queueunit", "low", "-n", ns, "-o", "json").stdout
            status = json.loads(got).get("status") or {}
            assert sum(a.get("replicas", 0) for a in status.get("admissions") or []) == 0, status
            return True

        await kube.eventually(low_reclaimed, what="the low unit holding no replica")
        # alice can see where her job stands, through the roles the install aggregates into edit.
        done = submit(cluster, ALICE, "-n", ns, "get", "queueunit", "low", "-o", "name")
        assert done.returncode == 0, done.stderr
    finally:
        kube.kubectl(cluster, "delete", "jobs", "--all", "-n", ns, "--wait=false")
        kube.kubectl(cluster, "delete", "elasticquota", quota_name, "-n", ns, "--wait=false")


async def test_a_released_pod_relabelled_out_of_its_job_is_deleted_and_replaced_behind_the_gate(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    """alice changes the label her Job selects its pods by: the real Job controller lets go of the
    released pod and makes a gated replacement. Left alone, both would be out of the gate for an
    admission of one; the reconciler deletes the pod that left its job
    (docs/architecture.md#trust-boundaries)."""
    cluster, ns = e2e_cluster, namespace_in
    quota_name = await alices_quota(cluster, ns)
    submit = tenancy.as_user
    try:
        # Unplaceable, so its pod stays released but unbound: the state a pod waits in for room.
        mover = job("mover", quota_name, "", placeable=False)
        del mover["spec"]["template"]["spec"]["priorityClassName"]
        done = submit(cluster, ALICE, "-n", ns, "create", "-f", "-", input_text=yaml.safe_dump(mover))
        assert done.returncode == 0, done.stderr

        async def released() -> dict[str, Any] | None:
            live = pods_of(cluster, ns, "mover")
            return next((p for p in live if not gated(p)), None)

        first = await kube.eventually(released, timeout=60, what="the mover's pod released")
        name = first["metadata"]["name"]
        relabel = ["label", "pod", name, "--overwrite", "batch.kubernetes.io/controller-uid=mine"]
        done = submit(cluster, ALICE, "-n", ns, *relabel)
        assert done.returncode == 0, done.stderr

        async def replaced() -> list[dict[str, Any]] | None:
            live = pods_of(cluster, ns, "mover")
            names_now = {p["metadata"]["name"] for p in live}
            if name in names_now or len(live) != 1 or gated(live[0]):
                return None
            return live

        await kube.eventually(
            replaced, timeout=90, what="the relabelled pod deleted, its replacement released"
        )

        # The event writer writes in no step with the deletion: wait on the event itself.
        async def told() -> bool:
            events = kube.events_of(cluster, ns, "mover")
            escaped = [e for e in events if e["reason"] == names.EventReason.ESCAPED_POD_DELETED]
            assert escaped and name in escaped[0]["message"], [(e["reason"], e["message"]) for e in events]
            return True

        await kube.eventually(told, what="EscapedPodDeleted on the mover job")
        unit = json.loads(kube.kubectl(cluster, "get", "queueunit", "mover", "-n", ns, "-o", "json").stdout)
        assert [a.get("replicas") for a in unit["status"]["admissions"]] == [1], unit["status"]
    finally:
        kube.kubectl(cluster, "delete", "jobs", "--all", "-n", ns, "--wait=false")
        kube.kubectl(cluster, "delete", "elasticquota", quota_name, "-n", ns, "--ignore-not-found")


async def test_a_pod_alice_deletes_keeps_its_place_until_it_is_gone(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    """alice holds her running pod terminating with a finalizer of her own and deletes it: it
    runs on (with a kubelet, for its whole grace period), so nothing may run beside it for the
    same admission. The real Job controller makes a replacement (its default replaces a pod as soon
    as it is being deleted); the replacement waits gated while the unit keeps counting the pod, and
    is released once she lets it go (docs/compatibility.md#pod-gating)."""
    cluster, ns = e2e_cluster, namespace_in
    quota_name = await alices_quota(cluster, ns)
    submit = tenancy.as_user
    name = ""
    try:
        keeper = job("keeper", quota_name, "", placeable=True)
        del keeper["spec"]["template"]["spec"]["priorityClassName"]
        keeper["spec"]["backoffLimit"] = 1
        keeper["spec"]["template"]["metadata"] = {"annotations": {COMPLETE_DELAY_ANNOTATION: "300s"}}
        done = submit(cluster, ALICE, "-n", ns, "create", "-f", "-", input_text=yaml.safe_dump(keeper))
        assert done.returncode == 0, done.stderr

        async def running() -> dict[str, Any] | None:
            live = pods_of(cluster, ns, "keeper")
            return next((p for p in live if p["status"].get("phase") == "Running"), None)

        first = await kube.eventually(running, timeout=60, what="the keeper's pod running")
        name = first["metadata"]["name"]
        hold = json.dumps({"metadata": {"finalizers": ["example.com/alice-hold"]}})
        done = submit(cluster, ALICE, "-n", ns, "patch", "pod", name, "--type=merge", "-p", hold)
        assert done.returncode == 0, done.stderr
        done = submit(cluster, ALICE, "-n", ns, "delete", "pod", name, "--wait=false")
        assert done.returncode == 0, done.stderr

        def everything() -> list[dict[str, Any]]:
            out = kube.kubectl(cluster, "get", "pods", "-n", ns, "-l", "job-name=keeper", "-o", "json")
            return list(json.loads(out.stdout)["items"])

        for _ in range(16):  # eight seconds for the Job controller and the reconciler to err
            await asyncio.sleep(0.5)
            others = [p for p in everything() if p["metadata"]["name"] != name]
            assert all(gated(p) for p in others), [(p["metadata"]["name"], p["spec"]) for p in others]
        unit = json.loads(kube.kubectl(cluster, "get", "queueunit", "keeper", "-n", ns, "-o", "json").stdout)
        assert [(a.get("replicas"), a.get("running")) for a in unit["status"]["admissions"]] == [(1, 1)], unit

        let_go = json.dumps([{"op": "remove", "path": "/metadata/finalizers"}])
        done = submit(cluster, ALICE, "-n", ns, "patch", "pod", name, "--type=json", "-p", let_go)
        assert done.returncode == 0, done.stderr
        name = ""

        async def replaced() -> bool:
            return any(not gated(p) for p in pods_of(cluster, ns, "keeper"))

        await kube.eventually(replaced, timeout=90, what="the replacement released once the pod is gone")
    finally:
        if name:
            kube.kubectl(
                cluster,
                "patch",
                "pod",
                name,
                "-n",
                ns,
                "--type=json",
                "-p",
                json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]),
                check=False,
            )
        kube.kubectl(cluster, "delete", "jobs", "--all", "-n", ns, "--wait=false")
        kube.kubectl(cluster, "delete", "elasticquota", quota_name, "-n", ns, "--ignore-not-found")

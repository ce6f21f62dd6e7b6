"""A Job that claims a parent it does not have never runs a pod unadmitted (full control plane).

alice, bound in her namespace to the built-in ``edit`` role (``tests/tenancy.py``), creates labelled
Jobs whose controller owner reference names a parent in a group the queue manages: a TFJob that does
not exist, her own queued TFJob with a UID it does not have, and a ``kubeflow.org`` Notebook, a
kind this cluster does not serve. A Job controlled by a kind the queue manages is that kind's child
and is not queued itself, and the webhook, which has no API client, cannot check the claim. It
gates such a Job's pod template instead of letting it in as it is
(docs/architecture.md#trust-boundaries), so the real Job controller creates its pods behind the
admission gate. The garbage collector deletes the first two soon (their owner is missing), but
not the third (it cannot look the kind up): the reconciler resolves that claim, finds it false,
holds the Job and queues it on its own label, and once its unit is admitted the Job runs and
completes like any other. The record of every version of every pod in her namespace
(``tests.kube.Recorder``) shows each pod of those Jobs stored gated and unbound in its first
version: none was ever schedulable before the reconciler released it.

And a real child: a Job whose controller is a queued TFJob with its real UID is left to its parent
(never suspended, no unit of its own), its template gated naming the parent's unit, so its pods
wait for the parent's admission (docs/compatibility.md#batchv1-job).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_tenant_pods import ALICE

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
GATE = {"name": names.ADMISSION_GATE}
MISSING_UID = "00000000-0000-4000-8000-000000000000"


def tfjob(name: str, quota_name: str) -> Obj:
    container = {"name": "tensorflow", "image": "busybox", "resources": {"requests": {"cpu": "500m"}}}
    replica = {"replicas": 1, "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota_name}},
        "spec": {"tfReplicaSpecs": {"Worker": replica}},
    }


def claiming_job(name: str, quota_name: str, *, parent: str, uid: str, kind: str = "TFJob") -> Obj:
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}},
    }
    owner = {"apiVersion": "kubeflow.org/v1", "kind": kind, "name": parent, "uid": uid, "controller": True}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {names.QUOTA_NAME_LABEL: quota_name},
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def conditions(job: Obj | None) -> dict[str, str]:
    return {c["type"]: c["status"] for c in ((job or {}).get("status") or {}).get("conditions") or []}


async def alices_quota(cluster: LocalCluster, ns: str) -> str:
    """alice's namespace rights, and her team's quota (2 CPU, without waiting for pods to run: the
    TFJobs here have no operator, so an admitted one never runs a pod) with its Queue ready."""
    tenancy.grant(cluster, ns, ALICE)
    quota_name = f"{ns}-q"
    kube.apply_quota(cluster, quota_name, ns, cpu="2")

    async def queue_ready() -> bool:
        found = kube.kubectl(
            cluster, "get", "queue", quota_name, "-n", names.COMPONENT_NAMESPACE, check=False
        )
        return found.returncode == 0

    await kube.eventually(queue_ready, what="the quota's Queue")
    return quota_name


def get(cluster: LocalCluster, kind: str, name: str, namespace: str) -> Obj | None:
    out = kube.kubectl(cluster, "get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def job_of(pod: Obj) -> str:
    return str((pod["metadata"].get("labels") or {}).get("job-name", ""))


def gated(pod: Obj) -> bool:
    return GATE in (pod["spec"].get("schedulingGates") or [])


async def test_a_job_claiming_a_parent_it_does_not_have_runs_no_pod_before_its_own_admission(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    cluster, ns = e2e_cluster, namespace_in
    quota_name = await alices_quota(cluster, ns)
    collected = ("ghost-child", "wrong-uid-child")  # their owner is missing: garbage collected
    queued = "unserved-child"
    forged = (*collected, queued)
    try:
        async with kube.Recorder(cluster, kq.PODS, namespace=ns) as pods_seen:
            await tenancy.create_as(cluster, ns, tfjob("real-parent", quota_name))
            bodies = (
                claiming_job(collected[0], quota_name, parent="no-such-tfjob", uid=MISSING_UID),
                claiming_job(collected[1], quota_name, parent="real-parent", uid=MISSING_UID),
                claiming_job(queued, quota_name, parent="nb", uid=MISSING_UID, kind="Notebook"),
            )
            for body in bodies:
                await tenancy.create_as(cluster, ns, body)

            async def complete() -> bool:
                job = get(cluster, "job", queued, ns)
                assert job is not None and conditions(job).get("Failed") != "True", job
                if conditions(job).get("Complete") == "True":
                    return True
                unit = get(cluster, "queueunit", queued, ns) or {}
                pods = [(p["metadata"]["name"], p["spec"].get("schedulingGates")) for p in pods_seen.objects]
                raise AssertionError(
                    f"job {job.get('spec')} {job.get('status')}; unit {unit.get('status')}; {pods}"
                )

            await kube.eventually(complete, timeout=120, what=f"{queued} queued, admitted and complete")
            assert get(cluster, "queueunit", queued, ns) is not None, "queued under a unit of its own"

            async def settled() -> bool:
                return all(
                    (job := get(cluster, "job", name, ns)) is None
                    or conditions(job).get("Complete") == "True"
                    for name in collected
                )

            await kube.eventually(settled, timeout=60, what="the Jobs of missing owners deleted or complete")
        # Leaving the block synced the record: it holds every pod version up to now.
        by_pod: dict[str, list[Obj]] = {}
        for pod in pods_seen.objects:
            if job_of(pod) in forged:
                by_pod.setdefault(pod["metadata"]["uid"], []).append(pod)
        assert queued in {job_of(versions[0]) for versions in by_pod.values()}, "the queued Job ran a pod"
        for versions in by_pod.values():
            first = versions[0]
            assert gated(first) and not first["spec"].get("nodeName"), (
                first["metadata"]["name"],
                first["spec"],
            )
            # A pod that ran was released by the reconciler for the Job's own unit: made from the
            # template it relinked to that unit when it released the Job, or, when the Job
            # controller made the pod before the reconciler held the Job (a started Job's template
            # can never change), found by its controller reference with no link. Either way it
            # never names the claimed parent's unit. (A Job the garbage collector is slow to
            # delete may get that far too.)
            own = f"{ns}/{job_of(first)}"
            for version in versions:
                if version["spec"].get("nodeName"):
                    link = (version["metadata"].get("annotations") or {}).get(
                        names.RELATED_QUEUEUNIT_ANNOTATION
                    )
                    assert link in (own, None), (version["metadata"]["name"], link)
    finally:
        kube.kubectl(cluster, "delete", "jobs,tfjobs", "--all", "-n", ns, "--wait=false")
        kube.kubectl(cluster, "delete", "elasticquota", quota_name, "-n", ns, "--ignore-not-found")


async def test_a_real_child_of_a_queued_parent_is_gated_for_its_parent_and_never_held(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    cluster, ns = e2e_cluster, namespace_in
    quota_name = await alices_quota(cluster, ns)
    try:
        await tenancy.create_as(cluster, ns, tfjob("parent", quota_name))
        parent = get(cluster, "tfjob", "parent", ns)
        assert parent is not None
        await tenancy.create_as(
            cluster, ns, claiming_job("child", quota_name, parent="parent", uid=parent["metadata"]["uid"])
        )
        stored = get(cluster, "job", "child", ns)
        assert stored is not None
        template = stored["spec"]["template"]
        assert template["spec"]["schedulingGates"] == [GATE]
        assert template["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == f"{ns}/parent-tf-qu"

        async def parent_unit() -> bool:
            return get(cluster, "queueunit", "parent-tf-qu", ns) is not None

        await kube.eventually(parent_unit, what="the parent's unit")
        assert get(cluster, "queueunit", "child", ns) is None
        assert (get(cluster, "job", "child", ns) or {})["spec"].get("suspend") is not True
    finally:
        kube.kubectl(cluster, "delete", "jobs,tfjobs", "--all", "-n", ns, "--wait=false")
        kube.kubectl(cluster, "delete", "elasticquota", quota_name, "-n", ns, "--ignore-not-found")

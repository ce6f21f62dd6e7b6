"""A namespace user cannot skip the queue: the hold, the gates and the pod links, attacked.

Every attack is made by ``alice``, impersonated with ``kubectl --as``, who holds only a namespace
user's rights in her namespace (``tests/tenancy.py``), against the real kube-apiserver with the
webhook, the admission policies and the reconciler running (docs/architecture.md#trust-boundaries):

* a Job created with a forged ``status`` (which the apiserver keeps until after mutating
  admission) is held and gated all the same;
* stripping the enqueue annotations, releasing ``spec.suspend``, removing the template's gate or
  changing or removing the quota label of a queued Job is refused;
* a pod's ``koord-queue/admission`` gate cannot be removed by its owner, and a pod of a queued job
  that is released without admission anyway (created by a controller we did not expect) is
  deleted by the reconciler;
* a running Job labelled into a queue is refused for alice, and when it happens anyway (written
  as the reconciler's identity, standing for a job created before the webhook) it is held and
  queued, not adopted as admitted;
* pods naming another team's QueueUnit (from another namespace, or not owned by its job) never
  count as that unit's running pods.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.integration.test_job_kinds import TOO_SMALL
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

ALICE = tenancy.ALICE
ROOM = {"cpu": "4", "memory": "16Gi"}


@pytest.fixture
def env(alice_in: Scenario) -> Scenario:
    return alice_in


def batch_job(name: str, quota: str | None, **extra: Any) -> dict[str, Any]:
    labels = {names.QUOTA_NAME_LABEL: quota} if quota else {}
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            }
        },
    }
    job.update(extra)
    return job


def alice(env: Scenario, *args: str, obj: Any = None) -> tuple[int, str]:
    """kubectl as alice in the test namespace: (exit code, stdout + stderr)."""
    text = yaml.safe_dump(obj) if obj is not None else None
    done = tenancy.as_user(env.cluster, ALICE, "-n", env.ns, *args, input_text=text)
    return done.returncode, done.stdout + done.stderr


def gated(template_spec: dict[str, Any]) -> bool:
    return {"name": names.ADMISSION_GATE} in (template_spec.get("schedulingGates") or [])


async def queued_job(env: Scenario, name: str = "held") -> dict[str, Any]:
    """A Job alice submitted into a quota too small for it: held, with its unit waiting."""
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    job = batch_job(name, quota, spec={**batch_job(name, quota)["spec"], "parallelism": 2})
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    await env.wait_unit(name, lambda u: (u.get("status") or {}).get("phase") == "Enqueued", what="waits")
    return env.get_job_sync(job)


async def test_a_job_created_with_a_forged_status_is_held_and_gated(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    forged = batch_job(
        "forged",
        quota,
        status={"startTime": "2026-01-01T00:00:00Z", "active": 1, "ready": 1},
    )
    forged["spec"]["parallelism"] = 2  # more than the quota: it must stay held
    forged["metadata"]["annotations"] = {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "2026-01-01T00:00:00Z"}
    code, out = alice(env, "create", "-f", "-", obj=forged)
    assert code == 0, out
    env.remember(forged)
    stored = env.get_job_sync(forged)
    assert stored["spec"]["suspend"] is True, stored["spec"]
    assert gated(stored["spec"]["template"]["spec"]), stored["spec"]["template"]
    assert names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION not in stored["metadata"]["annotations"]
    unit = await env.wait_unit("forged", lambda u: (u.get("status") or {}).get("phase") == "Enqueued")
    assert not (unit["status"].get("admissions") or [])


@pytest.mark.parametrize(
    ("attack", "field"),
    [
        (
            [{"op": "remove", "path": "/metadata/annotations/koord-queue~1job-has-enqueued"}],
            "job-has-enqueued",
        ),
        (
            [{"op": "remove", "path": "/metadata/annotations/koord-queue~1job-enqueue-timestamp"}],
            "job-enqueue-timestamp",
        ),
        ([{"op": "replace", "path": "/spec/suspend", "value": False}], "spec.suspend"),
        (
            [{"op": "remove", "path": "/spec/template/spec/schedulingGates/0"}],
            "spec.template.spec.schedulingGates",
        ),
        (
            [
                {
                    "op": "replace",
                    "path": "/metadata/labels/quota.scheduling.koordinator.sh~1name",
                    "value": "x",
                }
            ],
            names.QUOTA_NAME_LABEL,
        ),
        (
            [{"op": "remove", "path": "/metadata/labels/quota.scheduling.koordinator.sh~1name"}],
            names.QUOTA_NAME_LABEL,
        ),
    ],
    ids=["strip-has-enqueued", "strip-timestamp", "unsuspend", "ungate-template", "relabel", "unlabel"],
)
async def test_a_queued_job_cannot_be_released_by_its_owner(
    env: Scenario, attack: list[dict[str, Any]], field: str
) -> None:
    await queued_job(env)
    code, out = alice(env, "patch", "job", "held", "--type=json", "-p", json.dumps(attack))
    assert code != 0, f"the attack was allowed: {out}"
    assert "Forbidden" in out and field in out, out
    # Stripping the annotations first does not unlock the hold either: both in one write.
    both = [
        {"op": "remove", "path": "/metadata/annotations/koord-queue~1job-has-enqueued"},
        {"op": "remove", "path": "/metadata/annotations/koord-queue~1job-enqueue-timestamp"},
        {"op": "replace", "path": "/spec/suspend", "value": False},
    ]
    code, out = alice(env, "patch", "job", "held", "--type=json", "-p", json.dumps(both))
    assert code != 0 and "spec.suspend: Forbidden" in out, out
    stored = env.get_job_sync({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "held"}})
    assert stored["spec"]["suspend"] is True


def owned_pod(name: str, job: dict[str, Any], *, gate: bool, node: str | None = None) -> dict[str, Any]:
    """A pod as the Job controller makes it from the (gated) template: owned by the job."""
    meta = job["metadata"]
    template = job["spec"]["template"]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
    }
    if gate:
        spec["schedulingGates"] = [{"name": names.ADMISSION_GATE}]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": dict(template["metadata"]["annotations"]),
            "labels": {"batch.kubernetes.io/job-name": meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }


async def test_only_the_reconciler_removes_a_pods_gate_and_a_pod_released_past_it_is_deleted(
    env: Scenario,
) -> None:
    job = await queued_job(env)
    # A gated pod of the queued job (the Job controller would make it from the template).
    kube.kubectl(
        env.cluster,
        "create",
        "-n",
        env.ns,
        "-f",
        "-",
        input_text=yaml.safe_dump(owned_pod("p1", job, gate=True)),
    )
    code, out = alice(
        env, "patch", "pod", "p1", "--type=json", "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]'
    )
    assert code != 0 and "koord-queue/admission" in out, out
    pod = json.loads(kube.kubectl(env.cluster, "get", "pod", "-n", env.ns, "p1", "-o", "json").stdout)
    assert gated(pod["spec"]), pod["spec"]

    # A pod of the queued job that is released without admission (made ungated by something that
    # bypassed the template) is deleted by the reconciler, with a Warning event on the job.
    kube.kubectl(
        env.cluster,
        "create",
        "-n",
        env.ns,
        "-f",
        "-",
        input_text=yaml.safe_dump(owned_pod("p2", job, gate=False)),
    )

    async def gone() -> bool:
        found = kube.kubectl(
            env.cluster, "get", "pod", "-n", env.ns, "p2", "--ignore-not-found", "-o", "name"
        )
        return not found.stdout.strip()

    await kube.eventually(gone, what="the unadmitted pod p2 deleted")
    await env.wait_event("held", names.EventReason.UNADMITTED_POD_DELETED, kind="Job", type_="Warning")
    # The gated pod is untouched.
    assert kube.kubectl(env.cluster, "get", "pod", "-n", env.ns, "p1", "-o", "name").stdout.strip()


async def test_a_running_job_labelled_into_a_queue_is_held_and_queued_not_adopted(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    job = batch_job("runner", None, spec={**batch_job("runner", None)["spec"], "parallelism": 2})
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    label = json.dumps({"metadata": {"labels": {names.QUOTA_NAME_LABEL: quota}}})
    code, out = alice(env, "patch", "job", "runner", "--type=merge", "-p", label)
    assert code != 0 and "spec.suspend: Forbidden" in out, out

    # Written anyway (as a job created before the webhook was installed would be): the reconciler
    # holds it and queues it; it is not adopted as admitted, so it never gets quota unchecked.
    kube.kubectl(
        env.cluster,
        f"--as={system.RECONCILER_USER}",
        "patch",
        "job",
        "runner",
        "-n",
        env.ns,
        "--type=merge",
        "-p",
        label,
    )

    await env.wait_job(job, lambda j: j["spec"].get("suspend") is True, what="held again")
    unit = await env.wait_unit("runner", lambda u: (u.get("status") or {}).get("phase") == "Enqueued")
    assert not (unit["status"].get("admissions") or []), unit["status"]
    await env.wait_event("runner", names.EventReason.HELD_UNADMITTED, kind="Job", type_="Warning")


async def test_pods_naming_another_teams_unit_never_count_for_it(
    env: Scenario, integration_cluster: LocalCluster
) -> None:
    # The victim: a team in its own namespace with an admitted job.
    victim_ns = f"{env.ns}-b"
    async with kube.client(integration_cluster) as api:
        await kube.create_namespace(api, victim_ns)
        try:
            victim = Scenario(api, integration_cluster, victim_ns)
            quota = victim.name("q")
            await victim.add_quota(quota, ROOM)
            job = batch_job("train", quota)
            victim.submit(job)
            await victim.wait_unit("train", lambda u: (u.get("status") or {}).get("phase") == "Dequeued")
            stored = victim.get_job_sync(job)
            forged = owned_pod("forged", stored, gate=False, node="node-x")
            ref = forged["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION]
            assert ref == f"{victim_ns}/train"
            # alice, from her namespace: a bound pod naming the victim's unit, claiming its job. The
            # door refuses a pod naming a unit that is not born gated; created anyway (the admin
            # stands for a way past the door), it still counts for nothing.
            code, out = alice(env, "create", "-f", "-", obj=forged)
            assert code != 0 and "koord-queue-pod-birth" in out, out
            kube.kubectl(
                integration_cluster, "create", "-n", env.ns, "-f", "-", input_text=yaml.safe_dump(forged)
            )
            # ... and a bare bound pod in the victim's namespace, made by its own user, not the job's.
            bare = owned_pod("bare", stored, gate=False, node="node-x")
            bare["metadata"]["ownerReferences"] = []
            kube.kubectl(
                integration_cluster, "create", "-n", victim_ns, "-f", "-", input_text=yaml.safe_dump(bare)
            )
            # The job's own bound pod, created last: once it is counted, the others were seen.
            mine = owned_pod("mine", stored, gate=False, node="node-x")
            kube.kubectl(
                integration_cluster, "create", "-n", victim_ns, "-f", "-", input_text=yaml.safe_dump(mine)
            )

            def running(unit: dict[str, Any]) -> bool:
                return bool((unit.get("status") or {}).get("podState", {}).get("running") == 1)

            unit = await victim.wait_unit("train", running, what="exactly its own pod running")
            assert unit["status"]["admissions"][0]["running"] == 1, unit["status"]
            assert unit["status"]["admissions"][0]["replicas"] == 1, unit["status"]
        finally:
            await victim.cleanup()
            # No kubelet confirms the deletion of a pod bound to a node here: force it.
            for namespace in (victim_ns, env.ns):
                kube.kubectl(
                    integration_cluster,
                    "delete",
                    "pods",
                    "--all",
                    "-n",
                    namespace,
                    "--grace-period=0",
                    "--force",
                )
            await kube.delete_namespace(api, victim_ns)

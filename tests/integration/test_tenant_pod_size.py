"""A job is charged the size its pods really take, and keeps the size it was admitted with,
attacked on the real apiserver with the webhook, the admission policies and the reconciler running.

Pod-level resources (``spec.resources`` of a pod template, on by default since Kubernetes 1.34): the
kube-scheduler reserves the pod-level request, whatever the containers ask, so the unit charges it
(docs/compatibility.md#queueunit-construction); a Job whose containers ask for 100m under a
pod-level request of 3 CPUs waits in a 2-CPU quota, one of 1 CPU is admitted and charged 1.

Admitted pod size (docs/compatibility.md#admitted-pod-size):

A TFJob stands for every kind whose templates stay editable after admission (the operators' CRDs
allow any spec change; a ``batch/v1`` Job's template is immutable anyway). ``alice`` holds a
namespace user's rights (``tests/tenancy.py``):

* scaling her admitted TFJob is allowed: the unit follows the count and the scheduler admits the
  difference;
* raising its workers' requests is refused at the door, naming the pod set;
* the same edit written anyway (as the reconciler's identity, which the webhook does not check,
  standing for a write past the webhook) is caught by the reconciler: the TFJob is held, its unit
  queued again with its quota released and ``Evicted=True/PodSetsResized``, a Warning
  ``AdmittedJobResized`` on the job; the unit then follows the new size and, with room for it, the
  job is admitted and released again at that size.

What the apiserver fills in decides a pod's cost too (docs/compatibility.md#admitted-pod-size): in a
namespace with a LimitRange, ``alice`` cannot add a container without requests to her admitted
TFJob's workers, nor change their ``runtimeClassName``; with the webhook configurations taken away
she can, and each edit queues the job again at its new charge (the LimitRange default of the new
container, then the new class's overhead).

No training operator runs here: the test reads the hold and the units, not pods.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import system
from testenv.processes import wait_until
from tests import kube, tenancy
from tests.integration.test_job_kinds import batch_job, metadata, milli, template
from tests.scenario import Scenario, phase, status

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


def tf_job(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata(name, quota),
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template()}}},
    }


def alice(env: Scenario, *args: str, obj: Obj | None = None) -> tuple[int, str]:
    text = yaml.safe_dump(obj) if obj is not None else None
    done = tenancy.as_user(env.cluster, tenancy.ALICE, "-n", env.ns, *args, input_text=text)
    return done.returncode, done.stdout + done.stderr


def held(job: Obj) -> bool:
    return ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend") is True


def released(job: Obj) -> bool:
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    return not held(job) and bool(annotations.get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION))


def workers(replicas: int) -> str:
    return json.dumps({"spec": {"tfReplicaSpecs": {"Worker": {"replicas": replicas}}}})


def worker_cpu(cpu: str) -> str:
    container = {"name": "main", "resources": {"requests": {"cpu": cpu}}}
    return json.dumps(
        {"spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [container]}}}}}}
    )


def admitted_replicas(unit: Obj) -> int:
    return sum(a.get("replicas", 0) for a in status(unit).get("admissions") or [])


async def test_an_admitted_job_is_scaled_but_not_resized_and_one_resized_anyway_is_queued_again(
    alice_in: Scenario,
) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "4", "memory": "64Gi"})
    job = tf_job("train", quota)
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    unit_name = "train-tf-qu"
    await env.wait_unit(unit_name, lambda u: phase(u) == "Dequeued", what="admitted")
    await env.wait_job(job, released, what="released")

    # Scaling is allowed: the unit follows the count, the scheduler admits the second worker.
    code, out = alice(env, "patch", "tfjob", "train", "--type=merge", "-p", workers(2))
    assert code == 0, out
    await env.wait_unit(unit_name, lambda u: admitted_replicas(u) == 2, what="the second worker admitted")

    # Raising the requests of admitted pods is refused, naming the pod set.
    code, out = alice(env, "patch", "tfjob", "train", "--type=merge", "-p", worker_cpu("2"))
    assert code != 0 and "the job is admitted with pods of the size it was queued with" in out, out
    assert "worker" in out, out
    # So is a pod-level request added over the same containers (what the pods would really take).
    pod_level = {
        "spec": {
            "tfReplicaSpecs": {"Worker": {"template": {"spec": {"resources": {"requests": {"cpu": "8"}}}}}}
        }
    }
    code, out = alice(env, "patch", "tfjob", "train", "--type=merge", "-p", json.dumps(pod_level))
    assert code != 0 and "the job is admitted with pods of the size it was queued with" in out, out
    unit = await env.wait_unit(unit_name)
    assert milli(unit["spec"]["resource"])["cpu"] == 2000, unit["spec"]

    # Written past the webhook: the reconciler holds the job and queues it again at its new size,
    # 2 x 3 cpu, which the quota of 4 cannot hold: it stays held and waits.
    kube.kubectl(
        env.cluster,
        f"--as={system.RECONCILER_USER}",
        "patch",
        "tfjob",
        "train",
        "-n",
        env.ns,
        "--type=merge",
        "-p",
        worker_cpu("3"),
    )
    event = await env.wait_event(
        "train", names.EventReason.ADMITTED_JOB_RESIZED, kind="TFJob", type_="Warning"
    )
    assert "worker" in event.message, event.message
    await env.wait_job(job, held, what="held again")
    # (Evicted=True/PodSetsResized is set by the requeue and turned to False/Requeued by the
    # scheduler's first look at the queued unit: tests/unit/test_admitted_resize.py reads it.)
    # The requeue writes Enqueued with a "resized" message; the scheduler's reason comes in a
    # later write: wait for that one.
    requeued = await env.wait_unit(
        unit_name,
        lambda u: (
            phase(u) == "Enqueued"
            and milli(u["spec"]["resource"]).get("cpu") == 6000
            and "limited quotaName" in status(u).get("message", "")
        ),
        what="queued again, following the new size, and parked for it",
    )
    assert not status(requeued).get("admissions"), status(requeued)
    assert held(await env.get_job(job))

    # Queued, the job may be changed again: one worker of 3 cpu fits, is admitted and released.
    code, out = alice(env, "patch", "tfjob", "train", "--type=merge", "-p", workers(1))
    assert code == 0, out
    admitted = await env.wait_unit(
        unit_name,
        lambda u: phase(u) == "Dequeued" and milli(u["spec"]["resource"]).get("cpu") == 3000,
        what="admitted at the new size",
    )
    assert admitted_replicas(admitted) == 1, status(admitted)
    await env.wait_job(job, released, what="released again")


async def test_a_job_is_charged_its_pod_level_request_not_its_containers_sum(alice_in: Scenario) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "2", "memory": "64Gi"})
    jobs = {}
    for name, pod_cpu in (("big", "3"), ("fits", "1")):
        job = batch_job(name, quota, parallelism=1)
        spec = job["spec"]["template"]["spec"]
        spec["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
        spec["resources"] = {"requests": {"cpu": pod_cpu}}
        code, out = alice(env, "create", "-f", "-", obj=job)
        assert code == 0, out
        env.remember(job)
        jobs[name] = job
    fits = await env.wait_unit("fits", lambda u: phase(u) == "Dequeued", what="admitted")
    assert milli(fits["spec"]["resource"])["cpu"] == 1000, fits["spec"]
    big = await env.wait_unit(
        "big", lambda u: "limited quotaName" in str(status(u).get("message")), what="waits for room"
    )
    assert milli(big["spec"]["resource"])["cpu"] == 3000, big["spec"]
    assert phase(big) == "Enqueued" and not status(big).get("admissions"), status(big)
    assert (await env.get_job(jobs["big"]))["spec"]["suspend"] is True


async def test_a_job_without_requests_is_charged_the_limit_range_default_and_an_admitted_one_keeps_it(
    alice_in: Scenario,
) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "2", "memory": "64Gi"})
    limit_range = kube.limit_range(env.ns, {"cpu": "1"})
    env.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(limit_range))  # the admin's

    def bare(name: str, parallelism: int) -> Obj:
        job = batch_job(name, quota, parallelism=parallelism)
        job["spec"]["template"]["spec"]["containers"][0].pop("resources", None)
        return job

    small, big = bare("small", 1), bare("big", 3)
    for job in (small, big):
        code, out = alice(env, "create", "-f", "-", obj=job)
        assert code == 0, out
        env.remember(job)
    admitted = await env.wait_unit("small", lambda u: phase(u) == "Dequeued", what="admitted at 1 cpu")
    assert milli(admitted["spec"]["resource"]).get("cpu") == 1000, admitted["spec"]
    waiting = await env.wait_unit(
        "big", lambda u: "limited quotaName" in str(status(u).get("message")), what="3 x 1 cpu waits"
    )
    assert milli(waiting["spec"]["resource"]).get("cpu") == 3000, waiting["spec"]

    # The admin raises the default: the queued job follows it, the admitted one keeps its charge
    # (its pods were made with the old default) and is not taken for a resized job.
    limit_range["spec"]["limits"][0]["defaultRequest"] = {"cpu": "500m"}
    env.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(limit_range))
    await env.wait_unit(
        "big", lambda u: milli(u["spec"]["resource"]).get("cpu") == 1500, what="follows the new default"
    )
    kept = await env.wait_unit("small")
    assert phase(kept) in ("Dequeued", "Running") and milli(kept["spec"]["resource"]).get("cpu") == 1000, kept
    events = kube.events_of(env.cluster, env.ns, "small")
    assert not [e for e in events if e["reason"] == names.EventReason.ADMITTED_JOB_RESIZED], events


async def test_a_runtime_class_overhead_is_charged(alice_in: Scenario) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "4", "memory": "64Gi"})
    with kube.runtime_class(env.cluster, env.name("rc"), {"cpu": "250m"}) as runtime_class:
        job = batch_job("sandboxed", quota, parallelism=2)
        job["spec"]["template"]["spec"]["runtimeClassName"] = runtime_class
        code, out = alice(env, "create", "-f", "-", obj=job)
        assert code == 0, out
        env.remember(job)
        unit = await env.wait_unit(
            "sandboxed",
            lambda u: milli(u["spec"]["resource"]).get("cpu") == 2500,
            what="charged 2 x (1 + 250m)",
        )
        assert unit["spec"]["podSet"][0]["template"]["spec"]["overhead"] == {"cpu": "250m"}


SIDECAR = json.dumps(
    [
        {
            "op": "add",
            "path": "/spec/tfReplicaSpecs/Worker/template/spec/containers/-",
            "value": {"name": "sidecar", "image": "busybox", "command": ["true"]},
        }
    ]
)


def worker_runtime_class(name: str) -> str:
    return json.dumps(
        {"spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"runtimeClassName": name}}}}}}
    )


@contextlib.contextmanager
def webhook_unregistered(env: Scenario, processes: system.Processes) -> Iterator[None]:
    """The webhook configurations taken away (as before the webhook is installed) until alice's
    refused edit passes a server-side dry run, then put back."""
    system.unregister_webhook(env.cluster)
    try:

        def door_open() -> bool:
            return (
                alice(env, "patch", "tfjob", "train", "--dry-run=server", "--type=json", "-p", SIDECAR)[0]
                == 0
            )

        wait_until(door_open, timeout=30, what="webhook gone")
        yield
    finally:
        system.register_webhook(env.cluster, port=processes.webhook_port)

        def door_shut() -> bool:
            code, out = alice(
                env, "patch", "tfjob", "train", "--dry-run=server", "--type=json", "-p", SIDECAR
            )
            return code != 0 and "Forbidden" in out

        wait_until(door_shut, timeout=30, what="webhook back")


async def test_an_admitted_job_cannot_gain_a_container_or_change_its_runtime_class_uncharged(
    alice_in: Scenario, system_integration: system.Processes
) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "8", "memory": "64Gi"})
    env.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(kube.limit_range(env.ns, {"cpu": "1"})))
    job = tf_job("train", quota)
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    unit_name = "train-tf-qu"
    admitted = await env.wait_unit(unit_name, lambda u: phase(u) == "Dequeued", what="admitted")
    assert milli(admitted["spec"]["resource"])["cpu"] == 1000, admitted["spec"]
    await env.wait_job(job, released, what="released")

    with kube.runtime_class(env.cluster, env.name("rc"), {"cpu": "250m"}) as runtime_class:
        # At the door: a new container (which the LimitRange would give 1 cpu) and another
        # RuntimeClass (its overhead) are refused, naming the pod set and what changed.
        code, out = alice(env, "patch", "tfjob", "train", "--type=json", "-p", SIDECAR)
        assert code != 0 and "the job is admitted with pods of the shape" in out, out
        assert "worker" in out and "containers" in out, out
        code, out = alice(
            env, "patch", "tfjob", "train", "--type=merge", "-p", worker_runtime_class(runtime_class)
        )
        assert code != 0 and "runtimeClassName" in out, out

        with webhook_unregistered(env, system_integration):
            # Past the door, the sidecar is charged its default: queued again at 1 + 1 cpu.
            code, out = alice(env, "patch", "tfjob", "train", "--type=json", "-p", SIDECAR)
            assert code == 0, out
            event = await env.wait_event(
                "train", names.EventReason.ADMITTED_JOB_RESIZED, kind="TFJob", type_="Warning"
            )
            assert "worker" in event.message, event.message
            readmitted = await env.wait_unit(
                unit_name,
                lambda u: phase(u) == "Dequeued" and milli(u["spec"]["resource"]).get("cpu") == 2000,
                what="admitted again at its new charge, the sidecar's default included",
            )
            assert admitted_replicas(readmitted) == 1, status(readmitted)
            await env.wait_job(job, released, what="released at the new charge")

            # Then the RuntimeClass: queued again with the class's overhead added.
            code, out = alice(
                env, "patch", "tfjob", "train", "--type=merge", "-p", worker_runtime_class(runtime_class)
            )
            assert code == 0, out
            await env.wait_unit(
                unit_name,
                lambda u: phase(u) == "Dequeued" and milli(u["spec"]["resource"]).get("cpu") == 2250,
                what="admitted again with the RuntimeClass overhead",
            )
            # (The unit is admitted at 2250 only after a requeue: an admitted unit never follows
            # a changed per-pod charge, tests/unit/test_poddefaults.py. The Warning of the second
            # requeue may be folded into the first by the event writer, so it is not counted.)

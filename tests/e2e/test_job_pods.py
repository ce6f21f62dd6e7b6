"""Jobs, their pods and their QueueUnits end to end: gating, reporting, finishing and deletion.

Real controller-manager (Job controller, garbage collector), scheduler and kwok fake nodes with the
webhook and the reconciler running (``system_e2e``). Jobs are submitted with plain kubectl, with
the quota label and no suspend field (the webhook holds them).

* Admission is per unit: a Job whose whole demand does not fit is not admitted at all (no pod is
  ever created for it), while a smaller one in the same quota runs.
* S26-style gating with a real Job: only ``admissions[i].replicas`` pods are ungated; pods beyond
  that (the Job scaled up after admission) keep the gate ``koord-queue/admission``.
* ``podState`` and ``admissions[].running`` report bound pods while they run; a finished Job's unit
  goes Succeed with ``admissions: []`` and its quota admits the next job.
* Deleting a Job deletes its QueueUnit (owner reference + garbage collection) and frees its quota.

Pods finish after ``KWOK_POD_DURATION`` (3s) unless the template sets the kwok annotation
``pod-complete.stage.kwok.x-k8s.io/delay``, used here to keep pods running while they are observed.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
import yaml

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import parse_time
from koord_queue.shared.api.names import Message
from koord_queue.shared.jobs import podplan
from testenv import system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube
from tests.scenario import Obj, Scenario, gated, phase, status

pytestmark = pytest.mark.e2e

QUEUE_UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


def room(cpu: str) -> dict[str, str]:
    """A quota's min = max: ``cpu`` CPUs and memory for every test job."""
    return {"cpu": cpu, "memory": "64Gi"}


def job(
    name: str,
    quota_name: str,
    *,
    parallelism: int,
    completions: int | None = None,
    run_for: str | None = None,
) -> Obj:
    """A batch Job of ``parallelism`` pods asking for 1 CPU each; ``run_for`` keeps each pod running."""
    template: Obj = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:stable",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
                }
            ],
        }
    }
    if run_for is not None:
        template["metadata"] = {"annotations": {COMPLETE_DELAY_ANNOTATION: run_for}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota_name}},
        "spec": {
            "parallelism": parallelism,
            "completions": completions if completions is not None else parallelism,
            "template": template,
        },
    }


@pytest.fixture
async def env(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with kube.client(e2e_cluster) as api:
        yield Scenario(api, e2e_cluster, namespace_in, explain_with_pods=True)


async def test_a_job_larger_than_its_quota_is_never_partly_admitted_while_a_smaller_one_runs(
    env: Scenario,
) -> None:
    q = env.name("two")
    await env.add_quota(q, room("2"))
    async with kube.Recorder(env.cluster, QUEUE_UNITS, namespace=env.ns) as units:
        env.apply(job("big", q, parallelism=3))
        parked = await env.wait_unit(
            "big", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="parked on cpu"
        )
        assert not status(parked).get("admissions")

        env.apply(job("small", q, parallelism=2))
        await env.wait_unit(
            "small", lambda u: phase(u) == "Succeed", what="small ran and finished", timeout=60
        )
        assert (await env.get_job("small"))["status"].get("succeeded") == 2

        # The finished job's 2 CPU went back; big still does not fit and was never partly run.
        big_unit = await env.find_unit("big")
        assert big_unit is not None
        assert phase(big_unit) in ("", "Enqueued"), status(big_unit)
        assert not status(big_unit).get("admissions")
        assert (await env.get_job("big"))["spec"]["suspend"] is True
        assert await env.pods("big") == []

        await env.resize_quota(q, room("3"))
        done = await env.wait_unit(
            "big", lambda u: phase(u) == "Succeed", what="big admitted whole", timeout=60
        )
        assert status(done)["admissions"] == []
        assert (await env.get_job("big"))["status"].get("succeeded") == 3
    granted = [
        [(a["name"], a["replicas"]) for a in status(v).get("admissions") or []] for v in units.versions("big")
    ]
    assert all(g in ([], [("big", 3)]) for g in granted), granted


async def test_s26_only_the_admitted_number_of_pods_is_ungated(env: Scenario) -> None:
    q = env.name("gate")
    await env.add_quota(q, room("2"))
    env.apply(job("scaled", q, parallelism=2, completions=5, run_for="60s"))
    await env.wait_unit(
        "scaled",
        lambda u: status(u).get("admissions") == [{"name": "scaled", "replicas": 2, "running": 2}],
        what="2 replicas admitted and running",
        timeout=60,
    )

    # Scale the admitted Job to 5: the Job controller creates 3 more pods from the gated template,
    # and the unit's pod set follows, but only the 2 admitted replicas may be scheduled.
    env.kubectl("patch", "-n", env.ns, "job", "scaled", "--type=merge", "-p", '{"spec":{"parallelism":5}}')
    unit = await env.wait_unit(
        "scaled",
        lambda u: (
            [p["count"] for p in u["spec"]["podSet"]] == [5]
            and status(u).get("podState") == {"running": 2, "pending": 3}
        ),
        what="pod set count 5, podState 2 running + 3 pending",
    )
    assert [(a["name"], a["replicas"]) for a in status(unit)["admissions"]] == [("scaled", 2)]
    pods = await env.live_pods("scaled")
    assert len(pods) == 5
    assert sorted(gated(p) for p in pods) == [False, False, True, True, True], [
        (p.metadata.name, p.spec.node_name, p.spec.scheduling_gates) for p in pods
    ]
    assert all(p.spec.node_name for p in pods if not gated(p))
    assert not any(p.spec.node_name for p in pods if gated(p))


async def test_running_pods_are_reported_and_a_finished_job_releases_its_quota(env: Scenario) -> None:
    q = env.name("five")
    await env.add_quota(q, room("5"))
    async with kube.Recorder(env.cluster, QUEUE_UNITS, namespace=env.ns) as units:
        env.apply(job("first", q, parallelism=5, run_for="20s"))
        await env.wait_unit("first", lambda u: phase(u) == "Running", what="Running", timeout=60)
        pods = await env.live_pods("first")
        assert len(pods) == 5 and not any(gated(p) for p in pods)

        env.apply(job("second", q, parallelism=1))
        await env.wait_unit(
            "second",
            lambda u: Message.limited(q, "cpu") in str(status(u).get("message")),
            what="second parked",
        )
        assert (await env.get_job("second"))["spec"]["suspend"] is True

        finished = await env.wait_unit(
            "first", lambda u: phase(u) == "Succeed", what="first Succeed", timeout=60
        )
    assert status(finished)["admissions"] == []
    assert status(finished)["message"] == Message.SUCCEEDED
    # While the pods ran, every one of them was reported (a watch sees every version; a poll may not).
    history = [
        (phase(v), status(v).get("podState"), status(v).get("admissions")) for v in units.versions("first")
    ]
    assert (
        "Running",
        {"running": 5, "pending": 0},
        [{"name": "first", "replicas": 5, "running": 5}],
    ) in history, history

    await env.wait_unit(
        "second", lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="second admitted"
    )
    second = await env.wait_job("second", lambda j: j["spec"]["suspend"] is False, what="second resumed")
    assert second["metadata"]["annotations"].get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)


def written_at(unit_status: Obj) -> float:
    at = parse_time(unit_status.get("lastUpdateTime"))
    assert at is not None, unit_status
    return at


async def test_a_single_pod_job_costs_three_unit_status_writes(env: Scenario) -> None:
    """docs/compatibility.md#coalesced-pod-reports: admitted, Running, finished. The counts of a
    created pod and of a finished one ride with the next write instead of costing their own (five
    or six status writes without coalescing)."""
    q = env.name("solo")
    await env.add_quota(q, room("1"))
    async with kube.Recorder(env.cluster, QUEUE_UNITS, namespace=env.ns) as units:
        env.apply(job("solo", q, parallelism=1))
        # Waited on the record itself: a GET can see Succeed before this watch has delivered it.
        await units.until("solo", lambda u: phase(u) == "Succeed", what="Succeed", timeout=60)
    statuses = [status(v) for v in units.versions("solo")]
    writes = [now for before, now in zip([{}, *statuses], statuses, strict=False) if now != before]
    phases = [w.get("phase") for w in writes]
    assert [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]] == [
        "Dequeued",
        "Running",
        "Succeed",
    ], writes
    # Three when the kubelet and the Job controller report within 5 s (milliseconds on a quiet
    # machine). Under load a report of counts alone may be forced out after waiting its full window:
    # such a write (one that podplan.can_wait lets wait) comes at least COALESCE_SECONDS after the
    # write before it (less one second for lastUpdateTime's precision); one written at once would
    # come sooner. (A bound pod seen before the Job controller counts it active is written at once,
    # with the phase unchanged: reclaim reads `running`.)
    for before, now in itertools.pairwise(writes):
        changed = {k: v for k, v in now.items() if before.get(k) != v}
        if podplan.can_wait({"status": before}, {"status": changed}):
            gap = written_at(now) - written_at(before)
            assert gap >= podplan.COALESCE_SECONDS - 1, ("a count that did not wait its window", writes)
    running = next(w for w in writes if w.get("phase") == "Running")
    assert running["podState"] == {"running": 1, "pending": 0}, writes


async def test_deleting_a_job_deletes_its_unit_and_frees_its_quota(env: Scenario) -> None:
    q = env.name("one")
    await env.add_quota(q, room("1"))
    env.apply(job("holder", q, parallelism=1, run_for="600s"))
    holder = await env.wait_unit("holder", lambda u: phase(u) == "Running", what="holder Running", timeout=60)
    assert holder["metadata"]["ownerReferences"][0]["uid"] == (await env.get_job("holder"))["metadata"]["uid"]
    env.apply(job("waiter", q, parallelism=1))
    await env.wait_unit(
        "waiter", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="waiter parked"
    )

    env.kubectl("delete", "-n", env.ns, "job", "holder", "--wait=false")

    async def unit_gone() -> bool:
        return await env.find_unit("holder") is None

    await kube.eventually(unit_gone, what="holder's QueueUnit garbage-collected")
    await env.wait_unit(
        "waiter", lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="waiter admitted"
    )
    await env.wait_job("waiter", lambda j: j["spec"]["suspend"] is False, what="waiter resumed")


async def test_a_job_created_with_generate_name_is_admitted_and_its_pods_run(env: Scenario) -> None:
    """Under ``generateName`` the webhook cannot know the job's name, so its pod template carries
    the gate but no related-QueueUnit annotation; the pods must still be found and ungated."""
    q = env.name("gen")
    await env.add_quota(q, room("2"))
    obj = job("ignored", q, parallelism=2)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "gen-"
    out = env.kubectl("create", "-n", env.ns, "-f", "-", "-o", "name", input_text=yaml.safe_dump(obj))
    name = out.stdout.strip().split("/")[-1]
    await env.wait_unit(name, lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="admitted")
    await env.wait_job(
        name,
        lambda j: (j.get("status") or {}).get("succeeded") == 2,
        what="both pods ungated, run and succeed",
    )
    await env.wait_unit(name, lambda u: phase(u) == "Succeed", what="Succeed")

"""Events where users look: ``kubectl describe job`` shows, on the Job itself, that it is queued (its
quota and its position when it first had to wait), when it is admitted after waiting, and when it is
preempted (reconciler/job_events.py), and what that costs in event writes per job.

The cost is counted from the API (every Event the reconciler wrote about the job or its unit):
a job admitted at once costs exactly what it did before, the unit's ``Scheduled`` event and nothing
on the job, so the admission path stays at 4 writes (BENCHMARKS.md); a ``batch/v1`` Job that waits
gets exactly one event on the job (``Queued``; its controller's own ``Resumed`` tells the release)
besides its unit's ``FailedScheduling`` and ``Scheduled``; a kind whose controller does not announce
the release also gets ``Admitted``.

The integration profile has no Job controller: a resumed Job gets no pods, so an admitted Job's unit
keeps holding its quota with nothing running, which is what the preemption case needs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube
from tests import scenario as s
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

COMPONENT = names.CONTROLLER_AGENT


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


def job(name: str, quota: str, *, cpu: str = "1", priority: int | None = None) -> dict[str, Any]:
    annotations = {} if priority is None else {names.PRIORITY_ANNOTATION: str(priority)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}, "annotations": annotations},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                    ],
                }
            }
        },
    }


def create(sc: Scenario, body: dict[str, Any]) -> None:
    kube.kubectl(sc.cluster, "create", "-n", sc.ns, "-f", "-", input_text=json.dumps(body))


def ours(sc: Scenario) -> list[dict[str, Any]]:
    """Every Event the reconciler wrote in the namespace, oldest first."""
    out = kube.kubectl(sc.cluster, "get", "events", "-n", sc.ns, "-o", "json")
    items = [
        e for e in json.loads(out.stdout)["items"] if (e.get("source") or {}).get("component") == COMPONENT
    ]
    return sorted(items, key=lambda e: e.get("eventTime") or e.get("firstTimestamp") or "")


def about(events: list[dict[str, Any]], kind: str, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in events
        if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name
    ]


async def until(sc: Scenario, check: Any, what: str) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        events = ours(sc)
        return events if check(events) else None

    found: list[dict[str, Any]] = await kube.eventually(probe, timeout=30, what=what)
    return found


async def test_a_job_that_waits_is_told_queued_and_one_admitted_at_once_costs_no_job_event(
    sc: Scenario,
) -> None:
    q = sc.name("events")
    await sc.create_quota(s.quota(q, cpu="1"))
    create(sc, job("first", q))
    await sc.wait_phase("first", "Dequeued")
    create(sc, job("second", q))
    waited = await until(
        sc, lambda ev: any(r == "Queued" for _, r, _ in about(ev, "Job", "second")), "Queued on job second"
    )
    ((kind, reason, message),) = about(waited, "Job", "second")
    assert (kind, reason) == ("Normal", "Queued")
    reason = f"limited quotaName:{q}, limited resKey:cpu,; preempt failed"
    assert message == f"queued in quota {q} at position 1 of 1: {reason}"
    described = kube.kubectl(sc.cluster, "describe", "job", "second", "-n", sc.ns).stdout
    assert "Queued" in described and f"queued in quota {q} at position 1 of 1" in described

    await sc.patch_quota(q, {"spec": {"max": {"cpu": "2"}, "min": {"cpu": "2"}}})
    await sc.wait_phase("second", "Dequeued")
    done = await until(
        sc,
        lambda ev: any(r == "Scheduled" for _, r, _ in about(ev, "QueueUnit", "second")),
        "Scheduled on unit second",
    )
    # A later marker: a third job, created after second's admission, waits and is told so. An
    # Admitted event for second would have been queued with its Scheduled, long before.
    create(sc, job("third", q))
    done = await until(
        sc, lambda ev: any(r == "Queued" for _, r, _ in about(ev, "Job", "third")), "Queued on job third"
    )
    # The cost: a job admitted at once writes no event at all (scheduledEvents: AfterWait, the
    # default: the admission path keeps its 4 writes); a Job that waited writes one event on the job
    # besides its unit's: its release is the Job controller's Resumed, not a second event of ours.
    assert [r for _, r, _ in about(done, "Job", "second")] == ["Queued"]
    assert about(done, "Job", "first") == []
    assert about(done, "QueueUnit", "first") == []
    assert [r for _, r, _ in about(done, "QueueUnit", "second")] == ["FailedScheduling", "Scheduled"]


async def test_a_preempted_job_is_told_so(sc: Scenario) -> None:
    q = sc.name("preempted")
    annotations = {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}
    await sc.create_quota(s.quota(q, cpu="1", annotations=annotations))
    create(sc, job("low", q, priority=1))
    await sc.wait_phase("low", "Dequeued")
    create(sc, job("high", q, priority=10))
    # The unit's Preempted and the job's are two events about two objects, written by the event
    # writers in no particular order: wait for both.
    events = await until(
        sc,
        lambda ev: all(
            any(r == "Preempted" for _, r, _ in about(ev, kind, "low")) for kind in ("Job", "QueueUnit")
        ),
        "Preempted on job low and on its unit",
    )
    ((kind, _, message),) = [e for e in about(events, "Job", "low") if e[1] == "Preempted"]
    assert kind == "Normal"
    assert message == (
        f"preempted in quota {q}: 1 replica(s) are reclaimed (unbound pods only) so that "
        "higher-priority high can be admitted; the job waits for its next admission"
    )
    assert [r for _, r, _ in about(events, "QueueUnit", "low")].count("Preempted") == 1


async def test_a_unit_without_a_job_gets_no_job_event(sc: Scenario) -> None:
    q = sc.name("bare")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("holder", quota=q))
    await sc.wait_phase("holder", "Dequeued")
    await sc.create_unit(s.unit("bare", quota=q))
    await sc.wait_message("bare", f"limited quotaName:{q}")
    events = await until(
        sc,
        lambda ev: any(r == "FailedScheduling" for _, r, _ in about(ev, "QueueUnit", "bare")),
        "bare parked",
    )
    assert [e for e in events if e["involvedObject"]["kind"] != "QueueUnit"] == []

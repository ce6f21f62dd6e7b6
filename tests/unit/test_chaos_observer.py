"""The chaos observer's ownership-keyed invariant ``unadmitted-pod-schedulable`` and the forged
claims of a hostile tenant (pure: objects are fed to the observer as the etcd decoder yields them)."""

from __future__ import annotations

from typing import Any

import pytest

from chaos import observer as obs
from chaos.observer import Observer
from shared.api import names

NS = "chaos"
SCHEDULABLE = "unadmitted-pod-schedulable"
JOB_UID = "uid-job-1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(obs.time, "monotonic", fake)
    return fake


def job(
    name: str = "j", *, uid: str = JOB_UID, suspend: bool = False, quota: str | None = "q"
) -> dict[str, Any]:
    labels = {names.QUOTA_NAME_LABEL: quota} if quota else {}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels},
        "spec": {"suspend": suspend},
        "status": {"conditions": []},
    }


def unit(name: str = "j", *, replicas: int = 0, reclaim: bool = False) -> dict[str, Any]:
    admission: dict[str, Any] = {"name": name, "replicas": replicas}
    if reclaim:
        admission["reclaimState"] = {"replicas": 1}
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {names.QUOTA_NAME_LABEL: "q"}},
        "spec": {
            "consumerRef": {"kind": "Job", "name": name, "namespace": NS},
            "podSet": [{"name": name, "count": 2, "template": {"spec": {"containers": []}}}],
        },
        "status": {
            "phase": "Dequeued" if replicas else "Enqueued",
            "admissions": [admission] if replicas else [],
        },
    }


def pod(
    name: str,
    *,
    namespace: str = NS,
    owner_uid: str | None = JOB_UID,
    gated: bool = False,
    node: str = "",
    unit_ref: str = f"{NS}/j",
) -> dict[str, Any]:
    owners = [{"kind": "Job", "name": "j", "uid": owner_uid}] if owner_uid else []
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: unit_ref},
            "ownerReferences": owners,
        },
        "spec": {"nodeName": node, "schedulingGates": [{"name": names.ADMISSION_GATE}] if gated else []},
        "status": {"phase": "Pending"},
    }


def observer() -> Observer:
    return Observer(namespaces=frozenset({NS, "mallory"}))


def feed_unit(o: Observer, raw: dict[str, Any] | None, name: str = "j") -> None:
    o._last_event_at = obs.time.monotonic()  # as apply() does for every etcd event
    o._unit_event(f"{NS}/{name}", raw, o.revision + 1)
    o.revision += 1


def feed_job(o: Observer, raw: dict[str, Any] | None, name: str = "j") -> None:
    o._last_event_at = obs.time.monotonic()
    o._job_event(f"{NS}/{name}", raw, o.revision + 1)
    o.revision += 1


def feed_pod(o: Observer, raw: dict[str, Any] | None, key: str) -> None:
    o._last_event_at = obs.time.monotonic()
    o._pod_event(key, raw, o.revision + 1)
    o.revision += 1


def test_released_pods_within_the_admission_are_fine_one_more_is_a_violation(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    feed_pod(o, pod("p1"), f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]
    assert o.checks["schedulable pods of a managed job <= admitted (by owner UID)"] == 1
    feed_pod(o, pod("p2", node="n1"), f"{NS}/p2")
    assert o.violation_counts[SCHEDULABLE] == 1
    # Reported once per episode, not on every later event.
    feed_pod(o, pod("p2", node="n2"), f"{NS}/p2")
    assert o.violation_counts[SCHEDULABLE] == 1


def test_a_bound_pod_of_a_queued_job_is_a_violation_even_without_the_annotation(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=0))
    feed_job(o, job())
    feed_pod(o, pod("p1", node="n1", unit_ref=""), f"{NS}/p1")
    assert o.violation_counts[SCHEDULABLE] == 1
    assert "0 admitted" in o.violations[0].detail


def test_gated_unbound_pods_are_not_schedulable(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=0))
    feed_job(o, job())
    feed_pod(o, pod("p1", gated=True), f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]


def test_forged_claims_of_a_hostile_tenant_are_ignored_by_both_invariants(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    # Her own namespace, the job's real UID, bound; and a bare bound pod in the job's namespace.
    o._pod_event("mallory/claim", pod("claim", namespace="mallory", node="n1"), 10)
    feed_pod(o, pod("bare", owner_uid=None, node="n1"), f"{NS}/bare")
    feed_pod(o, pod("fake-uid", owner_uid="made-up", node="n1"), f"{NS}/fake-uid")
    assert not o.violation_counts
    assert o.stats["pods naming a unit they do not belong to (ignored)"] == 3
    assert o.stats["pods claiming a job of another namespace (ignored)"] == 1
    # Their deletion is not judged as a reclaim of the unit either.
    feed_unit(o, unit(replicas=1, reclaim=True))
    feed_pod(o, None, f"{NS}/bare")
    assert not o.violation_counts


def test_an_excess_repaired_within_the_grace_is_tolerated(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=2))
    feed_job(o, job())
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    feed_pod(o, pod("p2"), f"{NS}/p2")
    clock.now += 0.5
    feed_unit(o, unit(replicas=1))  # the admission shrinks before the extra pod is gone
    assert not o.violation_counts[SCHEDULABLE]
    clock.now += 0.5
    feed_pod(o, None, f"{NS}/p2")
    assert not o.violation_counts[SCHEDULABLE]
    assert o.stats["schedulable pods above admission, repaired within the grace (tolerated)"] == 1


def test_an_excess_outliving_the_grace_is_a_violation(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=2))
    feed_job(o, job())
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    feed_pod(o, pod("p2"), f"{NS}/p2")
    feed_unit(o, unit(replicas=1))
    assert not o.violation_counts[SCHEDULABLE]
    for _ in range(4):  # the etcd stream goes on; the grace runs out
        clock.now += 0.8
        o.apply(b"/registry/unrelated", b"", o.revision + 1)
    assert o.violation_counts[SCHEDULABLE] == 1


def test_a_stalled_stream_extends_the_grace(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    feed_pod(o, pod("p1"), f"{NS}/p1")
    feed_unit(o, unit(replicas=0))
    clock.now += 10.0  # etcd paused: nothing could be repaired meanwhile
    o.apply(b"/registry/unrelated", b"", o.revision + 1)
    assert not o.violation_counts[SCHEDULABLE]
    feed_pod(o, None, f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]


def test_finish_judges_what_is_still_pending(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    feed_pod(o, pod("p1"), f"{NS}/p1")
    feed_unit(o, unit(replicas=0))
    assert not o.violation_counts[SCHEDULABLE]
    o.finish()
    assert o.violation_counts[SCHEDULABLE] == 1


def test_pods_of_a_suspended_or_deleted_job_are_on_their_way_out(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=0))
    feed_job(o, job(suspend=True))
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]


def test_a_pod_seen_before_its_job_is_judged_when_the_job_arrives(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=0))
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]
    feed_job(o, job())
    assert o.violation_counts[SCHEDULABLE] == 1


def test_a_running_job_labelled_into_a_queue_runs_without_admission(clock: Clock) -> None:
    o = observer()
    feed_job(o, job(quota=None))
    assert not o.violation_counts
    feed_job(o, job(quota="q"))
    assert o.violation_counts["run-without-admission"] == 1
    assert "labelled into a queue" in o.violations[0].detail

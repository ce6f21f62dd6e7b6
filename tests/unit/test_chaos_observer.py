"""The chaos observer's ownership-keyed invariant ``unadmitted-pod-schedulable`` and the forged
claims of a hostile tenant (pure: objects are fed to the observer as the etcd decoder yields them)."""

from __future__ import annotations

from typing import Any

import pytest

from chaos import k8sproto
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


# --- usage-mismatch: what each unit is charged against what it really holds -----------------------

USAGE_UNIT = "charged-below-running", "charged-for-unneeded", "charged-below-pod-size"


def charged_unit(
    *, replicas: int, count: int = 2, cpu: str = "1", phase: str = "", quota: str = "q"
) -> obs.UnitView:
    container = {"resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}
    raw = {
        "metadata": {"name": "j", "namespace": NS, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "consumerRef": {"kind": "Job", "name": "j", "namespace": NS},
            "podSet": [{"name": "j", "count": count, "template": {"spec": {"containers": [container]}}}],
        },
        "status": {
            "phase": phase or ("Running" if replicas else "Enqueued"),
            "admissions": [{"name": "j", "replicas": replicas}] if replicas else [],
        },
    }
    return obs.parse_unit(raw)


def charged_job(
    *, parallelism: int | None = 2, completions: int | None = 2, succeeded: int = 0, finished: bool = False
) -> obs.JobView:
    raw = job()
    raw["spec"].update({"parallelism": parallelism, "completions": completions})
    raw["status"]["succeeded"] = succeeded
    if finished:
        raw["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    return obs.parse_job(raw)


def bound_pod(name: str, *, cpu: str = "1", live: bool = True) -> obs.PodView:
    raw = pod(name, node="n1")
    raw["spec"]["containers"] = [{"resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]
    if not live:
        raw["status"]["phase"] = "Succeeded"
    return obs.parse_pod(raw)


@pytest.mark.parametrize(
    ("replicas", "job_kw", "pods", "expected"),
    [
        # (1) never charged less than what runs
        (2, {}, [bound_pod("a"), bound_pod("b")], set()),
        (1, {}, [bound_pod("a"), bound_pod("b")], {"charged-below-running"}),
        (0, {}, [bound_pod("a")], {"charged-below-running"}),
        (1, {}, [bound_pod("a"), bound_pod("b", live=False)], set()),  # a completed pod holds nothing
        # (2) never charged for pods the job no longer needs
        (2, {}, [], set()),  # admitted, pods not bound yet
        (2, {"succeeded": 1}, [bound_pod("a")], {"charged-for-unneeded"}),
        (1, {"succeeded": 1}, [bound_pod("a")], set()),
        (2, {"parallelism": 1, "completions": None}, [], {"charged-for-unneeded"}),  # lowered parallelism
        (
            2,
            {"parallelism": 1, "completions": None},
            [bound_pod("a"), bound_pod("b")],
            set(),
        ),  # never below bound
        (1, {"finished": True, "succeeded": 2}, [], {"charged-for-unneeded"}),
        (1, {"parallelism": None, "completions": None}, [], set()),  # parallelism defaults to 1
        # (3) charged at least the size that runs
        (1, {"parallelism": 1}, [bound_pod("a", cpu="2")], {"charged-below-pod-size"}),
        (1, {"parallelism": 1}, [bound_pod("a", cpu="500m")], set()),
        (1, {"parallelism": 1}, [bound_pod("a", cpu="1001m")], {"charged-below-pod-size"}),
    ],
)
def test_unit_accounting_rules(
    replicas: int, job_kw: dict[str, Any], pods: list[obs.PodView], expected: set[str]
) -> None:
    found = obs.unit_accounting(charged_unit(replicas=replicas), charged_job(**job_kw), pods)
    assert {m.rule for m in found} == expected
    assert all(m.subject == f"{NS}/j" for m in found)


def test_unit_accounting_skips_finished_units_and_falls_back_to_the_unit_count() -> None:
    done = charged_unit(replicas=2, phase="Succeed")
    assert obs.unit_accounting(done, charged_job(finished=True), [bound_pod("a")]) == []
    # Without a Job, the unit's own pod set count bounds the replicas.
    assert obs.unit_accounting(charged_unit(replicas=2, count=2), None, []) == []
    assert {m.rule for m in obs.unit_accounting(charged_unit(replicas=2, count=1), None, [])} == {
        "charged-for-unneeded"
    }


@pytest.mark.parametrize(
    ("accumulated", "units", "drift"),
    [
        ({"cpu": 2000, "memory": 128 * 2**20 * 1000}, [charged_unit(replicas=2)], False),
        ({}, [charged_unit(replicas=0)], False),
        ({}, [charged_unit(replicas=2, phase="Succeed")], False),  # finished units hold nothing
        ({"cpu": 1000, "memory": 64 * 2**20 * 1000}, [charged_unit(replicas=2)], True),
        ({"cpu": 2000, "memory": 128 * 2**20 * 1000}, [charged_unit(replicas=2, quota="other")], True),
    ],
)
def test_quota_accounting_sum_over_units(
    accumulated: dict[str, int], units: list[obs.UnitView], drift: bool
) -> None:
    found = obs.quota_accounting("q", accumulated, units)
    assert bool(found) == drift
    assert all(m.rule == "quota-usage-drift" and m.subject == "q" for m in found)


def test_quota_usage_drifts_when_an_admission_charges_more_than_its_replicas() -> None:
    """``admissions[i].resources`` above replicas x per-pod is what quota-overrun's usage counts."""
    o = observer()
    raw = unit(replicas=1)
    raw["status"]["admissions"][0]["resources"] = {"cpu": "4"}
    feed_unit(o, raw)
    rules = {m.rule for m in o.accounting_mismatches()}
    assert "quota-usage-drift" in rules
    feed_unit(o, unit(replicas=1))
    assert not [m for m in o.accounting_mismatches() if m.rule == "quota-usage-drift"]


def test_accounting_mismatches_reads_owned_bound_pods_only(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=1))
    raw_job = job()
    raw_job["spec"].update({"parallelism": 2, "completions": 2})
    feed_job(o, raw_job)
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    assert o.accounting_mismatches() == []
    feed_pod(o, pod("p2", node="n1"), f"{NS}/p2")
    assert {m.rule for m in o.accounting_mismatches()} == {"charged-below-running"}
    # A forged pod (another namespace, or no owner) is not the job's: it changes nothing.
    feed_pod(o, None, f"{NS}/p2")
    o._pod_event("mallory/claim", pod("claim", namespace="mallory", node="n1"), o.revision + 1)
    feed_pod(o, pod("bare", owner_uid=None, node="n1"), f"{NS}/bare")
    assert o.accounting_mismatches() == []
    assert o.checks["usage charged = held: units judged"] == 3


def test_accounting_skips_jobs_being_deleted_or_suspended(clock: Clock) -> None:
    o = observer()
    feed_unit(o, unit(replicas=0))
    feed_job(o, job(suspend=True))
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    assert o.accounting_mismatches() == []


class Polls:
    """A scripted ``current()`` for :func:`settle`, with a fake clock advanced by ``sleep``."""

    def __init__(self, rounds: list[list[str]]) -> None:
        self.rounds = rounds
        self.calls = 0
        self.now = 0.0

    async def current(self) -> list[obs.Mismatch]:
        keys = self.rounds[min(self.calls, len(self.rounds) - 1)]
        self.calls += 1
        return [obs.Mismatch("charged-for-unneeded", k, f"detail {k}") for k in keys]

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("rounds", "persisted", "transient"),
    [
        ([[]], [], 0),
        ([["a"], []], [], 1),  # converged within the window: tolerated
        ([["a", "b"], ["a"], ["a", "c"]], ["a"], 2),  # only what was present at every poll
        ([["a"], ["b"], ["a"]], [], 2),  # went away once: not persistent
        ([["a"]], ["a"], 0),
    ],
)
def test_settle_reports_only_what_persists_for_the_whole_window(
    rounds: list[list[str]], persisted: list[str], transient: int
) -> None:
    import asyncio

    polls = Polls(rounds)
    settled = asyncio.run(
        obs.settle(polls.current, window=5.0, interval=1.0, clock=lambda: polls.now, sleep=polls.sleep)
    )
    assert sorted(m.subject for m in settled.persisted) == persisted
    assert settled.transient == transient
    assert polls.now <= 5.0 + 1.0


def test_pod_and_job_protobuf_fields_for_accounting() -> None:
    """The extra protobuf fields the accounting reads: a pod's container requests and overhead,
    a Job's parallelism and completions (hand-encoded wire format)."""

    def uvarint(value: int) -> bytes:
        out = bytearray()
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes([*out, value])

    def tag(number: int, payload: bytes) -> bytes:
        return uvarint(number << 3 | 2) + uvarint(len(payload)) + payload

    def varint(number: int, value: int) -> bytes:
        return uvarint(number << 3) + uvarint(value)

    def quantity(name: str, text: str) -> bytes:
        return tag(1, name.encode()) + tag(2, tag(1, text.encode()))

    resources = tag(2, quantity("cpu", "500m")) + tag(1, quantity("memory", "1Gi"))
    container = tag(1, b"c") + tag(8, resources)
    spec = tag(2, container) + tag(32, quantity("cpu", "10m")) + tag(10, b"node-1")
    envelope = k8sproto.MAGIC + tag(2, tag(1, tag(1, b"p")) + tag(2, spec))
    raw = obs.decode_pod(envelope)
    view = obs.parse_pod(raw)
    assert view.bound
    assert view.request == {"cpu": 510, "memory": 2**30 * 1000}

    job_spec = varint(1, 2) + varint(2, 3) + varint(10, 1)
    job_envelope = k8sproto.MAGIC + tag(2, tag(1, tag(1, b"j")) + tag(2, job_spec))
    parsed = obs.parse_job(obs.decode_job(job_envelope))
    assert (parsed.parallelism, parsed.completions, parsed.suspended) == (2, 3, True)

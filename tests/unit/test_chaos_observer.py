"""The chaos observer's ownership-keyed invariant ``unadmitted-pod-schedulable``, the forged claims
of a hostile tenant, ``usage-mismatch``, and the quota-guarantee invariants ``guarantee-unserved``
and ``guarantee-taken`` (pure: objects are fed to the observer as the etcd decoder yields them)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from chaos import k8sproto, views
from chaos import observer as obs
from chaos.guarantee_watch import GUARANTEE_ROUND_S
from chaos.observer import Observer
from koord_queue.shared.api import names

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
    """A pod as the Job controller makes them: controlled by the Job (``owner_uid``; None: no owner)
    and carrying its selector label."""
    owners = [{"kind": "Job", "name": "j", "uid": owner_uid, "controller": True}] if owner_uid else []
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: unit_ref},
            "labels": {"batch.kubernetes.io/controller-uid": owner_uid} if owner_uid else {},
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


def test_her_own_bound_pod_with_a_controller_reference_to_a_job_but_no_link_is_not_its_pod(
    clock: Clock,
) -> None:
    """The full run of 2026-12-04 counted ``mallory-join-2`` as a pod of ``chaos/sentinel-1``
    (RELIABILITY.md): her own pod, bound to a node, with a *controller* reference carrying the
    sentinel's real UID, whose unit annotation the policy ``koord-queue-pod-links`` refused. It
    names no unit and lacks the Job controller's selector label, so neither the product
    (docs/compatibility.md#pod-gating) nor the Job controller counts it: it is her bare pod. A
    plain owner reference to the Job proves nothing either, even on a pod naming its unit."""
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    feed_pod(o, pod("p1"), f"{NS}/p1")  # the sentinel's own released pod
    join = pod("mallory-join-2", node="n1", unit_ref="")
    join["metadata"]["labels"] = {}
    feed_pod(o, join, f"{NS}/mallory-join-2")
    plain = pod("plain", node="n1")
    plain["metadata"]["ownerReferences"][0]["controller"] = False
    feed_pod(o, plain, f"{NS}/plain")
    assert not o.violation_counts
    assert [p.key for p in o.owned_pods(o.jobs[f"{NS}/j"])] == [f"{NS}/p1"]
    # The Job controller's own pod is the job's with either link: with only the selector label (a
    # pod that names no unit, which the product would not count) it is still an excess.
    unlinked = pod("unlinked", node="n1", unit_ref="")
    feed_pod(o, unlinked, f"{NS}/unlinked")
    assert o.violation_counts[SCHEDULABLE] == 1


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


def test_a_job_claiming_a_parent_is_judged_by_its_pods_not_by_running_unsuspended(clock: Clock) -> None:
    """A labelled Job with a controller reference to a queued kind is let in unsuspended, its
    pods born gated (docs/architecture.md#trust-boundaries): running unsuspended is no violation,
    but a schedulable pod of it without an admission still is."""
    o = observer()
    claiming = job()
    claiming["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "gone", "uid": "u-x", "controller": True}
    ]
    feed_job(o, claiming)
    assert not o.violation_counts["run-without-admission"]
    assert o.stats["jobs claiming a parent, judged by their pods"] == 1
    feed_pod(o, pod("p1", node="n1"), f"{NS}/p1")
    clock.now += 60.0
    o.finish()
    assert o.violation_counts[SCHEDULABLE] == 1


def test_a_plain_reference_or_a_foreign_group_is_no_parent_claim() -> None:
    plain = {"ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "controller": False}]}
    foreign = {"ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Thing", "controller": True}]}
    assert not views.claims_parent(plain) and not views.claims_parent(foreign)


# --- usage-mismatch: what each unit is charged against what it really holds -----------------------

USAGE_UNIT = "charged-below-running", "charged-for-unneeded", "charged-below-pod-size"


def charged_unit(
    *, replicas: int, count: int = 2, cpu: str = "1", phase: str = "", quota: str = "q"
) -> views.UnitView:
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
    return views.parse_unit(raw)


def charged_job(
    *, parallelism: int | None = 2, completions: int | None = 2, succeeded: int = 0, finished: bool = False
) -> views.JobView:
    raw = job()
    raw["spec"].update({"parallelism": parallelism, "completions": completions})
    raw["status"]["succeeded"] = succeeded
    if finished:
        raw["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    return views.parse_job(raw)


def bound_pod(name: str, *, cpu: str = "1", live: bool = True) -> views.PodView:
    raw = pod(name, node="n1")
    raw["spec"]["containers"] = [{"resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]
    if not live:
        raw["status"]["phase"] = "Succeeded"
    return views.parse_pod(raw)


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
    replicas: int, job_kw: dict[str, Any], pods: list[views.PodView], expected: set[str]
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
    accumulated: dict[str, int], units: list[views.UnitView], drift: bool
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
    # A forged pod is not the job's: in another namespace it changes nothing; in the job's own,
    # out of the gate, it holds what nothing charges (the product deletes it: EscapedPodDeleted).
    feed_pod(o, None, f"{NS}/p2")
    o._pod_event("mallory/claim", pod("claim", namespace="mallory", node="n1"), o.revision + 1)
    assert o.accounting_mismatches() == []
    feed_pod(o, pod("bare", owner_uid=None, node="n1"), f"{NS}/bare")
    found = o.accounting_mismatches()
    assert [(m.rule, m.subject) for m in found] == [("released-pod-outside-its-job", f"{NS}/j")]
    assert f"{NS}/bare" in found[0].detail
    feed_pod(o, pod("bare", owner_uid=None, gated=True), f"{NS}/bare")  # behind the gate: harmless
    assert o.accounting_mismatches() == []
    assert o.checks["usage charged = held: units judged"] == 5


def test_a_released_pod_its_job_let_go_of_is_held_outside_any_charge(clock: Clock) -> None:
    """What the Job controller leaves after a relabel: the pod, released and still naming the unit,
    without the owner reference; the replacement it makes is the job's own."""
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    feed_pod(o, pod("p1"), f"{NS}/p1")
    assert o.accounting_mismatches() == []
    feed_pod(o, pod("p1", owner_uid=None), f"{NS}/p1")
    feed_pod(o, pod("p2", gated=True), f"{NS}/p2")
    assert {m.rule for m in o.accounting_mismatches()} == {"released-pod-outside-its-job"}
    feed_pod(o, None, f"{NS}/p1")  # deleted by the reconciler
    assert o.accounting_mismatches() == []


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
    raw = views.decode_pod(envelope)
    view = views.parse_pod(raw)
    assert view.bound
    assert view.request == {"cpu": 510, "memory": 2**30 * 1000}

    # An owner reference's controller flag (field 6), which decides whether it links the pod.
    def meta(controller: bool) -> bytes:
        owner = tag(1, b"Job") + tag(3, b"j") + tag(4, b"uid-1") + varint(6, int(controller))
        unit = tag(1, names.RELATED_QUEUEUNIT_ANNOTATION.encode()) + tag(2, b"ns/j")
        return tag(1, b"p") + tag(12, unit) + tag(13, owner)

    for controller, linked in ((True, ("uid-1",)), (False, ())):
        decoded = views.decode_pod(k8sproto.MAGIC + tag(2, tag(1, meta(controller)) + tag(2, spec)))
        assert decoded["metadata"]["ownerReferences"][0].get("controller", False) is controller
        assert views.parse_pod(decoded).owner_uids == linked

    job_spec = varint(1, 2) + varint(2, 3) + varint(10, 1)
    job_envelope = k8sproto.MAGIC + tag(2, tag(1, tag(1, b"j")) + tag(2, job_spec))
    parsed = views.parse_job(views.decode_job(job_envelope))
    assert (parsed.parallelism, parsed.completions, parsed.suspended) == (2, 3, True)


# --- guarantee-unserved and guarantee-taken (chaos.guarantee_watch) --------------------------------

UNSERVED, TAKEN = "guarantee-unserved", "guarantee-taken"


def gquota(name: str, *, min_cpu: str, max_cpu: str, parent: str = "", lends: bool = True) -> dict[str, Any]:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    if not lends:
        labels[names.QUOTA_ALLOW_LENT_LABEL] = "false"
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"min": {"cpu": min_cpu}, "max": {"cpu": max_cpu, "memory": "1Ti"}},
    }


def gunit(
    name: str,
    quota: str,
    *,
    cpu: str = "1",
    memory: str | None = None,
    replicas: int = 0,
    running: int = 0,
    reclaim: int | None = None,
    message: str = "",
    priority: int = 0,
) -> dict[str, Any]:
    requests = {"cpu": cpu} if memory is None else {"cpu": cpu, "memory": memory}
    template = {"spec": {"containers": [{"resources": {"requests": requests}}]}}
    status: dict[str, Any] = {"phase": "Enqueued" if not replicas else "Running", "message": message}
    if replicas:
        admission: dict[str, Any] = {"name": "main", "replicas": replicas, "running": running}
        if reclaim is not None:
            admission["reclaimState"] = {"replicas": reclaim}
        status["admissions"] = [admission]
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"priority": priority, "podSet": [{"name": "main", "count": 1, "template": template}]},
        "status": status,
    }


class Tree:
    """A parent ``p`` and children fed to an observer through :meth:`Observer.apply` as etcd
    would deliver them (JSON-stored kinds), with a fake clock."""

    def __init__(self, clock: Clock, *, parent_cpu: str = "4", **children: tuple[str, str, bool]) -> None:
        self.clock = clock
        self.o = observer()
        self.put_quota(gquota("p", min_cpu=parent_cpu, max_cpu=parent_cpu))
        for name, (min_cpu, max_cpu, lends) in children.items():
            self.put_quota(gquota(name, min_cpu=min_cpu, max_cpu=max_cpu, parent="p", lends=lends))

    def put_quota(self, raw: dict[str, Any]) -> None:
        key = obs.QUOTAS + f"{NS}/{raw['metadata']['name']}".encode()
        self.o.apply(key, json.dumps(raw).encode(), self.o.revision + 1)

    def put(self, raw: dict[str, Any] | None, name: str = "") -> None:
        key = obs.UNITS + f"{NS}/{raw['metadata']['name'] if raw else name}".encode()
        self.o.apply(key, json.dumps(raw).encode() if raw else b"", self.o.revision + 1)

    def wait(self, seconds: float, step: float = 1.0) -> None:
        """Time passes; etcd keeps delivering unrelated events (leases)."""
        while seconds > 0:
            self.clock.now += min(step, seconds)
            seconds -= step
            self.o.apply(b"/registry/leases/x", b"", self.o.revision + 1)

    @property
    def violations(self) -> Counter[str]:
        return self.o.violation_counts


def test_a_guaranteed_unit_left_waiting_while_the_parent_has_room_is_unserved(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b"))
    t.wait(GUARANTEE_ROUND_S - 1)
    assert not t.violations[UNSERVED]
    t.wait(2)
    assert t.violations[UNSERVED] == 1
    assert "b-1" in t.o.violations[0].detail and "every level has room" in t.o.violations[0].detail
    t.wait(10)  # reported once per episode
    assert t.violations[UNSERVED] == 1


def test_a_guaranteed_unit_admitted_within_the_bound_is_served(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b"))
    t.wait(5)
    t.put(gunit("b-1", "b", replicas=1))
    t.wait(GUARANTEE_ROUND_S + 5)
    assert not t.violations
    assert t.o.stats["guarantee-unserved: episodes ended by an admission"] == 1
    assert 4.0 <= t.o.guarantees.longest_served <= 6.0


def test_a_guaranteed_unit_refused_while_a_smaller_one_of_its_quota_is_admitted_stays_unserved(
    clock: Clock,
) -> None:
    """b's 2-cpu unit fits b's min of 3 and the parent has room the whole time; admitting b's
    1-cpu units meanwhile does not serve it, so the clock of its wait keeps running."""
    t = Tree(clock, parent_cpu="6", a=("3", "6", True), b=("3", "6", True))
    t.put(gunit("b-big", "b", cpu="2"))
    t.put(gunit("b-small", "b"))
    t.wait(GUARANTEE_ROUND_S - 5)
    t.put(gunit("b-small", "b", replicas=1))  # the smaller one goes first
    t.wait(6)
    assert t.violations[UNSERVED] == 1
    assert "b-big" in t.o.violations[0].detail and "every level has room" in t.o.violations[0].detail


def test_work_beyond_the_min_or_asking_more_than_min_is_not_guaranteed(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-0", "b", cpu="2", replicas=1, running=1))
    t.put(gunit("b-1", "b"))  # b is at its min already: this one would borrow
    t.put(gunit("a-1", "a", cpu="3"))  # larger than a's min
    t.wait(GUARANTEE_ROUND_S + 5)
    assert not t.violations
    assert not t.o.stats["guarantee-unserved: episodes (waiting within min, room or reclaimable)"]


def test_borrowed_capacity_that_runs_is_waited_for_and_capacity_that_does_not_is_reclaimable(
    clock: Clock,
) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("a-1", "a", cpu="2", replicas=1, running=1))
    t.put(gunit("a-2", "a", cpu="2", replicas=1, running=1))  # a borrows 2: the parent is full
    t.put(gunit("b-1", "b"))
    t.wait(GUARANTEE_ROUND_S + 5)
    assert not t.violations  # nothing can be reclaimed: b waits for a's pods to finish
    t.put(gunit("a-2", "a", cpu="2", replicas=1, running=0))  # not running: reclaimable
    t.wait(GUARANTEE_ROUND_S + 1)
    assert t.violations[UNSERVED] == 1
    assert "a-2" in t.o.violations[0].detail and "short cpu=1000m" in t.o.violations[0].detail


def test_bound_pods_count_as_running_even_before_the_report(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("a-1", "a", cpu="2", replicas=1, running=1))
    raw = gunit("a-2", "a", cpu="2", replicas=1, running=0)
    raw["spec"]["consumerRef"] = {"kind": "Job", "name": "a-2", "namespace": NS}
    t.put(raw)
    feed_job(t.o, job("a-2", uid="uid-a-2", quota="a"), name="a-2")
    feed_pod(t.o, pod("a-2-x", owner_uid="uid-a-2", node="n1", unit_ref=f"{NS}/a-2"), f"{NS}/a-2-x")
    t.put(gunit("b-1", "b"))
    t.wait(GUARANTEE_ROUND_S + 5)
    assert not t.violations[UNSERVED]


def test_reclaim_never_counts_capacity_that_would_take_a_borrower_below_its_min(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("a-1", "a", cpu="3", replicas=1, running=0))  # taking it leaves a at 0 < min 2
    t.put(gunit("b-0", "b", cpu="1", replicas=1, running=1))
    t.put(gunit("b-1", "b"))
    t.wait(GUARANTEE_ROUND_S + 5)
    assert not t.violations


def test_capacity_already_being_reclaimed_counts_toward_the_guarantee(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("a-1", "a", cpu="2", replicas=1, running=1))
    t.put(gunit("a-2", "a", cpu="2", replicas=1, running=0, reclaim=1))
    t.put(gunit("b-1", "b"))
    t.wait(GUARANTEE_ROUND_S + 1)
    assert t.violations[UNSERVED] == 1
    assert "cpu=2000m already being reclaimed" in t.o.violations[0].detail


def test_a_resource_min_does_not_name_is_not_guaranteed_but_does_not_void_the_guarantee(
    clock: Clock,
) -> None:
    """Pods asking for memory under a ``min`` that names only CPU: the CPU is still guaranteed
    (Koordinator's meaning; docs/compatibility.md#quota-guarantees), so borrowed CPU that does
    not run must be reclaimed for it."""
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("a-1", "a", cpu="2", replicas=1, running=1))
    t.put(gunit("a-2", "a", cpu="2", replicas=1, running=0))
    t.put(gunit("b-1", "b", memory="64Mi"))
    t.wait(GUARANTEE_ROUND_S + 1)
    assert t.violations[UNSERVED] == 1


def test_fault_windows_stop_the_unserved_clock(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b"))
    t.wait(5)
    t.o.disturb()
    t.o.disturb()  # nested: the apiserver restart inside a compaction fault
    t.wait(60)
    t.o.undisturb()
    t.wait(5)
    assert t.o.disturbed and not t.violations
    t.o.undisturb()
    t.wait(GUARANTEE_ROUND_S - 5 - 1)  # 5 s before the window, none inside it
    assert not t.violations
    t.wait(2)
    assert t.violations[UNSERVED] == 1


def test_finish_reports_a_unit_still_unserved(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b"))
    clock.now += GUARANTEE_ROUND_S + 1  # no event since
    t.o.finish()
    assert t.violations[UNSERVED] == 1
    assert "at the end of the run" in t.o.violations[0].detail


def test_a_borrowing_admission_into_a_waiting_siblings_min_is_taken(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b", message="waiting"))
    t.wait(3)
    t.put(gunit("a-1", "a", cpu="2", replicas=1))  # within a's min: not judged
    t.put(gunit("a-2", "a", cpu="1", replicas=1))  # borrows 1, leaves 1 for b's unit
    assert not t.violations[TAKEN]
    assert t.o.checks["guarantee-taken: borrowing admissions judged against siblings' min claims"] == 1
    t.put(gunit("a-3", "a", cpu="1", replicas=1))  # leaves nothing
    assert t.violations[TAKEN] == 1
    assert "b claims cpu=1000m" in t.o.violations[-1].detail


def test_a_lending_sibling_without_waiting_work_claims_nothing(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b", cpu="3", message="too large for b's min"))
    t.wait(3)
    for i in range(4):
        t.put(gunit(f"a-{i}", "a", replicas=1))
    assert not t.violations


def test_a_sibling_that_does_not_lend_claims_its_whole_unused_min(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", False))
    t.put(gunit("a-1", "a", cpu="2", replicas=1))
    t.put(gunit("a-2", "a", cpu="1", replicas=1))
    assert t.violations[TAKEN] == 1
    assert "(does not lend)" in t.o.violations[0].detail


def test_claims_of_units_the_reconciler_may_not_have_seen_do_not_count(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", True))
    t.put(gunit("b-1", "b", message="waiting"))
    t.put(gunit("b-2", "b"))  # no decision written for it yet
    t.wait(1)  # b-1 is younger than the grace
    t.put(gunit("a-1", "a", cpu="4", replicas=1))
    assert not t.violations[TAKEN]
    t.wait(3)
    t.put(gunit("a-1", "a", cpu="4", replicas=0))
    t.put(gunit("a-2", "a", cpu="4", replicas=1))
    assert t.violations[TAKEN] == 1
    assert "b claims cpu=1000m" in t.o.violations[0].detail  # b-2 has no message: not counted


def test_admissions_during_a_fault_are_tolerated(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", False))
    t.o.disturb()
    t.put(gunit("a-1", "a", cpu="3", replicas=1))
    t.o.undisturb()
    t.wait(1)
    t.put(gunit("a-2", "a", cpu="1", replicas=1))
    assert not t.violations[TAKEN]
    assert t.o.stats["guarantee-taken: during a fault or within the grace after it (tolerated)"] == 2


def test_a_sibling_whose_usage_just_dropped_claims_from_its_earlier_usage(clock: Clock) -> None:
    t = Tree(clock, a=("2", "4", True), b=("2", "4", False))
    t.put(gunit("b-1", "b", cpu="2", replicas=1, running=1))
    t.put(gunit("a-1", "a", cpu="2", replicas=1))  # the parent is full
    t.wait(3)
    t.put(None, name="b-1")  # b's job finished: its whole min is claimed again
    t.put(gunit("a-2", "a", cpu="1", replicas=1))  # decided before the release was seen
    assert not t.violations[TAKEN]
    t.wait(3)
    t.put(gunit("a-3", "a", cpu="1", replicas=1))
    assert t.violations[TAKEN] == 1


def test_a_terminating_bound_pod_still_counts_against_the_admission(clock: Clock) -> None:
    """A bound pod being deleted runs for its grace period: a released replacement beside it is one
    pod more than an admission of one (docs/compatibility.md#pod-gating)."""
    o = observer()
    feed_unit(o, unit(replicas=1))
    feed_job(o, job())
    leaving = pod("p1", node="n1")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    feed_pod(o, leaving, f"{NS}/p1")
    assert not o.violation_counts[SCHEDULABLE]
    feed_pod(o, pod("p2", gated=True), f"{NS}/p2")
    assert not o.violation_counts[SCHEDULABLE]  # the replacement waits behind its gate
    feed_pod(o, pod("p2"), f"{NS}/p2")
    assert o.violation_counts[SCHEDULABLE] == 1


# --- run-without-admission for a Workflow's unit: a reservation, judged by summed requests ---------

RUN = "run-without-admission"
WF = "wf"
WF_UID = "uid-wf-1"
RESERVATION_CHECK = "running pods of a Workflow within its reservation (summed requests)"


def wunit(*, replicas: int = 1, cpu: str = "500m", phase: str | None = None) -> dict[str, Any]:
    """A Workflow's unit as the reconciler makes it: one pod set ``default`` of count 1 whose
    template asks for the ``koord-queue/min-resources`` reservation."""
    template = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}}
    return {
        "metadata": {
            "name": WF,
            "namespace": NS,
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "ownerReferences": [{"kind": "Workflow", "name": WF, "uid": WF_UID}],
        },
        "spec": {
            "consumerRef": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": WF},
            "podSet": [{"name": "default", "count": 1, "template": template}],
        },
        "status": {
            "phase": phase or ("Running" if replicas else "Enqueued"),
            "admissions": [{"name": "default", "replicas": replicas}] if replicas else [],
        },
    }


def step(
    index: int, cpu: str, *, gated: bool = False, node: str = "", deleting: bool = False
) -> tuple[dict[str, Any], str]:
    """A step pod as Argo makes it: the unit link from ``spec.podMetadata``, the Workflow as its
    controller; with its key."""
    name = f"{WF}-step-{index}"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: f"{NS}/{WF}"},
        "labels": {names.GATED_POD_LABEL: "true"},
        "ownerReferences": [{"kind": "Workflow", "name": WF, "uid": WF_UID, "controller": True}],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {
        "nodeName": node,
        "schedulingGates": [{"name": names.ADMISSION_GATE}] if gated else [],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
    }
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}, f"{NS}/{name}"


def run_details(o: Observer) -> list[str]:
    return [v.detail for v in o.violations if v.invariant == RUN]


def feed_step(o: Observer, index: int, cpu: str, **kwargs: Any) -> str:
    raw, key = step(index, cpu, **kwargs)
    feed_pod(o, raw, key)
    return key


def pass_grace(o: Observer, clock: Clock) -> None:
    """The etcd stream goes on (no stall) until the grace has run out."""
    for _ in range(4):
        clock.now += 0.8
        o.apply(b"/registry/unrelated", b"", o.revision + 1)


def test_several_workflow_pods_whose_requests_fit_the_reservation_run_under_one_replica(
    clock: Clock,
) -> None:
    """Counted, two released pods would outnumber the one admitted replica; summed, 200m + 250m
    fit the 500m reserved."""
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "200m", node="n1")
    feed_step(o, 1, "250m")
    feed_step(o, 2, "400m", gated=True)  # waits behind its gate: holds nothing
    assert not o.violation_counts[RUN]
    assert o.checks[RESERVATION_CHECK] == 2
    assert o.checks["released pods <= admitted replicas"] == 0  # not judged by count


def test_workflow_pods_whose_summed_requests_exceed_the_reservation_run_without_admission(
    clock: Clock,
) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1")
    assert not o.violation_counts[RUN]
    feed_step(o, 1, "400m")  # released beside it: 800m of 500m
    assert o.violation_counts[RUN] == 1
    assert "cpu=800m in sum" in run_details(o)[0]
    assert "cpu=500m" in run_details(o)[0]
    feed_step(o, 2, "50m")  # the same episode, reported once
    assert o.violation_counts[RUN] == 1


def test_a_workflow_pod_larger_than_the_whole_reservation_runs_without_admission(clock: Clock) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 3, "1")
    assert o.violation_counts[RUN] == 1


def test_a_bound_workflow_pod_being_deleted_still_counts_against_the_reservation(clock: Clock) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1", deleting=True)
    assert not o.violation_counts[RUN]
    feed_step(o, 1, "400m")
    assert o.violation_counts[RUN] == 1


def test_a_released_workflow_pod_with_nothing_admitted_runs_without_admission(clock: Clock) -> None:
    """Whatever it asks: a pod that requests nothing still runs outside any admission."""
    o = observer()
    feed_unit(o, wunit(replicas=0), WF)
    feed_step(o, 0, "0")
    assert o.violation_counts[RUN] == 1
    assert "0 admitted replicas" in run_details(o)[0]


def test_workflow_pods_of_a_finished_unit_run_without_admission_once_the_grace_is_over(
    clock: Clock,
) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1")
    feed_unit(o, wunit(replicas=1, phase="Succeed"), WF)
    assert not o.violation_counts[RUN]  # in the grace: its pods may be on their way out
    pass_grace(o, clock)
    assert o.violation_counts[RUN] == 1


def test_a_deleted_workflow_whose_unit_goes_before_its_running_pod_is_tolerated(clock: Clock) -> None:
    """The quick run of 2026-12-04 (mallory-wfr-1 and -2): she deleted her Workflow, and the garbage
    collector deleted its unit a revision before its bound step pod got its deletion timestamp."""
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    raw, key = step(0, "400m", node="n1")
    feed_pod(o, raw, key)
    feed_unit(o, None, WF)
    assert not o.violation_counts[RUN]
    feed_pod(o, step(0, "400m", node="n1", deleting=True)[0], key)  # still runs: bound
    clock.now += 0.5
    feed_pod(o, None, key)
    pass_grace(o, clock)
    assert not o.violation_counts[RUN]
    assert o.stats["Workflow pods beyond the reservation, repaired within the grace (tolerated)"] == 1


def test_a_workflow_unit_deleted_and_readopted_within_the_grace_is_tolerated(clock: Clock) -> None:
    """A running Workflow's unit deleted by someone else: the reconciler re-creates it admitted
    (adoption, docs/compatibility.md#adoption-of-released-jobs) while the step pod runs on."""
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1")
    feed_unit(o, None, WF)
    clock.now += 0.2
    feed_unit(o, wunit(replicas=0, phase=""), WF)  # created for adoption, status written next
    clock.now += 0.1
    feed_unit(o, wunit(replicas=1, phase="Dequeued"), WF)
    pass_grace(o, clock)
    assert not o.violation_counts[RUN]


def test_a_workflow_pod_outliving_its_deleted_unit_runs_without_admission(clock: Clock) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1")
    feed_unit(o, None, WF)
    assert not o.violation_counts[RUN]
    pass_grace(o, clock)
    assert o.violation_counts[RUN] == 1
    assert "no QueueUnit" in run_details(o)[0]


def test_finish_judges_a_workflow_excess_still_in_its_grace(clock: Clock) -> None:
    o = observer()
    feed_unit(o, wunit(replicas=1), WF)
    feed_step(o, 0, "400m", node="n1")
    feed_unit(o, None, WF)
    o.finish()
    assert o.violation_counts[RUN] == 1


def test_reservation_is_replicas_times_the_template_request() -> None:
    assert obs.reserved(views.parse_unit(wunit(replicas=1, cpu="500m"))) == {"cpu": 500}
    assert obs.reserved(views.parse_unit(wunit(replicas=0))) == {}
    assert obs.reserved(views.parse_unit(wunit(replicas=1, phase="Failed"))) == {}
    assert obs.reserved(None) == {}

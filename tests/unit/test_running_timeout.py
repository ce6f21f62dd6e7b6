"""Running timeout, backoff timeout and partial running timeout (docs/compatibility.md#running-timeout).

The decision (``shared.jobs.running_timeout.decide``) is a table over a unit, its pods, the timeouts and
the time; the job path around it (``shared.jobs.jobpath``, carried out by ``reconciler.job_actions``)
is checked with a fake client for the order of its writes: the job is held before its unit gives
the quota back, and a failed second write is decided again instead of resuming the job.
"""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import format_time, parse_time
from koord_queue.shared.jobs import jobext, podplan, registry
from koord_queue.shared.jobs.running_timeout import Decision, RunningTimeout, RunningTimeouts, decide

T0 = "2024-05-01T10:00:00Z"
START = parse_time(T0) or 0.0
TIMEOUTS = RunningTimeout(running_timeout=60.0, backoff_timeout=30.0)
PARTIAL = RunningTimeout(running_timeout=60.0, backoff_timeout=30.0, partial_running_timeout=20.0)


def at(seconds: float) -> str:
    return format_time(START + seconds)


def make_unit(
    phase: str = "Dequeued",
    admissions: tuple[tuple[str, int, int], ...] = (("main", 2, 0),),
    *,
    kind: tuple[str, str] = ("batch/v1", "Job"),
    **status: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "phase": phase,
        "message": names.Message.DEQUEUED,
        "admissions": [{"name": n, "replicas": r, "running": run} for n, r, run in admissions],
        "lastAllocateTime": T0,
        "lastUpdateTime": T0,
        **status,
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": "first", "namespace": "ns", "resourceVersion": "7", "uid": "qu-1"},
        "spec": {"consumerRef": {"apiVersion": kind[0], "kind": kind[1], "name": "first", "namespace": "ns"}},
        "status": {k: v for k, v in body.items() if v is not None},
    }


def pod(name: str, pod_set: str = "main", *, bound: bool = False, terminal: bool = False) -> podplan.PodView:
    return podplan.PodView(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        pod_set=pod_set,
        created=T0,
        bound=bound,
        gated=False,
        terminal=terminal,
        deleting=False,
    )


def run(
    unit: dict[str, Any],
    pods: list[podplan.PodView],
    timeouts: RunningTimeout = TIMEOUTS,
    *,
    after: float,
    seen: dict[str, float] | None = None,
) -> Decision:
    return decide(unit, pods, timeouts, now=START + after, now_text=at(after), jitter=0.5, short_since=seen)


# --- nothing to do ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "unit", "pods", "timeouts"),
    [
        ("timeouts off", make_unit(), [], RunningTimeout()),
        ("only a backoff time", make_unit(), [], RunningTimeout(backoff_timeout=5.0)),
        ("all pods bound", make_unit(), [pod("a", bound=True), pod("b", bound=True)], TIMEOUTS),
        (
            "more bound than admitted",
            make_unit(admissions=(("main", 1, 0),)),
            [pod("a", bound=True)] * 2,
            TIMEOUTS,
        ),
        ("still queued", make_unit("Enqueued", admissions=()), [], TIMEOUTS),
        ("reserved: checks run, the job is held", make_unit("Reserved"), [], TIMEOUTS),
        ("already backing off", make_unit("TimeoutBackoff", admissions=()), [], TIMEOUTS),
        ("finished", make_unit("Succeed", admissions=()), [], TIMEOUTS),
        ("nothing admitted", make_unit(admissions=(("main", 0, 0),)), [], TIMEOUTS),
        ("no time to count from", make_unit(lastAllocateTime=None, lastUpdateTime=None), [], TIMEOUTS),
        (
            "a running job is never backed off for a late pod",
            make_unit("Running"),
            [pod("a", bound=True), pod("b")],
            TIMEOUTS,
        ),
        (
            "a workflow counts its reported replicas (no linked pods)",
            make_unit(admissions=(("default", 1, 1),), kind=("argoproj.io/v1alpha1", "Workflow")),
            [],
            TIMEOUTS,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_nothing_is_written_and_nothing_is_pending(
    case: str, unit: dict[str, Any], pods: list[podplan.PodView], timeouts: RunningTimeout
) -> None:
    assert run(unit, pods, timeouts, after=3600) == Decision()


def test_a_deactivated_unit_is_left_to_the_deactivation() -> None:
    unit = make_unit()
    unit["spec"]["active"] = False
    assert run(unit, [], after=3600) == Decision()


def test_a_reclaim_under_way_is_waited_for_and_the_first_sightings_are_kept() -> None:
    unit = make_unit()
    unit["status"]["admissions"][0]["reclaimState"] = {"replicas": 1}
    assert run(unit, [], after=3600, seen={"main": START}) == Decision(short_since={"main": START})


# --- the running timeout -----------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0, 1, 59.5])
def test_before_the_timeout_the_job_is_looked_at_again_when_it_falls_due(after: float) -> None:
    decision = run(make_unit(), [pod("a")], after=after)
    assert decision.status_patch is None and not decision.suspend
    assert decision.recheck_in == pytest.approx(60 - after)


def test_after_the_timeout_the_unit_backs_off_gives_its_quota_back_and_the_job_is_held() -> None:
    decision = run(make_unit(), [pod("a", bound=True), pod("b")], after=60)
    assert decision.suspend
    assert decision.status_patch is not None
    status = decision.status_patch["status"]
    assert status["phase"] == "TimeoutBackoff"
    assert status["message"] == "Backoff due to running timeout"
    assert status["admissions"] == []
    assert status["lastUpdateTime"] == at(60)
    # backoffTimeout is the requeue delay, flat: the scheduler queues the unit again at requeueAt
    assert status["requeueState"] == {"count": 1, "requeueAt": at(90)}
    conditions = {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}
    assert conditions["Evicted"] == ("True", "BackoffTimeout", "Backoff due to running timeout")
    assert conditions["QuotaReserved"][:2] == ("False", "BackoffTimeout")
    assert conditions["Admitted"][:2] == ("False", "BackoffTimeout")
    assert decision.event_reason == "RunningTimeout"
    assert decision.event_message.startswith("1 of 2 admitted pod(s) not running 1m0s after admission")
    assert decision.event_message.endswith("queued again in 30s")
    assert decision.recheck_in is None


def test_the_timeout_counts_from_the_admission_not_from_the_last_status_write() -> None:
    """Upstream counts from lastUpdateTime, which every usage report moves: never times out."""
    unit = make_unit(lastUpdateTime=at(59))
    assert run(unit, [pod("a")], after=61).suspend


def test_without_an_allocation_time_the_admitted_condition_counts() -> None:
    condition = {
        "type": "Admitted",
        "status": "True",
        "reason": "Admitted",
        "message": "",
        "lastTransitionTime": at(30),
    }
    unit = make_unit(lastAllocateTime=None, lastUpdateTime=at(50), conditions=[condition])
    assert run(unit, [pod("a")], after=80).recheck_in == pytest.approx(10)
    assert run(unit, [pod("a")], after=90).suspend


def test_terminal_pods_and_pods_of_other_pod_sets_do_not_run_for_the_admission() -> None:
    pods = [pod("a", bound=True, terminal=True), pod("b", "other", bound=True), pod("c", bound=True)]
    assert run(make_unit(), pods, after=60).suspend


def test_every_pod_set_must_run_in_full() -> None:
    unit = make_unit(admissions=(("head", 1, 1), ("worker", 2, 2)))
    pods = [pod("h", "head", bound=True), pod("w1", "worker", bound=True), pod("w2", "worker")]
    decision = run(unit, pods, after=60)
    assert decision.suspend
    assert decision.event_message.startswith("1 of 3 admitted pod(s)")


@pytest.mark.parametrize(
    ("previous", "count", "delay"),
    [(None, 1, 10.0), (1, 2, 20.0), (3, 4, 80.0), (10, 11, 900.0)],
)
def test_without_a_backoff_time_the_doubling_requeue_backoff_applies(
    previous: int | None, count: int, delay: float
) -> None:
    timeouts = RunningTimeout(running_timeout=60.0)
    state = None if previous is None else {"count": previous, "requeueAt": T0}
    decision = run(make_unit(requeueState=state), [], timeouts, after=60)
    assert decision.status_patch is not None
    written = decision.status_patch["status"]["requeueState"]
    assert written["count"] == count
    # jitter 0.5 is the middle of [0.9, 1.1): the delay itself (capped at 15 minutes)
    assert parse_time(written["requeueAt"]) == pytest.approx(START + 60 + delay, abs=1)


def test_a_flat_backoff_still_counts_consecutive_backoffs() -> None:
    decision = run(make_unit(requeueState={"count": 2, "requeueAt": T0}), [], after=60)
    assert decision.status_patch is not None
    assert decision.status_patch["status"]["requeueState"] == {"count": 3, "requeueAt": at(90)}


# --- the partial running timeout ---------------------------------------------------------------------


def test_a_partly_running_admitted_unit_shrinks_to_the_pods_that_run() -> None:
    unit = make_unit(admissions=(("head", 1, 1), ("worker", 4, 1)))
    pods = [
        pod("h", "head", bound=True),
        pod("w1", "worker", bound=True),
        pod("w2", "worker"),
        pod("w3", "worker"),
    ]
    assert run(unit, pods, PARTIAL, after=10).recheck_in == pytest.approx(10)
    decision = run(unit, pods, PARTIAL, after=20)
    assert not decision.suspend
    assert decision.status_patch == {
        "status": {
            "admissions": [
                {"name": "head", "replicas": 1, "running": 1},
                {"name": "worker", "replicas": 4, "running": 1, "reclaimState": {"replicas": 3}},
            ],
            "lastUpdateTime": at(20),
        }
    }
    assert decision.event_reason == "PartialRunningTimeout"
    assert decision.event_message == (
        "pod set worker: 1 of 4 admitted pod(s) running after 20s (partialRunningTimeout): the "
        "admission shrinks to 1 and the quota of the others is released"
    )


def test_with_a_partial_timeout_a_partly_running_unit_is_never_backed_off() -> None:
    timeouts = RunningTimeout(running_timeout=10.0, partial_running_timeout=120.0)
    decision = run(make_unit(), [pod("a", bound=True), pod("b")], timeouts, after=30)
    assert decision.status_patch is None and not decision.suspend
    assert decision.recheck_in == pytest.approx(90)


def test_with_a_partial_timeout_a_unit_with_nothing_running_still_backs_off() -> None:
    assert run(make_unit(), [pod("a"), pod("b")], PARTIAL, after=60).suspend


def test_a_partial_timeout_alone_never_touches_a_unit_with_nothing_running() -> None:
    assert run(make_unit(), [pod("a")], RunningTimeout(partial_running_timeout=5.0), after=3600) == Decision()


def test_once_running_a_shortfall_is_timed_from_when_it_was_first_seen() -> None:
    """A pod replaced an hour after the start is not an hour late."""
    unit = make_unit("Running")
    pods = [pod("a", bound=True), pod("b")]
    first = run(unit, pods, PARTIAL, after=3600)
    assert first.status_patch is None
    assert first.short_since == {"main": START + 3600}
    assert first.recheck_in == pytest.approx(20)
    later = run(unit, pods, PARTIAL, after=3619, seen=dict(first.short_since))
    assert later.status_patch is None and later.recheck_in == pytest.approx(1)
    due = run(unit, pods, PARTIAL, after=3620, seen=dict(first.short_since))
    assert due.status_patch is not None
    assert due.status_patch["status"]["admissions"][0]["reclaimState"] == {"replicas": 1}
    assert due.short_since == {}


def test_a_sighting_older_than_the_admission_does_not_count() -> None:
    unit = make_unit("Running", lastAllocateTime=at(100))
    decision = run(unit, [pod("a", bound=True), pod("b")], PARTIAL, after=110, seen={"main": START})
    assert decision.status_patch is None and decision.recheck_in == pytest.approx(10)


def test_a_shortfall_that_ended_is_forgotten() -> None:
    unit = make_unit("Running")
    decision = run(
        unit, [pod("a", bound=True), pod("b", bound=True)], PARTIAL, after=50, seen={"main": START}
    )
    assert decision == Decision()


# --- configuration lookups -----------------------------------------------------------------------------


def test_an_extension_without_its_own_entry_gets_the_default() -> None:
    own = RunningTimeout(running_timeout=1.0)
    timeouts = RunningTimeouts(default=TIMEOUTS, per_extension=(("tfjob", own),))
    assert timeouts.for_extension("tfjob") is own
    assert timeouts.for_extension("job") is TIMEOUTS
    assert not RunningTimeouts().for_extension("job").enabled


# --- the job extension's step: order of the writes ---------------------------------------------------


class FakeClient:
    """Records writes; ``fail_status`` makes unit status writes fail with a conflict."""

    def __init__(self, *, fail_status: bool = False) -> None:
        self.patches: list[tuple[str, str, Any]] = []
        self.fail_status = fail_status

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        subresource = kwargs.get("subresource", "")
        if subresource == "status" and self.fail_status:
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        self.patches.append((res.plural, subresource, patch))
        return {}


class FakeEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        self.recorded.append((str(obj.get("kind")), type_, reason))


def released_job(*, suspended: bool = False) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    annotations = {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}
    if not suspended:
        annotations[names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = T0
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "first",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "3",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": annotations,
        },
        "spec": {"parallelism": 2, "suspend": suspended, "template": {"spec": {"containers": [container]}}},
    }


def admitted_unit(job: kube.Obj) -> kube.Obj:
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="7", uid="qu-1", creationTimestamp=T0)
    unit["status"] = make_unit()["status"]
    unit["status"]["admissions"] = [{"name": "first", "replicas": 2, "running": 0}]
    return unit


def extensions(
    job: kube.Obj, unit: kube.Obj, timeouts: RunningTimeout, client: FakeClient
) -> tuple[JobExtensions, FakeEvents]:
    events = FakeEvents()
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: {"ns/first": unit},
        priority_classes=dict,
        events=events,  # type: ignore[arg-type]
        running_timeouts=RunningTimeouts(per_extension=(("job", timeouts),)),
    )
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    return jobs, events


KEY = JobKey("batch/v1", "Job", "ns", "first")
#: Admitted at T0 (2024), so any timeout of less than a few years has run out now.
EXPIRED = RunningTimeout(running_timeout=60.0, backoff_timeout=30.0)


async def test_the_job_is_held_before_its_unit_gives_the_quota_back() -> None:
    job = released_job()
    client = FakeClient()
    jobs, events = extensions(job, admitted_unit(job), EXPIRED, client)
    await jobs.reconcile(KEY)
    [(first, first_sub, suspend), (second, second_sub, status)] = client.patches
    assert (first, first_sub) == ("jobs", "")
    assert suspend["spec"] == {"suspend": True}
    assert (second, second_sub) == ("queueunits", "status")
    assert status["metadata"] == {"resourceVersion": "7"}
    assert status["status"]["phase"] == "TimeoutBackoff"
    assert status["status"]["admissions"] == []
    assert events.recorded == [
        ("QueueUnit", "Warning", "RunningTimeout"),
        ("Job", "Warning", "RunningTimeout"),
    ]


async def test_a_failed_status_write_is_decided_again_and_the_held_job_is_not_resumed() -> None:
    job = released_job()
    client = FakeClient(fail_status=True)
    jobs, _ = extensions(job, admitted_unit(job), EXPIRED, client)
    with pytest.raises(kube.Conflict):
        await jobs.reconcile(KEY)
    [(plural, _, suspend)] = client.patches
    assert plural == "jobs" and suspend["spec"] == {"suspend": True}
    # The next pass sees the held job and the unit still Dequeued (its quota still held).
    held = released_job(suspended=True)
    client = FakeClient()
    jobs, _ = extensions(held, admitted_unit(held), EXPIRED, client)
    await jobs.reconcile(KEY)
    [(plural, subresource, status)] = client.patches
    assert (plural, subresource) == ("queueunits", "status")
    assert status["status"]["phase"] == "TimeoutBackoff"


async def test_without_timeouts_an_admitted_held_job_is_resumed_as_before() -> None:
    held = released_job(suspended=True)
    client = FakeClient()
    # Admitted years ago and still held: with the no-pods timeout on it would be requeued instead.
    off = RunningTimeout(no_pods_timeout=0.0)
    jobs, events = extensions(held, admitted_unit(held), off, client)
    await jobs.reconcile(KEY)
    [(plural, subresource, resume)] = client.patches
    assert (plural, subresource) == ("jobs", "")
    assert resume["spec"]["suspend"] is False
    assert events.recorded == []


async def test_a_pending_timeout_schedules_one_look_again() -> None:
    job = released_job()
    client = FakeClient()
    # Without pods for years: the jobs-without-pods timeout would requeue it (tests/unit/test_stranded.py).
    far = RunningTimeout(running_timeout=10 * 365 * 86400.0, no_pods_timeout=0.0)
    jobs, _ = extensions(job, admitted_unit(job), far, client)
    await jobs.reconcile(KEY)
    await jobs.reconcile(KEY)
    assert [p for p in client.patches if p[1] == "status" and p[2]["status"].get("phase")] == []
    assert list(jobs._timeout_checks) == [KEY]
    jobs._timeout_checks[KEY].cancel()

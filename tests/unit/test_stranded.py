"""Admitted jobs left without pods (docs/compatibility.md#jobs-without-pods).

The decision (``shared.jobs.stranded.decide``) is a table over a unit, its pods, the timeout, the
last pod sighting and the time; the job path around it (``shared.jobs.jobpath``, carried out by
``reconciler.job_actions``) is checked with a fake client: the job is held
before its unit gives the quota back, with a ``NoPodsAfterAdmission`` event and the metric, and
after a failed status write the held job is decided again, never resumed on a stale view.
"""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.reconciler import metrics
from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import format_time, parse_time
from koord_queue.shared.jobs import jobext, podplan, registry
from koord_queue.shared.jobs.running_timeout import RunningTimeout, RunningTimeouts
from koord_queue.shared.jobs.stranded import Decision, decide

T0 = "2024-05-01T10:00:00Z"
START = parse_time(T0) or 0.0
TIMEOUT = RunningTimeout(no_pods_timeout=60.0, backoff_timeout=30.0)


def at(seconds: float) -> str:
    return format_time(START + seconds)


def make_unit(
    phase: str = "Dequeued", replicas: int = 2, *, active: bool = True, reclaim: bool = False, **status: Any
) -> dict[str, Any]:
    admission: dict[str, Any] = {"name": "main", "replicas": replicas, "running": 0}
    if reclaim:
        admission["reclaimState"] = {"replicas": 1}
    body = {
        "phase": phase,
        "message": names.Message.DEQUEUED,
        "admissions": [admission],
        "lastAllocateTime": T0,
        "lastUpdateTime": T0,
        **status,
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": "first", "namespace": "ns", "resourceVersion": "7", "uid": "qu-1"},
        "spec": {
            "active": active,
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "namespace": "ns"},
        },
        "status": {k: v for k, v in body.items() if v is not None},
    }


def pod(name: str, *, terminal: bool = False, deleting: bool = False) -> podplan.PodView:
    return podplan.PodView(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        pod_set="main",
        created=T0,
        bound=False,
        gated=False,
        terminal=terminal,
        deleting=deleting,
    )


def run(
    unit: dict[str, Any],
    pods: list[podplan.PodView] | None = None,
    timeouts: RunningTimeout = TIMEOUT,
    *,
    after: float,
    extension: str = "job",
    seen: float | None = None,
) -> Decision:
    return decide(
        unit,
        pods or [],
        timeouts,
        extension=extension,
        now=START + after,
        now_text=at(after),
        jitter=0.5,
        pods_seen_at=seen,
    )


# --- the decision ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "unit", "kwargs"),
    [
        ("switched off", make_unit(), {"timeouts": RunningTimeout(no_pods_timeout=0.0)}),
        ("another kind: its operator may take longer", make_unit(), {"extension": "tfjob"}),
        ("still queued", make_unit("Enqueued", 0), {}),
        ("reserved: checks run, the job is held", make_unit("Reserved"), {}),
        ("already backing off", make_unit("TimeoutBackoff", 0), {}),
        ("finished", make_unit("Succeed", 0), {}),
        ("deactivated", make_unit(active=False), {}),
        ("a reclaim deletes pods on purpose", make_unit(reclaim=True), {}),
        ("nothing admitted", make_unit(replicas=0), {}),
        ("no time to count from", make_unit(lastAllocateTime=None, lastUpdateTime=None), {}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_nothing_is_written_pending_or_remembered(
    case: str, unit: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    assert run(unit, after=3600.0, **kwargs) == Decision()


@pytest.mark.parametrize(
    "pods",
    [[pod("gated")], [pod("done", terminal=True)], [pod("going", deleting=True)]],
    ids=["a gated pod", "a finished pod (a Job in its failure backoff)", "a terminating pod"],
)
def test_any_pod_at_all_means_not_stranded_and_is_remembered(pods: list[podplan.PodView]) -> None:
    assert run(make_unit(), pods, after=3600.0) == Decision(pods_seen_at=START + 3600.0)


@pytest.mark.parametrize("phase", ["Dequeued", "Running"])
def test_before_the_timeout_the_job_is_looked_at_again_when_it_falls_due(phase: str) -> None:
    assert run(make_unit(phase), after=45.0, seen=START) == Decision(recheck_in=15.0, pods_seen_at=START)


def test_the_timeout_counts_from_the_last_pod_seen_when_that_is_later_than_the_admission() -> None:
    decision = run(make_unit("Running"), after=100.0, seen=START + 80.0)
    assert decision == Decision(recheck_in=40.0, pods_seen_at=START + 80.0)


def test_a_sighting_older_than_the_admission_does_not_count() -> None:
    assert run(make_unit(), after=30.0, seen=START - 500.0).recheck_in == 30.0


def test_after_the_timeout_the_unit_backs_off_gives_its_quota_back_and_the_job_is_held() -> None:
    decision = run(make_unit(), after=60.0, seen=START)
    assert decision.suspend
    assert decision.recheck_in is None and decision.pods_seen_at is None
    assert decision.status_patch is not None
    status = decision.status_patch["status"]
    assert status["phase"] == "TimeoutBackoff"
    assert status["message"] == "Backoff due to no pods after admission"
    assert status["admissions"] == []
    assert status["requeueState"]["requeueAt"] == at(90.0)
    assert decision.event_reason == "NoPodsAfterAdmission"
    assert "1m0s (noPodsTimeout)" in decision.event_message
    assert "queued again in 30s" in decision.event_message


def test_without_a_backoff_time_the_doubling_requeue_backoff_applies() -> None:
    decision = run(make_unit(), timeouts=RunningTimeout(no_pods_timeout=60.0), after=60.0, seen=START)
    assert decision.status_patch is not None
    assert decision.status_patch["status"]["requeueState"]["count"] == 1


def test_a_running_unit_whose_pods_all_vanished_is_requeued_once_the_timeout_has_passed() -> None:
    decision = run(make_unit("Running"), after=200.0, seen=START + 120.0)
    assert decision.event_reason == "NoPodsAfterAdmission"


# --- the job extension's step ------------------------------------------------------------------------


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
        return {"metadata": {"resourceVersion": "8"}} if subresource == "status" else {}

    async def delete(self, res: kube.Resource, name: str, **kwargs: Any) -> kube.Obj:
        self.patches.append((res.plural, "delete", name))
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
    job: kube.Obj, client: FakeClient, timeouts: RunningTimeout = TIMEOUT, *, first_look: float | None = START
) -> tuple[JobExtensions, FakeEvents]:
    """The job extensions with ``job`` in their store and its unit admitted; ``first_look`` is when
    the clock started (None: this process has never looked at the unit, as after a restart)."""
    events = FakeEvents()
    unit = admitted_unit(job)
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: {"ns/first": unit},
        priority_classes=dict,
        events=events,  # type: ignore[arg-type]
        running_timeouts=RunningTimeouts(per_extension=(("job", timeouts),)),
    )
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    if first_look is not None:
        jobs._pods_seen_at["ns/first"] = first_look
    return jobs, events


KEY = JobKey("batch/v1", "Job", "ns", "first")


def requeued() -> float:
    return metrics.JOBS_WITHOUT_PODS_REQUEUED.labels("Job")._value.get()


async def test_a_podless_job_is_held_before_its_unit_gives_the_quota_back_with_an_event_and_a_count() -> None:
    client = FakeClient()
    jobs, events = extensions(released_job(), client)
    before = requeued()
    await jobs.reconcile(KEY)
    [(first, first_sub, suspend), (second, second_sub, status)] = client.patches
    assert (first, first_sub) == ("jobs", "") and suspend["spec"] == {"suspend": True}
    assert (second, second_sub) == ("queueunits", "status")
    assert status["metadata"] == {"resourceVersion": "7"}
    assert status["status"]["phase"] == "TimeoutBackoff" and status["status"]["admissions"] == []
    assert events.recorded == [
        ("QueueUnit", "Warning", "NoPodsAfterAdmission"),
        ("Job", "Warning", "NoPodsAfterAdmission"),
    ]
    assert requeued() == before + 1


async def test_a_failed_status_write_is_decided_again_and_the_held_job_is_not_resumed() -> None:
    client = FakeClient(fail_status=True)
    jobs, _ = extensions(released_job(), client)
    with pytest.raises(kube.Conflict):
        await jobs.reconcile(KEY)
    # The next pass sees the held job with its unit still admitted (the same view as a pass brought
    # by the suspension before the status write is delivered): the status is written, nothing else.
    client = FakeClient()
    jobs, events = extensions(released_job(suspended=True), client)
    await jobs.reconcile(KEY)
    [(plural, subresource, status)] = client.patches
    assert (plural, subresource) == ("queueunits", "status")
    assert status["status"]["message"] == "Backoff due to no pods after admission"
    assert [reason for _, _, reason in events.recorded] == ["NoPodsAfterAdmission"] * 2


async def test_a_pending_timeout_schedules_its_own_look_again() -> None:
    client = FakeClient()
    far = RunningTimeout(no_pods_timeout=10 * 365 * 86400.0)
    jobs, _ = extensions(released_job(), client)
    jobs.running_timeouts = RunningTimeouts(per_extension=(("job", far),))
    await jobs.reconcile(KEY)
    assert [p for p in client.patches if p[1] == "status" and p[2]["status"].get("phase")] == []
    assert list(jobs._no_pods_checks) == [KEY]
    jobs._no_pods_checks[KEY].cancel()


# --- the two causes of the full chaos run of 2026-12-04 (RELIABILITY.md) ---------------------------
# A freshly restarted reconciler looked at chaos/sentinel-0 while the Job controller had just let go
# of its relabelled pod and its replacement was not in view yet: counted from the admission minutes
# before, the clock had run out, and the Job was requeued. The next pass saw the suspension's watch
# event before the status write's, and the replacement too: no longer podless, it went on to the
# resume step and released the held Job on the unit's stale, admitted copy.


def test_with_no_memory_the_clock_starts_at_this_first_look_not_at_the_admission() -> None:
    # An hour after the admission, a process that never looked at the unit before waits the bound.
    assert run(make_unit(), after=3600.0) == Decision(recheck_in=60.0, pods_seen_at=START + 3600.0)
    assert run(make_unit(), after=3660.0, seen=START + 3600.0).suspend


def job_pod(name: str, *, controller: str | None = "u-1", unit: bool = True, **extra: Any) -> kube.Obj:
    """A pod in ``ns``; ``controller``: the UID of its controlling Job (None: none, as after a let-go)."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": T0}
    if unit:
        meta["annotations"] = {
            names.RELATED_QUEUEUNIT_ANNOTATION: "ns/first",
            names.RELATED_PODSET_ANNOTATION: "first",
        }
    if controller is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "uid": controller, "controller": True}
        ]
    meta.update(extra.pop("metadata", {}))
    spec = {"schedulingGates": [{"name": names.ADMISSION_GATE}], "containers": [{"name": "c"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, **extra}


def add_pods(jobs: JobExtensions, *pods: kube.Obj) -> None:
    for p in pods:
        jobs.pods.objects[f"ns/{p['metadata']['name']}"] = p
        jobs._on_pod(None, p)


def requeues(client: FakeClient) -> list[Any]:
    return [p for p in client.patches if p[1] == "status" and p[2]["status"].get("phase") == "TimeoutBackoff"]


async def test_a_restarted_reconciler_does_not_requeue_a_job_whose_let_go_pod_awaits_a_replacement() -> None:
    client = FakeClient()
    jobs, _ = extensions(released_job(), client, first_look=None)  # admitted long ago, no memory
    add_pods(jobs, job_pod("relabelled", controller=None))  # let go by the Job controller
    await jobs.reconcile(KEY)
    assert requeues(client) == []
    assert ("jobs", "", {"spec": {"suspend": True}}) not in client.patches
    assert list(jobs._no_pods_checks) == [KEY]  # looked at again once the bound is up
    jobs._no_pods_checks[KEY].cancel()


@pytest.mark.parametrize(
    "pod",
    [
        job_pod("no-unit", unit=False),
        job_pod("going", unit=False, metadata={"deletionTimestamp": T0}),
        job_pod("failed", status={"phase": "Failed"}),
    ],
    ids=["gated, naming no unit", "being deleted, naming no unit", "finished"],
)
async def test_every_pod_the_job_controls_stops_the_clock_whether_or_not_it_names_the_unit(
    pod: kube.Obj,
) -> None:
    client = FakeClient()
    jobs, _ = extensions(released_job(), client)  # the clock started an age ago
    add_pods(jobs, pod)
    await jobs.reconcile(KEY)
    assert requeues(client) == []
    assert jobs._pods_seen_at["ns/first"] > START


async def test_a_pod_that_merely_names_the_unit_or_carries_a_plain_owner_reference_does_not_count() -> None:
    client = FakeClient()
    jobs, _ = extensions(released_job(), client)
    plain = job_pod("plain", controller=None)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "uid": "u-1"}  # not the controller
    plain["metadata"]["ownerReferences"] = [owner]
    add_pods(jobs, job_pod("bare", controller=None), plain)
    await jobs.reconcile(KEY)
    assert len(requeues(client)) == 1


async def test_after_the_requeue_no_pass_resumes_the_job_on_the_units_copy_from_before_it() -> None:
    client = FakeClient()
    jobs, _ = extensions(released_job(), client)
    await jobs.reconcile(KEY)
    assert len(requeues(client)) == 1
    # The suspension's watch event arrives before the status write's (the unit's copy is still the
    # admitted one), and the Job's replacement pod comes into view: nothing may be written now.
    client.patches.clear()
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = released_job(suspended=True)
    add_pods(jobs, job_pod("replacement"))
    await jobs.reconcile(KEY)
    assert client.patches == []


def test_a_pod_naming_no_unit_that_the_job_controls_wakes_the_job_when_it_goes() -> None:
    """Its going may leave the Job podless, and no unit's pod event would bring the Job back."""
    jobs, _ = extensions(released_job(), FakeClient())
    gone = job_pod("no-unit", unit=False)
    jobs._dirty.clear()
    jobs._on_pod(gone, None)
    assert KEY in jobs._dirty
    jobs._dirty.clear()
    jobs._on_pod(job_pod("bare", controller=None, unit=False), None)  # nobody's pod: nothing to wake
    assert not jobs._dirty

"""The job path's decision (docs/architecture.md#the-job-path-view-decide-act): every branch of
``shared.jobs.jobpath.decide`` with plain data (a job, its unit, pod views, settings, memory, the
time), no client and no event loop. The executor's wiring is covered by the tests that drive
``JobExtensions.reconcile`` through a fake client (test_job_extensions_wiring.py and others).
"""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.durations import format_time, parse_time
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.jobs import jobext, lifecycle, podplan, registry
from koord_queue.shared.jobs import jobsteps as steps
from koord_queue.shared.jobs.base import JobStatus
from koord_queue.shared.jobs.jobpath import POOL_UNKNOWN, JobView, Settings, decide
from koord_queue.shared.jobs.running_timeout import RunningTimeout
from koord_queue.shared.jobs.unitowners import ORPHAN_FINALIZER, JobKey

Obj = dict[str, Any]

NOW = "2026-12-05T00:00:00Z"
START = parse_time(NOW) or 0.0
ADAPTER = registry.by_extension("job")
KEY = JobKey("batch/v1", "Job", "ns", "first")
#: No timeouts, so each test sees only the stage it is about (the jobs-without-pods timeout is on
#: by default for batch/v1 Jobs).
QUIET = Settings(timeouts=RunningTimeout(no_pods_timeout=0.0))


def job(*, released: bool = False, labelled: bool = True, **spec: Any) -> Obj:
    """A Job of 2 pods: queued (held, enqueued, no dequeue stamp), or released by the reconciler."""
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    annotations = {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"}
    if released:
        annotations[names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION] = NOW
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "first",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "3",
            "creationTimestamp": NOW,
            "labels": {names.QUOTA_NAME_LABEL: "q"} if labelled else {},
            "annotations": annotations,
        },
        "spec": {
            "parallelism": 2,
            "suspend": not released,
            "template": {"spec": {"containers": [container]}},
            **spec,
        },
    }


def unit_of(source: Obj, phase: str | None = "Running", *, replicas: int = 2, **status: Any) -> Obj:
    """``source``'s own unit (owned by it), admitted for ``replicas`` when a phase is given."""
    unit = jobext.build_queue_unit(source, ADAPTER, {})
    unit["metadata"].update(resourceVersion="7", creationTimestamp=NOW, uid="qu-1")
    if phase is not None:
        admission = {"name": "first", "replicas": replicas, "running": 0}
        unit["status"] = {"phase": phase, "admissions": [admission], "lastAllocateTime": NOW, **status}
    return unit


def orphaned(unit: Obj) -> Obj:
    """``unit`` as the garbage collector leaves it after ``--cascade=orphan``: no owner reference."""
    del unit["metadata"]["ownerReferences"]
    return unit


def pod(name: str, *, bound: bool = False, gated: bool = False) -> podplan.PodView:
    return podplan.PodView(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        pod_set="first",
        created=NOW,
        bound=bound,
        gated=gated,
        terminal=False,
        deleting=False,
        resource_version="5",
    )


def view(job: Obj | None, unit: Obj | None = None, **fields: Any) -> JobView:
    return JobView(
        KEY,
        ADAPTER,
        job,
        unit,
        "ns/first",
        **{"settings": QUIET, "now": START, "now_text": NOW, "jitter": 0.5, **fields},
    )


def kinds(actions: tuple[steps.Action, ...]) -> list[str]:
    return [type(a).__name__ for a in actions]


# --- a job that is gone -------------------------------------------------------------------------------


def test_a_gone_job_without_a_unit_only_forgets_its_report() -> None:
    assert decide(view(None)) == (steps.ForgetReport(),)


def test_a_gone_jobs_orphaned_unit_is_released_once_none_of_its_pods_runs() -> None:
    unit = orphaned(unit_of(job()))
    assert decide(view(None, unit)) == (steps.ForgetReport(), steps.ReleaseOrphan(unit))


def test_a_gone_jobs_orphaned_unit_stays_while_one_of_its_pods_runs() -> None:
    assert decide(view(None, orphaned(unit_of(job())), orphan_pods_run=True)) == (steps.ForgetReport(),)


def test_a_gone_jobs_unit_still_owned_is_left_to_the_garbage_collector() -> None:
    assert decide(view(None, unit_of(job()))) == (steps.ForgetReport(),)


# --- a job that does not look queued ------------------------------------------------------------------


def test_an_unmanaged_job_is_left_alone() -> None:
    assert decide(view(job(labelled=False), managed=False)) == ()


def test_a_genuine_child_is_left_to_its_parents_unit() -> None:
    assert decide(view(job(labelled=False), genuine_child=True)) == ()


def test_an_unlabelled_job_where_queueing_is_mandatory_gets_the_default_quota() -> None:
    actions = decide(view(job(labelled=False), default_quota="team"))
    assert actions[0] == steps.SetDefaultQuota("team")
    assert isinstance(actions[1], steps.RecordEvent) and actions[1].reason == names.EventReason.DEFAULT_QUOTA
    assert len(actions) == 2


def test_an_unlabelled_job_without_a_default_quota_is_told_why_it_stays_held() -> None:
    actions = decide(view(job(labelled=False), default_quota_message="two quotas list ns"))
    assert actions == (
        steps.RecordEvent("job", "Warning", names.EventReason.NO_DEFAULT_QUOTA, "two quotas list ns"),
    )


def test_an_unlabelled_job_without_a_default_quota_gets_the_standard_message() -> None:
    (event,) = decide(view(job(labelled=False)))
    assert isinstance(event, steps.RecordEvent)
    assert event.message == names.no_default_quota_message("ns")


def test_an_unlabelled_job_that_runs_past_the_webhook_is_held_first() -> None:
    running = job(labelled=False, suspend=False)
    assert decide(view(running, default_quota="team")) == (steps.HoldEscaped(),)


def test_an_unlabelled_job_being_deleted_is_not_labelled() -> None:
    deleting = job(labelled=False)
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert decide(view(deleting, default_quota="team")) == ()


def test_an_unlabelled_finished_job_is_not_labelled() -> None:
    done = job(labelled=False)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert decide(view(done, default_quota="team")) == ()


def test_a_job_that_lost_its_label_stays_managed_by_its_own_unit() -> None:
    mine = job()
    unlabelled = job(labelled=False)
    assert decide(view(unlabelled, unit_of(mine, phase=None), managed=False)) == (steps.ForgetReport(),)


# --- a unit that is not the job's own yet -------------------------------------------------------------


def test_the_unit_of_a_job_being_deleted_with_cascade_orphan_is_disowned() -> None:
    deleting = job()
    deleting["metadata"].update(deletionTimestamp=NOW, finalizers=[ORPHAN_FINALIZER])
    (action,) = decide(view(deleting, unit_of(job())))
    assert isinstance(action, steps.Disown)
    assert action.patch["metadata"] == {"ownerReferences": [], "resourceVersion": "7"}


def test_a_predecessors_orphaned_unit_is_released_before_the_new_job_gets_its_own() -> None:
    unit = orphaned(unit_of(job()))
    assert decide(view(job(), unit)) == (steps.ReleaseOrphan(unit),)


def test_a_predecessors_orphaned_unit_stays_while_its_pods_run() -> None:
    assert decide(view(job(), orphaned(unit_of(job())), orphan_pods_run=True)) == ()


def test_a_unit_owned_by_a_deleted_predecessor_waits_for_the_garbage_collector() -> None:
    predecessor = job()
    predecessor["metadata"]["uid"] = "u-0"
    assert decide(view(job(), unit_of(predecessor))) == ()


def test_nothing_is_decided_on_a_unit_older_than_our_own_status_write() -> None:
    assert decide(view(job(), unit_of(job()), own_write_pending=True)) == ()


# --- holding, creating, adopting ----------------------------------------------------------------------


def test_a_job_running_without_the_reconcilers_stamp_is_held_before_anything_else() -> None:
    assert decide(view(job(suspend=False))) == (steps.HoldEscaped(),)


def test_a_queued_job_without_a_unit_gets_one() -> None:
    assert decide(view(job())) == (steps.CreateUnit(jobext.build_queue_unit(job(), ADAPTER, {})),)


def test_a_released_job_without_a_unit_gets_one_marked_for_adoption_and_its_status_after() -> None:
    released = job(released=True)
    released["status"] = {"active": 2}
    actions = decide(view(released))
    assert kinds(actions) == ["CreateUnit", "Log", "FinishAdoption"]
    assert actions[2] == steps.FinishAdoption(JobStatus.RUNNING, suspended=False, stamped=True)


def test_a_finished_job_without_a_unit_gets_none() -> None:
    done = job(released=True)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert decide(view(done)) == ()


def test_a_job_being_deleted_without_a_unit_gets_none() -> None:
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert decide(view(deleting)) == ()


def test_a_job_whose_spec_cannot_be_queued_is_told_why() -> None:
    (event,) = decide(view(job(parallelism=-1)))
    assert isinstance(event, steps.RecordEvent) and event.reason == "InvalidJob"


def test_a_job_naming_a_class_its_quota_refuses_is_warned_once_its_unit_is_created() -> None:
    asking = job()
    asking["spec"]["template"]["spec"]["priorityClassName"] = "gold"
    settings = Settings(priority_classes={"gold": 100}, allowed_classes=frozenset(), timeouts=QUIET.timeouts)
    actions = decide(view(asking, settings=settings))
    assert kinds(actions) == ["CreateUnit", "RecordEvent"]
    assert isinstance(actions[1], steps.RecordEvent) and actions[1].reason == "PriorityClassNotAllowed"


def test_a_unit_created_for_adoption_gets_its_status_written() -> None:
    released = job(released=True)
    released["status"] = {"active": 2}
    unit = jobext.build_queue_unit(released, ADAPTER, {}, adopted=True)
    unit["metadata"].update(resourceVersion="7")
    (action,) = decide(view(released, unit))
    assert isinstance(action, steps.WriteUnitStatus) and action.version == "seen"
    assert action.patch["status"]["phase"] == names.Phase.DEQUEUED


# --- the lifecycle stages, before the resume ----------------------------------------------------------


def test_a_queued_unit_follows_its_jobs_spec_and_the_pass_goes_on() -> None:
    grown = job(parallelism=3)
    actions = decide(view(grown, unit_of(job(), phase=None)))
    assert isinstance(actions[0], steps.PatchUnit) and actions[0].version == "seen"
    assert actions[0].patch["spec"]["podSet"][0]["count"] == 3
    assert kinds(actions)[1:] == ["ForgetReport"]


def test_an_admitted_job_whose_pods_grew_is_held_then_queued_again_at_its_new_size() -> None:
    bigger = job(released=True)
    bigger["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    actions = decide(view(bigger, unit_of(job(released=True))))
    assert kinds(actions) == ["HoldThenRelease", "Log", "RecordEvent", "PatchUnit"]
    assert actions[0] == steps.HoldThenRelease(actions[0].status_patch)  # type: ignore[union-attr]
    assert actions[3] == steps.PatchUnit(actions[3].patch, version="last")  # type: ignore[union-attr]


def budgeted_job() -> Obj:
    """A released job with a budget of 60 seconds."""
    released = job(released=True)
    released["metadata"]["annotations"][names.MAX_EXEC_TIME_ANNOTATION] = "60"
    return released


def budgeted(ready_for: float) -> Obj:
    """Its unit, its pods ready for ``ready_for`` seconds."""
    unit = unit_of(budgeted_job())
    ready = {"type": "PodsReady", "status": "True", "lastTransitionTime": format_time(START - ready_for)}
    unit["status"]["conditions"] = [ready]
    return unit


def test_a_used_up_budget_deactivates_the_spec_before_the_status() -> None:
    actions = decide(view(budgeted_job(), budgeted(ready_for=120)))
    assert kinds(actions) == ["PatchUnit", "WriteUnitStatus", "RecordEvent"]
    assert actions[0] == steps.PatchUnit({"spec": {"active": False}}, version="none")
    assert isinstance(actions[1], steps.WriteUnitStatus) and actions[1].version == "last"


def test_a_running_budget_looks_again_when_it_runs_out_and_the_pass_goes_on() -> None:
    actions = decide(view(budgeted_job(), budgeted(ready_for=20)))
    assert actions[0] == steps.Recheck(40.0)
    assert "ResumeJob" not in kinds(actions) and "ForgetReport" in kinds(actions)


def test_a_deactivated_unit_holds_its_job_before_giving_the_quota_back() -> None:
    unit = unit_of(job(released=True))
    unit["spec"]["active"] = False
    actions = decide(view(job(released=True), unit))
    parked = lifecycle.deactivation(unit, now=START, now_text=NOW)
    assert actions[0] == steps.HoldThenRelease(parked or {})
    assert kinds(actions) == ["HoldThenRelease", "RecordEvent"]


def timed(**timeouts: float) -> Settings:
    return Settings(timeouts=RunningTimeout(no_pods_timeout=0.0, **timeouts))


def test_a_running_timeout_not_due_is_remembered_and_looked_at_again() -> None:
    unit = unit_of(job(released=True), phase="Dequeued")
    actions = decide(view(job(released=True), unit, settings=timed(running_timeout=300.0)))
    assert actions[0] == steps.RememberShortSince(None)
    assert actions[1] == steps.ScheduleCheck("timeout", 300.0)
    assert "HoldThenRelease" not in kinds(actions)


def test_a_running_timeout_that_fell_due_holds_the_job_then_backs_the_unit_off() -> None:
    unit = unit_of(job(released=True), phase="Dequeued", lastAllocateTime=format_time(START - 600))
    actions = decide(view(job(released=True), unit, settings=timed(running_timeout=300.0)))
    assert kinds(actions) == [
        "RememberShortSince",
        "ScheduleCheck",
        "HoldThenRelease",
        "Log",
        "RecordEvent",
        "RecordEvent",
    ]
    hold = actions[2]
    assert isinstance(hold, steps.HoldThenRelease) and hold.hold and hold.pods == "unit"
    assert [a.on for a in actions[4:] if isinstance(a, steps.RecordEvent)] == ["unit", "job"]


def test_a_partial_running_timeout_shrinks_the_unit_without_holding_the_job() -> None:
    unit = unit_of(job(released=True), phase="Dequeued", lastAllocateTime=format_time(START - 600))
    settings = timed(partial_running_timeout=60.0)
    running = (pod("a", bound=True),)
    actions = decide(view(job(released=True), unit, settings=settings, pods=running, short_since={}))
    hold = next(a for a in actions if isinstance(a, steps.HoldThenRelease))
    assert not hold.hold


def no_pods(**fields: Any) -> JobView:
    unit = unit_of(job(released=True), phase="Dequeued", lastAllocateTime=format_time(START - 600))
    settings = Settings(timeouts=RunningTimeout(no_pods_timeout=60.0))
    return view(job(released=True), unit, settings=settings, **fields)


def test_a_job_without_pods_starts_the_clock_and_is_looked_at_when_it_runs_out() -> None:
    actions = decide(no_pods())
    assert actions[0] == steps.RememberPodsSeenAt(START)
    assert isinstance(actions[1], steps.ScheduleCheck) and actions[1].timer == "no_pods"


def test_a_job_without_pods_past_its_timeout_is_held_then_queued_again() -> None:
    actions = decide(no_pods(pods_seen_at=START - 120))
    assert kinds(actions)[2:] == [
        "HoldThenRelease",
        "CountRequeuedWithoutPods",
        "Log",
        "RecordEvent",
        "RecordEvent",
    ]
    hold = actions[2]
    assert isinstance(hold, steps.HoldThenRelease) and hold.pods == "job"


def test_a_job_with_pods_forgets_the_clock() -> None:
    actions = decide(no_pods(job_pods=(pod("a", bound=True),), pods_seen_at=START - 120))
    assert actions[0] == steps.RememberPodsSeenAt(START)
    assert "HoldThenRelease" not in kinds(actions)


# --- the resume and the pod plan ----------------------------------------------------------------------


def test_an_admitted_unit_resumes_its_held_job_and_nothing_else() -> None:
    actions = decide(view(job(), unit_of(job(), phase="Dequeued")))
    assert kinds(actions) == ["ResumeJob"]


def test_a_finished_job_is_not_resumed_but_reported_finished() -> None:
    done = job()
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    actions = decide(view(done, unit_of(job(), phase="Running")))
    assert kinds(actions) == ["ForgetReport", "WriteUnitStatus"]
    write = actions[1]
    assert isinstance(write, steps.WriteUnitStatus) and write.remember
    assert write.patch["status"]["phase"] == names.Phase.SUCCEED


def test_admitted_gated_pods_are_ungated() -> None:
    gated = (pod("a", gated=True), pod("b", gated=True))
    actions = decide(view(job(released=True), unit_of(job(released=True)), pods=gated))
    assert steps.Ungate(gated) in actions


H100 = PoolPlacement("h100", "h100-root", match_labels={"nvidia.com/gpu.product": "h100"})


def test_pods_of_a_unit_admitted_to_a_pool_are_ungated_with_its_placement() -> None:
    """docs/pools.md#placement: the pool named by the unit's status.pool, as the controller knows it."""
    gated = (pod("a", gated=True),)
    unit = unit_of(job(released=True), pool="h100")
    actions = decide(view(job(released=True), unit, pods=gated, placement=H100))
    assert steps.Ungate(gated, H100) in actions


def test_pods_of_a_unit_without_a_pool_are_ungated_without_placement() -> None:
    gated = (pod("a", gated=True),)
    actions = decide(view(job(released=True), unit_of(job(released=True)), pods=gated, placement=H100))
    assert steps.Ungate(gated, None) in actions


@pytest.mark.parametrize(
    ("placement", "why"),
    [
        (None, "is not known"),
        (PoolPlacement("a100"), "is not known"),  # the controller's answer for another pool
        (
            PoolPlacement("h100", problem="its nodeSelector cannot be read"),
            "cannot place pods: its nodeSelector cannot be read",
        ),
    ],
)
def test_a_pool_that_cannot_place_pods_releases_none(placement: PoolPlacement | None, why: str) -> None:
    gated = (pod("a", gated=True), pod("b", gated=True))
    unit = unit_of(job(released=True), pool="h100")
    actions = decide(view(job(released=True), unit, pods=gated, placement=placement))
    assert not any(isinstance(a, steps.Ungate) for a in actions)
    message = f"2 pod(s) stay gated: the unit was admitted to pool h100, which {why}"
    assert steps.RecordEvent("job", "Warning", POOL_UNKNOWN, message) in actions
    assert steps.Log("warning", f"ns/first: {message}") in actions
    assert kinds(actions)[-1] in ("ForgetReport", "WriteUnitStatus", "ScheduleCheck")  # the report goes on


def test_a_reclaim_deletes_unbound_pods_and_writes_its_status_last() -> None:
    unit = unit_of(job(released=True))
    unit["status"]["admissions"][0]["reclaimState"] = {"replicas": 1}
    pods = (pod("a", bound=True), pod("b"))
    actions = decide(view(job(released=True), unit, pods=pods))
    assert kinds(actions) == ["DeletePods", "WriteUnitStatus"]
    delete = actions[0]
    assert isinstance(delete, steps.DeletePods) and [p.name for p in delete.plan.delete] == ["b"]


def test_pods_that_escaped_their_job_are_deleted() -> None:
    escaped = (pod("stray", bound=True),)
    actions = decide(view(job(released=True), unit_of(job(released=True)), escaped=escaped))
    delete = actions[0]
    assert isinstance(delete, steps.DeletePods) and delete.plan.escaped == list(escaped)


def test_pods_kept_gated_are_reported_on_an_admitted_unit_only() -> None:
    withheld = ((pod("x", gated=True), "owned by another job"),)
    admitted = decide(view(job(released=True), unit_of(job(released=True)), withheld=withheld))
    assert "ReportPodProblems" in kinds(admitted)
    queued = decide(view(job(), unit_of(job(), phase=None), withheld=withheld))
    assert "ReportPodProblems" not in kinds(queued)


def test_a_job_running_with_only_gated_pods_is_reported_pending() -> None:
    released = job(released=True)
    released["status"] = {"active": 2}
    unit = unit_of(released, phase="Dequeued")
    actions = decide(view(released, unit, pods=(pod("a", gated=True),)))
    assert all(
        (a.patch.get("status") or {}).get("phase") != names.Phase.RUNNING
        for a in actions
        if isinstance(a, steps.WriteUnitStatus)
    )


def counting(**fields: Any) -> tuple[steps.Action, ...]:
    """A running unit one of whose 2 bound pods is gone (the job's end usually follows within a
    second): a report that may wait."""
    unit = unit_of(job(released=True))
    unit["status"]["admissions"][0]["running"] = 2
    bound = (pod("a", bound=True),)
    return decide(view(job(released=True), unit, pods=bound, monotonic=100.0, **fields))


def test_a_pod_count_report_that_may_wait_waits_with_one_recheck() -> None:
    actions = counting()
    assert actions[-2:] == (
        steps.RememberReportSince(100.0),
        steps.ScheduleCheck("report", podplan.COALESCE_SECONDS),
    )


def test_a_waiting_report_with_its_recheck_pending_sets_no_other() -> None:
    actions = counting(report_since=99.0, report_check_pending=True)
    assert actions[-1] == steps.RememberReportSince(99.0)


def test_a_report_that_waited_long_enough_is_written() -> None:
    actions = counting(report_since=100.0 - podplan.COALESCE_SECONDS, report_check_pending=True)
    assert kinds(actions)[-2:] == ["ForgetReport", "WriteUnitStatus"]


def test_a_queued_unit_following_a_refused_class_warns_the_job() -> None:
    asking = job()
    asking["spec"]["template"]["spec"]["priorityClassName"] = "gold"
    settings = Settings(priority_classes={"gold": 100}, allowed_classes=frozenset(), timeouts=QUIET.timeouts)
    unit = unit_of(job(), phase=None)
    unit["spec"]["priorityClassName"] = "silver"  # named before the quota refused the class
    actions = decide(view(asking, unit, settings=settings))
    assert kinds(actions)[:2] == ["PatchUnit", "RecordEvent"]
    assert isinstance(actions[1], steps.RecordEvent) and actions[1].reason == "PriorityClassNotAllowed"


def test_a_resized_job_whose_unit_is_being_reclaimed_waits_for_the_reclaim() -> None:
    bigger = job(released=True)
    bigger["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    unit = unit_of(job(released=True))
    unit["status"]["admissions"][0]["reclaimState"] = {"replicas": 1}
    actions = decide(view(bigger, unit))
    assert "HoldThenRelease" not in kinds(actions) and "PatchUnit" not in kinds(actions)

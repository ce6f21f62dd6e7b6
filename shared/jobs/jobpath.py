"""The job path's decision: what the job extension does about one job now
(docs/architecture.md#the-job-path-view-decide-act).

The controller (``reconciler.jobs``) builds one :class:`JobView` of a job (the job, its unit, its
pods, the settings and the controller's memory the decision needs, and ``now``), :func:`decide`
answers an ordered tuple of actions, and one executor (``reconciler.job_actions``) performs them in
order. Each stage that today "writes and waits for the update" ends the tuple there: the write's
watch event brings the job back with fresh objects. The stages, in their order:

1. a job that is gone: its unit released if the job was deleted with ``--cascade=orphan``;
2. a job that does not look queued: ignored, left to its parent (a genuine child), or labelled with
   its namespace's default quota (docs/operations.md#mandatory-queueing);
3. a unit that is not the job's own yet: disowned, released, left to garbage collection, or not
   looked at while our own status write is not in the store (``kube.OwnWrites``);
4. a job that runs without admission is held; a job without a unit gets one (adopted if released);
5. keeping the unit in step with the job, the execution budget, the running timeout and the
   jobs-without-pods timeout, each before the resume: a job held by one of them whose unit write
   failed must be decided again, not released again;
6. the resume, then the pod plan: reclaims, the status it writes, ungates and the coalesced report.

Pure: no I/O and no clock; time, jitter and memory are fields of the view.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.jobs import (
    adoption,
    batch_job,
    jobext,
    jobset,
    lifecycle,
    podplan,
    ray,
    running_timeout,
    stranded,
    unitowners,
)
from koord_queue.shared.jobs.base import Job, JobAdapter, JobSpecError, JobStatus, is_dequeued
from koord_queue.shared.jobs.jobsteps import (
    Action,
    Actions,
    CountRequeuedWithoutPods,
    CreateUnit,
    DeletePods,
    Disown,
    FinishAdoption,
    ForgetReport,
    HoldEscaped,
    HoldThenRelease,
    Log,
    PatchUnit,
    Recheck,
    RecordEvent,
    ReleaseOrphan,
    RememberPodsSeenAt,
    RememberReportSince,
    RememberShortSince,
    ReportPodProblems,
    ResumeJob,
    ScheduleCheck,
    SetDefaultQuota,
    Ungate,
    WriteUnitStatus,
)
from koord_queue.shared.jobs.poddefaults import PodDefaults
from koord_queue.shared.jobs.podplan import PodView
from koord_queue.shared.jobs.unitowners import JobKey

__all__ = ["FINISHED", "POOL_UNKNOWN", "RUNNING_ONCE_BOUND", "JobView", "Settings", "decide"]

Obj = dict[str, Any]

FINISHED: Final = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED})
#: Kinds whose ``job_status`` is Running as soon as pods are active, gated or unbound ones included
#: (a Job's ``status.active``, a JobSet's active child Jobs): reported Pending until one is bound.
RUNNING_ONCE_BOUND: Final = frozenset(
    {
        (batch_job.BatchJobAdapter.api_version, batch_job.BatchJobAdapter.kind),
        (jobset.JobSetAdapter.api_version, jobset.JobSetAdapter.kind),
    }
)

#: The Warning on a job whose unit was admitted to a pool the controller cannot place pods on (yet).
POOL_UNKNOWN: Final = "PoolUnknown"


# --- the view -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """What the configuration and the cluster say about the job: the PriorityClasses, the cap on its
    priority and the classes its quota allows (docs/compatibility.md#priority-cap), the default class,
    what the apiserver fills into its pods, and its kind's timeouts."""

    priority_classes: Mapping[str, int] = field(default_factory=dict)
    priority_cap: int | None = None
    allowed_classes: frozenset[str] | None = None
    default_class: str | None = None
    pod_defaults: PodDefaults | None = None
    timeouts: running_timeout.RunningTimeout = field(default_factory=running_timeout.RunningTimeout)


@dataclass(frozen=True, slots=True)
class JobView:
    """One job as the decision sees it. Flags the controller computed by lookups (or, for
    ``genuine_child``, one read of the claimed parent when the job does not look queued) are fields,
    so :func:`decide` stays pure.

    ``unit`` is the unit at ``unit_key`` (the job's unit name); ``pods`` the unit's pods,
    ``job_pods`` every pod of the job (only when the jobs-without-pods timeout applies to its kind),
    ``escaped``/``withheld`` the pods that name the unit but are not the job's (``reconciler.job_pods``).
    ``short_since``, ``pods_seen_at``, ``report_since`` and ``report_check_pending`` are the
    controller's memory for this job; ``monotonic`` the event loop's clock, which the report's
    coalescing counts in. ``placement`` is the pool the unit's ``status.pool`` names, as the
    controller knows it (None: no pool named, or not known).
    """

    key: JobKey
    adapter: JobAdapter
    job: Obj | None
    unit: Obj | None
    unit_key: str
    #: the controller's ``managed`` (labels, mandatory queueing): asked only when the job does not
    #: look queued by its adapter nor owns its unit
    managed: bool = True
    genuine_child: bool = False
    #: the namespace's default quota, or why there is none: asked only for an unlabelled job
    default_quota: str | None = None
    default_quota_message: str | None = None
    own_write_pending: bool = False
    #: whether a pod naming an orphaned unit still runs: asked only for an orphaned unit
    orphan_pods_run: bool = False
    live_cluster: Job | None = None
    pods: tuple[PodView, ...] = ()
    job_pods: tuple[PodView, ...] = ()
    escaped: tuple[PodView, ...] = ()
    withheld: tuple[tuple[PodView, str], ...] = ()
    settings: Settings = field(default_factory=Settings)
    short_since: Mapping[str, float] | None = None
    pods_seen_at: float | None = None
    report_since: float | None = None
    report_check_pending: bool = False
    placement: PoolPlacement | None = None
    now: float = 0.0
    now_text: str = ""
    jitter: float = 0.0
    monotonic: float = 0.0


#: A stage after the job's own checks: appends its actions, answers True when the pass ends there.
Stage = Callable[[JobView, Obj, Obj, list[Action]], bool]


# --- the decision -----------------------------------------------------------------------------------


def decide(view: JobView) -> Actions:
    """What to do about the job of ``view`` now, in order (the stages of the module docstring)."""
    job, unit, adapter = view.job, view.unit, view.adapter
    if job is None:
        return _job_gone(view)
    unqueued = _unqueued(view, job)
    if unqueued is not None:
        return unqueued
    # A job with its own unit stays managed until it finishes, even if it no longer looks
    # managed (its label or owners changed past the webhook): its unit keeps it held, or keeps
    # charging it and is reported finished (docs/architecture.md#trust-boundaries).
    if unit is not None:
        not_ours = _not_ours_yet(view, job, unit)
        if not_ours is not None:
            return not_ours
    status = ray.hold_while_cluster_lives(adapter.job_status(job), view.live_cluster)
    suspended, stamped = adapter.is_suspended(job), is_dequeued(job)
    if adoption.escaped_hold(status, suspended=suspended, stamped=stamped):
        return (HoldEscaped(),)  # the job's update brings us back
    if unit is None:
        return _create(view, job, status, suspended=suspended, stamped=stamped)
    adopted = adoption.completion_status(
        unit, status, suspended=suspended, stamped=stamped, now_text=view.now_text
    )
    if adopted is not None:
        return (WriteUnitStatus(adopted),)  # the unit's update brings us back
    return _own_unit(view, job, unit, status)


def _job_gone(view: JobView) -> Actions:
    """A unit left behind by a job deleted with --cascade=orphan is released once none of its pods
    runs (their events bring us back); any other unit of a deleted job still has its owner
    reference, and garbage collection deletes it. A pod the unit released counts whatever owner it
    has now (docs/compatibility.md#jobs-deleted-with---cascadeorphan)."""
    unit = view.unit
    if unit is not None and unitowners.orphaned(unit, view.key, None) and not view.orphan_pods_run:
        return (ForgetReport(), ReleaseOrphan(unit))
    return (ForgetReport(),)


def _unqueued(view: JobView, job: Obj) -> Actions | None:
    """A job that neither looks queued to its adapter nor owns its unit: nothing to do unless the
    controller manages it; a genuine child is accounted for by its parent's unit; an unlabelled one
    (mandatory queueing) gets its namespace's default quota. None: the job is queued."""
    owned = view.unit is not None and unitowners.owns(view.unit, view.key, job)
    if view.adapter.is_managed(job) or owned:
        return None
    if not view.managed or view.genuine_child:
        return ()
    if view.adapter.quota_name(job) is not None:
        return None
    return _default_quota(view, job)  # the label's watch event brings us back


def _default_quota(view: JobView, job: Obj) -> Actions:
    """An unlabelled job where queueing is mandatory: hold it if it runs past the webhook, then label
    it with its namespace's default quota, or say why it stays held."""
    adapter, namespace = view.adapter, view.key.namespace
    status = adapter.job_status(job)
    if status in FINISHED or (job.get("metadata") or {}).get("deletionTimestamp") is not None:
        return ()
    if adoption.escaped_hold(status, suspended=adapter.is_suspended(job), stamped=is_dequeued(job)):
        return (HoldEscaped(),)
    if view.default_quota is None:
        message = view.default_quota_message or names.no_default_quota_message(namespace)
        return (RecordEvent("job", "Warning", names.EventReason.NO_DEFAULT_QUOTA, message),)
    message = (
        f"queueing is mandatory in namespace {namespace}: the job had no quota label and is "
        f"queued on the namespace's default quota {view.default_quota}"
    )
    return (
        SetDefaultQuota(view.default_quota),
        RecordEvent("job", "Normal", names.EventReason.DEFAULT_QUOTA, message),
    )


def _not_ours_yet(view: JobView, job: Obj, unit: Obj) -> Actions | None:
    """The unit at the job's name that the job must not act on (yet); None when it may."""
    key = view.key
    patch = unitowners.disown_patch(unit, key, job)
    if patch is not None:
        return (Disown(patch),)  # orphaned by its job's deletion; the unit's update brings us back
    if unitowners.orphaned(unit, key, job):
        # A predecessor's unit: its deletion brings us back to create this job's own.
        return () if view.orphan_pods_run else (ReleaseOrphan(unit),)
    if unitowners.owned_by_another(unit, key, job):
        return ()  # a predecessor's unit, which garbage collection deletes: that brings us back
    if view.own_write_pending:
        return ()  # our own status write is not in the store yet; its watch event brings us back
    return None


def _create(view: JobView, job: Obj, status: JobStatus, *, suspended: bool, stamped: bool) -> Actions:
    """Create the job's unit; for a released job (docs/compatibility.md#adoption-of-released-jobs)
    marked for adoption, its status written right after on the created unit."""
    if status in FINISHED or (job.get("metadata") or {}).get("deletionTimestamp") is not None:
        return ()
    adopt = adoption.needs_adoption(status, suspended=suspended, stamped=stamped)
    settings, adapter = view.settings, view.adapter
    try:
        unit = jobext.build_queue_unit(
            job,
            adapter,
            settings.priority_classes,
            live_cluster=view.live_cluster,
            adopted=adopt,
            max_user_priority=settings.priority_cap,
            allowed_classes=settings.allowed_classes,
            default_class=settings.default_class,
            defaults=settings.pod_defaults,
        )
    except JobSpecError as err:
        return (RecordEvent("job", "Warning", "InvalidJob", f"cannot queue this {adapter.kind}: {err}"),)
    actions: list[Action] = [CreateUnit(unit), *_refused_class(view, job), *_raised(view, job, unit["spec"])]
    if adopt:
        key = view.key
        message = f"adopted {key.namespace}/{key.name}: its unit was missing while the job runs"
        # The job's own status, as the adoption was always finished on a created unit (a RayJob
        # held while its cluster lives only decides whether it is adopted).
        finish = FinishAdoption(adapter.job_status(job), suspended, stamped)
        actions += [Log("info", message), finish]
    return tuple(actions)


def _refused_class(view: JobView, job: Obj) -> Actions:
    """A Warning ``PriorityClassNotAllowed`` on a job naming a class its quota does not allow
    (docs/compatibility.md#priority-cap): its unit is queued as if it named none."""
    allowed = view.settings.allowed_classes
    refused = jobext.refused_priority_class(job, view.adapter, allowed)
    if refused is None or allowed is None:
        return ()
    message = jobext.refused_class_message(refused, view.adapter.quota_name(job) or "", allowed)
    return (RecordEvent("job", "Warning", "PriorityClassNotAllowed", message),)


def _raised(view: JobView, job: Obj, spec: Obj) -> Actions:
    """A Warning on a job whose preemption priority was raised to its priority
    (docs/compatibility.md#preemption-priority): the job's owner learns the value that counts."""
    message = jobext.raised_preemption_priority(job, spec, view.settings.priority_cap)
    if message is None:
        return ()
    return (RecordEvent("job", "Warning", names.PREEMPTION_PRIORITY_RAISED_REASON, message),)


def _own_unit(view: JobView, job: Obj, unit: Obj, status: JobStatus) -> Actions:
    """The job's own unit: the lifecycle stages (each before the resume: a job held by one of them
    whose unit write failed must be decided again, not released again), the resume, the pod plan."""
    actions: list[Action] = []
    if status not in FINISHED:  # a finished job's pod sets shrink to 0: nothing left to keep in step
        stages: tuple[Stage, ...] = (_keep_in_step, _budget_and_activation, _running_timeout, _stranded)
        for stage in stages:
            if stage(view, job, unit, actions):
                return tuple(actions)  # the unit's update brings us back
        if podplan.phase_of(unit) in podplan.ADMITTED_PHASES and view.adapter.is_suspended(job):
            resume = view.adapter.resume_patch(job, now_text=view.now_text)
            return (*actions, ResumeJob(resume))  # the job's update brings us back with fresh objects
    return (*actions, *_pod_plan(view, job, unit, status))


def _keep_in_step(view: JobView, job: Obj, unit: Obj, actions: list[Action]) -> bool:
    """Keep the unit's spec in step with the job, or queue the job again when its admitted pods
    changed size (docs/compatibility.md#admitted-pod-size)."""
    settings = view.settings

    def desired_for(admitted: Obj | None) -> Obj:
        return jobext.desired_spec(
            job,
            view.adapter,
            settings.priority_classes,
            live_cluster=view.live_cluster,
            max_user_priority=settings.priority_cap,
            allowed_classes=settings.allowed_classes,
            default_class=settings.default_class,
            defaults=settings.pod_defaults,
            admitted=admitted,
        )

    desired = None
    with contextlib.suppress(JobSpecError):
        desired = desired_for(unit if jobext.holds_admission(unit) else None)
    if desired is None:
        return False
    resized = jobext.admitted_resize(unit, desired)
    if resized:
        # Queued again, the unit is sized like a new one: with the namespace's fill-ins as they
        # are now, not those frozen at its admission (its next admission is decided on them).
        return _requeue_resized(view, job, unit, resized, desired_for(None), actions)
    drift = jobext.spec_drift(unit, desired)
    if drift is not None:
        # Conditional on the version seen: had the scheduler admitted the unit meanwhile (at its
        # old pod sets), following the job now would leave it admitted for less than it asks; the
        # 409 brings the next pass, which finds the admitted pod sets changed
        # (docs/compatibility.md#admitted-pod-size). The pass goes on after this write.
        actions.append(PatchUnit(drift))
        if "priorityClassName" in drift["spec"]:
            actions.extend(_refused_class(view, job))
        if "preemptionPriority" in drift["spec"]:
            actions.extend(_raised(view, job, desired))
    return False


def _requeue_resized(
    view: JobView, job: Obj, unit: Obj, pod_sets: tuple[str, ...], desired: Obj, actions: list[Action]
) -> bool:
    """Queue a job again whose admitted pods changed size (``jobext.admitted_resize``); ``desired`` is
    the unit spec the job asks for now.

    The webhook refuses such an edit from users, so this runs only where the door was bypassed.
    Three writes, in an order that never lets the job run at a size nobody admitted:

    1. the job is suspended (its controller deletes the pods made at either size);
    2. the unit's status: queued again, admissions cleared; this frees the quota, so it comes after
       the hold, as in a running-timeout backoff (:class:`HoldThenRelease`);
    3. the unit's pod sets follow the job, conditional on the version the second write made.

    The scheduler may admit the unit between 2 and 3 at its old size. Then the third write fails
    (its version is gone) and the next pass finds an admitted unit whose pod sets differ from the
    job again, and starts over from 2; had the third write been unconditional, the next pass would
    have seen an admitted unit in step with its job and released it at a size admitted for less.
    A failure after 1 likewise leaves the job held and the change found again (this stage runs
    before the resume).
    """
    patch = lifecycle.requeue_resized(unit, pod_sets, now=view.now, now_text=view.now_text)
    if patch is None:
        return False
    key = view.key
    message = (
        f"the resource requests of pod set(s) {', '.join(pod_sets)} changed after the job was admitted; "
        "it is suspended and queued again at its new size"
    )
    actions += [
        HoldThenRelease(patch),
        Log("warning", f"{view.adapter.kind} {key.namespace}/{key.name}: {message}"),
        RecordEvent("job", "Warning", names.EventReason.ADMITTED_JOB_RESIZED, message),
    ]
    drift = jobext.spec_drift({**unit, "status": {**(unit.get("status") or {}), **patch["status"]}}, desired)
    if drift is not None:
        actions.append(PatchUnit(drift, version="last"))
    return True


def _budget_and_activation(view: JobView, job: Obj, unit: Obj, actions: list[Action]) -> bool:
    """Execution budget and deactivation (docs/compatibility.md#activation-and-execution-budget).

    A used-up budget writes the spec first: once ``spec.active`` is false the unit is parked by the
    deactivation whatever happens next, so a failed second write can never leave the job running
    with its budget clock stopped (the other order could). The status write then follows the
    version the spec write made. A deactivated unit's job is held before its quota is given back
    (:class:`HoldThenRelease`)."""
    budget = lifecycle.execution_budget(unit, now=view.now, now_text=view.now_text)
    if budget.spec_patch is not None and budget.status_patch is not None:
        seconds = (unit.get("spec") or {}).get("maximumExecutionTimeSeconds")
        actions += [
            PatchUnit(budget.spec_patch, version="none"),
            WriteUnitStatus(budget.status_patch, version="last"),
            RecordEvent(
                "job",
                "Warning",
                names.EventReason.MAX_EXEC_TIME_EXCEEDED,
                f"The maximum execution time ({seconds}s) was exceeded",
            ),
        ]
        return True
    if budget.remaining is not None:
        actions.append(Recheck(budget.remaining))
    parked = lifecycle.deactivation(unit, now=view.now, now_text=view.now_text)
    if parked is None:
        return False
    message = "Job is suspended and its resources are reclaimed because the queue unit is deactivated"
    actions += [HoldThenRelease(parked), RecordEvent("job", "Normal", names.EventReason.DEACTIVATED, message)]
    return True


def _running_timeout(view: JobView, job: Obj, unit: Obj, actions: list[Action]) -> bool:
    """Running timeout, backoff and partial running timeout (docs/compatibility.md#running-timeout),
    decided by ``shared.jobs.running_timeout`` when one is set for the job's kind.

    Order of the two writes of a backoff (:class:`HoldThenRelease`): the job is suspended first, the
    unit's status (TimeoutBackoff, admissions cleared) second. The status write is what frees the
    quota, so the quota is never handed to another job while this one can still start pods. If the
    second write fails, the unit still holds its quota with its job held; the next pass (this stage
    runs before the resume) decides the same timeout again and only writes the status. The other
    order would free the quota of a still-released job whenever the suspension failed, and its pods
    could then be bound uncharged. A partial shrink holds nothing (``decision.suspend`` is false).
    """
    timeouts = view.settings.timeouts
    if not timeouts.enabled:
        return False
    decision = running_timeout.decide(
        unit,
        list(view.pods),
        timeouts,
        now=view.now,
        now_text=view.now_text,
        jitter=view.jitter,
        short_since=view.short_since,
    )
    actions += [
        RememberShortSince(decision.short_since or None),
        ScheduleCheck("timeout", decision.recheck_in),
    ]
    if decision.status_patch is None:
        return False
    reason, message = decision.event_reason, decision.event_message
    actions += [
        HoldThenRelease(decision.status_patch, hold=decision.suspend),
        Log("info", f"{reason} {view.unit_key}: {message}"),
        RecordEvent("unit", "Warning", reason, message),
        RecordEvent("job", "Warning", reason, message),
    ]
    return True


def _stranded(view: JobView, job: Obj, unit: Obj, actions: list[Action]) -> bool:
    """Take the admission back from a job left without pods (docs/compatibility.md#jobs-without-pods),
    decided by ``shared.jobs.stranded`` on every pod of the job (``view.job_pods``: those its
    controller owns as well as those counted for the unit).

    The writes are the running timeout's, in its order (:class:`HoldThenRelease`: the job suspended
    first, the unit's status second, the pods read again after the suspension). If the status write
    fails, the next pass (this stage runs before the resume) decides the same again and writes only
    the status; once it is written, the controller waits for its watch event (``own_write_pending``)
    before any stage acts on the unit again, so a held job is never resumed on a view of its unit
    from before the requeue. The full chaos run of 2026-12-04 saw exactly that race before the
    status write was remembered (RELIABILITY.md)."""
    timeouts, extension = view.settings.timeouts, view.adapter.extension
    if timeouts.no_pods_timeout <= 0 or extension not in stranded.KINDS:
        return False
    decision = stranded.decide(
        unit,
        list(view.job_pods),
        timeouts,
        extension=extension,
        now=view.now,
        now_text=view.now_text,
        jitter=view.jitter,
        pods_seen_at=view.pods_seen_at,
    )
    actions += [RememberPodsSeenAt(decision.pods_seen_at), ScheduleCheck("no_pods", decision.recheck_in)]
    if decision.status_patch is None:
        return False
    reason, message = decision.event_reason, decision.event_message
    actions += [
        HoldThenRelease(decision.status_patch, pods="job"),
        CountRequeuedWithoutPods(),
        Log("warning", f"{reason} {view.unit_key}: {message}"),
        RecordEvent("unit", "Warning", reason, message),
        RecordEvent("job", "Warning", reason, message),
    ]
    return True


def _pod_plan(view: JobView, job: Obj, unit: Obj, status: JobStatus) -> Actions:
    """The unit's pods (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones): delete
    what the plan reclaims or what escaped, write a reclaim's status (the pass ends: the unit's
    update brings us back), else report problems, ungate, and report the pods into the unit's
    status, coalesced while that may wait (docs/compatibility.md#coalesced-pod-reports)."""
    plan = podplan.plan_pods(unit, list(view.pods), now_text=view.now_text)
    plan.escaped = list(view.escaped)
    if podplan.phase_of(unit) in podplan.ADMITTED_PHASES:
        plan.withheld.extend(view.withheld)
    actions: list[Action] = []
    if plan.delete or plan.escaped or plan.unadmitted:
        actions.append(DeletePods(plan))
    if plan.status is not None:
        # No event here: the scheduler records Reclaimed when it sees the reclaim done and
        # replicas taken back (shared.core.scheduling.reclaim_took_back), for bare units too.
        return (*actions, WriteUnitStatus(plan.status, remember=True))
    if plan.withheld or plan.waiting or plan.beyond:
        actions.append(ReportPodProblems(plan))
    if plan.ungate:
        actions += _ungate(view, unit, tuple(plan.ungate))
    kind = (view.adapter.api_version, view.adapter.kind)
    if kind in RUNNING_ONCE_BOUND and status == JobStatus.RUNNING and not any(p.bound for p in view.pods):
        status = JobStatus.PENDING  # active pods that are all gated or unbound are not running
    patch = podplan.report(unit, list(view.pods), status, now_text=view.now_text)
    if patch is not None and podplan.can_wait(unit, patch):
        since = view.report_since if view.report_since is not None else view.monotonic
        left = since + podplan.COALESCE_SECONDS - view.monotonic
        if left > 0:  # a re-check writes it, unless a write that matters took it along first
            actions.append(RememberReportSince(since))
            if not view.report_check_pending:
                actions.append(ScheduleCheck("report", left))
            return tuple(actions)
    actions.append(ForgetReport())
    if patch is not None:
        actions.append(WriteUnitStatus(patch, remember=True))
    return tuple(actions)


def _ungate(view: JobView, unit: Obj, pods: tuple[PodView, ...]) -> Actions:
    """Release ``pods`` with the placement of the pool the unit was admitted to
    (docs/pools.md#placement). A pool named by the unit but unknown to the controller, or one whose
    selector cannot be read, releases nothing: a pod released without its pool's placement could
    run anywhere, and the apiserver keeps its placement once the gate is gone. The pool's arrival
    (``JobExtensions.pools_changed``) brings the job back."""
    pool = (unit.get("status") or {}).get("pool")
    if not isinstance(pool, str) or not pool:
        return (Ungate(pods),)
    placement = view.placement
    if placement is not None and placement.name == pool and placement.problem is None:
        return (Ungate(pods, placement),)
    why = (
        "is not known"
        if placement is None or placement.name != pool
        else f"cannot place pods: {placement.problem}"
    )
    message = f"{len(pods)} pod(s) stay gated: the unit was admitted to pool {pool}, which {why}"
    return (
        Log("warning", f"{view.unit_key}: {message}"),
        RecordEvent("job", "Warning", POOL_UNKNOWN, message),
    )

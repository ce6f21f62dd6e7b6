"""The actions of the job path (docs/architecture.md#the-job-path-view-decide-act): what the pure
decision (``shared.jobs.jobpath.decide``) answers, in order, and the executor
(``reconciler.job_actions``) performs, one small function per kind.

Most actions are one write or one piece of memory. A few need the API's answer mid-way, and say in
their docstring what the executor re-checks and why: :class:`HoldThenRelease` reads the pods again
after suspending the job, :class:`DeletePods` ends the pass when a pod changed since the plan,
:class:`CreateUnit`, :class:`SetDefaultQuota` end it when their write did not take, and
:class:`FinishAdoption` decides on the unit the API created. An action that ends the pass leaves
the rest of the tuple undone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.jobs.base import JobStatus
from koord_queue.shared.jobs.podplan import PodPlan, PodView

Obj = dict[str, Any]
#: The version a unit write is conditional on: none, the unit's in the view, or the one our last
#: write of the unit in this pass made (the view's when there was none).
Version = Literal["none", "seen", "last"]


@dataclass(frozen=True, slots=True)
class RecordEvent:
    """An event on the job (``on="job"``) or on its unit."""

    on: Literal["job", "unit"]
    type_: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Log:
    level: Literal["info", "warning"]
    message: str


@dataclass(frozen=True, slots=True)
class ForgetReport:
    """The job's pod-count report was written, is not needed, or the job is gone."""


@dataclass(frozen=True, slots=True)
class ReleaseOrphan:
    """Delete a unit left behind by a job deleted with ``--cascade=orphan``, none of whose pods runs
    (``reconciler.job_units.release_orphan``; conditional on its UID and version)."""

    unit: Obj


@dataclass(frozen=True, slots=True)
class Disown:
    """Drop the job's owner reference from its unit (``unitowners.disown_patch``)."""

    patch: Obj


@dataclass(frozen=True, slots=True)
class HoldEscaped:
    """Suspend a job that runs without admission, conditional on the job's version
    (``reconciler.job_lifecycle.hold_escaped``)."""


@dataclass(frozen=True, slots=True)
class SetDefaultQuota:
    """Label an unlabelled job with its namespace's default quota, conditional on the job's
    version; the pass ends when the job is gone or changed meanwhile (its event brings it back)."""

    quota: str


@dataclass(frozen=True, slots=True)
class CreateUnit:
    """Create the job's unit. The pass ends when it was not created (AlreadyExists: the store
    lagged; Invalid: told on the job); later actions may use the created unit (its version)."""

    unit: Obj


@dataclass(frozen=True, slots=True)
class FinishAdoption:
    """Write the status of the unit this pass created for adoption (``shared.jobs.adoption``),
    conditional on the created unit's version: decided on the API's answer, which the view cannot
    hold."""

    status: JobStatus
    suspended: bool
    stamped: bool


@dataclass(frozen=True, slots=True)
class PatchUnit:
    """A merge patch of the unit (its spec or metadata), conditional on ``version``."""

    patch: Obj
    version: Version = "seen"


@dataclass(frozen=True, slots=True)
class WriteUnitStatus:
    """A merge patch of the unit's status, conditional on ``version``; ``remember`` keeps its answer
    in the controller's ``kube.OwnWrites`` so that no later pass acts on the copy from before it."""

    patch: Obj
    version: Version = "seen"
    remember: bool = False


@dataclass(frozen=True, slots=True)
class HoldThenRelease:
    """Suspend the job (unless ``hold`` is false), then write ``status_patch``, which frees the
    quota, only once none of its pods runs (``reconciler.job_lifecycle.hold_then_release``).

    The executor reads the pods again after the suspension (``pods``: the unit's, or every pod of
    the job for the jobs-without-pods clock): the suspension takes time to act, and a pod the view
    did not hold may have appeared meanwhile. While one still runs the pass ends (its deletion
    brings the job back); the status write is remembered (``kube.OwnWrites``).
    """

    status_patch: Obj
    hold: bool = True
    pods: Literal["unit", "job"] = "unit"


@dataclass(frozen=True, slots=True)
class Recheck:
    """Look at the job again in ``delay`` seconds (a little after, so the deadline has passed)."""

    delay: float


@dataclass(frozen=True, slots=True)
class ScheduleCheck:
    """Replace the job's pending re-check of ``timer`` with one in ``delay`` seconds, or none."""

    timer: Literal["timeout", "no_pods", "report"]
    delay: float | None


@dataclass(frozen=True, slots=True)
class RememberShortSince:
    """The running timeout's first sightings of shortfalls for the unit (None: forget them)."""

    short_since: Mapping[str, float] | None


@dataclass(frozen=True, slots=True)
class RememberPodsSeenAt:
    """The jobs-without-pods clock's start for the unit (None: forget it)."""

    at: float | None


@dataclass(frozen=True, slots=True)
class RememberReportSince:
    """Since when the job's pod-count report waits (docs/compatibility.md#coalesced-pod-reports)."""

    since: float


@dataclass(frozen=True, slots=True)
class CountRequeuedWithoutPods:
    """Raise the counter of jobs queued again for having no pods."""


@dataclass(frozen=True, slots=True)
class ResumeJob:
    patch: Obj


@dataclass(frozen=True, slots=True)
class DeletePods:
    """Delete the plan's pods: a reclaim's, the escaped and the unadmitted ones, each conditional on
    what was seen (``reconciler.job_pods.delete_planned``). When one could not be deleted but is
    still in the store it changed since the plan was made: the pass ends, and the job is planned
    again shortly from fresh state (no reclaim status is written on a stale plan)."""

    plan: PodPlan


@dataclass(frozen=True, slots=True)
class ReportPodProblems:
    """Events for the pods the plan keeps gated or that wait, and for bound pods beyond the
    admission (``reconciler.job_pods.report_withheld``, ``report_beyond``)."""

    plan: PodPlan


@dataclass(frozen=True, slots=True)
class Ungate:
    """Remove the admission gate of ``pods``, after making sure a native gang's Workload exists.

    ``placement`` is the pool the unit was admitted to (docs/pools.md#placement): its node selector
    and tolerations go into each pod in the same write that removes the gate; a pod that
    contradicts it stays gated, told on the job (``reconciler.job_pods.ungate``)."""

    pods: tuple[PodView, ...]
    placement: PoolPlacement | None = None


Action = (
    RecordEvent
    | Log
    | ForgetReport
    | ReleaseOrphan
    | Disown
    | HoldEscaped
    | SetDefaultQuota
    | CreateUnit
    | FinishAdoption
    | PatchUnit
    | WriteUnitStatus
    | HoldThenRelease
    | Recheck
    | ScheduleCheck
    | RememberShortSince
    | RememberPodsSeenAt
    | RememberReportSince
    | CountRequeuedWithoutPods
    | ResumeJob
    | DeletePods
    | ReportPodProblems
    | Ungate
)
Actions = tuple[Action, ...]

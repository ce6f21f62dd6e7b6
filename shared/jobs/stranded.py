"""Admitted jobs left without pods (docs/compatibility.md#jobs-without-pods).

The queue trusts a job's own controller to create its pods once the job is admitted and resumed,
and to replace the ones a reclaim deletes. When that controller misses the job (the Job controller
can lose track of a Job across an apiserver restart and never sync it again), the unit stays
admitted with no pod at all: it holds its quota and, under ``koord-queue/wait-for-pods-running``,
its whole queue, for ever. This module decides when such a job is stranded; the reconciler then
takes the admission back exactly as a running timeout does (``shared.jobs.running_timeout``,
``reconciler.job_lifecycle.hold_then_release``): the job is suspended, the unit goes to
``TimeoutBackoff`` with its admissions cleared, which frees the quota, and its next admission
resumes the job, which makes its controller sync it and create its pods.

Stranded means, all at once: the job's kind is one whose controller creates every pod as soon as
the job is resumed (:data:`KINDS`); the unit is admitted and released (``Dequeued`` or ``Running``,
active, no reclaim under way, some replicas admitted); and no pod of the unit, in any state
(gated, running, terminating or finished), has been seen for ``noPodsTimeout``, counted from the
later of the admission and the last time a pod was seen. Any pod present counts,
so a Job in its pod-failure backoff (failed pods kept) is never taken for stranded. "Of the job"
means every pod its controller owns, whether or not it names the unit or is gated, and one being
deleted too (the caller collects them): a Job whose pods are being replaced, say one that let go
of a relabelled pod and whose replacement is not in the caller's view yet, is not podless.

The caller keeps the clock's start in memory between calls, as the running timeout keeps its
shortfalls. With no memory of the unit (a restarted reconciler, a new leader), the clock starts
at this first look, not at the admission: counted from an admission minutes old, the first look of
a fresh process would requeue at once any job caught between losing a pod and seeing its
replacement (the full chaos run of 2026-12-04 did exactly that, RELIABILITY.md). So a restart only
ever delays a requeue, by at most ``noPodsTimeout``.

Whether the job is suspended is deliberately not asked. Once this module has decided, the job is
suspended before the unit's status is written; the pass that the suspension brings may still see
the unit admitted (its status write not yet delivered, or failed), and must decide the same again,
not leave the held job to the resume step. A job still suspended past the bound with its unit
admitted is stranded too: its resume did not take.

Which kinds: only the batch/v1 Job. Operators of the other kinds (Kubeflow, JobSet, Ray, Spark,
Argo) create pods through intermediate objects, a driver or a workflow step, and may legitimately
have no pod for longer than any bound that would help a Job; their pods that never run are the
running timeout's to handle.

Pure: no I/O and no clock; ``now`` and the jitter of the doubling backoff are parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.api.durations import format_duration
from koord_queue.shared.jobs import podplan, running_timeout

__all__ = ["KINDS", "Decision", "decide"]

Obj = dict[str, Any]

#: The job extensions (``registry.EXTENSIONS``) whose jobs are watched for missing pods.
KINDS: Final = frozenset({"job"})


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one unit now.

    ``status_patch`` is a merge patch of the unit's status (``{"status": {...}}``) or None;
    ``suspend`` asks the caller to hold the job before writing it. ``recheck_in`` is when the
    pending timeout falls due (seconds); ``pods_seen_at`` is the clock start to keep for the next call
    (None: forget it). ``event_reason``/``event_message`` describe a requeue for the Warning event.
    """

    status_patch: Obj | None = None
    suspend: bool = False
    recheck_in: float | None = None
    pods_seen_at: float | None = None
    event_reason: str = ""
    event_message: str = ""


def decide(
    unit: Obj,
    pods: Sequence[podplan.PodView],
    timeouts: running_timeout.RunningTimeout,
    *,
    extension: str,
    now: float,
    now_text: str,
    jitter: float,
    pods_seen_at: float | None = None,
) -> Decision:
    """Whether the unit's job is stranded without pods (see the module docstring).

    ``pods`` are all the job's pods (``podplan.pod_view``), whatever their state: those its
    controller owns as well as those counted for the unit; ``pods_seen_at`` is what the previous
    call returned for this unit (None: this process has not looked at it yet).
    """
    limit = timeouts.no_pods_timeout
    if limit <= 0 or extension not in KINDS:
        return Decision()
    spec = unit.get("spec") or {}
    phase = (unit.get("status") or {}).get("phase") or ""
    if phase not in running_timeout.TIMED_PHASES or spec.get("active") is False:
        return Decision()  # not released, or parked by deactivation: no pod is expected
    admissions = podplan.admissions_of(unit)
    if any(a.reclaim is not None for a in admissions):
        return Decision()  # a reclaim deletes pods on purpose: look again once it is done
    if not any(a.replicas > 0 for a in admissions):
        return Decision()
    if pods:
        return Decision(pods_seen_at=now)
    admitted = running_timeout.admitted_at(unit)
    if admitted is None:
        return Decision()
    start = now if pods_seen_at is None else pods_seen_at  # no memory: this is the first look
    since = max(admitted, start)
    if now < since + limit:
        return Decision(recheck_in=since + limit - now, pods_seen_at=start)
    patch, requeue = running_timeout.backoff_patch(
        unit,
        message=names.Message.BACKOFF_NO_PODS,
        backoff_timeout=timeouts.backoff_timeout,
        now=now,
        now_text=now_text,
        jitter=jitter,
    )
    return Decision(
        status_patch=patch,
        suspend=True,
        event_reason=names.NO_PODS_AFTER_ADMISSION_REASON,
        event_message=names.no_pods_message(format_duration(limit), format_duration(round(requeue.delay))),
    )

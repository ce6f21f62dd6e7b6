"""Adoption: a released job whose QueueUnit is gone gets its unit back, admitted
(docs/compatibility.md#adoption-of-released-jobs).

A job that is no longer queuing was admitted once and runs (or is about to) on quota it was
granted. If its QueueUnit is deleted, a fresh unit would queue it again as a new job while it keeps
running uncharged, so upstream re-creates the unit as ``Dequeued`` (message ``"Deuqueued"``, sic)
with the job's pod sets admitted: the quota stays charged.

A create cannot set ``status`` (the QueueUnit has a status subresource), so adoption is two writes:
the unit is created carrying :data:`ADOPTED_ANNOTATION`, then its status is written. Between the
two, a unit without a phase looks like a new job to the scheduler, which could admit it a second
time or park it with a waiting message. :func:`awaiting_status` is how the scheduler recognises
such a unit and leaves it alone; the job extension finishes the adoption with
:func:`completion_status` whenever it meets one, so a restart between the two writes converges.
The annotation stays on the unit as a record; once the unit has a phase it means nothing.

A marked unit is *ignored*, never charged, by the scheduler: anyone who may create QueueUnits can
set an annotation, and charging an unadmitted unit would let them hold quota shared with others.

Pure: plain JSON in, plain JSON out; ``now_text`` is a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from koord_queue.shared.api import conditions
from koord_queue.shared.api.names import Message, Phase
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.api.predicates import expected_pod_sets
from koord_queue.shared.jobs.base import JobStatus, annotations_of, dig

Obj = dict[str, Any]

#: Set on a unit created for a job that was already released; see the module docstring.
ADOPTED_ANNOTATION: Final = "koord-queue/adopted"

#: Job states that mean "admitted once and released": the unit comes back admitted.
RELEASED: Final = frozenset({JobStatus.PENDING, JobStatus.RUNNING})


def needs_adoption(job_status: JobStatus, *, suspended: bool, stamped: bool) -> bool:
    """A job in this state whose unit is missing gets an admitted unit, not a queued one.

    Created and Queuing jobs are queued as new; finished jobs get no unit at all (step 4). A held
    (suspended) job is queued too, whatever its status says: a preempted Job still counts its
    terminating pods as active, and adopting it then would resume it past the queue. So is a job
    without the reconciler's dequeue stamp (``stamped``): only the reconciler sets the stamp when
    it admits a job (the webhook removes it on CREATE and forbids anyone else to change it), so a
    running job without it never waited in the queue, and adopting it would grant it quota
    unchecked (docs/architecture.md#trust-boundaries). It is held and queued instead
    (:func:`escaped_hold`).
    """
    return job_status in RELEASED and not suspended and stamped


def escaped_hold(job_status: JobStatus, *, suspended: bool, stamped: bool) -> bool:
    """A managed, unfinished job runs without ever having been admitted: hold it again.

    The reconciler releases a job and stamps it in one write, and holds it and removes the stamp in
    one write, so a released job without the stamp was released by someone else: created before
    the webhook was installed, labelled after it started, or let through while the webhook was
    bypassed. It is suspended and then queued like a new job.
    """
    return not suspended and not stamped and job_status not in (JobStatus.SUCCEEDED, JobStatus.FAILED)


def awaiting_status(unit: Mapping[str, Any]) -> bool:
    """The unit was created for adoption and its status has not been written yet.

    The scheduler must neither admit nor park such a unit: the job extension writes its status.
    """
    return annotations_of(unit).get(ADOPTED_ANNOTATION) is not None and not dig(unit, "status", "phase")


def completion_status(
    unit: Mapping[str, Any], job_status: JobStatus, *, suspended: bool, stamped: bool, now_text: str
) -> Obj | None:
    """The status patch that finishes the adoption of ``unit`` (see :func:`awaiting_status`).

    A released job (:func:`needs_adoption`) gets every pod set of the unit admitted in full
    (``replicas = count``), phase ``Dequeued`` and the upstream message; its pods are counted by
    the job extension's report as usual. A job that went back to the queue meanwhile (suspended
    again) gets ``Enqueued`` and competes like any other. A finished job needs nothing here: the
    report moves the unit to Succeed or Failed. None when nothing is to be written.
    """
    if not awaiting_status(unit):
        return None
    if job_status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        return None
    existing = dig(unit, "status", "conditions")
    current = [c for c in existing if isinstance(c, Mapping)] if isinstance(existing, list) else []
    if not needs_adoption(job_status, suspended=suspended, stamped=stamped):
        conds, _ = conditions.sync_conditions(
            current, phase=Phase.ENQUEUED, message=Message.ENQUEUED, now=now_text
        )
        return {
            "status": {
                "phase": Phase.ENQUEUED.value,
                "message": Message.ENQUEUED,
                "lastUpdateTime": now_text,
                "conditions": conds,
            }
        }
    conds, _ = conditions.sync_conditions(
        current, phase=Phase.DEQUEUED, message=Message.ADOPTED, now=now_text
    )
    return {
        "status": {
            "phase": Phase.DEQUEUED.value,
            "message": Message.ADOPTED,
            "admissions": _full_admissions(unit),
            "lastAllocateTime": now_text,
            "lastUpdateTime": now_text,
            "conditions": conds,
        }
    }


def _full_admissions(unit: Mapping[str, Any]) -> list[Obj]:
    """One admission per pod set, for its whole count, nothing running yet.

    The pod sets are read exactly as the scheduler reads them (``expected_pod_sets`` of the parsed
    unit), so the adopted unit is satisfied in its eyes and never competes for more.
    """
    return [
        {"name": ps.name, "replicas": ps.count, "running": 0} for ps in expected_pod_sets(parse_unit(unit))
    ]

"""Events on the job itself, so that ``kubectl describe job`` tells the queue's story
(docs/compatibility.md#events): ``Queued`` (its quota and its place when it first had to wait),
``Admitted`` (after it waited, for kinds whose controller does not say so itself) and
``Preempted`` (when it gives quota back).

The QueueUnit says whose it is: its owner reference carries the job's apiVersion, kind, name and
UID, so an event is recorded without reading the job. Units without a job (a QueueUnit created
directly, decision 8) get none.

What they cost (BENCHMARKS.md, writes per job): nothing on the fast path. A job admitted in the
first cycle that sees it gets no job event at all: the API already shows it on the job (the
``koord-queue/job-dequeue-timestamp`` annotation of the resume patch, and the Job controller's own
``Resumed`` event), so the admission path stays at 4 writes. A job that waits gets one ``Queued``
(once per unit: only when the unit leaves the empty phase), next to the status write and the
``FailedScheduling`` event its wait already costs, and one ``Admitted`` unless its kind's controller
announces the resume itself (``batch/v1`` Jobs: ``Resumed``); a victim gets one ``Preempted`` per
reclaim. They go through the same recorder as the unit's events (folded when repeated) and yield
to them: while a writer's queue is half full they are skipped (``EventRecorder.skipped_optional``),
so a burst never delays a unit's own events or grows the queue with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared.api.names import EventReason

Obj = dict[str, Any]


def job_ref(unit: Mapping[str, Any]) -> Obj | None:
    """The job of ``unit`` as an event's involved object (apiVersion, kind, metadata), from the
    owner reference matching its ``spec.consumerRef``; None for a unit without a job."""
    meta = unit.get("metadata") or {}
    consumer = (unit.get("spec") or {}).get("consumerRef") or {}
    kind = consumer.get("kind")
    for owner in meta.get("ownerReferences") or []:
        if not isinstance(owner, Mapping) or not owner.get("uid"):
            continue
        if kind and owner.get("kind") != kind:
            continue
        return {
            "apiVersion": str(owner.get("apiVersion", "")),
            "kind": str(owner.get("kind", "")),
            "metadata": {
                "name": str(owner.get("name", "")),
                "namespace": str(meta.get("namespace", "")),
                "uid": str(owner["uid"]),
            },
        }
    return None


def queued_message(quota: str, place: tuple[int, int] | None, reason: str) -> str:
    where = f" at position {place[0]} of {place[1]}" if place is not None else ""
    return f"queued in quota {quota}{where}: {reason}"


def admitted_message(quota: str, waited_s: float | None) -> str:
    waited = f" after waiting {round(waited_s)}s" if waited_s is not None and waited_s >= 0 else ""
    return f"admitted in quota {quota}{waited}; the job is released"


def preempted_message(quota: str, replicas: int, preemptor: str) -> str:
    return (
        f"preempted in quota {quota}: {replicas} replica(s) are reclaimed (unbound pods only) so that "
        f"higher-priority {preemptor} can be admitted; the job waits for its next admission"
    )


#: Kinds whose own controller records an event when the reconciler resumes the job (the Job
#: controller's ``Resumed``, "Job resumed"): ``Admitted`` would say it a second time, for one more
#: write per job that waited (docs/compatibility.md#events).
_RESUME_ANNOUNCED: Final = frozenset({("batch/v1", "Job")})


def record_admitted(
    recorder: EventRecorder, unit: Mapping[str, Any], quota: str, waited_s: float | None
) -> bool:
    """``Admitted`` on the job of a unit that waited, unless its controller announces the resume."""
    consumer = (unit.get("spec") or {}).get("consumerRef") or {}
    if (consumer.get("apiVersion"), consumer.get("kind")) in _RESUME_ANNOUNCED:
        return False
    return record(recorder, unit, EventReason.ADMITTED, admitted_message(quota, waited_s))


def record(recorder: EventRecorder, unit: Mapping[str, Any], reason: EventReason, message: str) -> bool:
    """Record a Normal event on the job of ``unit``; False when it has none or the recorder is busy."""
    job = job_ref(unit)
    if job is None:
        return False
    return recorder.record_optional(job, type_="Normal", reason=reason, message=message)


__all__ = ["admitted_message", "job_ref", "preempted_message", "queued_message", "record", "record_admitted"]

"""Phase predicates of upstream ``pkg/utils/util.go``, copied exactly
(docs/compatibility.md#phase-predicates).

Every component asks the same questions about a QueueUnit: does it still hold quota, has it got
all it asked for, are its pods running, is it out of the queue? Upstream answers them in one file
and the answers drive the scheduler, the quota cache and the job extensions alike; a re-implementation
that answers any of them differently drifts from upstream in ways that only show under load. So
these functions are deliberately literal, including their quirks (``dequeued`` is true for a unit
with no pod sets once "satisfied"; ``reserved_any_resource`` counts ``admissions[i].resources``).

Pure: reads only the parsed :class:`shared.api.model.Unit`.
"""

from __future__ import annotations

from koord_queue.shared.api import names
from koord_queue.shared.api.model import PodSet, Unit
from koord_queue.shared.api.names import Phase

__all__ = [
    "TERMINAL_PHASES",
    "all_running",
    "assigned",
    "dequeued",
    "expected_pod_sets",
    "has_reclaim",
    "pods_schedule_finished",
    "reserved_any_resource",
    "reserved_not_run",
    "satisfied",
    "v1_dequeued",
]

TERMINAL_PHASES = frozenset({Phase.SUCCEED, Phase.FAILED})
_V1_DEQUEUED = frozenset(
    {Phase.DEQUEUED, Phase.RESERVED, Phase.RUNNING, Phase.SCHED_READY, Phase.SCHED_SUCCEED}
)
_ASSIGNED = frozenset({Phase.RUNNING, Phase.DEQUEUED, Phase.RESERVED, Phase.SCHED_READY})
_SCHEDULE_FINISHED = frozenset(
    {
        Phase.SCHED_FAILED,
        Phase.SCHED_SUCCEED,
        Phase.ENQUEUED,
        "",
        Phase.RUNNING,
        Phase.SUCCEED,
        Phase.FAILED,
        Phase.DEQUEUED,
        Phase.PREEMPTED,
    }
)


def expected_pod_sets(unit: Unit) -> tuple[PodSet, ...]:
    """``spec.podSet``, or the pseudo pod set ``koord-queue/default-requirement`` (1 replica of
    ``spec.request``) for a unit with a request but no pod sets."""
    if unit.pod_sets:
        return unit.pod_sets
    if unit.request:
        return (PodSet(name=names.DEFAULT_REQUIREMENT_PODSET, count=1, min_count=None, per_pod=unit.request),)
    return ()


def reserved_any_resource(unit: Unit) -> bool:
    """``IsQueueUnitReservedAnyResource``: an admission with effective replicas > 0 (replicas minus
    ``reclaimState.replicas`` when set), or any ``admissions[i].resources`` entry > 0."""
    for adm in unit.admissions:
        effective = adm.replicas - adm.reclaim_replicas if adm.reclaim_replicas is not None else adm.replicas
        if effective > 0:
            return True
        if any(value > 0 for value in adm.resources.values()):
            return True
    return False


def satisfied(unit: Unit) -> bool:
    """``IsQueueUnitSatisfied``: every expected pod set has admitted replicas >= its count."""
    if not unit.admissions:
        return all(ps.count <= 0 for ps in expected_pod_sets(unit))
    admitted = {adm.name: adm.replicas for adm in unit.admissions}
    return all(admitted.get(ps.name, 0) >= ps.count for ps in expected_pod_sets(unit))


def all_running(unit: Unit) -> bool:
    """``IsQueueUnitAllRunning``: at least one admission, and ``running >= replicas`` for all."""
    return bool(unit.admissions) and all(adm.running >= adm.replicas for adm in unit.admissions)


def v1_dequeued(unit: Unit) -> bool:
    """``IsV1VersionDequeued``: no admissions but a phase that means "out of the queue"."""
    return not unit.admissions and unit.phase in _V1_DEQUEUED


def dequeued(unit: Unit) -> bool:
    """``IsQueueUnitDequeued``, "out of the queue"."""
    if v1_dequeued(unit) or unit.phase in TERMINAL_PHASES:
        return True
    if not satisfied(unit):
        return False
    return all_running(unit) or not unit.pod_sets


def reserved_not_run(unit: Unit) -> bool:
    """``IsQueueUnitReservedNotRun``: admissions exist and not all of them are running."""
    return bool(unit.admissions) and not all_running(unit)


def assigned(unit: Unit) -> bool:
    """``IsQueueUnitAssigned``: admissions exist, or a phase that implies an admission."""
    return bool(unit.admissions) or unit.phase in _ASSIGNED


def pods_schedule_finished(unit: Unit) -> bool:
    """``IsQueueUnitPodsScheduleFinished``."""
    return unit.phase in _SCHEDULE_FINISHED


def has_reclaim(unit: Unit) -> bool:
    """Some admission carries a ``reclaimState``: a reclaim was requested and is not settled yet."""
    return any(adm.reclaim_replicas is not None for adm in unit.admissions)

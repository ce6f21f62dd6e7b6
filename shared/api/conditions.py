"""QueueUnit conditions and the structured requeue backoff (docs/compatibility.md#conditions,
docs/compatibility.md#attempts-and-backoff).

Phases are the compatible API, but tools built on Kueue habits read ``status.conditions``
(``QuotaReserved``, ``Admitted``, ``PodsReady``, ``Finished``, ``Evicted``). Upstream derives them
from the phase in ``SyncQueueUnitConditions``; :func:`sync_conditions` does the same from the same
table, and like upstream's ``setCondition`` moves ``lastTransitionTime`` only when a condition's
status flips, so a watcher can tell "when did this become true" from "when was it last written".

The requeue backoff (``status.requeueState``) doubles from a 10 s base per consecutive backoff,
capped at 15 minutes, with +-10% jitter; the jitter comes from an injected value in [0, 1) so the
function stays pure and testable. Pure: standard library only; ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koord_queue.shared.api.durations import format_time
from koord_queue.shared.api.names import ConditionType, Phase

__all__ = [
    "MAX_REQUEUE_DELAY",
    "Conditions",
    "RequeueState",
    "evicted",
    "next_requeue_state",
    "set_condition",
    "sync_conditions",
]

Conditions = list[dict[str, object]]
MAX_REQUEUE_DELAY = 15 * 60.0
DEFAULT_REQUEUE_BASE = 10.0

_PENDING = "Pending"
_BACKOFF = "BackoffTimeout"
_Q, _A, _P, _F, _E = (
    ConditionType.QUOTA_RESERVED.value,
    ConditionType.ADMITTED.value,
    ConditionType.PODS_READY.value,
    ConditionType.FINISHED.value,
    ConditionType.EVICTED.value,
)
_RESERVED = (_Q, "True", "QuotaReserved", "Quota is reserved in the queue")
_ADMITTED = (_A, "True", "Admitted", "The queue unit is admitted and the job is released")


def set_condition(
    conditions: Conditions, type_: str, status: str, reason: str, message: str, *, now: str
) -> bool:
    """Set one condition in place; ``lastTransitionTime`` changes only when ``status`` flips.

    Returns whether anything changed. Unknown keys on an existing condition are kept.
    """
    for cond in conditions:
        if cond.get("type") == type_:
            before = dict(cond)
            if cond.get("status") != status or not cond.get("lastTransitionTime"):
                cond["lastTransitionTime"] = now
            cond.update(status=status, reason=reason, message=message)
            return cond != before
    conditions.append(
        {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
    )
    return True


def _has(conditions: Conditions, type_: str) -> bool:
    return any(cond.get("type") == type_ for cond in conditions)


def sync_conditions(
    existing: Sequence[Mapping[str, object]], *, phase: str, message: str, now: str
) -> tuple[Conditions, bool]:
    """Conditions for ``phase`` (the table of docs/compatibility.md#conditions) and whether
    ``requeueState`` is to be cleared.

    ``existing`` is not modified. Phases outside the table (``""``, legacy ``Preempted``) leave the
    conditions as they are.
    """
    conds: Conditions = [dict(cond) for cond in existing]
    rows: list[tuple[str, str, str, str]] = []
    clear_requeue = False
    if phase == Phase.ENQUEUED:
        rows = [
            (_Q, "False", _PENDING, "The queue unit is waiting in its queue"),
            (_A, "False", _PENDING, "The queue unit is not admitted yet"),
        ]
        if _has(conds, _P):
            rows.append((_P, "False", _PENDING, "The pods of the job are not running yet"))
        if _has(conds, _E):
            rows.append((_E, "False", "Requeued", "The queue unit is queued again"))
    elif phase == Phase.RESERVED:
        rows = [
            _RESERVED,
            (_A, "False", "WaitingForAdmissionChecks", "Waiting for all admission checks to be ready"),
        ]
    elif phase in (Phase.DEQUEUED, Phase.SCHED_READY, Phase.SCHED_SUCCEED):
        rows = [_RESERVED, _ADMITTED]
    elif phase == Phase.RUNNING:
        rows = [_RESERVED, _ADMITTED, (_P, "True", "PodsRunning", "The pods of the job are running")]
        clear_requeue = True
    if phase in (Phase.DEQUEUED, Phase.SCHED_READY, Phase.SCHED_SUCCEED, Phase.RUNNING) and _has(conds, _E):
        # Admitted again (or still admitted after a partial reclaim): an earlier eviction no longer
        # describes the unit. Kueue clears it the same way; upstream leaves Evicted=True for good.
        rows.append((_E, "False", "Admitted", "The queue unit is admitted again"))
    elif phase == Phase.SUCCEED:
        rows = [(_F, "True", "Succeeded", "The job succeeded")]
    elif phase == Phase.FAILED:
        rows = [(_F, "True", "Failed", "The job failed")]
    elif phase == Phase.TIMEOUT_BACKOFF:
        text = message or "The queue unit is backing off before it is queued again"
        rows = [(_Q, "False", _BACKOFF, text), (_A, "False", _BACKOFF, text)]
        if _has(conds, _P):
            rows.append((_P, "False", _BACKOFF, text))
        rows.append((_E, "True", _BACKOFF, text))
    elif phase == Phase.SCHED_FAILED:
        rows = [(_A, "False", "SchedulingFailed", message)]
    for type_, status, reason, text in rows:
        set_condition(conds, type_, status, reason, text, now=now)
    return conds, clear_requeue


def evicted(existing: Sequence[Mapping[str, object]], *, reason: str, message: str, now: str) -> Conditions:
    """``SetQueueUnitEvictedCondition``: ``Evicted=True`` and ``Admitted=False`` with ``reason``
    (``Preempted``, ``Deactivated``, ``BackoffTimeout``, ``MaximumExecutionTimeExceeded``)."""
    conds: Conditions = [dict(cond) for cond in existing]
    set_condition(conds, _E, "True", reason, message, now=now)
    set_condition(conds, _A, "False", reason, message, now=now)
    return conds


@dataclass(frozen=True, slots=True)
class RequeueState:
    """``status.requeueState``: the backoff count and when the unit may be queued again."""

    count: int
    delay: float
    requeue_at: float

    def to_status(self) -> dict[str, object]:
        return {"count": self.count, "requeueAt": format_time(self.requeue_at)}


def next_requeue_state(
    previous_count: int | None, *, now: float, jitter: float, base: float = DEFAULT_REQUEUE_BASE
) -> RequeueState:
    """``RecordQueueUnitRequeueState``: count+1, ``base * 2**(count-1)`` capped at 15 minutes,
    times a uniform factor in [0.9, 1.1) from ``jitter`` in [0, 1), and never beyond the cap.

    A base <= 0 means the default 10 s (upstream).
    """
    if base <= 0:
        base = DEFAULT_REQUEUE_BASE
    count = max(previous_count or 0, 0) + 1
    raw = base * 2.0 ** min(count - 1, 62)
    jitter = min(max(jitter, 0.0), 1.0)
    delay = min(min(raw, MAX_REQUEUE_DELAY) * (0.9 + 0.2 * jitter), MAX_REQUEUE_DELAY)
    return RequeueState(count=count, delay=delay, requeue_at=now + delay)

"""Pure decisions of the job extensions about a unit's activation and execution budget
(docs/compatibility.md#activation-and-execution-budget).

* :func:`deactivation`: the status patch that parks a unit whose ``spec.active`` is false;
* :func:`execution_budget`: how long an active unit may still run, or the patches that end it;
* :func:`requeue_resized`: the status patch that queues a unit again once its job changed the size
  of the pods it was admitted with.

Apart from the pod decisions (``shared.jobs.podplan``) because they look at time, not at pods: the
clock is a parameter (``now``), so they stay table-testable. The caller writes what they return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from koord_queue.shared.api import conditions, names
from koord_queue.shared.api.durations import parse_time
from koord_queue.shared.jobs import podplan

Obj = dict[str, Any]


def _pods_ready_since(unit: Obj) -> float | None:
    for cond in podplan.conditions_of(unit):
        if cond.get("type") == names.ConditionType.PODS_READY and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _accumulated(unit: Obj) -> int:
    value = (unit.get("status") or {}).get("accumulatedPastExecutionTimeSeconds")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def deactivation(unit: Obj, *, now: float, now_text: str) -> Obj | None:
    """The status patch that parks a deactivated unit (``spec.active: false``), or None.

    Upstream's ``reconcileDeactivation`` (docs/compatibility.md#activation-and-execution-budget):
    finished units and units still being reclaimed are left alone; a unit already parked (nothing
    reserved, Enqueued) needs nothing. Otherwise the unit returns to Enqueued with its quota released,
    the time its pods ran is added to ``accumulatedPastExecutionTimeSeconds``, and
    ``Evicted=True/Deactivated`` is set. The caller suspends the job and records the ``Deactivated``
    event on it.
    """
    spec = unit.get("spec") or {}
    status = unit.get("status") or {}
    phase = status.get("phase") or ""
    if spec.get("active") is not False or phase in (names.Phase.SUCCEED, names.Phase.FAILED):
        return None
    admissions = podplan.admissions_of(unit)
    if any(a.reclaim for a in admissions):
        return None
    holds = any(a.replicas > 0 for a in admissions)
    if not holds and phase in ("", names.Phase.ENQUEUED):
        return None
    return _requeued(
        unit, reason="Deactivated", message=names.Message.DEACTIVATED, now=now, now_text=now_text
    )


def requeue_resized(unit: Obj, pod_sets: Sequence[str], *, now: float, now_text: str) -> Obj | None:
    """The status patch that queues a unit again because its job changed the size of pods it was
    admitted with (``shared.jobs.jobext.admitted_resize``,
    docs/compatibility.md#admitted-pod-size), or None while a reclaim of it is in progress (the
    reclaim finishes first; the pod sets are not followed meanwhile).

    As :func:`deactivation`: Enqueued, quota released, the time run kept for the execution budget,
    ``Evicted=True/PodSetsResized``. The caller suspends the job first and records the event.
    """
    if not pod_sets or any(a.reclaim for a in podplan.admissions_of(unit)):
        return None
    message = f"{names.Message.RESIZED_PREFIX} {', '.join(pod_sets)}"
    return _requeued(unit, reason=names.EVICTED_RESIZED_REASON, message=message, now=now, now_text=now_text)


def _requeued(unit: Obj, *, reason: str, message: str, now: float, now_text: str) -> Obj:
    """Back to Enqueued with nothing admitted and ``Evicted=True/<reason>``; the time its pods ran
    is added to ``accumulatedPastExecutionTimeSeconds``."""
    conds, _ = conditions.sync_conditions(
        podplan.conditions_of(unit), phase=names.Phase.ENQUEUED, message=message, now=now_text
    )
    conds = conditions.evicted(conds, reason=reason, message=message, now=now_text)
    patch: Obj = {
        "phase": names.Phase.ENQUEUED.value,
        "message": message,
        "admissions": [],
        "lastUpdateTime": now_text,
        "conditions": conds,
    }
    since = _pods_ready_since(unit)
    if since is not None:
        patch["accumulatedPastExecutionTimeSeconds"] = _accumulated(unit) + max(0, int(now - since))
    return {"status": patch}


@dataclass(frozen=True, slots=True)
class Budget:
    """The outcome of the execution-time check: ``remaining`` seconds, or the patches that end it."""

    remaining: float | None
    spec_patch: Obj | None = None
    status_patch: Obj | None = None


def execution_budget(unit: Obj, *, now: float, now_text: str) -> Budget:
    """Upstream's ``reconcileMaxExecutionTime`` (docs/compatibility.md#activation-and-execution-budget):
    with a budget, an active unit and ``PodsReady=True``, remaining = budget - accumulated - (now -
    PodsReady since). At or below zero the unit is deactivated (``spec.active: false``), its clock
    stopped (``PodsReady=False``) and ``Evicted=True/MaximumExecutionTimeExceeded`` set; the caller
    records the Warning event."""
    spec = unit.get("spec") or {}
    budget = spec.get("maximumExecutionTimeSeconds")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0 or spec.get("active") is False:
        return Budget(remaining=None)
    since = _pods_ready_since(unit)
    if since is None:
        return Budget(remaining=None)
    remaining = budget - _accumulated(unit) - (now - since)
    if remaining > 0:
        return Budget(remaining=remaining)
    message = names.Message.MAX_EXEC_EXCEEDED
    conds = [dict(c) for c in podplan.conditions_of(unit)]
    conditions.set_condition(
        conds,
        names.ConditionType.PODS_READY.value,
        "False",
        "Pending",
        "The execution budget is used up",
        now=now_text,
    )
    conds = conditions.evicted(conds, reason="MaximumExecutionTimeExceeded", message=message, now=now_text)
    return Budget(
        remaining=0.0,
        spec_patch={"spec": {"active": False}},
        status_patch={
            "status": {
                "accumulatedPastExecutionTimeSeconds": None,
                "message": message,
                "lastUpdateTime": now_text,
                "conditions": conds,
            }
        },
    )

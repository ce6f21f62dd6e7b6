"""Running timeout, backoff timeout and partial running timeout of admitted units
(docs/compatibility.md#running-timeout).

An admitted unit whose pods cannot all be placed (no node fits, a missing image pull secret that
stops pod creation, a node selector nobody satisfies) would hold its quota, and under
``koord-queue/wait-for-pods-running`` its whole queue, forever. Per job extension the component
configuration sets three timeouts (:class:`RunningTimeout`, ``jobRunningTimeout`` in
``shared.core.config``), each off at 0:

* ``runningTimeout``: a unit still ``Dequeued`` (admitted, the job released, nothing running yet)
  whose pods do not all run this long after its admission goes to ``TimeoutBackoff`` with
  "Backoff due to running timeout": the job is held again and the unit's admissions are cleared,
  which frees its quota. ``status.requeueState`` says when the scheduler queues it again;
* ``backoffTimeout``: that requeue delay; unset (0), the doubling requeue backoff of
  ``shared.api.conditions`` applies, as after a failed admission check;
* ``partialRunningTimeout``: when some but not all pods run, each pod set short of its admitted
  replicas for this long gives the rest back: ``reclaimState.replicas = replicas - running``, which
  the job extension carries out like a preemption's reclaim (unbound pods deleted, ``replicas``
  lowered to the pods that run). With it set, a partly running unit is shrunk, never backed off.

"Admitted" is ``status.lastAllocateTime`` (written at every admission), else the ``Admitted=True``
condition's transition, else ``lastUpdateTime``. "Runs" is "bound to a node", the same count the
usage report writes into ``admissions[i].running``; kinds whose pods are never linked to their unit
(Argo Workflows) use that reported count. How long a pod set has been short is measured from its
admission while the unit is ``Dequeued``, and from when the shortfall was first seen once it is
``Running`` (a pod replaced long after the start is not "late since the admission"); the caller
keeps those first sightings between calls (``short_since``), as upstream keeps them in memory, so
a restart only ever delays a shrink.

Pure: no I/O and no clock; ``now`` and the jitter of the doubling backoff are parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from koord_queue.shared.api import conditions, names
from koord_queue.shared.api.durations import format_duration, parse_time
from koord_queue.shared.jobs import podplan, registry

__all__ = ["Decision", "RunningTimeout", "RunningTimeouts", "admitted_at", "backoff_patch", "decide"]

Obj = dict[str, Any]

#: Phases in which the job is released and its pods are expected to run.
TIMED_PHASES: Final = frozenset({names.Phase.DEQUEUED, names.Phase.RUNNING})


@dataclass(frozen=True, slots=True)
class RunningTimeout:
    """The timeouts of one job extension, in seconds; 0 turns each one off."""

    running_timeout: float = 0.0
    backoff_timeout: float = 0.0
    partial_running_timeout: float = 0.0
    #: How long an admitted, resumed job may have no pod at all (``shared.jobs.stranded``); unlike
    #: the others on by default (docs/compatibility.md#jobs-without-pods), and only for the kinds
    #: that module names.
    no_pods_timeout: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.running_timeout > 0 or self.partial_running_timeout > 0


@dataclass(frozen=True, slots=True)
class RunningTimeouts:
    """The configured timeouts: ``default``, and complete entries for the extensions named."""

    default: RunningTimeout = RunningTimeout()
    per_extension: tuple[tuple[str, RunningTimeout], ...] = ()

    def for_extension(self, extension: str) -> RunningTimeout:
        for name, timeouts in self.per_extension:
            if name == extension:
                return timeouts
        return self.default


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one unit now.

    ``status_patch`` is a merge patch of the unit's status subresource (``{"status": {...}}``) or
    None; ``suspend`` asks the caller to hold the job *before* writing it. ``recheck_in`` is when a
    timeout still pending falls due (seconds), ``short_since`` the first sightings to keep for the
    next call (pod set -> epoch seconds). ``event_reason``/``event_message`` describe a timeout for
    the Warning event.
    """

    status_patch: Obj | None = None
    suspend: bool = False
    recheck_in: float | None = None
    short_since: Mapping[str, float] = field(default_factory=dict)
    event_reason: str = ""
    event_message: str = ""


def _conditions(unit: Mapping[str, Any]) -> list[Mapping[str, object]]:
    found = (unit.get("status") or {}).get("conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def admitted_at(unit: Mapping[str, Any]) -> float | None:
    """When the unit was admitted: ``lastAllocateTime``, else ``Admitted=True`` since, else
    ``lastUpdateTime``; None when none of them can be read."""
    status = unit.get("status") or {}
    admitted = next(
        (
            c.get("lastTransitionTime")
            for c in _conditions(unit)
            if c.get("type") == names.ConditionType.ADMITTED and c.get("status") == "True"
        ),
        None,
    )
    for raw in (status.get("lastAllocateTime"), admitted, status.get("lastUpdateTime")):
        parsed = parse_time(raw)
        if parsed is not None:
            return parsed
    return None


def _synthetic_pods(unit: Mapping[str, Any]) -> bool:
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    adapter = registry.by_kind(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
    return adapter is not None and adapter.synthetic_pods


def _running(
    unit: Mapping[str, Any], admissions: Sequence[podplan.AdmissionView], pods: Sequence[podplan.PodView]
) -> dict[str, int]:
    """Running pods per admitted pod set: bound live pods, or the reported count for kinds whose pods
    are not linked to the unit."""
    if _synthetic_pods(unit):
        return {a.name: a.running for a in admissions}
    bound: dict[str, int] = {}
    for pod in pods:
        if pod.live and pod.bound:
            bound[pod.pod_set] = bound.get(pod.pod_set, 0) + 1
    return {a.name: bound.get(a.name, 0) for a in admissions}


def decide(
    unit: Obj,
    pods: Sequence[podplan.PodView],
    timeouts: RunningTimeout,
    *,
    now: float,
    now_text: str,
    jitter: float,
    short_since: Mapping[str, float] | None = None,
) -> Decision:
    """The running-timeout decision for one unit (see the module docstring).

    ``pods`` are the unit's pods (``podplan.pod_view``), ``jitter`` a value in [0, 1) for the doubling
    backoff, ``short_since`` what the previous call returned for this unit.
    """
    previous = short_since or {}
    if not timeouts.enabled:
        return Decision()
    spec = unit.get("spec") or {}
    status = unit.get("status") or {}
    phase = status.get("phase") or ""
    if phase not in TIMED_PHASES or spec.get("active") is False:
        return Decision()  # not released, or deactivation parks it: nothing is late
    admissions = podplan.admissions_of(unit)
    if any(a.reclaim is not None for a in admissions):
        return Decision(short_since=previous)  # a reclaim is under way: look again once it is done
    since = admitted_at(unit)
    if since is None or not any(a.replicas > 0 for a in admissions):
        return Decision()
    running = _running(unit, admissions, pods)
    short = [a for a in admissions if running[a.name] < a.replicas]
    if not short:
        return Decision()
    some_running = any(running.values())
    pending: list[float] = []

    partial = timeouts.partial_running_timeout
    if partial > 0 and some_running:
        seen = {a.name: previous.get(a.name, now) for a in short}
        expired: dict[str, int] = {}
        for adm in short:
            start = since if phase == names.Phase.DEQUEUED else max(since, seen[adm.name])
            if now >= start + partial:
                expired[adm.name] = adm.replicas - running[adm.name]
            else:
                pending.append(start + partial - now)
        if not expired:
            return Decision(recheck_in=min(pending), short_since=seen)
        raw = [a for a in status.get("admissions") or [] if isinstance(a, Mapping)]
        shrunk = []
        for entry in raw:
            item = dict(entry)
            if item.get("name") in expired:
                item["reclaimState"] = {"replicas": expired[str(item["name"])]}
            shrunk.append(item)
        return Decision(
            status_patch={"status": {"admissions": shrunk, "lastUpdateTime": now_text}},
            recheck_in=min(pending) if pending else None,
            short_since={k: v for k, v in seen.items() if k not in expired},
            event_reason=names.PARTIAL_RUNNING_TIMEOUT_REASON,
            event_message="; ".join(
                names.partial_running_timeout_message(
                    a.name, running[a.name], a.replicas, format_duration(partial)
                )
                for a in short
                if a.name in expired
            ),
        )

    limit = timeouts.running_timeout
    if limit <= 0 or phase != names.Phase.DEQUEUED:
        # Once the job runs (phase Running) only the partial timeout applies: a running job is
        # never suspended for a pod that is late.
        return Decision()
    if now < since + limit:
        return Decision(recheck_in=since + limit - now)
    patch, requeue = backoff_patch(
        unit,
        message=names.Message.BACKOFF_RUNNING_TIMEOUT,
        backoff_timeout=timeouts.backoff_timeout,
        now=now,
        now_text=now_text,
        jitter=jitter,
    )
    not_running = sum(a.replicas - running[a.name] for a in short)
    return Decision(
        status_patch=patch,
        suspend=True,
        event_reason=names.RUNNING_TIMEOUT_REASON,
        event_message=names.running_timeout_message(
            not_running,
            sum(a.replicas for a in admissions),
            format_duration(limit),
            format_duration(round(requeue.delay)),
        ),
    )


def backoff_patch(
    unit: Mapping[str, Any], *, message: str, backoff_timeout: float, now: float, now_text: str, jitter: float
) -> tuple[Obj, conditions.RequeueState]:
    """The status merge patch that sends an admitted unit to ``TimeoutBackoff`` with ``message``:
    admissions cleared (its quota given back) and the requeue time set, ``backoff_timeout`` when
    positive, else the doubling backoff. Shared by every decision that takes an admission back
    (this module, ``shared.jobs.stranded``)."""
    status = unit.get("status") or {}
    requeue_state = status.get("requeueState")
    count = requeue_state.get("count") if isinstance(requeue_state, Mapping) else None
    previous_count = count if isinstance(count, int) and not isinstance(count, bool) else None
    if backoff_timeout > 0:
        requeue = conditions.RequeueState(
            count=max(previous_count or 0, 0) + 1,
            delay=backoff_timeout,
            requeue_at=now + backoff_timeout,
        )
    else:
        requeue = conditions.next_requeue_state(previous_count, now=now, jitter=jitter)
    conds, _ = conditions.sync_conditions(
        _conditions(unit), phase=names.Phase.TIMEOUT_BACKOFF, message=message, now=now_text
    )
    return {
        "status": {
            "phase": names.Phase.TIMEOUT_BACKOFF.value,
            "message": message,
            # Backing off gives the quota back: nothing is admitted any more.
            "admissions": [],
            "lastUpdateTime": now_text,
            "conditions": conds,
            "requeueState": requeue.to_status(),
        }
    }, requeue

"""Pure decisions of the job extensions about a unit's pods: which to release, which to delete for
a reclaim, and the usage report.

* :func:`plan_pods`: which gated pods to release and which unbound pods to delete for a reclaim
  (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones: at most
  ``admissions[i].replicas`` pods per pod set are ungated; reclaim deletes only pods that are neither
  bound nor terminal, so running pods are never touched);
* :func:`report`: the ``status`` patch that reports bound pods, pod states and the job's phase;
* :func:`slim_pod`: what the pod informer keeps, exactly what ``shared.jobs.podview.pod_view`` reads.

The views of a unit's status they read (:func:`admissions_of`, :func:`conditions_of`) serve the
other decisions on a unit too (``shared.jobs.lifecycle``, ``shared.jobs.running_timeout``). Every
function returns ``None`` (or an empty plan) when nothing needs writing, so the I/O side writes only
on change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from koord_queue.shared.api import conditions, names, podtemplates, quantities
from koord_queue.shared.jobs import podbudget, registry
from koord_queue.shared.jobs.base import JobStatus, dig, text
from koord_queue.shared.jobs.podview import PodView as PodView
from koord_queue.shared.jobs.podview import pod_view as pod_view

Obj = dict[str, Any]

#: Phases in which a unit's admission releases pods. ``Reserved`` holds quota while admission checks
#: run: its pods stay gated until the checks pass (and go back behind the gate if they fail).
ADMITTED_PHASES = frozenset({names.Phase.DEQUEUED, names.Phase.RUNNING, names.Phase.SCHED_SUCCEED})


def admitted_sizes(unit: Obj) -> dict[str, dict[str, int] | None]:
    """The per-pod size each pod set of the unit's spec was queued (and so admitted) with, by the
    same rule as a pod's (None where the template cannot be read: nothing fits it)."""
    found: dict[str, dict[str, int] | None] = {}
    pod_sets = dig(unit, "spec", "podSet")
    for pod_set in pod_sets if isinstance(pod_sets, list) else []:
        name = dig(pod_set, "name")
        if not isinstance(name, str) or name in found:
            continue
        spec = dig(pod_set, "template", "spec")
        try:
            found[name] = podtemplates.pod_requests(spec if isinstance(spec, Mapping) else {})
        except quantities.QuantityError:
            found[name] = None
    return found


def _quantity(milli: int, resource: str) -> str:
    return quantities.format_milli(milli, resource=resource)


def size_problem(pod: PodView, admitted: Mapping[str, int] | None) -> str | None:
    """Why the pod does not fit the per-pod size its pod set was admitted with, or None when it
    does: each of its effective requests at most what one admitted pod was charged
    (docs/compatibility.md#pod-gating)."""
    if pod.requests is None:
        return "its resource requests cannot be read"
    if admitted is None:
        return f"the admitted size of pod set {pod.pod_set} cannot be read"
    over = [
        f"{name} {_quantity(value, name)} > {_quantity(admitted.get(name, 0), name)}"
        for name, value in pod.requests
        if value > admitted.get(name, 0)
    ]
    if over:
        return f"it asks for more than pod set {pod.pod_set} was admitted with per pod ({', '.join(over)})"
    return None


@dataclass(frozen=True, slots=True)
class AdmissionView:
    name: str
    replicas: int
    running: int
    reclaim: int | None


def _status(unit: Obj) -> Mapping[str, Any]:
    """The unit's status, empty when it is not an object (the status is read unchecked)."""
    status = unit.get("status")
    return status if isinstance(status, Mapping) else {}


def phase_of(unit: Obj) -> str:
    """``status.phase``, or ``""`` when absent or not a string."""
    phase = _status(unit).get("phase")
    return phase if isinstance(phase, str) else ""


def admissions_of(unit: Obj) -> list[AdmissionView]:
    """``status.admissions``, skipping entries that are not objects with a name."""
    found: list[AdmissionView] = []
    listed = _status(unit).get("admissions")
    for a in listed if isinstance(listed, list) else []:
        if not isinstance(a, Mapping) or not isinstance(a.get("name"), str):
            continue
        reclaim = dig(a, "reclaimState", "replicas")
        found.append(
            AdmissionView(
                name=a["name"],
                replicas=_int(a.get("replicas")),
                running=_int(a.get("running")),
                reclaim=_int(reclaim) if reclaim is not None else None,
            )
        )
    return found


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class PodPlan:
    """What to do with a unit's pods; ``status`` is a merge patch for the unit (or None).

    ``delete`` holds the pods of a reclaim; ``unadmitted`` the pods released beyond the admission
    (their gate was removed by someone else), deleted the same careful way but reported apart;
    ``escaped`` the released pods that name the unit but that its job does not own (the caller
    adds them: ``shared.jobs.podlinks.left_job``); ``withheld`` the gated pods that stay gated
    although the admission has room, with why (they do not fit the admitted per-pod size; the
    caller adds those whose owner is not proven); ``beyond`` the bound pods a pod set runs past what
    its admission holds (newest first), which are reported, never charged by growing the admission
    (docs/compatibility.md#reclaim-and-usage-reports); ``waiting`` the gated pods of a kind released
    within a reservation that wait for room, with why (``shared.jobs.podbudget``).
    """

    ungate: list[PodView] = field(default_factory=list)
    delete: list[PodView] = field(default_factory=list)
    unadmitted: list[PodView] = field(default_factory=list)
    escaped: list[PodView] = field(default_factory=list)
    withheld: list[tuple[PodView, str]] = field(default_factory=list)
    beyond: list[PodView] = field(default_factory=list)
    waiting: list[tuple[PodView, str]] = field(default_factory=list)
    status: Obj | None = None


def _order(pods: Iterable[PodView]) -> list[PodView]:
    return sorted(pods, key=lambda p: (p.created, p.name))


def _beyond_admission(live: Sequence[PodView], replicas: int) -> list[PodView]:
    """Unbound pods without the gate beyond what the admission allows, newest first.

    Only the reconciler removes the gate (an admission policy stops everyone else), and it releases
    at most ``replicas - bound`` pods. More released pods than that means the gate was removed past
    the queue (or the admission shrank after the release): such a pod must not be scheduled, so it
    is deleted like a reclaimed one and its controller creates a gated replacement.
    """
    bound = sum(1 for p in live if p.bound)
    released = [p for p in live if not p.bound and not p.gated]
    excess = len(released) - max(0, replicas - bound)
    return list(reversed(_order(released)))[:excess] if excess > 0 else []


def still_running(pods: Iterable[PodView]) -> list[PodView]:
    """The pods that run or may start: bound (being deleted or not) or released from the gate and
    not being deleted. Quota taken back from a held job is freed only once there are none
    (docs/compatibility.md#activation-and-execution-budget)."""
    return [p for p in pods if p.live and (p.bound or not p.gated)]


def _bound_beyond(live: Sequence[PodView], replicas: int) -> list[PodView]:
    """Bound pods past ``replicas``, newest first. Bound pods are never deleted (they run), and the
    admission is never grown to fit them: only the scheduler changes what a unit holds."""
    bound = [p for p in live if p.bound]
    excess = len(bound) - max(0, replicas)
    return list(reversed(_order(bound)))[:excess] if excess > 0 else []


def plan_pods(unit: Obj, pods: Sequence[PodView], *, now_text: str = "") -> PodPlan:
    """Release gated pods up to the admitted count and carry out any pending reclaim.

    Reclaim of an admission with ``reclaimState.replicas = n`` takes back ``min(n, replicas -
    bound)`` replicas: unbound live pods are deleted (newest first: the oldest are closest to being
    scheduled); replicas whose pods do not exist yet are released without a delete (upstream keeps
    such a reclaimState forever). Bound pods are never deleted, so the reclaim may take back fewer
    replicas than asked; the reclaimState is cleared either way and the scheduler sees the result.
    Released unbound pods beyond the admission (see :func:`_beyond_admission`) are deleted too,
    including every released unbound pod of a unit that holds no admission at all. Pods are
    released only in an admitted phase (:data:`ADMITTED_PHASES`): a unit that holds quota while
    its admission checks run, or that is backing off, keeps them gated and deletes any released
    unbound pod. A kind released within a reservation (a Workflow) is decided by
    ``shared.jobs.podbudget`` instead: its pods are released while their summed requests fit.
    """
    plan = PodPlan()
    admissions = admissions_of(unit)
    within = _within_reservation(unit)
    phase = (unit.get("status") or {}).get("phase") or ""
    releasing = phase in ADMITTED_PHASES
    by_set: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.live:
            by_set.setdefault(pod.pod_set, []).append(pod)
    admitted_sets = {a.name for a in admissions}
    for name in sorted(set(by_set) - admitted_sets):
        plan.unadmitted.extend(_beyond_admission(by_set[name], 0))
        if admissions:
            plan.beyond.extend(_bound_beyond(by_set[name], 0))
    if not admissions:
        return plan
    new_admissions: list[Obj] = []
    reclaimed_any = False
    sizes = admitted_sizes(unit)
    raw = {
        a.get("name"): a for a in (unit.get("status") or {}).get("admissions") or [] if isinstance(a, Mapping)
    }
    for adm in admissions:
        live = by_set.get(adm.name, [])
        bound = [p for p in live if p.bound]
        replicas = adm.replicas
        entry = dict(raw.get(adm.name) or {"name": adm.name})
        if within:
            if adm.reclaim is not None:
                replicas -= podbudget.reclaimable(live, replicas, adm.reclaim)
                entry["replicas"] = replicas
                entry.pop("reclaimState", None)
                reclaimed_any = True
            decided = podbudget.release(live, sizes.get(adm.name), replicas, releasing=releasing)
            plan.ungate.extend(decided.ungate)
            plan.unadmitted.extend(decided.unadmitted)
            plan.beyond.extend(decided.beyond)
            plan.withheld.extend(decided.never)
            plan.waiting.extend(decided.waiting)
            new_admissions.append(entry)
            continue
        if adm.reclaim is not None:
            take = max(0, min(adm.reclaim, replicas - len(bound)))
            unbound = [p for p in live if not p.bound]
            victims = list(reversed(_order(unbound)))[:take]
            plan.delete.extend(victims)
            replicas -= take
            entry["replicas"] = replicas
            entry.pop("reclaimState", None)
            reclaimed_any = True
            deleted = {p.uid for p in victims}
            live = [p for p in live if p.uid not in deleted]
        excess = _beyond_admission(live, replicas if releasing else 0)
        if excess:
            plan.unadmitted.extend(excess)
            gone = {p.uid for p in excess}
            live = [p for p in live if p.uid not in gone]
        plan.beyond.extend(_bound_beyond(live, replicas))
        released = [p for p in live if p.bound or not p.gated]
        missing = replicas - len(released)
        if missing > 0 and releasing:
            for pod in _order(p for p in live if not p.bound and p.gated):
                why = size_problem(pod, sizes.get(adm.name))
                if why is not None:
                    plan.withheld.append((pod, why))
                elif missing > 0:
                    plan.ungate.append(pod)
                    missing -= 1
        new_admissions.append(entry)
    if reclaimed_any:
        plan.status = {"status": _after_reclaim(unit, new_admissions, now_text=now_text)}
    return plan


def _after_reclaim(unit: Obj, admissions: list[Obj], *, now_text: str) -> Obj:
    """The status once a reclaim is carried out, conditions included.

    Nothing held any more: the unit is back in its queue, and says so (``Enqueued``, conditions
    for that phase). Something still held (bound pods are never reclaimed): the unit stays in its
    admitted phase, and its conditions say admitted again (the marking set ``Admitted=False``).
    """
    status: Obj = {"admissions": admissions}
    current = (unit.get("status") or {}).get("phase") or ""
    if all(_int(a.get("replicas")) == 0 for a in admissions):
        phase, message = names.Phase.ENQUEUED.value, names.Message.ENQUEUED_AFTER_PREEMPTED
        status["phase"], status["message"] = phase, message
    else:
        phase, message = current, str((unit.get("status") or {}).get("message") or "")
    conds, _ = conditions.sync_conditions(conditions_of(unit), phase=phase, message=message, now=now_text)
    if conds != conditions_of(unit):
        status["conditions"] = conds
    return status


def report(unit: Obj, pods: Sequence[PodView], job_status: JobStatus, *, now_text: str) -> Obj | None:
    """The status patch reporting bound pods and the job's life, or None when nothing changed.

    ``admissions[i].running`` counts the bound live pods of the pod set; ``podState`` counts bound
    (running) and unbound (pending) live pods. ``replicas`` is never raised to the pods seen: what a
    unit holds is the scheduler's to change (pods beyond it are :attr:`PodPlan.beyond`).
    A finished job's unit moves to Succeed or Failed with
    ``admissions = []``, which releases its quota (docs/compatibility.md#job-finish-and-deletion). A
    unit that was admitted (Dequeued) moves to Running once the job runs. A kind with ``synthetic_pods``
    (Workflow) reports its admitted replicas as running while the released job runs or is pending.
    """
    status = unit.get("status") or {}
    phase = status.get("phase") or ""
    if phase in (names.Phase.SUCCEED, names.Phase.FAILED):
        return None
    if job_status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        done = job_status == JobStatus.SUCCEEDED
        return {
            "status": {
                "phase": names.Phase.SUCCEED if done else names.Phase.FAILED,
                "message": names.Message.SUCCEEDED if done else names.Message.FAILED,
                "admissions": [],
                "podState": {"running": 0, "pending": 0},
                "lastUpdateTime": now_text,
            }
        }
    raw_admissions = [a for a in status.get("admissions") or [] if isinstance(a, Mapping)]
    if not raw_admissions:
        return None
    live = [p for p in pods if p.live]
    bound_by_set: dict[str, int] = {}
    #: live pods that hold their replica: bound, or released and not yet bound
    holding_by_set: dict[str, int] = {}
    for pod in live:
        if pod.bound:
            bound_by_set[pod.pod_set] = bound_by_set.get(pod.pod_set, 0) + 1
        if pod.bound or not pod.gated:
            holding_by_set[pod.pod_set] = holding_by_set.get(pod.pod_set, 0) + 1
    bound_total = sum(bound_by_set.values())
    pending_total = len(live) - bound_total
    if _synthetic_pods(unit) and job_status in (JobStatus.RUNNING, JobStatus.PENDING):
        # No pod is linked to such a unit: its admitted replicas count as bound once the job is
        # released, like upstream's synthetic pod on "mocked-node". Without this a Workflow stayed
        # "assumed" forever and held a wait-for-pods-running queue until it finished.
        bound_by_set = {str(a.get("name")): _int(a.get("replicas")) for a in raw_admissions}
        bound_total, pending_total = sum(bound_by_set.values()), 0
    patch: Obj = {}
    new_admissions = []
    changed = False
    counts = _pod_set_counts(unit)
    for a in raw_admissions:
        entry = dict(a)
        name = str(a.get("name"))
        running = bound_by_set.get(name, 0)
        if entry.get("running") != running:
            entry["running"] = running
            changed = True
        wanted = counts.get(name)
        holding = max(running, holding_by_set.get(name, 0))
        if wanted is not None and _int(entry.get("replicas")) > max(wanted, holding):
            # Over-admission: the pod set shrank (completed pods of a Job, lowered parallelism),
            # so the quota of the replicas it no longer needs is given back, and the unit is not
            # "assumed" for pods that will never run. Never below the pods that hold a replica:
            # bound ones, and released ones not bound yet (a Job controller that lost a status
            # write may start a pod its count no longer needs; it runs charged until it is gone).
            entry["replicas"] = max(wanted, holding)
            changed = True
        new_admissions.append(entry)
    if changed:
        patch["admissions"] = new_admissions
    pod_state = {"running": bound_total, "pending": pending_total}
    if (status.get("podState") or {}) != pod_state and (
        status.get("podState") or bound_total or pending_total
    ):
        patch["podState"] = pod_state
    if job_status == JobStatus.RUNNING and phase == names.Phase.DEQUEUED:
        patch["phase"] = names.Phase.RUNNING.value
        patch["message"] = names.Message.RUNNING
        conds, clear_requeue = conditions.sync_conditions(
            conditions_of(unit), phase=names.Phase.RUNNING, message=names.Message.RUNNING, now=now_text
        )
        patch["conditions"] = conds
        if clear_requeue and status.get("requeueState") is not None:
            patch["requeueState"] = None
    if not patch:
        return None
    patch["lastUpdateTime"] = now_text
    return {"status": patch}


#: How long a report that only changes pod counts waits for a write that matters
#: (docs/compatibility.md#coalesced-pod-reports). 5 s, the cadence of the quota figures: at 2 s,
#: a loaded cluster (binding or the Job controller's completion more than 2 s behind) forced
#: about one job in four into a write of counts alone.
COALESCE_SECONDS = 5.0


def can_wait(unit: Obj, patch: Obj) -> bool:
    """Whether a :func:`report` patch may wait :data:`COALESCE_SECONDS` to ride with a later one.

    Only counts nobody decides on yet may wait: ``podState`` alone, or a pod set's ``running``
    going down (its pods finished; the job's own end usually follows within a second). Anything
    that changes a phase, what a unit holds (``replicas``) or raises ``running`` (a bound pod, which
    reclaim and the Block policy read) is written at once. A single-pod job then costs three
    status writes: admitted, Running, finished (docs/compatibility.md#coalesced-pod-reports).
    """
    status = patch.get("status")
    if not isinstance(status, Mapping) or set(status) - {"podState", "admissions", "lastUpdateTime"}:
        return False
    new = status.get("admissions")
    if new is None:
        return True
    old = {
        str(a.get("name")): a
        for a in (unit.get("status") or {}).get("admissions") or []
        if isinstance(a, Mapping)
    }
    for entry in new:
        before = old.get(str(entry.get("name")))
        if before is None or _int(before.get("replicas")) != _int(entry.get("replicas")):
            return False
        if _int(entry.get("running")) > _int(before.get("running")):
            return False
        if {k: v for k, v in entry.items() if k != "running"} != {
            k: v for k, v in before.items() if k != "running"
        }:
            return False
    return True


def _pod_set_counts(unit: Obj) -> dict[str, int]:
    """``count`` per pod set of the unit's spec (the job's current demand, kept in step by
    :func:`spec_drift`)."""
    found: dict[str, int] = {}
    for pod_set in dig(unit, "spec", "podSet") or []:
        name, count = dig(pod_set, "name"), dig(pod_set, "count")
        if isinstance(name, str) and isinstance(count, int) and not isinstance(count, bool):
            found[name] = count
    return found


def _synthetic_pods(unit: Obj) -> bool:
    """The unit's consumer is a kind whose pods are never linked to it (see ``synthetic_pods``)."""
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    adapter = registry.by_kind(text(ref.get("apiVersion")), text(ref.get("kind")))
    return adapter is not None and adapter.synthetic_pods


def _within_reservation(unit: Obj) -> bool:
    """The unit's consumer is a kind whose pods are released within a reservation (see
    ``pods_within_reservation``)."""
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    adapter = registry.by_kind(text(ref.get("apiVersion")), text(ref.get("kind")))
    return adapter is not None and adapter.pods_within_reservation


def conditions_of(unit: Obj) -> list[Mapping[str, object]]:
    """The unit's status conditions, skipping entries that are not objects (the status is read unchecked)."""
    found = _status(unit).get("conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


# --- what the informer keeps -------------------------------------------------------------------

#: Pod fields the extensions read (:func:`pod_view`, the pod-set and unit annotations and labels).
_POD_SPEC_FIELDS = ("nodeName", "schedulingGates", "resources", "overhead")
#: Of each container, what its effective requests are read from (``podtemplates.pod_requests``).
_CONTAINER_FIELDS = ("resources", "restartPolicy")
#: Of a pod still behind the admission gate, what its release adds a pool's placement to
#: (``placement.release_ops``, docs/pools.md#placement); a released pod drops them again.
_GATED_SPEC_FIELDS = ("nodeSelector", "affinity", "tolerations")


def slim_pod(pod: Obj) -> Obj:
    """A pod reduced to what the job extensions read: metadata, where it is bound, its gates, what
    its requests are made of and its phase. The pod informer watches every pod of the cluster; a
    whole pod is 5-10 KiB in memory, this view well under one. A pod behind the admission gate also
    keeps its placement, which its release extends; released pods (most of them) do not."""
    spec = pod.get("spec")
    status = pod.get("status")
    out: Obj = {k: v for k, v in pod.items() if k not in ("spec", "status")}
    if isinstance(spec, dict):
        gates = spec.get("schedulingGates")
        gated = isinstance(gates, list) and any(
            isinstance(g, dict) and g.get("name") == names.ADMISSION_GATE for g in gates
        )
        kept = (*_POD_SPEC_FIELDS, *_GATED_SPEC_FIELDS) if gated else _POD_SPEC_FIELDS
        out["spec"] = {k: spec[k] for k in kept if k in spec}
        for key in ("containers", "initContainers"):
            listed = spec.get(key)
            if isinstance(listed, list):
                out["spec"][key] = [
                    {k: c[k] for k in _CONTAINER_FIELDS if k in c} if isinstance(c, dict) else c
                    for c in listed
                ]
    if isinstance(status, dict) and "phase" in status:
        out["status"] = {"phase": status["phase"]}
    return out

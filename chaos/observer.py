"""The independent invariant observer: every change of QueueUnits, ElasticQuotas, Jobs and Pods,
replayed from etcd in revision order, with the issue's invariants checked at every version.

Independent on purpose: it reads the storage directly (one etcd watch over a key range holding all
four kinds, so their changes arrive in one total order and an apiserver restart or a ``410 Gone``
leaves no gap in the history), parses objects with its own code (:mod:`chaos.views`: its own
quantity parser and per-pod arithmetic, :mod:`chaos.k8sproto` for the protobuf-stored kinds) and
imports nothing from the product but the API's names. A bug in the product's parsing or
accounting can therefore not hide itself from the check.

Invariants checked continuously (each check evaluation is counted in :attr:`Observer.checks`):

``quota-overrun``
    Whenever a unit's held resources grow (an admission), the usage of every quota on its chain
    (leaf up the ``quota.scheduling.koordinator.sh/parent`` labels) is at most that quota's
    ``max`` for every resource that grew. Usage is the sum over non-finished units of
    ``per-pod request x admitted replicas`` (marked victims keep holding until reclaimed). Usage
    above ``max`` after a quota *shrink* is not a violation (nothing can be taken back), but any
    admission while it lasts is, except within :data:`SHRINK_GRACE_S` of the shrink (a decision
    taken on the snapshot before the shrink reached the reconciler; counted as ``tolerated``).
``double-admission``
    An admission never raises a pod set's admitted replicas above its count; a finished unit is
    never admitted again; a unit released without an observable reason (reclaim, backoff,
    eviction, finish, deletion) is never admitted again (that would be a second admission in one
    cycle, the admitted state having been lost and recreated).
``run-without-admission``
    A managed Job is resumed (or labelled into a queue while it runs) only while its unit is
    admitted, and the live ungated (released) pods naming a unit in their
    ``koord-queue/related-queueunit`` annotation never outnumber its admitted replicas. Pods of a job
    that is being deleted or has been suspended again are exempt (they are on their way out). A
    pod's claim on a unit counts only as the product may count it: the pod lives in the unit's
    namespace and, when the unit has a Job, is controlled by that Job (:func:`chaos.views.job_link_uids`);
    forged claims (a hostile tenant's pod in another namespace, or a bare pod) are ignored here and
    counted in :attr:`stats` (the tenant phase checks that the product ignores them too).
    A Workflow's unit is a reservation, not a number of pods (one pod set of count 1 sized by
    ``koord-queue/min-resources``; any number of step pods may run within it,
    docs/compatibility.md#argo-workflow), so its pods are judged by what they ask
    (:func:`reservation_excess`): the pods naming it that take node resources (released, or bound,
    a bound pod being deleted included) run only while it admits replicas, and their summed requests
    stay within its reservation (admitted replicas x the pod set template's request, per resource).
    Within :data:`SCHEDULABLE_GRACE_S` after the unit shrank or was deleted (a Workflow deleted with
    its pods; a unit deleted by someone else, re-created admitted by adoption) an excess is judged
    when the grace has passed, extended by any stall of the etcd stream, as below.
``unadmitted-pod-schedulable``
    Keyed on ownership, not on the annotation: for every managed Job, the live pods it controls (a
    controller reference carrying the Job's UID, in the Job's namespace, on a pod that names a unit
    or carries the Job controller's selector label: :func:`chaos.views.job_link_uids`) that are bound
    to a node or not gated (schedulable) never outnumber its unit's admitted replicas (a batch Job
    has one pod set). A bound pod of a unit holding no admission is a violation like any other
    excess. The only tolerance: within :data:`SCHEDULABLE_GRACE_S` after the unit's admission shrank
    (a reclaim mark, fewer replicas, a finish, the unit's deletion) the excess is remembered and
    judged when the grace has passed (counted as ``tolerated`` when repaired by then); the grace is
    extended by any stall of the etcd stream (nothing can be repaired while etcd is paused). Pods of
    a Job that is being deleted or was suspended again are exempt, as above.
``bound-pod-reclaimed``
    A bound, non-terminal pod is never deleted while its unit is being reclaimed and its job is
    alive (reclaim may delete only unbound pods).
``job-failed-by-preemption``
    A job whose pods were reclaimed (its unit was marked by a preemption) never ends ``Failed``:
    preemption puts a job back in its queue, it must not spend the job's retry budget.
``admitted-without-quota`` / ``admitted-unreadable``
    Nothing is admitted whose quota chain is broken (a missing quota) or whose demand cannot be
    read (an unparsable quantity).
``guarantee-unserved`` / ``guarantee-taken``
    Below a parent quota, each unit that fits within its quota's ``min`` is served (admitted
    itself) within one reclaim round once room exists or borrowed capacity that does not run could
    be reclaimed, and no
    borrowing admission takes what a sibling's ``min`` still claims. The rules, their clocks and
    what they tolerate are in :mod:`chaos.guarantee_watch`; the clocks stop while a fault window
    is open (:meth:`Observer.disturb`).

Checked at quiescent points only (after each fault's recovery probe and at the end of the run, by
:mod:`chaos.run` through :meth:`Observer.accounting_mismatches` and :func:`settle`; the product
converges asynchronously, so a mismatch is a violation only if it persists for a whole convergence
window):

``usage-mismatch``
    What each unfinished unit of a managed batch Job is charged (admitted replicas x the per-pod
    request of its pod set template) matches what is really held: the live bound pods the job owns
    (owner UID, same namespace) and the pods the job still needs (``min(parallelism, completions -
    succeeded)``, 0 once finished), read from the Job and Pods themselves. Rules (see
    :func:`unit_accounting`): ``charged-below-running`` (replicas >= bound pods),
    ``charged-for-unneeded`` (replicas <= max(needed, bound pods): no over-admission after pods
    completed or parallelism was lowered), ``charged-below-pod-size`` (the template's per-pod
    request >= each bound pod's request: a template that grew while queued is charged its new size),
    ``released-pod-outside-its-job`` (no live pod out of the gate names the unit in its namespace
    unless the Job owns it: one its controller let go of after a relabel is charged by nothing).
    Per quota (``quota-usage-drift``, :func:`quota_accounting`): the usage the observer accumulated
    admission by admission (what ``quota-overrun`` judges) equals the sum over the quota's
    unfinished units of replicas x per-pod request, recomputed from scratch.

End-state checks (every submitted job ends admitted or waiting with a message that says why; no
job is lost) are evaluated by :mod:`chaos.run` from the observer's final state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from chaos.etcd import Compacted, Etcd, KeyValue, prefix_end
from chaos.guarantee_watch import GuaranteeWatch
from chaos.views import (
    TERMINAL,
    JobView,
    PodView,
    QuotaView,
    UnitView,
    add_resources,
    as_map,
    decode_job,
    decode_pod,
    parse_job,
    parse_pod,
    parse_unit,
    resource_list,
)
from koord_queue.shared.api import names

#: After a quota's max is lowered, admissions decided on the older snapshot may still land.
SHRINK_GRACE_S = 2.0
#: After a unit's admission shrinks, its extra pods may stay schedulable until the reconciler's
#: deletions land (decisions in flight).
SCHEDULABLE_GRACE_S = 2.0
#: A longer silence of the etcd stream than this extends every pending grace by its length.
STALL_S = 1.0
#: Violation details kept per invariant (all are counted).
MAX_DETAILS = 50

UNITS = b"/registry/scheduling.x-k8s.io/queueunits/"
QUOTAS = b"/registry/scheduling.sigs.k8s.io/elasticquotas/"
PODS = b"/registry/pods/"
JOBS = b"/registry/jobs/"
#: One range holds jobs, ..., pods, ..., elasticquotas, queues, queueunits: a single ordered stream.
WATCH_START = JOBS
WATCH_END = prefix_end(UNITS)
#: Written by :meth:`Observer.sync`; inside the range, outside every prefix the apiserver reads.
SENTINEL = b"/registry/scheduling.chaos-observer-sentinel"

#: The consumer kind whose unit is a reservation its pods run within, not a number of pods
#: (docs/compatibility.md#argo-workflow): judged by :func:`reservation_excess`.
WORKFLOW: Final = "Workflow"

# --- usage-mismatch: pure rules ------------------------------------------------------------------

USAGE_MISMATCH = "usage-mismatch"


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One way what is charged differs from what is held; ``subject`` is a unit key or a quota."""

    rule: str
    subject: str
    detail: str

    @property
    def key(self) -> tuple[str, str]:
        return self.rule, self.subject


def _fmt(resources: Mapping[str, int]) -> str:
    return ",".join(f"{r}={v}m" for r, v in sorted(resources.items())) or "nothing"


def unit_accounting(unit: UnitView, job: JobView | None, bound: Iterable[PodView]) -> list[Mismatch]:
    """The unit rules of ``usage-mismatch`` for one unfinished unit of a batch Job (one pod set):
    ``bound`` are the live pods bound to a node that the job owns. The pod set's count is what the
    Job still needs (from the Job itself), or the unit's count when the Job is unknown."""
    bound = [p for p in bound if p.live and p.bound]
    if unit.phase in TERMINAL:
        return []
    out: list[Mismatch] = []
    pod_sets = sorted(unit.counts.keys() | unit.replicas.keys())
    if not pod_sets:
        return out
    # A batch Job has one pod set: its pods all belong to it.
    main = pod_sets[0]
    for pod_set in pod_sets:
        replicas = max(0, unit.replicas.get(pod_set, 0))
        pods = bound if pod_set == main else []
        count = job.needed if job is not None else unit.counts.get(pod_set, 0)
        where = f"{unit.key} pod set {pod_set!r}"
        if replicas < len(pods):
            out.append(
                Mismatch(
                    "charged-below-running",
                    unit.key,
                    f"{where}: {replicas} admitted replicas but {len(pods)} bound pods "
                    f"({', '.join(p.key for p in pods[:4])})",
                )
            )
        if replicas > max(count, len(pods)):
            out.append(
                Mismatch(
                    "charged-for-unneeded",
                    unit.key,
                    f"{where}: {replicas} admitted replicas but the job needs {count} "
                    f"and {len(pods)} are bound (over-admission)",
                )
            )
        template = unit.per_pod.get(pod_set, {})
        for pod in pods:
            short = {r: v for r, v in pod.request.items() if v > template.get(r, 0)}
            if short:
                out.append(
                    Mismatch(
                        "charged-below-pod-size",
                        unit.key,
                        f"{where}: charged {_fmt(template)} per pod but bound pod {pod.key} "
                        f"requests {_fmt(pod.request)}",
                    )
                )
                break
    return out


def charged(unit: UnitView) -> dict[str, int]:
    """What an unfinished unit's admissions charge: replicas x per-pod request, per pod set."""
    if unit.phase in TERMINAL:
        return {}
    total: dict[str, int] = {}
    for pod_set, n in unit.replicas.items():
        total = add_resources(total, {r: v * max(0, n) for r, v in unit.per_pod.get(pod_set, {}).items()})
    return {r: v for r, v in total.items() if v}


def reserved(unit: UnitView | None) -> dict[str, int]:
    """What a unit's admission reserves for its pods to run within: per pod set, admitted replicas x
    the pod set template's per-pod request, summed; nothing for a missing or finished unit."""
    if unit is None or unit.phase in TERMINAL:
        return {}
    total: dict[str, int] = {}
    for pod_set, n in sorted(unit.replicas.items()):
        total = add_resources(total, {r: v * max(0, n) for r, v in unit.per_pod.get(pod_set, {}).items()})
    return total


def reservation_excess(unit_key: str, unit: UnitView | None, running: Iterable[PodView]) -> str | None:
    """The ``run-without-admission`` rule for a Workflow's unit (pure): what its pods run is judged
    by their summed requests, not by their number, since its admission is a reservation any number of
    step pods run within (docs/compatibility.md#argo-workflow). ``running`` are the pods counted
    for the unit that take node resources (:attr:`PodView.schedulable`: released, or bound, a bound
    pod being deleted included). None when they are within the admission; else what is wrong:

    * pods run while the unit admits nothing (missing, finished, or no admitted replicas), whatever
      their requests (a pod that asks for nothing still runs outside any admission);
    * the summed requests exceed the reservation (:func:`reserved`) for some resource.
    """
    pods = sorted(running, key=lambda p: p.key)
    if not pods:
        return None
    names_ = ", ".join(p.key for p in pods[:4])
    admitted = unit.total if unit is not None and unit.phase not in TERMINAL else 0
    if admitted == 0:
        state = "no QueueUnit" if unit is None else f"{unit.phase or 'pending'} with 0 admitted replicas"
        return f"{unit_key}: {len(pods)} pods run ({names_}) while its unit has {state}"
    limit = reserved(unit)
    used: dict[str, int] = {}
    for pod in pods:
        used = add_resources(used, pod.request)
    over = sorted(r for r, v in used.items() if v > limit.get(r, 0))
    if not over:
        return None
    return (
        f"{unit_key}: {len(pods)} pods run ({names_}) requesting "
        + ", ".join(f"{r}={used[r]}m" for r in over)
        + f" in sum, beyond the {admitted} admitted replicas' reservation {_fmt(limit)}"
    )


def quota_accounting(quota: str, accumulated: Mapping[str, int], units: Iterable[UnitView]) -> list[Mismatch]:
    """The quota rule of ``usage-mismatch``: the usage accumulated admission by admission equals
    the sum over the quota's unfinished units of what their admissions charge."""
    expected: dict[str, int] = {}
    for unit in units:
        if unit.quota == quota:
            expected = add_resources(expected, charged(unit))
    expected = {r: v for r, v in expected.items() if v}
    actual = {r: v for r, v in accumulated.items() if v}
    if expected == actual:
        return []
    return [
        Mismatch(
            "quota-usage-drift",
            quota,
            f"quota {quota}: usage from admissions {_fmt(actual)} but its units charge {_fmt(expected)}",
        )
    ]


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    revision: int
    detail: str


# --- the observer -------------------------------------------------------------------------------


@dataclass
class Observer:
    """Feed it etcd changes with :meth:`apply` (or let :meth:`run` watch etcd itself)."""

    namespaces: frozenset[str]
    units: dict[str, UnitView] = field(default_factory=dict)
    quotas: dict[str, QuotaView] = field(default_factory=dict)
    pods: dict[str, PodView] = field(default_factory=dict)
    jobs: dict[str, JobView] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    violation_counts: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    revision: int = 0
    #: ``ns/name`` of units ever admitted, with their number of admission cycles
    cycles: Counter[str] = field(default_factory=Counter)
    _self_used: dict[str, dict[str, int]] = field(default_factory=dict)
    _pods_by_unit: dict[str, set[str]] = field(default_factory=dict)
    _by_consumer: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _cycle_end: dict[str, str] = field(default_factory=dict)
    _cycle_reclaimed: set[str] = field(default_factory=set)
    _deletion_judged: set[str] = field(default_factory=set)
    #: job uid -> ``ns/name``: the owner-UID chain ``unadmitted-pod-schedulable`` follows
    _job_by_uid: dict[str, str] = field(default_factory=dict)
    #: owner uid -> pod keys (any namespace; a pod counts only in its owner's namespace)
    _pods_by_owner: dict[str, set[str]] = field(default_factory=dict)
    #: unit key -> when (monotonic) its admission last shrank
    _shrunk_at: dict[str, float] = field(default_factory=dict)
    #: job key -> (grace deadline, revision, detail): an excess of schedulable pods seen in the grace
    _suspects: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    #: jobs currently in violation of ``unadmitted-pod-schedulable`` (reported once per episode)
    _in_violation: set[str] = field(default_factory=set)
    #: unit key -> its consumer's kind, kept after the unit is deleted (its pods may outlive it)
    _unit_kinds: dict[str, str] = field(default_factory=dict)
    #: Workflow unit key -> (grace deadline, revision, detail): pods beyond its reservation seen in
    #: the grace after it shrank or was deleted (``run-without-admission``, :func:`reservation_excess`)
    _unit_suspects: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    #: Workflow units currently in violation (reported once per episode)
    _unit_in_violation: set[str] = field(default_factory=set)
    _last_event_at: float = 0.0
    #: jobs whose unit was ever marked for reclaim (preempted)
    preempted_jobs: set[str] = field(default_factory=set)
    #: called with the unit whenever a reclaim mark appears (fault injection hooks in here)
    on_reclaim: list[Callable[[UnitView], None]] = field(default_factory=list)
    _progress: asyncio.Condition | None = None
    #: every unit and quota version replayed, compactly, for post-mortems (:meth:`dump`)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: ``guarantee-unserved`` and ``guarantee-taken`` (:mod:`chaos.guarantee_watch`)
    guarantees: GuaranteeWatch = field(default_factory=GuaranteeWatch)
    #: open fault windows (:meth:`disturb`), since when, and the closed windows' total length
    _disturbed: int = 0
    _disturbed_since: float = 0.0
    _disturbed_total: float = 0.0
    #: the quiet clock (:meth:`quiet_clock`) when the last fault window closed
    quiet_resumed_at: float = -1e9

    # --- fault windows ----------------------------------------------------------------------------

    def disturb(self) -> None:
        """A fault that stops or blinds the reconciler begins (:mod:`chaos.faults` calls this from
        the fault's start until its recovery probe is admitted): nothing can be served meanwhile,
        so the guarantee invariants' quiet clock stops."""
        if self._disturbed == 0:
            self._disturbed_since = time.monotonic()
        self._disturbed += 1

    def undisturb(self) -> None:
        if self._disturbed == 0:
            return
        self._disturbed -= 1
        if self._disturbed == 0:
            self._disturbed_total += time.monotonic() - self._disturbed_since
            self.quiet_resumed_at = self.quiet_clock()

    @property
    def disturbed(self) -> bool:
        return self._disturbed > 0

    def quiet_clock(self) -> float:
        """Monotonic seconds outside fault windows: the time the reconciler had to act."""
        now = time.monotonic()
        open_window = now - self._disturbed_since if self._disturbed else 0.0
        return now - self._disturbed_total - open_window

    # --- bookkeeping ----------------------------------------------------------------------------

    def violate(self, invariant: str, revision: int, detail: str) -> None:
        self.violation_counts[invariant] += 1
        if self.violation_counts[invariant] <= MAX_DETAILS:
            self.violations.append(Violation(invariant, revision, detail))

    def unit_of_job(self, job_key: str) -> UnitView | None:
        namespace, _, name = job_key.partition("/")
        key = self._by_consumer.get(("Job", namespace, name), job_key)
        return self.units.get(key)

    def pods_of(self, unit_key: str) -> list[PodView]:
        return [self.pods[k] for k in sorted(self._pods_by_unit.get(unit_key, ())) if k in self.pods]

    def chain(self, leaf: str) -> tuple[list[str], str | None]:
        """Quota names from ``leaf`` up to the root, and the name at which the walk broke."""
        walked: list[str] = []
        current = leaf
        while current and current != names.ROOT_QUOTA:
            if current in walked:
                return walked, current
            quota = self.quotas.get(current)
            if quota is None:
                return walked, current
            walked.append(current)
            current = quota.parent
        return walked, None

    def usage(self, quota: str) -> dict[str, int]:
        total: dict[str, int] = {}
        for leaf, used in self._self_used.items():
            if quota in self.chain(leaf)[0]:
                total = add_resources(total, used)
        return total

    # --- intake -----------------------------------------------------------------------------------

    def apply(self, key: bytes, value: bytes, revision: int) -> None:
        """One etcd change (``value`` empty on delete)."""
        now = time.monotonic()
        if (self._suspects or self._unit_suspects) and now - self._last_event_at > STALL_S:
            # The stream was silent (etcd paused, watch reconnecting): nothing could be repaired.
            gap = now - self._last_event_at
            self._suspects = {k: (d + gap, r, t) for k, (d, r, t) in self._suspects.items()}
            self._unit_suspects = {k: (d + gap, r, t) for k, (d, r, t) in self._unit_suspects.items()}
        self._last_event_at = now
        self.revision = max(self.revision, revision)
        self.stats["etcd events"] += 1
        try:
            if key.startswith(UNITS):
                self._unit_event(key[len(UNITS) :].decode(), json.loads(value) if value else None, revision)
            elif key.startswith(QUOTAS):
                self._quota_event(key[len(QUOTAS) :].decode(), json.loads(value) if value else None)
            elif key.startswith(PODS):
                self._pod_event(key[len(PODS) :].decode(), decode_pod(value) if value else None, revision)
            elif key.startswith(JOBS):
                self._job_event(key[len(JOBS) :].decode(), decode_job(value) if value else None, revision)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self.stats["undecodable etcd values"] += 1
            self.violate("observer-decode", revision, f"{key.decode(errors='replace')}: {err!r}")
        if self._suspects or self._unit_suspects:
            self._expire(now)
        self.guarantees.flush(self, revision)

    def _in_scope(self, key: str) -> bool:
        return key.split("/", 1)[0] in self.namespaces

    def _quota_event(self, key: str, raw: Mapping[str, Any] | None) -> None:
        name = key.rsplit("/", 1)[-1]
        if raw is None:
            gone = self.quotas.pop(name, None)
            self.guarantees.dirty.update({name, gone.parent if gone is not None else ""} - {""})
            return
        spec = as_map(raw.get("spec"))
        maximum, _ = resource_list(spec.get("max"))
        minimum, _ = resource_list(spec.get("min"))
        labels = as_map(as_map(raw.get("metadata")).get("labels"))
        parent = str(labels.get(names.QUOTA_PARENT_LABEL) or "")
        lends = str(labels.get(names.QUOTA_ALLOW_LENT_LABEL) or "").strip().lower() != "false"
        old = self.quotas.get(name)
        view = QuotaView(name=name, max=maximum, parent=parent, min=minimum, lends=lends)
        self.guarantees.dirty.update({name, parent, old.parent if old is not None else ""} - {""})
        if old is not None:
            view.shrunk_at = old.shrunk_at
            if any(maximum.get(r, 0) < v for r, v in old.max.items()) or (maximum.keys() - old.max.keys()):
                view.shrunk_at = time.monotonic()
                self.stats["quota shrinks observed"] += 1
        self.quotas[name] = view
        self.history.append(
            {
                "rev": self.revision,
                "quota": name,
                "max": maximum,
                "min": minimum,
                "parent": parent,
                "lends": lends,
            }
        )

    def _unit_event(self, key: str, raw: Mapping[str, Any] | None, revision: int) -> None:
        if not self._in_scope(key):
            return
        old = self.units.get(key)
        new = parse_unit(raw) if raw is not None else None
        self.checks["unit versions replayed"] += 1
        if old is not None and old.quota and old.held:
            after = new.held if new is not None and new.quota == old.quota else {}
            if any(after.get(r, 0) < v for r, v in old.held.items()):
                self.guarantees.note_release(self, old.quota)
        if old is not None:
            if old.quota:
                self._self_used[old.quota] = add_resources(self._self_used.get(old.quota, {}), old.held, -1)
            if old.consumer:
                self._by_consumer.pop(old.consumer, None)
        if new is None:
            self.units.pop(key, None)
        else:
            self.units[key] = new
            if new.quota:
                self._self_used[new.quota] = add_resources(self._self_used.get(new.quota, {}), new.held)
            if new.consumer:
                self._by_consumer[new.consumer] = key
        self.history.append(
            {"rev": revision, "unit": key, "deleted": True}
            if new is None
            else {
                "rev": revision,
                "unit": key,
                "quota": new.quota,
                "phase": new.phase,
                "replicas": new.replicas,
                "held": new.held,
                "reclaim": new.reclaim,
                "message": new.message[:120],
            }
        )
        self.guarantees.unit_changed(self, key, old, new)
        self._check_admission(key, old, new, revision)
        if new is not None and new.quota:
            before = old.held if old is not None and old.quota == new.quota else {}
            grown = sorted(r for r, v in new.held.items() if v > before.get(r, 0))
            if grown:
                self._check_quota(new, grown, revision)
                self.guarantees.admitted(self, new, grown, revision)
        shrunk = old is not None and (
            new is None
            or new.total < old.total
            or (new.phase in TERMINAL and old.phase not in TERMINAL)
            or (new.reclaim and not old.reclaim)
            or (
                old.consumer_kind == WORKFLOW
                and any(reserved(new).get(r, 0) < v for r, v in reserved(old).items())
            )
        )
        if shrunk:
            self._shrunk_at[key] = time.monotonic()
        if new is not None and new.consumer_kind:
            self._unit_kinds[key] = new.consumer_kind
        if self._unit_kinds.get(key) == WORKFLOW:
            if shrunk or key in self._unit_suspects or key in self._unit_in_violation:
                self._check_released(key, revision)
        elif old is not None and (new is None or new.total < old.total or new.phase in TERMINAL):
            self._check_released(key, revision)
        job_key = self._job_of_unit(key, old, new)
        if job_key in self.jobs and (shrunk or job_key in self._suspects or job_key in self._in_violation):
            self._check_schedulable(job_key, revision)

    def _check_admission(self, key: str, old: UnitView | None, new: UnitView | None, revision: int) -> None:
        before = old.total if old is not None and old.phase not in TERMINAL else 0
        after = new.total if new is not None and new.phase not in TERMINAL else 0
        if new is not None:
            if new.reclaim and not (old is not None and old.reclaim):
                self.stats["reclaim marks (preemptions)"] += 1
                if new.consumer is not None and new.consumer[0] == "Job":
                    self.preempted_jobs.add(f"{new.consumer[1]}/{new.consumer[2]}")
                for hook in self.on_reclaim:
                    hook(new)
            if new.reclaim:
                self._cycle_reclaimed.add(key)
            for pod_set, n in new.replicas.items():
                previous = old.replicas.get(pod_set, 0) if old is not None else 0
                if n > previous:
                    self.checks["admitted replicas <= pod set count"] += 1
                    count = new.counts.get(pod_set)
                    if count is None or n > count:
                        self.violate(
                            "double-admission",
                            revision,
                            f"{key}: pod set {pod_set!r} has {n} admitted replicas, count {count}",
                        )
            if after > before and new.unreadable:
                self.violate("admitted-unreadable", revision, f"{key}: admitted with an unreadable request")
        if before == 0 and after > 0:
            assert new is not None
            self.checks["admission cycles (once per cycle)"] += 1
            if old is not None and old.phase in TERMINAL:
                self.violate("double-admission", revision, f"{key}: admitted again after {old.phase}")
            if self._cycle_end.get(key) == "unexplained":
                self.violate(
                    "double-admission", revision, f"{key}: admitted again after an unexplained release"
                )
            self.cycles[key] += 1
            self.stats["admissions"] += 1
            if self.cycles[key] > 1:
                self.stats["re-admissions after a release"] += 1
            self._cycle_reclaimed.discard(key)
            if new.reclaim:
                self._cycle_reclaimed.add(key)
        elif before > 0 and after == 0:
            if new is None:
                reason = "deleted"
            elif new.phase in TERMINAL:
                reason = "finished"
            elif key in self._cycle_reclaimed:
                reason = "reclaimed"
            elif new.phase == "TimeoutBackoff":
                reason = "backoff"
            elif not new.active or new.message.startswith("Evicted"):
                reason = "evicted"
            else:
                reason = "unexplained"
                self.stats["unexplained releases"] += 1
            self._cycle_end[key] = reason
            self.stats[f"releases: {reason}"] += 1
            self._cycle_reclaimed.discard(key)

    def _check_quota(self, unit: UnitView, grown: list[str], revision: int) -> None:
        assert unit.quota is not None
        chain, broken = self.chain(unit.quota)
        self.checks["admitted quota chain exists"] += 1
        if broken is not None:
            self.violate(
                "admitted-without-quota",
                revision,
                f"{unit.key}: holds {grown} but quota {broken!r} is missing",
            )
        now = time.monotonic()
        for name in chain:
            quota = self.quotas[name]
            used = self.usage(name)
            self.checks["usage <= max at every level"] += 1
            over = [
                r
                for r in grown
                if (not quota.max and used.get(r, 0) > 0)
                or (r in quota.max and used.get(r, 0) > quota.max[r])
            ]
            if not over:
                continue
            detail = f"{unit.key} admitted: quota {name} uses " + ", ".join(
                f"{r}={used.get(r, 0)}m > max {quota.max.get(r, 0)}m" for r in over
            )
            if now - quota.shrunk_at < SHRINK_GRACE_S:
                self.stats["admissions racing a quota shrink (tolerated)"] += 1
                continue
            self.violate("quota-overrun", revision, detail)

    def _check_released(self, unit_key: str, revision: int, *, final: bool = False) -> None:
        if self._unit_kinds.get(unit_key) == WORKFLOW:
            self._check_reservation(unit_key, revision, final=final)
            return
        released = []
        for pod in self.pods_of(unit_key):
            if not pod.live or pod.gated or not self._claim_holds(pod, unit_key):
                continue
            job = self.jobs.get(pod.job) if pod.job else None
            if pod.job is not None and (job is None or job.deleting or job.suspended):
                continue  # on its way out with its job
            released.append(pod.key)
        if not released:
            return
        self.checks["released pods <= admitted replicas"] += 1
        unit = self.units.get(unit_key)
        admitted = unit.total if unit is not None and unit.phase not in TERMINAL else 0
        if len(released) > admitted:
            self.violate(
                "run-without-admission",
                revision,
                f"{unit_key}: {len(released)} pods released ({', '.join(released[:4])}) "
                f"with {admitted} admitted replicas",
            )

    def _check_reservation(self, unit_key: str, revision: int, *, final: bool = False) -> None:
        """``run-without-admission`` for a Workflow's unit (:func:`reservation_excess`): the pods
        counted for it that take node resources stay within what it admits. Within
        :data:`SCHEDULABLE_GRACE_S` after the unit shrank or was deleted (the Workflow being deleted
        with its pods, or the unit deleted by someone else and re-created by adoption) an excess is
        remembered and judged when the grace has passed, as ``unadmitted-pod-schedulable`` does for
        a Job's pods; ``final``: no grace is left (the run is over)."""
        pending = self._unit_suspects.pop(unit_key, None)
        running = [p for p in self.pods_of(unit_key) if p.schedulable and self._claim_holds(p, unit_key)]
        if running:
            self.checks["running pods of a Workflow within its reservation (summed requests)"] += 1
        detail = reservation_excess(unit_key, self.units.get(unit_key), running)
        if detail is None:
            if pending is not None:
                self.stats["Workflow pods beyond the reservation, repaired within the grace (tolerated)"] += 1
            self._unit_in_violation.discard(unit_key)
            return
        if unit_key in self._unit_in_violation:
            return  # this episode is reported already
        shrunk = self._shrunk_at.get(unit_key, -1e9)
        deadline = max(shrunk + SCHEDULABLE_GRACE_S, pending[0] if pending is not None else -1e9)
        if not final and time.monotonic() < deadline:
            self._unit_suspects[unit_key] = (
                deadline,
                pending[1] if pending is not None else revision,
                detail,
            )
            return
        self._unit_in_violation.add(unit_key)
        self.violate("run-without-admission", pending[1] if pending is not None else revision, detail)

    def _pod_event(self, key: str, raw: Mapping[str, Any] | None, revision: int) -> None:
        if not self._in_scope(key):
            return
        old = self.pods.get(key)
        new = parse_pod(raw) if raw is not None else None
        state = new if new is not None else old
        if state is not None and key not in self._deletion_judged and (new is None or new.deleting):
            self._deletion_judged.add(key)
            self._judge_deletion(old if new is None else new, revision)
        if new is None:
            self.pods.pop(key, None)
            if old is not None:
                self._touch_owners(old)
            if old is not None and old.unit:
                self._pods_by_unit.get(old.unit, set()).discard(key)
            for uid in old.owner_uids if old is not None else ():
                self._pods_by_owner.get(uid, set()).discard(key)
            self._deletion_judged.discard(key)
            if old is not None and old.schedulable:
                self._recheck_owners(old, revision)
                self._recheck_reservation(old, revision)
            return
        self.pods[key] = new
        if old is None or old.bound != new.bound or old.live != new.live:
            self._touch_owners(new)
        if new.unit:
            self._pods_by_unit.setdefault(new.unit, set()).add(key)
            if (old is None or old.unit != new.unit) and not self._claim_holds(new, new.unit):
                self.stats["pods naming a unit they do not belong to (ignored)"] += 1
        for uid in set(old.owner_uids if old is not None else ()) - set(new.owner_uids):
            self._pods_by_owner.get(uid, set()).discard(key)
        for uid in new.owner_uids:
            self._pods_by_owner.setdefault(uid, set()).add(key)
            owner = self.jobs.get(self._job_by_uid.get(uid, ""))
            if old is None and owner is not None and owner.namespace != new.namespace:
                self.stats["pods claiming a job of another namespace (ignored)"] += 1
        if new.bound and not (old is not None and old.bound):
            self.stats["pods bound"] += 1
        changed = old is None or old.gated or not old.live or (new.bound and not old.bound)
        if new.live and not new.gated and new.unit and changed:
            self._check_released(new.unit, revision)
        if new.schedulable and (old is None or not old.schedulable or (new.bound and not old.bound)):
            for uid in new.owner_uids:
                job_key = self._job_by_uid.get(uid)
                if job_key is not None:
                    self._check_schedulable(job_key, revision)
        elif old is not None and old.schedulable and not new.schedulable:
            self._recheck_owners(old, revision)
            self._recheck_reservation(old, revision)

    def _recheck_reservation(self, pod: PodView, revision: int) -> None:
        """A pod stopped taking node resources: settle its Workflow unit's pending or reported excess."""
        if pod.unit and (pod.unit in self._unit_suspects or pod.unit in self._unit_in_violation):
            self._check_released(pod.unit, revision)

    def _touch_owners(self, pod: PodView) -> None:
        """A pod started or stopped running: what its job's unit can give back to reclaim changed."""
        for uid in pod.owner_uids:
            job_key = self._job_by_uid.get(uid)
            unit = self.unit_of_job(job_key) if job_key is not None else None
            if unit is not None and unit.quota:
                self.guarantees.touch(self, unit.quota)

    def _judge_deletion(self, pod: PodView | None, revision: int) -> None:
        if pod is None or pod.terminal:
            return
        unit = self.units.get(pod.unit) if pod.unit and self._claim_holds(pod, pod.unit) else None
        job = self.jobs.get(pod.job) if pod.job else None
        reclaiming = unit is not None and unit.reclaim
        self.checks["pod deletions judged (bound pods never reclaimed)"] += 1
        if not pod.bound:
            if reclaiming:
                self.stats["unbound pods deleted by reclaim"] += 1
            return
        job_alive = job is not None and not job.deleting and not job.suspended
        if reclaiming and job_alive:
            self.violate(
                "bound-pod-reclaimed",
                revision,
                f"bound pod {pod.key} deleted while {pod.unit} is being reclaimed",
            )
        else:
            self.stats["bound pods deleted with their job"] += 1

    def _job_event(self, key: str, raw: Mapping[str, Any] | None, revision: int) -> None:
        if not self._in_scope(key):
            return
        old = self.jobs.get(key)
        new = parse_job(raw) if raw is not None else None
        if new is None:
            self.jobs.pop(key, None)
            if old is not None and self._job_by_uid.get(old.uid) == key:
                del self._job_by_uid[old.uid]
            self._suspects.pop(key, None)
            self._in_violation.discard(key)
            return
        self.jobs[key] = new
        if new.uid:
            self._job_by_uid[new.uid] = key
        if new.finished and not (old is not None and old.finished):
            self.stats[f"jobs {new.finished.lower()}"] += 1
            if new.finished == "Failed" and key in self.preempted_jobs:
                self.violate(
                    "job-failed-by-preemption",
                    revision,
                    f"job {key} ended Failed ({new.reason}) after its pods were reclaimed by a preemption",
                )
        running = new.managed and not new.suspended and not new.finished and not new.deleting
        joined = old is not None and not old.managed  # labelled into a queue
        if running and new.claims_parent and (old is None or old.suspended or joined):
            # Let in unsuspended with its template gated until the claim is resolved: its pods,
            # not the Job, are what could run (``unadmitted-pod-schedulable`` judges them).
            self.stats["jobs claiming a parent, judged by their pods"] += 1
        elif running and (old is None or old.suspended or joined):
            self.checks["job resumed only while admitted"] += 1
            unit = self.unit_of_job(key)
            if unit is None or unit.total == 0 or unit.phase in TERMINAL:
                state = "no QueueUnit" if unit is None else f"unit {unit.phase or 'pending'}, 0 admitted"
                how = "was labelled into a queue while running" if joined else "runs unsuspended"
                self.violate("run-without-admission", revision, f"job {key} {how} with {state}")
        if (
            old is None
            or old.managed != new.managed
            or old.suspended != new.suspended
            or old.deleting != new.deleting
            or old.uid != new.uid
            or key in self._suspects
            or key in self._in_violation
        ):
            self._check_schedulable(key, revision)

    # --- unadmitted-pod-schedulable ---------------------------------------------------------------

    def owned_pods(self, job: JobView) -> list[PodView]:
        """The pods ``job`` owns: an owner reference with its UID, in its namespace (owner references
        are namespace-local: a UID copied into a pod elsewhere owns nothing)."""
        out = []
        for key in sorted(self._pods_by_owner.get(job.uid, ())):
            pod = self.pods.get(key)
            if pod is not None and pod.namespace == job.namespace:
                out.append(pod)
        return out

    def _claim_holds(self, pod: PodView, unit_key: str) -> bool:
        """The product may count ``pod`` for the unit its annotation names: same namespace, and owned
        by the unit's Job (its UID) when the unit has one."""
        if pod.namespace != unit_key.partition("/")[0]:
            return False
        unit = self.units.get(unit_key)
        consumer = unit.consumer if unit is not None else None
        if consumer is None or consumer[0] != "Job":
            return True
        job = self.jobs.get(f"{consumer[1]}/{consumer[2]}")
        return job is None or not job.uid or job.uid in pod.owner_uids

    def _job_of_unit(self, key: str, old: UnitView | None, new: UnitView | None) -> str:
        view = new if new is not None else old
        if view is not None and view.consumer is not None and view.consumer[0] == "Job":
            return f"{view.consumer[1]}/{view.consumer[2]}"
        return key

    def _recheck_owners(self, pod: PodView, revision: int) -> None:
        """A schedulable pod went away: settle its job's pending or reported excess."""
        for uid in pod.owner_uids:
            job_key = self._job_by_uid.get(uid)
            if job_key is not None and (job_key in self._suspects or job_key in self._in_violation):
                self._check_schedulable(job_key, revision)

    def _check_schedulable(self, job_key: str, revision: int, *, final: bool = False) -> None:
        """``unadmitted-pod-schedulable`` for one job (see the module docstring); ``final``: no grace
        is left (the run is over)."""
        job = self.jobs.get(job_key)
        pending = self._suspects.pop(job_key, None)
        excess: list[PodView] = []
        unit: UnitView | None = None
        admitted = 0
        if job is not None and job.managed and job.uid and not job.deleting and not job.suspended:
            pods = [p for p in self.owned_pods(job) if p.schedulable]
            if pods:
                unit = self.unit_of_job(job_key)
                admitted = unit.total if unit is not None and unit.phase not in TERMINAL else 0
                self.checks["schedulable pods of a managed job <= admitted (by owner UID)"] += 1
                if len(pods) > admitted:
                    excess = pods
        if not excess:
            if pending is not None:
                self.stats["schedulable pods above admission, repaired within the grace (tolerated)"] += 1
            self._in_violation.discard(job_key)
            return
        if job_key in self._in_violation:
            return  # this episode is reported already
        bound = sum(1 for p in excess if p.bound)
        state = (
            "no QueueUnit"
            if unit is None
            else f"unit {unit.key} {unit.phase or 'pending'} with {admitted} admitted replicas"
        )
        detail = (
            f"job {job_key}: {len(excess)} schedulable pods ({bound} bound; "
            f"{', '.join(p.key for p in excess[:4])}) with {state}"
        )
        shrunk = self._shrunk_at.get(unit.key if unit is not None else job_key, -1e9)
        deadline = max(shrunk + SCHEDULABLE_GRACE_S, pending[0] if pending is not None else -1e9)
        if not final and time.monotonic() < deadline:
            self._suspects[job_key] = (deadline, pending[1] if pending is not None else revision, detail)
            return
        self._in_violation.add(job_key)
        self.violate("unadmitted-pod-schedulable", pending[1] if pending is not None else revision, detail)

    def _expire(self, now: float) -> None:
        for job_key, (deadline, _, _) in list(self._suspects.items()):
            if deadline <= now:
                self._check_schedulable(job_key, self.revision)
        for unit_key, (deadline, _, _) in list(self._unit_suspects.items()):
            if deadline <= now:
                self._check_released(unit_key, self.revision)

    def finish(self) -> None:
        """The run is over: judge every excess still waiting for its grace."""
        for job_key in list(self._suspects):
            self._check_schedulable(job_key, self.revision, final=True)
        for unit_key in list(self._unit_suspects):
            self._check_released(unit_key, self.revision, final=True)
        self.guarantees.finish(self)

    # --- usage-mismatch (judged at quiescent points by :func:`settle`) ----------------------------

    def accounting_mismatches(self) -> list[Mismatch]:
        """Every current ``usage-mismatch`` (unit and quota rules), counting the evaluations."""
        out: list[Mismatch] = []
        for _, unit in sorted(self.units.items()):
            if unit.phase in TERMINAL or unit.consumer is None or unit.consumer[0] != "Job":
                continue
            job = self.jobs.get(f"{unit.consumer[1]}/{unit.consumer[2]}")
            if job is None or not job.managed or not job.uid or job.deleting or job.suspended:
                continue  # unknown, or its pods are on their way out
            bound = [p for p in self.owned_pods(job) if p.live and p.bound]
            if any(not p.request for p in bound):
                self.stats["usage-mismatch: bound pods with no readable request"] += 1
            self.checks["usage charged = held: units judged"] += 1
            out += unit_accounting(unit, job, bound)
            out += self._outside_its_job(unit.key, job)
        for quota in sorted(self._self_used.keys() | {u.quota for u in self.units.values() if u.quota}):
            self.checks["usage charged = held: quota sums judged"] += 1
            units = (u for u in self.units.values() if u.quota == quota)
            out += quota_accounting(quota, self._self_used.get(quota, {}), units)
        return out

    def _outside_its_job(self, unit_key: str, job: JobView) -> list[Mismatch]:
        """``released-pod-outside-its-job``: a live pod out of the admission gate, in the unit's
        namespace and naming the unit, that the live Job does not own (its controller let go of it
        after a relabel, or it was made by hand). Nothing charges what it holds, and the Job's
        replacement takes its place in the admission."""
        outside = [
            p.key
            for p in self.pods_of(unit_key)
            if p.live and not p.gated and p.namespace == job.namespace and job.uid not in p.owner_uids
        ]
        if not outside:
            return []
        detail = f"{unit_key}: released pods naming it that its Job does not own: {', '.join(outside[:4])}"
        return [Mismatch("released-pod-outside-its-job", unit_key, detail)]

    def dump(self, path: Path) -> None:
        """Write :attr:`history` as JSON lines (post-mortem of a violation)."""
        with path.open("w") as out:
            for entry in self.history:
                out.write(json.dumps(entry, sort_keys=True) + "\n")

    # --- watching etcd ----------------------------------------------------------------------------

    async def run(self, etcd: Etcd) -> None:
        """Load the current state, then follow every change; reconnects (and relists on a
        compaction) forever. Cancel to stop."""
        self._progress = asyncio.Condition()
        kvs, revision = await etcd.range(WATCH_START, WATCH_END)
        self._load(kvs, revision)
        while True:
            try:
                async for event in etcd.watch(WATCH_START, WATCH_END, start_revision=self.revision + 1):
                    self.apply(event.key, event.value if event.type == "PUT" else b"", event.revision)
                    async with self._progress:
                        self._progress.notify_all()
            except Compacted:
                self.stats["observer relists after a compaction (history gap)"] += 1
                kvs, revision = await etcd.range(WATCH_START, WATCH_END)
                self._load(kvs, revision, relist=True)
            except (aiohttp.ClientError, RuntimeError, TimeoutError, ValueError):
                self.stats["observer watch reconnects"] += 1
                await asyncio.sleep(0.5)
            except Exception as err:  # never die silently: the checks would go stale
                self.stats["observer watch errors"] += 1
                self.violate("observer-failed", self.revision, f"watch failed: {err!r}; resuming")
                await asyncio.sleep(0.5)

    def _load(self, kvs: Iterable[KeyValue], revision: int, *, relist: bool = False) -> None:
        present = set()
        for kv in sorted(kvs, key=lambda kv: kv.mod_revision):
            present.add(kv.key)
            self.apply(kv.key, kv.value, kv.mod_revision)
        if relist:
            known = [UNITS + k.encode() for k in self.units] + [PODS + k.encode() for k in self.pods]
            known += [JOBS + k.encode() for k in self.jobs]
            for key in known:
                if key not in present:
                    self.apply(key, b"", revision)
        self.revision = max(self.revision, revision)
        # Objects arrive in mod-revision order, so a pod may have come before its job: judge all.
        for job_key in list(self.jobs):
            self._check_schedulable(job_key, self.revision)

    async def sync(self, etcd: Etcd, *, timeout: float = 30.0) -> bool:
        """Write the sentinel and wait until the watch has delivered it: every change up to now
        has been replayed. False when etcd or the watch did not answer in time."""
        try:
            target = await etcd.put(SENTINEL, str(time.time()).encode(), timeout=timeout)
        except (aiohttp.ClientError, RuntimeError, TimeoutError):
            return False
        assert self._progress is not None, "run() is not running"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self.revision >= target)
        return self.revision >= target


# --- convergence ------------------------------------------------------------------------------------


@dataclass
class Settled:
    """The outcome of one :func:`settle`: what persisted for the whole window, what went away."""

    persisted: list[Mismatch]
    transient: int
    seconds: float


async def settle(
    current: Callable[[], Awaitable[list[Mismatch]]],
    *,
    window: float,
    interval: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Settled:
    """Poll ``current`` until no mismatch has been present at every poll since the first, or
    ``window`` seconds have passed: a mismatch is reported only if it persisted throughout (by its
    rule and subject), those that went away are counted as transient."""
    begun = clock()
    first = await current()
    persisting = {m.key: m for m in first}
    seen = set(persisting)
    while persisting and clock() - begun < window:
        await sleep(interval)
        now = {m.key: m for m in await current()}
        seen |= now.keys()
        persisting = {k: now[k] for k in persisting if k in now}
    return Settled(list(persisting.values()), len(seen - persisting.keys()), round(clock() - begun, 1))

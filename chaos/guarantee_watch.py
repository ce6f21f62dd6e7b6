"""The observer's quota-guarantee invariants (docs/compatibility.md#quota-guarantees and
docs/compatibility.md#reclaim-across-quotas), judged from what etcd shows.

Independent of the scheduler on purpose, like the rest of :mod:`chaos.observer`: everything below
is computed from the QueueUnits, ElasticQuotas, Jobs and Pods the observer replays (its own usage
sums, its own reading of ``min``, ``max``, the parent label and ``allow-lent-resource``, running
pods counted from the pods themselves as well as from the reports), never from
``shared.core.guarantees``. So a wrong share, a missed wake-up or a reclaim that never starts
shows here even when the scheduler's own arithmetic agrees with itself.

``guarantee-unserved``
    A quota below a parent quota that has a waiting unit which fits within its ``min`` (its usage
    plus the unit's remaining request stays within ``min`` for every resource ``min`` names; the
    resources ``min`` does not name are guaranteed nothing, so they must simply be free) is
    *unserved* while either the unit fits now (``max`` at every level has room) or the only
    shortfall is at the parent, on guaranteed resources, and the borrowing siblings (those above
    their ``min`` on a short resource) hold enough capacity that is not running (admitted replicas
    beyond the bound pods and beyond the reported running ones, the larger of the two) or is
    already being reclaimed, taking no sibling below its ``min`` on a short resource, with victims
    taken in the reclaim order (lowest priority, then newest). Each such unit is judged on its own:
    its state must end, by its own admission or by the state going away, within
    :data:`GUARANTEE_ROUND_S` seconds of *quiet* time. The admission of another unit of the quota
    does not end it: a smaller unit admitted while a within-``min`` one keeps waiting is the very
    refusal the rule exists to see (docs/compatibility.md#quota-guarantees). The clock stops while
    a fault that stops or blinds the reconciler is open (:meth:`chaos.observer.Observer.disturb`,
    from the fault's start until its recovery probe is admitted), since nothing can be served
    meanwhile.
``guarantee-taken``
    At every admission seen in etcd, for each level of the unit's chain that has a parent quota:
    if the admission leaves the quota above its ``min`` on a resource it grew (it *borrows*), the
    parent's free capacity on that resource must still cover what every other child claims: a
    child that does not lend claims its whole unused ``min``; a child that lends claims the part of
    its ``min`` its waiting units that fit would use (in queue order, each unit whole or not at
    all). An admission within the quota's own ``min`` is not judged: the tree rules make the
    children's ``min`` add up to no more than the parent's, so when the parent is short a borrower
    holds the difference, and returning it is what ``guarantee-unserved`` judges.

    Decisions are taken on the reconciler's view, which trails etcd: a claim counts only for a
    waiting unit that has waited :data:`CLAIM_GRACE_S` seconds of quiet time and carries a status
    message (the reconciler has seen it), and a sibling whose usage dropped within the grace
    claims from the larger usage of that window (its freed ``min`` may not be seen yet). An
    admission landing while a fault is open, or within the grace after it closed, is counted as
    tolerated, not judged.

Only the quota of a unit's own label is judged as a child (units of a deeper quota count in its
ancestors' usage, as everywhere in the observer).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chaos.views import JobView, PodView, QuotaView, UnitView

#: One reclaim round, in quiet seconds: the scheduler marks the victims (a status write), the job
#: extension removes each unbound pod's finalizer and deletes it, then lowers the victim's replicas
#: (a status write), the scheduler sees the release and admits the waiting unit (a status write).
#: See RELIABILITY.md ("What runs") for how the bound was chosen.
GUARANTEE_ROUND_S = 15.0
#: How far the reconciler's view may trail etcd when it decides an admission (quiet seconds).
CLAIM_GRACE_S = 2.0

UNSERVED = "guarantee-unserved"
TAKEN = "guarantee-taken"
TERMINAL = frozenset({"Succeed", "Failed"})


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _scale(a: Mapping[str, int], n: int) -> dict[str, int]:
    return {r: v * n for r, v in a.items()}


def covers(have: Mapping[str, int], need: Mapping[str, int]) -> bool:
    return all(have.get(r, 0) >= v for r, v in need.items())


def fmt(resources: Mapping[str, int]) -> str:
    return ",".join(f"{r}={v}m" for r, v in sorted(resources.items()) if v) or "nothing"


def queue_order(units: Iterable[UnitView]) -> list[UnitView]:
    """The order a Priority queue serves its units: higher priority, then older, then name."""
    return sorted(units, key=lambda u: (-u.priority, u.created, u.key))


def victim_order(units: Iterable[UnitView]) -> list[UnitView]:
    """The order reclaim takes victims in: lowest priority first, then the most recently admitted,
    then the newest (equal times: the later name first)."""
    by_name = sorted(units, key=lambda u: u.key, reverse=True)
    return sorted(by_name, key=lambda u: (u.priority, -(u.allocated or 0.0), -u.created))


class Replay(Protocol):
    """What the watch reads from the observer's replay of etcd and how it reports; the one
    implementation is :class:`chaos.observer.Observer`. A protocol rather than an import, so the
    dependency runs one way (the observer holds the watch and calls its hooks)."""

    @property
    def units(self) -> Mapping[str, UnitView]: ...
    @property
    def quotas(self) -> Mapping[str, QuotaView]: ...
    @property
    def jobs(self) -> Mapping[str, JobView]: ...
    @property
    def checks(self) -> Counter[str]: ...
    @property
    def stats(self) -> Counter[str]: ...
    @property
    def revision(self) -> int: ...
    @property
    def disturbed(self) -> bool: ...
    @property
    def quiet_resumed_at(self) -> float: ...
    def quiet_clock(self) -> float: ...
    def chain(self, leaf: str) -> tuple[list[str], str | None]: ...
    def usage(self, quota: str) -> dict[str, int]: ...
    def owned_pods(self, job: JobView) -> list[PodView]: ...
    def violate(self, invariant: str, revision: int, detail: str) -> None: ...


@dataclass
class _Candidate:
    unit: UnitView
    borrower: str
    resources: dict[str, int]


@dataclass
class GuaranteeWatch:
    """The state behind the two invariants; the :class:`~chaos.observer.Observer` calls the hooks."""

    #: quota -> keys of the units labelled with it
    by_quota: dict[str, set[str]] = field(default_factory=dict)
    #: unit key -> quiet clock when its current waiting spell began
    waiting_since: dict[str, float] = field(default_factory=dict)
    #: quota -> (quiet clock of its last usage drop, the largest usage before the drops of the grace)
    peaks: dict[str, tuple[float, dict[str, int]]] = field(default_factory=dict)
    #: quotas whose children need a fresh ``guarantee-unserved`` judgement
    dirty: set[str] = field(default_factory=set)
    #: waiting unit key -> (quiet clock when it became unserved, revision, why, its quota)
    unserved: dict[str, tuple[float, int, str, str]] = field(default_factory=dict)
    #: units whose current unserved episode is reported already
    reported: set[str] = field(default_factory=set)
    #: the longest wait (quiet seconds) that ended with an admission of the waiting quota
    longest_served: float = 0.0

    # --- hooks ------------------------------------------------------------------------------------

    def note_release(self, o: Replay, quota: str) -> None:
        """Usage under ``quota`` is about to drop: remember what it was (see ``guarantee-taken``)."""
        now = o.quiet_clock()
        for name in o.chain(quota)[0]:
            used = o.usage(name)
            previous = self.peaks.get(name)
            if previous is not None and now - previous[0] < CLAIM_GRACE_S:
                used = {r: max(used.get(r, 0), previous[1].get(r, 0)) for r in used.keys() | previous[1]}
            self.peaks[name] = (now, used)

    def unit_changed(self, o: Replay, key: str, old: UnitView | None, new: UnitView | None) -> None:
        if old is not None and old.quota and (new is None or new.quota != old.quota):
            self.by_quota.get(old.quota, set()).discard(key)
        if new is not None and new.quota:
            self.by_quota.setdefault(new.quota, set()).add(key)
        if new is not None and new.reclaim and not (old is not None and old.reclaim) and new.quota:
            quota = o.quotas.get(new.quota)
            parent = quota.parent if quota is not None else ""
            if parent in o.quotas and any(any(c.min.values()) for c in self.children(o, parent)):
                o.stats["guarantee trees: reclaim marks (units below a parent with guaranteed children)"] += 1
        if new is not None and new.waiting:
            if old is None or not old.waiting:
                self.waiting_since[key] = o.quiet_clock()
        else:
            self.waiting_since.pop(key, None)
        for view in (old, new):
            if view is not None and view.quota:
                self.touch(o, view.quota)

    def touch(self, o: Replay, quota: str) -> None:
        """Something under ``quota`` changed: judge again the children of every quota on its chain."""
        self.dirty.update(o.chain(quota)[0])

    def flush(self, o: Replay, revision: int, *, final: bool = False) -> None:
        """Judge what changed, then report the unserved states that outlived the bound."""
        if self.dirty:
            dirty, self.dirty = self.dirty, set()
            parents = {q.parent for q in o.quotas.values() if q.parent}
            for name in sorted(dirty & parents):
                self.evaluate(o, name, revision)
        self.expire(o, final=final)

    def finish(self, o: Replay) -> None:
        """The run is over: judge every tree once more and report what is still unserved."""
        self.dirty.update(o.quotas)
        self.flush(o, o.revision, final=True)

    # --- shared arithmetic ------------------------------------------------------------------------

    def children(self, o: Replay, parent: str) -> list[QuotaView]:
        return sorted((q for q in o.quotas.values() if q.parent == parent), key=lambda q: q.name)

    def waiting_units(self, o: Replay, quota: str) -> list[UnitView]:
        units = (o.units.get(k) for k in self.by_quota.get(quota, ()))
        return queue_order(u for u in units if u is not None and u.active and u.waiting)

    def running(self, o: Replay, unit: UnitView) -> dict[str, int]:
        """Per admission, the pods that run: the job extension's report, or the live bound pods
        the unit's Job owns when more (a batch Job has one pod set)."""
        out = dict(unit.running)
        if unit.consumer is not None and unit.consumer[0] == "Job" and len(unit.replicas) == 1:
            job = o.jobs.get(f"{unit.consumer[1]}/{unit.consumer[2]}")
            if job is not None and job.uid:
                bound = sum(1 for p in o.owned_pods(job) if p.live and p.bound)
                name = next(iter(unit.replicas))
                out[name] = max(out.get(name, 0), bound)
        return out

    # --- guarantee-unserved -----------------------------------------------------------------------

    def evaluate(self, o: Replay, parent_name: str, revision: int) -> None:
        parent = o.quotas.get(parent_name)
        now = o.quiet_clock()
        for child in self.children(o, parent_name):
            reasons = self.unserved_reasons(o, child, parent) if parent is not None else {}
            for key in [k for k, e in self.unserved.items() if e[3] == child.name and k not in reasons]:
                del self.unserved[key]
                self.reported.discard(key)
            for key, reason in sorted(reasons.items()):
                o.checks["guarantee-unserved: states judged (waiting within min, room or reclaimable)"] += 1
                current = self.unserved.get(key)
                if current is None:
                    o.stats["guarantee-unserved: episodes (waiting within min, room or reclaimable)"] += 1
                    self.unserved[key] = (now, revision, reason, child.name)
                else:
                    self.unserved[key] = (current[0], current[1], reason, child.name)

    def unserved_reasons(self, o: Replay, child: QuotaView, parent: QuotaView) -> dict[str, str]:
        """Per waiting unit of ``child`` that should be served now (it fits within the ``min`` and
        fits, or reclaim could make it fit), why."""
        out: dict[str, str] = {}
        mins = {r: v for r, v in child.min.items() if v > 0}
        if not mins:
            return out
        chain, broken = o.chain(child.name)
        if broken is not None or len(chain) < 2:
            return out
        used = {name: o.usage(name) for name in chain}
        for unit in self.waiting_units(o, child.name):
            request = unit.remaining
            named = {r: v for r, v in request.items() if r in mins}
            if not named or any(used[child.name].get(r, 0) + v > mins[r] for r, v in named.items()):
                continue
            short: dict[str, dict[str, int]] = {}
            for name in chain:
                limits = o.quotas[name].max
                lack = {
                    r: used[name].get(r, 0) + v - limits[r]
                    for r, v in request.items()
                    if r in limits and used[name].get(r, 0) + v > limits[r]
                }
                if lack or (not limits and request):
                    short[name] = lack or dict(request)
            within = (
                f"{unit.key} (asks {fmt(request)}) fits within the min of {child.name} "
                f"(uses {fmt(used[child.name])}, min {fmt(mins)})"
            )
            if not short:
                out[unit.key] = f"{within} and every level has room"
                continue
            need = short.get(parent.name)
            if set(short) != {parent.name} or need is None or any(r not in mins for r in need):
                continue  # only a shortfall of guaranteed resources at the parent can be reclaimed
            found = self.reclaimable(o, parent.name, child.name, need)
            if found is not None:
                out[unit.key] = f"{within}; {parent.name} is short {fmt(need)}, {found}"
        return out

    def reclaimable(self, o: Replay, parent: str, child: str, need: Mapping[str, int]) -> str | None:
        """A description of the borrowed capacity that reclaim can return toward ``need`` when it
        covers it, else None."""
        freed: dict[str, int] = {}
        usage: dict[str, dict[str, int]] = {}
        floors: dict[str, dict[str, int]] = {}
        candidates: dict[str, _Candidate] = {}
        for sibling in self.children(o, parent):
            if sibling.name == child:
                continue
            used = o.usage(sibling.name)
            if not any(used.get(r, 0) > sibling.min.get(r, 0) for r in need):
                continue
            on_the_way: dict[str, int] = {}
            for name in sorted(q for q in o.quotas if sibling.name in o.chain(q)[0]):
                for key in sorted(self.by_quota.get(name, ())):
                    unit = o.units.get(key)
                    if unit is None or unit.phase in TERMINAL:
                        continue
                    running = self.running(o, unit)
                    idle: dict[str, int] = {}
                    for pod_set, replicas in unit.replicas.items():
                        spare = replicas - running.get(pod_set, 0)
                        if spare <= 0:
                            continue
                        per_pod = unit.per_pod.get(pod_set, {})
                        if pod_set in unit.reclaiming:
                            on_the_way = _add(
                                on_the_way, _scale(per_pod, min(spare, unit.reclaiming[pod_set]))
                            )
                        elif not unit.reclaim:
                            idle = _add(idle, _scale(per_pod, spare))
                    if idle:
                        candidates[key] = _Candidate(unit, sibling.name, idle)
            freed = _add(freed, on_the_way)
            # What is on its way out no longer protects the sibling's min.
            usage[sibling.name] = {r: v - on_the_way.get(r, 0) for r, v in used.items()}
            floors[sibling.name] = sibling.min
        if not usage:
            return None
        total = dict(freed)
        taken: dict[str, dict[str, int]] = {}
        victims: list[str] = []
        for unit in victim_order(c.unit for c in candidates.values()):
            if covers(total, need):
                break
            candidate = candidates[unit.key]
            name, res = candidate.borrower, candidate.resources
            left = {r: usage[name].get(r, 0) - taken.get(name, {}).get(r, 0) - v for r, v in res.items()}
            if any(left[r] < floors[name].get(r, 0) for r, v in res.items() if r in need and v > 0):
                continue
            taken[name] = _add(taken.get(name, {}), res)
            total = _add(total, res)
            victims.append(unit.key)
        if not covers(total, need):
            return None
        return (
            f"borrowers {', '.join(sorted(usage))} can return {fmt(total)} "
            f"({fmt(freed)} already being reclaimed; not running: {', '.join(victims[:4]) or 'none needed'})"
        )

    def expire(self, o: Replay, *, final: bool = False) -> None:
        now = o.quiet_clock()
        for key, (since, revision, reason, _) in sorted(self.unserved.items()):
            waited = now - since
            if key in self.reported or waited <= GUARANTEE_ROUND_S:
                continue
            self.reported.add(key)
            o.violate(
                UNSERVED,
                revision,
                f"{reason}; unserved for {waited:.0f} s of quiet time (bound {GUARANTEE_ROUND_S:.0f} s), "
                f"still at revision {o.revision}{' at the end of the run' if final else ''}",
            )

    # --- guarantee-taken --------------------------------------------------------------------------

    def used_then(self, o: Replay, name: str, now: float) -> dict[str, int]:
        """The usage of ``name``, or the larger usage it had within the grace."""
        used = o.usage(name)
        peak = self.peaks.get(name)
        if peak is None or now - peak[0] >= CLAIM_GRACE_S:
            return used
        return {r: max(used.get(r, 0), peak[1].get(r, 0)) for r in used.keys() | peak[1]}

    def claim(self, o: Replay, child: QuotaView, now: float) -> dict[str, int]:
        """What ``child``'s ``min`` still claims of its parent (see ``guarantee-taken``)."""
        mins = {r: v for r, v in child.min.items() if v > 0}
        if not mins:
            return {}
        used = self.used_then(o, child.name, now)
        room = {r: v - used.get(r, 0) for r, v in mins.items()}
        if not child.lends:
            return {r: v for r, v in room.items() if v > 0}
        total: dict[str, int] = {}
        for unit in self.waiting_units(o, child.name):
            since = self.waiting_since.get(unit.key)
            if not unit.message or since is None or now - since < CLAIM_GRACE_S:
                continue
            named = {r: v for r, v in unit.remaining.items() if r in room}
            if named and all(total.get(r, 0) + v <= room[r] for r, v in named.items()):
                total = _add(total, named)
        return total

    def admitted(self, o: Replay, unit: UnitView, grown: list[str], revision: int) -> None:
        """``unit``'s held resources grew (an admission): its own wait was served (another unit of
        its quota still waiting stays judged), and ``guarantee-taken`` is judged at every level with
        a parent quota."""
        assert unit.quota is not None
        chain, broken = o.chain(unit.quota)
        now = o.quiet_clock()
        episode = self.unserved.pop(unit.key, None)
        self.reported.discard(unit.key)
        if episode is not None:
            o.stats["guarantee-unserved: episodes ended by an admission"] += 1
            self.longest_served = max(self.longest_served, now - episode[0])
        if broken is not None:
            return
        for name, parent_name in itertools.pairwise(chain):
            quota, parent = o.quotas[name], o.quotas[parent_name]
            used = o.usage(name)
            borrowing = [r for r in grown if used.get(r, 0) > quota.min.get(r, 0)]
            if not borrowing:
                continue
            claims: dict[str, int] = {}
            by_sibling: dict[str, dict[str, int]] = {}
            siblings = self.children(o, parent_name)
            for sibling in siblings:
                if sibling.name != name:
                    claim = self.claim(o, sibling, now)
                    if any(claim.values()):
                        by_sibling[sibling.name] = claim
                        claims = _add(claims, claim)
            if not claims:
                continue
            o.checks["guarantee-taken: borrowing admissions judged against siblings' min claims"] += 1
            parent_used = o.usage(parent_name)
            short = {
                r: parent.max[r] - parent_used.get(r, 0)
                for r in borrowing
                if r in parent.max and claims.get(r, 0) > parent.max[r] - parent_used.get(r, 0)
            }
            if not short:
                continue
            guaranteed = {r: sum(s.min.get(r, 0) for s in siblings) for r in short}
            if any(guaranteed[r] > parent.max[r] for r in short):
                o.stats["guarantee-taken: children's min above the parent's max (not judged)"] += 1
                continue
            if o.disturbed or now - o.quiet_resumed_at < CLAIM_GRACE_S:
                o.stats["guarantee-taken: during a fault or within the grace after it (tolerated)"] += 1
                continue
            if time.monotonic() - parent.shrunk_at < CLAIM_GRACE_S:
                o.stats["guarantee-taken: racing a parent shrink (tolerated)"] += 1
                continue
            o.violate(
                TAKEN,
                revision,
                f"{unit.key} admitted: {name} borrows ({fmt({r: used.get(r, 0) for r in borrowing})} "
                f"> min {fmt({r: quota.min.get(r, 0) for r in borrowing})}) leaving {parent_name} "
                f"{fmt(short)} free, but "
                + "; ".join(
                    f"{s} claims {fmt(c)}" + ("" if o.quotas[s].lends else " (does not lend)")
                    for s, c in sorted(by_sibling.items())
                ),
            )

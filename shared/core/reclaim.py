"""Reclaim across quotas: ``min`` holds against siblings that borrowed it
(docs/compatibility.md#reclaim-across-quotas).

A unit that fits within its quota's ``min`` at its own level (and upward while that holds) but does
not fit because siblings borrowed marks admitted-but-not-running units of the borrowing siblings,
lowest preemption priority first (docs/compatibility.md#preemption-priority; among equals, those
with no bound pod), then newest, protect time respected,
never taking a sibling (or any quota on the victim's chain below it) below its own ``min``. Running
borrowers are never disrupted; the unit then waits saying for whom.

The search has three steps, each a function: which siblings borrow where the unit is short
(:func:`_borrowers`), which of their units could be taken and which are already on the way
(:func:`_candidates`), and the cheapest victims that cover the need while every quota on a victim's
chain keeps its ``min`` (:func:`_choose`).

A quota labelled ``koord-queue/reclaim-fair-share: "true"`` claims its fair share too
(docs/compatibility.md#reclaim-of-fair-shares): everywhere above, ``min`` reads as the larger of
``min`` and the quota's runtime (:func:`_floor`), for the claim and for the siblings it takes from,
so a sibling over its share loses only admitted-but-not-running units and never goes below its own
share. Without the label, shares (and usage history) only order who gets capacity as it frees.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.predicates import expected_pod_sets
from koord_queue.shared.core.policies import QueueState
from koord_queue.shared.core.preemption import Victim, protected_until, reclaimable
from koord_queue.shared.core.quota import QuotaLedger
from koord_queue.shared.core.usage import UsageView

__all__ = ["Reclaim", "fair_reclaim", "may_claim", "plan_reclaim"]


@dataclass(frozen=True, slots=True)
class Reclaim:
    """What a guaranteed unit's failed admission decided: ``victims`` per queue to mark now;
    ``waiting_for`` victims already on the way it counts on; ``borrowers`` the borrowing quotas
    (for the message); ``wake_at`` when a protected candidate becomes reclaimable."""

    victims: Mapping[str, tuple[Victim, ...]] = field(default_factory=dict)
    waiting_for: tuple[str, ...] = ()
    borrowers: tuple[str, ...] = ()
    wake_at: float | None = None
    protected: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return bool(self.victims or self.waiting_for)


def fair_reclaim(view: UsageView, leaf: str) -> bool:
    """Whether ``leaf`` reclaims its fair share, not only its ``min``: the label
    ``koord-queue/reclaim-fair-share: "true"`` (docs/compatibility.md#reclaim-of-fair-shares)."""
    spec = view.ledger.quotas.get(leaf)
    return spec is not None and spec.labels.get(names.RECLAIM_FAIR_SHARE_LABEL) == "true"


def _floor(view: UsageView, name: str, fair: bool) -> Mapping[str, int]:
    """What a claim stands on at ``name``, and what a victim's quota keeps: its ``min``, or with
    fair reclaim the larger of its ``min`` and its runtime (its fair share of the cycle)."""
    floor = view.ledger.quotas[name].min
    runtime = view.runtime.get(name) if fair else None
    if not runtime:
        return floor
    return {r: max(floor.get(r, 0), runtime.get(r, 0)) for r in floor.keys() | runtime.keys()}


def _within_min(view: UsageView, name: str, short: Mapping[str, int], fair: bool = False) -> bool:
    """The unit's request on the ``short`` resources fits within ``name``'s floor (``_floor``)."""
    floor = _floor(view, name, fair)
    return all(view.used(name, r) + v <= floor.get(r, 0) for r, v in short.items())


def may_claim(view: UsageView, leaf: str) -> bool:
    """Cheap test: could a unit of ``leaf`` be guaranteed (the quota has a parent quota and is
    below its floor on some resource)? Keeps an exhausted queue from being skipped unseen."""
    quotas = view.ledger.quotas
    spec = quotas.get(leaf)
    if spec is None or spec.parent not in quotas:
        return False
    floor = _floor(view, leaf, fair_reclaim(view, leaf))
    return any(view.used(leaf, r) < v for r, v in floor.items())


def _subtree(children: Mapping[str, tuple[str, ...]], top: str) -> list[str]:
    out, todo = [], [top]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.append(name)
        todo.extend(children.get(name, ()))
    return sorted(out)


def plan_reclaim(
    request: Mapping[str, int],
    leaf: str,
    *,
    view: UsageView,
    units: Mapping[str, Unit],
    queues: Mapping[str, QueueState],
    now: float,
    protect: float,
    claimed: frozenset[str] | set[str] = frozenset(),
    preempts: bool = True,
) -> Reclaim | None:
    """Victims among borrowing siblings for a unit of ``leaf`` that the filter refused.

    ``None`` when the guarantee does not apply (the unit does not fit within ``min`` at its own
    level, or nobody borrows where it is short): the ordinary preempt path decides then.
    ``claimed`` are victims another waiting unit already counts on in this cycle: a victim's
    capacity is promised to one unit at a time. A unit that does not preempt (``preempts=False``,
    docs/compatibility.md#non-preempting-jobs) claims nothing: ``None``, it waits for room."""
    if not preempts:
        return None
    need = _need(view, leaf, request)
    if not need:
        return None
    fair = fair_reclaim(view, leaf)
    borrowers, stops = _borrowers(view, leaf, request, need, fair)
    if not borrowers:
        return None
    found = _candidates(stops, need, units=units, queues=queues, now=now, protect=protect, claimed=claimed)
    if quantities.covers(found.released, need):
        return Reclaim(
            waiting_for=tuple(sorted(found.waiting)), borrowers=tuple(borrowers), wake_at=found.wake
        )
    chosen = _choose(view, found, need, fair)
    if chosen is None:
        return Reclaim(borrowers=tuple(borrowers), wake_at=found.wake, protected=tuple(found.protected))
    return Reclaim(
        victims=chosen,
        waiting_for=tuple(sorted(found.waiting)),
        borrowers=tuple(borrowers),
        wake_at=found.wake,
        protected=tuple(found.protected),
    )


def _need(view: UsageView, leaf: str, request: Mapping[str, int]) -> dict[str, int]:
    """Per resource, how far the unit overshoots the tightest bound (``max`` or runtime share) on
    its chain above its own quota; empty when nothing is short (or the chain is broken)."""
    chain = view.ledger.chain(leaf)
    if chain.error is not None or not request:
        return {}
    need: dict[str, int] = {}
    for name in chain.names[1:]:
        limits, share = view._limits(name)
        for bound in (limits, share or {}):
            for r, v in request.items():
                if r in bound:
                    excess = view.used(name, r) + v - bound[r]
                    if excess > 0:
                        need[r] = max(need.get(r, 0), excess)
    return need


def _borrowers(
    view: UsageView, leaf: str, request: Mapping[str, int], need: Mapping[str, int], fair: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The siblings that borrow on a ``need`` resource, at each level where the unit is still within
    ``min`` (judged on the short resources only: one nobody lacks does not stop its claim); and
    every quota below them, mapped to the borrowing sibling it belongs to."""
    ledger = view.ledger
    levels = ledger.chain(leaf).names
    short = {r: request[r] for r in need}
    pairs: list[tuple[str, str]] = []
    for i, name in enumerate(levels[:-1]):
        if not _within_min(view, name, short, fair):
            break
        pairs.append((levels[i + 1], name))
    children = ledger.children()
    borrowers: list[str] = []
    stops: dict[str, str] = {}
    for parent, own in pairs:
        for sibling in children.get(parent, ()):
            if sibling == own:
                continue
            floor = _floor(view, sibling, fair)
            if not any(view.used(sibling, r) > floor.get(r, 0) for r in need):
                continue
            borrowers.append(sibling)
            for name in _subtree(children, sibling):
                stops[name] = sibling
    return borrowers, stops


@dataclass
class _Found:
    """What the borrowers' queues offer: units that could be taken (``candidates``, with their
    order key, quota and borrowing sibling), capacity already on the way (``released``, from
    ``waiting``), and units protected for now (the earliest ends at ``wake``)."""

    candidates: list[tuple[tuple[int, int, float, float, str], str, str, Victim]] = field(
        default_factory=list
    )
    released: dict[str, int] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    wake: float | None = None


def _candidates(
    stops: Mapping[str, str],
    need: Mapping[str, int],
    *,
    units: Mapping[str, Unit],
    queues: Mapping[str, QueueState],
    now: float,
    protect: float,
    claimed: frozenset[str] | set[str],
) -> _Found:
    """Scan the queues of the borrowers and of every quota below them (see :class:`_Found`)."""
    found = _Found()
    for name in sorted(stops):
        qs = queues.get(name)
        if qs is None:
            continue
        for key in sorted(qs.in_flight.keys() | qs.marks.keys()):
            unit = units.get(key)
            if unit is None or key in claimed:
                continue
            if quantities.covers(found.released, need):
                break  # enough on the way already: the rest is for other waiting units
            per_pod = {ps.name: ps.per_pod for ps in expected_pod_sets(unit)}
            for podset, replicas in qs.reclaim_on_the_way(key).items():
                found.released = quantities.add(
                    found.released, quantities.scale(per_pod.get(podset, {}), replicas)
                )
            found.waiting.append(key)
        for item in qs.assumed:
            key = str(item[-1])
            unit = units.get(key)
            if unit is None or key in claimed or qs.on_the_way(key):
                continue
            taken = reclaimable(unit, now=now, protect=protect)
            if taken is None:
                until = protected_until(unit, now=now, protect=protect)
                if until is not None:
                    found.protected.append(key)
                    found.wake = until if found.wake is None else min(found.wake, until)
                continue
            has_bound = any(adm.running > 0 for adm in unit.admissions)
            # Lowest *preemption* priority first (docs/compatibility.md#preemption-priority).
            order = (
                unit.victim_priority,
                int(has_bound),
                -(unit.last_allocate_time or 0.0),
                -unit.created,
                key,
            )
            found.candidates.append(
                (order, name, stops[name], Victim(key, unit.name, taken.reclaim, taken.resources))
            )
    return found


def _choose(
    view: UsageView, found: _Found, need: Mapping[str, int], fair: bool = False
) -> dict[str, tuple[Victim, ...]] | None:
    """The first candidates in order (lowest priority, no bound pod, newest) whose taking keeps every
    quota from the victim's up to its borrowing sibling at its ``min``, until what is freed (with
    what is on the way) covers ``need``; None when they cannot."""
    taken: dict[str, dict[str, int]] = {}
    chosen: dict[str, list[Victim]] = {}
    total = dict(found.released)
    candidates = list(found.candidates)
    # Timestamps have a second's resolution: among equal ones the later name goes first.
    candidates.sort(key=lambda c: c[0][-1], reverse=True)
    candidates.sort(key=lambda c: c[0][:-1])
    for _, name, sibling, victim in candidates:
        path = _path(view.ledger, name, sibling)
        if not all(_keeps_min(view, x, taken.get(x, {}), victim.resources, need, fair) for x in path):
            continue
        for x in path:
            taken[x] = quantities.add(taken.get(x, {}), victim.resources)
        chosen.setdefault(name, []).append(victim)
        total = quantities.add(total, victim.resources)
        if quantities.covers(total, need):
            return {q: tuple(v) for q, v in sorted(chosen.items())}
    return None


def _path(ledger: QuotaLedger, leaf: str, top: str) -> list[str]:
    """The quotas from ``leaf`` up to ``top`` (both included)."""
    out: list[str] = []
    for name in ledger.chain(leaf).names:
        out.append(name)
        if name == top:
            break
    return out


def _keeps_min(
    view: UsageView,
    name: str,
    taken: Mapping[str, int],
    freed: Mapping[str, int],
    short: Mapping[str, int],
    fair: bool = False,
) -> bool:
    """Taking ``freed`` on top of ``taken`` leaves quota ``name`` at or above its ``min`` on the
    resources that are ``short`` (the others are not what the reclaim is for)."""
    floor = _floor(view, name, fair)
    return all(
        view.used(name, r) - taken.get(r, 0) - v >= floor[r]
        for r, v in freed.items()
        if v > 0 and r in floor and r in short
    )

"""Quota guarantees: ``min`` honoured, borrowing and lending between siblings, fair shares
(docs/compatibility.md#quota-guarantees).

Upstream admits against ``max`` up the parent chain only, so under an oversubscribed parent (the
children's ``max`` add up to more than the parent's) the first busy child takes everything and a
sibling's ``min`` means nothing. Here, below every parent that is a quota, each child gets a
*runtime* bound per resource, computed once per cycle from usage and waiting demand (Koordinator's
meaning of the same objects):

1. A child's *request* is its usage plus its waiting demand, capped at its ``max``.
2. Its *guarantee* is ``min(min, request)``: unused ``min`` is lent to siblings. A child labelled
   ``allow-lent-resource: "false"`` keeps its whole ``min`` (nobody may borrow it). A child with
   child quotas of its own keeps at least what their ``min`` claim of it (:func:`_claims_below`).
3. What the parent can give (its ``max``, bounded by its own runtime when it has a parent quota,
   minus what units labelled with the parent itself ask for) goes first to the guarantees; the rest
   is divided by *water-filling* in proportion to ``shared-weight`` (default: the child's ``max``;
   for a resource that ``max`` leaves out, the parent's limit on it, so the weight is in that
   resource's own scale), never beyond a child's request. So siblings competing for spare capacity
   get it in proportion to their weights, and none is starved. With usage history on, each weight
   is scaled by the child's fair-share factor (``shared.core.history``), so a child that used less
   than its share lately gets more of the spare capacity (docs/compatibility.md#fair-over-time).
4. *Whole units*: a share is cut to whole steps of the child's smallest waiting unit, but never
   below its guarantee, nor so far that a unit which fitted on that resource no longer does.
5. *Work conservation*, judged on whole units (a unit fits only if it fits on every resource): a
   child none of whose waiting units fits its share cannot use it; its request is lowered to its
   usage and the parent's division is made again (a demoted child whose unit fits in what is
   left over gets its request back), so its share goes to siblings that can use it rather than
   staying idle (:func:`_conserve`). Its claim on its ``min`` stands while one of its units fits
   there.

So the guarantee is exact (docs/compatibility.md#quota-guarantees): a child's runtime is never
below its guarantee, so a unit within ``min`` at every level below the top is admitted whenever
every ``max`` on its chain has room; ``tests/unit/test_guarantees_reference.py`` checks this and
work conservation against a brute-force reference.

The scheduler checks ``used + request <= runtime`` beside ``max`` (``UsageView.check``). When no
parent is oversubscribed (every child's request fits), every runtime equals the request, which any
admission that passes ``max`` fits; and below a parent whose children all have ``min == max``
nobody can borrow. In both cases (:func:`_may_borrow`) no runtime is computed there at all, and
admission is exactly as upstream's.

The *reclaim across quotas*, which makes ``min`` hold against borrowers that already hold it, is
``shared.core.reclaim``.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import charges
from koord_queue.shared.core.history import FACTOR_SCALE, UsageHistory, factor
from koord_queue.shared.core.quota import QuotaLedger

__all__ = ["Shares", "anyone_borrows", "borrowing", "compute", "fair_weights", "water_fill", "weight"]


@dataclass(frozen=True, slots=True)
class Shares:
    """One cycle's guarantee figures: ``runtime`` for every quota below a parent quota, and
    ``request`` (usage plus waiting demand, capped at ``max``) for the same quotas."""

    runtime: Mapping[str, Resources] = field(default_factory=dict)
    request: Mapping[str, Resources] = field(default_factory=dict)
    #: the part of each quota's ``min`` held for it (its demand, or all of it when it does not lend)
    guaranteed: Mapping[str, Resources] = field(default_factory=dict)


def water_fill(cap: int, asks: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Divide ``cap`` among ``(name, want, weight)`` in proportion to the weights, nobody beyond
    its want; what a satisfied asker leaves goes to the others. Integer milli units: the remainder
    of a proportional split goes one unit each in name order, so the result is deterministic and
    sums to ``min(cap, total want)``. Zero weights are served only once the weighted are full."""
    out: dict[str, int] = {}
    active: list[tuple[str, int, int]] = []
    for name, want, w in sorted(asks):
        out[name] = 0
        if want > 0:
            active.append((name, want, max(w, 0)))
    left = max(cap, 0)
    while active and left > 0:
        total_w = sum(w for _, _, w in active)
        if total_w == 0:
            for name, want, _ in active:
                give = min(want, left)
                out[name] += give
                left -= give
            break
        full = [a for a in active if a[1] * total_w <= left * a[2]]
        if full:
            for name, want, _ in full:
                out[name] += want
                left -= want
            active = [a for a in active if a not in full]
            continue
        for name, _, w in active:
            out[name] += left * w // total_w
        rest = left - sum(left * w // total_w for _, _, w in active)
        for name, _, w in active:
            if rest <= 0:
                break
            if w > 0:
                out[name] += 1
                rest -= 1
        left = 0
    return out


def weight(spec: Quota, resource: str, *, unlimited: int) -> int:
    """The quota's ``shared-weight`` for ``resource``, by default its ``max``. A quota whose
    ``max`` does not name the resource may take all the parent gives there, so it weighs
    ``unlimited`` (the parent's limit on that resource): the weight stays in the resource's own
    scale, as if its ``max`` named the parent's limit."""
    if spec.shared_weight is not None and resource in spec.shared_weight:
        return spec.shared_weight[resource]
    return spec.max.get(resource, unlimited)


def borrowing(ledger: QuotaLedger) -> frozenset[str]:
    """The parent quotas below which some child may borrow (the only places spare capacity is
    divided, and so the only places usage history orders siblings); cached until the tree
    changes."""
    if not ledger.children():
        return frozenset()
    found = ledger.per_tree("guarantees.borrowing", lambda: _borrowing_parents(ledger))
    assert isinstance(found, frozenset)
    return found


def anyone_borrows(ledger: QuotaLedger) -> bool:
    """Whether :func:`compute` can return anything for this tree: the caller skips gathering the
    queues' demand when it cannot (most trees: nothing is oversubscribed)."""
    return bool(borrowing(ledger))


def compute(
    ledger: QuotaLedger,
    pending: Mapping[str, Resources],
    smallest: Mapping[str, Sequence[Resources]],
    history: UsageHistory | None = None,
) -> Shares:
    """The runtime and request of every quota below a parent quota.

    ``pending`` is, per quota, the sum of its active waiting units' requests; ``smallest`` the
    least requests of those units that no other one is below (``Demand.floors``); ``history`` the
    decayed usages that scale the weights (None or off: the plain weights). Cost:
    O(quotas x depth) times the size of those lists."""
    children = ledger.children()
    dividing = borrowing(ledger)
    if not dividing:
        return Shares()  # nobody can borrow anywhere: upstream's admission, at no cost
    quotas = ledger.quotas
    sub_pending: dict[str, dict[str, int]] = {}
    sub_small: dict[str, tuple[Resources, ...]] = {}
    usage: dict[str, Resources] = {}
    gathered: dict[str, list[Resources]] = {}
    for leaf, pend in sorted(pending.items()):
        if leaf not in quotas or not pend:
            continue
        small = tuple(smallest.get(leaf, ()))
        for name in ledger.chain(leaf).names:
            acc = sub_pending.setdefault(name, {})
            for r, v in pend.items():
                acc[r] = acc.get(r, 0) + v
            # A unit the max of a quota on its way up refuses cannot use a share above it.
            limit = quotas[name].max
            now = usage.get(name)
            if now is None:
                now = usage[name] = ledger.used(name)
            small = tuple(
                u
                for u in small
                if limit and all(r not in limit or now.get(r, 0) + v <= limit[r] for r, v in u.items())
            )
            gathered.setdefault(name, []).extend(small)
    for name, found in gathered.items():
        sub_small[name] = charges.smallest_units(found) if len(found) > 1 else tuple(found)
    below = _claims_below(ledger, sub_pending, usage)
    runtime: dict[str, Resources] = {}
    request: dict[str, Resources] = {}
    held: dict[str, Resources] = {}
    order = [p for p in sorted(children) if quotas[p].parent not in children]
    seen: set[str] = set()
    while order:
        parent = order.pop(0)
        if parent in seen:  # a cycle in the parent labels: its units fail the chain walk anyway
            continue
        seen.add(parent)
        kids = children[parent]
        if parent in runtime or parent in dividing:
            _divide(
                ledger, parent, kids, runtime, request, held, sub_pending, sub_small, pending, below, history
            )
        order.extend(c for c in children[parent] if c in children)
    return Shares(runtime=runtime, request=request, guaranteed=held)


def _claims_below(
    ledger: QuotaLedger, sub_pending: Mapping[str, Mapping[str, int]], usage: dict[str, Resources]
) -> dict[str, Resources]:
    """Per quota with child quotas, what its children's ``min`` claim of it in sum: a child that
    does not lend claims its whole ``min``; one that lends, its ``min`` as far as its demand (its
    usage plus waiting demand, capped at its ``max``) or its own children's claims reach. A parent
    quota that lends claims at least that much of its own parent, so a guarantee deep in the tree
    is never squeezed by a lending quota above it whose own demand is small."""
    quotas, children = ledger.quotas, ledger.children()
    claims: dict[str, Resources] = {}
    sums: dict[str, Resources] = {}

    def claim(name: str, path: frozenset[str]) -> Resources:
        if name in claims:
            return claims[name]
        spec = quotas[name]
        total: dict[str, int] = {}
        for kid in children.get(name, ()):
            if kid not in path:  # a cycle in the parent labels: its units fail the chain walk anyway
                for r, v in claim(kid, path | {kid}).items():
                    total[r] = total.get(r, 0) + v
        if total:
            sums[name] = total
        if not spec.min:
            claims[name] = {}
            return claims[name]
        used = usage.get(name)
        if used is None:
            used = usage[name] = ledger.used(name)
        pend = sub_pending.get(name, {})
        out: dict[str, int] = {}
        for r, floor in spec.min.items():
            if not spec.lends:
                out[r] = floor
                continue
            want = used.get(r, 0) + pend.get(r, 0)
            if r in spec.max:
                want = min(want, spec.max[r])
            out[r] = min(floor, max(want, total.get(r, 0)))
        claims[name] = out
        return out

    for name in sorted(children):
        if quotas[name].parent in children:  # only a quota divided among siblings needs its sum
            claim(name, frozenset({name}))
    return sums


def _borrowing_parents(ledger: QuotaLedger) -> frozenset[str]:
    return frozenset(p for p in ledger.children() if _may_borrow(ledger, p))


def _may_borrow(ledger: QuotaLedger, parent: str) -> bool:
    """Whether the division below ``parent`` can refuse anything ``max`` admits: some child may
    borrow (``min != max``) and the children's ``max`` together exceed the parent's on a resource
    it limits (an oversubscribed parent). Otherwise every share equals the request, so nothing is
    computed there at all (and nothing costs a cycle)."""
    quotas = ledger.quotas
    kids = [quotas[c] for c in ledger.children().get(parent, ())]
    if all(k.min == k.max for k in kids):
        return False
    for r, cap in quotas[parent].max.items():
        if any(r not in k.max for k in kids) or sum(k.max[r] for k in kids) > cap:
            return True
    return False


def _limit(ledger: QuotaLedger, parent: str, runtime: Mapping[str, Resources]) -> dict[str, int]:
    """What ``parent`` may hold per resource: its ``max``, bounded by its own runtime."""
    cap = dict(ledger.quotas[parent].max)
    for r, v in runtime.get(parent, {}).items():
        cap[r] = min(cap.get(r, v), v)
    return cap


def _capacity(
    ledger: QuotaLedger, parent: str, limit: Mapping[str, int], pending: Mapping[str, Resources]
) -> dict[str, int]:
    """What ``parent`` can give its children: its limit less what its own units use and ask."""
    own_used = ledger.self_used(parent)
    own_pending = pending.get(parent, {})
    return {r: max(0, v - own_used.get(r, 0) - own_pending.get(r, 0)) for r, v in limit.items()}


def _fits_one(
    units: Sequence[Resources], room: Mapping[str, int], used: Mapping[str, int], limit: Mapping[str, int]
) -> bool:
    """Some unit of ``units`` fits, on every resource ``room`` bounds, within ``room - used``, and
    under the quota's own ``limit`` (its ``max``, where an empty one refuses every request)."""
    if not limit:
        return False
    return any(
        all(
            (r not in room or v <= room[r] - used.get(r, 0))
            and (r not in limit or v <= limit[r] - used.get(r, 0))
            for r, v in u.items()
        )
        for u in units
    )


def _within(units: Sequence[Resources], floor: Mapping[str, int], used: Mapping[str, int]) -> bool:
    """Some unit of ``units`` fits within ``floor - used`` (a resource ``floor`` does not name: 0)."""
    return any(all(used.get(r, 0) + v <= floor.get(r, 0) for r, v in u.items()) for u in units)


def _divide(
    ledger: QuotaLedger,
    parent: str,
    kids: tuple[str, ...],
    runtime: dict[str, Resources],
    request: dict[str, Resources],
    held: dict[str, Resources],
    sub_pending: Mapping[str, Mapping[str, int]],
    sub_small: Mapping[str, tuple[Resources, ...]],
    pending: Mapping[str, Resources],
    below: Mapping[str, Resources],
    history: UsageHistory | None = None,
) -> None:
    quotas = ledger.quotas
    limit = _limit(ledger, parent, runtime)
    cap = _capacity(ledger, parent, limit, pending)
    used = {c: ledger.used(c) for c in kids}
    asks: dict[str, dict[str, int]] = {}
    for c in kids:
        spec = quotas[c]
        want = dict(used[c])
        for r, v in sub_pending.get(c, {}).items():
            want[r] = want.get(r, 0) + v
        asks[c] = {r: min(v, spec.max[r]) if r in spec.max else v for r, v in want.items()}
        if not sub_small.get(c):
            # No waiting unit of it passes the max of its quota (or of one below): nothing to ask.
            asks[c] = dict(used[c])
    units = {c: sub_small[c] for c in kids if sub_pending.get(c) and sub_small.get(c)}
    split = _Split(quotas, kids, cap, limit, used, units, below, history, ledger.tree_epoch)
    full = {c: dict(a) for c, a in asks.items()}
    shares = _conserve(split, asks, units)
    # A demoted child keeps its claim on its min while a waiting unit of it fits there: a sibling
    # may use its share, not the min that unit is about to use.
    claims = {
        c: full[c] if asks[c] != full[c] and _within(units.get(c, ()), quotas[c].min, used[c]) else asks[c]
        for c in kids
    }
    for c in kids:
        runtime[c] = shares[c]
        request[c] = {r: v for r, v in sorted(asks[c].items()) if v}
        spec = quotas[c]
        claim = {
            r: min(v, max(claims[c].get(r, 0), below.get(c, {}).get(r, 0))) if spec.lends else v
            for r, v in spec.min.items()
        }
        held[c] = {r: v for r, v in sorted(claim.items()) if v}


def _conserve(
    split: _Split, asks: dict[str, dict[str, int]], units: Mapping[str, tuple[Resources, ...]]
) -> dict[str, dict[str, int]]:
    """Work conservation, judged on whole units: a child none of whose waiting units fits its share
    cannot use it now, so its request drops to its usage (``asks`` is updated) and the others
    divide the rest. Returns the final shares.

    Every child that cannot use its share is demoted and the division made again, until all that
    still ask can. A child may have lacked room only because a sibling held a share it could not
    use, so afterwards each demoted child whose unit would fit in its share plus what the division
    leaves over is tried with its request back, and keeps it when it and every child still asking
    each fit a unit. Usually two divisions; never more than ``2 x children + 1``."""
    used, cap = split.used, split.cap
    full = {c: dict(a) for c, a in asks.items()}

    def fits(c: str, room: Mapping[str, int]) -> bool:
        return _fits_one(units[c], room, used[c], split.quotas[c].max)

    def leftover(shares: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        return {r: v - sum(shares[k].get(r, 0) for k in split.kids) for r, v in cap.items()}

    demoted: list[str] = []
    shares = split.run(asks)
    while unable := [c for c in sorted(units) if c not in demoted and not fits(c, shares[c])]:
        for c in unable:
            asks[c] = dict(used[c])
            demoted.append(c)
        shares = split.run(asks)
    left = leftover(shares) if demoted else {}
    for c in sorted(demoted):
        if not fits(c, {r: shares[c].get(r, 0) + v for r, v in left.items()}):
            continue  # nothing left over that it could use: the others keep their shares
        tried = split.run({**asks, c: full[c]})
        asking = [k for k in sorted(units) if k not in demoted or k == c]
        if all(fits(k, tried[k]) for k in asking):
            asks[c] = full[c]
            demoted.remove(c)
            shares = tried
            left = leftover(shares)
    return shares


@dataclass(slots=True)
class _Split:
    """One parent's division of its capacity among its children, resource by resource.

    ``units`` are, per child, its least waiting requests (none below another on every resource).
    A child given only part of what it asks is given whole steps of room (a fraction of its
    smallest unit admits nothing), but never less than its guarantee and never so little that a
    unit which fitted on that resource no longer does; the fractions freed go, a step at a time,
    to the child with the lowest weighted share that can use one."""

    quotas: Mapping[str, Quota]
    kids: tuple[str, ...]
    cap: Mapping[str, int]
    limit: Mapping[str, int]
    used: Mapping[str, Resources]
    units: Mapping[str, tuple[Resources, ...]]
    #: per child with child quotas, what their ``min`` claims of it (``_claims_below``)
    below: Mapping[str, Resources]
    #: decayed usages that scale the weights (docs/compatibility.md#fair-over-time); None: plain
    history: UsageHistory | None = None
    #: the ledger's tree epoch (what the weights were read from)
    epoch: int = 0
    _by_resource: dict[str, tuple[dict[str, list[int]], dict[str, int], dict[str, int]]] = field(
        default_factory=dict
    )

    def _sizes(self, r: str) -> tuple[dict[str, list[int]], dict[str, int], dict[str, int]]:
        """Per child: its units' requests of ``r``, the smallest (its step; 0: no rounding), and its
        weight on ``r`` (none of them depends on what the children ask)."""
        found = self._by_resource.get(r)
        if found is None:
            sizes = {c: [u.get(r, 0) for u in self.units.get(c, ())] for c in self.kids}
            steps = {c: min(v) if v else 0 for c, v in sizes.items()}
            found = self._by_resource[r] = (sizes, steps, self._weights(r))
        return found

    def _weights(self, r: str) -> dict[str, int]:
        """The children's weights on ``r``, scaled by their fair-share factors (history on): kept
        in ``history.derived`` while the figures and the tree stand, as every cycle divides again
        and the figures move once a fold."""
        history = self.history
        if history is None or not history.enabled:
            return self._plain_weights(r)
        key = ("weights", self.epoch, self.kids, r, self.limit[r])
        found = history.derived.get(key)
        if found is None:
            plain = self._plain_weights(r)
            found = history.derived[key] = fair_weights(history, self.kids, plain, self.limit[r], r)
        return cast(dict[str, int], found)

    def _plain_weights(self, r: str) -> dict[str, int]:
        return {c: weight(self.quotas[c], r, unlimited=self.limit[r]) for c in self.kids}

    def run(self, asks: Mapping[str, Resources]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {c: {} for c in self.kids}
        for r in sorted(self.cap):
            for c, v in self._resource(r, asks).items():
                out[c][r] = v
        return out

    def _resource(self, r: str, asks: Mapping[str, Resources]) -> dict[str, int]:
        cap = self.cap[r]
        want = {c: asks[c].get(r, 0) for c in self.kids}
        sizes, steps, weights = self._sizes(r)
        guaranteed: dict[str, int] = {}
        for c in self.kids:
            spec = self.quotas[c]
            floor = spec.min.get(r, 0)
            claimed = max(want[c], self.below.get(c, {}).get(r, 0))
            guaranteed[c] = min(floor, claimed) if spec.lends else floor
        total = sum(guaranteed.values())
        if total >= cap:
            # The guarantees alone overrun the parent (an oversubscribed min): share by guarantee.
            alloc = water_fill(cap, ((c, g, g) for c, g in guaranteed.items()))
        else:
            extra = water_fill(cap - total, ((c, want[c] - guaranteed[c], weights[c]) for c in self.kids))
            alloc = {c: guaranteed[c] + extra[c] for c in self.kids}
        leftover = cap - sum(alloc.values())
        for c in self.kids:
            step = steps[c]
            room = alloc[c] - self.used[c].get(r, 0)
            if step > 0 and alloc[c] < want[c] and room > 0:
                largest_fit = max(v for v in sizes[c] if v <= room) if step <= room else 0
                cut = min(room % step, room - largest_fit, max(0, alloc[c] - guaranteed[c]))
                alloc[c] -= cut
                leftover += cut
        heap = [(_order(alloc[c], weights[c]), c) for c in self.kids if steps[c] > 0 and want[c] > alloc[c]]
        heapq.heapify(heap)
        while heap and leftover > 0:
            _, c = heapq.heappop(heap)
            give = min(steps[c], want[c] - alloc[c])
            if give > leftover:
                continue  # the leftover only shrinks: this child cannot take a step any more
            alloc[c] += give
            leftover -= give
            if want[c] > alloc[c]:
                heapq.heappush(heap, (_order(alloc[c], weights[c]), c))
        return alloc


def fair_weights(
    history: UsageHistory, kids: Sequence[str], weights: Mapping[str, int], limit: int, resource: str
) -> dict[str, int]:
    """``weights`` scaled by each child's fair-share factor on ``resource`` (``history.factor``:
    its decayed usage as a fraction of the parent's ``limit``, against its weight's fraction).
    When every factor is 1 (no history) the weights come back unchanged, so the division is
    exactly the plain weighted one."""
    total = sum(max(w, 0) for w in weights.values())
    factors = {
        c: factor(history.usage(c).get(resource, 0.0), limit, weights[c] / total if total > 0 else 0.0)
        for c in kids
    }
    if all(f == 1.0 for f in factors.values()):
        return dict(weights)
    return {c: weights[c] * max(1, round(factors[c] * FACTOR_SCALE)) for c in kids}


def _order(alloc: int, weight: int) -> float:
    """Who takes the next leftover step: the lowest share per weight, unweighted last (an order
    between children, never a quantity: ties fall to the name)."""
    return alloc / weight if weight > 0 else math.inf

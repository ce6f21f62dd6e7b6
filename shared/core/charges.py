"""What a unit holds and what it still asks for, and a queue's waiting demand
(docs/compatibility.md#usage-and-the-quota-filter).

:func:`reserved_resources` is the one definition of what an admitted unit holds in its quota: the
ledger (``shared.core.quota``) adds and removes exactly this, so usage never drifts.
:func:`remaining_request` is what the quota filter checks for a waiting or partly admitted unit (the
pod sets' replicas not yet admitted, at their per-pod size). :class:`Demand` keeps the smallest
request per resource over a queue's waiting units, so the scheduler can skip a queue none of whose
units can fit.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.predicates import TERMINAL_PHASES, expected_pod_sets, v1_dequeued
from koord_queue.shared.api.quantities import Resources

__all__ = [
    "Demand",
    "grants_request",
    "remaining_grants",
    "remaining_request",
    "reserved_resources",
    "smallest_units",
]


def _nonzero(res: Mapping[str, int]) -> Resources:
    return {name: res[name] for name in sorted(res) if res[name] != 0}


def reserved_resources(unit: Unit) -> Resources:
    """What ``unit`` holds in its quota; the single source for both adding and removing usage."""
    if unit.phase in TERMINAL_PHASES:
        return {}
    if not unit.admissions:
        return _nonzero(unit.resource) if v1_dequeued(unit) else {}
    per_pod = {ps.name: ps.per_pod for ps in expected_pod_sets(unit)}
    total: dict[str, int] = {}
    for adm in unit.admissions:
        replicas = max(adm.replicas, 0)
        held = {r: v * replicas for r, v in per_pod.get(adm.name, {}).items()}
        for r, v in adm.resources.items():
            if v > held.get(r, 0):
                held[r] = v
        for r, v in held.items():
            total[r] = total.get(r, 0) + v
    return _nonzero(total)


def remaining_grants(unit: Unit) -> dict[str, int]:
    """Replicas still missing per pod set (``count - admitted``), only the positive ones."""
    if not unit.admissions:
        return {ps.name: ps.count for ps in expected_pod_sets(unit) if ps.count > 0}
    admitted = {adm.name: adm.replicas for adm in unit.admissions}
    grants: dict[str, int] = {}
    for ps in expected_pod_sets(unit):
        missing = ps.count - admitted.get(ps.name, 0)
        if missing > 0:
            grants[ps.name] = missing
    return grants


def grants_request(unit: Unit, grants: Mapping[str, int]) -> Resources:
    """What granting ``grants`` (pod set -> replicas) charges: ``per_pod x replicas`` summed, zeros
    dropped, keys sorted."""
    per_pod = {ps.name: ps.per_pod for ps in expected_pod_sets(unit)}
    total: dict[str, int] = {}
    for podset, count in grants.items():
        for r, v in per_pod.get(podset, {}).items():
            total[r] = total.get(r, 0) + v * count
    return _nonzero(total)


def remaining_request(unit: Unit) -> Resources:
    """The demand the quota filter checks: sum of ``per_pod x missing replicas``, zeros dropped,
    keys sorted."""
    return grants_request(unit, remaining_grants(unit))


class Demand:
    """Smallest request per resource over a queue's active waiting units (a multiset per
    resource, kept with ``bisect``): with :meth:`UsageView.exhausted` it lets the scheduler skip a
    whole queue once what is left in its quota is below every pending request."""

    __slots__ = ("_floors", "_front", "_minimums", "count", "empty", "total", "values")

    def __init__(self) -> None:
        self.count = 0
        self.empty = 0
        self.values: dict[str, list[int]] = {}
        #: the sum of the requests (the queue's waiting demand, for the guarantee model)
        self.total: dict[str, int] = {}
        self._minimums: dict[str, int] | None = None
        #: how many waiting units have each least acceptable request (sorted items as the key)
        self._floors: dict[tuple[tuple[str, int], ...], int] = {}
        self._front: tuple[Resources, ...] | None = None

    def add(self, request: Resources, smallest: Resources | None = None) -> None:
        """Count a waiting unit: ``request`` adds to the total, ``smallest`` (the least it would
        accept, its ``minCount`` floor; default ``request``) to the minimums."""
        self._minimums = None
        self._front = None
        self.count += 1
        small = request if smallest is None else smallest
        if not small:
            self.empty += 1
        floor = tuple(sorted(small.items()))
        self._floors[floor] = self._floors.get(floor, 0) + 1
        for r, v in request.items():
            self.total[r] = self.total.get(r, 0) + v
        for r, v in small.items():
            bisect.insort(self.values.setdefault(r, []), v)

    def remove(self, request: Resources, smallest: Resources | None = None) -> None:
        self._minimums = None
        self._front = None
        self.count -= 1
        small = request if smallest is None else smallest
        if not small:
            self.empty -= 1
        floor = tuple(sorted(small.items()))
        left_floor = self._floors[floor] - 1
        if left_floor:
            self._floors[floor] = left_floor
        else:
            del self._floors[floor]
        for r, v in request.items():
            left = self.total[r] - v
            if left:
                self.total[r] = left
            else:
                del self.total[r]
        for r, v in small.items():
            values = self.values[r]
            del values[bisect.bisect_left(values, v)]
            if not values:
                del self.values[r]

    def minimums(self) -> dict[str, int]:
        """Per resource requested by *every* unit, the smallest request (cached; do not modify)."""
        if self._minimums is None:
            values = sorted(self.values.items())
            self._minimums = {r: vals[0] for r, vals in values if len(vals) == self.count}
        return self._minimums

    def floors(self) -> tuple[Resources, ...]:
        """The least requests of the waiting units that no other one is below on every resource
        (sorted, duplicates dropped; cached, do not modify). Whether *some* unit fits a share is
        judged on whole units: per-resource minimums can come from different units."""
        if self._front is None:
            self._front = smallest_units(dict(f) for f in self._floors)
        return self._front


def smallest_units(requests: Iterable[Mapping[str, int]]) -> tuple[Resources, ...]:
    """The requests among ``requests`` that no other is at or below on every resource (a resource
    a request does not name counts as 0), sorted and without duplicates. If any request fits a
    bound, one of these does: they are all a fit test needs."""
    distinct = sorted({tuple(sorted((r, v) for r, v in req.items() if v)) for req in requests})
    front: list[Resources] = []
    # A request below another on every resource has the smaller sum, so it is met first.
    for items in sorted(distinct, key=lambda f: (sum(v for _, v in f), f)):
        req = dict(items)
        if not any(all(req.get(r, 0) >= v for r, v in b.items()) for b in front):
            front.append(req)
    return tuple(sorted(front, key=lambda f: sorted(f.items())))

"""What a quota may still admit: the ledger's usage plus the admissions decided earlier in the
same cycle, checked against every level of a unit's route (docs/compatibility.md#usage-and-the-quota-filter).

The ledger (``shared.core.quota``) keeps what units hold; a :class:`UsageView` is one cycle's
working copy on top of it, never written back.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Mapping

from koord_queue.shared.api.names import Message
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core.quota import QuotaLedger

__all__ = ["UsageView"]


class UsageView:
    """The ledger plus the admissions decided earlier in the current cycle (never written back).

    Each admission of a cycle is added here at once, so later decisions of the same cycle see it
    and nothing is over-admitted; the reconciler then assumes the admission into the real cache.
    """

    __slots__ = ("_extra", "_gaps", "guaranteed", "ledger", "level", "runtime")

    def __init__(
        self,
        ledger: QuotaLedger,
        runtime: Mapping[str, Resources] | None = None,
        guaranteed: Mapping[str, Resources] | None = None,
    ) -> None:
        self.ledger = ledger
        self._extra: dict[str, dict[str, int]] = {}
        self.level: str | None = None
        #: Per quota with a parent, what it may use now (``shared.core.guarantees``); a second limit
        #: beside ``max``, empty when guarantees are off or the tree is flat.
        self.runtime: Mapping[str, Resources] = runtime or {}
        #: Per quota with a parent, the part of its ``min`` its own demand claims (held for it).
        self.guaranteed: Mapping[str, Resources] = guaranteed or {}
        #: Per parent, the guaranteed capacity its children claim and do not use yet.
        self._gaps: dict[str, dict[str, int]] = {}
        for name, claim in self.guaranteed.items():
            gaps = self._gaps.setdefault(ledger._quotas[name].parent, {})
            for r, v in claim.items():
                gap = v - self.used(name, r)
                if gap > 0:
                    gaps[r] = gaps.get(r, 0) + gap

    def gap(self, parent: str) -> Resources:
        """The guaranteed capacity of ``parent`` that its children claim and do not use yet."""
        return dict(self._gaps.get(parent, {}))

    def _limits(self, name: str) -> tuple[Resources, Resources | None]:
        return self.ledger._quotas[name].max, self.runtime.get(name)

    def used(self, name: str, resource: str) -> int:
        extra = self._extra.get(name)
        base = self.ledger._used.get(name)
        return (base.get(resource, 0) if base else 0) + (extra.get(resource, 0) if extra else 0)

    def reserve(self, quota: str, request: Mapping[str, int], via: str = "") -> None:
        for name in self.ledger.route_names(quota, via) if via else self.ledger.chain(quota).names:
            claim = self.guaranteed.get(name)
            if claim:
                gaps = self._gaps.setdefault(self.ledger._quotas[name].parent, {})
                for r, v in request.items():
                    unused = claim.get(r, 0) - self.used(name, r)
                    if unused > 0:
                        gaps[r] = gaps.get(r, 0) - min(unused, v)
            extra = self._extra.setdefault(name, {})
            for r, v in request.items():
                extra[r] = extra.get(r, 0) + v

    def check(self, request: Mapping[str, int], quota: str, *, item: str, via: str = "") -> str | None:
        """``None`` when ``request`` fits at every level, else upstream's failure text.

        After a failure, :attr:`level` names the quota that refused (``None`` for a structural
        error), so the scheduler knows which releases can help. ``via`` names the pool quota a
        route charges besides ``quota`` (docs/pools.md#fallback-between-pools); its chain is
        checked after ``quota``'s.
        """
        chain = self.ledger.chain(quota)
        route = self.ledger.route_names(quota, via) if via else chain.names
        for name in route:
            limits = self.ledger._quotas[name].max
            self.level = name
            if not limits:
                if request:
                    return Message.quota_spec_empty(name)
                continue
            for r in sorted(request):
                if r in limits and limits[r] - self.used(name, r) < request[r]:
                    return Message.limited(name, r)
        # Capacity first (upstream's texts), then the shares: a share refuses only where room exists.
        for name in route if self.runtime else ():
            refused = self._share_refuses(name, request)
            if refused is not None:
                return Message.share_limited(name, self.ledger._quotas[name].parent, refused)
        self.level = None
        return chain.message(item) or (self.ledger.chain(via).message(item) if via else None)

    def _share_refuses(self, name: str, request: Mapping[str, int]) -> str | None:
        """The resource on which ``name``'s share refuses ``request``, if any: beyond its runtime,
        or borrowing (beyond its ``min``) into capacity its siblings' guarantees still claim."""
        share = self.runtime.get(name)
        if share is None:
            return None
        quotas = self.ledger._quotas
        self.level = name
        for r in sorted(request):
            if r in share and share[r] - self.used(name, r) < request[r]:
                return r
        floor = quotas[name].min
        parent = quotas[name].parent
        gaps = self._gaps.get(parent)
        if not gaps:
            return None
        limits = quotas[parent].max
        above = self.runtime.get(parent, {})
        claim = self.guaranteed.get(name, {})
        for r in sorted(request):
            if self.used(name, r) + request[r] <= floor.get(r, 0):
                continue  # within its own min on r: it takes nothing the siblings are guaranteed
            others = gaps.get(r, 0) - max(0, claim.get(r, 0) - self.used(name, r))
            if others <= 0 or (r not in limits and r not in above):
                continue
            limit = min(limits.get(r, above.get(r, 0)), above.get(r, limits.get(r, 0)))
            if self.used(parent, r) + request[r] + others > limit:
                self.level = parent
                return r
        return None

    def headroom(self, quota: str) -> Resources | None:
        """Per resource, the smallest ``max - used`` along the chain (absent = unlimited).

        ``None`` when nothing can ever fit by freeing usage (a structural error); an empty ``max``
        shows as ``{"*": 0}``-like impossibility via ``None`` too.
        """
        chain = self.ledger.chain(quota)
        if chain.error is not None:
            return None
        room: dict[str, int] = {}
        for name in chain.names:
            limits, share = self._limits(name)
            if not limits:
                return None
            for bound in (limits, share or {}):
                for r, cap in bound.items():
                    free = cap - self.used(name, r)
                    room[r] = min(room.get(r, free), free)
        return room

    def exhausted(self, quota: str, minimums: Mapping[str, int], *, any_empty: bool) -> bool:
        """True when no unit of ``quota`` can fit: for some level and resource, the smallest
        request among them exceeds what is left (``minimums`` holds, per resource, the minimum over
        units that *all* request it; ``any_empty`` says some unit requests nothing). Sets
        :attr:`level` like :meth:`check`."""
        routes = self.ledger.routes(quota)
        if len(routes) == 1 and not routes[0].via:
            return self._exhausted(quota, "", minimums, any_empty=any_empty)
        if all(self._exhausted(quota, r.via, minimums, any_empty=any_empty) for r in routes):
            self.level = None  # several routes: any release on any of them may help
            return True
        return False

    def _exhausted(self, quota: str, via: str, minimums: Mapping[str, int], *, any_empty: bool) -> bool:
        self.level = None
        if self.ledger.chain(quota).error is not None or (via and self.ledger.chain(via).error is not None):
            return True
        for name in self.ledger.route_names(quota, via):
            limits, share = self._limits(name)
            self.level = name
            if not limits:
                if not any_empty:
                    return True
                continue
            for bound in (limits, share or {}):
                for r, smallest in minimums.items():
                    if r in bound and bound[r] - self.used(name, r) < smallest:
                        return True
        self.level = None
        return False

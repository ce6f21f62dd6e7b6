"""The pools a unit may be admitted to, in the order they are tried, and why some are skipped
(docs/pools.md#fallback-between-pools).

A unit's quota gives its routes (``shared.core.quota.QuotaLedger.routes``): one per quota its
``koord-queue/pool-quotas`` annotation lists, else its own. Here they are narrowed for one unit:

* a unit that holds an admission in a pool stays there (its later admissions, a gang growing to
  its full size, go to the same pool and pool quota);
* a job's ``koord-queue/pools`` keeps only the pools it names, in its order: never a pool the
  quota does not list;
* a pool whose ElasticQuotaProfile is unknown, or which a pod set's own node selector or required
  affinity contradicts, is skipped with a reason the waiting message shows.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from koord_queue.shared.api import placement
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.core import charges
from koord_queue.shared.core.quota import QuotaLedger, Route

__all__ = ["NOT_ACROSS_POOLS", "NO_POOL", "Option", "describe", "nothing_to_try", "options", "tried"]

#: The one route of a quota in no pool: the behaviour from before pools.
NO_POOL = Route("")
#: Why a unit with several routes did not try preemption (docs/pools.md#limits-of-this-version).
NOT_ACROSS_POOLS = "queue-level preemption is not tried across pools"


@dataclass(frozen=True, slots=True)
class Option:
    """A route in the unit's order; ``skip`` says why it is not tried (None: it is)."""

    route: Route
    skip: str | None = None


_PLAIN = (Option(NO_POOL),)


def options(
    unit: Unit, ledger: QuotaLedger, placements: Mapping[str, PoolPlacement] | None
) -> tuple[Option, ...]:
    """The routes for ``unit`` in order. ``placements`` None checks no placement (a replay that
    cannot read the profiles); an empty tuple means the job's pools and its quota's share none."""
    if not ledger.pooled and unit.pools is None and not unit.pool:
        return _PLAIN
    if unit.pool and charges.reserved_resources(unit):
        return (_checked(unit, Route(unit.pool, unit.pool_quota), placements),)
    routes = ledger.routes(unit.quota or "")
    if unit.pools is None:
        if routes == (NO_POOL,):
            return _PLAIN
        ordered = list(routes)
    else:
        ordered = [r for wanted in unit.pools for r in routes if r.pool == wanted]
    return tuple(_checked(unit, r, placements) for r in ordered)


def _checked(unit: Unit, route: Route, placements: Mapping[str, PoolPlacement] | None) -> Option:
    if route.via and not route.pool:
        return Option(route, f"quota {route.via} is not inside any pool's tree")
    if not route.pool or placements is None:
        return Option(route)
    pool = placements.get(route.pool)
    if pool is None:
        return Option(route, f"no ElasticQuotaProfile named {route.pool} is known")
    if pool.problem is not None:
        return Option(route, pool.problem)
    for pod_set in unit.pod_sets:
        if pod_set.placement is not None:
            why = placement.contradiction(pod_set.placement, pool)
            if why is not None:
                return Option(route, f"skipped: {why}")
    return Option(route)


def describe(route: Route, text: str) -> str:
    """One route's part of a waiting message: ``pool h100: <why>``."""
    return f"pool {route.pool or route.via or '-'}: {text}"


def nothing_to_try(unit: Unit, ledger: QuotaLedger) -> str:
    """The waiting message of a unit whose own pools and its quota's have none in common."""
    listed = ", ".join(r.pool or r.via for r in ledger.routes(unit.quota or "")) or "none"
    wanted = ", ".join(unit.pools or ()) or "none"
    return f"none of the job's pools ({wanted}) is one its quota {unit.quota} admits to ({listed})"


def tried(message: str) -> list[str]:
    """The pools a waiting message names, one ``pool <name>: <why>`` each in the order tried;
    empty when the message is not about pools (:func:`describe` wrote each part)."""
    if not message.startswith("pool "):
        return []
    return [part if i == 0 else f"pool {part}" for i, part in enumerate(message.split("; pool "))]

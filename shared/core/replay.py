"""What a reader could see, fed through the scheduler's own cycle.

``kubectl koord-queue`` must show what the scheduler decides, not what a second copy of its rules
would guess. So :func:`replay` fills the scheduler's own cache (``shared.core.scheduling.Cache``) with
the objects a reader could read and runs one cycle of ``shared.core.scheduling.schedule``; writing
nothing, it returns the cache and the plan for ``shared.core.explain`` to read. :func:`quota_rows`
reads the same replayed ledger for ``kubectl koord-queue quotas``.

A reader may not see everything: a namespace user reads the QueueUnits and ElasticQuotas of their
namespace only, not the other namespaces' units that share the quota, nor (usually) the Queues in
``koord-queue``. :class:`View` says what was seen (``complete``: every unit of the cluster) and what
could not be read, so that callers show usage as a lower bound instead of guessing; quotas that could
not be read enter the replay as placeholders that refuse nothing.

Usage history (docs/compatibility.md#fair-over-time) is restored as a reconciler taking over restores
it: from each quota's ``koord-queue/usage-history`` record, decayed to ``now`` by the cycle's first
fold, with the half-life the records (or the component configuration) name. A quota whose record the
reader cannot read starts at zero, so callers say when the quotas were not all read.

Pure: standard library and sibling modules only; the clock is a parameter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.durations import DurationError, parse_duration
from koord_queue.shared.api.model import QueueConfig, Quota, Unit
from koord_queue.shared.api.names import Phase
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import quotastatus
from koord_queue.shared.core.charges import remaining_request
from koord_queue.shared.core.plan import Admit, Park
from koord_queue.shared.core.policies import is_waiting
from koord_queue.shared.core.scheduling import Cache
from koord_queue.shared.jobs.running_timeout import RunningTimeout

__all__ = [
    "UNKNOWN_RESOURCE",
    "QuotaRow",
    "ServedStanding",
    "View",
    "history_half_life",
    "quota_rows",
    "replay",
]

#: The only resource a placeholder quota (one the reader cannot read) limits: resources absent from
#: ``max`` are unlimited, so the placeholder refuses nothing and the walk up the tree goes on.
UNKNOWN_RESOURCE = "koord-queue.x-k8s.io/unknown"


@dataclass(frozen=True, slots=True)
class ServedStanding:
    """A quota's standing among its siblings as the visibility API served it (``fairShare``, the
    scheduler's own figures): what a namespace user learns about a level whose parent and siblings
    they cannot read. ``ahead`` names only the siblings the reader may see; ``ahead_count`` counts
    them all; ``score`` None is an infinite standing (a zero share)."""

    parent: str
    position: int
    siblings: int
    ahead_count: int
    ahead: tuple[str, ...] = ()
    share: Mapping[str, float] = field(default_factory=dict)
    score: float | None = 0.0
    usage: Resources = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class View:
    """The objects a reader could see, parsed, and what could not be read.

    ``complete``: the units are every unit of the cluster (an admin's view); otherwise usage and
    the units ahead are lower bounds. ``unreadable_quotas`` are quota names referenced (a unit's
    label, a parent label) that could not be read: they enter the replay as placeholders that refuse
    nothing. ``queues_known``: the Queues themselves were read (else they were derived from the
    quotas, as the reconciler derives them). ``positions`` are the 1-based places the visibility API
    gave (unit key -> position); ``queue_missing`` the queues it answered 404 for.
    """

    units: Mapping[str, Unit]
    quotas: Sequence[Quota] = ()
    queues: Sequence[QueueConfig] = ()
    reclaim_protect_seconds: float = 0.0
    namespace_binding: bool = True
    guarantees: bool = True
    complete: bool = False
    unreadable_quotas: frozenset[str] = frozenset()
    queues_known: bool = True
    positions: Mapping[str, int] = field(default_factory=dict)
    queue_missing: frozenset[str] = frozenset()
    running_timeout: RunningTimeout | None = None
    unknowns: tuple[str, ...] = ()
    #: the usage history's half-life in seconds (``usageHalfLife``; 0: off); None: as the quotas'
    #: ``koord-queue/usage-history`` records say (off when none can be read)
    usage_half_life: float | None = None
    #: every ElasticQuota of the cluster was read (else sibling quotas may be missing)
    quotas_complete: bool = True
    #: standings the visibility API served, by quota (for levels whose parent cannot be read)
    standings: Mapping[str, ServedStanding] = field(default_factory=dict)


def _record_half_life(text: str | None) -> float | None:
    """The ``halfLife`` of a usage-history record, in seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        raw = doc.get("halfLife") if isinstance(doc, dict) else None
        return parse_duration(raw) if isinstance(raw, str) else None
    except (ValueError, DurationError):
        return None


def history_half_life(half_life: float | None, quotas: Iterable[Quota]) -> float:
    """The half-life a replay counts with: ``half_life`` when known (the component configuration),
    else the one the first quota (by name) with a readable record names, else 0 (history off: with
    no record to read, a replay could only guess it)."""
    if half_life is not None:
        return max(0.0, half_life)
    for quota in sorted(quotas, key=lambda q: q.name):
        found = _record_half_life(quota.annotations.get(names.QUOTA_USAGE_HISTORY_ANNOTATION))
        if found is not None and found > 0:
            return found
    return 0.0


def replay(view: View, now: float) -> tuple[Cache, list[Admit | Park]]:
    """The scheduler's cache filled with ``view`` and one cycle run over it (nothing is written
    anywhere: the plan is returned). Placeholders stand in for the unreadable quotas."""
    cache = Cache(
        reclaim_protect_seconds=view.reclaim_protect_seconds,
        quota_namespace_binding=view.namespace_binding,
        quota_guarantees=view.guarantees,
        usage_half_life=history_half_life(view.usage_half_life, view.quotas),
    )
    # The user may not read the pools' profiles: placement is not judged in a replay
    # (docs/pools.md#what-users-see); the waiting message the scheduler wrote still names it.
    cache.set_placements(None)
    known = {q.name for q in view.quotas}
    for quota in view.quotas:
        cache.put_quota(quota)
    for name in sorted(view.unreadable_quotas - known):
        cache.put_quota(Quota(name=name, max={UNKNOWN_RESOURCE: 0}))
    configs = {c.name: c for c in view.queues}
    if not view.queues_known:
        # Queues not read: each quota has one (the reconciler makes it); settings unknown.
        names_seen = view.unreadable_quotas | {q.name for q in view.quotas}
        for name in sorted(names_seen - configs.keys() - view.queue_missing):
            configs[name] = QueueConfig(name=name)
    for name in sorted(configs):
        cache.put_queue(configs[name])
    for key in sorted(view.units):
        cache.put_unit(view.units[key])
    plan = cache.schedule(now)
    return cache, [d for d in plan.decisions if isinstance(d, Admit | Park)]


# --- quotas -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One quota for ``kubectl koord-queue quotas``: limits, usage and the work waiting in it."""

    name: str
    namespace: str
    parent: str
    depth: int
    min: Resources
    max: Resources
    used: Resources
    over_min: Resources
    waiting: int
    waiting_request: Resources
    admitted: int
    used_complete: bool
    ignored: bool = False
    #: what the quota may use now, as last published on it (``shared.core.quotastatus``); None
    #: when not published (``publishQuotaStatus: false`` and no koord-scheduler) or unreadable
    runtime: Resources | None = None
    #: the pool whose tree the quota is in (docs/pools.md#the-tree-of-a-pool), empty for none, and
    #: the quotas inside pools its units fall back through (``koord-queue/pool-quotas``)
    pool: str = ""
    pool_quotas: tuple[str, ...] = ()
    #: the decayed average usage (milli units), restored from the quota's record and decayed to
    #: ``now`` (docs/compatibility.md#fair-over-time); None when the replay keeps no history
    decayed: Resources | None = None


def quota_rows(view: View, now: float = 0.0) -> list[QuotaRow]:
    """Every readable quota in tree order (parents before children, then by name), with the usage
    the scheduler's ledger computes from the units seen, the demand of the units waiting and, at
    ``now``, the decayed usage the replayed history holds."""
    cache, _ = replay(view, now)
    history = cache.snapshot.history
    ledger = cache.ledger
    waiting: dict[str, tuple[int, Resources]] = {}
    admitted: dict[str, int] = {}
    for unit in cache.units.values():
        if not unit.quota:
            continue
        if is_waiting(unit) and unit.phase not in (Phase.RESERVED,):
            count, total = waiting.get(unit.quota, (0, {}))
            waiting[unit.quota] = (count + 1, quantities.add(total, remaining_request(unit)))
        elif ledger.contribution(unit.key) is not None:
            admitted[unit.quota] = admitted.get(unit.quota, 0) + 1
    quotas = ledger.quotas
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for name in sorted(quotas):
        parent = quotas[name].parent
        if parent and parent in quotas and parent != name:
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)
    rows: list[QuotaRow] = []
    seen: set[str] = set()

    def walk(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        quota = quotas[name]
        used = ledger.used(name)
        count, total = waiting.get(name, (0, {}))
        rows.append(
            QuotaRow(
                name=name,
                namespace=quota.namespace,
                parent=quota.parent,
                depth=depth,
                min=dict(quota.min),
                max=dict(quota.max),
                used=used,
                over_min=quotastatus.borrowed(quota, used),
                waiting=count,
                waiting_request=total,
                admitted=admitted.get(name, 0),
                used_complete=view.complete,
                runtime=quotastatus.read(quota.annotations, names.QUOTA_RUNTIME_ANNOTATION),
                pool=ledger.pool_of(name),
                pool_quotas=quota.pool_quotas,
                decayed=(
                    {r: round(v) for r, v in sorted(history.usage(name).items())} if history.enabled else None
                ),
            )
        )
        for child in children.get(name, []):
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    for name in sorted(quotas):  # cycles: whatever the walk did not reach
        walk(name, 0)
    for quota in ledger.ignored():
        rows.append(
            QuotaRow(
                name=quota.name,
                namespace=quota.namespace,
                parent=quota.parent,
                depth=0,
                min=dict(quota.min),
                max=dict(quota.max),
                used={},
                over_min={},
                waiting=0,
                waiting_request={},
                admitted=0,
                used_complete=view.complete,
                ignored=True,
            )
        )
    return rows

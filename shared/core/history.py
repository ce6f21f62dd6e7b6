"""Usage history: what each quota held over time, decayed with a half-life, and the fair-share
factor that turns it into the order in which siblings get spare capacity
(docs/compatibility.md#fair-over-time).

Sharing only *current* spare capacity is fair at each moment and unfair over a day: a team that
filled the parent all night "only uses its share" at every instant once a sibling arrives, and the
sibling waits behind the backlog. So every quota keeps a **decayed average** of the resources its
admitted units held (its subtree's usage, ``QuotaLedger.used``): over a step of ``dt`` seconds in
which it held ``u``, the average ``a`` becomes ``a * d + u * (1 - d)`` with ``d = 2 ** (-dt / H)``
for the half-life ``H``. The average is in the resource's own units (3.2 GPUs), so a figure reads
as "held 3.2 GPUs on average lately".

Below a parent, a child's **fair-share factor** on a resource is ``2 ** (-u / s)`` (the form of
Slurm's fair-share factor), where ``u`` is its decayed average as a fraction of the parent's limit
and ``s`` its weight's fraction of its siblings' weights (``shared-weight``, by default ``max``).
The spare capacity of the parent (what is left once every ``min`` is served) is divided in
proportion to ``weight x factor`` instead of ``weight`` (``shared.core.guarantees``). So a child
that used less than its share lately gets more than its share of the next slots, until the
averages even out; two children that used their shares get exactly their shares (equal ``u / s``,
equal factors), and with no history at all every factor is 1 and the division is the plain
weighted one. ``min`` is never touched: history orders spare capacity only.

A child's *standing* among its siblings is its largest ``u / s`` over the resources the parent
limits (lower stands first): the order queues of equal priority are scanned in, and what
``kubectl koord-queue explain`` reports ("B is ahead of you because ...").

Cost: a fold re-anchors only the quotas whose usage changed since the last one (the average of a
quota whose holding does not change is a closed formula of the time), and nothing per unit; and
folds are at least a *grain* apart (:data:`FOLD_GRAIN_SECONDS`, or 1/128 of the half-life when
that is shorter), so between two folds every figure, and everything computed from them (the
fair weights, the standings), is read from memory. A change is charged from the fold before or
after it, so the figures are late by at most one grain: 28 s against a one-hour half-life moves an
average by at most 0.54% of the change, a third of one step of the factor (1/64). The
averages are written to each ElasticQuota (``koord-queue/usage-history``: the average and when it
was taken) and read back when a reconciler starts or takes over, decayed analytically
across the gap, so a restart never resets them (``reconciler/quotas.py`` writes them).

Pure: standard library and sibling modules only; ``now`` is a parameter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.durations import format_duration, format_time, parse_time
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.quantities import QuantityError, Resources
from koord_queue.shared.core.quota import QuotaLedger

__all__ = [
    "DEFAULT_HALF_LIFE_SECONDS",
    "FACTOR_SCALE",
    "FOLD_GRAIN_SECONDS",
    "Record",
    "Standing",
    "UsageHistory",
    "factor",
    "parse_record",
    "render_record",
    "standing_score",
]

#: The default half-life (``usageHalfLife``): long enough that a night's burst still counts the
#: next morning, short enough that yesterday's is mostly forgotten.
DEFAULT_HALF_LIFE_SECONDS = 3600.0
#: Weights are integers (``guarantees.water_fill``); a factor is applied as ``weight x round(f x
#: FACTOR_SCALE)`` (at least 1), so it moves in steps of 1/64: the division changes when a factor
#: does by a step, not with every second of decay (each change wakes the queues that may gain).
FACTOR_SCALE = 64
#: Folds are at least this far apart (or 1/128 of the half-life when that is shorter); a cycle in
#: between reads the figures of the last fold. A tree change folds at once.
FOLD_GRAIN_SECONDS = 30.0
#: The smallest factor used, so that a weight never becomes 0 (a zero weight is served last of all,
#: a different rule): a child 20 shares over its share still gets a sliver, in weight order.
_MIN_FACTOR = 2.0**-20


@dataclass(frozen=True, slots=True)
class Record:
    """What is stored on a quota: the decayed averages (milli units) and when they were taken."""

    at: float
    usage: Resources
    #: per namespace of the quota's own units (a queue ordering by namespace usage only)
    namespaces: Mapping[str, Resources] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Standing:
    """A child quota among its siblings: its decayed average per resource (milli units), its
    weight's fraction of the siblings' weights per resource, its factor per resource and its
    standing (the largest ``u / s``; lower is served first)."""

    name: str
    usage: Resources
    share: Mapping[str, float]
    factor: Mapping[str, float]
    score: float


def factor(usage: float, limit: int, share: float) -> float:
    """The fair-share factor ``2 ** (-u / s)``: ``u`` = ``usage / limit``, ``s`` = ``share``."""
    if limit <= 0 or share <= 0 or usage <= 0:
        return 1.0 if usage <= 0 else _MIN_FACTOR
    return max(_MIN_FACTOR, float(2.0 ** (-(usage / limit) / share)))


def standing_score(usage: float, limit: int, share: float) -> float:
    """A child's standing on one resource, ``u / s``: its decayed ``usage`` as a fraction of the
    parent's ``limit``, against its ``share`` of the siblings' weights (0 without usage; a child
    with usage and no share stands last)."""
    if usage <= 0:
        return 0.0
    return (usage / limit) / share if limit > 0 and share > 0 else math.inf


def render_record(record: Record, half_life: float) -> str:
    """The annotation text: ``{"at": RFC 3339, "halfLife": Go duration, "usage": ResourceList}``."""
    usage = {r: v for r, v in record.usage.items() if v > 0}
    doc: dict[str, object] = {
        "at": format_time(record.at),
        "halfLife": format_duration(half_life),
        "usage": quantities.format_resource_list(usage),
    }
    if record.namespaces:
        doc["namespaces"] = {ns: quantities.format_resource_list(u) for ns, u in record.namespaces.items()}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def parse_record(text: str | None) -> Record | None:
    """The annotation read back; None when absent or unreadable (then history starts at zero)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, Mapping):
        return None
    at = parse_time(doc.get("at"))
    raw = doc.get("usage")
    if at is None or not isinstance(raw, Mapping):
        return None
    raw_ns = doc.get("namespaces", {})
    if not isinstance(raw_ns, Mapping):
        return None
    try:
        usage = quantities.parse_resource_list(raw)
        namespaces = {
            str(ns): quantities.parse_resource_list(u) for ns, u in raw_ns.items() if isinstance(u, Mapping)
        }
    except QuantityError:
        return None
    return Record(
        at=at,
        usage={r: v for r, v in usage.items() if v > 0},
        namespaces={ns: {r: v for r, v in u.items() if v > 0} for ns, u in namespaces.items()},
    )


class UsageHistory:
    """Every quota's decayed average usage, kept *analytically*: per series (a quota, or with
    :attr:`by_namespace` a ``quota/namespace`` pair) what it holds now, ``h``, and one offset per
    resource, ``k``, such that its average at any later time ``t`` is ``h + k * 2 ** (-t / H)``
    (times counted from an origin, :attr:`_origin`). While the holding does not change the
    average follows that closed formula, so nothing needs folding; when the holding changes at
    ``t`` from ``h`` to ``h'``, keeping the average continuous takes one multiply-add per
    resource: ``k += (h - h') * 2 ** (t / H)``. A fold does that for the series whose usage changed
    (the ledger tells which), and a figure is computed when read. The cost per fold is the number
    of quotas that changed, not the number of quotas.

    ``half_life`` 0 turns history off: every factor is 1, nothing is kept or written."""

    def __init__(self, half_life: float = 0.0) -> None:
        self.half_life = max(0.0, half_life)
        #: per series: the offsets (milli units, scaled to :attr:`_origin`), the holding, and
        #: when it was first counted (no change is charged from before that)
        self._k: dict[str, dict[str, float]] = {}
        self._held: dict[str, Mapping[str, int]] = {}
        self._since: dict[str, float] = {}
        #: the time the offsets are scaled to; moved forward now and then so they stay finite
        self._origin: float | None = None
        self._stored: dict[str, Record] = {}
        #: the time of the last fold: figures are read as of then, so one cycle reads one instant
        self.now = 0.0
        self._epoch = -1
        #: quotas whose queue orders its units by namespace usage (``QueueConfig.fair_order``):
        #: they also keep one series per namespace, named ``quota/namespace``
        self.by_namespace: set[str] = set()
        self._namespaces: dict[str, set[str]] = {}
        #: figures read at :attr:`now` (cleared when a fold begins), so that the division and the
        #: order read each once
        self._memo: dict[str, dict[str, float]] = {}
        #: quotas whose usage the last cycle's own admissions changed (:meth:`hold`)
        self._assumed: set[str] = set()
        #: the shortest time between two folds
        self.grain = min(FOLD_GRAIN_SECONDS, self.half_life / 128)
        #: bumped whenever a figure may have changed: what is computed from the figures (the fair
        #: weights, the standings) is kept in :attr:`derived` until it moves
        self.version = 0
        #: results computed from this version's figures, by their callers' keys
        self.derived: dict[object, object] = {}

    @property
    def enabled(self) -> bool:
        return self.half_life > 0

    def remember(self, quota: Quota) -> None:
        """A quota seen (watch event): the latest record it carries is kept. It is used only when
        the quota is first counted (after a start, or :meth:`restart` when leadership begins), so
        a record this replica wrote itself never goes back in while it keeps counting."""
        if not self.enabled:
            return
        record = parse_record(quota.annotations.get(names.QUOTA_USAGE_HISTORY_ANNOTATION))
        if record is not None:
            self._stored[quota.name] = record
        else:
            self._stored.pop(quota.name, None)

    def restart(self) -> None:
        """Leadership begins: count on from what the quotas carry (another leader may have counted
        meanwhile), not from what this replica counted the last time it led."""
        self._k.clear()
        self._held.clear()
        self._since.clear()
        self._origin = None
        self._namespaces.clear()
        self._assumed.clear()
        self._epoch = -1
        self._moved()

    def fold(self, ledger: QuotaLedger, now: float) -> bool:
        """Bring the history up to ``now``; returns whether it is on.

        A series whose usage changed since the last fold is re-anchored: a change the cycle made
        itself (its admissions, assumed at once: :meth:`hold`) from the last fold on, any other
        (the watch event that woke this cycle) from ``now``, so the error is one grain at most.
        When the tree changed, quotas that went are dropped and new ones start: from their stored
        record, decayed across the gap as if they held then what they hold now (their units kept
        running while nobody counted), else from zero."""
        if not self.enabled:
            return False
        if self._epoch == ledger.tree_epoch and now - self.now < self.grain:
            return True  # within the grain: the last fold's figures stand, changes wait for the next
        previous = self.now
        self._moved()
        self.now = max(now, self.now)
        self._keep_finite()
        if self._epoch != ledger.tree_epoch:
            self._epoch = ledger.tree_epoch
            self._sync_tree(ledger)
        quotas, pairs = ledger.take_usage_changes()
        assumed: set[str] = set()
        for leaf in self._assumed:
            if leaf in ledger.quotas:
                assumed.update(ledger.chain(leaf).names)
        self._assumed = set()
        since, now = self._since, self.now
        scale_now, scale_before = self._scale(now), self._scale(previous)
        for name in quotas:
            start = since.get(name)
            if start is None:
                continue
            if name not in assumed:
                scale = scale_now
            else:  # from the last fold on, or from when it was first counted if that is later
                scale = scale_before if previous > start else self._scale(start)
            self._charge(name, ledger.holding(name), scale)
        for quota, ns in pairs:
            if quota in self.by_namespace and quota in since:
                self._namespace_series(quota, ns, ledger, previous if quota in assumed else now)
        return True

    def _moved(self) -> None:
        """A fold (or a restart) begins: every figure read before, and all derived from them, may
        change."""
        self.version += 1
        self.derived.clear()
        self._memo.clear()

    def _scale(self, t: float) -> float:
        assert self._origin is not None
        return float(2.0 ** ((t - self._origin) / self.half_life))

    def _keep_finite(self) -> None:
        """The offsets grow as ``2 ** (t / H)``: past 256 half-lives from the origin, move the
        origin to now (every offset scaled down once, so a float never overflows)."""
        if self._origin is None:
            self._origin = self.now
            return
        if (self.now - self._origin) / self.half_life < 256:
            return
        down = self._scale(self.now) ** -1
        self._origin = self.now
        for k in self._k.values():
            for r in k:
                k[r] *= down

    def _sync_tree(self, ledger: QuotaLedger) -> None:
        quotas = ledger.quotas
        for series in [n for n in self._since if n.partition("/")[0] not in quotas]:
            self._drop(series)
        for name in [n for n in self._namespaces if n not in quotas or n not in self.by_namespace]:
            for series in self._namespaces.pop(name):
                self._drop(series)
        for name in quotas:
            if name in self._since:
                continue
            record = self._stored.get(name)
            self._start(name, ledger.used(name), record, record.usage if record else None)
            if name in self.by_namespace:
                used = ledger.namespace_used(name)
                for ns in sorted(used.keys() | (record.namespaces.keys() if record else set())):
                    stored = record.namespaces.get(ns, {}) if record is not None else None
                    self._start(f"{name}/{ns}", dict(used.get(ns, {})), record, stored)

    def _start(
        self,
        series: str,
        held: Mapping[str, int],
        record: Record | None,
        stored: Mapping[str, int] | None,
        at: float | None = None,
    ) -> None:
        """Count ``series`` from now on (or from ``at``), holding ``held``: from ``stored`` as of
        ``record.at`` when given (decayed across the gap as if it held ``held`` meanwhile), else
        from nothing."""
        quota, _, ns = series.partition("/")
        if ns:
            self._namespaces.setdefault(quota, set()).add(series)
        held = {r: v for r, v in held.items() if v}
        if record is None or stored is None or record.at > self.now:
            since, base = (self.now if at is None else at), {}
        else:
            since, base = record.at, {r: float(v) for r, v in stored.items()}
        scale = self._scale(since)
        self._k[series] = {r: (base.get(r, 0.0) - held.get(r, 0)) * scale for r in base.keys() | held.keys()}
        self._held[series] = held
        self._since[series] = since

    def _namespace_series(self, quota: str, ns: str, ledger: QuotaLedger, at: float) -> None:
        series = f"{quota}/{ns}"
        held = ledger.namespace_used(quota).get(ns, {})
        if series not in self._since:
            self._start(series, held, None, None, at=at)  # from nothing at ``at``: held since
            return
        start = self._since[series]
        self._charge(series, held, self._scale(at if at > start else start))
        if not self._held[series] and not self._value(series, self.now):
            self._drop(series)  # a namespace forgotten
            self._namespaces.get(quota, set()).discard(series)

    def _drop(self, series: str) -> None:
        self._k.pop(series, None)
        self._held.pop(series, None)
        self._since.pop(series, None)

    def hold(self, *leaves: str) -> None:
        """What the quotas ``leaves`` (and so every quota above them) hold changed just after a
        fold (the cycle's own admissions, assumed into the cache at once): the next fold charges
        the new usage from that fold on. Only noted here, so an admission costs the history
        nothing more."""
        self._assumed.update(leaves)

    def _charge(self, series: str, holding: Mapping[str, int], scale: float) -> None:
        """From the time whose scale is ``scale`` on, ``series`` holds ``holding``: the average
        stays continuous there (one multiply-add per resource that changed)."""
        old, k = self._held[series], self._k[series]
        held: dict[str, int] = {}
        for r, v in holding.items():
            if v:
                held[r] = v
            delta = old.get(r, 0) - v
            if delta:
                k[r] = k.get(r, 0.0) + delta * scale
        for r, v in old.items():
            if r not in holding:
                k[r] = k.get(r, 0.0) + v * scale
        self._held[series] = held

    def _value(self, series: str, at: float) -> dict[str, float]:
        """The average at ``at``. Every resource held has an offset (:meth:`_start` gives one to
        each, :meth:`_charge` to each that changes, and none is ever removed), so the offsets name
        every resource the average can have."""
        held, k = self._held[series], self._k[series]
        decay = self._scale(at) ** -1
        out: dict[str, float] = {}
        for r, offset in k.items():
            h = held.get(r, 0)
            value = h + offset * decay
            if value >= 0.5 or h:  # below half a milli unit and nothing held: forgotten
                out[r] = value
        return out

    def usage(self, name: str) -> Mapping[str, float]:
        """The decayed average of ``name`` (a quota, or ``quota/namespace``) per resource as of
        the last fold (milli units; empty when unknown)."""
        found = self._memo.get(name)
        if found is None:
            found = self._memo[name] = self._value(name, self.now) if name in self._since else {}
        return found

    def record(self, name: str) -> Record | None:
        """What to store on the quota now (None: not counted yet, or history off)."""
        if name not in self._since:
            return None
        namespaces = {
            s.partition("/")[2]: {r: round(v) for r, v in sorted(self.usage(s).items()) if round(v) > 0}
            for s in sorted(self._namespaces.get(name, ()))
        }
        return Record(
            at=self.now,
            usage={r: round(v) for r, v in sorted(self.usage(name).items())},
            namespaces={ns: u for ns, u in namespaces.items() if u},
        )

    def namespace_ranks(self, quota: Quota) -> dict[str, int]:
        """The namespaces of ``quota``'s own units by decayed usage, lowest first: rank 1, 2, ...
        (a namespace without history is 0, ahead of all). Usage is compared as the largest
        fraction of the quota's ``max`` over its resources, in whole percent, so two namespaces
        that used about the same share the rank rather than swap it every second."""
        scores: dict[str, float] = {}
        for series in self._namespaces.get(quota.name, ()):
            avg = self.usage(series)
            fractions = [avg.get(r, 0.0) / cap for r, cap in quota.max.items() if cap > 0]
            if not fractions:
                fractions = [sum(avg.values())]
            scores[series.partition("/")[2]] = round(max(fractions, default=0.0), 2)
        distinct = sorted(set(scores.values()))
        return {ns: distinct.index(v) + 1 for ns, v in sorted(scores.items())}

    def shares(
        self, ledger: QuotaLedger, parent: str, kids: Sequence[str], weights: Mapping[str, Mapping[str, int]]
    ) -> dict[str, Standing]:
        """Each of ``kids``' standing below ``parent``; ``weights`` per kid per resource (the
        weights ``guarantees`` divides with, over the resources the parent limits)."""
        limit = ledger.quotas[parent].max
        out: dict[str, Standing] = {}
        totals = {r: sum(weights[c].get(r, 0) for c in kids) for r in limit}
        for c in kids:
            usage = self.usage(c)
            share: dict[str, float] = {}
            factors: dict[str, float] = {}
            score = 0.0
            for r, cap in limit.items():
                s = weights[c].get(r, 0) / totals[r] if totals[r] > 0 else 0.0
                share[r] = s
                factors[r] = factor(usage.get(r, 0.0), cap, s)
                score = max(score, standing_score(usage.get(r, 0.0), cap, s))
            out[c] = Standing(
                name=c,
                usage={r: round(v) for r, v in sorted(usage.items())},
                share=share,
                factor=factors,
                score=score,
            )
        return out

"""Where a quota stands among its siblings, from usage history: the order queues are scanned in,
and the words users read about it (docs/compatibility.md#fair-over-time).

``shared.core.history`` keeps the decayed averages and the factor; ``shared.core.guarantees``
divides spare capacity with them. This module answers "who goes first, and why": below each parent
quota, the siblings ordered by standing (their largest ``u / s``, decayed usage as a fraction of
the parent against their weight's fraction of the siblings'), and, per level of a quota's chain,
the siblings ahead of it with their figures, for ``kubectl koord-queue explain`` and the
visibility API.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from koord_queue.shared.api import quantities
from koord_queue.shared.core import guarantees
from koord_queue.shared.core.guarantees import weight
from koord_queue.shared.core.history import Standing, UsageHistory
from koord_queue.shared.core.quota import QuotaLedger

__all__ = ["Level", "Ranks", "describe_level", "levels", "ranks"]


@dataclass(frozen=True, slots=True)
class Level:
    """One level of a quota's chain: the parent, the siblings (the quota itself included) in the
    order they get spare capacity, and the parent's limit on each resource."""

    parent: str
    quota: str
    order: tuple[Standing, ...]
    limit: Mapping[str, int]

    @property
    def ahead(self) -> tuple[Standing, ...]:
        """The siblings served before ``quota`` (a strictly lower standing)."""
        mine = next(s for s in self.order if s.name == self.quota)
        return tuple(s for s in self.order if s.score < mine.score)


class Ranks:
    """Standings below each parent quota, computed on first use (one cycle's figures)."""

    def __init__(self, ledger: QuotaLedger, history: UsageHistory) -> None:
        self.ledger = ledger
        self.history = history
        self._cache: dict[str, dict[str, Standing]] = {}
        self._keys: dict[str, tuple[float, ...]] = {}

    def standing(self, parent: str) -> dict[str, Standing]:
        found = self._cache.get(parent)
        if found is None:
            kids = self.ledger.children().get(parent, ())
            limit = self.ledger.quotas[parent].max
            weights = {
                c: {r: weight(self.ledger.quotas[c], r, unlimited=cap) for r, cap in limit.items()}
                for c in kids
            }
            found = self._cache[parent] = self.history.shares(self.ledger, parent, kids, weights)
        return found

    def score(self, parent: str, kid: str) -> float:
        """``kid``'s standing below ``parent`` (0 for a quota that is not its child)."""
        found = self.standing(parent).get(kid)
        return found.score if found is not None else 0.0

    def key(self, name: str) -> tuple[float, ...]:
        """The standing of ``name`` and of each quota above it, from the top, below the parents
        that divide spare capacity (``guarantees.borrowing``; elsewhere siblings never compete):
        queues compare level by level, so the sibling subtree that used less lately goes first."""
        found = self._keys.get(name)
        if found is None:
            quotas, dividing = self.ledger.quotas, guarantees.borrowing(self.ledger)
            found = self._keys[name] = tuple(
                self.score(quotas[q].parent, q) if quotas[q].parent in dividing else 0.0
                for q in reversed(self.ledger.chain(name).names)
            )
        return found


def ranks(ledger: QuotaLedger, history: UsageHistory) -> Ranks:
    """The standings of the current figures, kept until they move (``history.derived``) or the
    tree changes: the scan order asks every cycle, the figures change once a fold."""
    key = ("ranks", id(ledger), ledger.tree_epoch)
    found = history.derived.get(key)
    if not isinstance(found, Ranks):
        found = history.derived[key] = Ranks(ledger, history)
    return found


def levels(ledger: QuotaLedger, history: UsageHistory, name: str) -> list[Level]:
    """Every level of ``name``'s chain that divides spare capacity among siblings, from the top."""
    if not history.enabled or name not in ledger.quotas:
        return []
    ranks = Ranks(ledger, history)
    quotas, children = ledger.quotas, ledger.children()
    out: list[Level] = []
    for q in reversed(ledger.chain(name).names):
        parent = quotas[q].parent
        if parent not in children:
            continue
        standing = ranks.standing(parent)
        order = tuple(sorted(standing.values(), key=lambda s: (s.score, s.name)))
        out.append(Level(parent=parent, quota=q, order=order, limit=dict(quotas[parent].max)))
    return out


def _figure(standing: Standing, limit: Mapping[str, int]) -> str:
    parts = []
    for r in sorted(limit):
        used = standing.usage.get(r, 0)
        cap = limit[r]
        frac = used / cap if cap > 0 else 0.0
        parts.append(
            f"{quantities.format_milli(used, resource=r)} {r} ({frac:.0%} of the parent) "
            f"against a {standing.share.get(r, 0.0):.0%} share"
        )
    return "; ".join(parts) if parts else "no usage"


def describe_level(level: Level) -> str:
    """One sentence per level: who is ahead of the quota and why, or that nobody is."""
    mine = next(s for s in level.order if s.name == level.quota)
    head = f"below {level.parent}: {level.quota} has held {_figure(mine, level.limit)} lately"
    ahead = level.ahead
    if not ahead:
        return head + "; no sibling is ahead of it for spare capacity"
    names = ", ".join(
        f"{s.name} (held {_figure(s, level.limit)})" for s in sorted(ahead, key=lambda s: (s.score, s.name))
    )
    return f"{head}; ahead of it for spare capacity, because they used less of their share lately: {names}"

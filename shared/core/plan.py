"""The decisions of a scheduling cycle and what it reads: :class:`Plan`, :class:`Snapshot`.

``shared.core.scheduling.schedule`` turns a :class:`Snapshot` and the scheduler's state into a
:class:`Plan`; the reconciler applies its decisions in order
(docs/architecture.md#decision-3-decide-on-a-snapshot-then-act).

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import EventReason, Phase
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core.history import UsageHistory
from koord_queue.shared.core.preemption import MarkVictims
from koord_queue.shared.core.quota import QuotaLedger

__all__ = ["Admit", "Decision", "Park", "Plan", "Snapshot", "announces_admission"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit ``key``: add ``grants`` (pod set -> replicas) to ``status.admissions``."""

    key: str
    queue: str
    grants: Mapping[str, int]
    phase: Phase
    message: str
    admission_checks: tuple[str, ...]
    request: Resources
    reason: EventReason = EventReason.SCHEDULED
    #: where it was admitted (docs/pools.md#fallback-between-pools): the pool, and the quota inside
    #: it charged besides the unit's own (empty when none)
    pool: str = ""
    pool_quota: str = ""


def announces_admission(phase_before: str, *, always: bool) -> bool:
    """Whether an admission to ``Dequeued`` gets the unit event ``Scheduled`` "dequeue success".

    A unit that was ``Enqueued`` before (parked with a reason, or requeued after a backoff) waited,
    and its event history would otherwise end at the last ``FailedScheduling``; it gets the event. A
    unit admitted by the first cycle that sees it (no phase yet) has nothing to close: its status
    says ``Dequeued`` and the event would only cost the apiserver one write per job. ``always``
    (``scheduledEvents: Always``) is upstream's behaviour (docs/compatibility.md#events).
    """
    return always or phase_before == Phase.ENQUEUED


@dataclass(frozen=True, slots=True)
class Park:
    """Leave ``key`` waiting with ``message`` (Warning ``FailedScheduling``).

    ``repeated`` says the message equals the last one given (in memory or in ``status.message``):
    the reconciler may skip the write and the event. ``preempt_error`` (why the preemption attempt
    marked nothing), ``protected`` (candidate victims skipped because of the reclaim protect
    time) and ``promised`` (the victims whose freed quota the unit now waits for, newly marked or
    already on the way; each is promised to one waiting unit at a time) are for the decision log
    and the metrics only.
    """

    key: str
    queue: str
    message: str
    reason: EventReason = EventReason.FAILED_SCHEDULING
    queue_not_found: bool = False
    repeated: bool = False
    preempt_error: str | None = None
    protected: tuple[str, ...] = ()
    promised: tuple[str, ...] = ()


Decision = Admit | Park | MarkVictims


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions of one cycle, in order, and when to run again if nothing else happens."""

    decisions: tuple[Decision, ...] = ()
    wake_at: float | None = None
    examined: int = 0

    @property
    def admits(self) -> list[Admit]:
        return [d for d in self.decisions if isinstance(d, Admit)]

    @property
    def parks(self) -> list[Park]:
        return [d for d in self.decisions if isinstance(d, Park)]

    @property
    def marks(self) -> list[MarkVictims]:
        return [d for d in self.decisions if isinstance(d, MarkVictims)]


@dataclass(slots=True)
class Snapshot:
    """What a cycle reads: every known unit by key and the quota ledger built from them."""

    units: dict[str, Unit] = field(default_factory=dict)
    ledger: QuotaLedger = field(default_factory=QuotaLedger)
    reclaim_protect_seconds: float = 0.0
    #: the ``quotaGuarantees`` switch: ``min``, lending and fair shares below parent quotas
    #: (docs/compatibility.md#quota-guarantees); off, admission checks ``max`` only as upstream.
    guarantees: bool = True
    #: each pool's placement by name (docs/pools.md#placement); None checks no placement (a replay
    #: by a user who cannot read the ElasticQuotaProfiles)
    placements: Mapping[str, PoolPlacement] | None = field(default_factory=dict)
    #: every quota's decayed usage (docs/compatibility.md#fair-over-time); off unless given a
    #: half-life. Folded by each cycle, so it is the one mutable part a cycle changes here.
    history: UsageHistory = field(default_factory=UsageHistory)

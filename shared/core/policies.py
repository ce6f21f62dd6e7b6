"""Per-queue scheduling state, kept incrementally from watch events
(docs/compatibility.md#priority-and-block-policies, docs/compatibility.md#intelligent-policy).

Upstream keeps per queue a sorted slice, ``assumed`` and ``updating`` sets, blocked quotas, a scan
cursor and a preemption flag, mutated from informer callbacks. :class:`QueueState` keeps the same
facts, derived from the units wherever possible so that a relist after a restart rebuilds the same
state (docs/architecture.md#decision-2-the-cluster-is-the-source-of-truth):

* ``lanes``: the *waiting* units (not dequeued, not satisfied, not in backoff, no reclaim in
  progress) as sorted lists of ``sort_key + (key,)`` kept with ``bisect``; one lane for
  Priority/Block, two (high, low) for Intelligent. Inactive units keep their place.
* ``assumed``: units holding quota whose pods are not all running, sorted the same way.
* ``in_flight`` / ``marks``: victims whose reclaim is observed on the unit, or decided and not
  yet observed ("capacity on the way", docs/architecture.md#decision-4-asynchronous-preemption);
  an observed reclaim not carried out within :data:`RECLAIM_TIMEOUT` of being first seen is no
  longer counted on (``stale``), so the preemptor chooses other victims;
  ``round``: the queue's one preemption round.
* ``updating``: units admitted by a plan whose write has not been observed yet.
* ``blocked``: Block/Intelligent's blocked quota. Units reach a queue through their quota label,
  so all units of a queue share one quota and upstream's set of blocked quotas is one flag here.
* ``parked``: each unit's last failure and the availability epoch it was computed at.
* ``dirty``: whether anything that could change a decision happened since the last scan.

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from koord_queue.shared.api.model import QueueConfig, Unit
from koord_queue.shared.api.names import Message, Phase, QueuePolicy
from koord_queue.shared.api.predicates import (
    TERMINAL_PHASES,
    has_reclaim,
    reserved_any_resource,
    reserved_not_run,
    satisfied,
    v1_dequeued,
)
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import gangs
from koord_queue.shared.core.charges import Demand, remaining_request
from koord_queue.shared.core.ordering import SortKey, lane_of, unit_key
from koord_queue.shared.core.quota import QuotaLedger

__all__ = [
    "MARK_OBSERVE_TIMEOUT",
    "RECLAIM_TIMEOUT",
    "Entry",
    "Mark",
    "ParkRecord",
    "PreemptRound",
    "QueueState",
    "SchedulerState",
    "beyond_depth_message",
    "invalid_message",
    "is_assumed",
    "is_waiting",
    "queue_item_details",
    "unlabelled_message",
]

#: A decided mark not observed on the victim within this many seconds is taken as a failed write.
MARK_OBSERVE_TIMEOUT = 60.0
#: An observed reclaim (``reclaimState`` on the victim) still not carried out this many seconds after
#: the scheduler first saw it is no longer capacity on the way: whoever plays the job extension for
#: that unit is not acting on it (the job stopped being managed, an external controller is gone),
#: and the preemptor waiting on it marks other victims instead
#: (docs/compatibility.md#reclaim-by-the-job-extension). Counted from when this process first saw
#: it, so a restart starts the bound again.
RECLAIM_TIMEOUT = 120.0

Item = tuple[int | float | str, ...]


def beyond_depth_message(queue: str, depth: int) -> str:
    return f"waiting in queue {queue}: position is beyond the queue's max-depth {depth}"


def inactive_message(queue: str) -> str:
    return (
        f"QueueUnit is inactive (spec.active is false): it keeps its place in queue {queue} and is "
        "not admitted until spec.active is true"
    )


def invalid_message(problem: str) -> str:
    return f"QueueUnit cannot be scheduled: {problem}; fix its spec to make it schedulable"


def is_waiting(unit: Unit) -> bool:
    """A unit competes for admission: it still needs replicas and nothing is in progress for it."""
    # Equivalent to "not dequeued and not satisfied" (dequeued needs satisfied unless v1/terminal).
    return (
        unit.phase not in TERMINAL_PHASES
        and unit.phase != Phase.TIMEOUT_BACKOFF
        and not has_reclaim(unit)
        and not v1_dequeued(unit)
        and not satisfied(unit)
    )


def unlabelled_message(unit: Unit) -> str | None:
    """The message a unit with no quota label should show, or None when it needs none.

    Such a unit maps to no queue, so no cycle ever looks at it
    (docs/compatibility.md#s29-unit-without-a-quota-label: no phase, no event). Only one that never got
    a phase is told why; one that lost its label later keeps whatever its last decision said.
    """
    if unit.quota or unit.phase or unit.message == Message.NO_QUOTA_LABEL:
        return None
    return Message.NO_QUOTA_LABEL


def is_assumed(unit: Unit) -> bool:
    """Holds quota but not all pods run (upstream's ``assumed`` membership, derived)."""
    return unit.phase not in TERMINAL_PHASES and reserved_not_run(unit) and reserved_any_resource(unit)


@dataclass(slots=True)
class Entry:
    """What the scan needs about a waiting unit, cached so the scan never recomputes it."""

    item: Item
    lane: int
    request: Resources
    active: bool
    invalid: str | None
    name: str
    namespace: str
    priority: int
    #: the smallest admission the unit accepts (its ``minCount`` floor; else ``request``)
    smallest: Resources | None = None


@dataclass(slots=True)
class ParkRecord:
    """The last park of a unit; ``level`` is the quota that refused it (``None``: not known)."""

    message: str
    epoch: int
    quota_failure: bool
    level: str | None = None


@dataclass(slots=True)
class Mark:
    reclaim: dict[str, int]
    marked_at: float


@dataclass(slots=True)
class PreemptRound:
    """The queue's single preemption round: who preempts, and whom it is waiting for."""

    preemptor: str
    victims: set[str] = field(default_factory=set)
    started_at: float = 0.0


class QueueState:
    """Everything the scheduler remembers about one queue between cycles."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.name = config.name
        self.lanes: tuple[list[Item], list[Item]] = ([], [])
        self.entries: dict[str, Entry] = {}
        self.assumed: list[Item] = []
        self.assumed_items: dict[str, Item] = {}
        #: assumed units with a raised preemption priority (``preemption._unpreemptable_holder``)
        self.raised: set[str] = set()
        self.in_flight: dict[str, dict[str, int]] = {}
        #: when each ``in_flight`` reclaim was first seen by :meth:`expire` (its clock), and those
        #: past :data:`RECLAIM_TIMEOUT`
        self.in_flight_seen: dict[str, float] = {}
        self.stale: set[str] = set()
        self.marks: dict[str, Mark] = {}
        self.updating: set[str] = set()
        #: the version each unit in ``updating`` had when its admission was decided
        self.updating_versions: dict[str, str] = {}
        self.blocked = False
        self.parked: dict[str, ParkRecord] = {}
        self.unparked: set[str] = set()
        self.round: PreemptRound | None = None
        self.dirty = True
        self.wake_at: float | None = None
        self.last_attempt_at: float | None = None
        self.demand = Demand()
        self.active_in_lane = [0, 0]
        #: Quotas that refused this queue's units in its last scan; only releases there can help.
        #: ``None`` means unknown (wake on any release on the chain).
        self.limiting: frozenset[str] | None = None
        #: ``fair_order`` queues: each namespace's rank by decayed usage (lower first; 0 for none)
        self.ranks: Mapping[str, int] = {}

    @property
    def policy(self) -> QueuePolicy | None:
        return self.config.policy

    def sort_key(self, unit: Unit) -> SortKey:
        """The unit's place in its lane: its key, with (``fair_order``) its namespace's rank right
        after its priority (docs/compatibility.md#fair-order-inside-a-queue)."""
        key = unit_key(unit, self.config.policy)
        if self.config.fair_order:
            return (key[0], self.ranks.get(unit.namespace, 0), *key[1:])
        return key

    # --- watch events -------------------------------------------------------------------------------

    def upsert(self, unit: Unit) -> None:
        """Fold the current state of a unit labelled with this queue's quota into the state."""
        key = unit.key
        reclaim = {a.name: a.reclaim_replicas for a in unit.admissions if a.reclaim_replicas is not None}
        if reclaim:
            if key not in self.in_flight:
                self.dirty = True  # the next scan starts its RECLAIM_TIMEOUT (``expire``)
            self.in_flight[key] = reclaim
            self.marks.pop(key, None)
        elif self.in_flight.pop(key, None) is not None:
            self.in_flight_seen.pop(key, None)
            self.stale.discard(key)
            self.dirty = True
        self._set_assumed(unit)
        if is_waiting(unit):
            if key in self.updating and self.updating_versions.get(key) != unit.resource_version:
                # A partial admission (docs/compatibility.md#gangs-and-partial-admission) leaves
                # the unit waiting: a newer version seen means its write landed.
                self.updating.discard(key)
                self.updating_versions.pop(key, None)
                self.dirty = True  # it competes again for the rest
            entry = self._entry(unit)
            old = self.entries.get(key)
            if old != entry:
                if old is not None:
                    self._drop_entry(key, old)
                self._add_entry(key, entry)
                self.parked.pop(key, None)
                if entry.active or entry.invalid is not None:
                    self.unparked.add(key)
                else:
                    self.unparked.discard(key)
                self.blocked = False
                self.dirty = True
        else:
            old = self.entries.get(key)
            if old is not None:
                self._drop_entry(key, old)
                # Our own admission landing frees nothing for the others, except where a waiting
                # unit's mere presence matters (Intelligent's high sub-queue, the max-depth window).
                if key not in self.updating or self._presence_matters():
                    self.dirty = True
            self.parked.pop(key, None)
            self.unparked.discard(key)
            self.updating.discard(key)
            self.updating_versions.pop(key, None)

    def remove(self, key: str) -> None:
        """The unit was deleted or moved to another queue."""
        old = self.entries.get(key)
        if old is not None:
            self._drop_entry(key, old)
        item = self.assumed_items.pop(key, None)
        if item is not None:
            del self.assumed[bisect.bisect_left(self.assumed, item)]
        self.raised.discard(key)
        for table in (self.in_flight, self.marks, self.parked, self.in_flight_seen):
            table.pop(key, None)
        self.stale.discard(key)
        self.unparked.discard(key)
        self.updating.discard(key)
        self.updating_versions.pop(key, None)
        if self.round is not None:
            self.round.victims.discard(key)
            if self.round.preemptor == key:
                self.round = None
        self.blocked = False
        self.dirty = True

    def release(self) -> None:
        """Quota on this queue's chain was released: blocked units may fit again."""
        self.blocked = False
        self.dirty = True

    # --- plan feedback ----------------------------------------------------------------------------

    def forget_park(self, key: str) -> None:
        """The waiting message could not be written: decide (and write) it again next scan."""
        if key in self.entries:
            self.parked.pop(key, None)
            self.unparked.add(key)
            self.dirty = True

    def forget_admit(self, key: str) -> None:
        """The admission write failed: the unit competes again (upstream's Unreserve)."""
        self.updating.discard(key)
        self.updating_versions.pop(key, None)
        self.dirty = True

    def forget_marks(self, keys: set[str] | frozenset[str]) -> None:
        """Marking writes failed or were skipped: those victims are no longer on the way."""
        for key in keys:
            self.marks.pop(key, None)
        self.dirty = True

    def expire(self, now: float) -> None:
        """Drop marks never observed and end a round that has nothing left to wait for."""
        for key in sorted(self.marks):
            if now - self.marks[key].marked_at > MARK_OBSERVE_TIMEOUT:
                del self.marks[key]
                self.dirty = True
        for key in sorted(self.in_flight):
            seen = self.in_flight_seen.setdefault(key, now)
            if key not in self.stale and now - seen > RECLAIM_TIMEOUT:
                self.stale.add(key)
                self.dirty = True
        round_ = self.round
        if round_ is None:
            return
        waiting = round_.preemptor in self.entries and round_.preemptor not in self.updating
        if not waiting or not any(self.on_the_way(v) for v in round_.victims):
            self.round = None
            self.dirty = True

    def _presence_matters(self) -> bool:
        return self.config.policy is QueuePolicy.INTELLIGENT or self.config.max_depth > 0

    def on_the_way(self, key: str) -> bool:
        """A reclaim was decided for ``key`` and has not finished (nor gone stale)."""
        return (key in self.in_flight and key not in self.stale) or key in self.marks

    def reclaim_deadline(self) -> float | None:
        """When the oldest observed reclaim still counted on goes stale (for the queue's timer)."""
        times = [t + RECLAIM_TIMEOUT for k, t in self.in_flight_seen.items() if k not in self.stale]
        return min(times) if times else None

    def reclaim_on_the_way(self, key: str) -> dict[str, int]:
        mark = self.marks.get(key)
        if mark is not None:
            return mark.reclaim
        return self.in_flight.get(key, {})

    # --- internals ----------------------------------------------------------------------------------

    def _entry(self, unit: Unit) -> Entry:
        return Entry(
            item=(*self.sort_key(unit), unit.key),
            lane=lane_of(unit, self.config),
            request=remaining_request(unit),
            smallest=gangs.smallest_request(unit),
            active=unit.active and unit.invalid is None,
            invalid=unit.invalid,
            name=unit.name,
            namespace=unit.namespace,
            priority=unit.priority,
        )

    def _add_entry(self, key: str, entry: Entry) -> None:
        self.entries[key] = entry
        bisect.insort(self.lanes[entry.lane], entry.item)
        if entry.active:
            self.demand.add(entry.request, entry.smallest)
            self.active_in_lane[entry.lane] += 1

    def _drop_entry(self, key: str, entry: Entry) -> None:
        del self.entries[key]
        lane = self.lanes[entry.lane]
        del lane[bisect.bisect_left(lane, entry.item)]
        if entry.active:
            self.demand.remove(entry.request, entry.smallest)
            self.active_in_lane[entry.lane] -= 1

    def _set_assumed(self, unit: Unit) -> None:
        key = unit.key
        old = self.assumed_items.get(key)
        new = (*unit_key(unit, self.config.policy), key) if is_assumed(unit) else None
        self.raised.discard(key)
        if new is not None and unit.victim_priority > unit.priority:
            self.raised.add(key)
        if old == new:
            return
        if old is not None:
            del self.assumed[bisect.bisect_left(self.assumed, old)]
            del self.assumed_items[key]
            if new is None and self.config.wait_for_pods_running:
                self.blocked = False  # upstream: a unit that left assumed unblocks the queue
        if new is not None:
            bisect.insort(self.assumed, new)
            self.assumed_items[key] = new
        if self.config.wait_for_pods_running:  # only then does the assumed set hold the queue
            self.dirty = True


def rebuild(
    state: QueueState, config: QueueConfig, units: Mapping[str, Unit], members: set[str]
) -> QueueState:
    """A state for a changed Queue spec, keeping what is in progress (marks, round, admissions)."""
    fresh = QueueState(config)
    fresh.ranks = state.ranks
    fresh.marks = state.marks
    fresh.in_flight_seen = state.in_flight_seen
    fresh.stale = state.stale
    fresh.round = state.round
    fresh.updating = state.updating
    fresh.updating_versions = state.updating_versions
    fresh.last_attempt_at = state.last_attempt_at
    for key in sorted(members):
        fresh.upsert(units[key])
    return fresh


def queue_item_details(state: QueueState) -> list[dict[str, object]]:
    """``Queue.status.queueItemDetails["active"]``: waiting units with 1-based positions.

    Intelligent lists its high sub-queue then its low one, numbered continuously
    (docs/compatibility.md#intelligent-policy).
    """
    out: list[dict[str, object]] = []
    for lane in state.lanes:
        for item in lane:
            entry = state.entries[str(item[-1])]
            row = {"name": entry.name, "namespace": entry.namespace, "priority": entry.priority}
            out.append({**row, "position": len(out) + 1})
    return out


class SchedulerState:
    """All queues' states plus the routing of units to queues by their quota label.

    Units whose label names a queue that does not exist (or whose Queue has an unsupported policy)
    wait in ``orphans`` and are parked once with ``queue <q> is not exist``; they move into the
    queue as soon as it appears. Units without a quota label are not tracked at all
    (docs/compatibility.md#units-without-a-quota-label).
    ``dirty`` names the queues a cycle must rescan; ``timers`` the queues to rescan at a given time.
    """

    def __init__(self) -> None:
        self.queues: dict[str, QueueState] = {}
        self.configs: dict[str, QueueConfig] = {}
        self.members: dict[str, set[str]] = {}
        self.orphans: dict[str, set[str]] = {}
        self.orphans_parked: set[str] = set()
        self.dirty: set[str] = set()
        self.timers: dict[str, float] = {}
        #: the last cycle's guarantee figures (``shared.core.guarantees.Shares``), per quota
        self.runtime: Mapping[str, Resources] = {}
        self.requests: Mapping[str, Resources] = {}
        self.guaranteed: Mapping[str, Resources] = {}
        #: per parent quota, the guaranteed capacity its children claimed and did not use
        self.gaps: Mapping[str, Resources] = {}
        #: per queue, bumped when a quota on its chain got a larger runtime (parked units retry)
        self.share_epochs: dict[str, int] = {}
        self._dependents: dict[str, set[str]] = {}
        self._dependents_epoch: tuple[int, int] | None = None

    def put_unit(self, old: Unit | None, unit: Unit, units: Mapping[str, Unit]) -> None:
        if old is not None and old.quota and old.quota != unit.quota:
            self._detach(old.key, old.quota)
        name = unit.quota
        if not name:
            return
        self.members.setdefault(name, set()).add(unit.key)
        state = self.queues.get(name)
        if state is not None:
            state.upsert(unit)
            self._sync_dirty(state)
        elif is_waiting(unit):
            self.orphans.setdefault(name, set()).add(unit.key)
        else:
            self._drop_orphan(name, unit.key)

    def delete_unit(self, unit: Unit) -> None:
        if unit.quota:
            self._detach(unit.key, unit.quota)

    def put_queue(self, config: QueueConfig, units: Mapping[str, Unit]) -> None:
        name = config.name
        self.configs[name] = config
        self._dependents_epoch = None
        if config.policy is None:
            self._unqueue(name, units)
            return
        members = self.members.get(name, set())
        state = self.queues.get(name)
        if state is None:
            state = rebuild(QueueState(config), config, units, members)
            self.queues[name] = state
            self.orphans.pop(name, None)
            for key in members:
                self.orphans_parked.discard(key)
        elif state.config != config:
            state = rebuild(state, config, units, members)
            self.queues[name] = state
        else:
            return
        self.dirty.add(name)

    def rerank(self, name: str, ranks: Mapping[str, int], units: Mapping[str, Unit]) -> None:
        """A ``fair_order`` queue's namespace ranks changed: its lanes are sorted again."""
        state = self.queues[name]
        state.ranks = ranks
        self.queues[name] = rebuild(state, state.config, units, self.members.get(name, set()))
        self.dirty.add(name)

    def delete_queue(self, name: str, units: Mapping[str, Unit]) -> None:
        self.configs.pop(name, None)
        self._dependents_epoch = None
        self._unqueue(name, units)

    def on_release(self, quotas: frozenset[str] | set[str], chain_of: QuotaLedger) -> None:
        """Wake the queues whose quota chain contains a quota that released usage or changed."""
        epoch = (chain_of.tree_epoch, len(self.queues))
        if self._dependents_epoch != epoch:
            self._dependents = {}
            for qname in sorted(self.queues):
                for quota in (*chain_of.chain(qname).names, qname):
                    self._dependents.setdefault(quota, set()).add(qname)
            self._dependents_epoch = epoch
        if not quotas:
            return
        woken: set[str] = set()
        for quota in quotas:
            woken.update(self._dependents.get(quota, ()))
        for qname in sorted(woken):
            state = self.queues[qname]
            if state.limiting is None or not state.limiting.isdisjoint(quotas):
                state.release()
                self.dirty.add(qname)

    def on_share_growth(self, quotas: set[str], chain_of: QuotaLedger) -> None:
        """The runtime of ``quotas`` grew: every queue below them may fit more now."""
        if not quotas:
            return
        self.on_release(frozenset(), chain_of)  # refresh the dependents map if the tree changed
        woken: set[str] = set()
        for quota in quotas:
            woken.update(self._dependents.get(quota, ()))
        for qname in sorted(woken):
            self.share_epochs[qname] = self.share_epochs.get(qname, 0) + 1
            self.queues[qname].release()
            self.dirty.add(qname)

    def wake_all(self) -> None:
        """The quota tree changed shape: every queue may see different limits."""
        for qname in sorted(self.queues):
            self.queues[qname].release()
            self.queues[qname].limiting = None
            self.dirty.add(qname)

    def mark_dirty(self, state: QueueState) -> None:
        self._sync_dirty(state)

    def new_orphans(self) -> list[tuple[str, str]]:
        """``(queue, unit key)`` of orphans not parked yet, in order; they count as parked now."""
        found = [(q, k) for q in sorted(self.orphans) for k in sorted(self.orphans[q] - self.orphans_parked)]
        self.orphans_parked.update(k for _, k in found)
        return found

    def fire_timers(self, now: float, *, block_stale: float) -> None:
        """Queues whose timer is due become dirty; a block older than ``block_stale`` is lifted."""
        for qname in sorted(q for q, at in self.timers.items() if at <= now):
            del self.timers[qname]
            self.dirty.add(qname)
            state = self.queues.get(qname)
            if state is not None and state.blocked and (state.last_attempt_at or 0.0) + block_stale <= now:
                state.blocked = False

    # --- internals ----------------------------------------------------------------------------------

    def _sync_dirty(self, state: QueueState) -> None:
        if state.dirty:
            self.dirty.add(state.name)

    def _detach(self, key: str, name: str) -> None:
        self.members.get(name, set()).discard(key)
        state = self.queues.get(name)
        if state is not None:
            state.remove(key)
            self.dirty.add(name)
        self._drop_orphan(name, key)

    def _drop_orphan(self, name: str, key: str) -> None:
        orphans = self.orphans.get(name)
        if orphans is not None:
            orphans.discard(key)
            if not orphans:
                del self.orphans[name]
        self.orphans_parked.discard(key)

    def _unqueue(self, name: str, units: Mapping[str, Unit]) -> None:
        """The queue is gone or unusable: its waiting units become orphans."""
        self.queues.pop(name, None)
        self.dirty.discard(name)
        self.timers.pop(name, None)
        for key in sorted(self.members.get(name, set())):
            if is_waiting(units[key]):
                self.orphans.setdefault(name, set()).add(key)

"""One scheduling cycle as a pure function of the cache: ``schedule(snapshot, state, now) -> Plan``.

ARCHITECTURE decision 3: decide on a snapshot, then act; the reconciler applies the plan in order
(assume each admission into the cache, write, forget on failure; write the victims' reclaim states;
write parked units' messages and events). How a cycle works (REFERENCE §3.4-3.7):

1. Units whose quota label names no usable queue are parked once with ``queue <q> is not exist``
   (``queue_not_found=True``: the reconciler emits ``QueueNotFound`` once per unit). Units whose
   namespace may not use their quota (``QuotaLedger.binding_problem``) keep their place but never
   compete: the queues see them as invalid, and they are parked once with the binding text.
2. Queues are served **strictly in order** of ``spec.priority``, then name (upstream runs them
   concurrently). Only queues where something changed since their last scan are scanned (a unit
   event, a release on a quota that limited them, a spec change, a timer).
3. A scanned queue is walked from its head (a batch rescan replaces upstream's cursor) and may
   admit **many** units; each admission enters the cycle's usage view at once, so nothing is
   over-admitted within the cycle.
4. Per unit: skip units being admitted and inactive units (they keep their place); run the quota
   **filter**; on failure the preempt path runs and the unit is parked with the filter text plus
   ``"; preempt succeed"`` / ``"; preempt failed"``; on success, under ``wait-for-pods-running``
   with the queue held, the reserve path runs; otherwise admit to ``Reserved`` (a queue admission
   check selects the unit) or ``Dequeued``.
5. Policies: Priority lets lower units bypass a failed one; Block blocks the quota until a release,
   add or delete for it (or 3 minutes without an attempt); Intelligent blocks on failure too and
   scans its low sub-queue only when no high unit waits. ``max-depth`` caps the scan (Intelligent
   included, where upstream parses and ignores it). Units sorting after a preemptor whose round is
   in progress wait for it: it is first in line for the quota being freed.
6. Cost control without changing outcomes: a scan stops once no later unit can be admitted (the
   headroom is below every pending request; a unit sorting earlier holds the queue; a round is in
   progress); units not examined since they (re)entered the queue still get one park with their
   own reason; a unit parked for quota is not re-examined until its chain releases something.
   Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from shared.admission_checks import matched_checks
from shared.model import QueueConfig, Quota, Unit, evolve, with_grants
from shared.names import EventReason, Message, Phase, QueuePolicy
from shared.ordering import queue_key
from shared.policies import (
    Entry,
    Item,
    ParkRecord,
    QueueState,
    SchedulerState,
    beyond_depth_message,
    inactive_message,
    invalid_message,
    queue_item_details,
)
from shared.predicates import has_reclaim, satisfied
from shared.preemption import (
    MarkVictims,
    PreemptOutcome,
    disabled_reason,
    first_holder,
    may_preempt,
    plan_preempt,
    plan_reserve,
    record_outcome,
    skip_reason,
)
from shared.quantities import Resources
from shared.quota import QuotaLedger, UsageView, remaining_grants

__all__ = [
    "BLOCK_STALE_SECONDS",
    "Admit",
    "Cache",
    "Decision",
    "Park",
    "Plan",
    "Snapshot",
    "UnitNotes",
    "schedule",
]

#: Block/Intelligent: blocked quotas are cleared after this long without any attempt (upstream).
BLOCK_STALE_SECONDS = 180.0


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


@dataclass(frozen=True, slots=True)
class Park:
    """Leave ``key`` waiting with ``message`` (Warning ``FailedScheduling``).

    ``repeated`` says the message equals the last one given (in memory or in ``status.message``):
    the reconciler may skip the write and the event. ``preempt_error`` (why the preemption attempt
    marked nothing) and ``protected`` (candidate victims skipped because of the reclaim protect
    time) are for the decision log and the metrics only.
    """

    key: str
    queue: str
    message: str
    reason: EventReason = EventReason.FAILED_SCHEDULING
    queue_not_found: bool = False
    repeated: bool = False
    preempt_error: str | None = None
    protected: tuple[str, ...] = ()


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


class _Stop(enum.Enum):
    BLOCKED = "blocked"  # Block/Intelligent quota blocked, or Block holding after a preemption
    EXHAUSTED = "exhausted"  # no pending request fits the headroom any more
    HELD = "held"  # wait-for-pods-running: a unit sorting earlier holds the queue
    PREEMPTING = "preempting"  # behind a preemptor whose round is in progress
    HIGH_WAITING = "high-waiting"  # Intelligent: high units still wait


class _Cycle:
    def __init__(self, snapshot: Snapshot, state: SchedulerState, now: float) -> None:
        self.units = snapshot.units
        self.ledger = snapshot.ledger
        self.protect = snapshot.reclaim_protect_seconds
        self.state = state
        self.now = now
        self.view: UsageView = snapshot.ledger.view()
        self.decisions: list[Decision] = []
        self.examined = 0
        self.admitted: dict[str, list[Item]] = {}
        self.epochs: dict[str, int] = {}
        self.levels: set[str | None] = set()

    # --- helpers ------------------------------------------------------------------------------------

    def epoch(self, qs: QueueState) -> int:
        value = self.epochs.get(qs.name)
        if value is None:
            value = self.epochs[qs.name] = self.ledger.epoch(qs.name)
        return value

    def park(
        self,
        qs: QueueState,
        key: str,
        message: str,
        *,
        quota_failure: bool,
        preempt_error: str | None = None,
        protected: tuple[str, ...] = (),
    ) -> None:
        previous = qs.parked.get(key)
        repeated = message in (self.units[key].message, previous.message if previous else None)
        level = self.view.level if quota_failure else None
        if quota_failure:
            self.levels.add(level)
        qs.parked[key] = ParkRecord(message, self.epoch(qs), quota_failure, level)
        qs.unparked.discard(key)
        self.decisions.append(
            Park(
                key=key,
                queue=qs.name,
                message=message,
                repeated=repeated,
                preempt_error=preempt_error,
                protected=protected,
            )
        )

    def stop_reason(self, qs: QueueState, key: str, item: Item) -> _Stop | None:
        if qs.config.wait_for_pods_running:
            holder = first_holder(qs, self.admitted.get(qs.name, []), key)
            if holder is not None and holder < item:
                return _Stop.HELD
        minimums = qs.demand.minimums()
        if self.view.exhausted(qs.name, minimums, any_empty=qs.demand.empty > 0) and not may_preempt(
            qs, key, item
        ):
            self.levels.add(self.view.level)
            return _Stop.EXHAUSTED
        return None

    # --- one queue ----------------------------------------------------------------------------------

    def scan(self, qs: QueueState) -> None:
        qs.expire(self.now)
        qs.dirty = False
        qs.wake_at = None
        self.levels = set()
        if qs.config.policy is QueuePolicy.INTELLIGENT:
            stop = self.scan_lane(qs, 0)
            high_left = qs.active_in_lane[0] - sum(
                1 for k in qs.updating if k in qs.entries and qs.entries[k].lane == 0
            )
            if stop is None and high_left > 0:
                stop = _Stop.HIGH_WAITING
            if stop is None:
                self.scan_lane(qs, 1)
            else:
                low = stop if stop in (_Stop.BLOCKED, _Stop.HELD) else _Stop.HIGH_WAITING
                self.park_unparked(qs, 1, 0, low)
        else:
            self.scan_lane(qs, 0)
        qs.limiting = None if None in self.levels else frozenset(str(n) for n in self.levels)
        self.set_timer(qs)

    def scan_lane(self, qs: QueueState, lane_no: int) -> _Stop | None:
        lane = qs.lanes[lane_no]
        depth = qs.config.max_depth
        limit = len(lane) if depth <= 0 else min(len(lane), depth)
        policy = qs.config.policy
        check_stop = True
        pos = 0
        while pos < limit:
            item = lane[pos]
            pos += 1
            key = str(item[-1])
            entry = qs.entries[key]
            if key in qs.updating:
                continue
            if not entry.active:
                if key in qs.unparked:
                    self.park(qs, key, self.idle_reason(qs, entry), quota_failure=False)
                continue
            stop: _Stop | None = None
            round_ = qs.round
            if qs.blocked:
                stop = _Stop.BLOCKED
            elif (
                round_ is not None
                and round_.preemptor != key
                and round_.preemptor in qs.entries
                and qs.entries[round_.preemptor].item < item
            ):
                stop = _Stop.PREEMPTING
            elif check_stop:
                stop = self.stop_reason(qs, key, item)
                check_stop = False
            if stop is not None:
                self.park_unparked(qs, lane_no, pos - 1, stop)
                return stop
            record = qs.parked.get(key)
            if (
                record is not None
                and record.quota_failure
                and record.epoch == self.epoch(qs)
                and not may_preempt(qs, key, item)
            ):
                self.levels.add(record.level)
                if policy is QueuePolicy.PRIORITY:
                    continue
                qs.last_attempt_at = self.now
                qs.blocked = True  # still failing: Block/Intelligent stop here as upstream would
                self.park_unparked(qs, lane_no, pos, _Stop.BLOCKED)
                return _Stop.BLOCKED
            qs.last_attempt_at = self.now
            preempted = self.attempt(qs, key, item)
            if preempted is None:
                continue  # admitted
            check_stop = True
            if policy is QueuePolicy.PRIORITY:
                continue
            if not preempted:
                qs.blocked = True
            self.park_unparked(qs, lane_no, pos, _Stop.BLOCKED)
            return _Stop.BLOCKED
        self.park_unparked(qs, lane_no, limit, None)
        return None

    def attempt(self, qs: QueueState, key: str, item: Item) -> bool | None:
        """Try one unit. ``None``: admitted; otherwise whether a preemption is under way for it."""
        self.examined += 1
        cfg = qs.config
        entry = qs.entries[key]
        admitted = self.admitted.setdefault(qs.name, [])
        failure = self.view.check(entry.request, qs.name, item=key)
        if failure is not None:
            why = disabled_reason(cfg)
            outcome = (
                PreemptOutcome(error=why)
                if why is not None
                else plan_preempt(
                    item,
                    entry.request,
                    state=qs,
                    units=self.units,
                    view=self.view,
                    now=self.now,
                    protect=self.protect,
                    admitted=admitted,
                )
            )
            self.apply_outcome(qs, key, outcome, path="preempt")
            suffix = Message.PREEMPT_SUCCEED_SUFFIX if outcome.succeeded else Message.PREEMPT_FAILED_SUFFIX
            self.park(
                qs,
                key,
                failure + suffix,
                quota_failure=True,
                preempt_error=outcome.error,
                protected=outcome.protected,
            )
            return outcome.succeeded
        if cfg.wait_for_pods_running and first_holder(qs, admitted, key) is not None:
            outcome = plan_reserve(
                item, state=qs, units=self.units, now=self.now, protect=self.protect, admitted=admitted
            )
            self.apply_outcome(qs, key, outcome, path="reserve")
            names = [v.name for v in outcome.victims] or list(outcome.waiting_for)
            message = outcome.error or Message.waiting_for_victims(names)
            self.park(
                qs,
                key,
                message,
                quota_failure=False,
                preempt_error=outcome.error,
                protected=outcome.protected,
            )
            return outcome.succeeded
        unit = self.units[key]
        checks = matched_checks(cfg.admission_checks, unit.labels)
        self.view.reserve(qs.name, entry.request)
        admitted.append(item)
        qs.updating.add(key)
        qs.parked.pop(key, None)
        qs.unparked.discard(key)
        self.decisions.append(
            Admit(
                key=key,
                queue=qs.name,
                grants=remaining_grants(unit),
                phase=Phase.RESERVED if checks else Phase.DEQUEUED,
                message=Message.RESERVED if checks else Message.DEQUEUED,
                admission_checks=checks,
                request=entry.request,
            )
        )
        return None

    def apply_outcome(self, qs: QueueState, key: str, outcome: PreemptOutcome, *, path: str) -> None:
        mark = record_outcome(qs, key, outcome, now=self.now, path=path)
        if mark is not None:
            self.decisions.append(mark)

    def idle_reason(self, qs: QueueState, entry: Entry) -> str:
        """Why a unit that does not compete waits: its namespace may not use the quota, its spec
        is invalid, or it is inactive."""
        text = self.ledger.binding_problem(qs.name, entry.namespace)
        if text is not None:
            return text
        return invalid_message(entry.invalid) if entry.invalid is not None else inactive_message(qs.name)

    def park_unparked(self, qs: QueueState, lane_no: int, start: int, stop: _Stop | None) -> None:
        """Give every unit not examined since it (re)entered the queue its own reason, once.

        Units that do not compete get theirs wherever they stand (the scan may never reach them)."""
        if not qs.unparked:
            return
        idle = sorted(
            k
            for k in qs.unparked
            if qs.entries[k].lane == lane_no and k not in qs.updating and not qs.entries[k].active
        )
        for key in idle:
            self.park(qs, key, self.idle_reason(qs, qs.entries[key]), quota_failure=False)
        lane = qs.lanes[lane_no]
        depth = qs.config.max_depth
        waits = {_Stop.HELD: Message.NO_MORE_IN_QUEUE, _Stop.PREEMPTING: Message.queue_preempting(qs.name)}
        pending = sorted(
            (qs.entries[k].item, k)
            for k in qs.unparked
            if qs.entries[k].lane == lane_no and k not in qs.updating and qs.entries[k].active
        )
        for item, key in pending:
            pos = bisect.bisect_left(lane, item)
            if pos < start:
                continue
            if depth > 0 and pos >= depth:
                self.park(qs, key, beyond_depth_message(qs.name, depth), quota_failure=False)
                continue
            if stop is None:
                continue
            failure = self.view.check(qs.entries[key].request, qs.name, item=key)
            if failure is not None:
                text, why = failure + Message.PREEMPT_FAILED_SUFFIX, skip_reason(qs, key)
                self.park(qs, key, text, quota_failure=True, preempt_error=why)
            elif stop is not _Stop.EXHAUSTED:  # it fits but was not tried: say what it waits for
                self.park(qs, key, waits.get(stop, Message.BLOCKED_BY_HIGHER), quota_failure=False)

    def set_timer(self, qs: QueueState) -> None:
        times = [t for t in (qs.wake_at,) if t is not None]
        if qs.blocked and qs.last_attempt_at is not None:
            times.append(qs.last_attempt_at + BLOCK_STALE_SECONDS)
        if qs.marks:
            times.append(min(m.marked_at for m in qs.marks.values()) + 60.0)
        if times:
            self.state.timers[qs.name] = max(min(times), self.now)
        else:
            self.state.timers.pop(qs.name, None)
        if qs.dirty:
            self.state.dirty.add(qs.name)


def schedule(snapshot: Snapshot, state: SchedulerState, now: float) -> Plan:
    """Run one cycle. Deterministic: the same snapshot, state and ``now`` give the same plan.

    Mutates only ``state`` (the scheduler's memory: dirty flags, parked messages, blocked quotas,
    marks and rounds, admissions in flight); never ``snapshot``.
    """
    cycle = _Cycle(snapshot, state, now)
    for qname, key in state.new_orphans():
        message = Message.queue_not_exist(qname)
        repeated = snapshot.units[key].message == message
        cycle.decisions.append(Park(key, qname, message, queue_not_found=True, repeated=repeated))
    state.fire_timers(now, block_stale=BLOCK_STALE_SECONDS)
    due = sorted(
        (state.queues[q] for q in state.dirty if q in state.queues), key=lambda qs: queue_key(qs.config)
    )
    state.dirty.clear()
    for qs in due:
        cycle.scan(qs)
    wake = min(state.timers.values(), default=None)
    return Plan(decisions=tuple(cycle.decisions), wake_at=wake, examined=cycle.examined)


@dataclass(frozen=True, slots=True)
class UnitNotes:
    """What a unit event implies beyond the cache: ``reclaimed`` -> Normal event ``Reclaimed``."""

    released: bool = False
    reclaimed: bool = False


class _Queued(Mapping[str, Unit]):
    """The units as the queues see them (:meth:`Cache.queued`), for rebuilding a queue's state."""

    __slots__ = ("_cache",)

    def __init__(self, cache: Cache) -> None:
        self._cache = cache

    def __getitem__(self, key: str) -> Unit:
        return self._cache.queued(self._cache.snapshot.units[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache.snapshot.units)

    def __len__(self) -> int:
        return len(self._cache.snapshot.units)


class Cache:
    """The reconciler's scheduling cache: feed it every watch event, call :meth:`schedule`, then
    :meth:`assume` each admission before writing it (:meth:`forget` it if the write fails) and
    :meth:`forget_marks` for victims whose marking could not be written. Updates are incremental
    (O(log n) per unit event, O(depth) for usage); a relist feeds everything again, same state.

    ``quota_namespace_binding`` (the ``quotaNamespaceBinding`` switch) keeps units of namespaces a
    quota is not bound to from ever being admitted under it (``shared.quota``)."""

    def __init__(self, *, reclaim_protect_seconds: float = 0.0, quota_namespace_binding: bool = True) -> None:
        self.snapshot = Snapshot(
            ledger=QuotaLedger(namespace_binding=quota_namespace_binding),
            reclaim_protect_seconds=reclaim_protect_seconds,
        )
        self.state = SchedulerState()
        self.units: Mapping[str, Unit] = self.snapshot.units
        self.ledger: QuotaLedger = self.snapshot.ledger
        #: units refused by their quota's namespace binding -> their namespace
        self._refused: dict[str, str] = {}
        self._queued = _Queued(self)

    def queued(self, unit: Unit) -> Unit:
        """``unit`` as its queue sees it: refused by its quota's namespace binding, it looks
        invalid (with the binding text), so it keeps its place but never competes, never counts
        as pending demand and never holds back an Intelligent queue's low sub-queue. The cache
        itself (usage, admissions, messages) always keeps the unit as it is."""
        problem = self.ledger.binding_problem(unit.quota, unit.namespace) if unit.quota else None
        if problem is None:
            self._refused.pop(unit.key, None)
            return unit
        self._refused[unit.key] = unit.namespace
        return evolve(unit, invalid=problem)

    def put_unit(self, unit: Unit) -> UnitNotes:
        old = self.snapshot.units.get(unit.key)
        self.snapshot.units[unit.key] = unit
        released = self.ledger.put_unit(unit)
        self.state.put_unit(old, self.queued(unit), self._queued)
        self.state.on_release(released, self.ledger)
        reclaimed = old is not None and has_reclaim(old) and not has_reclaim(unit) and not satisfied(unit)
        return UnitNotes(released=bool(released), reclaimed=reclaimed)

    def delete_unit(self, key: str) -> UnitNotes:
        old = self.snapshot.units.pop(key, None)
        self._refused.pop(key, None)
        if old is None:
            return UnitNotes()
        released = self.ledger.delete_unit(key)
        self.state.delete_unit(old)
        self.state.on_release(released, self.ledger)
        return UnitNotes(released=bool(released))

    def put_queue(self, config: QueueConfig) -> None:
        self.state.put_queue(config, self._queued)

    def delete_queue(self, name: str) -> None:
        self.state.delete_queue(name, self._queued)

    def put_quota(self, quota: Quota) -> None:
        old = self.ledger.quotas.get(quota.name)
        changed = self.ledger.put_quota(quota)
        self._rebind()
        if not changed:
            return
        new = self.ledger.quotas.get(quota.name)
        if old is None or new is None or old.parent != new.parent:
            self.state.wake_all()
        else:
            self.state.on_release({quota.name}, self.ledger)

    def delete_quota(self, name: str, namespace: str | None = None) -> None:
        """``namespace`` None deletes every quota of that name."""
        changed = self.ledger.delete_quota(name, namespace)
        self._rebind()
        if changed:
            self.state.wake_all()

    def _rebind(self) -> None:
        """Quota bindings changed: the units whose answer may differ are fed to their queues again
        (those labelled with a rebound quota, and the refused ones of namespaces whose usable
        quotas changed, whose waiting text lists them)."""
        quotas, namespaces = self.ledger.take_binding_changes()
        if not quotas and not namespaces:
            return
        keys: set[str] = set()
        for name in quotas:
            keys.update(self.state.members.get(name, ()))
        keys.update(k for k, ns in self._refused.items() if ns in namespaces)
        for key in sorted(keys):
            unit = self.snapshot.units.get(key)
            if unit is not None:
                self.state.put_unit(unit, self.queued(unit), self._queued)

    def schedule(self, now: float) -> Plan:
        return schedule(self.snapshot, self.state, now)

    def assume(self, admit: Admit, *, now: float) -> tuple[Unit, Unit]:
        """Fold an admission into the cache before writing it; returns ``(before, after)``."""
        before = self.snapshot.units[admit.key]
        after = with_grants(before, admit.grants, phase=admit.phase, message=admit.message, now=now)
        self.put_unit(after)
        return before, after

    def forget(self, before: Unit) -> None:
        """The admission write failed: restore the unit as it was and let it compete again."""
        self.put_unit(before)
        state = self.state.queues.get(before.quota or "")
        if state is not None:
            state.forget_admit(before.key)
            self.state.mark_dirty(state)

    def forget_park(self, key: str) -> None:
        """A park's message write failed: the unit gets its message decided and written again."""
        unit = self.snapshot.units.get(key)
        state = self.state.queues.get(unit.quota or "") if unit is not None else None
        if state is not None:
            state.forget_park(key)
            self.state.mark_dirty(state)

    def forget_marks(self, queue: str, keys: set[str] | frozenset[str]) -> None:
        state = self.state.queues.get(queue)
        if state is not None:
            state.forget_marks(keys)
            self.state.mark_dirty(state)

    def queue_item_details(self, queue: str) -> list[dict[str, object]]:
        state = self.state.queues.get(queue)
        return [] if state is None else queue_item_details(state)

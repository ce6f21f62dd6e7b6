"""One scheduling cycle as a pure function of the cache: ``schedule(snapshot, state, now) -> Plan``.

Decide on a snapshot, then act (docs/architecture.md#decision-3-decide-on-a-snapshot-then-act); the
reconciler applies the plan in order (assume each admission into the cache, write, forget on failure;
write the victims' reclaim states; write parked units' messages and events). How a cycle works
(docs/compatibility.md#scheduling):

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
   add or delete for it (or 3 minutes without an attempt); Intelligent blocks on a high unit's
   failure and scans its low sub-queue only when no high unit waits, where (upstream polls it
   round-robin) lower units bypass a failed one as under Priority. ``max-depth`` caps the scan
   (Intelligent included, where upstream parses and ignores it). Units sorting after a preemptor
   whose round is in progress wait for it: it is first in line for the quota being freed.
6. Cost control without changing outcomes: a scan stops once no later unit can be admitted (the
   headroom is below every pending request; a unit sorting earlier holds the queue; a round is in
   progress); units not examined since they (re)entered the queue still get one park with their
   own reason; a unit parked for quota is not re-examined until its chain releases something.
   Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from koord_queue.shared.api.model import QueueConfig, Quota, Unit, evolve, with_grants
from koord_queue.shared.api.names import Message
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.core import fairness, guarantees
from koord_queue.shared.core.cycle import BLOCK_STALE_SECONDS, Cycle
from koord_queue.shared.core.history import UsageHistory
from koord_queue.shared.core.ordering import queue_key
from koord_queue.shared.core.plan import Admit, Decision, Park, Plan, Snapshot
from koord_queue.shared.core.policies import QueueState, SchedulerState, queue_item_details
from koord_queue.shared.core.quota import QuotaLedger
from koord_queue.shared.core.usage import UsageView

#: With usage history on, a cycle runs at least this often even when nothing happens, so the
#: averages (and the records the reconciler stores) follow what quotas hold in a quiet cluster.
HISTORY_TICK_SECONDS = 30.0

__all__ = [
    "BLOCK_STALE_SECONDS",
    "HISTORY_TICK_SECONDS",
    "Admit",
    "Cache",
    "Decision",
    "Park",
    "Plan",
    "Snapshot",
    "UnitNotes",
    "reclaim_took_back",
    "schedule",
]


def schedule(snapshot: Snapshot, state: SchedulerState, now: float) -> Plan:
    """Run one cycle. Deterministic: the same snapshot, state and ``now`` give the same plan.

    Mutates only ``state`` (the scheduler's memory: dirty flags, parked messages, blocked quotas,
    marks and rounds, admissions in flight); never ``snapshot``.
    """
    snapshot.history.fold(snapshot.ledger, now)
    refresh_shares(snapshot, state)
    cycle = Cycle(snapshot, state, now)
    for qname, key in state.new_orphans():
        message = Message.queue_not_exist(qname)
        repeated = snapshot.units[key].message == message
        cycle.decisions.append(Park(key, qname, message, queue_not_found=True, repeated=repeated))
    state.fire_timers(now, block_stale=BLOCK_STALE_SECONDS)
    due = _in_order(snapshot, [state.queues[q] for q in state.dirty if q in state.queues])
    state.dirty.clear()
    for qs in due:
        cycle.scan(qs)
    wake = min(state.timers.values(), default=None)
    if snapshot.history.enabled:  # a quiet cluster's usage history still moves, and is stored
        tick = now + HISTORY_TICK_SECONDS
        wake = tick if wake is None else min(wake, tick)
    return Plan(decisions=tuple(cycle.decisions), wake_at=wake, examined=cycle.examined)


def _in_order(snapshot: Snapshot, due: list[QueueState]) -> list[QueueState]:
    """The queues to scan, by ``spec.priority``, then (usage history on) by standing among their
    siblings at every level from the top (docs/compatibility.md#fair-over-time), then by name."""
    history = snapshot.history
    if len(due) < 2 or not history.enabled or not guarantees.anyone_borrows(snapshot.ledger):
        return sorted(due, key=lambda qs: queue_key(qs.config))
    ranks = fairness.ranks(snapshot.ledger, history)
    return sorted(due, key=lambda qs: (-qs.config.priority, ranks.key(qs.name), qs.name))


def refresh_shares(snapshot: Snapshot, state: SchedulerState) -> None:
    """Compute this cycle's guarantee figures (``shared.core.guarantees``) and wake the queues
    below any quota whose runtime grew since the last cycle (their parked units may fit now)."""
    ledger = snapshot.ledger
    settled = not any(state.runtime.values()) and not any(state.gaps.values())
    if (
        not snapshot.guarantees
        or not ledger.has_subquotas
        or (settled and not guarantees.anyone_borrows(ledger))
    ):
        # Nothing to divide, and nothing divided last cycle that could wake a queue now.
        state.runtime, state.requests, state.guaranteed, state.gaps = {}, {}, {}, {}
        return
    busy = [(name, qs.demand) for name, qs in state.queues.items() if qs.demand.count]
    shares = guarantees.compute(
        ledger, {n: d.total for n, d in busy}, {n: d.floors() for n, d in busy}, snapshot.history
    )
    old = state.runtime
    grown = {
        name
        for name, now_rt in shares.runtime.items()
        if name not in old
        or any(v > old[name].get(r, v - 1) for r, v in now_rt.items())
        or any(r not in now_rt for r in old[name])
    }
    view = UsageView(ledger, shares.runtime, shares.guaranteed)
    gaps = {parent: view.gap(parent) for parent in ledger.children()}
    for parent, before in state.gaps.items():
        now_gap = gaps.get(parent, {})
        if any(now_gap.get(r, 0) < v for r, v in before.items()):
            grown.add(parent)  # siblings' claims were met: borrowers may use what is left
    state.runtime, state.requests, state.guaranteed, state.gaps = (
        shares.runtime,
        shares.request,
        shares.guaranteed,
        gaps,
    )
    state.on_share_growth(grown, ledger)


@dataclass(frozen=True, slots=True)
class UnitNotes:
    """What a unit event implies beyond the cache: ``reclaimed`` -> Normal event ``Reclaimed``
    (the only place it is decided: see :func:`reclaim_took_back`)."""

    released: bool = False
    reclaimed: bool = False


def reclaim_took_back(old: Unit, new: Unit) -> bool:
    """A reclaim marked on ``old`` is done on ``new`` and took back at least one replica: the pod
    set's ``reclaimState`` is gone and its ``replicas`` is lower (unbound pods deleted, or replicas
    without pods released). Not when every pod was bound meanwhile (nothing taken back), nor when
    the unit gave its admissions up for another reason (its job finished, it backed off)."""
    after = {a.name: a for a in new.admissions}
    for before in old.admissions:
        now = after.get(before.name)
        if (
            before.reclaim_replicas is not None
            and now is not None
            and now.reclaim_replicas is None
            and now.replicas < before.replicas
        ):
            return True
    return False


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
    quota is not bound to from ever being admitted under it (``shared.core.quota``)."""

    def __init__(
        self,
        *,
        reclaim_protect_seconds: float = 0.0,
        quota_namespace_binding: bool = True,
        quota_guarantees: bool = True,
        usage_half_life: float = 0.0,
    ) -> None:
        self.snapshot = Snapshot(
            ledger=QuotaLedger(namespace_binding=quota_namespace_binding),
            reclaim_protect_seconds=reclaim_protect_seconds,
            guarantees=quota_guarantees,
            history=UsageHistory(usage_half_life),
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
        reclaimed = old is not None and reclaim_took_back(old, unit)
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
        if config.fair_order:
            self.snapshot.history.by_namespace.add(config.name)
        else:
            self.snapshot.history.by_namespace.discard(config.name)
        self.state.put_queue(config, self._queued)
        # The Queue records which of several same-named quotas holds the name.
        changed = self.ledger.set_holder(config.name, config.quota_holder or None)
        self._rebind()
        if changed:
            self.state.wake_all()

    def delete_queue(self, name: str) -> None:
        self.state.delete_queue(name, self._queued)

    def put_quota(self, quota: Quota) -> None:
        self.snapshot.history.remember(quota)
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

    def set_placements(self, placements: Mapping[str, PoolPlacement] | None) -> None:
        """The pools' placements changed (docs/pools.md#placement): every queue looks again, as a
        pool that was skipped may now be tried (pools change rarely: profiles and node taints)."""
        if placements == self.snapshot.placements:
            return
        self.snapshot.placements = placements
        self.ledger.touch()  # parked units' epochs change: they are tried again
        self.state.wake_all()

    def schedule(self, now: float) -> Plan:
        history = self.snapshot.history
        if history.by_namespace and history.fold(self.ledger, now):
            self._rerank()
        return schedule(self.snapshot, self.state, now)

    def _rerank(self) -> None:
        """Queues ordering their units by namespace usage get their lanes sorted again when the
        namespaces' ranks changed (docs/compatibility.md#fair-order-inside-a-queue)."""
        history = self.snapshot.history
        for name in sorted(history.by_namespace):
            qs, quota = self.state.queues.get(name), self.ledger.quotas.get(name)
            if qs is None or quota is None or not qs.config.fair_order:
                continue
            ranks = history.namespace_ranks(quota)
            if ranks != qs.ranks:
                self.state.rerank(name, ranks, self._queued)

    def assume(self, admit: Admit, *, now: float) -> tuple[Unit, Unit]:
        """Fold an admission into the cache before writing it; returns ``(before, after)``."""
        before = self.snapshot.units[admit.key]
        after = with_grants(before, admit.grants, phase=admit.phase, message=admit.message, now=now)
        if (after.pool, after.pool_quota) != (admit.pool, admit.pool_quota):
            after = evolve(after, pool=admit.pool, pool_quota=admit.pool_quota)
        self.put_unit(after)
        self._held(after)
        return before, after

    def forget(self, before: Unit) -> None:
        """The admission write failed: restore the unit as it was and let it compete again."""
        self.put_unit(before)
        self._held(before)
        state = self.state.queues.get(before.quota or "")
        if state is not None:
            state.forget_admit(before.key)
            self.state.mark_dirty(state)

    def _held(self, unit: Unit) -> None:
        """An admission assumed or forgotten right after its cycle: the usage history charges
        the time from that cycle on with the new usage (``UsageHistory.hold``)."""
        history = self.snapshot.history
        if history.enabled and unit.quota:
            history.hold(unit.quota, unit.pool_quota)  # no pool quota: "", not a quota

    def forget_park(self, key: str) -> None:
        """A park's message write failed: the unit gets its message decided and written again."""
        unit = self.snapshot.units.get(key)
        state = self.state.queues.get(unit.quota or "") if unit is not None else None
        if state is not None:
            state.forget_park(key)
            self.state.mark_dirty(state)
        else:
            # A unit whose queue does not exist (yet): its one-off "queue ... is not exist" message
            # is decided again by the next cycle instead of being taken as written.
            self.state.orphans_parked.discard(key)

    def forget_marks(self, queue: str, keys: set[str] | frozenset[str]) -> None:
        state = self.state.queues.get(queue)
        if state is not None:
            state.forget_marks(keys)
            self.state.mark_dirty(state)

    def queue_item_details(self, queue: str) -> list[dict[str, object]]:
        state = self.state.queues.get(queue)
        return [] if state is None else queue_item_details(state)

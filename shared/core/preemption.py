"""Queue-level preemption planner: which admitted-but-not-running units to reclaim, and when.

Specification: docs/compatibility.md#queue-level-preemption. Two entry points, both
pure functions of a queue's state, the units and ``now``; the scheduler turns their outcome into a
:class:`MarkVictims` decision and remembers the marks until they are observed.

* :func:`plan_reserve` (the *reserve* path): the preemptor passed the quota filter, but with
  ``wait-for-pods-running`` the queue is held by assumed units (holding quota, pods not all
  running). Every assumed unit that sorts after the preemptor is marked in one round.
* :func:`plan_preempt` (the *preempt* path): the quota filter failed. Gated by
  ``wait-for-pods-running`` *and* ``enable-queueunit-preemption``. A dry run walks the assumed units
  from the lowest priority and stops as soon as the released resources cover the preemptor's request
  for every requested resource.

A victim (docs/compatibility.md#victim-rules): sorts after the preemptor in the queue's order, judged
at its *preemption priority* (``ordering.victim_key``, docs/compatibility.md#preemption-priority), so no
two units can preempt each other; has an
admission with ``replicas != running`` and no ``reclaimState`` (reclaimable = ``replicas -
running`` replicas of that pod set); and its ``lastAllocateTime`` is older than the reclaim protect
time. Bound pods are never reclaimed, so a unit whose pods all run is never a victim.

Where we do better than upstream (each keeps the documented behaviour in the documented cases):

* **Capacity on the way** (docs/architecture.md#decision-4-asynchronous-preemption): victims already
  marked and not yet reclaimed count as released capacity, so a preemptor requeued while they are
  reclaimed marks nobody new unless they are not enough; nothing is ever marked twice.
* **No useless marking.** Upstream marks victims even when the preemptor could still not be
  admitted afterwards. We mark nothing when an assumed unit that can never be this preemptor's
  victim (it sorts before it) would still hold the queue, when a protected unit would (we retry
  when its protection ends), or when even every candidate would not free enough quota. If all
  candidates together cannot cover the full request but can cover the *shortfall* (the request
  minus what is free now), the shortest prefix covering the shortfall is marked (upstream would
  mark the whole walk).
* **One round per queue** is a real round here: it lasts until the preemptor is admitted or gone,
  or until none of its victims is still being reclaimed; another unit asking meanwhile is rejected
  with upstream's text. A preemptor that counts on capacity on the way takes the round too (those
  victims join it), so a victim's freed quota is promised to one waiting preemptor at a time.

A unit whose ``preemptionPolicy`` is ``Never`` marks nobody on either path: it waits for room
(:data:`names.NON_PREEMPTING_ERROR`).

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import QueueConfig, Unit
from koord_queue.shared.api.names import EventReason, Message, QueuePolicy
from koord_queue.shared.api.predicates import expected_pod_sets
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import gangs
from koord_queue.shared.core.ordering import victim_key
from koord_queue.shared.core.policies import Item, Mark, PreemptRound, QueueState
from koord_queue.shared.core.usage import UsageView

__all__ = [
    "INTELLIGENT_UNSUPPORTED",
    "NO_VICTIMS",
    "PREEMPTION_DISABLED",
    "PREEMPTION_NEEDS_WAIT",
    "MarkVictims",
    "PreemptOutcome",
    "Reclaimable",
    "Victim",
    "disabled_reason",
    "failed_suffix",
    "first_holder",
    "may_preempt",
    "plan_preempt",
    "plan_reserve",
    "reclaimable",
    "record_outcome",
    "skip_reason",
]

PREEMPTION_NEEDS_WAIT = "preemption is disabled because wait-for-pods-running is disabled"
PREEMPTION_DISABLED = "preemption is disabled in queue"
NO_VICTIMS = "no victims found"
INTELLIGENT_UNSUPPORTED = "preemption not supported in intelligent queue yet"


@dataclass(frozen=True, slots=True)
class Victim:
    """One unit to mark: ``reclaim`` maps pod set -> ``reclaimState.replicas`` to write."""

    key: str
    name: str
    reclaim: Mapping[str, int]
    resources: Resources


@dataclass(frozen=True, slots=True)
class MarkVictims:
    """Plan decision: write the reclaim states, message, ``Evicted`` condition and event."""

    queue: str
    preemptor: str
    victims: tuple[Victim, ...]
    path: str  # "reserve" or "preempt"
    message: str = Message.RECLAIMING
    reason: EventReason = EventReason.PREEMPTED


@dataclass(frozen=True, slots=True)
class Reclaimable:
    reclaim: dict[str, int]
    resources: Resources


@dataclass(frozen=True, slots=True)
class PreemptOutcome:
    """What a preemption attempt decided.

    ``victims`` are newly marked; ``waiting_for`` are the keys of victims already on the way that
    the preemptor counts on; ``error`` is upstream's error text when nothing is (or was) marked;
    ``wake_at`` is when a protected candidate becomes reclaimable; ``protected`` are the keys of
    the candidates skipped because of the reclaim protect time (for the decision log and the
    protection-skip metric).
    """

    victims: tuple[Victim, ...] = ()
    waiting_for: tuple[str, ...] = ()
    error: str | None = None
    wake_at: float | None = None
    protected: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.error is None and bool(self.victims or self.waiting_for)

    @property
    def promised(self) -> tuple[str, ...]:
        """The keys of every victim whose freed quota the preemptor now counts on."""
        if not self.succeeded:
            return ()
        return (*(v.key for v in self.victims), *self.waiting_for)


@dataclass(slots=True)
class _Ctx:
    state: QueueState
    units: Mapping[str, Unit]
    now: float
    protect: float
    admitted: list[Item] = field(default_factory=list)


def protected_until(unit: Unit, *, now: float, protect: float) -> float | None:
    """When the reclaim protection of ``unit`` ends, or ``None`` if it is not protected now."""
    if protect <= 0 or unit.last_allocate_time is None:
        return None
    until = unit.last_allocate_time + protect
    return until if now < until else None


def reclaimable(unit: Unit, *, now: float, protect: float) -> Reclaimable | None:
    """Upstream ``GetResourcesCanReclaim``: replicas admitted but not running, unless protected or
    already carrying a ``reclaimState``; ``None`` when there is nothing to reclaim now."""
    if protected_until(unit, now=now, protect=protect) is not None:
        return None
    per_pod = {ps.name: ps.per_pod for ps in expected_pod_sets(unit)}
    reclaim: dict[str, int] = {}
    resources: Resources = {}
    unit_bound = any(adm.running > 0 for adm in unit.admissions)
    for adm in unit.admissions:
        missing = adm.replicas - adm.running
        if adm.reclaim_replicas is not None or missing <= 0:
            continue
        gang = gangs.floor(unit, adm.name)
        if gang is not None:  # whole or not at all (docs/compatibility.md#gangs-and-partial-admission)
            missing = gangs.reclaim_count(adm.replicas, adm.running, gang, unit_bound=unit_bound)
            if missing <= 0:
                continue
        reclaim[adm.name] = missing
        resources = quantities.add(resources, quantities.scale(per_pod.get(adm.name, {}), missing))
    return Reclaimable(reclaim, resources) if reclaim else None


def _on_the_way(ctx: _Ctx, preemptor: Item) -> tuple[list[str], Resources]:
    """Victims already marked and not yet reclaimed that sort after the preemptor (their keys, in
    queue order) and what they free. While a round is in progress only its preemptor gets here
    (:func:`_gate`), so no two waiting units count on the same victim."""
    state = ctx.state
    found: list[Item] = []
    released: Resources = {}
    for key in sorted(state.in_flight.keys() | state.marks.keys()):
        unit = ctx.units.get(key)
        if unit is None or not state.on_the_way(key):
            continue
        item = _victim_item(state, unit, key)
        if item <= preemptor:
            continue
        per_pod = {ps.name: ps.per_pod for ps in expected_pod_sets(unit)}
        for podset, replicas in sorted(state.reclaim_on_the_way(key).items()):
            released = quantities.add(released, quantities.scale(per_pod.get(podset, {}), replicas))
        found.append(item)
    return [str(item[-1]) for item in sorted(found)], released


def _victim_item(state: QueueState, unit: Unit, key: str) -> Item:
    """The item ``unit`` is compared with as a victim (docs/compatibility.md#preemption-priority)."""
    return (*victim_key(unit, state.config.policy), key)


def _overridden(unit: Unit) -> bool:
    """The unit's victim key differs from its queue key (a preemption priority above its priority)."""
    return unit.victim_priority != unit.priority


def _unpreemptable_holder(ctx: _Ctx, preemptor: Item, exclude: str) -> bool:
    """An assumed unit (not on the way, not ``exclude``) sorting after ``preemptor`` in queue order
    but not at its preemption priority: it holds the queue and can never be this preemptor's
    victim, so marking others would not free the queue. (Those sorting before are
    :func:`first_holder`'s.) Only a unit with a preemption priority can be one; the scan is asked
    only before something would be marked or counted on, once per round; it reads only the
    assumed units with a raised preemption priority (``QueueState.raised``), not all of them."""
    state, units = ctx.state, ctx.units
    for key in state.raised:
        item = state.assumed_items[key]
        if (
            item > preemptor
            and key != exclude
            and not state.on_the_way(key)
            and _victim_item(state, units[key], key) <= preemptor
        ):
            return True
    return False


def _unless_held(ctx: _Ctx, preemptor: Item, exclude: str, outcome: PreemptOutcome) -> PreemptOutcome:
    """``outcome``, unless an assumed unit this preemptor may not take holds the queue: then
    nothing is marked or counted on (docs/compatibility.md#preemption-priority)."""
    if _unpreemptable_holder(ctx, preemptor, exclude):
        return PreemptOutcome(error=Message.NO_MORE_IN_QUEUE)
    return outcome


def first_holder(state: QueueState, admitted: list[Item], exclude: str) -> Item | None:
    """The first unit (in queue order) holding the queue under ``wait-for-pods-running``: assumed
    and not being reclaimed, or admitted earlier in this cycle; ``exclude`` (the asker) never holds
    the queue against itself."""
    first = admitted[0] if admitted else None
    for item in state.assumed:
        key = str(item[-1])
        if key != exclude and not state.on_the_way(key):
            return item if first is None or item < first else first
    return first


def disabled_reason(config: QueueConfig) -> str | None:
    """Why the preempt path can never run in a queue with ``config`` (``None``: it can)."""
    if config.policy is QueuePolicy.INTELLIGENT:
        return INTELLIGENT_UNSUPPORTED
    if not config.wait_for_pods_running:
        return PREEMPTION_NEEDS_WAIT
    if not config.enable_preemption:
        return PREEMPTION_DISABLED
    return None


def _gate(ctx: _Ctx, preemptor: str, *, preempt_path: bool) -> str | None:
    config = ctx.state.config
    unit = ctx.units.get(preemptor)
    if unit is not None and not unit.preempts:
        return names.NON_PREEMPTING_ERROR
    if preempt_path:
        reason = disabled_reason(config)
        if reason is not None:
            return reason
    elif config.policy is QueuePolicy.INTELLIGENT:
        return Message.NO_MORE_IN_QUEUE
    round_ = ctx.state.round
    if round_ is not None and round_.preemptor != preemptor:
        return Message.queue_preempting(ctx.state.name)
    return None


def plan_reserve(
    preemptor: Item,
    *,
    state: QueueState,
    units: Mapping[str, Unit],
    now: float,
    protect: float,
    admitted: list[Item],
) -> PreemptOutcome:
    """Reserve path: the queue is held by assumed units; mark all of them if all can be victims.

    ``admitted`` are the items admitted earlier in this cycle in this queue (they hold it too).
    """
    ctx = _Ctx(state, units, now, protect, admitted)
    key = str(preemptor[-1])
    error = _gate(ctx, key, preempt_path=False)
    if error is not None:
        return PreemptOutcome(error=error)
    holder = first_holder(state, admitted, key)
    if holder is not None and holder < preemptor:
        return PreemptOutcome(error=Message.NO_MORE_IN_QUEUE)
    victims: list[Victim] = []
    for item in state.assumed:
        victim_key = str(item[-1])
        if victim_key == key or state.on_the_way(victim_key):
            continue
        unit = units[victim_key]
        if _overridden(unit) and _victim_item(state, unit, victim_key) <= preemptor:
            return PreemptOutcome(error=Message.NO_MORE_IN_QUEUE)  # guarded by its preemption priority
        found = reclaimable(unit, now=now, protect=protect)
        if found is None:
            # A holder we may not reclaim (yet): marking the others would not free the queue.
            until = protected_until(unit, now=now, protect=protect)
            skipped = (victim_key,) if until is not None else ()
            return PreemptOutcome(error=Message.NO_MORE_IN_QUEUE, wake_at=until, protected=skipped)
        victims.append(Victim(victim_key, unit.name, found.reclaim, found.resources))
    if not victims:
        waiting, _ = _on_the_way(ctx, preemptor)
        return PreemptOutcome(waiting_for=tuple(waiting))
    return PreemptOutcome(victims=tuple(victims))


def plan_preempt(
    preemptor: Item,
    request: Mapping[str, int],
    *,
    state: QueueState,
    units: Mapping[str, Unit],
    view: UsageView,
    now: float,
    protect: float,
    admitted: list[Item],
) -> PreemptOutcome:
    """Preempt path (filter failed): the shortest lowest-first prefix of candidates that covers."""
    ctx = _Ctx(state, units, now, protect, admitted)
    key = str(preemptor[-1])
    error = _gate(ctx, key, preempt_path=True)
    if error is not None:
        return PreemptOutcome(error=error)
    holder = first_holder(state, admitted, key)
    if holder is not None and holder < preemptor:
        return PreemptOutcome(error=Message.NO_MORE_IN_QUEUE)
    headroom = view.headroom(state.name)
    if headroom is None:
        return PreemptOutcome(error=NO_VICTIMS)
    waiting, released = _on_the_way(ctx, preemptor)
    shortfall = {r: v - headroom[r] for r, v in request.items() if r in headroom and v > headroom[r]}
    if quantities.covers(released, request) or (shortfall and quantities.covers(released, shortfall)):
        return _unless_held(ctx, preemptor, key, PreemptOutcome(waiting_for=tuple(waiting)))
    # Walk the assumed units from the lowest priority while they sort after the preemptor; among
    # units of equal priority, those with no bound pod first (nothing running is disturbed).
    walked: list[Victim] = []
    protected: list[str] = []
    wake: float | None = None
    total = dict(released)
    for item in _walk(state, units, preemptor):
        victim_key = str(item[-1])
        if state.on_the_way(victim_key):
            continue
        unit = units[victim_key]
        found = reclaimable(unit, now=now, protect=protect)
        if found is None:
            until = protected_until(unit, now=now, protect=protect)
            if until is not None:
                protected.append(victim_key)
                if wake is None or until < wake:
                    wake = until
            continue
        walked.append(Victim(victim_key, unit.name, found.reclaim, found.resources))
        total = quantities.add(total, found.resources)
        if quantities.covers(total, request):
            outcome = PreemptOutcome(
                victims=tuple(walked), waiting_for=tuple(waiting), protected=tuple(protected)
            )
            return _unless_held(ctx, preemptor, key, outcome)
    # The whole walk cannot cover the request: cover the shortfall against what is free now.
    if not shortfall or not quantities.covers(total, shortfall):
        return PreemptOutcome(error=NO_VICTIMS, wake_at=wake, protected=tuple(protected))
    total = dict(released)
    for count, victim in enumerate(walked, start=1):
        total = quantities.add(total, victim.resources)
        if quantities.covers(total, shortfall):
            outcome = PreemptOutcome(
                victims=tuple(walked[:count]), waiting_for=tuple(waiting), protected=tuple(protected)
            )
            return _unless_held(ctx, preemptor, key, outcome)
    return PreemptOutcome(error=NO_VICTIMS, wake_at=wake, protected=tuple(protected))  # pragma: no cover


def _walk(state: QueueState, units: Mapping[str, Unit], preemptor: Item) -> Iterator[Item]:
    """The assumed units sorting after ``preemptor`` at their preemption priority, lowest first
    (:func:`_by_victim_key`); within one preemption priority those with no bound pod first, each
    run sorted only when the walk reaches it, so a walk that covers early stays cheap."""
    run: list[Item] = []
    priority: int | None = None
    for item, unit in _by_victim_key(state, units, preemptor):
        if run and unit.victim_priority != priority:
            yield from sorted(run, key=lambda it: _bound(units[str(it[-1])]))
            run = []
        run.append(item)
        priority = unit.victim_priority
    yield from sorted(run, key=lambda it: _bound(units[str(it[-1])]))


def _by_victim_key(
    state: QueueState, units: Mapping[str, Unit], preemptor: Item
) -> Iterator[tuple[Item, Unit]]:
    """The assumed units whose victim item sorts after ``preemptor``, highest victim item first.

    ``state.assumed`` is in queue order and a unit's victim item never sorts after its queue item,
    so walking it backwards yields the units without a preemption priority in victim order; the
    few with one wait in a heap until the walk passes their victim item. Lazy, like the walk."""
    waiting: list[tuple[_Desc, Item]] = []
    for item in reversed(state.assumed):
        if item <= preemptor:
            break
        unit = units[str(item[-1])]
        if _overridden(unit):
            heapq.heappush(waiting, (_Desc(_victim_item(state, unit, unit.key)), item))
            continue
        while waiting and waiting[0][0].item > item:
            found = heapq.heappop(waiting)[1]
            yield found, units[str(found[-1])]
        yield item, unit
    while waiting:
        desc, found = heapq.heappop(waiting)
        if desc.item <= preemptor:
            break
        yield found, units[str(found[-1])]


@dataclass(frozen=True, slots=True)
class _Desc:
    """An item ordered backwards, so that ``heapq`` (a min-heap) pops the highest first."""

    item: Item

    def __lt__(self, other: _Desc) -> bool:
        return self.item > other.item


def _bound(unit: Unit) -> bool:
    return any(adm.running > 0 for adm in unit.admissions)


def may_preempt(state: QueueState, key: str, item: Item, *, preempts: bool = True) -> bool:
    """Could the preempt path mark anything for ``key`` (or, a fortiori, a unit sorting after)?

    Cheap and conservative: lets the scheduler skip a whole exhausted queue when it is False.
    ``preempts=False`` asks about ``key`` alone, a unit that never preempts (its ``preemptionPolicy``
    is ``Never``): nothing, so its unchanged failure is not tried again. Whether the queue may be
    skipped from ``key`` on is asked with ``preempts=True``: a unit sorting after it may preempt.
    """
    if not preempts:
        return False
    cfg = state.config
    if disabled_reason(cfg) is not None:
        return False
    if state.round is not None and state.round.preemptor != key:
        return False
    return bool(state.assumed) and state.assumed[-1] > item


def record_outcome(
    state: QueueState, preemptor: str, outcome: PreemptOutcome, *, now: float, path: str
) -> MarkVictims | None:
    """Remember what an attempt decided: the wake-up time, the round, and the marks (until they are
    observed on the victims, so nothing is marked twice); returns the plan decision, if any.

    Every victim the preemptor counts on, newly marked or already on the way, joins its round: no
    other unit may count on it while the round lasts."""
    if outcome.wake_at is not None and (state.wake_at is None or outcome.wake_at < state.wake_at):
        state.wake_at = outcome.wake_at
    promised = outcome.promised
    if not promised:
        return None
    if state.round is None:
        state.round = PreemptRound(preemptor=preemptor, started_at=now)
    state.round.victims.update(promised)
    if not outcome.victims:
        return None
    for victim in outcome.victims:
        state.marks[victim.key] = Mark(dict(victim.reclaim), now)
    state.dirty = True  # re-check the preemptor once the marks are written
    return MarkVictims(queue=state.name, preemptor=preemptor, victims=outcome.victims, path=path)


def failed_suffix(unit: Unit) -> str:
    """What a unit that did not fit and marked nobody adds to its waiting message."""
    return Message.PREEMPT_FAILED_SUFFIX if unit.preempts else names.NON_PREEMPTING_SUFFIX


def skip_reason(state: QueueState, key: str, *, preempts: bool = True) -> str:
    """The preemption error (for logs) of a unit the scan did not try because none could succeed."""
    if not preempts:
        return names.NON_PREEMPTING_ERROR
    busy = state.round is not None and state.round.preemptor != key
    return disabled_reason(state.config) or (Message.queue_preempting(state.name) if busy else NO_VICTIMS)

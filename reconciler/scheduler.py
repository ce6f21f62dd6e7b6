"""The scheduling loop: feed watch events into ``shared.core.scheduling.Cache``, run cycles, write plans.

Decisions 2-4 of docs/architecture.md#decisions in practice:

* every QueueUnit, Queue and ElasticQuota event is parsed once (``shared.api.model``) and folded into
  the cache incrementally; a relist simply feeds everything again;
* a cycle is ``cache.schedule(now)`` — pure; this module only hands the plan to its writer
  (``reconciler.scheduler_writes``), which applies it to the API;
* an admission is *assumed* into the cache before its write and *forgotten* if the write fails;
  while a write is in flight the watch events of that unit are held back, and afterwards events
  older than the written resourceVersion are ignored, so a lagging watch can never make an
  admitted unit look unadmitted (which would admit it twice);
* marks (reclaim states) are written asynchronously; the preemptor is admitted by a later cycle
  once the freed quota is observed.

Besides cycles this loop moves Reserved units through their admission checks
(docs/compatibility.md#admission-checks), returns backed-off units to the queue when their ``requeueAt``
passes, and publishes each queue's ``status.queueItemDetails`` at its refresh interval.

The loop owns all of the scheduler's state: the cache and what is being written. The writes are a
collaborator in ``reconciler.scheduler_writes`` that works on this state and gives each result back
through :meth:`SchedulerLoop.settle_cache`, next to the watch intake it has to agree with.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from koord_queue.reconciler import metrics, scheduler_writes
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.quotas import QUEUES
from koord_queue.shared import kube
from koord_queue.shared.api import admission_checks
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import EventReason, Message, Phase
from koord_queue.shared.api.parsing import parse_queue, parse_quota, parse_unit
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.core.config import ScheduledEvents, Settings
from koord_queue.shared.core.policies import unlabelled_message
from koord_queue.shared.core.preemption import MarkVictims
from koord_queue.shared.core.scheduling import Admit, Cache, Park
from koord_queue.shared.jobs import adoption

log = logging.getLogger(__name__)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class SchedulerLoop:
    """Owns the scheduler's state; its :attr:`writer` applies what a cycle decides
    (``reconciler.scheduler_writes``)."""

    verbosity: ClassVar[int] = 0

    def __init__(
        self,
        client: kube.Kube,
        *,
        events: EventRecorder,
        settings: Settings,
        leadership: kube.Leadership | None = None,
    ) -> None:
        self.client = client
        self.events = events
        #: closed while following: watch events only fill the cache, nothing is queued to write
        #: (docs/architecture.md#decision-12-leadership-and-high-availability)
        self.leadership = leadership if leadership is not None else kube.Leadership()
        #: ``scheduledEvents: Always``: every admission gets ``Scheduled``, not only those that waited
        self.scheduled_event_always = settings.scheduled_events == ScheduledEvents.ALWAYS
        self.cache = Cache(
            reclaim_protect_seconds=settings.reclaim_protect_seconds,
            quota_namespace_binding=settings.quota_namespace_binding,
            quota_guarantees=settings.quota_guarantees,
            usage_half_life=settings.usage_half_life_seconds,
        )
        #: raw objects by key, kept by the informers (set by the wiring in main)
        self.unit_store: Mapping[str, kube.Obj] = {}
        self._queue_raw: dict[str, kube.Obj] = {}
        self._wake = asyncio.Event()
        #: our last write of each unit, until the watch delivers it (the store may be older)
        self._written = kube.OwnWrites()
        self._queue_failures: dict[str, str] = {}
        self._reserved: set[str] = set()
        self._backoff: list[tuple[float, str]] = []
        self._published: dict[str, tuple[float, list[dict[str, object]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._hold_until = 0.0
        self.cycles = 0
        #: what is being written, shared with the writer (``scheduler_writes.WriteState``)
        self.writes = scheduler_writes.WriteState()
        self.writer = scheduler_writes.Writer(self)

    # --- intake ------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def set_placements(self, placements: Mapping[str, PoolPlacement]) -> None:
        """The pools' placements as the profile controller knows them now (docs/pools.md#placement):
        a pool skipped as unknown, or contradicted, may be tried again."""
        self.cache.set_placements(dict(placements))
        self.wake()

    def on_unit(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        key = _key(obj)
        if key in self.writes.writing:
            return  # applied from the informer store once our write settles
        if new is not None and self._written.behind(key, new):
            return  # older than what we wrote: the watch is catching up
        if new is not None and self._holds(key, new):
            return  # the echo of our own write, applied when it settled: nothing new to parse
        self._apply_unit(key, new)

    def _holds(self, key: str, raw: kube.Obj) -> bool:
        """Is this exact version of the unit what the cache already holds? A resourceVersion names
        one content, so parsing it again would change nothing: typically the watch event of our
        own admission, which :meth:`settle_cache` applied from the write's answer
        (docs/architecture.md#assume-and-forget)."""
        held = self.cache.units.get(key)
        version = (raw.get("metadata") or {}).get("resourceVersion")
        return held is not None and bool(version) and held.resource_version == version

    def _apply_unit(self, key: str, raw: kube.Obj | None) -> None:
        if raw is not None and adoption.awaiting_status(raw):
            # Re-created for a released job; the job extension writes its admission next
            # (docs/compatibility.md#adoption-of-released-jobs). Until then it is neither admitted nor
            # parked by us.
            raw = None
        if raw is None:
            gone = self.cache.units.get(key)
            if gone is not None and gone.consumer_kind:
                metrics.QUEUEUNITS_BY_JOB_TYPE.labels(gone.namespace, gone.consumer_kind).dec()
            self.cache.delete_unit(key)
            self.writes.queue_not_found.discard(key)
            self._reserved.discard(key)
            self._written.forget(key)
            self.writes.deferred_parks.pop(key, None)
        else:
            unit = parse_unit(raw)
            old = self.cache.units.get(key)
            notes = self.cache.put_unit(unit)
            if notes.reclaimed:
                self.events.record(
                    raw,
                    type_="Normal",
                    reason=EventReason.RECLAIMED,
                    message=Message.reclaimed_event(unit.name),
                )
            if unit.phase == Phase.RESERVED:
                self._reserved.add(key)
            else:
                self._reserved.discard(key)
            if unit.phase == Phase.TIMEOUT_BACKOFF and self.leadership.leading:
                # Only the leader requeues; a follower's heap would grow with every event and
                # never be drained. ``_take_over`` fills it from the cache instead.
                heapq.heappush(self._backoff, (self._requeue_at(unit), key))
            if old is None and unit.consumer_kind:
                metrics.QUEUEUNITS_BY_JOB_TYPE.labels(unit.namespace, unit.consumer_kind).inc()
            note = unlabelled_message(unit) if self.leadership.leading else None
            if note is not None and key not in self.writes.noting:
                self.writes.noting.add(key)
                self.spawn(self.writer.write_note(key, unit, note), name=f"note-{key}")
        self.wake()

    def settle_cache(self, key: str, written: kube.Obj | None) -> None:
        """Feed the result of our write (or the latest watched object) back into the cache.

        Watch events of ``key`` were held back while the write was in flight, and some of them
        may be newer than ``written``: the unit was deleted, or changed by someone else, after our
        write landed. The informer store always holds the latest watched object (it is updated
        before the handlers run), so the newer of the two wins; a missing store entry means the
        unit is gone. Applying ``written`` over a deletion would leave a ghost holding quota.
        """
        self.writes.writing.discard(key)
        if key in self.writes.writing:
            # Another write of this unit is still on its way (an admission decided while its
            # previous reason was being written): what the cache holds is decided when the last
            # one settles, with all results known. Deciding now from a failed or dropped write
            # could erase an admission that lands a moment later.
            if written is not None:
                self._written.wrote(key, written)
            return
        latest = self.unit_store.get(key)
        if written is None and latest is not None and self._written.behind(key, latest):
            # This write failed (or was dropped), but an earlier one of ours landed and the
            # watch has not delivered it yet: the store is older than the cache, which holds
            # what we wrote. Applying the store would erase, say, an admission that is in etcd
            # (the chaos-c overrun: a park dropped on 409 after the same unit's admission).
            self.wake()
            return
        if written is None or latest is None:
            self._apply_unit(key, latest)
            return
        written_rv, latest_rv = kube.resource_version(written), kube.resource_version(latest)
        if written_rv is not None and latest_rv is not None and latest_rv > written_rv:
            self._apply_unit(key, latest)
            return
        self._written.wrote(key, written)
        self._apply_unit(key, written)

    def on_queue(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        name = str((obj.get("metadata") or {}).get("name", ""))
        if new is None:
            self._queue_raw.pop(name, None)
            self.cache.delete_queue(name)
        else:
            self._queue_raw[name] = new
            config = parse_queue(new)
            self.cache.put_queue(config)
            problem = config.policy_error
            if problem and self._queue_failures.get(name) != problem:
                self._queue_failures[name] = problem
                self.events.record(new, type_="Warning", reason=EventReason.ADD_QUEUE_FAIL, message=problem)
            elif not problem:
                self._queue_failures.pop(name, None)
        self.wake()

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if new is None:
            # Same-named quotas elsewhere stay: the next oldest takes over (shared.core.quota).
            self.cache.delete_quota(name, str(meta.get("namespace", "")))
        else:
            self.cache.put_quota(parse_quota(new))
        self.wake()

    # --- the loop ----------------------------------------------------------------------------

    def _take_over(self) -> None:
        """What a follower left to the leader, taken up from the warm cache as leadership begins:
        the backed-off units to requeue and the unlabelled units still without their reason; the
        usage history counts on from what the quotas carry (docs/compatibility.md#fair-over-time)."""
        self.cache.snapshot.history.restart()
        self._backoff = [
            (self._requeue_at(unit), key)
            for key, unit in self.cache.units.items()
            if unit.phase == Phase.TIMEOUT_BACKOFF
        ]
        heapq.heapify(self._backoff)
        for key, unit in sorted(self.cache.units.items()):
            note = unlabelled_message(unit)
            if note is not None and key not in self.writes.noting:
                self.writes.noting.add(key)
                self.spawn(self.writer.write_note(key, unit, note), name=f"note-{key}")

    async def run(self) -> None:
        """The loop; runs only while leading (``reconciler/main.py``)."""
        self._take_over()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publisher(), name="queue-items")
            wake_at: float | None = None
            while True:
                timeout = None if wake_at is None else max(0.0, wake_at - time.time())
                backoff_due = self._backoff[0][0] - time.time() if self._backoff else None
                if backoff_due is not None:
                    timeout = backoff_due if timeout is None else min(timeout, backoff_due)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                self._wake.clear()
                await asyncio.sleep(0)  # let a burst of watch events land before deciding
                pause = self._hold_until - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)  # backoff after the apiserver failed our writes
                if self.writes.marking:
                    # Victims are marked before anything the freed quota allows is admitted, so
                    # the API shows "marked, then admitted" (the reserve path's order) and a
                    # failed mark is forgotten before the next decision.
                    await asyncio.gather(*self.writes.marking, return_exceptions=True)
                    self.writes.marking.clear()
                wake_at = self.cycle()
                self._settle_checks()
                self._requeue_due()

    def cycle(self) -> float | None:
        now = time.time()
        started = time.perf_counter()
        plan = self.cache.schedule(now)
        metrics.observe_cycle(time.perf_counter() - started)
        self.cycles += 1
        for decision in plan.decisions:
            if isinstance(decision, Admit):
                self.writer.admit(decision, now)
            elif isinstance(decision, Park):
                self.writer.park(decision)
            elif isinstance(decision, MarkVictims):
                self.writer.mark(decision, now)
        return plan.wake_at

    def hold(self, err: kube.KubeError) -> None:
        """After a transport error, a 5xx or a 429, pause the cycles briefly: the same decisions
        would fail again at once (the chaos run saw 200 retries a second during an outage)."""
        if err.status == 0 or err.status == 429 or err.status >= 500:
            self._hold_until = max(self._hold_until, time.monotonic() + 1.0)

    def spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- admission checks and backoff --------------------------------------------------------

    def _settle_checks(self) -> None:
        for key in sorted(self._reserved):
            unit = self.cache.units.get(key)
            if unit is None or key in self.writes.writing:
                continue
            outcome = admission_checks.next_phase(unit.phase, unit.admission_checks)
            if outcome is None:
                continue
            self._reserved.discard(key)
            self.writes.writing.add(key)
            self.spawn(self.writer.write_check_outcome(key, unit, outcome), name=f"checks-{key}")

    @staticmethod
    def _requeue_at(unit: Unit) -> float:
        if unit.requeue_at is not None:
            return unit.requeue_at
        return unit.last_update_time or time.time()

    def _requeue_due(self) -> None:
        now = time.time()
        while self._backoff and self._backoff[0][0] <= now:
            _, key = heapq.heappop(self._backoff)
            unit = self.cache.units.get(key)
            if unit is None or unit.phase != Phase.TIMEOUT_BACKOFF or key in self.writes.writing:
                continue
            if self._requeue_at(unit) > now:
                heapq.heappush(self._backoff, (self._requeue_at(unit), key))
                continue
            self.writes.writing.add(key)
            self.spawn(self.writer.write_requeue(key, unit), name=f"requeue-{key}")

    # --- queue status ------------------------------------------------------------------------

    async def _publisher(self) -> None:
        gauges_at = 0.0
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if now - gauges_at >= 5.0:
                gauges_at = now
                self._update_gauges()
            for name in sorted(self.cache.state.configs):
                config = self.cache.state.configs[name]
                if config.disable_show_items or name not in self._queue_raw:
                    continue
                last, shown = self._published.get(name, (0.0, []))
                if now - last < max(config.items_refresh_seconds, 0.1):
                    continue
                details = self.cache.queue_item_details(name)
                self._published[name] = (now, shown)
                if details == shown:
                    continue
                # Where the Queue informer found it: the install namespace (the only one it watches).
                where = str((self._queue_raw[name].get("metadata") or {}).get("namespace", ""))
                try:
                    await self.client.patch(
                        QUEUES,
                        name,
                        {"status": {"queueItemDetails": {"active": details}}},
                        namespace=where,
                        subresource="status",
                    )
                    self._published[name] = (now, details)
                except kube.KubeError as err:
                    log.info("queue %s: queueItemDetails not published: %s", name, err)

    def _update_gauges(self) -> None:
        for name, state in self.cache.state.queues.items():
            waiting = sum(len(lane) for lane in getattr(state, "lanes", ()))
            metrics.QUEUEUNITS_IN_ACTIVE_QUEUE.labels(name).set(waiting)
        backoff: dict[str, int] = {}
        for unit in self.cache.units.values():
            if unit.phase == Phase.TIMEOUT_BACKOFF and unit.quota:
                backoff[unit.quota] = backoff.get(unit.quota, 0) + 1
        for name in self.cache.state.queues:
            metrics.QUEUEUNITS_IN_BACKOFF_QUEUE.labels(name).set(backoff.get(name, 0))
        for quota in self.cache.ledger.quotas:
            for resource, value in self.cache.ledger.used(quota).items():
                metrics.DEQUEUED_QUOTA_USAGE.labels(quota, resource).set(value / 1000)

"""The scheduling loop: feed watch events into ``shared.core.scheduling.Cache``, run cycles, write plans.

Decisions 2-4 of docs/architecture.md#decisions in practice:

* every QueueUnit, Queue and ElasticQuota event is parsed once (``shared.api.model``) and folded into
  the cache incrementally; a relist simply feeds everything again;
* a cycle is ``cache.schedule(now)`` — pure; this module only applies the plan;
* an admission is *assumed* into the cache before its write and *forgotten* if the write fails;
  while a write is in flight the watch events of that unit are held back, and afterwards events
  older than the written resourceVersion are ignored, so a lagging watch can never make an
  admitted unit look unadmitted (which would admit it twice);
* marks (reclaim states) are written asynchronously; the preemptor is admitted by a later cycle
  once the freed quota is observed.

Besides cycles this loop moves Reserved units through their admission checks
(docs/compatibility.md#admission-checks), returns backed-off units to the queue when their ``requeueAt``
passes, and publishes each queue's ``status.queueItemDetails`` at its refresh interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from reconciler import job_events, metrics
from reconciler.events import EventRecorder
from reconciler.jobs import QUEUE_UNITS
from reconciler.quotas import QUEUES
from shared import kube
from shared.api import admission_checks, conditions, names, quantities
from shared.api.model import Unit, format_time, parse_queue, parse_quota, parse_unit
from shared.api.names import EventReason, Message, Phase
from shared.core import explain
from shared.core.config import Settings
from shared.core.policies import unlabelled_message
from shared.core.preemption import MarkVictims
from shared.core.scheduling import Admit, Cache, Park
from shared.jobs import adoption

log = logging.getLogger(__name__)

WRITE_CONCURRENCY = 64
#: A waiting message is retried this often when others touch the unit meanwhile.
PARK_WRITE_ATTEMPTS = 3


def _rv(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return None


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def admissions_json(unit: Unit) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for a in unit.admissions:
        entry: dict[str, Any] = {"name": a.name, "replicas": a.replicas, "running": a.running}
        if a.resources:
            entry["resources"] = quantities.format_resource_list(a.resources)
        if a.reclaim_replicas is not None:
            entry["reclaimState"] = {"replicas": a.reclaim_replicas}
        out.append(entry)
    return out


class SchedulerLoop:
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
        self.cache = Cache(
            reclaim_protect_seconds=settings.reclaim_protect_seconds,
            quota_namespace_binding=settings.quota_namespace_binding,
        )
        #: raw objects by key, kept by the informers (set by the wiring in main)
        self.unit_store: Mapping[str, kube.Obj] = {}
        self._queue_raw: dict[str, kube.Obj] = {}
        self._wake = asyncio.Event()
        self._writing: set[str] = set()
        #: parks decided while another write of the same unit was on its way (the newest only)
        self._deferred_parks: dict[str, Park] = {}
        self._written_rv: dict[str, int] = {}
        self._queue_not_found: set[str] = set()
        self._queue_failures: dict[str, str] = {}
        self._reserved: set[str] = set()
        self._backoff: list[tuple[float, str]] = []
        self._published: dict[str, tuple[float, list[dict[str, object]]]] = {}
        self._sem = asyncio.Semaphore(WRITE_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self._noting: set[str] = set()  # units without a quota label whose reason is being written
        self._marking: list[asyncio.Task[None]] = []
        self._hold_until = 0.0
        self.cycles = 0

    # --- intake ------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def on_unit(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        key = _key(obj)
        if key in self._writing:
            return  # applied from the informer store once our write settles
        if new is not None:
            written = self._written_rv.get(key)
            rv = _rv(new)
            if written is not None and rv is not None:
                if rv < written:
                    return  # older than what we wrote: the watch is catching up
                del self._written_rv[key]
        self._apply_unit(key, new)

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
            self._queue_not_found.discard(key)
            self._reserved.discard(key)
            self._written_rv.pop(key, None)
            self._deferred_parks.pop(key, None)
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
            if note is not None and key not in self._noting:
                self._noting.add(key)
                self._spawn(self._write_note(key, unit, note), name=f"note-{key}")
        self.wake()

    async def _write_note(self, key: str, unit: Unit, message: str) -> None:
        """Give a unit no cycle looks at its reason, without a phase
        (docs/compatibility.md#s29-unit-without-a-quota-label).

        Conditional on the version seen, so it never lands over a label added meanwhile; on any
        failure the next event of the unit tries again.
        """
        body = {"metadata": {"resourceVersion": unit.resource_version}, "status": {"message": message}}
        try:
            await self._write_status(key, body)
        except kube.KubeError as err:
            log.debug("reason for unlabelled %s not written: %s", key, err)
        finally:
            self._noting.discard(key)

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
        the backed-off units to requeue and the unlabelled units still without their reason."""
        self._backoff = [
            (self._requeue_at(unit), key)
            for key, unit in self.cache.units.items()
            if unit.phase == Phase.TIMEOUT_BACKOFF
        ]
        heapq.heapify(self._backoff)
        for key, unit in sorted(self.cache.units.items()):
            note = unlabelled_message(unit)
            if note is not None and key not in self._noting:
                self._noting.add(key)
                self._spawn(self._write_note(key, unit, note), name=f"note-{key}")

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
                if self._marking:
                    # Victims are marked before anything the freed quota allows is admitted, so
                    # the API shows "marked, then admitted" (the reserve path's order) and a
                    # failed mark is forgotten before the next decision.
                    await asyncio.gather(*self._marking, return_exceptions=True)
                    self._marking.clear()
                wake_at = self.cycle()
                self._settle_checks()
                self._requeue_due()

    def cycle(self) -> float | None:
        now = time.time()
        started = time.perf_counter()
        plan = self.cache.schedule(now)
        metrics.SCHEDULING_LATENCY.observe((time.perf_counter() - started) * 1000)
        self.cycles += 1
        for decision in plan.decisions:
            if isinstance(decision, Admit):
                self._admit(decision, now)
            elif isinstance(decision, Park):
                self._park(decision)
            elif isinstance(decision, MarkVictims):
                self._mark(decision, now)
        return plan.wake_at

    async def _outcome_of(self, key: str, before: Unit, err: kube.KubeError) -> kube.Obj | None:
        """Did a failed admission write land anyway? A dropped connection or a 5xx may come after
        etcd committed it; forgetting it then would free the quota twice (an overrun) until the
        watch caught up. So the unit stays assumed until the cluster answers: the unit as written
        if it holds more than before, None if the write certainly did not happen. There is no
        retry limit (a limit would turn "unknown" into "not written"); the backoff is capped, the
        watch may answer first (a newer version in the store), and losing leadership or stopping
        cancels the wait."""
        if err.status not in (0, 500, 502, 503, 504):
            return None  # a definite refusal (409, 422, ...): nothing was written
        namespace, name = key.split("/", 1)
        admitted_before = sum(a.replicas for a in before.admissions)
        attempt = 0
        while True:
            current = self._newer_in_store(key, before)
            if current is None:
                try:
                    current = await self.client.get(QUEUE_UNITS, name, namespace=namespace)
                except kube.NotFound:
                    return None
                except kube.KubeError:
                    if attempt == 8:
                        log.warning("admission of %s: outcome still unknown; it stays assumed", key)
                    attempt += 1
                    await asyncio.sleep(min(0.25 * 2 ** min(attempt, 5), 4.0))
                    continue
            now_admitted = sum(a.replicas for a in parse_unit(current).admissions)
            return current if now_admitted > admitted_before else None

    def _newer_in_store(self, key: str, before: Unit) -> kube.Obj | None:
        """The watched version of ``key`` if the watch has delivered one newer than ``before``."""
        latest = self.unit_store.get(key)
        if latest is None:
            return None
        version = (latest.get("metadata") or {}).get("resourceVersion")
        return latest if version and version != before.resource_version else None

    def _hold(self, err: kube.KubeError) -> None:
        """After a transport error, a 5xx or a 429, pause the cycles briefly: the same decisions
        would fail again at once (the chaos run saw 200 retries a second during an outage)."""
        if err.status == 0 or err.status == 429 or err.status >= 500:
            self._hold_until = max(self._hold_until, time.monotonic() + 1.0)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write_status(self, key: str, body: kube.Obj) -> kube.Obj:
        namespace, name = key.split("/", 1)
        async with self._sem:
            return await self.client.patch(QUEUE_UNITS, name, body, namespace=namespace, subresource="status")

    def _settle_cache(self, key: str, written: kube.Obj | None) -> None:
        """Feed the result of our write (or the latest watched object) back into the cache.

        Watch events of ``key`` were held back while the write was in flight, and some of them
        may be newer than ``written``: the unit was deleted, or changed by someone else, after our
        write landed. The informer store always holds the latest watched object (it is updated
        before the handlers run), so the newer of the two wins; a missing store entry means the
        unit is gone. Applying ``written`` over a deletion would leave a ghost holding quota.
        """
        self._writing.discard(key)
        latest = self.unit_store.get(key)
        if written is None or latest is None:
            self._apply_unit(key, latest)
            return
        written_rv, latest_rv = _rv(written), _rv(latest)
        if written_rv is not None and latest_rv is not None and latest_rv > written_rv:
            self._apply_unit(key, latest)
            return
        if written_rv is not None:
            self._written_rv[key] = written_rv
        self._apply_unit(key, written)

    def _settled(self, key: str, written: kube.Obj | None) -> None:
        """Our write for ``key`` finished: update the cache, then give a deferred reason."""
        self._settle_cache(key, written)
        deferred = self._deferred_parks.pop(key, None)
        if deferred is not None and key not in self._writing:
            self._issue_park(deferred)

    # --- admissions --------------------------------------------------------------------------

    def _admit(self, admit: Admit, now: float) -> None:
        before, after = self.cache.assume(admit, now=now)
        self._deferred_parks.pop(admit.key, None)  # superseded by this admission
        self._writing.add(admit.key)
        metrics.JOB_SCHEDULE_ATTEMPTS.labels(admit.queue, "scheduled").inc()
        if before.created:
            metrics.ADMISSION_WAIT.labels(admit.queue).observe(max(0.0, now - before.created))
        if self.verbosity >= 2:
            log.info("queue %s: admit %s as %s %s", admit.queue, admit.key, admit.phase, dict(admit.grants))
        self._spawn(self._write_admit(admit, before, after, now), name=f"admit-{admit.key}")

    async def _write_admit(self, admit: Admit, before: Unit, after: Unit, now: float) -> None:
        stamp = format_time(now)
        conds, clear_requeue = conditions.sync_conditions(
            before.conditions, phase=admit.phase, message=admit.message, now=stamp
        )
        status: kube.Obj = {
            "phase": admit.phase.value,
            "message": admit.message,
            "admissions": admissions_json(after),
            "lastAllocateTime": stamp,
            "lastUpdateTime": stamp,
            "conditions": conds,
        }
        if clear_requeue:
            status["requeueState"] = None
        if admit.phase == Phase.RESERVED:
            config = self.cache.state.configs.get(admit.queue)
            status["admissionChecks"] = admission_checks.checks_for_admission(
                config.admission_checks if config else (), before.labels, before.admission_checks, now=stamp
            )
        body = {"metadata": {"resourceVersion": before.resource_version}, "status": status}
        written: kube.Obj | None = None
        try:
            written = await self._write_status(admit.key, body)
            if before.queue != admit.queue:
                namespace, name = admit.key.split("/", 1)
                with contextlib.suppress(kube.KubeError):
                    written = await self.client.patch(
                        QUEUE_UNITS, name, {"spec": {"queue": admit.queue}}, namespace=namespace
                    )
        except kube.KubeError as err:
            self._hold(err)
            written = await self._outcome_of(admit.key, before, err)
            if written is None:
                log.info("admission of %s not written (%s); it competes again", admit.key, err)
                self.cache.forget(before)
        finally:
            self._settled(admit.key, written)
        if written is not None and admit.phase == Phase.DEQUEUED:
            self.events.record(
                written, type_="Normal", reason=EventReason.SCHEDULED, message=Message.SCHEDULED_EVENT
            )
            if before.phase == Phase.ENQUEUED:  # it waited: tell the job (none on the fast path)
                waited = now - before.created if before.created else None
                message = job_events.admitted_message(admit.queue, waited)
                job_events.record(self.events, written, EventReason.ADMITTED, message)

    # --- parks --------------------------------------------------------------------------------

    def _park(self, park: Park) -> None:
        metrics.JOB_SCHEDULE_ATTEMPTS.labels(park.queue, "unschedulable").inc()
        protected = park.protected
        if protected:
            metrics.PROTECTION_SKIPS.labels(park.queue).inc(len(protected))
            if self.verbosity >= 2:
                log.info(
                    "queue %s: victims %s skipped by the reclaim protect time for %s",
                    park.queue,
                    list(protected),
                    park.key,
                )
        if park.preempt_error and self.verbosity >= 2:
            log.info("queue %s: %s preemption failed: %s", park.queue, park.key, park.preempt_error)
        if park.repeated:
            return
        if park.key in self._writing:
            # Another write of this unit is on its way (often its previous reason). The pure
            # state now records this reason as given, so dropping it would leave the unit showing
            # an outdated one for good: give it once that write has landed.
            self._deferred_parks[park.key] = park
            return
        self._issue_park(park)

    def _issue_park(self, park: Park) -> None:
        unit = self.cache.units.get(park.key)
        raw = self.unit_store.get(park.key)
        if unit is None or raw is None or unit.message == park.message:
            return
        if self.verbosity >= 2:
            log.info("queue %s: %s waits: %s", park.queue, park.key, park.message)
        self._writing.add(park.key)
        self._spawn(self._write_park(park, unit, raw), name=f"park-{park.key}")

    @staticmethod
    def _park_status(park: Park, unit: Unit) -> kube.Obj:
        stamp = format_time(time.time())
        status: kube.Obj = {"message": park.message, "lastUpdateTime": stamp, "attempts": unit.attempts + 1}
        if unit.phase in ("", Phase.ENQUEUED):
            conds, _ = conditions.sync_conditions(
                unit.conditions, phase=Phase.ENQUEUED, message=park.message, now=stamp
            )
            status["phase"] = Phase.ENQUEUED.value
            status["conditions"] = conds
        return status

    @staticmethod
    def _superseded(decided: Unit, latest: Unit) -> bool:
        """Has the unit moved on since a park was decided? ``""`` and ``Enqueued`` both wait."""
        waiting = ("", Phase.ENQUEUED)
        same_phase = latest.phase == decided.phase or (latest.phase in waiting and decided.phase in waiting)
        return not same_phase or latest.admissions != decided.admissions

    async def _write_park(self, park: Park, unit: Unit, raw: kube.Obj) -> None:
        """Write the waiting message, never over a newer decision.

        A later cycle may admit the unit while this message is on its way (the quota was freed
        meanwhile). The write therefore carries the resourceVersion the park was decided on: an
        unconditional patch landing after the admission would turn the admitted unit back to
        ``Enqueued`` while it keeps its admissions, so its job would never be resumed. On a
        conflict the unit is re-read; if it has moved on (admitted, backed off, finished) the
        message is stale and dropped, otherwise (someone else touched it) the write is retried on
        the fresh version.
        """
        written: kube.Obj | None = None
        dropped = False
        current = unit
        namespace, name = park.key.split("/", 1)
        try:
            for _ in range(PARK_WRITE_ATTEMPTS):
                body = {
                    "metadata": {"resourceVersion": current.resource_version},
                    "status": self._park_status(park, current),
                }
                try:
                    written = await self._write_status(park.key, body)
                    break
                except kube.Conflict:
                    latest = parse_unit(await self.client.get(QUEUE_UNITS, name, namespace=namespace))
                    if self._superseded(unit, latest):
                        dropped = True
                        break
                    current = latest
        except kube.NotFound:
            dropped = True
        except kube.KubeError as err:
            log.info("message for %s not written: %s", park.key, err)
            # Decide it again later: the core would otherwise take the message as given and the
            # unit would wait in silence (found by the chaos run: an apiserver restart mid-burst).
            self.cache.forget_park(park.key)
            self._hold(err)
        finally:
            self._settled(park.key, written)
        if dropped:
            return
        target = written or raw
        self.events.record(
            target, type_="Warning", reason=EventReason.FAILED_SCHEDULING, message=park.message
        )
        if not unit.phase:  # its first wait (phase "" -> Enqueued): once per unit, on the job
            state = self.cache.state.queues.get(park.queue)
            place = explain.position(state, park.key) if state is not None else None
            message = job_events.queued_message(park.queue, place, park.message)
            job_events.record(self.events, target, EventReason.QUEUED, message)
        if park.queue_not_found and park.key not in self._queue_not_found:
            self._queue_not_found.add(park.key)
            self.events.record(
                target,
                type_="Warning",
                reason=EventReason.QUEUE_NOT_FOUND,
                message=Message.queue_not_found_event(park.queue, unit.namespace, unit.name),
            )

    # --- preemption marks --------------------------------------------------------------------

    def _mark(self, mark: MarkVictims, now: float) -> None:
        metrics.PREEMPTION_ROUNDS.labels(mark.queue).inc()
        metrics.PREEMPTION_VICTIMS.labels(mark.queue).inc(len(mark.victims))
        if self.verbosity >= 2:
            log.info(
                "queue %s: %s preempts %s (%s path)",
                mark.queue,
                mark.preemptor,
                [v.key for v in mark.victims],
                mark.path,
            )
        for victim in mark.victims:
            unit = self.cache.units.get(victim.key)
            if unit is None or victim.key in self._writing:
                self.cache.forget_marks(mark.queue, {victim.key})
                continue
            self._writing.add(victim.key)
            self._marking.append(
                self._spawn(
                    self._write_mark(mark, victim.key, dict(victim.reclaim), unit, now),
                    name=f"mark-{victim.key}",
                )
            )

    async def _write_mark(
        self, mark: MarkVictims, key: str, reclaim: dict[str, int], unit: Unit, now: float
    ) -> None:
        stamp = format_time(now)
        admissions = admissions_json(unit)
        for entry in admissions:
            if entry["name"] in reclaim:
                entry["reclaimState"] = {"replicas": reclaim[entry["name"]]}
        conds = conditions.evicted(unit.conditions, reason="Preempted", message=mark.message, now=stamp)
        body = {
            "metadata": {"resourceVersion": unit.resource_version},
            "status": {
                "admissions": admissions,
                "message": mark.message,
                "lastUpdateTime": stamp,
                "conditions": conds,
            },
        }
        written: kube.Obj | None = None
        try:
            written = await self._write_status(key, body)
        except kube.KubeError as err:
            log.info("reclaim mark on %s not written (%s)", key, err)
            self.cache.forget_marks(mark.queue, {key})
        finally:
            self._settled(key, written)
        if written is not None:
            replicas = sum(reclaim.values())
            preemptor = mark.preemptor.split("/", 1)[-1]
            self.events.record(
                written,
                type_="Warning",
                reason=EventReason.PREEMPTED,
                message=f"{replicas} replica(s) marked for reclaim in queue {mark.queue} "
                f"so that higher-priority QueueUnit {preemptor} can be admitted",
            )
            message = job_events.preempted_message(mark.queue, replicas, preemptor)
            job_events.record(self.events, written, EventReason.PREEMPTED, message)

    # --- admission checks and backoff --------------------------------------------------------

    def _settle_checks(self) -> None:
        for key in sorted(self._reserved):
            unit = self.cache.units.get(key)
            if unit is None or key in self._writing:
                continue
            outcome = admission_checks.next_phase(unit.phase, unit.admission_checks)
            if outcome is None:
                continue
            self._reserved.discard(key)
            self._writing.add(key)
            self._spawn(self._write_check_outcome(key, unit, outcome), name=f"checks-{key}")

    async def _write_check_outcome(
        self, key: str, unit: Unit, outcome: admission_checks.CheckOutcome
    ) -> None:
        now = time.time()
        stamp = format_time(now)
        status: kube.Obj = {"phase": outcome.phase.value, "message": outcome.message, "lastUpdateTime": stamp}
        conds, _ = conditions.sync_conditions(
            unit.conditions, phase=outcome.phase, message=outcome.message, now=stamp
        )
        status["conditions"] = conds
        if outcome.phase == Phase.TIMEOUT_BACKOFF:
            # Backing off gives the quota back: QuotaReserved=False means nothing is held.
            status["admissions"] = []
            requeue = conditions.next_requeue_state(unit.requeue_count, now=now, jitter=random.random())
            status["requeueState"] = requeue.to_status()
        body = {"metadata": {"resourceVersion": unit.resource_version}, "status": status}
        written: kube.Obj | None = None
        try:
            written = await self._write_status(key, body)
        except kube.KubeError as err:
            log.info("admission-check outcome for %s not written: %s", key, err)
        finally:
            self._settled(key, written)
        if written is not None and outcome.phase == Phase.DEQUEUED:
            self.events.record(
                written, type_="Normal", reason=EventReason.SCHEDULED, message=Message.SCHEDULED_EVENT
            )
            waited = now - unit.created if unit.created else None
            message = job_events.admitted_message(unit.quota or "", waited)
            job_events.record(self.events, written, EventReason.ADMITTED, message)

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
            if unit is None or unit.phase != Phase.TIMEOUT_BACKOFF or key in self._writing:
                continue
            if self._requeue_at(unit) > now:
                heapq.heappush(self._backoff, (self._requeue_at(unit), key))
                continue
            self._writing.add(key)
            self._spawn(self._write_requeue(key, unit), name=f"requeue-{key}")

    async def _write_requeue(self, key: str, unit: Unit) -> None:
        stamp = format_time(time.time())
        conds, _ = conditions.sync_conditions(
            unit.conditions, phase=Phase.ENQUEUED, message=Message.ENQUEUED_AFTER_BACKOFF, now=stamp
        )
        body = {
            "metadata": {"resourceVersion": unit.resource_version},
            "status": {
                "phase": Phase.ENQUEUED.value,
                "message": Message.ENQUEUED_AFTER_BACKOFF,
                "lastUpdateTime": stamp,
                "conditions": conds,
                "admissions": [],
            },
        }
        written: kube.Obj | None = None
        try:
            written = await self._write_status(key, body)
        except kube.KubeError as err:
            log.info("requeue of %s not written: %s", key, err)
        finally:
            self._settled(key, written)

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
                try:
                    await self.client.patch(
                        QUEUES,
                        name,
                        {"status": {"queueItemDetails": {"active": details}}},
                        namespace=names.COMPONENT_NAMESPACE,
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

"""The scheduling loop's writes: a cycle's plan, admission-check outcomes, requeues and reasons, applied
to the API.

Kept apart from ``reconciler.scheduler`` because writing is its own concern with its own hazards: a
write races later cycles and the watch, so every write is conditional on the resourceVersion it was
decided on, an ambiguous failure is resolved before an admission is forgotten, and each write ends
by handing its result back to the loop (``WriterHost.settle_cache``), which holds the unit's
watch events back meanwhile. The loop owns all the state; :class:`Writer` only works on it, so there
is one place that says what the scheduler knows.

The writer sees the loop only through :class:`WriterHost`, a narrow interface of its own: the client,
the events, the cache and the watched units to read, the state of writes in flight
(:class:`WriteState`, which the loop's intake reads to hold watch events back) and three calls
(spawn a write, settle it, pause after a failure). It never imports the loop, so the two modules
do not depend on each other both ways (docs/architecture.md#import-rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenacity import RetryCallState

from koord_queue.reconciler import job_events, metrics
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.job_units import QUEUE_UNITS
from koord_queue.shared import kube, retrying
from koord_queue.shared.api import admission_checks, conditions, quantities
from koord_queue.shared.api.durations import format_time
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import EventReason, Message, Phase
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.core import explain
from koord_queue.shared.core.plan import announces_admission
from koord_queue.shared.core.preemption import MarkVictims
from koord_queue.shared.core.scheduling import Admit, Cache, Park

log = logging.getLogger(__name__)

WRITE_CONCURRENCY = 64
#: A waiting message is retried this often when others touch the unit meanwhile.
PARK_WRITE_ATTEMPTS = 3


class InFlight:
    """The units with writes of ours on their way, counted: an admission may be decided while the
    same unit's previous reason is still being written, and the unit stays "being written" (its
    watch events held back, its cache entry settled) until the last of them has answered."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def add(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def discard(self, key: str) -> None:
        count = self._counts.get(key, 0) - 1
        if count > 0:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    def __len__(self) -> int:
        return len(self._counts)


@dataclass
class WriteState:
    """What is being written, shared by the loop (its intake holds watch events back for these
    units) and the writer (which marks and clears them)."""

    writing: InFlight = field(default_factory=InFlight)
    #: parks decided while another write of the same unit was on its way (the newest only)
    deferred_parks: dict[str, Park] = field(default_factory=dict)
    queue_not_found: set[str] = field(default_factory=set)
    #: units without a quota label whose reason is being written
    noting: set[str] = field(default_factory=set)
    #: victim marks on their way; a cycle waits for them before deciding again
    marking: list[asyncio.Task[None]] = field(default_factory=list)


class WriterHost(Protocol):
    """What the writer needs of the scheduling loop, and nothing more."""

    client: kube.Kube
    events: EventRecorder
    cache: Cache
    unit_store: Mapping[str, kube.Obj]
    writes: WriteState
    #: ``scheduledEvents: Always``: every admission gets ``Scheduled``
    scheduled_event_always: bool

    @property
    def verbosity(self) -> int: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...

    def settle_cache(self, key: str, written: kube.Obj | None) -> None: ...

    def hold(self, err: kube.KubeError) -> None: ...


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


class Writer:
    """Turns the loop's decisions into QueueUnit status writes.

    A collaborator, not an owner: what is being written (:class:`WriteState`) stays the loop's
    state, because its intake reads it to hold watch events back. A unit is marked as being
    written before its write is spawned, by the loop (checks, requeues) or here (:meth:`admit`,
    :meth:`park`, :meth:`mark`), and each such write ends in :meth:`_settled`.
    """

    def __init__(self, host: WriterHost) -> None:
        self.host = host
        self._sem = asyncio.Semaphore(WRITE_CONCURRENCY)

    # --- admissions --------------------------------------------------------------------------

    def admit(self, admit: Admit, now: float) -> None:
        before, after = self.host.cache.assume(admit, now=now)
        self.host.writes.deferred_parks.pop(admit.key, None)  # superseded by this admission
        self.host.writes.writing.add(admit.key)
        metrics.JOB_SCHEDULE_ATTEMPTS.labels(admit.queue, "scheduled").inc()
        if before.created:
            metrics.ADMISSION_WAIT.labels(admit.queue).observe(max(0.0, now - before.created))
        if self.host.verbosity >= 2:
            log.info("queue %s: admit %s as %s %s", admit.queue, admit.key, admit.phase, dict(admit.grants))
        self.host.spawn(self._write_admit(admit, before, after, now), name=f"admit-{admit.key}")

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
        if (before.pool, before.pool_quota) != (admit.pool, admit.pool_quota):
            # where it was admitted (docs/pools.md#fallback-between-pools); null removes a stale one
            status["pool"] = admit.pool or None
            status["poolQuota"] = admit.pool_quota or None
        if admit.phase == Phase.RESERVED:
            config = self.host.cache.state.configs.get(admit.queue)
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
                    written = await self.host.client.patch(
                        QUEUE_UNITS, name, {"spec": {"queue": admit.queue}}, namespace=namespace
                    )
        except kube.KubeError as err:
            self.host.hold(err)
            written = await self._outcome_of(admit.key, before, err)
            if written is None:
                log.info("admission of %s not written (%s); it competes again", admit.key, err)
                self.host.cache.forget(before)
        finally:
            self._settled(admit.key, written)
        if written is not None and admit.phase == Phase.DEQUEUED:
            if announces_admission(before.phase, always=self.host.scheduled_event_always):
                self.host.events.record(
                    written, type_="Normal", reason=EventReason.SCHEDULED, message=Message.SCHEDULED_EVENT
                )
            if before.phase == Phase.ENQUEUED:  # it waited: tell the job (none on the fast path)
                waited = now - before.created if before.created else None
                job_events.record_admitted(self.host.events, written, admit.queue, waited)

    # --- parks --------------------------------------------------------------------------------

    def park(self, park: Park) -> None:
        metrics.JOB_SCHEDULE_ATTEMPTS.labels(park.queue, "unschedulable").inc()
        protected = park.protected
        if protected:
            metrics.PROTECTION_SKIPS.labels(park.queue).inc(len(protected))
            if self.host.verbosity >= 2:
                log.info(
                    "queue %s: victims %s skipped by the reclaim protect time for %s",
                    park.queue,
                    list(protected),
                    park.key,
                )
        if park.preempt_error and self.host.verbosity >= 2:
            log.info("queue %s: %s preemption failed: %s", park.queue, park.key, park.preempt_error)
        if park.repeated:
            return
        if park.key in self.host.writes.writing:
            # Another write of this unit is on its way (often its previous reason). The pure
            # state now records this reason as given, so dropping it would leave the unit showing
            # an outdated one for good: give it once that write has landed.
            self.host.writes.deferred_parks[park.key] = park
            return
        self._issue_park(park)

    def _issue_park(self, park: Park) -> None:
        unit = self.host.cache.units.get(park.key)
        raw = self.host.unit_store.get(park.key)
        if unit is None or raw is None or unit.message == park.message:
            return
        if self.host.verbosity >= 2:
            log.info("queue %s: %s waits: %s", park.queue, park.key, park.message)
        self.host.writes.writing.add(park.key)
        self.host.spawn(self._write_park(park, unit, raw), name=f"park-{park.key}")

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
            async for attempt in retrying.on_conflict(PARK_WRITE_ATTEMPTS):
                with attempt:
                    body = {
                        "metadata": {"resourceVersion": current.resource_version},
                        "status": self._park_status(park, current),
                    }
                    try:
                        written = await self._write_status(park.key, body)
                    except kube.Conflict:
                        latest = parse_unit(
                            await self.host.client.get(QUEUE_UNITS, name, namespace=namespace)
                        )
                        if self._superseded(unit, latest):
                            dropped = True
                            break
                        current = latest
                        raise
        except kube.NotFound:
            dropped = True
        except kube.Conflict:
            pass  # conflicted every time: the message is not written, the event still is
        except kube.KubeError as err:
            log.info("message for %s not written: %s", park.key, err)
            # Decide it again later: the core would otherwise take the message as given and the
            # unit would wait in silence (found by the chaos run: an apiserver restart mid-burst).
            self.host.cache.forget_park(park.key)
            self.host.hold(err)
        finally:
            self._settled(park.key, written)
        if dropped:
            return
        target = written or raw
        self.host.events.record(
            target, type_="Warning", reason=EventReason.FAILED_SCHEDULING, message=park.message
        )
        if not unit.phase:  # its first wait (phase "" -> Enqueued): once per unit, on the job
            state = self.host.cache.state.queues.get(park.queue)
            place = explain.position(state, park.key) if state is not None else None
            message = job_events.queued_message(park.queue, place, park.message)
            job_events.record(self.host.events, target, EventReason.QUEUED, message)
        if park.queue_not_found and park.key not in self.host.writes.queue_not_found:
            self.host.writes.queue_not_found.add(park.key)
            self.host.events.record(
                target,
                type_="Warning",
                reason=EventReason.QUEUE_NOT_FOUND,
                message=Message.queue_not_found_event(park.queue, unit.namespace, unit.name),
            )

    # --- preemption marks --------------------------------------------------------------------

    def mark(self, mark: MarkVictims, now: float) -> None:
        metrics.PREEMPTION_ROUNDS.labels(mark.queue).inc()
        metrics.PREEMPTION_VICTIMS.labels(mark.queue).inc(len(mark.victims))
        if self.host.verbosity >= 2:
            log.info(
                "queue %s: %s preempts %s (%s path)",
                mark.queue,
                mark.preemptor,
                [v.key for v in mark.victims],
                mark.path,
            )
        for victim in mark.victims:
            unit = self.host.cache.units.get(victim.key)
            if unit is None or victim.key in self.host.writes.writing:
                self.host.cache.forget_marks(mark.queue, {victim.key})
                continue
            self.host.writes.writing.add(victim.key)
            self.host.writes.marking.append(
                self.host.spawn(
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
            self.host.cache.forget_marks(mark.queue, {key})
        finally:
            self._settled(key, written)
        if written is not None:
            replicas = sum(reclaim.values())
            preemptor = mark.preemptor.split("/", 1)[-1]
            self.host.events.record(
                written,
                type_="Warning",
                reason=EventReason.PREEMPTED,
                message=f"{replicas} replica(s) marked for reclaim in queue {mark.queue} "
                f"so that higher-priority QueueUnit {preemptor} can be admitted",
            )
            message = job_events.preempted_message(mark.queue, replicas, preemptor)
            job_events.record(self.host.events, written, EventReason.PREEMPTED, message)

    # --- admission checks, requeues and reasons ---------------------------------------------

    async def write_check_outcome(self, key: str, unit: Unit, outcome: admission_checks.CheckOutcome) -> None:
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
            self.host.events.record(
                written, type_="Normal", reason=EventReason.SCHEDULED, message=Message.SCHEDULED_EVENT
            )
            waited = now - unit.created if unit.created else None
            job_events.record_admitted(self.host.events, written, unit.quota or "", waited)

    async def write_requeue(self, key: str, unit: Unit) -> None:
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

    async def write_note(self, key: str, unit: Unit, message: str) -> None:
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
            self.host.writes.noting.discard(key)

    # --- every write -----------------------------------------------------------------------

    async def _write_status(self, key: str, body: kube.Obj) -> kube.Obj:
        namespace, name = key.split("/", 1)
        async with self._sem:
            return await self.host.client.patch(
                QUEUE_UNITS, name, body, namespace=namespace, subresource="status"
            )

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

        def still_unknown(state: RetryCallState) -> None:
            if state.attempt_number == 9:
                log.warning("admission of %s: outcome still unknown; it stays assumed", key)

        current: kube.Obj | None = None
        try:
            async for attempt in retrying.outcome_backoff(still_unknown):
                with attempt:
                    current = self._newer_in_store(key, before)
                    if current is None:
                        current = await self.host.client.get(QUEUE_UNITS, name, namespace=namespace)
        except kube.NotFound:
            return None
        assert current is not None
        now_admitted = sum(a.replicas for a in parse_unit(current).admissions)
        return current if now_admitted > admitted_before else None

    def _newer_in_store(self, key: str, before: Unit) -> kube.Obj | None:
        """The watched version of ``key`` if the watch has delivered one newer than ``before``."""
        latest = self.host.unit_store.get(key)
        if latest is None:
            return None
        version = (latest.get("metadata") or {}).get("resourceVersion")
        return latest if version and version != before.resource_version else None

    def _settled(self, key: str, written: kube.Obj | None) -> None:
        """Our write for ``key`` finished: update the cache, then give a deferred reason."""
        self.host.settle_cache(key, written)
        deferred = self.host.writes.deferred_parks.pop(key, None)
        if deferred is not None and key not in self.host.writes.writing:
            self._issue_park(deferred)

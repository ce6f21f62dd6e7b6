"""Kubernetes Events, recorded off the hot path and without flooding the apiserver.

``record`` only enqueues; a few worker tasks write. Identical events (same object, type, reason and
message) are folded like client-go's correlator: the first is created, repeats within the window
bump ``count`` on the same Event at most once per ``min_patch_interval``, so a unit that fails the
same way every cycle costs one write per interval instead of one per cycle. When the queue is full
the event is dropped and counted: events are information, never a reason to stall scheduling.

The queue holds only the involved object's reference, never the object: under a burst thousands of
events wait, and each whole QueueUnit (our write's answer, ``managedFields`` included) would stay
alive until its event was written (the 15,000-job benchmark measured about 100 MiB of them). One
writer fell behind a burst (about 40 Scheduled events a second, each a round trip) and dropped
events, so several write concurrently; events of one object go to one writer, in order.

Only the leader records (docs/architecture.md#decision-12-leadership-and-high-availability): while
the ``leadership`` gate is closed ``record`` drops the event instead of queueing it. A follower sees
the same watch events as the leader, which records whatever they call for; queueing them too would
write them a second time, stale, when the follower takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from koord_queue.shared import kube
from koord_queue.shared.api import names

log = logging.getLogger(__name__)


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    last_write: float


class EventRecorder:
    def __init__(
        self,
        client: kube.Kube,
        *,
        component: str = names.CONTROLLER_AGENT,
        instance: str = "",
        window_s: float = 600.0,
        min_patch_interval_s: float = 30.0,
        max_queue: int = 10_000,
        writers: int = 4,
        leadership: kube.Leadership | None = None,
    ) -> None:
        self.client = client
        #: closed while following: events are dropped, never queued (open by default)
        self.leadership = leadership if leadership is not None else kube.Leadership()
        self.component = component
        self.instance = instance
        self.window_s = window_s
        self.min_patch_interval_s = min_patch_interval_s
        self.writers = max(1, writers)
        per_writer = max(1, max_queue // self.writers)
        self._queues: list[asyncio.Queue[tuple[dict[str, str], str, str, str]]] = [
            asyncio.Queue(maxsize=per_writer) for _ in range(self.writers)
        ]
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self._swept = time.monotonic()
        self.dropped = 0
        #: events not recorded because this replica did not lead
        self.not_leading = 0
        #: optional events (on jobs) skipped because the writers were behind
        self.skipped_optional = 0
        self.written = 0

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        """Queue an event about ``obj`` (any object with apiVersion, kind and metadata); dropped
        while this replica does not lead."""
        if not self.leadership.leading:
            self.not_leading += 1
            return
        meta = obj.get("metadata") or {}
        ref = {
            "apiVersion": str(obj.get("apiVersion", "")),
            "kind": str(obj.get("kind", "")),
            "name": str(meta.get("name", "")),
            "namespace": str(meta.get("namespace") or "default"),
            "uid": str(meta.get("uid", "")),
        }
        queue = self._queues[hash(ref["uid"]) % self.writers]
        try:
            queue.put_nowait((ref, type_, reason, message))
        except asyncio.QueueFull:
            self.dropped += 1

    def record_optional(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> bool:
        """:meth:`record` for an event that may be skipped: not while the writers are behind (a
        writer's queue half full), so it never delays or crowds out the events that must be
        written (reconciler/job_events.py). Returns whether it was queued."""
        if any(q.qsize() * 2 >= q.maxsize for q in self._queues):
            self.skipped_optional += 1
            return False
        self.record(obj, type_=type_, reason=reason, message=message)
        return True

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i, queue in enumerate(self._queues):
                tg.create_task(self._writer(queue), name=f"events-{i}")

    async def _writer(self, queue: asyncio.Queue[tuple[dict[str, str], str, str, str]]) -> None:
        while True:
            ref, type_, reason, message = await queue.get()
            try:
                await self._write(ref, type_, reason, message)
            except kube.KubeError as err:
                log.warning("event %s for %s/%s not written: %s", reason, ref["kind"], ref["name"], err)
            except Exception:
                log.exception("event %s not written", reason)
            finally:
                queue.task_done()

    async def drain(self, *, timeout: float = 5.0) -> None:
        """Wait (bounded) until the queues are empty — for tests and graceful shutdown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(q.join() for q in self._queues)), timeout)

    async def _write(self, ref: dict[str, str], type_: str, reason: str, message: str) -> None:
        namespace = ref["namespace"]
        uid = ref["uid"]
        key = (uid, type_, reason, message)
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen.last_write < self.window_s:
            seen.count += 1
            if now - seen.last_write < self.min_patch_interval_s:
                return
            seen.last_write = now
            with contextlib.suppress(kube.NotFound):
                await self.client.patch(
                    kube.EVENTS,
                    seen.name,
                    namespace=seen.namespace,
                    patch={"count": seen.count, "lastTimestamp": _now_text()},
                )
                self.written += 1
                return
        stamp = _now_text()
        name = f"{ref['name'] or 'object'}.{secrets.token_hex(8)}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": dict(ref),
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance or self.component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            # Microseconds: events of one second (Preempted, then Reclaimed) keep their order.
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "action": reason,
            "count": 1,
        }
        await self.client.create(kube.EVENTS, event, namespace=namespace)
        self.written += 1
        self._seen[key] = _Seen(name=name, namespace=namespace, count=1, last_write=now)
        if len(self._seen) > 50_000 or now - self._swept >= self.window_s / 10:
            # Entries older than the window fold no more events: drop them as time passes, not
            # only once the map is full, or every object evented stays for as long (one entry
            # per job: 45,000, about 22 MiB, after 30 minutes at 25 jobs/s; bench/bench_soak.py).
            self._swept = now
            cutoff = now - self.window_s
            self._seen = {k: v for k, v in self._seen.items() if v.last_write >= cutoff}

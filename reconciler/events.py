"""Kubernetes Events, recorded off the hot path and without flooding the apiserver.

``record`` only enqueues; a worker task writes. Identical events (same object, type, reason and
message) are folded like client-go's correlator: the first is created, repeats within the window
bump ``count`` on the same Event at most once per ``min_patch_interval``, so a unit that fails the
same way every cycle costs one write per interval instead of one per cycle. When the queue is full
the event is dropped and counted: events are information, never a reason to stall scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared import kube, names

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
    ) -> None:
        self.client = client
        self.component = component
        self.instance = instance
        self.window_s = window_s
        self.min_patch_interval_s = min_patch_interval_s
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=max_queue)
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self.dropped = 0
        self.written = 0

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        """Queue an event about ``obj`` (any object with apiVersion, kind and metadata)."""
        try:
            self._queue.put_nowait(("event", (obj, type_, reason, message)))
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self) -> None:
        while True:
            _, (obj, type_, reason, message) = await self._queue.get()
            try:
                await self._write(obj, type_, reason, message)
            except kube.KubeError as err:
                log.warning(
                    "event %s for %s/%s not written: %s",
                    reason,
                    obj.get("kind"),
                    (obj.get("metadata") or {}).get("name"),
                    err,
                )
            except Exception:
                log.exception("event %s not written", reason)
            finally:
                self._queue.task_done()

    async def drain(self, *, timeout: float = 5.0) -> None:
        """Wait (bounded) until the queue is empty — for tests and graceful shutdown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)

    async def _write(self, obj: kube.Obj, type_: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        uid = str(meta.get("uid", ""))
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
        name = f"{meta.get('name', 'object')}.{secrets.token_hex(8)}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": namespace,
                "uid": uid,
            },
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
        if len(self._seen) > 50_000:
            cutoff = now - self.window_s
            self._seen = {k: v for k, v in self._seen.items() if v.last_write >= cutoff}

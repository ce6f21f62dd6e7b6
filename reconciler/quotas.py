"""Keep one Queue per ElasticQuota (REFERENCE §4.3); decisions in ``shared.quotaqueues``.

Every quota event marks the quota's name dirty; a single worker creates, patches or deletes the
Queue in namespace ``koord-queue``. The Queue store (from the scheduler's Queue informer) is read to
decide; writes that race with an admin's edit simply conflict and are retried with fresh objects.

Quota events alone do not cover a Queue deleted behind our back (``kubectl delete queue``) while its
quota stays: its units would wait for a queue that never comes back. So the worker also checks the
stores every :data:`RESYNC_SECONDS` and re-creates the Queue of every quota that has none (a lookup
per quota, no API call unless one is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from reconciler.events import EventRecorder
from shared import kube, names, quotaqueues

log = logging.getLogger(__name__)

QUEUES = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
QUOTAS = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")

#: How often quotas whose Queue has disappeared are looked for.
RESYNC_SECONDS = 5.0


class QuotaQueueSync:
    def __init__(
        self,
        client: kube.Kube,
        *,
        quotas: Callable[[], Mapping[str, kube.Obj]],
        queues: Callable[[], Mapping[str, kube.Obj]],
        events: EventRecorder,
    ) -> None:
        self.client = client
        self.quotas = quotas
        self.queues = queues
        self.events = events
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._complained: dict[str, str] = {}

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            self._dirty[name] = None
            self._wake.set()

    def _quota_named(self, name: str) -> kube.Obj | None:
        # Quotas are keyed by name only (upstream compatibility); the oldest wins on a clash.
        found = [q for q in self.quotas().values() if (q.get("metadata") or {}).get("name") == name]
        found.sort(
            key=lambda q: (
                (q.get("metadata") or {}).get("creationTimestamp", ""),
                (q.get("metadata") or {}).get("namespace", ""),
            )
        )
        return found[0] if found else None

    def missing_queues(self) -> list[str]:
        """Names of the quotas whose Queue is not in the store (deleted by someone else)."""
        queues = self.queues()
        found: set[str] = set()
        for quota in self.quotas().values():
            name = (quota.get("metadata") or {}).get("name")
            if isinstance(name, str) and name and f"{names.COMPONENT_NAMESPACE}/{name}" not in queues:
                found.add(name)
        return sorted(found)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        resync_at = loop.time() + RESYNC_SECONDS
        while True:
            if loop.time() >= resync_at:
                resync_at = loop.time() + RESYNC_SECONDS
                for name in self.missing_queues():
                    log.info("queue for quota %s is missing; creating it again", name)
                    self._dirty[name] = None
            if not self._dirty:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, resync_at - loop.time()))
                continue
            name = next(iter(self._dirty))
            del self._dirty[name]
            try:
                await self.sync(name)
            except kube.Conflict:
                self._dirty[name] = None
            except kube.KubeError as err:
                log.warning("queue for quota %s: %s; will retry", name, err)
                asyncio.get_running_loop().call_later(1.0, self.on_quota, None, {"metadata": {"name": name}})
            except Exception:
                log.exception("queue for quota %s: sync failed", name)

    async def sync(self, name: str) -> None:
        quota = self._quota_named(name)
        existing = self.queues().get(f"{names.COMPONENT_NAMESPACE}/{name}")
        if quota is None:
            if existing is not None and quotaqueues.created_from_quota(existing):
                with contextlib.suppress(kube.NotFound):
                    await self.client.delete(QUEUES, name, namespace=names.COMPONENT_NAMESPACE)
            self._complained.pop(name, None)
            return
        intent = quotaqueues.intent(quota)
        if existing is None:
            try:
                existing = await self.client.create(QUEUES, intent.queue, namespace=names.COMPONENT_NAMESPACE)
            except kube.Conflict as err:
                if err.reason != "AlreadyExists":
                    raise
                existing = await self.client.get(QUEUES, name, namespace=names.COMPONENT_NAMESPACE)
        patch = quotaqueues.update_patch(existing, intent.queue)
        if patch is not None:
            existing = await self.client.patch(QUEUES, name, patch, namespace=names.COMPONENT_NAMESPACE)
        if intent.policy_problem and self._complained.get(name) != intent.policy_problem:
            self._complained[name] = intent.policy_problem
            self.events.record(
                existing,
                type_="Warning",
                reason=names.EventReason.ADD_QUEUE_FAIL,
                message=intent.policy_problem,
            )
        elif not intent.policy_problem:
            self._complained.pop(name, None)

"""Keep one Queue per ElasticQuota (docs/compatibility.md#queues-from-elasticquotas) and the
quota-binding ConfigMap; decisions in ``shared.core.quotaqueues``.

Every quota event marks the quota's name dirty; a single worker creates, patches or deletes the
Queue in the install namespace (``--namespace``, docs/operations.md#install-namespace). The Queue
store (from the scheduler's Queue informer) is read to decide; writes that race with an admin's
edit simply conflict and are retried with fresh objects.

Quota events alone do not cover a Queue deleted behind our back (``kubectl delete queue``) while its
quota stays: its units would wait for a queue that never comes back. So the worker also checks the
stores every :data:`RESYNC_SECONDS` and re-creates the Queue of every quota that has none (a lookup
per quota, no API call unless one is missing).

Same-named quotas in several namespaces (docs/compatibility.md#same-named-quotas): the name belongs
to the quota that claimed it first. Creating the Queue is the claim: it is atomic (a second create
fails with AlreadyExists) and the Queue records the holder's namespace (``koord-queue/quota-namespace``),
so the holder keeps the name across restarts and leader changes whatever the creation timestamps
say; the scheduler's ledger reads the same record. Without a record (before the Queue exists, or a
Queue made by hand) the oldest counts, then the first the watch delivered. The holder loses the name
only once it is gone from the cluster (asked directly: a lagging cache never moves a claim). Every
other quota of the name gets a Warning ``DuplicateQuotaName`` event and the annotation
``koord-queue/ignored-reason`` naming the holder (removed once it counts again). A quota whose
namespaces or priority-cap annotation cannot be read gets a Warning ``InvalidQuotaAnnotation``.

:class:`QuotaBindingSync` keeps the ConfigMap ``koord-queue-quota-bindings`` (install namespace) that the
quota-binding admission policy (manifests/quota-binding-policy.yaml) reads: which namespaces each
quota serves, which quotas each namespace may use, and whether the check is on.

:class:`QuotaStatusSync` publishes each quota's figures (``status.used`` and the runtime, request and
borrowed annotations; decided in ``shared.core.quotastatus``) on the quota itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tenacity import RetryCallState

from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared import kube, retrying
from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.parsing import parse_quota
from koord_queue.shared.core import quotaqueues, quotastatus
from koord_queue.shared.core.quota import winner, winner_key
from koord_queue.shared.core.scheduling import Cache

log = logging.getLogger(__name__)

QUEUES = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
QUOTAS = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")
CONFIG_MAPS = kube.Resource("", "v1", "configmaps", "ConfigMap")

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
        namespace: str,
    ) -> None:
        self.client = client
        #: where the Queues live: the install namespace
        self.namespace = namespace
        self.quotas = quotas
        self.queues = queues
        self.events = events
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._complained: dict[str, str] = {}
        #: namespace/name of a quota -> the last duplicate or annotation complaint given about it
        self._ignored: dict[str, str] = {}
        self._unreadable: dict[str, str] = {}
        #: namespace/name of a quota -> when the watch first delivered it (tells apart quotas
        #: created in the same second, whose timestamps are equal)
        self._arrival: dict[str, int] = {}
        self._arrivals = 0
        #: quota name -> the namespace holding it, as last written on its Queue (kept for a Queue
        #: deleted behind our back, so the one re-created names the same holder)
        self._holders: dict[str, str] = {}

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if isinstance(name, str) and name:
            key = f"{meta.get('namespace', '')}/{name}"
            if new is None:
                self._arrival.pop(key, None)
            elif key not in self._arrival:
                self._arrivals += 1
                self._arrival[key] = self._arrivals
            self._dirty[name] = None
            self._wake.set()

    def on_queue_gone(self, queue: kube.Obj | None) -> None:
        """A Queue was deleted: its quota's sync runs again (and creates it again if the quota
        stays; the holder it recorded is remembered in :attr:`_holders`)."""
        name = ((queue or {}).get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            self._dirty[name] = None
            self._wake.set()

    def _named(self, name: str, holder: str | None = None) -> list[tuple[Quota, kube.Obj]]:
        """Every quota called ``name`` in the store, the one that counts first
        (``shared.core.quota.winner``; ``holder``: the namespace the Queue records)."""
        found = [
            (parse_quota(q), q)
            for q in self.quotas().values()
            if (q.get("metadata") or {}).get("name") == name
        ]
        return self._ordered(name, found, holder)

    def _ordered(
        self, name: str, found: list[tuple[Quota, kube.Obj]], holder: str | None
    ) -> list[tuple[Quota, kube.Obj]]:
        arrival = {q.namespace: self._arrival.get(f"{q.namespace}/{name}", 0) for q, _ in found}
        first = winner((q for q, _ in found), holder=holder, arrival=arrival)
        return sorted(
            found, key=lambda pair: (pair[0] is not first, winner_key(pair[0], arrival[pair[0].namespace]))
        )

    async def _contenders(self, name: str, queue: kube.Obj | None) -> list[tuple[Quota, kube.Obj]]:
        """The quotas called ``name``, the holder first. A holder the store does not show is asked
        for directly: the store may lag behind the cluster, and a claim moves only once its holder
        is really gone."""
        holder = quotaqueues.holder_of(queue) or self._holders.get(name)
        found = self._named(name, holder)
        if holder is not None and all(q.namespace != holder for q, _ in found):
            try:
                raw = await self.client.get(QUOTAS, name, namespace=holder)
            except kube.NotFound:
                pass
            else:
                found = self._ordered(name, [*found, (parse_quota(raw), raw)], holder)
        return found

    def missing_queues(self) -> list[str]:
        """Names of the quotas whose Queue is not in the store (deleted by someone else)."""
        queues = self.queues()
        found: set[str] = set()
        for quota in self.quotas().values():
            name = (quota.get("metadata") or {}).get("name")
            if isinstance(name, str) and name and f"{self.namespace}/{name}" not in queues:
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
                asyncio.get_running_loop().call_later(1.0, self.on_queue_gone, {"metadata": {"name": name}})
            except Exception:
                log.exception("queue for quota %s: sync failed", name)

    async def sync(self, name: str) -> None:
        existing = self.queues().get(f"{self.namespace}/{name}")
        named = await self._contenders(name, existing)
        quota = named[0][1] if named else None
        if quota is None:
            await self._report(name, named)
            if existing is not None and quotaqueues.created_from_quota(existing):
                with contextlib.suppress(kube.NotFound):
                    await self.client.delete(QUEUES, name, namespace=self.namespace)
            self._complained.pop(name, None)
            self._holders.pop(name, None)
            return
        if existing is None:
            # Creating the Queue claims the name for this quota (atomically: only one create wins).
            try:
                existing = await self.client.create(
                    QUEUES, quotaqueues.intent(quota, self.namespace).queue, namespace=self.namespace
                )
            except kube.Conflict as err:
                if err.reason != "AlreadyExists":
                    raise
                existing = await self.client.get(QUEUES, name, namespace=self.namespace)
                named = await self._contenders(name, existing)  # its record decides
                quota = named[0][1]
        await self._report(name, named)
        self._holders[name] = named[0][0].namespace
        intent = quotaqueues.intent(quota, self.namespace)
        patch = quotaqueues.update_patch(existing, intent.queue)
        if patch is not None:
            existing = await self.client.patch(QUEUES, name, patch, namespace=self.namespace)
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

    async def _report(self, name: str, named: list[tuple[Quota, kube.Obj]]) -> None:
        """Tell the ignored same-named quotas why (event + annotation), clear the annotation on the
        one that counts, and complain once about annotations that cannot be read."""
        keys = {f"{q.namespace}/{name}" for q, _ in named}
        for table in (self._ignored, self._unreadable):
            for key in [k for k in table if k.split("/", 1)[1] == name]:
                if key not in keys:
                    del table[key]
        for i, (quota, raw) in enumerate(named):
            key = f"{quota.namespace}/{name}"
            problems = "; ".join(p for p in quota.problems if p.startswith("metadata.annotations["))
            if problems and self._unreadable.get(key) != problems:
                self._unreadable[key] = problems
                self.events.record(
                    raw, type_="Warning", reason=names.INVALID_QUOTA_ANNOTATION_REASON, message=problems
                )
            elif not problems:
                self._unreadable.pop(key, None)
            reason = (
                None
                if i == 0
                else names.duplicate_quota_message(quota.namespace, name, named[0][0].namespace)
            )
            if reason is not None and self._ignored.get(key) != reason:
                self._ignored[key] = reason
                log.warning("%s", reason)
                self.events.record(
                    raw, type_="Warning", reason=names.DUPLICATE_QUOTA_NAME_REASON, message=reason
                )
            elif reason is None:
                self._ignored.pop(key, None)
            patch = quotaqueues.ignored_patch(raw, reason)
            if patch is None:
                continue
            try:
                await self.client.patch(QUOTAS, name, patch, namespace=quota.namespace)
            except kube.NotFound:
                continue
            except kube.KubeError as err:
                # Information only (the event says the same): never hold up the Queue for it.
                log.warning(
                    "ElasticQuota %s: %s annotation not written: %s",
                    key,
                    names.IGNORED_REASON_ANNOTATION,
                    err,
                )


class QuotaBindingSync:
    """Keep the ConfigMap the quota-binding admission policy reads in step with the quotas.

    The data comes from ``shared.core.quotaqueues.binding_data`` and ``tree_data`` (the tree policy
    reads the same ConfigMap) over the quotas that count. It is
    written after quota events (a burst coalesced into one write) and compared with the cluster
    every ``resync_seconds``, so a ConfigMap deleted or edited by hand is put back. Until it exists
    the policy lets jobs in (``parameterNotFoundAction: Allow``): the scheduler holds them anyway.
    """

    def __init__(
        self,
        client: kube.Kube,
        *,
        quotas: Callable[[], Iterable[Quota]],
        enforce: bool,
        namespace: str,
        guarantees: bool = True,
        name: str = names.QUOTA_BINDINGS_CONFIGMAP,
        resync_seconds: float = 60.0,
        settle_seconds: float = 0.2,
    ) -> None:
        self.client = client
        self.quotas = quotas
        self.enforce = enforce
        self.guarantees = guarantees
        self.namespace = namespace
        self.name = name
        self.resync_seconds = resync_seconds
        self.settle_seconds = settle_seconds
        self._wake = asyncio.Event()
        self.writes = 0

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        self._wake.set()

    def desired(self) -> dict[str, str]:
        quotas = list(self.quotas())
        tree = quotaqueues.tree_data(quotas, guarantees=self.guarantees)
        return quotaqueues.binding_data(quotas, enforce=self.enforce) | tree

    async def run(self) -> None:
        while True:
            async for attempt in retrying.steady(1.0, self._failed):
                with attempt:
                    self._wake.clear()
                    await self.sync()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.resync_seconds)
            await asyncio.sleep(self.settle_seconds)  # let a burst of quota events land first

    def _failed(self, state: RetryCallState) -> None:
        log.warning("ConfigMap %s/%s: %s; will retry", self.namespace, self.name, retrying.failure(state))

    async def sync(self) -> None:
        """Create or replace the ConfigMap when its data differs (a conflict is retried at once: the
        ConfigMap was created or replaced meanwhile, by another leader's last write; compare again)."""
        async for attempt in retrying.on_conflict():
            with attempt:
                await self._sync_once()

    async def _sync_once(self) -> None:
        data = self.desired()
        try:
            current = await self.client.get(CONFIG_MAPS, self.name, namespace=self.namespace)
        except kube.NotFound:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/part-of": "koord-queue"},
                },
                "data": data,
            }
            await self.client.create(CONFIG_MAPS, body, namespace=self.namespace)
            self.writes += 1
            return
        if (current.get("data") or {}) == data:
            return
        await self.client.replace(CONFIG_MAPS, self.name, {**current, "data": data}, namespace=self.namespace)
        self.writes += 1


class QuotaStatusSync:
    """Publish each quota's figures on the quota (docs/compatibility.md#quota-guarantees, "Published
    figures"): ``status.used`` and the annotations ``quota.scheduling.koordinator.sh/runtime``,
    ``.../request`` and ``koord-queue/borrowed``, as ``shared.core.quotastatus`` computes them from
    the scheduler's cache.

    Only the leader runs it (``reconciler/main.py`` starts it in ``act``), and only with
    ``publishQuotaStatus`` on: where koord-scheduler runs, it owns these fields.

    Every ``tick_seconds`` (and after any quota event) the figures are compared with the quota as
    the informer last saw it; what differs is written, at most once per quota per
    ``interval_seconds``, so a quota whose usage changes with every admission costs one write per
    interval, and nothing is written while the figures equal what the quota shows. A write the watch
    has not shown yet is not repeated (the stored object is older than the one the write returned).

    ``status.used`` goes through the ``/status`` subresource. Koordinator's own CRD has none (the
    API answers 404 there), so on a 404 the status is merged into the main resource instead, and
    from then on directly; if such a write comes back without the new status (the CRD gained the
    subresource) the subresource is tried again. Errors are logged, never raised: the quota is
    tried again after the interval (after a conflict, at once).
    """

    def __init__(
        self,
        client: kube.Kube,
        *,
        cache: Callable[[], Cache],
        quotas: Callable[[], Mapping[str, kube.Obj]],
        interval_seconds: float = 5.0,
        tick_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.cache = cache
        self.quotas = quotas
        #: the scheduler has run a cycle since this replica began to lead: before that the cache
        #: holds no runtime yet, and publishing would show the request in its place for a moment
        self.ready = ready
        self.interval_seconds = interval_seconds
        self.tick_seconds = tick_seconds if tick_seconds is not None else min(1.0, interval_seconds)
        self.clock = clock
        #: whether ElasticQuotas have the status subresource (None: not known yet)
        self.status_subresource: bool | None = None
        self.writes = 0
        self._wake = asyncio.Event()
        self._last: dict[str, float] = {}
        self._written = kube.OwnWrites()
        self._complaints: dict[str, str] = {}

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.sync()
            except Exception:  # a bug must not stop the scheduler's task group
                log.exception("quota figures: publication pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.tick_seconds)

    async def sync(self) -> int:
        """One pass: write what differs (and is due) for every quota that counts; returns the
        number of quotas written."""
        if not self.ready():
            return 0
        cache = self.cache()
        figures = quotastatus.published(cache.ledger, cache.state, cache.snapshot.history)
        store = self.quotas()
        seen: set[str] = set()
        written = 0
        for name, fig in figures.items():
            quota = cache.ledger.quotas[name]
            key = f"{quota.namespace}/{name}"
            seen.add(key)
            obj = store.get(key)
            if obj is None:
                continue
            if self._written.behind(key, obj):
                continue  # the watch has not caught up with our last write yet
            writes = quotastatus.changes(obj, fig)
            if writes.empty:
                continue
            now = self.clock()
            if now - self._last.get(key, -math.inf) < self.interval_seconds:
                continue
            self._last[key] = now
            if await self._write(quota.namespace, name, key, fig, writes):
                written += 1
        for table in (self._last, self._written.versions, self._complaints):
            for key in [k for k in table if k not in seen]:
                del table[key]
        return written

    async def _write(
        self, namespace: str, name: str, key: str, fig: quotastatus.Figures, writes: quotastatus.Writes
    ) -> bool:
        try:
            # merge patches carry no resourceVersion: after a conflict, simply send it again
            async for attempt in retrying.on_conflict(3):
                with attempt:
                    await self._apply(namespace, name, key, fig, writes)
        except kube.Conflict:
            self._last.pop(key, None)  # conflicted every time: the next pass tries again
            return False
        except kube.NotFound:
            return False  # deleted meanwhile
        except kube.KubeError as err:
            text = str(err)
            if self._complaints.get(key) != text:
                self._complaints[key] = text
                log.warning("ElasticQuota %s: figures not published: %s; will retry", key, err)
            return False
        self._complaints.pop(key, None)
        self.writes += 1
        return True

    async def _apply(
        self, namespace: str, name: str, key: str, fig: quotastatus.Figures, writes: quotastatus.Writes
    ) -> None:
        main: dict[str, Any] = dict(writes.annotations or {})
        if writes.status is not None and self.status_subresource is not False:
            try:
                done = await self.client.patch(
                    QUOTAS, name, writes.status, namespace=namespace, subresource="status"
                )
            except kube.NotFound:
                main.update(writes.status)  # no subresource (or the quota is gone: the patch says)
            else:
                self.status_subresource = True
                self._written.wrote(key, done)
        elif writes.status is not None:
            main.update(writes.status)
        if not main:
            return
        done = await self.client.patch(QUOTAS, name, main, namespace=namespace)
        self._written.wrote(key, done)
        if "status" in main:
            used = ((done.get("status") or {}) if isinstance(done, Mapping) else {}).get("used")
            shown = quotastatus.status_shows(used, fig.used)
            if shown and self.status_subresource is not False:
                log.info("ElasticQuotas have no status subresource: status.used is merged into the quota")
            self.status_subresource = False if shown else None
            if not shown:
                self._last.pop(key, None)  # the status was dropped: write it through /status next

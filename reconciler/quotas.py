"""Keep one Queue per ElasticQuota (docs/compatibility.md#queues-from-elasticquotas) and the
quota-binding ConfigMap; decisions in ``shared.core.quotaqueues``.

Every quota event marks the quota's name dirty; a single worker creates, patches or deletes the
Queue in namespace ``koord-queue``. The Queue store (from the scheduler's Queue informer) is read to
decide; writes that race with an admin's edit simply conflict and are retried with fresh objects.

Quota events alone do not cover a Queue deleted behind our back (``kubectl delete queue``) while its
quota stays: its units would wait for a queue that never comes back. So the worker also checks the
stores every :data:`RESYNC_SECONDS` and re-creates the Queue of every quota that has none (a lookup
per quota, no API call unless one is missing).

Same-named quotas in several namespaces: the Queue follows the one that counts
(``shared.core.quota.winner``: the oldest); every other one gets a Warning ``DuplicateQuotaName`` event
and the annotation ``koord-queue/ignored-reason`` saying why (removed once it counts again). A quota
whose namespaces or priority-cap annotation cannot be read gets a Warning ``InvalidQuotaAnnotation``.

:class:`QuotaBindingSync` keeps the ConfigMap ``koord-queue/koord-queue-quota-bindings`` that the
quota-binding admission policy (manifests/quota-binding-policy.yaml) reads: which namespaces each
quota serves, which quotas each namespace may use, and whether the check is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from reconciler.events import EventRecorder
from shared import kube
from shared.api import names
from shared.api.model import Quota
from shared.api.parsing import parse_quota
from shared.core import quotaqueues
from shared.core.quota import winner_key

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
    ) -> None:
        self.client = client
        self.quotas = quotas
        self.queues = queues
        self.events = events
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._complained: dict[str, str] = {}
        #: namespace/name of a quota -> the last duplicate or annotation complaint given about it
        self._ignored: dict[str, str] = {}
        self._unreadable: dict[str, str] = {}

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        obj = new or old or {}
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            self._dirty[name] = None
            self._wake.set()

    def _named(self, name: str) -> list[tuple[Quota, kube.Obj]]:
        """Every quota called ``name``, the one that counts first (``shared.core.quota.winner_key``)."""
        found = [
            (parse_quota(q), q)
            for q in self.quotas().values()
            if (q.get("metadata") or {}).get("name") == name
        ]
        return sorted(found, key=lambda pair: winner_key(pair[0]))

    def _quota_named(self, name: str) -> kube.Obj | None:
        # Quotas are keyed by name only (upstream compatibility); the oldest counts on a clash.
        found = self._named(name)
        return found[0][1] if found else None

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
        named = self._named(name)
        await self._report(name, named)
        quota = named[0][1] if named else None
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
        namespace: str = names.COMPONENT_NAMESPACE,
        name: str = names.QUOTA_BINDINGS_CONFIGMAP,
        resync_seconds: float = 60.0,
        settle_seconds: float = 0.2,
    ) -> None:
        self.client = client
        self.quotas = quotas
        self.enforce = enforce
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
        return quotaqueues.binding_data(quotas, enforce=self.enforce) | quotaqueues.tree_data(quotas)

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.sync()
            except kube.KubeError as err:
                log.warning("ConfigMap %s/%s: %s; will retry", self.namespace, self.name, err)
                await asyncio.sleep(1.0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.resync_seconds)
            await asyncio.sleep(self.settle_seconds)  # let a burst of quota events land first

    async def sync(self) -> None:
        """Create or replace the ConfigMap when its data differs (a conflict is retried at once)."""
        while True:
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
                try:
                    await self.client.create(CONFIG_MAPS, body, namespace=self.namespace)
                except kube.Conflict:
                    continue  # created meanwhile (another leader's last write): compare again
                self.writes += 1
                return
            if (current.get("data") or {}) == data:
                return
            try:
                await self.client.replace(
                    CONFIG_MAPS, self.name, {**current, "data": data}, namespace=self.namespace
                )
            except kube.Conflict:
                continue
            self.writes += 1
            return

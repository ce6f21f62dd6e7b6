"""List + watch one resource into an in-memory store, forever.

The cluster is the source of truth (docs/architecture.md#decision-2-the-cluster-is-the-source-of-truth):
the store is a cache rebuilt by a full list at start and after any ``410 Gone``; between lists, a watch
resumes from the last resourceVersion seen (bookmarks keep it fresh). Transport errors back off
exponentially (tenacity's wait strategy), so an apiserver restart costs a relist at most, never the
loop.

Handlers receive ``(old, new)`` pairs — ``old`` is None on add, ``new`` is None on delete — and must
not block: they update derived state and wake the scheduler. A handler error is logged and the
event skipped; one bad object never stops the informer.

Stores of the many (jobs, pods, QueueUnits) are *packed*: each object is kept as its JSON bytes and
decoded on access. A parsed object costs about seven times its JSON in Python dicts and strings (a
slim 950-byte Job is 6.5 KiB as a dict); the reconciler reads a stored object only when it reconciles
it, and decoding one costs a few microseconds. A read therefore returns a fresh copy: compare
``resourceVersion``, never identity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, MutableMapping

import orjson
from tenacity import RetryCallState

from koord_queue.shared import kube, retrying

log = logging.getLogger(__name__)

Handler = Callable[[kube.Obj | None, kube.Obj | None], None]


def slim(obj: kube.Obj) -> kube.Obj:
    """Drop what no decision reads and that doubles an object's memory: ``managedFields`` and
    kubectl's last-applied copy of the whole object."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    return obj


def key_of(obj: kube.Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


class PackedStore(MutableMapping[str, kube.Obj]):
    """key → object, held as JSON bytes; every read decodes a fresh copy."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}

    def __getitem__(self, key: str) -> kube.Obj:
        obj: kube.Obj = orjson.loads(self._packed[key])
        return obj

    def get(self, key: str, default: kube.Obj | None = None) -> kube.Obj | None:  # type: ignore[override]
        packed = self._packed.get(key)
        if packed is None:
            return default
        obj: kube.Obj = orjson.loads(packed)
        return obj

    def __setitem__(self, key: str, obj: kube.Obj) -> None:
        # orjson hands back its whole output buffer (8 KiB for a 1 KiB object, measured with
        # orjson 3.13): copy the bytes out, or the packing would cost more than the dicts did.
        self._packed[key] = bytes(memoryview(orjson.dumps(obj)))

    def __delitem__(self, key: str) -> None:
        del self._packed[key]

    def __contains__(self, key: object) -> bool:
        return key in self._packed

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


class Informer:
    """Keeps ``self.objects`` (key → raw object) in step with the cluster."""

    def __init__(
        self,
        client: kube.Kube,
        resource: kube.Resource,
        *,
        handler: Handler,
        namespace: str | None = None,
        label_selector: str | None = None,
        watch_timeout_s: int = 300,
        transform: Callable[[kube.Obj], kube.Obj] | None = slim,
        optional: bool = False,
        packed: bool = False,
    ) -> None:
        self.client = client
        self.resource = resource
        self.handler = handler
        self.namespace = namespace
        self.label_selector = label_selector
        self.watch_timeout_s = watch_timeout_s
        self.transform = transform
        #: a kind whose CRD may not be installed (a job kind): a 404 counts as "none yet", so the
        #: process gets ready, and the list is retried until the CRD appears
        self.optional = optional
        self.objects: MutableMapping[str, kube.Obj] = PackedStore() if packed else {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self._need_list = True

    def _dispatch(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        try:
            self.handler(old, new)
        except Exception:
            obj = new or old or {}
            log.exception("handler failed for %s %s; event skipped", self.resource.kind, key_of(obj))

    def _store(self, obj: kube.Obj) -> None:
        if self.transform is not None:
            obj = self.transform(obj)
        key = key_of(obj)
        old = self.objects.get(key)
        self.objects[key] = obj
        self._dispatch(old, obj)

    def _remove(self, obj: kube.Obj) -> None:
        key = key_of(obj)
        old = self.objects.get(key)
        if old is not None:
            del self.objects[key]
            self._dispatch(old, None)

    async def _relist(self) -> None:
        items, rv = await self.client.list(
            self.resource, namespace=self.namespace, label_selector=self.label_selector
        )
        seen: set[str] = set()
        for item in items:
            seen.add(key_of(item))
            self._store(item)
        for key in [k for k in self.objects if k not in seen]:
            gone = self.objects.get(key)
            if gone is not None:
                self._remove(gone)
        self.resource_version = rv
        self.relists += 1
        self.synced.set()

    async def run(self) -> None:
        """List, then watch from the list's version, for ever. A ``410 Gone`` relists at once; a kind
        that is not installed (``404``) is listed again every 2 s, or every 30 s if it is optional;
        any other API error backs off (``shared.retrying.watch_backoff``, up to 10 s), the count
        starting over with each event a watch delivers."""
        missing = retrying.steady(30.0 if self.optional else 2.0, self._missing, errors=kube.NotFound)
        async for missing_try in missing:
            with missing_try:
                self._need_list = True
                async for attempt in retrying.watch_backoff(self._failed):
                    with attempt:
                        await self._follow(attempt.retry_state)

    async def _follow(self, state: RetryCallState) -> None:
        """Watch after watch until an error other than ``410 Gone`` ends it."""
        while True:
            try:
                if self._need_list:
                    await self._relist()
                    self._need_list = False
                async for kind, obj in self.client.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                    timeout_seconds=self.watch_timeout_s,
                ):
                    retrying.start_over(state)
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if kind == "DELETED":
                        self._remove(obj)
                    elif kind in ("ADDED", "MODIFIED"):
                        self._store(obj)
                    if rv:
                        self.resource_version = str(rv)
            except kube.Gone:
                log.info("%s watch expired (410); relisting", self.resource.plural)
                self._need_list = True

    def _missing(self, state: RetryCallState) -> None:
        if not self.optional:
            log.warning("%s list/watch failed (%s); retrying", self.resource.plural, retrying.failure(state))
        elif not self.synced.is_set():
            log.info("%s: not installed in this cluster; checking again every 30s", self.resource.plural)
            self.synced.set()

    def _failed(self, state: RetryCallState) -> None:
        err = retrying.failure(state)
        log.warning(
            "%s list/watch failed (%s); retrying in %.1fs", self.resource.plural, err, retrying.delay(state)
        )
        if isinstance(err, kube.KubeError) and err.status in (400, 403, 404):
            self._need_list = True

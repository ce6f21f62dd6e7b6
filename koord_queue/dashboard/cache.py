"""The QueueUnits the dashboard shows, kept by one list and then a watch, as the user
(docs/dashboard.md#what-it-costs).

A page polls every second; listing 50,000 QueueUnits each time would cost the API server and this
process far more than the page is worth. So each *scope* (one namespace, or ``None``: every
namespace) is listed once, page by page, with the user's own client, then watched from the list's
resourceVersion; a 410 Gone lists again. Each change bumps :attr:`UnitStore.version`, which is what
the pages' answers are built from (once per change, not per poll).

What is kept is the parsed :class:`~koord_queue.shared.api.model.Unit` (what the scheduler replay
and the rows need) and the job each unit stands for, not the raw object: at 50,000 units the raw
JSON would be most of the process's memory. The kept unit is slimmed further: the fields neither
the replay, ``explain`` nor ``list``'s rows read (its conditions, annotations, parse notes, last
update time) are emptied, repeated values are one shared copy (:class:`Sharing`), and a relist
keeps the unit it already has when the resourceVersion is the same, so a relist never holds two
parsed generations of 50,000 units (docs/dashboard.md#at-50000-units;
tests/unit/test_dashboard_cache.py measures the bytes kept per unit).

The identity never changes: a store lists and watches with the client the plugin was built with,
so the API server's RBAC decides what it holds. A store for every namespace is only made when the
user's cluster-wide list succeeds; a refusal there is remembered and the namespace's own store is
used instead, never anything broader (:class:`Stores`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson

from koord_queue.cli.client import QUEUE_UNITS, is_rbac_refusal
from koord_queue.cli.commands import job_ref
from koord_queue.dashboard.views import Held
from koord_queue.shared import kube
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.parsing import parse_unit

#: QueueUnits asked for per list page.
PAGE: Final = 500
#: Units parsed between two turns of the event loop while a list is read (a page of 500 parses
#: in about 60 ms, which the early page's requests would otherwise wait behind).
YIELD_EVERY: Final = 50
#: The longest a list waits for a request that asked it to step aside (:class:`Gate`).
PAUSE_MAX_S: Final = 2.0
#: How long a failed watch waits before listing again (a back-off, not a synchronisation).
RETRY_S: Final = 1.0
MAX_RETRY_S: Final = 30.0
#: How long a refused cluster-wide list is believed before it is tried again.
REFUSAL_S: Final = 60.0
#: Distinct values :class:`Sharing` remembers before it forgets them all (units keep theirs).
MAX_SHARED: Final = 20_000
#: Stores kept at once (a user browsing many namespaces); the least recently used one is stopped.
MAX_STORES: Final = 8


#: The fields of a Unit that repeat from unit to unit (a quota's name, its message, the same pod
#: template's requests): one shared copy of each value, by :class:`Sharing`.
_STRINGS: Final = (
    "namespace",
    "quota",
    "phase",
    "message",
    "queue",
    "pool",
    "pool_quota",
    "preemption_policy",
)
_VALUES: Final = ("labels", "request", "resource", "pod_sets", "admissions")
#: One empty mapping for every kept unit's annotations.
_NO_ANNOTATIONS: Final[Mapping[str, str]] = MappingProxyType({})
#: The fields of a Unit that nothing the dashboard builds reads (the scheduler replay, explain's
#: answers, list's rows; the unit page reads its unit again): emptied on the kept copy. Conditions
#: carry a timestamp each, so they would never be shared and would cost more than the rest of
#: the unit.
UNREAD: Final[dict[str, Any]] = {
    "annotations": _NO_ANNOTATIONS,
    "conditions": (),
    "problems": (),
    "last_update_time": None,
}


def _fingerprint(name: str, value: Any) -> bytes:
    """Equal values, equal bytes: orjson serialises the parsed values (dicts, tuples of frozen
    dataclasses) in a few microseconds; ``repr`` for anything it does not know."""
    try:
        return name.encode() + b":" + orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return f"{name}:{value!r}".encode()


class Sharing:
    """One copy of each repeated value among the units a store keeps: 50,000 units of a few
    teams carry a few distinct labels, messages and requests, and a copy of each per unit would be
    most of the process's memory (docs/dashboard.md#what-it-costs). The values are read, never
    written, by the replay and the rows."""

    def __init__(self) -> None:
        self._seen: dict[bytes, Any] = {}

    def unit(self, unit: Unit) -> Unit:
        """``unit`` with its repeated values replaced by the shared copies and the fields the
        dashboard never reads emptied (:data:`UNREAD`); a unit just parsed, not yet seen by
        anything else."""
        for name, empty in UNREAD.items():
            object.__setattr__(unit, name, empty)
        for name in _STRINGS:
            value = getattr(unit, name)
            if isinstance(value, str) and value:
                object.__setattr__(unit, name, sys.intern(value))
        for name in _VALUES:
            value = getattr(unit, name)
            if value:
                if len(self._seen) >= MAX_SHARED:  # distinct values churned: start over
                    self._seen.clear()
                object.__setattr__(unit, name, self._seen.setdefault(_fingerprint(name, value), value))
        return unit

    def clear(self) -> None:
        self._seen.clear()


def _libc() -> Any:
    with contextlib.suppress(OSError):
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return None


_LIBC: Final = _libc()
#: glibc's mallopt parameter for the number of malloc arenas.
_M_ARENA_MAX: Final = -8


def one_arena() -> None:
    """One malloc arena for the whole process (glibc): the page builds run in a worker thread, and
    a second arena would keep what a build freed (docs/dashboard.md#what-it-costs)."""
    with contextlib.suppress(AttributeError):
        if _LIBC is not None:
            _LIBC.mallopt(_M_ARENA_MAX, 1)


def give_back() -> None:
    """Return the memory a list or a build freed to the system (glibc's ``malloc_trim``)."""
    with contextlib.suppress(AttributeError):
        if _LIBC is not None:
            _LIBC.malloc_trim(0)


def hold(raw: dict[str, Any], sharing: Sharing | None = None) -> Held:
    """What is kept of one QueueUnit: the parsed unit and the job text of ``list``
    (``commands.job_ref``)."""
    unit = parse_unit(raw)
    job = job_ref(unit, raw)
    if sharing is not None:
        unit = sharing.unit(unit)
    return Held(unit, job)


class Gate:
    """Lets a request someone waits on go before the background lists: while a page's first
    answer is read (docs/dashboard.md#the-first-page), every list of the dashboard stops between
    two slices of units and before asking for its next page, for at most :data:`PAUSE_MAX_S`.
    The event loop and the API server are then that answer's; the list goes on after it."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._holders = 0

    @contextlib.contextmanager
    def held(self) -> Any:
        self._holders += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holders -= 1
            if not self._holders:
                self._open.set()

    async def passed(self) -> None:
        if not self._open.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._open.wait(), PAUSE_MAX_S)


def _key(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class UnitStore:
    """The QueueUnits of one scope, listed once and then watched, with the user's client."""

    def __init__(
        self,
        client: kube.Kube,
        namespace: str | None,
        gate: Gate | None = None,
        long: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.gate = gate or Gate()
        #: set once the store's first list needs more than one page (its page cannot be ready at once)
        self.long = long or asyncio.Event()
        self.units: dict[str, Held] = {}
        #: bumped on every change the watch delivers (and on every relist)
        self.version = 0
        self.resource_version = ""
        #: the last failure of the watch (the store keeps serving what it last had)
        self.error: kube.KubeError | None = None
        self._task: asyncio.Task[None] | None = None
        self.sharing = Sharing()

    async def load(self) -> None:
        """List the scope page by page, keeping only :class:`Held`; raises the API server's
        refusal (the caller decides what a 403 means)."""
        fresh: dict[str, Held] = {}
        kept = self.units  # a relist: an unchanged unit (same resourceVersion) is kept as it is
        self.sharing.clear()
        query: dict[str, Any] = {"limit": PAGE}
        while True:
            await self.gate.passed()
            try:
                page = await self.client.request(
                    "GET", QUEUE_UNITS.path(self.namespace), query=query, verb="LIST"
                )
            except kube.Gone:
                if "continue" not in query:
                    raise
                # the list's snapshot was compacted away while it was read (a long list): list
                # again from the start, keeping each unit parsed so far that did not change
                kept, fresh = {**kept, **fresh}, {}
                query = {"limit": PAGE}
                continue
            if self.version == 0 and (page.get("metadata") or {}).get("continue"):
                self.long.set()
            items: list[dict[str, Any]] = page.pop("items", None) or []
            items.reverse()
            count = 0
            while items:  # each raw unit is let go as soon as it is kept
                raw = items.pop()
                meta = raw.get("metadata") or {}
                key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
                known = kept.get(key)
                if known is not None and known.unit.resource_version == meta.get("resourceVersion"):
                    fresh[known.unit.key] = known
                else:
                    held = hold(raw, self.sharing)
                    fresh[held.unit.key] = held
                del raw, meta
                count += 1
                if count % YIELD_EVERY == 0:
                    # let the early page's reads go on between units (docs/dashboard.md#the-first-page)
                    await asyncio.sleep(0)
                    await self.gate.passed()
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.resource_version = str(meta.get("resourceVersion", ""))
                break
            query["continue"] = token
        self.units = fresh
        self.version += 1
        del fresh, page, kept
        give_back()

    def start(self) -> None:
        """Follow the changes from the list's resourceVersion in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name=f"dashboard-watch-{self.namespace}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def apply(self, kind: str, raw: dict[str, Any]) -> None:
        """One watch event."""
        meta = raw.get("metadata") or {}
        self.resource_version = str(meta.get("resourceVersion") or self.resource_version)
        if kind == "BOOKMARK":
            return
        if kind == "DELETED":
            self.units.pop(_key(raw), None)
        else:
            held = hold(raw, self.sharing)
            self.units[held.unit.key] = held
        self.version += 1

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                async for kind, raw in self.client.watch(
                    QUEUE_UNITS, resource_version=self.resource_version, namespace=self.namespace
                ):
                    self.apply(kind, raw)
                    failures = 0
                self.error = None
            except kube.Gone:
                await self._relist()
            except kube.KubeError as err:
                # a refused or failing watch: back off (1 s, doubling to 30 s) before listing
                # again with the same identity and scope; nothing broader is ever tried
                self.error = err
                failures += 1
                await asyncio.sleep(min(MAX_RETRY_S, RETRY_S * 2 ** (failures - 1)))
                await self._relist()

    async def _relist(self) -> None:
        try:
            await self.load()
            self.error = None
        except kube.KubeError as err:
            self.error = err


class Stores:
    """The stores of one dashboard (one user): at most :data:`MAX_STORES`, least recently used
    stopped first."""

    def __init__(self, client: kube.Kube) -> None:
        self.client = client
        self._stores: OrderedDict[str | None, UnitStore] = OrderedDict()
        self._locks: dict[str | None, asyncio.Lock] = {}
        self._cluster_refused_at: float | None = None
        #: shared by every store of this dashboard (docs/dashboard.md#the-first-page); ``long`` is
        #: set while a store's first list is under way and needs more than one page
        self.gate = Gate()
        self.long = asyncio.Event()
        self._loading = 0

    async def get(self, namespace: str | None) -> UnitStore:
        """The loaded store of ``namespace`` (``None``: every namespace); raises the refusal of its
        first list."""
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            store = self._stores.get(namespace)
            if store is None:
                store = UnitStore(self.client, namespace, self.gate, self.long)
                self._loading += 1
                try:
                    await store.load()
                finally:
                    self._loading -= 1
                    if not self._loading:
                        self.long.clear()
                store.start()
                self._stores[namespace] = store
                while len(self._stores) > MAX_STORES:
                    _, old = self._stores.popitem(last=False)
                    await old.stop()
            self._stores.move_to_end(namespace)
            return store

    async def widest(self, namespace: str) -> tuple[UnitStore, bool]:
        """The store the replay of ``namespace``'s page reads, and whether it is complete: every
        namespace when the user may list them (as ``explain`` reads), else the namespace's own.
        Only an RBAC refusal falls back, and only to the namespace itself."""
        refused = self._cluster_refused_at
        if refused is None or time.monotonic() - refused > REFUSAL_S:
            try:
                return await self.get(None), True
            except kube.KubeError as err:
                if not is_rbac_refusal(err):
                    raise
                self._cluster_refused_at = time.monotonic()
        return await self.get(namespace), False

    async def close(self) -> None:
        for store in self._stores.values():
            await store.stop()
        self._stores.clear()

"""The queue page's answer, built once per change and answered with 304 while nothing changed
(docs/dashboard.md#what-it-costs).

The units come from ``dashboard.cache`` (listed once, then watched, as the user); the quotas, the
Queues, the component settings and the visibility API's positions are read as ``explain`` reads
them (``Reader``, the user's client), in the background of the polls: again when the units changed
(at most every :data:`SIDE_S` seconds) and at least every :data:`SIDE_MAX_S` seconds while a page
polls, so a poll never waits for them once the page was built. The answer is rebuilt only when
the units' version or those reads changed: one scheduler replay for the whole page
(``explain.explain_many``), the first ``limit`` rows of each queue, serialised once; its ETag is
the hash of those bytes, so a poll of an unchanged page is a 304 with no body.

Each row's "why" is ``explain``'s summary of that unit, from the same objects ``explain`` reads: the
QueueUnits of every namespace when the user may list them, else the namespace's own.

That needs every unit listed first, which at 50,000 units takes many seconds. So a namespace's first
request does not wait for it (docs/dashboard.md#the-first-page): the full page is built in the
background, and until it is ready the answer is the *early page*: the namespace's first waiting
units as the visibility API numbers them (one read, as the user), each one GET as the user, with
``list``'s short reason marked as such instead of ``explain``'s why, and ``"loading": true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import orjson

from koord_queue.cli import commands
from koord_queue.cli.client import QUEUE_UNITS, VISIBILITY, CliError, Gathered, Reader, denied
from koord_queue.dashboard import views
from koord_queue.dashboard.cache import Stores, UnitStore, give_back, hold
from koord_queue.dashboard.views import Held
from koord_queue.shared import kube
from koord_queue.shared.api.model import Quota, Unit
from koord_queue.shared.core import explain, replay, visibility

#: How long the quotas, Queues, settings and positions read for a page are reused.
SIDE_S: Final = 1.0
SIDE_MAX_S: Final = 10.0
#: Rows of each queue on a first page, and the most a request may ask for.
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 5000
#: How long a namespace's first request waits for the full page before it answers the early one
#: (a small cluster's full page is ready by then, so it never sees an early page); not waited once
#: the list has more than one page, which no full page is built behind within that time.
EARLY_WAIT_S: Final = 0.3
#: While the full page is built, the early page is read again this often for as long as a page
#: asked for it in the last :data:`EARLY_LINGER_S` seconds, so a poll usually finds it read less
#: than :data:`SIDE_S` ago instead of waiting for its reads (and joins the read under way when not).
EARLY_EVERY_S: Final = 0.8
EARLY_LINGER_S: Final = 10.0
#: GETs of the early page's units in flight at once (the API client's connection pool is 64).
EARLY_GETS: Final = 50


@dataclass(frozen=True, slots=True)
class Built:
    """One answer: its JSON bytes and their ETag."""

    body: bytes
    etag: str


@dataclass(slots=True)
class _Side:
    got: Gathered
    fingerprint: str
    read_at: float
    #: the units' version when the reads started
    version: int


class QueuePages:
    """The queue pages of one dashboard (one user)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.stores = Stores(reader.client)
        self._built: dict[tuple[str | None, int], tuple[tuple[int, str], Built]] = {}
        self._side: dict[str | None, _Side] = {}
        self._locks: dict[tuple[str | None, int], asyncio.Lock] = {}
        self._refreshing: dict[str | None, asyncio.Task[None]] = {}
        #: full pages being built in the background while the early page is answered
        self._pending: dict[tuple[str | None, int], asyncio.Task[Built]] = {}
        #: namespaces whose full page was built once (their store is listed and watched)
        self._warm: set[str | None] = set()
        self._early: dict[tuple[str | None, int], tuple[float, Built]] = {}
        #: the early page's reads in flight, and its keeper, by page
        self._early_reads: dict[tuple[str, int], asyncio.Task[Built]] = {}
        self._keepers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._asked: dict[tuple[str, int], float] = {}

    async def close(self) -> None:
        tasks = [
            *self._refreshing.values(),
            *self._pending.values(),
            *self._early_reads.values(),
            *self._keepers.values(),
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.stores.close()

    async def answer(self, namespace: str | None, limit: int) -> Built:
        """The page of ``namespace`` (None: every namespace); raises ``CliError`` on a refusal.
        Until a namespace's units are all listed, the early page (docs/dashboard.md#the-first-page)."""
        if namespace is None or namespace in self._warm:
            return await self._full(namespace, limit)
        key = (namespace, limit)
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._full(namespace, limit), name=f"dashboard-page-{namespace}")
            self._pending[key] = task
        if not task.done() and not self.stores.long.is_set():
            long = asyncio.ensure_future(self.stores.long.wait())
            try:
                await asyncio.wait({task, long}, timeout=EARLY_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                long.cancel()
        if task.done():  # ready, or failed: its refusal is this answer's, and the next request starts over
            del self._pending[key]
            self._early.pop(key, None)
            return task.result()
        return await self._early_page(namespace, limit)

    async def _early_page(self, namespace: str, limit: int) -> Built:
        """The namespace's first waiting units from the visibility API, each read with one GET as
        the user: read less than :data:`SIDE_S` seconds ago, else read now (the page's first
        answer with the lists stepping aside meanwhile, ``cache.Gate``); kept fresh in the
        background while pages ask for it."""
        key = (namespace, limit)
        self._asked[key] = time.monotonic()
        keeper = self._keepers.get(key)
        if keeper is None or keeper.done():
            self._keepers[key] = asyncio.create_task(self._keep_early(namespace, limit))
        cached = self._early.get(key)
        if cached is not None:
            if time.monotonic() - cached[0] < SIDE_S:
                return cached[1]
            return await self._early_read(namespace, limit)
        with self.stores.gate.held():  # the page's first answer: nothing to show until it is read
            return await self._early_read(namespace, limit)

    async def _keep_early(self, namespace: str, limit: int) -> None:
        """Read the early page again every :data:`EARLY_EVERY_S` seconds while the full page is
        built and a page asked for it within :data:`EARLY_LINGER_S` seconds (a pace, not a
        synchronisation); a failed read is left for the next request to meet."""
        key = (namespace, limit)
        while time.monotonic() - self._asked.get(key, 0.0) < EARLY_LINGER_S:
            full = self._pending.get(key)
            if full is None or full.done():
                return
            started = time.monotonic()
            with contextlib.suppress(CliError, kube.KubeError):
                await self._early_read(namespace, limit)
            await asyncio.sleep(max(0.0, EARLY_EVERY_S - (time.monotonic() - started)))

    async def _early_read(self, namespace: str, limit: int) -> Built:
        """One read of the early page, shared by everyone asking while it runs."""
        key = (namespace, limit)
        reading = self._early_reads.get(key)
        if reading is None or reading.done():
            reading = asyncio.create_task(self._read_early(namespace, limit))
            self._early_reads[key] = reading
        return await asyncio.shield(reading)

    async def _read_early(self, namespace: str, limit: int) -> Built:
        key = (namespace, limit)
        read_at = time.monotonic()
        client = self.reader.client
        try:  # the same refusal as the full page's list, before anything else is read
            await client.request("GET", QUEUE_UNITS.path(namespace), query={"limit": 1}, verb="LIST")
        except kube.KubeError as err:
            raise denied(err, "list", QUEUE_UNITS, namespace) from None
        path = f"{VISIBILITY}/namespaces/{quote(namespace, safe='')}/queueunits"
        try:
            page = await client.request("GET", path, query={"offset": 0, "limit": POSITIONS_PAGE})
            items: list[dict[str, Any]] = list(page.get("items") or [])
            known = True
        except kube.KubeError:
            items, known = [], False
        wanted = early_rows(items, min(limit, DEFAULT_LIMIT))
        gate = asyncio.Semaphore(EARLY_GETS)

        async def get(name: str) -> Held | None:
            async with gate:
                try:
                    raw = await client.request("GET", QUEUE_UNITS.path(namespace, name))
                except kube.KubeError as err:
                    if err.status == 404:  # gone since the visibility API numbered it
                        return None
                    raise denied(err, "get", QUEUE_UNITS, namespace) from None
                return hold(raw)

        got = await asyncio.gather(*(get(name) for name, _ in wanted))
        held = [(h, position) for h, (_, position) in zip(got, wanted, strict=True) if h is not None]
        built = early_build(namespace, held, known, limit, time.time())
        self._early[key] = (read_at, built)
        return built

    async def _full(self, namespace: str | None, limit: int) -> Built:
        try:
            if namespace is None:
                store, complete = await self.stores.get(None), True
            else:
                store, complete = await self.stores.widest(namespace)
        except kube.KubeError as err:
            raise denied(err, "list", QUEUE_UNITS, namespace) from None
        lock = self._locks.setdefault((namespace, limit), asyncio.Lock())
        async with lock:
            side = self._side.get(namespace)
            if side is None or side.got.complete != complete:
                side = await self._side_reads(namespace, store, complete)
            else:
                self._refresh(namespace, store, complete, side)
            stamp = (store.version, side.fingerprint)
            cached = self._built.get((namespace, limit))
            if cached is not None and cached[0] == stamp:
                return cached[1]
            units = {key: held.unit for key, held in store.units.items()}
            jobs = {key: held.job for key, held in store.units.items()}
            built = await asyncio.get_running_loop().run_in_executor(
                None, build, namespace, units, jobs, side.got, limit, time.time()
            )
            self._built[(namespace, limit)] = (stamp, built)
            self._warm.add(namespace)
            del units, jobs
            give_back()
            return built

    def _refresh(self, namespace: str | None, store: UnitStore, complete: bool, side: _Side) -> None:
        """Read the quotas, Queues, settings and positions again in the background when the units
        changed since they were read (or they are old); the next poll builds with them."""
        age = time.monotonic() - side.read_at
        due = (store.version != side.version and age >= SIDE_S) or age >= SIDE_MAX_S
        running = self._refreshing.get(namespace)
        if not due or (running is not None and not running.done()):
            return

        async def reread() -> None:
            with contextlib.suppress(CliError, kube.KubeError):  # the next poll tries again
                await self._side_reads(namespace, store, complete)

        self._refreshing[namespace] = asyncio.create_task(reread())

    async def _side_reads(self, namespace: str | None, store: UnitStore, complete: bool) -> _Side:
        now = time.monotonic()
        version = store.version
        got = Gathered()
        got.complete = complete
        if not complete:
            got.unknowns.append(
                "QueueUnits of other namespaces cannot be read (no cluster-wide list permission): "
                "usage counts only what you can see"
            )
        await self.reader.quotas(namespace, got)
        await self.reader.queues(got)
        await self.reader.settings(got)
        quotas_seen = {u.unit.quota for u in store.units.values() if u.unit.quota}
        await positions(self.reader, namespace, sorted(quotas_seen), got)
        if namespace is not None and not got.quotas_complete:
            await self.reader.standings(namespace, got)
        readable = {str((q.get("metadata") or {}).get("name", "")) for q in got.quotas}
        if namespace is not None and not complete:
            for quota in sorted(quotas_seen - readable):
                exists = await self.reader.queue_exists(namespace, quota, got)
                if exists is None:
                    got.unreadable_quotas.add(quota)
                    got.unknowns.append(
                        f"whether queue {quota} exists cannot be told (visibility API unavailable)"
                    )
                elif exists:
                    got.unreadable_quotas.add(quota)
                    got.unknowns.append(f"ElasticQuota {quota} exists but cannot be read (another namespace)")
        fingerprint = hashlib.sha256(
            orjson.dumps(
                [
                    got.quotas,
                    got.queues,
                    repr(got.settings),
                    sorted(got.positions.items()),
                    sorted(got.queue_missing),
                    sorted(got.unreadable_quotas),
                    got.unknowns,
                    repr(sorted(got.standings.items())),
                    got.visibility_ok,
                ],
                default=repr,
            )
        ).hexdigest()
        side = _Side(got, fingerprint, now, version)
        self._side[namespace] = side
        return side


#: Items asked for per page of the visibility API: its answer for 10,000 waiting units decoded at
#: once would be the largest thing the dashboard ever holds.
POSITIONS_PAGE: Final = 1000


async def positions(reader: Reader, namespace: str | None, queues: list[str], got: Gathered) -> None:
    """``Reader.positions``, the same paths, the same first ``visibility.MAX_LIMIT`` units and the
    same notes when the API is unavailable, read :data:`POSITIONS_PAGE` items at a time."""
    paths = (
        [f"{VISIBILITY}/namespaces/{quote(namespace, safe='')}/queueunits"]
        if namespace is not None
        else [f"{VISIBILITY}/queues/{quote(q, safe='')}/queueunits" for q in sorted(set(queues))]
    )
    for path in paths:
        offset = 0
        while offset < visibility.MAX_LIMIT:
            limit = min(POSITIONS_PAGE, visibility.MAX_LIMIT - offset)
            try:
                page = await reader.client.request("GET", path, query={"offset": offset, "limit": limit})
            except kube.KubeError as err:
                if got.positions_lost(err):
                    return
                break
            items = page.get("items") or []
            for item in items:
                if "position" in item:
                    meta = item.get("metadata") or {}
                    got.positions[f"{meta.get('namespace', '')}/{meta.get('name', '')}"] = int(
                        item["position"]
                    )
            if len(items) < limit:
                break
            offset += limit


def view_of(units: dict[str, Unit], got: Gathered) -> replay.View:
    """The replay's input, as ``explain``'s (``commands.view_from``), with the default running
    timeout: it changes no unit's "why", only the timeout ``explain`` prints."""
    settings = got.settings
    return commands.view_from(got, units, settings.running_timeouts.default if settings else None)


def replay_scope(units: dict[str, Unit], quotas: list[Quota], keys: list[str]) -> dict[str, Unit]:
    """The units whose replay decides the rows ``keys``: those of the quota trees the rows' units
    are in (a queue is admitted against its own tree only), or every unit when node pools link
    trees (docs/pools.md#fallback-between-pools). At 50,000 units over many teams this is what
    keeps one page's replay small; tests/unit/test_dashboard_queuepage.py checks the rows' why
    against ``explain`` over every unit."""
    if any(q.pool or q.pool_quotas for q in quotas) or any(u.pool or u.pools for u in units.values()):
        return units
    parent = {q.name: q.parent for q in quotas}

    def root(name: str) -> str:
        seen = {name}
        while parent.get(name) and parent[name] not in seen:
            name = parent[name]
            seen.add(name)
        return name

    roots = {root(units[key].quota or "") for key in keys if units[key].quota}
    wanted = set(keys)
    return {k: u for k, u in units.items() if k in wanted or (u.quota and root(u.quota) in roots)}


def build(
    namespace: str | None,
    units: dict[str, Unit],
    jobs: dict[str, str],
    got: Gathered,
    limit: int,
    now: float,
) -> Built:
    """The page: the first ``limit`` rows of each queue of ``namespace``, each with explain's why
    from one replay over every unit read (pure; run off the event loop)."""
    shown_units = units if namespace is None else {k: u for k, u in units.items() if u.namespace == namespace}
    groups = views.first_rows(shown_units, got.positions, limit)
    keys = [key for group in groups for key in group.keys]
    replayed = replay_scope(units, got.parsed_quotas(), keys)
    answers = explain.explain_many(view_of(replayed, got), keys, now) if keys else {}
    queues = []
    for group in groups:
        rows = []
        for key in group.keys:
            row = views.row(units[key], jobs.get(key, "-"), got.positions.get(key), now)
            row["why"] = answers[key].summary
            rows.append(row)
        queues.append(
            {
                "queue": group.queue,
                "waiting": group.waiting,
                "total": group.total,
                "units": rows,
            }
        )
    body = orjson.dumps(
        {
            "namespace": namespace,
            "positionsKnown": got.visibility_ok,
            "queues": queues,
            "count": len(shown_units),
            "limit": limit,
            "builtAt": round(now, 3),
        }
    )
    return Built(body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def early_rows(items: list[dict[str, Any]], per_queue: int) -> list[tuple[str, int]]:
    """``(name, position)`` of the first ``per_queue`` numbered units of each queue, from one page
    of the visibility API's namespaced answer (ordered by queue, then position)."""
    taken: dict[str, int] = {}
    wanted = []
    for item in items:
        position = item.get("position")
        name = str((item.get("metadata") or {}).get("name", ""))
        queue = str(item.get("queueName") or item.get("quotaName") or "")
        if not isinstance(position, int) or not name or taken.get(queue, 0) >= per_queue:
            continue
        taken[queue] = taken.get(queue, 0) + 1
        wanted.append((name, position))
    return wanted


def early_build(
    namespace: str, held: list[tuple[Held, int]], positions_known: bool, limit: int, now: float
) -> Built:
    """The early page (pure): the rows of ``held`` by queue in position order, each "why" being
    ``list``'s short reason (``whyFrom: "list"``) until the full page replaces it."""
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for one, position in sorted(held, key=lambda hp: (hp[0].unit.quota or "", hp[1])):
        row = views.row(one.unit, one.job, position, now)
        row["why"] = row["reason"]
        row["whyFrom"] = "list"
        by_queue.setdefault(one.unit.quota or "", []).append(row)
    queues = [
        {"queue": queue, "waiting": None, "total": None, "units": rows}
        for queue, rows in sorted(by_queue.items(), key=lambda kv: (kv[0] == "", kv[0]))
    ]
    body = orjson.dumps(
        {
            "namespace": namespace,
            "positionsKnown": positions_known,
            "queues": queues,
            "count": None,
            "limit": limit,
            "builtAt": round(now, 3),
            "loading": True,
        }
    )
    return Built(body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')

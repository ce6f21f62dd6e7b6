"""The queue page at scale (docs/dashboard.md#what-it-costs): one scheduler replay gives every row
``explain``'s own answer; the first rows of each queue are the ones ``list``'s order puts first; the
QueueUnits are listed once and then watched, relisted on 410 Gone; and a user refused the
cluster-wide list gets a store built from their own namespace's list and watch, never anything
broader, while any other failure is not taken for a refusal.

The API server is a fake here (what it answers to each path is written out); the real control
plane, the user's RBAC and the browser are tests/e2e/test_dashboard.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, cast

import orjson
import pytest

from koord_queue.cli.client import VISIBILITY, CliError, Gathered
from koord_queue.dashboard import cache, queuepage, views
from koord_queue.shared import kube
from koord_queue.shared.api.names import Message
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.core import explain
from tests.unit.test_explain import NOW, PREEMPT, queue, quota, unit, view


def busy_cluster() -> Any:
    """Units in every state explain knows: admitted, running, waiting for quota, blocked behind a
    parent, held, finished, unlabelled, labelled with a missing queue, being reclaimed."""
    units = [
        unit("holder", "q", priority=9, phase="Dequeued", admitted=1, running=1),
        unit("big", "q", priority=5, cpu="2"),
        unit("small", "q", priority=1),
        unit("held", "q", priority=3, active=False),
        unit("done", "q", phase="Succeeded"),
        unit("loose", None),
        unit("lost", "nowhere"),
        unit("c1-run", "c1", phase="Dequeued", admitted=1, running=1, ns="other"),
        unit("c2-wait", "c2", cpu="1", ns="other"),
        unit("low", "r", priority=1, phase="Dequeued", admitted=1, reclaim=1),
        unit("high", "r", priority=10, message=Message.limited("r", "cpu") + Message.PREEMPT_SUCCEED_SUFFIX),
    ]
    quotas = [
        quota("q", "2"),
        quota("p", "1", ns="other"),
        quota("c1", "1", parent="p", ns="other"),
        quota("c2", "4", parent="p", ns="other"),
        quota("r", "1"),
    ]
    queues = [queue("q"), queue("c1"), queue("c2"), queue("r", ann=PREEMPT)]
    return view(units, quotas, queues)


def test_one_replay_explains_every_unit_exactly_as_explain_does() -> None:
    v = busy_cluster()
    many = explain.explain_many(v, list(v.units), NOW)
    assert set(many) == set(v.units)
    for key in v.units:
        assert many[key] == explain.explain(v, key, NOW), key
    # the answers differ from one another: the test covers many reasons, not one
    assert len({e.reason for e in many.values()}) >= 7


def test_the_page_rows_carry_explains_why_and_lists_fields_in_list_order() -> None:
    v = busy_cluster()
    got = Gathered(complete=True)
    got.positions = {"ns/big": 1, "ns/small": 2, "ns/held": 3}
    built = queuepage.build("ns", dict(v.units), {k: f"job/{k.split('/')[1]}" for k in v.units}, got, 50, NOW)
    body = orjson.loads(built.body)
    shown = {row["name"]: row for group in body["queues"] for row in group["units"]}
    assert set(shown) == {u.name for u in v.units.values() if u.namespace == "ns"}
    # explain reads every namespace it can; the replay with the same objects gives the same why
    whole = queuepage.view_of(dict(v.units), got)
    for name, row in shown.items():
        assert row["why"] == explain.explain(whole, f"ns/{name}", NOW).summary, name
    q = next(g for g in body["queues"] if g["queue"] == "q")
    assert [r["name"] for r in q["units"]] == [r["name"] for r in views.queue_order(q["units"])[0].rows]
    assert [r["name"] for r in q["units"]][:3] == ["big", "small", "held"]
    assert q["total"] == 5 and body["count"] == 9
    assert q["waiting"] == sum(1 for r in q["units"] if r["waiting"])


def test_the_replay_of_a_page_is_its_quota_trees_unless_pools_link_them() -> None:
    v = busy_cluster()
    quotas = list(v.quotas)
    scope = queuepage.replay_scope(dict(v.units), quotas, ["ns/small"])
    assert set(scope) == {k for k, u in v.units.items() if u.quota == "q"}
    scope = queuepage.replay_scope(dict(v.units), quotas, ["other/c2-wait"])
    assert set(scope) == {"other/c1-run", "other/c2-wait"}  # the whole tree of p, c1 and c2
    pooled = [*quotas[:-1], dataclasses.replace(quotas[-1], pool_quotas=("c1",))]
    assert queuepage.replay_scope(dict(v.units), pooled, ["ns/small"]) == dict(v.units)


def test_only_the_first_rows_of_each_queue_are_built_and_the_etag_follows_the_bytes() -> None:
    units = {f"ns/u{i:03}": unit(f"u{i:03}", "q", priority=i % 7) for i in range(300)}
    got = Gathered(complete=True)
    first = queuepage.build("ns", units, {}, got, 20, NOW)
    body = orjson.loads(first.body)
    (group,) = body["queues"]
    assert len(group["units"]) == 20 and group["total"] == 300
    everything = [views.row(u, "-", None, NOW) for u in units.values()]
    expected = [r["name"] for r in views.queue_order(everything)[0].rows[:20]]
    assert [r["name"] for r in group["units"]] == expected
    again = queuepage.build("ns", units, {}, got, 20, NOW)
    assert again.etag == first.etag
    later = queuepage.build("ns", units, {}, got, 20, NOW + 1)
    assert later.etag != first.etag


def raw_unit(name: str, ns: str, rv: str, priority: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "uid": f"u-{name}"},
        "spec": {
            "priority": priority,
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
        },
        "status": {},
    }


class FakeApiServer:
    """Answers lists and watches from a script; refuses the cluster-wide path with RBAC's 403
    (or ``cluster_error``) unless ``cluster_ok``; records every path asked."""

    def __init__(self, *, cluster_ok: bool = False, cluster_error: int = 403) -> None:
        self.cluster_ok = cluster_ok
        self.cluster_error = cluster_error
        self.asked: list[str] = []
        self.watched: list[tuple[str | None, str]] = []
        self.items: dict[str | None, list[dict[str, Any]]] = {}
        self.events: asyncio.Queue[tuple[str, dict[str, Any]] | Exception] = asyncio.Queue()
        self.list_version = 10

    async def request(self, method: str, path: str, *, query: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.asked.append(path)
        namespace = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None
        if namespace is None and not self.cluster_ok:
            if self.cluster_error == 403:
                raise kube.KubeError(
                    403,
                    "Forbidden",
                    'queueunits.scheduling.x-k8s.io is forbidden: User "alice" cannot list resource '
                    '"queueunits" in API group "scheduling.x-k8s.io" at the cluster scope',
                )
            raise kube.KubeError(self.cluster_error, "InternalError", "etcd is away")
        items = self.items.get(namespace, [])
        start = int(query.get("continue") or 0)
        page = items[start : start + query["limit"]]
        meta: dict[str, Any] = {"resourceVersion": str(self.list_version)}
        if start + query["limit"] < len(items):
            meta["continue"] = str(start + query["limit"])
        return {"items": page, "metadata": meta}

    async def watch(
        self, res: kube.Resource, *, resource_version: str, namespace: str | None = None, **_: Any
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched.append((namespace, resource_version))
        while True:
            event = await self.events.get()
            if isinstance(event, Exception):
                raise event
            yield event


async def until(check: Any, what: str) -> None:
    """Poll ``check`` with a deadline (the watch runs as a task of this loop)."""
    deadline = asyncio.get_running_loop().time() + 5
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def test_a_store_lists_in_pages_then_follows_the_watch_and_relists_on_gone() -> None:
    api = FakeApiServer()
    api.items["team-a"] = [raw_unit(f"u{i}", "team-a", str(i)) for i in range(1203)]
    store = cache.UnitStore(cast(kube.Kube, api), "team-a")
    await store.load()
    assert len(store.units) == 1203 and api.asked.count(api.asked[0]) == 3  # 500 + 500 + 203
    assert store.units["team-a/u7"].job == "job/u7"
    store.start()
    try:
        version = store.version
        await api.events.put(("MODIFIED", raw_unit("u7", "team-a", "11", priority=4)))
        await api.events.put(("DELETED", raw_unit("u8", "team-a", "12")))
        await api.events.put(("ADDED", raw_unit("new", "team-a", "13")))
        await until(lambda: "team-a/new" in store.units, "the added unit")
        assert store.units["team-a/u7"].unit.priority == 4 and "team-a/u8" not in store.units
        assert store.version == version + 3 and store.resource_version == "13"
        assert api.watched == [("team-a", "10")]
        api.items["team-a"] = [raw_unit("only", "team-a", "20")]
        api.list_version = 20
        await api.events.put(kube.Gone(410, "Expired", "too old resource version"))
        await until(lambda: set(store.units) == {"team-a/only"}, "the relist after 410 Gone")
        await until(lambda: ("team-a", "20") in api.watched, "the watch from the new list")
    finally:
        await store.stop()


async def test_a_namespace_user_refused_the_cluster_list_gets_her_namespace_and_nothing_broader() -> None:
    api = FakeApiServer()
    api.items["team-a"] = [raw_unit("mine", "team-a", "1")]
    api.items["team-b"] = [raw_unit("theirs", "team-b", "1")]
    stores = cache.Stores(cast(kube.Kube, api))
    try:
        store, complete = await stores.widest("team-a")
        assert not complete and store.namespace == "team-a" and set(store.units) == {"team-a/mine"}
        assert all("/namespaces/team-b/" not in p for p in api.asked)
        await until(lambda: api.watched == [("team-a", "10")], "her own watch")
        # the refusal is remembered: the next poll does not ask the cluster-wide list again
        asked = len(api.asked)
        again, _ = await stores.widest("team-a")
        assert again is store and len(api.asked) == asked
        # a cluster-wide page is refused outright, not served from any namespace's store
        with pytest.raises(kube.KubeError) as refused:
            await stores.get(None)
        assert refused.value.status == 403
    finally:
        await stores.close()


async def test_an_api_server_failure_on_the_cluster_list_is_not_taken_for_a_refusal() -> None:
    api = FakeApiServer(cluster_error=500)
    api.items["team-a"] = [raw_unit("mine", "team-a", "1")]
    stores = cache.Stores(cast(kube.Kube, api))
    try:
        with pytest.raises(kube.KubeError) as failed:
            await stores.widest("team-a")
        assert failed.value.status == 500
    finally:
        await stores.close()


async def test_an_admin_page_reads_every_namespace_from_one_store() -> None:
    api = FakeApiServer(cluster_ok=True)
    api.items[None] = [raw_unit("a", "team-a", "1"), raw_unit("b", "team-b", "1")]
    stores = cache.Stores(cast(kube.Kube, api))
    try:
        store, complete = await stores.widest("team-a")
        assert complete and store.namespace is None and len(store.units) == 2
        assert (await stores.get(None)) is store
    finally:
        await stores.close()


async def test_a_refused_watch_lists_the_same_namespace_again_and_nothing_broader() -> None:
    api = FakeApiServer(cluster_ok=True)  # even a cluster-wide list would be allowed: never asked
    api.items["team-a"] = [raw_unit("mine", "team-a", "1")]
    store = cache.UnitStore(cast(kube.Kube, api), "team-a")
    await store.load()
    store.start()
    try:
        await until(lambda: len(api.watched) == 1, "the first watch")
        refusal = kube.KubeError(403, "Forbidden", 'User "alice" cannot watch resource "queueunits"')
        await api.events.put(refusal)
        await until(lambda: len(api.watched) == 2, "the watch after the relist")
        assert store.error is None or store.error is refusal
        assert all("/namespaces/team-a/" in path for path in api.asked), api.asked
        assert [ns for ns, _ in api.watched] == ["team-a", "team-a"]
    finally:
        await store.stop()


class PagedVisibility:
    """The visibility API's namespaced path for ``waiting`` units, served by offset and limit."""

    def __init__(self, waiting: int, *, status: int = 200) -> None:
        self.waiting, self.status = waiting, status
        self.asked: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, *, query: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.asked.append(dict(query))
        if self.status != 200:
            raise kube.KubeError(self.status, "ServiceUnavailable", "the visibility server is away")
        first, last = query["offset"], min(self.waiting, query["offset"] + query["limit"])
        return {
            "items": [
                {"metadata": {"namespace": "team-a", "name": f"u{i}"}, "position": i + 1}
                for i in range(first, last)
            ]
        }


class PagedReader:
    def __init__(self, client: PagedVisibility) -> None:
        self.client = client


async def test_positions_are_read_a_page_at_a_time_up_to_what_list_reads() -> None:
    api = PagedVisibility(12_345)
    got = Gathered()
    await queuepage.positions(cast(Any, PagedReader(api)), "team-a", [], got)
    # the same first 10,000 units the plugin's list and explain read, never 10,000 at once
    assert len(got.positions) == 10_000 and got.positions["team-a/u9999"] == 10_000
    assert max(q["limit"] for q in api.asked) == queuepage.POSITIONS_PAGE
    small = PagedVisibility(1_500)
    got = Gathered()
    await queuepage.positions(cast(Any, PagedReader(small)), "team-a", [], got)
    assert len(got.positions) == 1_500 and len(small.asked) == 2
    away = PagedVisibility(10, status=503)
    got = Gathered()
    await queuepage.positions(cast(Any, PagedReader(away)), "team-a", [], got)
    assert not got.visibility_ok and got.unknowns == [
        "positions unknown: the visibility API answered 503 (the visibility server is away)"
    ]


def test_a_kept_unit_equals_the_parsed_one_and_repeated_values_are_one_copy() -> None:
    sharing = cache.Sharing()
    first = raw_unit("a", "team-a", "1", priority=3)
    second = raw_unit("b", "team-a", "2", priority=3)
    second["spec"]["consumerRef"]["name"] = "a-job"
    for raw in (first, second):
        raw["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": "q"}
        raw["status"] = {"phase": "Enqueued", "message": "limited quotaName:q, limited resKey:cpu,"}
    kept = [cache.hold(raw, sharing) for raw in (first, second)]
    assert [k.unit for k in kept] == [
        dataclasses.replace(parse_unit(r), **cache.UNREAD) for r in (first, second)
    ]
    assert kept[0].unit.labels is kept[1].unit.labels and kept[0].unit.message is kept[1].unit.message
    assert kept[1].job == "job/a-job"
    other = raw_unit("c", "team-a", "3")
    other["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": "r"}
    assert cache.hold(other, sharing).unit.labels == {"quota.scheduling.koordinator.sh/name": "r"}


class EarlyApiServer:
    """The reads of the early page (docs/dashboard.md#the-first-page): a one-item list (refused
    with 403 when ``refuse``), the visibility API's namespaced page, one GET per unit."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.asked: list[str] = []
        self.units = {f"u{i}": raw_unit(f"u{i}", "team-a", str(i), priority=i % 3) for i in range(80)}
        for raw in self.units.values():
            raw["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": "q"}
        self.units["u5"]["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": "p"}

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.asked.append(path)
        if self.refuse:
            raise kube.KubeError(403, "Forbidden", 'User "mallory" cannot list resource "queueunits"')
        if path.startswith(VISIBILITY):
            assert path.endswith("/namespaces/team-a/queueunits") and kw["query"]["limit"] <= 1000
            ordered = ["u5", *[f"u{i}" for i in range(80) if i != 5][::-1]]  # by queue, then position
            return {
                "items": [
                    {
                        "metadata": {"namespace": "team-a", "name": name},
                        "queueName": "p" if name == "u5" else "q",
                        "position": 1 if name == "u5" else n,
                    }
                    for n, name in enumerate(ordered)
                ]
            }
        name = path.rsplit("/", 1)[1]
        if name == "queueunits":
            return {"items": [], "metadata": {}}
        if name == "u40":  # deleted after the visibility API numbered it
            raise kube.KubeError(404, "NotFound", 'queueunits "u40" not found')
        return self.units[name]


class SlowPages(queuepage.QueuePages):
    """The full page held back until ``release`` is set: the 50,000-unit list, in miniature."""

    def __init__(self, reader: Any) -> None:
        super().__init__(reader)
        self.release = asyncio.Event()
        self.full = queuepage.Built(b'{"queues": [], "loading": false}', '"full"')

    async def _full(self, namespace: str | None, limit: int) -> queuepage.Built:
        await self.release.wait()
        self._warm.add(namespace)
        return self.full


async def test_the_first_page_answers_from_the_visibility_api_before_every_unit_is_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queuepage, "EARLY_EVERY_S", 60.0)  # no background read during this test
    api = EarlyApiServer()
    pages = SlowPages(PagedReader(cast(Any, api)))
    try:
        early = await pages.answer("team-a", 50)
        body = orjson.loads(early.body)
        assert body["loading"] is True and body["positionsKnown"] is True
        assert [g["queue"] for g in body["queues"]] == ["p", "q"]
        p_rows, q_rows = (g["units"] for g in body["queues"])
        assert [r["name"] for r in p_rows] == ["u5"] and p_rows[0]["position"] == 1
        # the first 50 of queue q in position order, u40 (gone) left out, each why list's reason
        names = [r["name"] for r in q_rows]
        assert len(names) == 49 and "u40" not in names and names[0] == "u79" and names[-1] == "u30"
        assert [r["position"] for r in q_rows] == sorted(r["position"] for r in q_rows)
        assert all(r["whyFrom"] == "list" and r["why"] == r["reason"] for r in q_rows)
        # every read was the namespace's own, as the user: nothing cluster-wide, nothing else
        assert all("/namespaces/team-a/" in p for p in api.asked)
        # a poll within a second is the same answer without reading again
        asked = len(api.asked)
        assert (await pages.answer("team-a", 50)) is early and len(api.asked) == asked
        pages.release.set()
        assert (await pages.answer("team-a", 50)) is pages.full
        assert (await pages.answer("team-a", 50)) is pages.full
    finally:
        pages.release.set()
        await pages.close()


async def test_the_early_page_of_a_namespace_the_user_may_not_list_is_refused() -> None:
    api = EarlyApiServer(refuse=True)
    pages = SlowPages(PagedReader(cast(Any, api)))
    try:
        with pytest.raises(CliError) as refused:
            await pages.answer("team-a", 50)
        assert "mallory" in str(refused.value) or "forbidden" in str(refused.value).lower()
        assert not any(p.startswith(VISIBILITY) for p in api.asked)
    finally:
        pages.release.set()
        await pages.close()


async def test_once_the_list_is_long_the_early_page_answers_without_waiting_and_is_kept_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/dashboard.md#the-first-page: a list of more than one page cannot give the full page
    # within EARLY_WAIT_S, so no request waits for it; the early page is read again in the
    # background while pages ask, so a poll finds it fresh, and not once the full page is ready
    monkeypatch.setattr(queuepage, "EARLY_WAIT_S", 30.0)
    monkeypatch.setattr(queuepage, "EARLY_EVERY_S", 0.01)
    api = EarlyApiServer()
    pages = SlowPages(PagedReader(cast(Any, api)))
    pages.stores.long.set()
    try:
        early = await asyncio.wait_for(pages.answer("team-a", 50), 10)
        assert orjson.loads(early.body)["loading"] is True
        reads = api.asked.count(f"{VISIBILITY}/namespaces/team-a/queueunits")
        await until(
            lambda: api.asked.count(f"{VISIBILITY}/namespaces/team-a/queueunits") > reads + 1,
            "the early page read again in the background",
        )
        pages.release.set()
        deadline = asyncio.get_running_loop().time() + 5
        while (await pages.answer("team-a", 50)) is not pages.full:  # the next poll, at the latest
            assert asyncio.get_running_loop().time() < deadline, "the full page after its release"
            await asyncio.sleep(0.01)
        keeper = pages._keepers[("team-a", 50)]
        await until(keeper.done, "the keeper to stop once the full page is ready")
    finally:
        pages.release.set()
        await pages.close()


async def test_a_list_steps_aside_while_a_page_waits_for_its_first_answer() -> None:
    api = FakeApiServer()
    api.items["team-a"] = [raw_unit(f"u{i}", "team-a", str(i)) for i in range(1203)]
    stores = cache.Stores(cast(kube.Kube, api))
    try:
        with stores.gate.held():
            loading = asyncio.create_task(stores.get("team-a"))
            for _ in range(50):  # the fake answers at once: the list would be done by now
                await asyncio.sleep(0)
            assert not loading.done() and api.asked == []
        store = await asyncio.wait_for(loading, 10)
        assert len(store.units) == 1203
    finally:
        await stores.close()


class HeldBackPages(FakeApiServer):
    """A list whose pages after the first wait for ``more``."""

    def __init__(self) -> None:
        super().__init__(cluster_ok=True)
        self.more = asyncio.Event()

    async def request(self, method: str, path: str, *, query: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if query.get("continue"):
            await self.more.wait()
        return await super().request(method, path, query=query, **kw)


async def test_a_long_first_list_is_known_while_it_runs_and_a_loaded_store_is_not_long() -> None:
    # docs/dashboard.md#the-first-page: only a first list of more than one page under way lets a
    # page skip waiting for its full page; once listed, a namespace's page waits for it again
    api = HeldBackPages()
    api.items[None] = [raw_unit(f"u{i}", "team-a", str(i)) for i in range(1203)]
    stores = cache.Stores(cast(kube.Kube, api))
    try:
        loading = asyncio.create_task(stores.get(None))
        await until(stores.long.is_set, "the first page of a longer list")
        api.more.set()
        await asyncio.wait_for(loading, 10)
        assert not stores.long.is_set()
        small = FakeApiServer()
        small.items["team-b"] = [raw_unit("only", "team-b", "1")]
        short = cache.Stores(cast(kube.Kube, small))
        await short.get("team-b")
        assert not short.long.is_set()
        await short.close()
    finally:
        api.more.set()
        await stores.close()


class ExpiringContinue(FakeApiServer):
    """A list whose first continue token has expired (410), as after etcd compacted the list's
    snapshot while a long list was read."""

    def __init__(self) -> None:
        super().__init__()
        self.expired = False

    async def request(self, method: str, path: str, *, query: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if query.get("continue") and not self.expired:
            self.expired = True
            self.asked.append(path)
            raise kube.Gone(410, "Expired", "The provided continue parameter is too old")
        return await super().request(method, path, query=query, **kw)


async def test_a_list_whose_continue_token_expired_starts_over_and_keeps_what_it_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []
    hold = cache.hold

    def counting(raw: dict[str, Any], sharing: cache.Sharing | None = None) -> views.Held:
        parsed.append(raw["metadata"]["name"])
        return hold(raw, sharing)

    monkeypatch.setattr(cache, "hold", counting)
    api = ExpiringContinue()
    api.items["team-a"] = [raw_unit(f"u{i}", "team-a", str(i)) for i in range(1203)]
    store = cache.UnitStore(cast(kube.Kube, api), "team-a")
    await store.load()
    assert len(store.units) == 1203 and api.expired
    assert len(parsed) == 1203  # the first page's 500 were not parsed twice
    assert len(api.asked) == 5  # 500, the expired continue, then 500 + 500 + 203 from the start

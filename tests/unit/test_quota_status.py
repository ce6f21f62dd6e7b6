"""The figures each ElasticQuota shows (docs/compatibility.md#quota-guarantees, "Published
figures") and the reconciler's writer of them, without a cluster.

``shared.core.quotastatus.published`` is checked against the scheduler's own cache: the guarantee
model's runtime and request where it computes them, request (usage plus the subtree's waiting
demand, capped at ``max``) and runtime = request elsewhere, borrowed = used - min. ``changes`` is
what differs from a quota object as watched. :class:`QuotaStatusSync` runs against a small fake
API: one write per quota per interval, none while the quota shows its figures, the main resource
when there is no status subresource, errors logged and retried. Last, the wiring: with
``publishQuotaStatus: false`` no publisher exists. The real apiserver runs the same paths in
tests/integration/test_quota_status.py.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest

from koord_queue.reconciler import main
from koord_queue.reconciler.quotas import QuotaStatusSync
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core import quotastatus
from koord_queue.shared.core.config import Settings
from koord_queue.shared.core.quotastatus import Figures
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_guarantees import eq, jobs, settle, tree
from tests.unit.test_model import queue, quota, unit
from tests.unit.test_scheduling import World

RUNTIME, REQUEST, BORROWED = (
    names.QUOTA_RUNTIME_ANNOTATION,
    names.QUOTA_REQUEST_ANNOTATION,
    names.QUOTA_BORROWED_ANNOTATION,
)


def cpu(n: float) -> dict[str, int]:
    return {"cpu": int(n * 1000)}


# --- the figures -----------------------------------------------------------------------------------


def test_a_top_level_quota_publishes_request_as_runtime_capped_at_max() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q"),))
    w.add(*(unit(f"u{i}").quota("q").cpu("1") for i in range(3)), unit("big").quota("q").cpu("3"))
    settle(w)
    fig = quotastatus.published(w.cache.ledger, w.cache.state)["q"]
    # 3 used, 3 waiting: the request is capped at max 4; nobody lends here, runtime = request.
    assert fig == Figures(used=cpu(3), runtime=cpu(4), request=cpu(4), borrowed={})
    assert fig.annotations() == {RUNTIME: '{"cpu":"4"}', REQUEST: '{"cpu":"4"}', BORROWED: None}


def test_an_idle_quota_shows_zero_for_the_resources_it_names() -> None:
    w = World(quota("q", cpu="4", memory="8Gi"), queues=(queue("q"),))
    fig = quotastatus.published(w.cache.ledger, w.cache.state)["q"]
    zero = {"cpu": 0, "memory": 0}
    assert fig == Figures(used=zero, runtime=zero, request=zero, borrowed={})
    assert quotastatus.render(fig.used) == '{"cpu":"0","memory":"0"}'


def test_a_borrowing_child_publishes_the_guarantee_models_figures_and_what_it_borrows() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "a", 10)
    jobs(w, "a", 2, start=10)  # beyond the parent: they wait
    settle(w)
    figures = quotastatus.published(w.cache.ledger, w.cache.state)
    a, b, p = figures["a"], figures["b"], figures["p"]
    assert (a.used, a.borrowed) == (cpu(10), cpu(5))
    # Exactly what the scheduler decided with this cycle.
    assert a.runtime == w.cache.state.runtime["a"] == cpu(10)
    assert a.request == w.cache.state.requests["a"] == cpu(10)  # 12 asked, capped at max 10
    assert (b.used, b.runtime, b.request, b.borrowed) == (cpu(0), cpu(0), cpu(0), {})
    # The parent is top-level: the subtree's usage plus its waiting demand, capped at its max.
    assert (p.used, p.request, p.runtime, p.borrowed) == (cpu(10), cpu(10), cpu(10), {})
    assert a.annotations()[BORROWED] == '{"cpu":"5"}'


def test_below_a_parent_whose_children_cannot_borrow_runtime_is_the_request() -> None:
    w = tree(eq("a", min_cpu="5", max_cpu="5"), eq("b", min_cpu="5", max_cpu="5"))
    jobs(w, "a", 7)
    settle(w)
    assert "a" not in w.cache.state.runtime  # no runtime computed there at all
    a = quotastatus.published(w.cache.ledger, w.cache.state)["a"]
    assert (a.used, a.request, a.runtime, a.borrowed) == (cpu(5), cpu(5), cpu(5), {})


def test_with_guarantees_off_every_runtime_is_the_request() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"), guarantees_on=False)
    jobs(w, "a", 12)
    settle(w)
    a = quotastatus.published(w.cache.ledger, w.cache.state)["a"]
    assert (a.used, a.request, a.runtime, a.borrowed) == (cpu(10), cpu(10), cpu(10), cpu(5))


def test_borrowed_counts_resources_named_by_min_or_max_only() -> None:
    q = eq("q", min_cpu="2", max_cpu="8")
    assert quotastatus.borrowed(q, {"cpu": 3000, "gpu": 1000}) == {"cpu": 1000}
    assert quotastatus.borrowed(q, {"cpu": 2000}) == {}


# --- what differs from the quota as watched --------------------------------------------------------


def showing(fig: Figures | None = None, annotations: dict[str, str] | None = None) -> kube.Obj:
    obj: kube.Obj = {"metadata": {"name": "q", "namespace": "ns", "annotations": dict(annotations or {})}}
    if fig is not None:
        obj["metadata"]["annotations"].update({k: v for k, v in fig.annotations().items() if v is not None})
        obj["status"] = {"used": {r: str(v // 1000) for r, v in fig.used.items()}}
    return obj


FIG = Figures(used=cpu(3), runtime=cpu(4), request=cpu(5), borrowed=cpu(1))


def test_a_quota_showing_its_figures_needs_no_write_even_written_another_way() -> None:
    assert quotastatus.changes(showing(FIG), FIG).empty
    # koord-scheduler's spelling of the same quantities.
    other = showing(
        annotations={RUNTIME: '{"cpu": "4000m"}', REQUEST: '{"cpu":"5"}', BORROWED: '{"cpu":"1000m"}'}
    )
    other["status"] = {"used": {"cpu": "3000m"}}
    assert quotastatus.changes(other, FIG).empty


def test_what_differs_is_patched_and_what_went_away_is_removed() -> None:
    stale = showing(
        annotations={RUNTIME: '{"cpu":"1"}', REQUEST: "not json", names.QUOTA_NAMESPACES_ANNOTATION: "[]"}
    )
    stale["status"] = {"used": {"cpu": "9", "memory": "1Gi"}}
    writes = quotastatus.changes(stale, FIG)
    assert writes.annotations == {
        "metadata": {"annotations": {RUNTIME: '{"cpu":"4"}', REQUEST: '{"cpu":"5"}', BORROWED: '{"cpu":"1"}'}}
    }
    # A merge patch keeps map entries it does not name: the resource no longer used is nulled.
    assert writes.status == {"status": {"used": {"cpu": "3", "memory": None}}}

    nothing_borrowed = Figures(used=cpu(3), runtime=cpu(4), request=cpu(5), borrowed={})
    writes = quotastatus.changes(showing(FIG), nothing_borrowed)
    assert writes.annotations == {"metadata": {"annotations": {BORROWED: None}}} and writes.status is None


# --- the writer --------------------------------------------------------------------------------------


class FakeAPI:
    """ElasticQuotas by namespace/name, with or without the status subresource; records writes."""

    def __init__(self, *, status_subresource: bool = True) -> None:
        self.objects: dict[str, kube.Obj] = {}
        self.status_subresource = status_subresource
        self.writes: list[tuple[str, str, Any]] = []
        self.fail: list[kube.KubeError] = []
        self.version = 10

    def put(self, obj: kube.Obj) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        meta = obj["metadata"]
        self.objects[f"{meta['namespace']}/{meta['name']}"] = obj

    async def patch(
        self,
        res: kube.Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str = "",
    ) -> kube.Obj:
        key = f"{namespace}/{name}"
        if self.fail:
            raise self.fail.pop(0)
        if subresource == "status" and not self.status_subresource:
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        if key not in self.objects:
            raise kube.NotFound(404, "NotFound", f"{name} not found")
        self.writes.append((key, subresource, copy.deepcopy(patch)))
        obj = copy.deepcopy(self.objects[key])
        if subresource == "status" or not self.status_subresource:
            merge(obj.setdefault("status", {}), patch.get("status", {}))
        merge(obj["metadata"], (patch.get("metadata") or {}))
        self.put(obj)
        return copy.deepcopy(obj)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            merge(target.setdefault(k, {}), v)
        else:
            target[k] = v


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def quota_obj(name: str, *, cpu_max: str = "4") -> kube.Obj:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "default", "annotations": {}},
        "spec": {"min": {"cpu": cpu_max}, "max": {"cpu": cpu_max}},
    }


def world(api: FakeAPI) -> tuple[QuotaStatusSync, Cache, Clock]:
    cache = Cache()
    for name in ("q", "r"):
        api.put(quota_obj(name))
        cache.put_quota(quota(name, cpu="4"))
        cache.put_queue(queue(name).build())
    clock = Clock()
    sync = QuotaStatusSync(
        api,  # type: ignore[arg-type]
        cache=lambda: cache,
        quotas=lambda: api.objects,
        interval_seconds=5.0,
        clock=clock,
    )
    return sync, cache, clock


def admit(cache: Cache, name: str, quota_name: str) -> None:
    cache.put_unit(unit(name).quota(quota_name).cpu("1").build())
    for decision in cache.schedule(1000.0).admits:
        cache.assume(decision, now=1000.0)


def shown(api: FakeAPI, key: str) -> tuple[dict[str, Any], dict[str, str]]:
    obj = api.objects[key]
    return obj.get("status", {}).get("used", {}), obj["metadata"].get("annotations", {})


async def test_the_writer_publishes_once_then_only_what_changes_at_most_once_per_interval() -> None:
    api = FakeAPI()
    sync, cache, clock = world(api)
    admit(cache, "a", "q")

    assert await sync.sync() == 2  # both quotas: their first figures
    used, annotations = shown(api, "default/q")
    assert used == {"cpu": "1"}
    assert json.loads(annotations[RUNTIME]) == {"cpu": "1"} and BORROWED not in annotations
    assert [(k, sub) for k, sub, _ in api.writes] == [
        ("default/q", "status"),
        ("default/q", ""),
        ("default/r", "status"),
        ("default/r", ""),
    ]
    # The quotas show their figures: nothing to write, however often it looks.
    api.writes.clear()
    clock.now += 60
    assert await sync.sync() == 0 and api.writes == []

    # Usage changes twice within the interval: one write now, the next only once it has passed.
    admit(cache, "b", "q")
    assert await sync.sync() == 1
    admit(cache, "c", "q")
    clock.now += 1
    assert await sync.sync() == 0
    assert shown(api, "default/q")[0] == {"cpu": "2"}
    clock.now += 4
    assert await sync.sync() == 1
    assert shown(api, "default/q")[0] == {"cpu": "3"}
    assert all(k == "default/q" for k, _, _ in api.writes)


async def test_a_write_the_watch_has_not_shown_yet_is_not_repeated() -> None:
    api = FakeAPI()
    sync, _, clock = world(api)
    stale = copy.deepcopy(api.objects)  # what the informer still holds
    sync.quotas = lambda: stale
    assert await sync.sync() == 2
    clock.now += 60
    assert await sync.sync() == 0  # the stored objects are older than the ones our writes returned


async def test_without_a_status_subresource_the_status_is_merged_into_the_quota() -> None:
    api = FakeAPI(status_subresource=False)
    sync, cache, clock = world(api)
    admit(cache, "a", "q")
    assert await sync.sync() == 2
    assert sync.status_subresource is False
    assert shown(api, "default/q")[0] == {"cpu": "1"}
    api.writes.clear()
    admit(cache, "b", "q")
    clock.now += 5
    assert await sync.sync() == 1
    # Known now: one patch of the main resource carries status and annotations together.
    ((key, sub, patch),) = api.writes
    assert (key, sub) == ("default/q", "") and patch["status"]["used"] == {"cpu": "2"}
    assert set(patch["metadata"]["annotations"]) == {RUNTIME, REQUEST}


async def test_write_errors_are_logged_and_retried_and_conflicts_retried_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeAPI()
    sync, _, clock = world(api)
    api.fail = [kube.KubeError(500, "InternalError", "etcd is away")]
    with caplog.at_level(logging.WARNING):
        assert await sync.sync() == 1  # r is written; q failed
    assert "figures not published" in caplog.text and "etcd is away" in caplog.text
    clock.now += 1
    assert await sync.sync() == 0  # not before the interval
    clock.now += 4
    assert await sync.sync() == 1
    assert shown(api, "default/q")[1][RUNTIME] == '{"cpu":"0"}'

    api2 = FakeAPI()
    sync2, _, _ = world(api2)
    api2.fail = [kube.Conflict(409, "Conflict", "modified")] * 2
    assert await sync2.sync() == 2  # each conflict sent again at once

    api3 = FakeAPI()
    sync3, _, _ = world(api3)
    api3.fail = [kube.Conflict(409, "Conflict", "modified")] * 3
    assert await sync3.sync() == 1  # q conflicted three times: given up for this pass
    assert await sync3.sync() == 1  # ...and tried again by the next, without waiting for the interval
    assert shown(api3, "default/q")[1][RUNTIME] == '{"cpu":"0"}'


async def test_nothing_is_published_before_the_scheduler_has_run_a_cycle() -> None:
    api = FakeAPI()
    sync, _, _ = world(api)
    cycles = 0
    sync.ready = lambda: cycles > 0
    assert await sync.sync() == 0 and api.writes == []
    cycles = 1
    assert await sync.sync() == 2


async def test_a_deleted_quota_is_skipped_quietly() -> None:
    api = FakeAPI()
    sync, _, _ = world(api)
    store = dict(api.objects)
    sync.quotas = lambda: store
    del api.objects["default/q"]  # gone from the API, still in the informer's store
    assert await sync.sync() == 1


# --- the wiring -------------------------------------------------------------------------------------


def test_the_publisher_exists_only_with_the_switch_on() -> None:
    """``reconciler/main.py`` starts it (in ``act``, the leader's part) only when this returns one,
    and hands it the quota events only then: with ``publishQuotaStatus: false`` nothing is
    written at all."""
    cache = Cache()

    def build(settings: Settings) -> QuotaStatusSync | None:
        return main.quota_status_sync(
            settings,
            None,  # type: ignore[arg-type]
            cache=lambda: cache,
            quotas=dict,
        )

    assert build(Settings(publish_quota_status=False)) is None
    on = build(Settings())
    assert isinstance(on, QuotaStatusSync) and on.interval_seconds == 5.0

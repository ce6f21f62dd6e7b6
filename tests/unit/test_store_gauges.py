"""``koord_queue_store_objects``: the store and map sizes the soak benchmark watches for leaks.

The collector measures every container of the components it is given, so these tests check what a
leak hunt relies on: the informer stores are named by resource, the scheduler's per-unit state is
found down to each queue's own maps (summed over queues), aliases and shared objects are counted
once or not at all, and after the units are deleted the per-unit maps are back to their idle sizes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from koord_queue.reconciler import metrics
from koord_queue.reconciler.informer import Informer, PackedStore
from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core.config import Settings

NOW = "2024-05-01T10:00:00Z"
JOBS = kube.Resource("batch", "v1", "jobs", "Job")
QUOTA: kube.Obj = {
    "apiVersion": names.QUOTA_API_VERSION,
    "kind": "ElasticQuota",
    "metadata": {"name": "q", "namespace": "ns", "uid": "eq-1", "creationTimestamp": NOW},
    "spec": {"max": {"cpu": "2", "memory": "1Ti"}},
}
QUEUE: kube.Obj = {
    "apiVersion": names.API_VERSION,
    "kind": "Queue",
    "metadata": {"name": "q", "namespace": names.COMPONENT_NAMESPACE, "uid": "q-1"},
    "spec": {},
}


def unit(name: str, rv: int = 1) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "creationTimestamp": NOW,
            "labels": {names.QUOTA_NAME_LABEL: "q"},
        },
        "spec": {
            "queue": "q",
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
            "podSet": [{"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}],
        },
    }


class FakeEvents:
    def record(self, obj: kube.Obj, **kwargs: Any) -> None:
        pass


class Part:
    """A component with the shapes the collector has to tell apart."""

    def __init__(self, shared: object) -> None:
        self.by_job: dict[str, int] = {"a": 1, "b": 2}
        self.alias = self.by_job  # the same map under a second name: counted once
        self.lanes: tuple[list[int], list[int]] = ([1, 2, 3], [4])
        self.backlog: asyncio.Queue[int] = asyncio.Queue()
        self.backlog.put_nowait(1)
        self.shared = shared  # a skipped object: never entered
        self.name = "not a container"
        self.children = {"x": Child(), "y": Child()}


class Child:
    def __init__(self) -> None:
        self.pending: set[str] = {"p"}


class Shared:
    def __init__(self) -> None:
        self.huge = list(range(1000))


def informer(objects: dict[str, kube.Obj]) -> Informer:
    inf = Informer(None, JOBS, handler=lambda old, new: None, packed=True)  # type: ignore[arg-type]
    for key, obj in objects.items():
        inf.objects[key] = obj
    return inf


def test_every_container_is_measured_once_under_its_path() -> None:
    shared = Shared()
    jobs = informer({"ns/a": {"metadata": {"name": "a"}}, "ns/b": {"metadata": {"name": "b"}}})
    parts = {"part": Part(shared), "gone": None}
    sizes = metrics.StoreSizes([jobs], parts, skip=[shared], packages=("tests.",)).sizes()
    assert sizes["informer:jobs.batch"] == 2
    assert sizes["part.by_job"] == 2
    assert "part.alias" not in sizes
    assert sizes["part.lanes"] == 2 and sizes["part.lanes[*]"] == 4
    assert sizes["part.backlog"] == 1
    assert sizes["part.children"] == 2 and sizes["part.children[*].pending"] == 2
    assert not any(k.startswith("part.shared") for k in sizes)
    assert "part.name" not in sizes
    assert not any(k.startswith("gone") for k in sizes)
    assert "asyncio:tasks" not in sizes  # no running loop here


async def test_the_event_loop_is_measured_when_scraped_on_it() -> None:
    handle = asyncio.get_running_loop().call_later(60, lambda: None)
    try:
        sizes = metrics.StoreSizes([], {}).sizes()
    finally:
        handle.cancel()
    assert sizes["asyncio:tasks"] >= 1 and sizes["asyncio:timers"] >= 1


def test_the_scheduler_state_of_deleted_units_is_gone() -> None:
    loop = SchedulerLoop(None, events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    store: dict[str, kube.Obj] = {}
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    collector = metrics.StoreSizes([], {"scheduler": loop})
    # warm: the per-quota memory (members, chains, dependents) exists once a unit was seen
    store["ns/warm"] = unit("warm")
    loop.on_unit(None, store["ns/warm"])
    loop.on_unit(store.pop("ns/warm"), None)
    idle = collector.sizes()
    for i in range(5):
        store[f"ns/u{i}"] = unit(f"u{i}")
        loop.on_unit(None, store[f"ns/u{i}"])
    busy = collector.sizes()
    assert busy["scheduler.cache.snapshot.units"] == 5
    assert busy["scheduler.cache.state.queues[*].entries"] == 5
    assert busy["scheduler.cache.state.members"] == 1
    for i in range(5):
        loop.on_unit(store.pop(f"ns/u{i}"), None)
    after = collector.sizes()
    grown = {k: (idle.get(k), v) for k, v in after.items() if v > idle.get(k, 0)}
    assert grown == {}


def test_the_gauge_is_served_and_replaced_on_a_second_registration() -> None:
    registry = CollectorRegistry(auto_describe=True)
    collector = metrics.StoreSizes([informer({"ns/a": {}})], {"m": {"k": 1}})
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'koord_queue_store_objects{store="informer:jobs.batch"} 1.0' in text
    assert 'koord_queue_store_objects{store="m"} 1.0' in text
    first = metrics.watch_stores([], {"a": {}})
    second = metrics.watch_stores([], {"b": {}})  # a second run in one process: no duplicate
    assert first is not second
    served = generate_latest(metrics.REGISTRY).decode()
    assert 'store="b"' in served and 'store="a"' not in served


def test_packed_store_reads_are_not_needed_to_measure_it() -> None:
    store = PackedStore()
    store["ns/a"] = {"metadata": {"name": "a"}}
    sizes = metrics.StoreSizes([], {"s": store}).sizes()
    assert sizes["s"] == 1


class EventClient:
    async def create(self, res: Any, body: kube.Obj, *, namespace: str) -> kube.Obj:
        return body


async def test_the_event_memory_of_objects_gone_for_a_window_is_dropped(monkeypatch: Any) -> None:
    """The leak the soak found: one ``EventRecorder._seen`` entry per evented job, kept until the
    map held 50,000. Entries past the window fold nothing any more and go as time passes."""
    from koord_queue.reconciler import events as events_module

    clock = [1000.0]
    monkeypatch.setattr(events_module.time, "monotonic", lambda: clock[0])
    recorder = events_module.EventRecorder(EventClient(), window_s=100.0)  # type: ignore[arg-type]
    gauge = metrics.StoreSizes([], {"events": recorder})
    for i in range(30):
        clock[0] += 5.0  # one job's event every 5 s: 150 s in all
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": f"j{i}", "namespace": "ns", "uid": f"u{i}"}
        await recorder._write(ref, "Normal", "Dequeued", "admitted")
    # a sweep every window / 10: what is left is at most a window and a sweep interval old
    assert gauge.sizes()["events._seen"] <= (100 + 10) / 5 + 1

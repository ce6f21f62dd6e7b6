"""The informer loop with a fake client: a job kind whose CRD is not installed does not keep the
reconciler from getting ready, and a relist replaces the store (deletions seen while away)."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.reconciler.informer import Informer, PackedStore
from koord_queue.shared import kube

RES = kube.Resource("example.io", "v1", "things", "Thing")


class FakeClient:
    def __init__(self, lists: list[Any]) -> None:
        self.lists = lists

    async def list(self, res: kube.Resource, **_: Any) -> tuple[list[kube.Obj], str]:
        result = self.lists.pop(0) if self.lists else ([], "9")
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[no-any-return]

    async def watch(self, res: kube.Resource, **_: Any) -> AsyncIterator[tuple[str, kube.Obj]]:
        if self.lists:
            raise kube.Gone(410, "Expired", "too old")
        await asyncio.sleep(3600)
        yield "BOOKMARK", {}


def thing(name: str) -> kube.Obj:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "managedFields": [{}]}}


async def test_a_missing_optional_kind_counts_as_synced_and_empty() -> None:
    client = FakeClient([kube.NotFound(404, "NotFound", "the server could not find the requested resource")])
    informer = Informer(client, RES, handler=lambda old, new: None, optional=True)  # type: ignore[arg-type]
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), timeout=5)
    assert informer.objects == {}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("packed", [False, True])
async def test_a_relist_after_410_reports_objects_deleted_meanwhile_and_slims_objects(packed: bool) -> None:
    events: list[tuple[str | None, str | None]] = []

    def handler(old: kube.Obj | None, new: kube.Obj | None) -> None:
        events.append(
            ((old or {}).get("metadata", {}).get("name"), (new or {}).get("metadata", {}).get("name"))
        )

    client = FakeClient([([thing("a"), thing("b")], "5"), ([thing("b")], "7")])
    informer = Informer(client, RES, handler=handler, packed=packed)  # type: ignore[arg-type]
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        if informer.relists >= 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert informer.relists == 2
    assert set(informer.objects) == {"ns/b"}
    assert ("a", None) in events
    assert "managedFields" not in informer.objects["ns/b"]["metadata"]


def test_a_packed_store_holds_bytes_and_hands_out_copies() -> None:
    store = PackedStore()
    obj = thing("a")
    store["ns/a"] = obj
    obj["metadata"]["name"] = "changed"  # the caller's dict is not the stored one
    first, second = store["ns/a"], store.get("ns/a")
    assert first == second and first is not second
    assert first["metadata"]["name"] == "a"
    assert "ns/a" in store and list(store) == ["ns/a"] and len(store) == 1
    assert store.get("ns/none") is None and store.get("ns/none", {}) == {}
    assert all(isinstance(v, bytes) for v in store._packed.values())

    del store["ns/a"]
    assert len(store) == 0 and store.pop("ns/a", None) is None


def test_a_packed_object_costs_its_json_size_not_orjsons_buffer() -> None:
    store = PackedStore()
    obj = {"metadata": {"name": "x" * 900}}
    tracemalloc.start()
    try:
        for i in range(200):
            store[f"ns/{i}"] = obj
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held / 200 < 2 * 1024, held / 200

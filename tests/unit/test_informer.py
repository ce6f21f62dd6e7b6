"""The informer loop with a fake client: a job kind whose CRD is not installed does not keep the
reconciler from getting ready, a relist replaces the store (deletions seen while away), and failed lists
and watches wait as long as they always did."""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.reconciler.informer import Informer, PackedStore
from koord_queue.shared import kube, retrying

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


# --- back-off (docs/architecture.md#retries) -------------------------------------------------------


class Enough(Exception):
    """Ends a run: raised by the fake sleep once the waits under test were taken."""


class ScriptedClient:
    """Lists and watches follow a script: each step is an exception to raise or, for a watch, the
    events to deliver before the watch ends with the next step's error."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls: list[str] = []

    def _next(self) -> Any:
        return self.script.pop(0) if self.script else Enough()

    async def list(self, res: kube.Resource, **_: Any) -> tuple[list[kube.Obj], str]:
        self.calls.append("list")
        step = self._next()
        if isinstance(step, BaseException):
            raise step
        return [], "1"

    async def watch(self, res: kube.Resource, **_: Any) -> AsyncIterator[tuple[str, kube.Obj]]:
        self.calls.append("watch")
        step = self._next()
        if isinstance(step, list):
            for event in step:
                yield event
            step = self._next()
        if isinstance(step, BaseException):
            raise step


def run_until_done(
    script: list[Any], monkeypatch: pytest.MonkeyPatch, *, optional: bool = False
) -> tuple[list[float], ScriptedClient, Informer]:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retrying, "sleep", record)
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the top of each jitter range
    client = ScriptedClient(script)
    informer = Informer(client, RES, handler=lambda old, new: None, optional=optional)  # type: ignore[arg-type]
    with pytest.raises(Enough):
        asyncio.run(informer.run())
    return waits, client, informer


TRANSPORT = kube.KubeError(0, "ClientConnectorError", "connection refused")


def test_list_failures_back_off_exponentially_up_to_10s_and_an_event_starts_over(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    event = ("MODIFIED", thing("a"))
    script: list[Any] = [TRANSPORT] * 7 + [None, [event], TRANSPORT, [], TRANSPORT]
    waits, client, _ = run_until_done(script, monkeypatch)
    # seven failed lists, then list ok, a watch with an event fails, a watch without one fails
    assert waits == pytest.approx([0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 0.4, 0.8])
    assert client.calls[:8] == ["list"] * 8 and client.calls[8:] == ["watch"] * 3
    assert "things list/watch failed (0 ClientConnectorError: connection refused); retrying in 0.4s" in (
        caplog.text
    )


def test_a_410_relists_at_once_and_a_403_relists_after_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = kube.Gone(410, "Expired", "too old")
    forbidden = kube.KubeError(403, "Forbidden", "no")
    waits, client, informer = run_until_done([None, gone, None, forbidden, None, TRANSPORT], monkeypatch)
    assert waits == pytest.approx([0.4, 0.8])  # a 410 costs no wait; the 403 is a failure like any
    assert client.calls == ["list", "watch", "list", "watch", "list", "watch", "watch"]
    assert informer.relists == 3


def test_a_missing_kind_is_listed_again_every_2s_or_every_30s_if_optional(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = kube.NotFound(404, "NotFound", "the server could not find the requested resource")
    waits, client, informer = run_until_done([missing, missing, TRANSPORT], monkeypatch)
    assert waits == pytest.approx([2.0, 2.0, 0.4]) and not informer.synced.is_set()
    waits, client, informer = run_until_done([missing, missing], monkeypatch, optional=True)
    assert waits == pytest.approx([30.0, 30.0]) and informer.synced.is_set()
    assert client.calls == ["list", "list", "list"]

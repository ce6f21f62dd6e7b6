"""The event recorder: references only, folding of repeats, per-object order, bounded queues, and
nothing recorded while the replica does not lead."""

from __future__ import annotations

import asyncio
from typing import Any

from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared import kube


class FakeClient:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    async def create(self, res: Any, body: dict[str, Any], *, namespace: str) -> dict[str, Any]:
        await asyncio.sleep(0)  # a round trip: lets other writers interleave
        self.created.append(body)
        return body

    async def patch(self, res: Any, name: str, *, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((name, patch))
        return {}


def unit(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "QueueUnit",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "managedFields": [{"big": "x" * 1000}]},
        "spec": {"podSet": []},
    }


async def run_until_drained(recorder: EventRecorder) -> None:
    task = asyncio.create_task(recorder.run())
    await recorder.drain(timeout=5)
    task.cancel()


def test_events_carry_a_reference_and_keep_their_order_per_object() -> None:
    async def go() -> FakeClient:
        client = FakeClient()
        recorder = EventRecorder(client, writers=3)  # type: ignore[arg-type]
        for i in range(20):
            obj = unit(f"u{i}", f"uid-{i}")
            recorder.record(obj, type_="Warning", reason="Preempted", message="m")
            recorder.record(obj, type_="Normal", reason="Reclaimed", message="m")
            obj.clear()  # the caller's object may change or go away: the queue holds a reference
        await run_until_drained(recorder)
        return client

    client = asyncio.run(go())
    assert len(client.created) == 40
    by_object: dict[str, list[str]] = {}
    for event in client.created:
        ref = event["involvedObject"]
        assert set(ref) == {"apiVersion", "kind", "name", "namespace", "uid"}
        by_object.setdefault(ref["uid"], []).append(event["reason"])
    assert all(reasons == ["Preempted", "Reclaimed"] for reasons in by_object.values())


def test_repeats_are_folded_into_one_event() -> None:
    async def go() -> FakeClient:
        client = FakeClient()
        recorder = EventRecorder(client)  # type: ignore[arg-type]
        for _ in range(5):
            recorder.record(unit("a", "uid-a"), type_="Warning", reason="FailedScheduling", message="same")
        await run_until_drained(recorder)
        return client

    client = asyncio.run(go())
    assert len(client.created) == 1 and client.patched == []


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    async def go() -> tuple[EventRecorder, FakeClient]:
        client = FakeClient()
        recorder = EventRecorder(client, max_queue=4, writers=1)  # type: ignore[arg-type]
        for i in range(10):
            recorder.record(unit(f"u{i}", f"uid-{i}"), type_="Normal", reason="Scheduled", message="m")
        await run_until_drained(recorder)
        return recorder, client

    recorder, client = asyncio.run(go())
    assert recorder.dropped == 6 and len(client.created) == 4


def test_a_follower_drops_events_instead_of_replaying_them_when_it_takes_over() -> None:
    """The leader records what a watch event calls for; a follower seeing the same event must not
    queue it, or it would be written a second time, stale, on take-over."""

    async def go() -> tuple[EventRecorder, FakeClient]:
        client = FakeClient()
        gate = kube.Leadership(leading=False)
        recorder = EventRecorder(client, leadership=gate)  # type: ignore[arg-type]
        recorder.record(unit("seen", "uid-1"), type_="Normal", reason="Reclaimed", message="m")
        gate.acquire()
        recorder.record(unit("now", "uid-2"), type_="Normal", reason="Scheduled", message="m")
        await run_until_drained(recorder)
        return recorder, client

    recorder, client = asyncio.run(go())
    assert [e["involvedObject"]["name"] for e in client.created] == ["now"]
    assert recorder.not_leading == 1 and recorder.dropped == 0

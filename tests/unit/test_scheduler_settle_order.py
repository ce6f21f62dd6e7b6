"""Two writes of one unit in flight at once must not let a lagging watch erase an admission.

Found by the chaos run (RELIABILITY.md, the ``chaos-c`` overrun after a kube-apiserver restart): a
cycle parks a unit (quota full), a release follows at once and the next cycle admits the same unit
while its park write is still on its way. Both writes are conditional on the same resourceVersion:
the admission lands, the park gets a 409 and is dropped. When the dropped park settled after the
admission, it fed the cache the informer store's version of the unit, which (the watch lagging behind
etcd after the restart) was the version before the admission: the admitted unit no longer held its
quota in the cache, and the next cycle admitted another unit into it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core.config import Settings

NOW = "2024-05-01T10:00:00Z"
CONTAINER: kube.Obj = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}


def unit(name: str, rv: int, status: kube.Obj | None = None, *, priority: int = 0) -> kube.Obj:
    obj: kube.Obj = {
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
            "priority": priority,
            "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": name},
            "podSet": [{"name": "main", "count": 1, "template": {"spec": {"containers": [CONTAINER]}}}],
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def admitted(name: str, rv: int) -> kube.Obj:
    return unit(
        name,
        rv,
        {
            "phase": "Dequeued",
            "message": names.Message.DEQUEUED,
            "admissions": [{"name": "main", "replicas": 1}],
        },
    )


QUOTA: kube.Obj = {
    "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
    "kind": "ElasticQuota",
    "metadata": {"name": "q", "namespace": "ns", "uid": "eq-1", "creationTimestamp": NOW},
    "spec": {"max": {"cpu": "1", "memory": "1Ti"}},
}
QUEUE: kube.Obj = {
    "apiVersion": names.API_VERSION,
    "kind": "Queue",
    "metadata": {"name": "q", "namespace": names.COMPONENT_NAMESPACE, "uid": "q-1"},
    "spec": {},
}


class ScriptedClient:
    """An apiserver with one QueueUnit table: status patches are conditional on resourceVersion,
    and each patch of a unit waits for its gate (so the test orders the answers)."""

    def __init__(self, units: dict[str, kube.Obj]) -> None:
        self.etcd = dict(units)
        self.rv = 100
        self.gates: dict[str, list[asyncio.Event]] = {}
        self.patches: list[tuple[str, str]] = []

    def gate(self, name: str) -> asyncio.Event:
        event = asyncio.Event()
        self.gates.setdefault(name, []).append(event)
        return event

    async def patch(self, res: kube.Resource, name: str, body: Any, **kwargs: Any) -> kube.Obj:
        gates = self.gates.get(name)
        if gates:
            await gates.pop(0).wait()
        current = self.etcd[name]
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            self.patches.append((name, "409"))
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        self.rv += 1
        new = {**current, "metadata": {**current["metadata"], "resourceVersion": str(self.rv)}}
        new["status"] = {**(current.get("status") or {}), **body["status"]}
        self.etcd[name] = new
        self.patches.append((name, new["status"].get("phase", "")))
        return new

    async def get(self, res: kube.Resource, name: str, **kwargs: Any) -> kube.Obj:
        return self.etcd[name]


class FakeEvents:
    def record(self, obj: kube.Obj, **kwargs: Any) -> None:
        pass


def held(loop: SchedulerLoop) -> int:
    return loop.cache.ledger.used("q").get("cpu", 0)


async def settle(loop: SchedulerLoop) -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_dropped_park_settling_after_the_admission_does_not_erase_it() -> None:
    holder = admitted("holder", 10)
    x = unit("x", 11)
    client = ScriptedClient({"holder": holder, "x": x})
    store: dict[str, kube.Obj] = {"ns/holder": holder, "ns/x": x}  # the informer store
    loop = SchedulerLoop(client, events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    loop.on_unit(None, holder)
    loop.on_unit(None, x)

    park_gate = client.gate("x")  # x's park write is slow to answer
    loop.cycle()  # the quota is full: x is parked, its message on its way
    await settle(loop)
    assert "ns/x" in loop.writes.writing and client.patches == []

    # The holder finishes (the watch delivers it): the next cycle admits x, park still in flight.
    done = unit("holder", 12, {"phase": "Succeed", "message": "Succeeded"})
    client.etcd["holder"] = done
    store["ns/holder"] = done
    loop.on_unit(holder, done)
    loop.cycle()
    await settle(loop)
    assert client.patches == [("x", "Dequeued")]  # the admission landed (etcd: x holds 1 cpu)
    assert held(loop) == 1000

    park_gate.set()  # the park gets its 409 and is dropped; the watch has not caught up (store: rv 11)
    await settle(loop)
    assert client.patches[-1] == ("x", "409")
    assert held(loop) == 1000, "the cache forgot an admission that is in etcd"

    # A new unit arrives, sorting ahead of x: there is no room for it.
    y = unit("y", client.rv + 1, priority=10)
    client.etcd["y"] = y
    store["ns/y"] = y
    loop.on_unit(None, y)
    loop.cycle()
    await settle(loop)
    dequeued = [k for k, v in client.etcd.items() if (v.get("status") or {}).get("phase") == "Dequeued"]
    assert dequeued == ["x"], f"quota q (max 1 cpu) overrun: {dequeued} admitted"


class LateReplyClient(ScriptedClient):
    """Like ScriptedClient, but a write of a unit with a reply gate is applied at once and only
    answered when the gate opens (etcd committed it; the response is still on its way)."""

    def __init__(self, units: dict[str, kube.Obj]) -> None:
        super().__init__(units)
        self.replies: dict[str, asyncio.Event] = {}

    async def patch(self, res: kube.Resource, name: str, body: Any, **kwargs: Any) -> kube.Obj:
        reply = self.replies.pop(name, None)
        written = await super().patch(res, name, body, **kwargs)
        if reply is not None:
            await reply.wait()
        return written


async def test_a_dropped_park_settling_before_the_admission_answers_does_not_erase_it() -> None:
    """The same race with the answers the other way round: the admission is committed but its
    answer is late, and the park's 409 settles first. Nothing may be decided from the dropped
    park while the admission is still on its way."""
    holder = admitted("holder", 10)
    x = unit("x", 11)
    client = LateReplyClient({"holder": holder, "x": x})
    store: dict[str, kube.Obj] = {"ns/holder": holder, "ns/x": x}
    loop = SchedulerLoop(client, events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    loop.on_unit(None, holder)
    loop.on_unit(None, x)

    park_gate = client.gate("x")
    loop.cycle()
    await settle(loop)

    done = unit("holder", 12, {"phase": "Succeed", "message": "Succeeded"})
    client.etcd["holder"] = done
    store["ns/holder"] = done
    loop.on_unit(holder, done)
    admission_reply = asyncio.Event()
    client.replies["x"] = admission_reply
    # The park's gate is first in line for "x": hand the admission a gate of its own, open.
    client.gates["x"].append(asyncio.Event())
    client.gates["x"][-1].set()
    loop.cycle()
    await settle(loop)
    assert client.etcd["x"]["status"]["phase"] == "Dequeued"  # committed, not yet answered
    assert held(loop) == 1000

    park_gate.set()  # the park: 409, dropped, while the admission's answer is still out
    await settle(loop)
    assert ("x", "409") in client.patches
    assert held(loop) == 1000, "a dropped park erased an admission whose answer was on its way"

    admission_reply.set()
    await settle(loop)
    assert held(loop) == 1000 and "ns/x" not in loop.writes.writing

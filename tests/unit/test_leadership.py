"""Leadership gates every side effect (docs/architecture.md#decision-12-leadership-and-high-availability).

A follower keeps its caches warm and writes nothing: the client refuses writes while the gate is
closed (sending and counting nothing), the event recorder drops instead of queueing, the scheduler
queues no status note and no requeue, the job extensions mark no job. When the gate opens, each
worker starts from a full pass over its warm cache, and nothing seen while following is replayed.
The two-process version of this runs in tests/e2e/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube, kubeconfig
from koord_queue.shared.api import names
from koord_queue.shared.core.config import Settings
from koord_queue.shared.jobs import jobext, registry

NOW = "2024-05-01T10:00:00Z"


class FakeClient:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    async def create(self, res: kube.Resource, obj: kube.Obj, **kwargs: Any) -> kube.Obj:
        self.writes.append(("create", res.plural, obj))
        return obj

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        self.writes.append(("patch", name, patch))
        return {"metadata": {"name": name, "namespace": kwargs.get("namespace"), "resourceVersion": "9"}}


async def test_the_client_refuses_writes_while_not_leading_and_sends_nothing() -> None:
    gate = kube.Leadership(leading=False)
    # Nothing listens on the discard port: a request that is really sent fails with status 0.
    client = kube.Kube(
        kubeconfig.Settings(host="http://127.0.0.1:9"), qps=0, burst=1, user_agent="test", leadership=gate
    )
    try:
        unit = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
        writes = [
            client.create(kube.EVENTS, {"metadata": {"name": "e"}}, namespace="ns"),
            client.patch(unit, "u", {"status": {}}, namespace="ns", subresource="status"),
            client.replace(kube.SECRETS, "s", {}, namespace="ns"),
            client.delete(kube.PODS, "p", namespace="ns"),
        ]
        for write in writes:
            with pytest.raises(kube.NotLeading):
                await write
        assert client.requests == {}  # not even counted: nothing was sent

        with pytest.raises(kube.KubeError) as read_error:
            await client.get(kube.PODS, "p", namespace="ns")
        assert not isinstance(read_error.value, kube.NotLeading)  # reads go out while following
        assert client.requests == {"GET": 1}

        gate.acquire()
        with pytest.raises(kube.KubeError) as write_error:
            await client.delete(kube.PODS, "p", namespace="ns")
        assert not isinstance(write_error.value, kube.NotLeading)
        assert client.requests == {"GET": 1, "DELETE": 1}
    finally:
        await client.close()


def test_a_process_without_leader_election_always_leads() -> None:
    assert kube.Leadership().leading
    assert EventRecorder(FakeClient()).leadership.leading  # type: ignore[arg-type]


def queue_unit(
    name: str, *, labels: dict[str, str] | None = None, status: kube.Obj | None = None
) -> kube.Obj:
    unit: kube.Obj = {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "5",
            "creationTimestamp": NOW,
            "labels": labels or {},
        },
        "spec": {
            "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": name},
            "resource": {"cpu": "1"},
            "podSet": [{"name": "main", "count": 1, "template": {"spec": {"containers": []}}}],
        },
    }
    if status is not None:
        unit["status"] = status
    return unit


async def test_a_follower_scheduler_queues_no_note_event_or_requeue_and_takes_them_up_on_take_over() -> None:
    gate = kube.Leadership(leading=False)
    client = FakeClient()
    events = EventRecorder(client, leadership=gate)  # type: ignore[arg-type]
    loop = SchedulerLoop(client, events=events, settings=Settings(), leadership=gate)  # type: ignore[arg-type]
    unlabelled = queue_unit("unlabelled")
    backing_off = queue_unit(
        "backing-off",
        labels={names.QUOTA_NAME_LABEL: "q"},
        status={"phase": names.Phase.TIMEOUT_BACKOFF.value, "lastUpdateTime": NOW},
    )
    broken_queue = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "broken", "namespace": names.COMPONENT_NAMESPACE, "uid": "q-1"},
        "spec": {"queuePolicy": "NoSuchPolicy"},
    }
    for _ in range(3):  # repeated watch events (relists, status churn) must not pile anything up
        loop.on_unit(None, unlabelled)
        loop.on_unit(None, backing_off)
    loop.on_queue(None, broken_queue)
    await asyncio.sleep(0)
    assert set(loop.cache.units) == {"ns/unlabelled", "ns/backing-off"}  # the cache stays warm
    assert client.writes == [] and loop._tasks == set()
    assert loop._backoff == []
    assert events.not_leading == 1  # the AddQueueFail the leader gives; never queued here

    gate.acquire()
    loop._take_over()
    await asyncio.gather(*loop._tasks)
    assert [(verb, name) for verb, name, _ in client.writes] == [("patch", "unlabelled")]
    assert client.writes[0][2]["status"] == {"message": names.Message.NO_QUOTA_LABEL}
    assert [key for _, key in loop._backoff] == ["ns/backing-off"]
    writer = asyncio.create_task(events.run())
    await events.drain(timeout=1)
    writer.cancel()
    assert [w for w in client.writes if w[0] == "create"] == []  # nothing replayed from following


def batch_job(name: str, uid: str) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
        },
        "spec": {"parallelism": 1, "suspend": True, "template": {"spec": {"containers": [container]}}},
    }


async def test_follower_job_extensions_mark_nothing_and_look_at_everything_on_take_over() -> None:
    gate = kube.Leadership(leading=False)
    job = batch_job("first", "u-1")
    orphan = jobext.build_queue_unit(batch_job("gone", "u-0"), registry.by_extension("job"), {})
    orphan["metadata"]["ownerReferences"] = []
    units = {"ns/gone": orphan}
    jobs = JobExtensions(
        FakeClient(),  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: units,
        priority_classes=dict,
        events=EventRecorder(FakeClient(), leadership=gate),  # type: ignore[arg-type]
        leadership=gate,
    )
    informer = jobs.job_informers[("batch/v1", "Job")]
    informer.objects["ns/first"] = job
    informer.handler(None, job)
    jobs.on_unit(None, orphan)
    pod = {
        "metadata": {
            "name": "first-x",
            "namespace": "ns",
            "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: "ns/first"},
        }
    }
    jobs.pods.handler(None, pod)
    assert jobs._dirty == {} and jobs._urgent == {}
    assert jobs._pods_by_unit == {"ns/first": {"ns/first-x"}}  # the index stays warm

    gate.acquire()
    jobs._take_over()
    assert set(jobs._dirty) | set(jobs._urgent) == {
        JobKey("batch/v1", "Job", "ns", "first"),
        JobKey("batch/v1", "Job", "ns", "gone"),  # a unit whose job is gone is found only this way
    }

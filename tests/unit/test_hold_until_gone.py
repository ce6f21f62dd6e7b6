"""Quota taken back from a held job is freed only once none of its pods runs
(``reconciler.job_lifecycle.hold_then_release``; docs/compatibility.md#activation-and-execution-budget)."""

from __future__ import annotations

from typing import Any

from koord_queue.reconciler import job_lifecycle
from koord_queue.reconciler.job_units import JobKey
from koord_queue.shared import kube
from koord_queue.shared.jobs import podplan, registry


class Client:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any, str]] = []

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        self.patches.append((res.plural, patch, kwargs.get("subresource", "")))
        return {"metadata": {"resourceVersion": "2"}}


def pod(*, bound: bool, deleting: bool) -> podplan.PodView:
    return podplan.PodView("ns", "p", "uid-p", "main", "t", bound, not bound, False, deleting)


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"}, "spec": {}}
UNIT = {"metadata": {"name": "j", "resourceVersion": "1"}}
PARKED = {"status": {"phase": "Enqueued", "admissions": []}}


async def hold(client: Client, pods: list[podplan.PodView], job: kube.Obj = JOB) -> kube.Obj | None:
    adapter = registry.by_kind("batch/v1", "Job")
    assert adapter is not None
    return await job_lifecycle.hold_then_release(
        client,  # type: ignore[arg-type]
        JobKey("batch/v1", "Job", "ns", "j"),
        adapter,
        job,
        UNIT,
        "j",
        PARKED,
        pods_of=lambda: pods,
    )


async def test_a_terminating_pod_keeps_the_quota_charged_until_it_is_gone() -> None:
    client = Client()
    assert await hold(client, [pod(bound=True, deleting=True)]) is None
    assert [(res, sub) for res, _, sub in client.patches] == [("jobs", "")]  # held, quota kept
    held = {**JOB, "spec": {"suspend": True}}
    client.patches.clear()
    assert await hold(client, [pod(bound=True, deleting=True)], held) is None
    assert client.patches == []  # still waiting, nothing written again
    assert await hold(client, [], held) is not None
    assert [(res, sub) for res, _, sub in client.patches] == [("queueunits", "status")]


async def test_a_gated_or_unbound_deleted_pod_does_not_hold_the_quota() -> None:
    client = Client()
    held = {**JOB, "spec": {"suspend": True}}
    assert await hold(client, [pod(bound=False, deleting=False), pod(bound=False, deleting=True)], held)
    assert [(res, sub) for res, _, sub in client.patches] == [("queueunits", "status")]

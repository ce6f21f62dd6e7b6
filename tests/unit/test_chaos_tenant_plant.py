"""The hostile tenant's plants in her own namespace (``chaos/tenant_plant.py``,
docs/operations.md#install-namespace): her copy of the quota-binding parameters is a faithful
forgery (what the reconciler would write had the quota been bound to her), and each try is judged
by what the system did with it: RBAC's refusal is refused, a Queue left as she wrote it is
neutralised, a Queue the reconciler took up or a Job admitted under the borrowed quota is a breach."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from chaos import load
from chaos import tenant_plant as plant
from chaos.tenant_common import NAMESPACE, Sent
from koord_queue.shared import kube
from koord_queue.shared.api import names


def test_the_planted_bindings_bind_the_load_quota_to_her_namespace_and_enforce_nothing() -> None:
    data = plant.planted_bindings(plant.VICTIM_QUOTA, NAMESPACE)["data"]
    assert data[f"q.{plant.VICTIM_QUOTA}"] == f" {load.NAMESPACE} {NAMESPACE} "
    assert plant.VICTIM_QUOTA in data[f"ns.{NAMESPACE}"]
    assert data["enforce"] == "false"
    assert plant.planted_bindings(plant.VICTIM_QUOTA, NAMESPACE)["metadata"]["name"] == (
        names.QUOTA_BINDINGS_CONFIGMAP
    )


def test_her_queue_is_stopped_and_admits_nothing() -> None:
    queue = plant.planted_queue(plant.VICTIM_QUOTA)
    assert queue["metadata"]["annotations"] == {names.STOPPED_ANNOTATION: "true"}
    assert queue["spec"]["queuePolicy"] == "Block"


def test_a_queue_is_untouched_only_at_her_version_and_without_status() -> None:
    written = {"metadata": {"resourceVersion": "7"}}
    assert plant.untouched(written, {"metadata": {"resourceVersion": "7"}})
    assert plant.untouched(written, {"metadata": {"resourceVersion": "7"}, "status": {}})
    assert not plant.untouched(written, {"metadata": {"resourceVersion": "8"}})
    assert not plant.untouched(written, {"metadata": {"resourceVersion": "7"}, "status": {"pending": 1}})


class FakeKube:
    """The admin's reads: the stored Queue and her Job's unit; deletes are noted."""

    def __init__(self, queue: kube.Obj, unit: kube.Obj) -> None:
        self.queue, self.unit = queue, unit
        self.deleted: list[str] = []

    async def get(self, res: kube.Resource, name: str, **_: Any) -> kube.Obj:
        return self.queue

    async def delete(self, res: kube.Resource, name: str, **_: Any) -> None:
        self.deleted.append(f"{res.plural}/{name}")

    async def create(self, res: kube.Resource, body: kube.Obj, **_: Any) -> kube.Obj:
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "7"}}


class FakeAttacker:
    def __init__(
        self, answers: dict[str, str], *, queue: kube.Obj | None = None, unit: kube.Obj | None = None
    ):
        self.admin = FakeKube(queue or {"metadata": {"resourceVersion": "7"}}, unit or {})
        self.mallory = FakeKube({}, {})
        self.answers = answers
        self.records: list[tuple[str, str]] = []

    def record(
        self, attack: str, r: int, target: str, outcome: str, detail: str, seconds: float | None = None
    ) -> None:
        self.records.append((attack, outcome))

    async def send(self, call: Callable[[], Awaitable[kube.Obj]], *, rbac_allows: bool = True) -> Sent:
        obj = await call()
        kind = str(obj.get("kind"))
        status = self.answers.get(kind, "accepted")
        return Sent(status, obj if status == "accepted" else {}, message=f"{kind}: {status}")

    async def _read(self, call: Callable[[], Awaitable[Any]]) -> Any:
        return await call()

    async def _own_unit(self, name: str) -> kube.Obj:
        return self.admin.unit


def run(t: FakeAttacker, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(plant, "WATCH_S", 0.2)
    asyncio.run(plant.plant_attacks(t, 0))  # type: ignore[arg-type]
    return dict(t.records)


def test_refused_by_rbac_and_by_the_policy_are_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    t = FakeAttacker({"Queue": "refused", "Job": "refused"})
    assert run(t, monkeypatch) == {plant.QUEUE: "refused", plant.BINDINGS: "refused"}
    # Her ConfigMap is taken away again.
    assert f"configmaps/{names.QUOTA_BINDINGS_CONFIGMAP}" in t.admin.deleted


def test_accepted_but_ignored_is_neutralised(monkeypatch: pytest.MonkeyPatch) -> None:
    waiting = {"status": {"phase": "Enqueued", "message": "quota chaos-a is not bound"}}
    t = FakeAttacker({}, unit=waiting)
    assert run(t, monkeypatch) == {plant.QUEUE: "neutralised", plant.BINDINGS: "neutralised"}
    assert f"queues/{plant.VICTIM_QUOTA}" in t.admin.deleted


def test_a_queue_taken_up_or_a_job_admitted_is_a_breach(monkeypatch: pytest.MonkeyPatch) -> None:
    published = {"metadata": {"resourceVersion": "9"}, "status": {"queueUnits": ["x"]}}
    admitted = {"status": {"phase": "Dequeued", "admissions": [{"name": "main", "replicas": 1}]}}
    t = FakeAttacker({}, queue=published, unit=admitted)
    assert run(t, monkeypatch) == {plant.QUEUE: "SUCCEEDED", plant.BINDINGS: "SUCCEEDED"}


def test_the_attacks_are_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(plant.ATTACKS) <= set(ATTACKS)

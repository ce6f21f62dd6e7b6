"""Work that must be done before anything else makes sense is retried at a steady pace until it is:
the certificate pass (every 10 s, or the interval if shorter), the Workload hand-off ConfigMap (every
2 s) and the quota binding ConfigMap (every second), each failure logged (docs/architecture.md#retries)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from koord_queue.certs.manager import WebhookCertManager
from koord_queue.reconciler import workloads
from koord_queue.reconciler.quotas import QuotaBindingSync
from koord_queue.shared import kube
from tests.unit import retry_waits
from tests.unit.retry_waits import Enough

AWAY = kube.KubeError(503, "ServiceUnavailable", "etcd is away")


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return retry_waits.record(monkeypatch)


def failing(times: int, then: BaseException | None = None) -> Any:
    calls = 0

    async def call(*_: Any, **__: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= times:
            raise AWAY
        if then is not None:
            raise then
        return None

    return call


@pytest.mark.parametrize(("interval", "wait"), [(60.0, 10.0), (3.0, 3.0)])
def test_a_failed_certificate_pass_is_tried_again_after_10s_or_the_interval(
    waits: list[float], caplog: pytest.LogCaptureFixture, interval: float, wait: float
) -> None:
    manager = WebhookCertManager(None, interval_s=interval)  # type: ignore[arg-type]
    manager.sync = failing(2, then=Enough())  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING), pytest.raises(Enough):
        asyncio.run(manager.run())
    assert waits == [wait, wait]
    assert (
        f"webhook certificate sync failed (503 ServiceUnavailable: etcd is away); retrying in {wait:g}s"
        in (caplog.text)
    )


class ConfigMaps:
    """GET fails ``failures`` times, then finds nothing; creates succeed."""

    def __init__(self, failures: int) -> None:
        self.get = failing(failures, then=kube.NotFound(404, "NotFound", ""))
        self.created: list[str] = []
        self.written = asyncio.Event()

    async def create(self, res: kube.Resource, body: kube.Obj, **_: Any) -> kube.Obj:
        self.created.append(body["metadata"]["name"])
        self.written.set()
        return body


def test_the_workload_handoff_configmap_is_retried_every_2s_until_written(
    waits: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    client = ConfigMaps(failures=3)
    with caplog.at_level(logging.WARNING):
        asyncio.run(workloads.publish(client, workloads.Handoff(enabled=True, served=True), "koord-queue"))  # type: ignore[arg-type]
    assert waits == [2.0, 2.0, 2.0] and len(client.created) == 1
    assert caplog.text.count("etcd is away; will retry") == 3


def test_the_quota_binding_configmap_is_retried_every_second(waits: list[float]) -> None:
    client = ConfigMaps(failures=2)
    sync = QuotaBindingSync(client, quotas=lambda: [], enforce=True, namespace="koord-queue")  # type: ignore[arg-type]
    sync.resync_seconds = 0.0

    async def until_written() -> None:
        task = asyncio.create_task(sync.run())
        await asyncio.wait_for(client.written.wait(), timeout=5.0)  # the run goes on after the write
        task.cancel()

    asyncio.run(until_written())
    assert waits[:2] == [1.0, 1.0] and client.created

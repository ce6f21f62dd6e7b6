"""An admission write whose outcome is unknown stays assumed until the cluster answers.

A dropped connection or a 5xx may come after etcd committed the write. The scheduler asks for the
unit until it gets an answer (or the watch delivers a newer version): giving up after a fixed
number of failed reads would forget an admission that happened and let the quota be spent twice.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from koord_queue.reconciler import scheduler_writes
from koord_queue.shared import kube
from koord_queue.shared.api.parsing import parse_unit
from tests.unit import retry_waits
from tests.unit.retry_waits import UNIT


class FlakyClient:
    """GET fails ``failures`` times with a transport error, then returns ``answer``."""

    def __init__(self, failures: int, answer: dict[str, Any]) -> None:
        self.failures = failures
        self.answer = answer
        self.gets = 0

    async def get(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.gets += 1
        if self.gets <= self.failures:
            raise kube.KubeError(0, "Transport", "connection refused")
        return self.answer


def writer_with(client: FlakyClient, store: dict[str, Any]) -> scheduler_writes.Writer:
    loop = SimpleNamespace(client=client, unit_store=store)
    return scheduler_writes.Writer(loop)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return retry_waits.record(monkeypatch)


async def test_a_write_that_landed_is_kept_however_long_the_cluster_takes_to_answer() -> None:
    admitted = {**UNIT, "metadata": {**UNIT["metadata"], "resourceVersion": "6"}}
    admitted["status"] = {"phase": "Dequeued", "admissions": [{"name": "main", "replicas": 1}]}
    client = FlakyClient(failures=20, answer=admitted)
    writer = writer_with(client, {})
    err = kube.KubeError(503, "ServiceUnavailable", "etcd leader changed")
    written = await writer._outcome_of("ns/u", parse_unit(UNIT), err)
    assert written is admitted  # 20 failed reads (the old code gave up after 8) and still known
    assert client.gets == 21


async def test_the_watch_can_answer_before_a_read_succeeds() -> None:
    admitted = {**UNIT, "metadata": {**UNIT["metadata"], "resourceVersion": "7"}}
    admitted["status"] = {"phase": "Dequeued", "admissions": [{"name": "main", "replicas": 1}]}
    client = FlakyClient(failures=1000, answer=UNIT)
    writer = writer_with(client, {"ns/u": admitted})
    err = kube.KubeError(0, "Transport", "reset")
    assert await writer._outcome_of("ns/u", parse_unit(UNIT), err) is admitted
    assert client.gets == 0


async def test_a_write_that_did_not_land_is_forgotten_once_known() -> None:
    client = FlakyClient(failures=3, answer=UNIT)
    writer = writer_with(client, {"ns/u": UNIT})  # the store holds the same version: no news there
    err = kube.KubeError(500, "InternalError", "")
    assert await writer._outcome_of("ns/u", parse_unit(UNIT), err) is None
    # A definite refusal needs no read at all.
    refused = kube.KubeError(409, "Conflict", "")
    assert await writer._outcome_of("ns/u", parse_unit(UNIT), refused) is None
    assert client.gets == 4


async def test_failed_reads_wait_half_a_second_doubling_to_4s_and_the_ninth_is_logged(
    waits: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    client = FlakyClient(failures=12, answer=UNIT)
    writer = writer_with(client, {})
    with caplog.at_level("WARNING", logger="koord_queue.reconciler.scheduler_writes"):
        await writer._outcome_of("ns/u", parse_unit(UNIT), kube.KubeError(0, "Transport", "reset"))
    assert waits == [0.5, 1.0, 2.0, 4.0] + [4.0] * 8
    unknown = [r for r in caplog.records if "outcome still unknown" in r.getMessage()]
    assert len(unknown) == 1  # once, after the ninth failed read


async def test_a_unit_deleted_meanwhile_was_not_admitted(waits: list[float]) -> None:
    class GoneClient(FlakyClient):
        async def get(self, *_: Any, **__: Any) -> dict[str, Any]:
            self.gets += 1
            if self.gets == 1:
                raise kube.KubeError(0, "Transport", "reset")
            raise kube.NotFound(404, "NotFound", "")

    client = GoneClient(failures=0, answer=UNIT)
    writer = writer_with(client, {})
    assert await writer._outcome_of("ns/u", parse_unit(UNIT), kube.KubeError(503, "x", "")) is None
    assert client.gets == 2 and waits == [0.5]

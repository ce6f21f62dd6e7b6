"""A waiting message is written on the version it was decided on: a conflict re-reads the unit, drops
the message if the unit moved on, and otherwise sends it again at once, three tries in all
(``reconciler/scheduler_writes.py`` ``_write_park``; docs/architecture.md#retries)."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest

from koord_queue.reconciler import scheduler_writes
from koord_queue.shared import kube, retrying
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.core.scheduling import Park
from tests.unit.retry_waits import UNIT

PARK = Park(key="ns/u", queue="q", message="insufficient quota")


class ConflictingClient:
    """Every status patch conflicts ``conflicts`` times, then lands; a GET returns ``latest``."""

    def __init__(self, conflicts: int, latest: dict[str, Any]) -> None:
        self.conflicts = conflicts
        self.latest = latest
        self.patches: list[str] = []
        self.gets = 0

    async def patch(self, res: kube.Resource, name: str, body: Any, **_: Any) -> dict[str, Any]:
        self.patches.append(body["metadata"]["resourceVersion"])
        if len(self.patches) <= self.conflicts:
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        return {**self.latest, "status": body["status"]}

    async def get(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.gets += 1
        bumped = copy.deepcopy(self.latest)
        bumped["metadata"]["resourceVersion"] = str(5 + self.gets)
        return bumped


def write(client: ConflictingClient) -> tuple[list[Any], list[str]]:
    settled: list[Any] = []
    events: list[str] = []
    host = SimpleNamespace(
        client=client,
        settle_cache=lambda key, written: settled.append(written),
        writes=SimpleNamespace(deferred_parks={}, writing=set()),
        events=SimpleNamespace(record=lambda target, **kw: events.append(kw["message"])),
    )
    writer = scheduler_writes.Writer(host)  # type: ignore[arg-type]
    asyncio.run(writer._write_park(PARK, parse_unit(UNIT), UNIT))
    return settled, events


def test_a_conflict_is_written_again_at_once_on_the_fresh_version(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retrying, "sleep", record)
    client = ConflictingClient(conflicts=2, latest=UNIT)
    settled, events = write(client)
    assert client.patches == ["5", "6", "7"] and client.gets == 2
    assert settled[0]["status"]["message"] == "insufficient quota"
    assert events == ["insufficient quota"]
    assert set(waits) == {0.0}


def test_three_conflicts_give_up_the_write_but_not_the_event() -> None:
    client = ConflictingClient(conflicts=3, latest=UNIT)
    settled, events = write(client)
    assert len(client.patches) == scheduler_writes.PARK_WRITE_ATTEMPTS == 3
    assert settled == [None] and events == ["insufficient quota"]


def test_a_unit_that_moved_on_drops_the_message() -> None:
    admitted = copy.deepcopy(UNIT)
    admitted["status"] = {"phase": "Dequeued", "admissions": [{"name": "main", "replicas": 1}]}
    client = ConflictingClient(conflicts=1, latest=admitted)
    settled, events = write(client)
    assert client.patches == ["5"] and settled == [None] and events == []

"""The watch event of the scheduler's own write is not parsed again (BENCHMARKS.md, session 12).

An admission is applied to the cache from the write's answer when it settles; the watch then
delivers the same resourceVersion. Parsing it again would change nothing, so it is skipped; any
other version, newer or from someone else, still goes through.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from koord_queue.reconciler import scheduler
from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared.api import parsing
from koord_queue.shared.api.model import Unit
from koord_queue.shared.core.config import Settings
from tests.unit.test_scheduler_settle_order import (
    QUEUE,
    QUOTA,
    FakeEvents,
    ScriptedClient,
    held,
    settle,
    unit,
)


async def test_the_echo_of_an_admission_is_not_parsed_and_later_versions_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = unit("x", 11)
    client = ScriptedClient({"x": x})
    store = {"ns/x": x}
    loop = SchedulerLoop(client, events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    loop.on_unit(None, x)
    loop.cycle()
    await settle(loop)
    written = client.etcd["x"]
    assert written["status"]["phase"] == "Dequeued" and held(loop) == 1000
    assert loop.cache.units["ns/x"].resource_version == written["metadata"]["resourceVersion"]

    parsed: list[str] = []

    def counting(raw: Mapping[str, object]) -> Unit:
        result = parsing.parse_unit(raw)
        parsed.append(result.resource_version)
        return result

    monkeypatch.setattr(scheduler, "parse_unit", counting)
    store["ns/x"] = written
    loop.on_unit(x, written)  # the echo of our own admission
    assert parsed == [] and held(loop) == 1000

    finished = unit("x", 13, {"phase": "Succeed", "message": "Succeeded"})
    store["ns/x"] = finished
    loop.on_unit(written, finished)  # the job extension's write: a new version
    assert parsed == ["13"] and held(loop) == 0
    assert loop.cache.units["ns/x"].phase == "Succeed"

    loop.on_unit(finished, None)  # a deletion always applies
    assert "ns/x" not in loop.cache.units


async def test_an_assumed_admission_is_replaced_by_the_stored_version_when_its_write_fails() -> None:
    """The cache holds the assumed unit under the version it was decided on while the write is on
    its way; a refused write puts back the stored unit, which the skip must not mistake for it."""
    x = unit("x", 11)
    client = ScriptedClient({"x": x})
    client.etcd["x"] = unit("x", 12)  # someone wrote meanwhile: our conditional write gets a 409
    store = {"ns/x": x}
    loop = SchedulerLoop(client, events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    loop.on_unit(None, x)
    loop.cycle()
    await settle(loop)
    assert client.patches == [("x", "409")]
    assert held(loop) == 0 and loop.cache.units["ns/x"].phase == ""
    newer = client.etcd["x"]
    store["ns/x"] = newer
    loop.on_unit(x, newer)
    assert loop.cache.units["ns/x"].resource_version == "12"

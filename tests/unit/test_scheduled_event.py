"""Which admissions get the unit event ``Scheduled`` (docs/compatibility.md#events).

By default (``scheduledEvents: AfterWait``) only a unit that waited gets it: one that the first cycle
admits has nothing to close in its event history, and the event would be one apiserver write per
job. ``Always`` is upstream's behaviour. The loop tests run the real scheduler loop against a
scripted apiserver and count the events it records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube
from koord_queue.shared.api.names import EventReason, Phase
from koord_queue.shared.core import config
from koord_queue.shared.core.config import ScheduledEvents, Settings
from koord_queue.shared.core.plan import announces_admission
from tests.unit.test_scheduler_settle_order import QUEUE, QUOTA, ScriptedClient, settle, unit

HEADER = "apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n"


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        self.recorded.append((obj["metadata"]["name"], reason))

    def record_optional(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> bool:
        self.record(obj, type_=type_, reason=reason, message=message)
        return True

    def scheduled(self) -> list[str]:
        return [name for name, reason in self.recorded if reason == EventReason.SCHEDULED]


# --- the switch ------------------------------------------------------------------------------------


def test_the_default_is_after_wait_and_always_restores_upstream() -> None:
    assert config.parse(HEADER).scheduled_events is ScheduledEvents.AFTER_WAIT
    assert config.parse(HEADER + "scheduledEvents: Always\n").scheduled_events is ScheduledEvents.ALWAYS
    assert not config.parse(HEADER + "scheduledEvents: AfterWait\n").warnings


@pytest.mark.parametrize("value", ["always", "Never", "[Always]", "1", "true"])
def test_any_other_value_is_refused_with_the_choices(value: str) -> None:
    with pytest.raises(config.ConfigError, match="scheduledEvents: expected AfterWait or Always"):
        config.parse(HEADER + f"scheduledEvents: {value}\n")


def test_the_shipped_configuration_names_the_default() -> None:
    path = Path(__file__).parents[2] / "manifests" / "config.yaml"
    doc = yaml.safe_load(path.read_text())
    assert config.parse(doc["data"]["config.yaml"]).scheduled_events is ScheduledEvents.AFTER_WAIT


@pytest.mark.parametrize(
    ("before", "always", "expected"),
    [
        ("", False, False),  # admitted by the first cycle that saw it
        (Phase.ENQUEUED, False, True),  # parked, or requeued after a backoff
        ("", True, True),
        (Phase.ENQUEUED, True, True),
    ],
)
def test_announces_admission(before: str, always: bool, expected: bool) -> None:
    assert announces_admission(before, always=always) is expected


# --- the loop --------------------------------------------------------------------------------------


async def _first_fits_second_waits(mode: ScheduledEvents) -> list[str]:
    """Quota of 1 cpu: ``first`` is admitted at once, ``second`` is parked until ``first`` finishes."""
    first, second = unit("first", 10), unit("second", 11)
    client = ScriptedClient({"first": first, "second": second})
    store: dict[str, kube.Obj] = {"ns/first": first}
    events = Events()
    loop: Any = SchedulerLoop(client, events=events, settings=Settings(scheduled_events=mode))  # type: ignore[arg-type]
    loop.unit_store = store
    loop.on_quota(None, QUOTA)
    loop.on_queue(None, QUEUE)
    loop.on_unit(None, first)
    loop.cycle()
    await settle(loop)
    assert client.patches == [("first", "Dequeued")]

    store["ns/second"] = second
    loop.on_unit(None, second)
    loop.cycle()
    await settle(loop)
    assert client.patches[-1] == ("second", "Enqueued"), "the quota is full: second waits"
    assert (second["metadata"]["name"], EventReason.FAILED_SCHEDULING) in events.recorded

    admitted = client.etcd["first"]
    client.rv += 1  # the job extension's write: a new version, as the apiserver gives every write
    meta = {**admitted["metadata"], "resourceVersion": str(client.rv)}
    done = {**admitted, "metadata": meta, "status": {"phase": "Succeed", "message": "Succeeded"}}
    client.etcd["first"] = store["ns/first"] = done
    loop.on_unit(admitted, done)
    loop.cycle()
    await settle(loop)
    assert client.patches[-1] == ("second", "Dequeued")
    return events.scheduled()


async def test_only_the_unit_that_waited_gets_scheduled_by_default() -> None:
    assert await _first_fits_second_waits(ScheduledEvents.AFTER_WAIT) == ["second"]


async def test_always_gives_every_admission_its_event() -> None:
    assert await _first_fits_second_waits(ScheduledEvents.ALWAYS) == ["first", "second"]

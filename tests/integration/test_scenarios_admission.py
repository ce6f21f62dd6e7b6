"""Admission under quota, black box against the real apiserver with the reconciler running.

Scenarios of docs/compatibility.md#scenario-list: S1 (basic admission: phase, admissions, message,
``spec.queue``, ``lastAllocateTime``, conditions, the ``Scheduled`` event), S2 (quota exhaustion, then
release when the holder is deleted or finishes), the parent-quota chain (a child with room is held by an
exhausted parent), exact milli-CPU arithmetic (two 500m units fit in one CPU; upstream rounds 500m up to
1), S29 (no quota label: no phase, no event, in no queue; our reason in ``status.message``) and S30 (an
unknown quota label: ``QueueNotFound``, then admission once the ElasticQuota appears).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube
from tests import scenario as s
from tests.scenario import Scenario

pytestmark = pytest.mark.integration


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


def _metrics_port(processes: system.Processes) -> int:
    for component in processes.components:
        if component.name == "reconciler":
            return component.ports["metrics"]
    raise AssertionError("the reconciler is not running")


async def test_s1_a_unit_that_fits_is_dequeued_with_admissions_and_conditions(sc: Scenario) -> None:
    q = sc.name("s1")
    await sc.create_quota(s.quota(q, cpu="4"))
    await sc.create_unit(s.unit("train", quota=q, cpu="1", priority=10))

    got = await sc.wait_phase("train", "Dequeued")
    st = s.status(got)
    assert st["admissions"] == [{"name": "train", "replicas": 1, "running": 0}]
    assert st["message"] == Message.DEQUEUED
    assert st.get("lastAllocateTime")
    for type_ in (names.ConditionType.QUOTA_RESERVED, names.ConditionType.ADMITTED):
        cond = s.condition(got, type_)
        assert cond is not None, f"no {type_} condition: {st}"
        assert cond["status"] == "True" and cond["reason"] and cond["lastTransitionTime"], cond

    await sc.wait_unit("train", lambda u: u["spec"].get("queue") == q, what=f"spec.queue == {q}")


async def test_the_fallback_quota_label_maps_a_unit_too(sc: Scenario) -> None:
    q = sc.name("fallback")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("aliased", quota=None, labels={names.QUOTA_NAME_LABEL_FALLBACK: q}))
    got = await sc.wait_phase("aliased", "Dequeued")
    assert got["spec"].get("queue") in (None, "", q)
    await sc.wait_unit("aliased", lambda u: u["spec"].get("queue") == q, what=f"spec.queue == {q}")


@pytest.mark.parametrize("release", ["deleted", "finished"])
async def test_s2_a_unit_beyond_the_quota_waits_with_the_limit_and_is_admitted_after_release(
    sc: Scenario, system_integration: system.Processes, release: str
) -> None:
    q = sc.name("s2")
    await sc.create_quota(s.quota(q, cpu="2"))
    await sc.create_unit(s.unit("a", quota=q, cpu="2", priority=10))
    await sc.wait_phase("a", "Dequeued")
    port = _metrics_port(system_integration)
    labels = {"queue": q, "result": "unschedulable"}
    before = await asyncio.to_thread(sc.metric, port, "job_schedule_attempts_total", labels)

    await sc.create_unit(s.unit("b", quota=q, cpu="2", priority=10))
    parked = await sc.wait_message("b", "limited quotaName:")
    text = s.message(parked)
    assert text.startswith(f"limited quotaName:{q}, limited resKey:cpu,"), text
    assert text.endswith(Message.PREEMPT_FAILED_SUFFIX), text
    waiting = await sc.assert_waiting("b")
    assert s.status(waiting).get("attempts", 0) >= 1, "failed cycles are counted"
    event = await sc.wait_event("b", names.EventReason.FAILED_SCHEDULING, type_="Warning")
    assert event.message == text
    after = await asyncio.to_thread(sc.metric, port, "job_schedule_attempts_total", labels)
    assert after > before, (before, after)

    if release == "deleted":
        await sc.delete_unit("a")
    else:
        await sc.finish("a")
    got = await sc.wait_phase("b", "Dequeued")
    assert s.admissions(got) == [{"name": "b", "replicas": 1, "running": 0}]
    # b waited, so its FailedScheduling history ends with Scheduled; a, admitted by the first cycle
    # that saw it, got no event (scheduledEvents: AfterWait, docs/compatibility.md#events).
    event = await sc.wait_event("b", names.EventReason.SCHEDULED, type_="Normal")
    assert event.message == Message.SCHEDULED_EVENT
    assert names.EventReason.SCHEDULED not in [e.reason for e in await sc.events("a")]


async def test_raising_the_quotas_max_admits_a_waiting_unit(sc: Scenario) -> None:
    q = sc.name("grow")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("first", quota=q, cpu="1"))
    await sc.wait_phase("first", "Dequeued")
    await sc.create_unit(s.unit("second", quota=q, cpu="1"))
    await sc.wait_message("second", "limited quotaName:")

    await sc.patch_quota(q, {"spec": {"max": {"cpu": "2"}, "min": {"cpu": "2"}}})
    await sc.wait_phase("second", "Dequeued")
    assert s.phase(await sc.get_unit("first")) == "Dequeued"


async def test_a_child_quota_with_room_is_held_by_its_exhausted_parent(sc: Scenario) -> None:
    parent, left, right = sc.name("parent"), sc.name("left"), sc.name("right")
    await sc.create_quota(s.quota(parent, cpu="2"))
    await sc.create_quota(s.quota(left, cpu="4", parent=parent))
    await sc.create_quota(s.quota(right, cpu="4", parent=parent))

    await sc.create_unit(s.unit("big", quota=left, cpu="2"))
    await sc.wait_phase("big", "Dequeued")
    await sc.create_unit(s.unit("small", quota=right, cpu="1"))
    parked = await sc.wait_message("small", "limited quotaName:")
    assert s.message(parked) == (
        f"limited quotaName:{parent}, limited resKey:cpu,{Message.PREEMPT_FAILED_SUFFIX}"
    ), "the parent, not the child, limits"
    await sc.assert_waiting("small")

    await sc.delete_unit("big")
    await sc.wait_phase("small", "Dequeued")


async def test_two_500m_units_fit_exactly_in_one_cpu_and_a_third_waits(sc: Scenario) -> None:
    q = sc.name("milli")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("half-1", quota=q, cpu="500m"))
    await sc.create_unit(s.unit("half-2", quota=q, cpu="500m"))
    await sc.wait_phase("half-1", "Dequeued")
    await sc.wait_phase("half-2", "Dequeued")

    await sc.create_unit(s.unit("half-3", quota=q, cpu="500m"))
    parked = await sc.wait_message("half-3", "limited quotaName:")
    assert s.message(parked).startswith(f"limited quotaName:{q}, limited resKey:cpu,")
    await sc.assert_waiting("half-3")


@pytest.mark.parametrize("round_", range(3))
async def test_units_deleted_while_being_admitted_leave_no_quota_behind(sc: Scenario, round_: int) -> None:
    """Churn: admissions and waiting messages are in flight while their units are deleted.

    Regression for two races in the reconciler: a deletion seen during an admission write was
    overwritten by the write's result (a ghost kept the quota), and a waiting message written
    after a later admission turned the admitted unit back to Enqueued.
    """
    q = sc.name(f"churn-{round_}")
    await sc.create_quota(s.quota(q, cpu="10"))

    async def create_then_delete(index: int) -> None:
        await sc.create_unit(s.unit(f"u{index}", quota=q, cpu="1"))
        await asyncio.sleep(0.01 * (index % 7))
        await sc.delete_unit(f"u{index}")

    await asyncio.gather(*(create_then_delete(i) for i in range(40)))
    await sc.create_unit(s.unit("whole", quota=q, cpu="10"))
    got = await sc.wait_phase("whole", "Dequeued", timeout=15)
    assert s.admissions(got) == [{"name": "whole", "replicas": 1, "running": 0}]
    cond = s.condition(got, names.ConditionType.ADMITTED)
    assert cond is not None and cond["status"] == "True", s.status(got)


async def test_s29_a_unit_without_a_quota_label_gets_no_phase_no_event_and_no_queue(sc: Scenario) -> None:
    """Upstream leaves such a unit silent; we keep S29 (no phase, no event, in no queue) but say
    why in ``status.message``, so no unit ever waits without a reason."""
    q = sc.name("s29")
    await sc.create_quota(s.quota(q, cpu="4"))
    await sc.create_unit(s.unit("unlabelled", quota=None))
    # Units share one watch: once a later labelled unit has its event, the first one was seen too.
    await sc.create_unit(s.unit("labelled", quota=q, cpu="8"))
    await sc.wait_event("labelled", names.EventReason.FAILED_SCHEDULING)

    got = await sc.wait_message("unlabelled", "not queued: the unit has no quota label")
    assert s.status(got) == {"message": Message.NO_QUOTA_LABEL}, "no phase, only the reason"
    assert await sc.events("unlabelled") == []
    for queue in await sc.list_queues():
        listed = (queue.get("status") or {}).get("queueItemDetails", {}).get("active") or []
        assert not any(i["name"] == "unlabelled" and i["namespace"] == sc.ns for i in listed), queue


async def test_s30_an_unknown_quota_is_reported_and_the_unit_is_admitted_once_it_appears(
    sc: Scenario,
) -> None:
    q = sc.name("late")
    await sc.create_unit(s.unit("early", quota=q))

    parked = await sc.wait_message("early", Message.queue_not_exist(q))
    assert s.message(parked) == f"queue {q} is not exist"
    await sc.assert_waiting("early")
    event = await sc.wait_event("early", names.EventReason.QUEUE_NOT_FOUND, type_="Warning")
    assert event.message == Message.queue_not_found_event(q, sc.ns, "early")

    await sc.create_quota(s.quota(q, cpu="4"), wait_queue=False)
    got = await sc.wait_phase("early", "Dequeued", timeout=15)
    assert s.status(got)["message"] == Message.DEQUEUED
    found = [e for e in await sc.events("early") if e.reason == names.EventReason.QUEUE_NOT_FOUND]
    assert len(found) == 1 and found[0].count == 1, "QueueNotFound is emitted once per unit"


@pytest.mark.parametrize("round_", range(2))
async def test_units_created_before_their_quota_end_up_showing_the_real_reason(
    sc: Scenario, round_: int
) -> None:
    """Regression: a reason decided while the previous one was still being written was dropped,
    so units kept saying their queue did not exist after it had appeared."""
    q = sc.name(f"early-{round_}")
    units = [f"u{i}" for i in range(30)]
    await asyncio.gather(*(sc.create_unit(s.unit(name, quota=q, cpu="1")) for name in units))
    await sc.create_quota(s.quota(q, cpu="500m"), wait_queue=False)

    async def all_limited() -> bool:
        found = {name: s.message(await sc.get_unit(name)) for name in units}
        stale = {n: m for n, m in found.items() if not m.startswith(f"limited quotaName:{q},")}
        assert not stale, stale
        return True

    await kube.eventually(all_limited, timeout=15, what="every unit shows the quota limit")


async def test_units_of_a_deleted_quota_wait_with_queue_not_found(sc: Scenario) -> None:
    q = sc.name("gone")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("admitted", quota=q, cpu="1"))
    await sc.wait_phase("admitted", "Dequeued")
    await sc.create_unit(s.unit("left-behind", quota=q, cpu="1"))
    await sc.wait_message("left-behind", "limited quotaName:")

    await sc.delete_quota(q)
    parked = await sc.wait_message("left-behind", Message.queue_not_exist(q))
    assert s.phase(parked) in s.WAITING
    await sc.wait_event("left-behind", names.EventReason.QUEUE_NOT_FOUND, type_="Warning")


async def test_kubectl_shows_the_waiting_reason(sc: Scenario, integration_cluster: LocalCluster) -> None:
    q = sc.name("wide")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("fits", quota=q, cpu="1"))
    await sc.create_unit(s.unit("waits", quota=q, cpu="1", priority=-1))
    await sc.wait_phase("fits", "Dequeued")
    await sc.wait_message("waits", "limited quotaName:")
    out = kube.kubectl(integration_cluster, "get", "qu", "-n", sc.ns, "-o", "wide").stdout
    row = next(line for line in out.splitlines() if line.startswith("waits "))
    assert f"limited quotaName:{q}" in row, out

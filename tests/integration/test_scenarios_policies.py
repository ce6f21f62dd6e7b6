"""Queue policies and activation, black box against the real apiserver with the reconciler running.

Scenarios of docs/compatibility.md#scenario-list: S7 (``wait-for-pods-running`` holds the queue until
the admitted unit's pods run), S8/S9 (an inactive unit is never admitted and keeps no quota; activating
it admits it), how Block and Priority differ when a high unit does not fit (Priority lets a smaller unit
bypass it, Block holds the whole quota until a release), and S14-S17 (Intelligent positions published in
the Queue's ``status.queueItemDetails``: high sub-queue first, each ordered by priority, then
non-preemptible before preemptible, then age).

Queue tuning is put on the ElasticQuota: its ``koord-queue/*`` annotations and policy label are
copied onto the Queue when it is created, so no unit can race a later Queue update.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from testenv import system
from testenv.cluster import LocalCluster
from tests import scenario as s
from tests.scenario import Scenario

pytestmark = pytest.mark.integration


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


# --- S7 -------------------------------------------------------------------------------------------


async def test_s7_wait_for_pods_running_holds_the_queue_until_the_admitted_pods_run(sc: Scenario) -> None:
    q = sc.name("s7")
    await sc.create_quota(s.quota(q, cpu="16", annotations={names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"}))
    await sc.create_unit(s.unit("holder", quota=q, priority=10))
    got = await sc.wait_phase("holder", "Dequeued")
    assert s.admissions(got)[0]["running"] == 0

    await sc.create_unit(s.unit("waiter", quota=q, priority=10))
    parked = await sc.wait_message("waiter", Message.NO_MORE_IN_QUEUE)
    assert s.message(parked) == Message.NO_MORE_IN_QUEUE
    await sc.assert_waiting("waiter")

    await sc.set_running("holder", 1)
    await sc.wait_phase("waiter", "Dequeued")


# --- S8, S9 ---------------------------------------------------------------------------------------


async def test_s8_an_inactive_unit_is_never_admitted_and_holds_no_quota(sc: Scenario) -> None:
    q = sc.name("s8")
    await sc.create_quota(s.quota(q, cpu="2"))
    # Higher priority than the rival: were it considered, it would be admitted first.
    await sc.create_unit(s.unit("inactive", quota=q, cpu="2", priority=100, active=False))
    await sc.create_unit(s.unit("rival", quota=q, cpu="2"))

    await sc.wait_phase("rival", "Dequeued")
    got = await sc.get_unit("inactive")
    assert got["spec"]["active"] is False, "spec.active persists"
    assert s.phase(got) not in ("Dequeued", "Reserved")
    assert s.admissions(got) == []


async def test_s9_activating_an_inactive_unit_admits_it(sc: Scenario) -> None:
    q = sc.name("s9")
    await sc.create_quota(s.quota(q, cpu="4"))
    await sc.create_unit(s.unit("sleeper", quota=q, cpu="1", priority=100, active=False))
    await sc.create_unit(s.unit("marker", quota=q, cpu="1"))
    await sc.wait_phase("marker", "Dequeued")  # the scheduler has looked at both
    got = await sc.get_unit("sleeper")
    assert s.phase(got) not in ("Dequeued", "Reserved") and s.admissions(got) == []

    await sc.patch_unit("sleeper", {"spec": {"active": True}})
    got = await sc.wait_phase("sleeper", "Dequeued")
    assert s.admissions(got) == [{"name": "sleeper", "replicas": 1, "running": 0}]


async def test_freed_quota_goes_to_the_higher_priority_unit_even_if_it_came_later(sc: Scenario) -> None:
    q = sc.name("order")
    await sc.create_quota(s.quota(q, cpu="1"))
    await sc.create_unit(s.unit("holder", quota=q, priority=50))
    await sc.wait_phase("holder", "Dequeued")
    await sc.create_unit(s.unit("early-low", quota=q, priority=1))
    await sc.wait_message("early-low", "limited quotaName:")
    await sc.create_unit(s.unit("late-high", quota=q, priority=10))
    await sc.wait_message("late-high", "limited quotaName:")

    await sc.delete_unit("holder")
    await sc.wait_phase("late-high", "Dequeued")
    await sc.wait_message("early-low", "limited quotaName:")
    await sc.assert_waiting("early-low")


# --- Block vs Priority ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["Priority", "Block"])
async def test_a_small_unit_bypasses_a_big_one_that_does_not_fit_only_under_priority(
    sc: Scenario, policy: str
) -> None:
    q = sc.name(policy.lower())
    await sc.create_quota(s.quota(q, cpu="3", policy=policy))
    queue = await sc.wait_queue(q)
    assert queue["spec"]["queuePolicy"] == policy
    await sc.create_unit(s.unit("holder", quota=q, cpu="2", priority=100))
    await sc.wait_phase("holder", "Dequeued")  # 1 CPU left

    await sc.create_unit(s.unit("big", quota=q, cpu="2", priority=10))
    await sc.wait_message("big", "limited quotaName:")
    await sc.create_unit(s.unit("small", quota=q, cpu="1", priority=1))

    if policy == "Priority":
        await sc.wait_phase("small", "Dequeued")
    else:
        parked = await sc.wait_message("small", Message.BLOCKED_BY_HIGHER)
        assert s.message(parked) == Message.BLOCKED_BY_HIGHER
        await sc.assert_waiting("small")
    await sc.assert_waiting("big")

    await sc.delete_unit("holder")
    await sc.wait_phase("big", "Dequeued")
    await sc.wait_phase("small", "Dequeued")


async def test_max_depth_limits_how_far_a_unit_may_bypass_one_that_does_not_fit(sc: Scenario) -> None:
    q = sc.name("depth")
    await sc.create_quota(s.quota(q, cpu="2", annotations={names.MAX_DEPTH_ANNOTATION: "1"}))
    await sc.create_unit(s.unit("holder", quota=q, cpu="1", priority=100))
    await sc.wait_phase("holder", "Dequeued")  # 1 CPU left
    await sc.create_unit(s.unit("big", quota=q, cpu="2", priority=10))
    await sc.wait_message("big", "limited quotaName:")
    await sc.create_unit(s.unit("small", quota=q, cpu="1", priority=1))

    parked = await sc.wait_message("small", "max-depth")
    assert s.message(parked) == f"waiting in queue {q}: position is beyond the queue's max-depth 1"
    await sc.assert_waiting("small")


# --- Intelligent: the low sub-queue ---------------------------------------------------------------


async def test_intelligent_a_small_low_unit_is_admitted_behind_many_low_units_that_do_not_fit(
    sc: Scenario,
) -> None:
    # Upstream polls the low sub-queue round-robin: low units that cannot fit do not stop a later
    # low unit that can.
    q = sc.name("low-rr")
    annotations = {names.PRIORITY_THRESHOLD_ANNOTATION: "4"}
    await sc.create_quota(s.quota(q, cpu="2", policy="Intelligent", annotations=annotations))
    bigs = [f"big-{i}" for i in range(30)]
    for i, name in enumerate(bigs):
        await sc.create_unit(s.unit(name, quota=q, cpu="3", priority=i % 4))
    for name in bigs:
        await sc.wait_message(name, "limited quotaName:")

    await sc.create_unit(s.unit("small", quota=q, cpu="1", priority=0))
    got = await sc.wait_phase("small", "Dequeued", timeout=5.0)
    assert s.admissions(got) == [{"name": "small", "replicas": 1, "running": 0}]
    for name in bigs:
        await sc.assert_waiting(name)


# --- S14-S17: Intelligent positions ---------------------------------------------------------------


def _positions(queue: dict[str, Any], namespace: str) -> dict[str, int]:
    items = ((queue.get("status") or {}).get("queueItemDetails") or {}).get("active") or []
    return {i["name"]: i["position"] for i in items if i["namespace"] == namespace}


INTELLIGENT_CASES = {
    # S14: all in the high sub-queue (priority >= 4): by priority.
    "s14-high": ([("job-1", 5), ("job-2", 4), ("job-3", 6)], {"job-3": 1, "job-1": 2, "job-2": 3}),
    # S15: all in the low sub-queue: by priority.
    "s15-low": ([("job-1", 1), ("job-2", 3), ("job-3", 2)], {"job-2": 1, "job-3": 2, "job-1": 3}),
    # S16: mixed: the high sub-queue is listed first, numbering continues into the low one.
    "s16-mixed": (
        [("low-a", 1), ("high-a", 6), ("low-b", 3), ("high-b", 5)],
        {"high-a": 1, "high-b": 2, "low-b": 3, "low-a": 4},
    ),
    # S17: the threshold itself belongs to the high sub-queue.
    "s17-boundary": (
        [("below", 3), ("threshold", 4), ("above", 5)],
        {"above": 1, "threshold": 2, "below": 3},
    ),
}


@pytest.mark.parametrize("case", sorted(INTELLIGENT_CASES))
async def test_s14_s17_intelligent_positions_are_published_on_the_queue(sc: Scenario, case: str) -> None:
    units, expected = INTELLIGENT_CASES[case]
    q = sc.name(case)
    annotations = {
        names.PRIORITY_THRESHOLD_ANNOTATION: "4",
        names.QUEUE_ITEMS_REFRESH_ANNOTATION: "100ms",
    }
    # 100m of CPU: nothing fits, so every unit stays listed.
    await sc.create_quota(s.quota(q, cpu="100m", policy="Intelligent", annotations=annotations))
    for name, priority in units:
        await sc.create_unit(s.unit(name, quota=q, cpu="1", priority=priority))

    queue = await sc.wait_queue(
        q, lambda got: _positions(got, sc.ns) == expected, what=f"positions {expected}"
    )
    items = queue["status"]["queueItemDetails"]["active"]
    assert [i["position"] for i in items] == list(range(1, len(units) + 1))
    assert {i["name"]: i["priority"] for i in items} == dict(units)


async def test_intelligent_puts_a_non_preemptible_unit_before_a_preemptible_one_of_equal_priority(
    sc: Scenario,
) -> None:
    q = sc.name("preemptible")
    annotations = {names.QUEUE_ITEMS_REFRESH_ANNOTATION: "100ms"}
    await sc.create_quota(s.quota(q, cpu="100m", policy="Intelligent", annotations=annotations))
    await sc.create_unit(
        s.unit("first-preemptible", quota=q, priority=5, labels={names.PREEMPTIBLE_LABEL: "true"})
    )
    await sc.create_unit(s.unit("second-steady", quota=q, priority=5))
    expected = {"second-steady": 1, "first-preemptible": 2}
    await sc.wait_queue(q, lambda got: _positions(got, sc.ns) == expected, what=f"positions {expected}")


async def test_intelligent_moves_a_unit_whose_priority_crosses_the_threshold(sc: Scenario) -> None:
    q = sc.name("crossing")
    annotations = {
        names.PRIORITY_THRESHOLD_ANNOTATION: "4",
        names.QUEUE_ITEMS_REFRESH_ANNOTATION: "100ms",
    }
    await sc.create_quota(s.quota(q, cpu="100m", policy="Intelligent", annotations=annotations))
    await sc.create_unit(s.unit("high", quota=q, priority=4))
    await sc.create_unit(s.unit("climber", quota=q, priority=3))
    await sc.create_unit(s.unit("low", quota=q, priority=2))
    before = {"high": 1, "climber": 2, "low": 3}
    await sc.wait_queue(q, lambda got: _positions(got, sc.ns) == before, what=f"positions {before}")

    await sc.patch_unit("climber", {"spec": {"priority": 9}})
    after = {"climber": 1, "high": 2, "low": 3}
    await sc.wait_queue(q, lambda got: _positions(got, sc.ns) == after, what=f"positions {after}")

    await sc.patch_unit("climber", {"spec": {"priority": 0}})
    last = {"high": 1, "low": 2, "climber": 3}
    await sc.wait_queue(q, lambda got: _positions(got, sc.ns) == last, what=f"positions {last}")

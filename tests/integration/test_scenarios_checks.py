"""Admission checks, black box against the real apiserver with the reconciler running.

Scenarios of docs/compatibility.md#scenario-list: S10 (a rejected check backs the unit off:
``TimeoutBackoff``, ``Evicted=True``, ``QuotaReserved=False``), S11 (``status.requeueState`` counts
consecutive backoffs and pushes ``requeueAt`` further out), S12 (mixed outcomes: all Ready → Dequeued,
Rejected or Retry → TimeoutBackoff, anything Pending → stays Reserved; also for units with two pod sets)
and S13 (a check's label selector decides which units must pass it).

Admission checks live on the Queue (``spec.admissionChecks``). The test makes the Queue by hand
*before* the ElasticQuota, so the reconciler never sees the queue without its checks; the quota
sync then adopts it. The test plays the admission-check controller by writing check states through
the status subresource, as upstream's suites do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.durations import parse_time
from koord_queue.shared.api.names import ConditionType, Message
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


async def queue_with_checks(sc: Scenario, suffix: str, checks: list[dict[str, Any]], *, cpu: str) -> str:
    q = sc.name(suffix)
    await sc.create_queue(s.queue(q, admission_checks=checks))
    await sc.create_quota(s.quota(q, cpu=cpu))
    return q


def _cond(unit: dict[str, Any], type_: str) -> tuple[str, str]:
    cond = s.condition(unit, type_)
    assert cond is not None, f"no {type_} condition: {s.status(unit)}"
    return cond["status"], cond["reason"]


async def test_s10_a_rejected_check_backs_the_unit_off_with_an_evicted_condition(sc: Scenario) -> None:
    q = await queue_with_checks(sc, "s10", [{"name": "conditions-check"}], cpu="4")
    await sc.create_unit(s.unit("checked", quota=q))

    got = await sc.wait_phase("checked", "Reserved")
    assert s.message(got) == Message.RESERVED
    assert s.check_states(got) == {"conditions-check": "Pending"}
    assert _cond(got, ConditionType.QUOTA_RESERVED)[0] == "True"
    assert _cond(got, ConditionType.ADMITTED)[0] == "False"
    assert s.admissions(got) == [{"name": "checked", "replicas": 1, "running": 0}]

    await sc.set_checks("checked", {"conditions-check": "Rejected"}, text="rejected by the test")
    got = await sc.wait_phase("checked", "TimeoutBackoff")
    assert s.message(got) == Message.CHECK_FAILED
    assert _cond(got, ConditionType.EVICTED) == ("True", "BackoffTimeout")
    assert _cond(got, ConditionType.QUOTA_RESERVED)[0] == "False"
    assert _cond(got, ConditionType.ADMITTED)[0] == "False"


async def test_s11_each_backoff_counts_and_pushes_requeue_at_further_out(sc: Scenario) -> None:
    q = await queue_with_checks(sc, "s11", [{"name": "requeue-check"}], cpu="4")
    await sc.create_unit(s.unit("retried", quota=q))
    await sc.wait_phase("retried", "Reserved")

    await sc.set_checks("retried", {"requeue-check": "Rejected"}, text="no capacity")
    got = await sc.wait_phase("retried", "TimeoutBackoff")
    first = s.status(got)["requeueState"]
    assert first["count"] == 1
    first_at = parse_time(first["requeueAt"])
    updated = parse_time(s.status(got)["lastUpdateTime"])
    assert first_at is not None and updated is not None and first_at > updated, s.status(got)

    def back_to_reserved(st: dict[str, Any]) -> None:
        st["phase"] = "Reserved"
        for check in st["admissionChecks"]:
            check.update(state="Pending", message="")

    await sc.update_status("retried", back_to_reserved)
    await sc.set_checks("retried", {"requeue-check": "Rejected"}, text="still no capacity")
    got = await sc.wait_unit(
        "retried",
        lambda u: s.phase(u) == "TimeoutBackoff" and s.status(u).get("requeueState", {}).get("count") == 2,
        what="second backoff recorded",
    )
    second_at = parse_time(s.status(got)["requeueState"]["requeueAt"])
    assert second_at is not None and second_at > first_at, (first, s.status(got)["requeueState"])


async def test_a_backed_off_unit_is_queued_again_when_requeue_at_passes_and_rechecked(sc: Scenario) -> None:
    q = await queue_with_checks(sc, "requeue", [{"name": "flaky-check"}], cpu="4")
    await sc.create_unit(s.unit("again", quota=q))
    await sc.wait_phase("again", "Reserved")
    await sc.set_checks("again", {"flaky-check": "Retry"}, text="try later")
    backed_off = await sc.wait_phase("again", "TimeoutBackoff")
    assert s.admissions(backed_off) == [], "a backed-off unit holds no quota"

    # requeueAt is about 10 s out (count 1); the reconciler queues it again, then re-admits it.
    got = await sc.wait_phase("again", "Reserved", timeout=25)
    assert s.check_states(got) == {"flaky-check": "Pending"}, "checks start over"
    assert s.admissions(got) == [{"name": "again", "replicas": 1, "running": 0}]
    assert s.status(got)["requeueState"]["count"] == 1
    assert _cond(got, ConditionType.QUOTA_RESERVED)[0] == "True"


# S12: (unit index, check states to set, expected phase); units 5-8 repeat 1-4 with two pod sets.
S12_TABLE = [
    (1, {"ad1": "Ready", "ad2": "Ready"}, "Dequeued"),
    (2, {"ad2": "Rejected"}, "TimeoutBackoff"),
    (3, {"ad2": "Retry"}, "TimeoutBackoff"),
    (4, {"ad2": "Ready"}, "Reserved"),
]


async def test_s12_mixed_check_outcomes_decide_each_units_phase(sc: Scenario) -> None:
    q = await queue_with_checks(sc, "s12", [{"name": "ad1"}, {"name": "ad2"}], cpu="16")
    for i in range(1, 9):
        extra = [s.pod_set("default")] if i > 4 else []
        await sc.create_unit(s.unit(f"qu{i}", quota=q, extra_pod_sets=extra))
    for i in range(1, 9):
        got = await sc.wait_phase(f"qu{i}", "Reserved")
        assert s.check_states(got) == {"ad1": "Pending", "ad2": "Pending"}
        assert len(s.admissions(got)) == (2 if i > 4 else 1)

    # The Pending-staying units first: once the others have moved, these were evaluated too.
    for index, states, _ in sorted(S12_TABLE, key=lambda row: row[2] != "Reserved"):
        for name in (f"qu{index}", f"qu{index + 4}"):
            await sc.set_checks(name, states, text=f"set by the test: {states}")
    for index, _, expected in S12_TABLE:
        if expected == "Reserved":
            continue
        for name in (f"qu{index}", f"qu{index + 4}"):
            got = await sc.wait_phase(name, expected)
            text = Message.CHECKS_READY if expected == "Dequeued" else Message.CHECK_FAILED
            assert s.message(got) == text
    for name in ("qu4", "qu8"):
        got = await sc.get_unit(name)
        assert s.phase(got) == "Reserved", s.status(got)
        assert s.check_states(got) == {"ad1": "Pending", "ad2": "Ready"}
    event = await sc.wait_event("qu1", names.EventReason.SCHEDULED, type_="Normal")
    assert event.message == Message.SCHEDULED_EVENT


async def test_s13_only_units_matching_a_checks_selector_must_pass_it(sc: Scenario) -> None:
    selector = {"matchLabels": {"requires-provisioning": "true"}}
    q = await queue_with_checks(sc, "s13", [{"name": "provisioning", "labelSelector": selector}], cpu="4")
    await sc.create_unit(s.unit("plain", quota=q))
    await sc.create_unit(s.unit("provisioned", quota=q, labels={"requires-provisioning": "true"}))

    plain = await sc.wait_phase("plain", "Dequeued")
    assert s.message(plain) == Message.DEQUEUED
    assert s.check_states(plain) == {}
    provisioned = await sc.wait_phase("provisioned", "Reserved")
    assert s.check_states(provisioned) == {"provisioning": "Pending"}

    await sc.set_checks("provisioned", {"provisioning": "Ready"})
    await sc.wait_phase("provisioned", "Dequeued")

"""The phase predicates (docs/compatibility.md#phase-predicates), one table per predicate."""

from __future__ import annotations

import pytest

from koord_queue.shared.api import names, predicates
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.parsing import parse_unit
from tests.unit.test_model import unit


@pytest.mark.parametrize(
    ("case", "u", "expected"),
    [
        ("no admissions", unit("a").cpu("1").build(), False),
        ("replicas > 0", unit("a").cpu("1").admitted(1).build(), True),
        ("replicas fully reclaimed", unit("a").cpu("1").admitted(1, reclaim=1).build(), False),
        ("replicas partly reclaimed", unit("a").cpu("1", 2).admitted(2, reclaim=1).build(), True),
        ("zero replicas", unit("a").cpu("1").admitted(0).build(), False),
    ],
)
def test_reserved_any_resource(case: str, u: Unit, expected: bool) -> None:
    assert predicates.reserved_any_resource(u) is expected, case


def test_reserved_any_resource_counts_reported_resources() -> None:
    raw = unit("a").cpu("1").admitted(0).raw()
    raw["status"]["admissions"][0]["resources"] = {"cpu": "1"}
    assert predicates.reserved_any_resource(parse_unit(raw))


@pytest.mark.parametrize(
    ("case", "u", "expected"),
    [
        ("fresh", unit("a").cpu("1", 2).build(), False),
        ("partly admitted", unit("a").cpu("1", 2).admitted(1).build(), False),
        ("fully admitted", unit("a").cpu("1", 2).admitted(2).build(), True),
        ("over admitted", unit("a").cpu("1", 2).admitted(3).build(), True),
        ("no pod sets, no request", unit("a").build(), True),
    ],
)
def test_satisfied(case: str, u: Unit, expected: bool) -> None:
    assert predicates.satisfied(u) is expected, case


def test_a_request_without_pod_sets_uses_the_default_requirement_pod_set() -> None:
    raw = unit("a").raw()
    raw["spec"]["request"] = {"cpu": "1"}
    u = parse_unit(raw)
    (ps,) = predicates.expected_pod_sets(u)
    assert (ps.name, ps.count, ps.per_pod) == (names.DEFAULT_REQUIREMENT_PODSET, 1, {"cpu": 1000})
    assert not predicates.satisfied(u)


@pytest.mark.parametrize(
    ("case", "u", "all_running", "reserved_not_run"),
    [
        ("none", unit("a").cpu("1").build(), False, False),
        ("pending", unit("a").cpu("1").admitted(1, 0).build(), False, True),
        ("running", unit("a").cpu("1").admitted(1, 1).build(), True, False),
    ],
)
def test_running_predicates(case: str, u: Unit, all_running: bool, reserved_not_run: bool) -> None:
    assert predicates.all_running(u) is all_running, case
    assert predicates.reserved_not_run(u) is reserved_not_run, case


@pytest.mark.parametrize(
    ("case", "u", "expected"),
    [
        ("enqueued", unit("a").cpu("1").phase("Enqueued").build(), False),
        ("v1 dequeued", unit("a").cpu("1").phase("Running").build(), True),
        ("succeeded", unit("a").cpu("1").admitted(1).phase("Succeed").build(), True),
        ("failed", unit("a").cpu("1").phase("Failed").build(), True),
        ("satisfied, all running", unit("a").cpu("1").admitted(1, 1).build(), True),
        ("satisfied, not running", unit("a").cpu("1").admitted(1, 0).build(), False),
        ("satisfied, no pod sets", unit("a").build(), True),
    ],
)
def test_dequeued(case: str, u: Unit, expected: bool) -> None:
    assert predicates.dequeued(u) is expected, case


@pytest.mark.parametrize(
    ("phase", "assigned", "finished"),
    [
        ("", False, True),
        ("Enqueued", False, True),
        ("Reserved", True, False),
        ("Dequeued", True, True),
        ("SchedReady", True, False),
        ("Running", True, True),
        ("TimeoutBackoff", False, False),
        ("Preempted", False, True),
    ],
)
def test_assigned_and_schedule_finished(phase: str, assigned: bool, finished: bool) -> None:
    u = unit("a").cpu("1").phase(phase).build()
    assert predicates.assigned(u) is assigned
    assert predicates.pods_schedule_finished(u) is finished
    assert predicates.assigned(unit("b").cpu("1").admitted(1).phase("Enqueued").build())


def test_has_reclaim() -> None:
    assert predicates.has_reclaim(unit("a").cpu("1").admitted(1, reclaim=1).build())
    assert not predicates.has_reclaim(unit("a").cpu("1").admitted(1).build())

"""Quota usage ledger and filter: symmetric accounting, exact milli arithmetic, the parent chain,
upstream's failure texts, and property tests that usage always equals the sum over present units."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Admission, Unit
from koord_queue.shared.api.names import Message
from koord_queue.shared.core.charges import remaining_grants, remaining_request, reserved_resources
from koord_queue.shared.core.quota import QuotaLedger
from koord_queue.shared.core.usage import UsageView
from tests.unit.test_model import quota, unit


def _ledger(*quotas: object) -> QuotaLedger:
    ledger = QuotaLedger()
    for q in quotas:
        ledger.put_quota(q)  # type: ignore[arg-type]
    return ledger


# --- what a unit holds and asks for -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "u", "held"),
    [
        ("not admitted", unit("a").cpu("1").build(), {}),
        ("admitted 500m", unit("a").cpu("500m").admitted(1).build(), {"cpu": 500}),
        (
            "reclaim state is not subtracted",
            unit("a").cpu("1", 2).admitted(2, reclaim=2).build(),
            {"cpu": 2000},
        ),
        ("finished units hold nothing", unit("a").cpu("1").admitted(1).phase("Succeed").build(), {}),
        ("legacy dequeued without admissions", unit("a").cpu("3").phase("Running").build(), {"cpu": 3000}),
    ],
)
def test_reserved_resources(case: str, u: Unit, held: dict[str, int]) -> None:
    assert reserved_resources(u) == held, case


def test_reported_resources_win_when_larger_per_resource() -> None:
    u = unit("a").cpu("1", 2).admitted(2).build()
    adm = dataclasses.replace(u.admissions[0], resources={"cpu": 1500, "memory": 10})
    u = dataclasses.replace(u, admissions=(adm,))
    assert reserved_resources(u) == {"cpu": 2000, "memory": 10}


def test_remaining_demand_counts_only_missing_replicas() -> None:
    u = unit("a").podset("w", 4, cpu="1").podset("h", 1, cpu="2").admitted(3, podset="w").build()
    assert remaining_grants(u) == {"h": 1, "w": 1}
    assert remaining_request(u) == {"cpu": 3000}


# --- the filter -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "demand", "expected"),
    [
        ("fits exactly", {"cpu": 4000}, None),
        ("too much cpu", {"cpu": 4001}, Message.limited("team-a", "cpu")),
        ("unlimited resource", {"cpu": 1000, "nvidia.com/gpu": 8000}, None),
        (
            "first failing resource in name order",
            {"memory": 10**15, "cpu": 10**9},
            Message.limited("team-a", "cpu"),
        ),
        ("empty request", {}, None),
    ],
)
def test_check_against_max(case: str, demand: dict[str, int], expected: str | None) -> None:
    view = UsageView(_ledger(quota("team-a", cpu="4", memory="8Gi")))
    assert view.check(demand, "team-a", item="default/u") == expected, case


def test_an_empty_max_rejects_any_request() -> None:
    view = UsageView(_ledger(quota("empty")))
    assert view.check({"cpu": 1}, "empty", item="ns/u") == Message.quota_spec_empty("empty")
    assert view.check({}, "empty", item="ns/u") is None


def test_every_ancestor_is_checked_and_usage_propagates_up() -> None:
    ledger = _ledger(quota("root-a", cpu="4"), quota("child", parent="root-a", cpu="10"))
    ledger.put_unit(unit("x").quota("child").cpu("3").admitted(1).build())
    assert ledger.used("root-a") == {"cpu": 3000}
    assert ledger.used("child") == {"cpu": 3000}
    view = UsageView(ledger)
    assert view.check({"cpu": 2000}, "child", item="default/y") == Message.limited("root-a", "cpu")
    assert view.check({"cpu": 1000}, "child", item="default/y") is None


def test_a_missing_ancestor_and_a_cycle_use_upstream_texts() -> None:
    ledger = _ledger(quota("a", parent="ghost", cpu="4"))
    assert UsageView(ledger).check({"cpu": 1}, "a", item="ns/u") == Message.quota_missing(
        "ns/u", "ghost", ["a"]
    )
    assert UsageView(ledger).check({"cpu": 1}, "nope", item="ns/u") == Message.quota_missing(
        "ns/u", "nope", []
    )
    ledger = _ledger(quota("a", parent="b", cpu="4"), quota("b", parent="a", cpu="4"))
    assert UsageView(ledger).check({"cpu": 1}, "a", item="ns/u") == Message.quota_cycle(
        "ns/u", "a", ["a", "b"]
    )


def test_the_root_quota_name_ends_the_walk() -> None:
    ledger = _ledger(quota("a", parent=names.ROOT_QUOTA, cpu="1"))
    assert ledger.chain("a").names == ("a",)
    assert ledger.chain("a").error is None


def test_a_cycle_view_counts_its_own_admissions() -> None:
    view = UsageView(_ledger(quota("q", cpu="2")))
    view.reserve("q", {"cpu": 1500})
    assert view.check({"cpu": 500}, "q", item="x") is None
    assert view.check({"cpu": 501}, "q", item="x") == Message.limited("q", "cpu")


def test_exhausted_uses_the_smallest_request_common_to_all_units() -> None:
    ledger = _ledger(quota("q", cpu="2"))
    ledger.put_unit(unit("x").quota("q").cpu("1500m").admitted(1).build())
    view = UsageView(ledger)
    assert view.exhausted("q", {"cpu": 501}, any_empty=False)
    assert not view.exhausted("q", {"cpu": 500}, any_empty=False)
    assert not view.exhausted("q", {}, any_empty=True)


# --- incremental, symmetric accounting ------------------------------------------------------------


def test_releases_are_reported_and_bump_the_epoch() -> None:
    ledger = _ledger(quota("q", cpu="4"))
    u = unit("x").quota("q").cpu("1", 2).admitted(2).build()
    assert ledger.put_unit(u) == frozenset()
    epoch = ledger.epoch("q")
    shrunk = dataclasses.replace(u, admissions=(Admission("x", 1, 0),))
    assert ledger.put_unit(shrunk) == {"q"}
    assert ledger.epoch("q") > epoch
    assert ledger.delete_unit(u.key) == {"q"}
    assert ledger.used("q") == {}


def test_a_relabelled_unit_moves_its_usage() -> None:
    ledger = _ledger(quota("a", cpu="4"), quota("b", cpu="4"))
    u = unit("x").quota("a").cpu("1").admitted(1).build()
    ledger.put_unit(u)
    moved = dataclasses.replace(u, quota="b")
    assert ledger.apply(u, moved) == {"a"}
    assert (ledger.used("a"), ledger.used("b")) == ({}, {"cpu": 1000})


def test_usage_of_a_quota_that_appears_later_is_rebuilt() -> None:
    ledger = QuotaLedger()
    ledger.put_unit(unit("x").quota("late").cpu("1").admitted(1).build())
    ledger.put_quota(quota("parent", cpu="8"))
    ledger.put_quota(quota("late", parent="parent", cpu="2"))
    assert ledger.used("late") == {"cpu": 1000}
    assert ledger.used("parent") == {"cpu": 1000}


_units = st.lists(
    st.tuples(
        st.integers(0, 5),  # unit id
        st.sampled_from(["a", "b", "c", None]),  # quota label
        st.integers(0, 3),  # replicas
        st.sampled_from(["250m", "1", "1500m"]),
        st.booleans(),  # delete instead
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(events=_units)
def test_usage_always_equals_the_sum_over_present_units(
    events: list[tuple[int, str | None, int, str, bool]],
) -> None:
    ledger = _ledger(
        quota("a", parent="c", cpu="100"), quota("b", parent="c", cpu="100"), quota("c", cpu="100")
    )
    present: dict[str, Unit] = {}
    for ident, label, replicas, cpu, delete in events:
        key = f"default/u{ident}"
        if delete:
            ledger.delete_unit(key)
            present.pop(key, None)
            continue
        builder = unit(f"u{ident}").cpu(cpu, 3)
        if label:
            builder.quota(label)
        if replicas:
            builder.admitted(replicas)
        u = builder.build()
        ledger.apply(present.get(key), u)
        present[key] = u
    for name in ("a", "b"):
        expected: dict[str, int] = {}
        for u in present.values():
            if u.quota == name:
                for r, v in reserved_resources(u).items():
                    expected[r] = expected.get(r, 0) + v
        assert {r: v for r, v in ledger.used(name).items() if v} == expected
    total_c = {r: v for r, v in ledger.used("c").items() if v}
    sum_children = {
        r: ledger.used("a").get(r, 0) + ledger.used("b").get(r, 0) + ledger.self_used("c").get(r, 0)
        for r in ("cpu",)
    }
    assert total_c == {r: v for r, v in sum_children.items() if v}

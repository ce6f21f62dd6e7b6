"""Queue policies (Priority, Block, Intelligent), max-depth, queue positions (S14-S17), and the
incremental per-queue state checked against a from-scratch rebuild (property test)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import Message
from koord_queue.shared.core.policies import QueueState, beyond_depth_message, is_waiting
from koord_queue.shared.core.scheduling import BLOCK_STALE_SECONDS
from tests.unit.test_model import queue, quota, unit
from tests.unit.test_scheduling import World, admits, parked

# --- Priority vs Block ----------------------------------------------------------------------------


def _big_then_small(policy: str) -> World:
    w = World(quota("q", cpu="4"), queues=(queue("q").policy(policy),))
    w.add(unit("hold").quota("q").priority(9).cpu("3"))
    w.cycle()
    w.add(unit("big").quota("q").priority(5).cpu("2"), unit("small").quota("q").priority(1).cpu("1"))
    return w


def test_priority_lets_a_lower_unit_bypass_an_unschedulable_one() -> None:
    w = _big_then_small("Priority")
    plan = w.cycle()
    assert admits(plan) == ["small"]
    assert parked(plan, "big").message.startswith(Message.limited("q", "cpu"))  # type: ignore[union-attr]


def test_block_blocks_the_quota_until_a_release() -> None:
    w = _big_then_small("Block")
    plan = w.cycle()
    assert admits(plan) == []
    assert parked(plan, "big") is not None
    assert parked(plan, "small").message == Message.BLOCKED_BY_HIGHER  # type: ignore[union-attr]
    assert w.cache.state.queues["q"].blocked
    assert w.cycle().decisions == ()
    w.finish("hold")
    assert admits(w.cycle()) == ["big", "small"]


def test_block_is_lifted_by_an_add_or_a_delete_in_the_queue() -> None:
    w = _big_then_small("Block")
    w.cycle()
    w.add(unit("tiny").quota("q").priority(0).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []  # the head still fails and blocks again
    assert parked(plan, "tiny") is not None
    w.delete("big")
    assert admits(w.cycle()) == ["small"]


def test_a_stale_block_is_cleared_after_three_minutes() -> None:
    w = _big_then_small("Block")
    plan = w.cycle()
    assert plan.wake_at == w.now + BLOCK_STALE_SECONDS
    w.cycle(dt=BLOCK_STALE_SECONDS - 10)
    assert w.cache.state.queues["q"].blocked
    w.cycle(dt=20)
    state = w.cache.state.queues["q"]
    assert state.blocked  # cleared, the head re-examined and blocked again
    assert state.last_attempt_at == w.now


def test_a_release_in_a_shared_parent_unblocks_sibling_queues() -> None:
    w = World(
        quota("p", cpu="2"),
        quota("a", parent="p", cpu="2"),
        quota("b", parent="p", cpu="2"),
        queues=(queue("a").policy("Block"), queue("b")),
    )
    w.add(unit("b1").quota("b").cpu("2"))
    w.cycle()
    w.add(unit("a1").quota("a").cpu("1"))
    assert admits(w.cycle()) == []
    w.finish("b1")
    assert admits(w.cycle()) == ["a1"]


# --- Intelligent ----------------------------------------------------------------------------------


def _intelligent() -> World:
    return World(quota("q", cpu="3"), queues=(queue("q").policy("Intelligent").threshold(4),))


def test_intelligent_any_waiting_high_unit_blocks_all_low_units() -> None:
    w = _intelligent()
    w.add(unit("high").quota("q").priority(5).cpu("4"), unit("low").quota("q").priority(1).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []
    assert parked(plan, "high").message.startswith(Message.limited("q", "cpu"))  # type: ignore[union-attr]
    assert parked(plan, "low").message == Message.BLOCKED_BY_HIGHER  # type: ignore[union-attr]


def test_intelligent_low_units_go_once_no_high_unit_waits() -> None:
    w = _intelligent()
    w.add(unit("high").quota("q").priority(4).cpu("1"), unit("low").quota("q").priority(3).cpu("1"))
    assert admits(w.cycle()) == ["high", "low"]


def test_intelligent_orders_non_preemptible_before_preemptible() -> None:
    w = _intelligent()
    w.add(
        unit("pre").quota("q").priority(2).label(names.PREEMPTIBLE_LABEL, "true").created(1).cpu("1"),
        unit("keep").quota("q").priority(2).created(2).cpu("1"),
    )
    assert admits(w.cycle()) == ["keep", "pre"]


def _low_units_too_big(w: World, count: int) -> None:
    for i in range(count):
        w.add(unit(f"big-{i}").quota("q").priority(i % 4).created(i).cpu("4"))


def test_intelligent_low_units_that_do_not_fit_do_not_hold_back_a_later_low_unit() -> None:
    # Upstream polls the low sub-queue round-robin: a low unit that cannot fit does not stop the
    # low units behind it. One scan walks past all of them.
    w = _intelligent()
    _low_units_too_big(w, 30)
    w.add(unit("small").quota("q").priority(0).created(100).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == ["small"]
    for i in range(30):
        park = parked(plan, f"big-{i}")
        assert park is not None and park.message.startswith(Message.limited("q", "cpu")), i
    assert not w.cache.state.queues["q"].blocked
    assert w.cycle().decisions == ()  # the big ones wait for a release, not re-examined each cycle


def test_intelligent_a_small_low_unit_arriving_behind_parked_ones_is_admitted_at_once() -> None:
    w = _intelligent()
    _low_units_too_big(w, 30)
    assert admits(w.cycle()) == []
    w.add(unit("small").quota("q").priority(0).created(100).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == ["small"]
    assert plan.examined == 1  # the parked ones are skipped: nothing was released


def test_intelligent_a_high_unit_that_does_not_fit_still_blocks_the_queue() -> None:
    w = _intelligent()
    w.add(unit("high").quota("q").priority(5).cpu("4"), unit("high-small").quota("q").priority(4).cpu("1"))
    w.add(unit("low").quota("q").priority(1).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []
    assert w.cache.state.queues["q"].blocked


def test_intelligent_rejects_preemption() -> None:
    w = World(quota("q", cpu="1"), queues=(queue("q").policy("Intelligent").preemption(),))
    w.add(unit("low").quota("q").priority(1).cpu("1"))
    w.cycle()
    w.add(unit("high").quota("q").priority(9).cpu("1"))
    plan = w.cycle()
    park = parked(plan, "high")
    assert park is not None and park.message.endswith(Message.PREEMPT_FAILED_SUFFIX)
    assert park.preempt_error == "preemption not supported in intelligent queue yet"
    assert plan.marks == []


# --- max-depth ------------------------------------------------------------------------------------


def test_max_depth_caps_the_scan_and_says_so_once() -> None:
    w = World(quota("q", cpu="10"), queues=(queue("q").max_depth(2),))
    for i in range(4):
        w.add(unit(f"u{i}").quota("q").cpu("1"))
    hold = dataclasses.replace(w.cache.units["default/u0"], active=False)
    w.cache.put_unit(hold)
    plan = w.cycle()
    assert admits(plan) == ["u1"]  # u0 (inactive) and u1 are within depth 2
    assert parked(plan, "u2").message == beyond_depth_message("q", 2)  # type: ignore[union-attr]
    assert admits(w.cycle()) == ["u2"]  # u1 left the queue: u2 moved within depth


# --- positions (S14-S17) --------------------------------------------------------------------------


def _positions(w: World) -> dict[str, int]:
    return {str(d["name"]): int(d["position"]) for d in w.cache.queue_item_details("q")}  # type: ignore[call-overload]


def _nothing_fits(*prios: tuple[str, int]) -> World:
    w = World(quota("q", cpu="100m"), queues=(queue("q").policy("Intelligent").threshold(4),))
    for i, (name, p) in enumerate(prios):
        w.add(unit(name).quota("q").priority(p).created(i).cpu("1"))
    w.cycle()
    return w


def test_s14_high_sub_queue_positions() -> None:
    assert _positions(_nothing_fits(("job-1", 5), ("job-2", 4), ("job-3", 6))) == {
        "job-3": 1,
        "job-1": 2,
        "job-2": 3,
    }


def test_s15_low_sub_queue_positions() -> None:
    assert _positions(_nothing_fits(("job-1", 1), ("job-2", 3), ("job-3", 2))) == {
        "job-2": 1,
        "job-3": 2,
        "job-1": 3,
    }


def test_s17_the_threshold_priority_is_high() -> None:
    assert _positions(_nothing_fits(("above", 5), ("threshold", 4), ("below", 3))) == {
        "above": 1,
        "threshold": 2,
        "below": 3,
    }


def test_s16_high_then_low_numbered_continuously() -> None:
    w = _nothing_fits(("l1", 1), ("h1", 7), ("l2", 2), ("h2", 4))
    assert _positions(w) == {"h1": 1, "h2": 2, "l2": 3, "l1": 4}
    details = w.cache.queue_item_details("q")
    assert details[0] == {"name": "h1", "namespace": "default", "priority": 7, "position": 1}


def test_positions_list_only_waiting_units() -> None:
    w = World(quota("q", cpu="1"), queues=(queue("q"),))
    w.add(unit("in").quota("q").cpu("1"), unit("out").quota("q").cpu("1"))
    w.cycle()
    assert _positions(w) == {"out": 1}


def test_a_priority_change_moves_a_unit_between_sub_queues() -> None:
    w = _nothing_fits(("a", 1), ("b", 5))
    w.replace("a", priority=9)
    assert _positions(w) == {"a": 1, "b": 2}


def test_a_policy_change_rebuilds_the_order() -> None:
    w = _nothing_fits(("a", 1), ("b", 5))
    w.cache.put_queue(queue("q").policy("Priority").build())
    assert _positions(w) == {"b": 1, "a": 2}


# --- incremental state vs rebuild -----------------------------------------------------------------


_events = st.lists(
    st.tuples(
        st.integers(0, 7),  # which unit
        st.sampled_from(["add", "priority", "admit", "run", "inactive", "delete", "finish"]),
        st.integers(-2, 8),
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(events=_events, intelligent=st.booleans())
def test_incremental_state_matches_a_rebuild(events: list[tuple[int, str, int]], intelligent: bool) -> None:
    cfg = queue("q").policy("Intelligent" if intelligent else "Priority").threshold(3).build()
    state = QueueState(cfg)
    units: dict[str, Unit] = {}
    for ident, op, value in events:
        key = f"default/u{ident}"
        current = units.get(key)
        if op == "delete" or (current is None and op != "add"):
            if current is not None:
                state.remove(key)
                del units[key]
            continue
        if op == "add" or current is None:
            new = unit(f"u{ident}").quota("q").priority(value).created(ident).cpu("1", 2).build()
        elif op == "priority":
            new = dataclasses.replace(current, priority=value)
        elif op == "admit":
            builder = unit(f"u{ident}").quota("q").priority(current.priority).created(ident).cpu("1", 2)
            new = dataclasses.replace(builder.admitted(value % 3).build(), active=current.active)
        elif op == "run":
            new = dataclasses.replace(
                current,
                admissions=tuple(dataclasses.replace(a, running=a.replicas) for a in current.admissions),
            )
        elif op == "inactive":
            new = dataclasses.replace(current, active=not current.active)
        else:
            new = dataclasses.replace(current, phase=names.Phase.SUCCEED.value, admissions=())
        units[key] = new
        state.upsert(new)
    fresh = QueueState(cfg)
    for key in sorted(units):
        fresh.upsert(units[key])
    assert state.lanes == fresh.lanes
    assert state.assumed == fresh.assumed
    assert state.entries == fresh.entries
    assert state.demand.minimums() == fresh.demand.minimums()
    assert state.active_in_lane == fresh.active_in_lane
    assert set(state.entries) == {k for k, u in units.items() if is_waiting(u)}
    for lane in state.lanes:
        assert lane == sorted(lane)

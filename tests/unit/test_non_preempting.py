"""Non-preempting jobs (docs/compatibility.md#non-preempting-jobs): a unit whose
``spec.preemptionPolicy`` is ``Never`` waits for room, is still ordered by its priority, and marks no
victim on any path (queue-level preemption, the reserve path, reclaim across quotas); it holds a
Block queue exactly as a unit whose preemption failed does."""

from __future__ import annotations

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from koord_queue.shared.core.preemption import PREEMPTION_DISABLED, MarkVictims
from koord_queue.shared.core.reclaim import plan_reclaim
from koord_queue.shared.core.usage import UsageView
from tests.unit.test_guarantees import eq, jobs, settle, tree
from tests.unit.test_model import UnitBuilder, queue, quota, unit
from tests.unit.test_scheduling import World, admits, parked


def never(builder: UnitBuilder) -> UnitBuilder:
    builder.spec["preemptionPolicy"] = names.PREEMPTION_POLICY_NEVER
    return builder


def _low_admitted(q: str = "q", *, cpu: str = "2") -> World:
    w = World(quota(q, cpu=cpu), queues=(queue(q).preemption(),))
    w.add(unit("low").quota(q).priority(10).cpu("2"))
    assert admits(w.cycle()) == ["low"]
    return w


def test_the_policy_is_parsed() -> None:
    assert never(unit("a")).build().preempts is False
    assert unit("a").build().preempts is True
    explicit = unit("a")
    explicit.spec["preemptionPolicy"] = names.PREEMPTION_POLICY_PREEMPT
    assert explicit.build().preempts is True
    odd = unit("a")
    odd.spec["preemptionPolicy"] = "Sometimes"
    built = odd.build()
    assert built.preempts is True and any("spec.preemptionPolicy" in p for p in built.problems)


def test_the_preempt_path_marks_nobody_and_says_so() -> None:
    w = _low_admitted()
    w.add(never(unit("high").quota("q").priority(100).cpu("2")))
    plan = w.cycle()
    assert plan.marks == [] and admits(plan) == []
    park = parked(plan, "high")
    assert park is not None
    assert park.message == Message.limited("q", "cpu") + names.NON_PREEMPTING_SUFFIX
    assert park.preempt_error == names.NON_PREEMPTING_ERROR
    # Room comes: it is admitted, ahead of a lower unit that waited longer (ordered by priority).
    w.add(unit("mid").quota("q").priority(50).cpu("2").created(-100))
    w.run("low")
    w.finish("low")
    assert admits(w.cycle()) == ["high"]


def test_the_same_unit_allowed_to_preempt_marks_the_victim() -> None:
    w = _low_admitted()
    w.add(unit("high").quota("q").priority(100).cpu("2"))
    plan = w.cycle()
    assert [v.name for m in plan.marks for v in m.victims] == ["low"]


def test_the_reserve_path_marks_nobody_and_says_so() -> None:
    w = _low_admitted(cpu="4")
    w.add(never(unit("high").quota("q").priority(100).cpu("1")))
    plan = w.cycle()
    assert plan.marks == [] and admits(plan) == []
    park = parked(plan, "high")
    assert park is not None and park.message == Message.NO_MORE_IN_QUEUE + names.NON_PREEMPTING_SUFFIX
    # The low unit's pods run: the queue is free, and it is admitted.
    w.run("low")
    assert admits(w.cycle()) == ["high"]


def test_a_preempting_unit_behind_a_non_preempting_one_still_preempts() -> None:
    w = _low_admitted()
    w.add(
        never(unit("first").quota("q").priority(100).cpu("2")),
        unit("second").quota("q").priority(50).cpu("2"),
    )
    plan = w.cycle()
    assert [v.name for m in plan.marks for v in m.victims] == ["low"]
    assert [m.preemptor for m in plan.marks] == ["default/second"]
    first = parked(plan, "first")
    assert first is not None and first.message.endswith(names.NON_PREEMPTING_SUFFIX)


@pytest.mark.parametrize("how", ["never", "failed"])
def test_a_block_queue_is_held_alike_by_a_non_preempting_and_a_failed_preemptor(how: str) -> None:
    """Block: a unit that cannot be admitted holds the units behind it whether it does not preempt
    or its preemption failed (here: preemption is off in the queue)."""
    q = queue("q").policy("Block").wait_for_pods_running()
    if how == "never":
        q = q.preemption()
    w = World(quota("q", cpu="3"), queues=(q,))
    w.add(unit("low").quota("q").priority(10).cpu("2"))
    assert admits(w.cycle()) == ["low"]
    head = unit("head").quota("q").priority(100).cpu("2")
    w.add(never(head) if how == "never" else head, unit("small").quota("q").priority(5).cpu("1"))
    w.run("low")
    plan = w.cycle(dt=5)
    assert admits(plan) == [] and plan.marks == []
    park, small = parked(plan, "head"), parked(plan, "small")
    expected = names.NON_PREEMPTING_ERROR if how == "never" else PREEMPTION_DISABLED
    assert park is not None and park.preempt_error == expected
    assert small is not None and small.message == Message.BLOCKED_BY_HIGHER
    assert w.cache.state.queues["q"].blocked
    for _ in range(2):  # nothing changed: not tried again, the queue stays blocked
        plan = w.cycle(dt=5)
        assert not plan.decisions and w.cache.state.queues["q"].blocked


def test_an_unchanged_failure_is_not_tried_again() -> None:
    w = _low_admitted()
    w.add(never(unit("high").quota("q").priority(100).cpu("2")))
    w.cycle()
    plan = w.cycle()
    assert plan.marks == [] and parked(plan, "high") is None  # skipped: nothing changed


def test_reclaim_across_quotas_takes_nothing_for_a_non_preempting_unit() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "a", 10, priority=1)
    settle(w)
    w.add(never(unit("b-50").quota("b").cpu("1")))
    plan = w.cycle()
    assert [m for m in plan.decisions if isinstance(m, MarkVictims)] == []
    park = parked(plan, "b-50")
    assert park is not None and park.message.endswith(names.NON_PREEMPTING_SUFFIX)
    view = UsageView(w.cache.ledger)
    queues = w.cache.state.queues
    found = plan_reclaim(
        {"cpu": 1000}, "b", view=view, units=w.cache.units, queues=queues, now=w.now, protect=0
    )
    assert found is not None and found.victims  # allowed to preempt, it would reclaim
    assert (
        plan_reclaim(
            {"cpu": 1000},
            "b",
            view=view,
            units=w.cache.units,
            queues=queues,
            now=w.now,
            protect=0,
            preempts=False,
        )
        is None
    )

"""Quota guarantees (docs/compatibility.md#quota-guarantees): ``min`` honoured, borrowing and
lending between siblings, shares by weight, and reclaim across quotas
(docs/compatibility.md#reclaim-across-quotas).

Decision-level tables on the scheduler's own :class:`Cache` (the ``World`` harness of
``test_scheduling``), then hypothesis properties over random trees and workloads: no admission
ever exceeds ``max`` at any level, no borrowing admission takes capacity a sibling's waiting work
is guaranteed, reclaim never picks a running replica nor takes a sibling below its ``min``, and
with ``min == max`` everywhere the decisions equal the max-only (upstream) ones.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names, parsing
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.names import Message
from koord_queue.shared.core import guarantees
from koord_queue.shared.core.preemption import MarkVictims
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_model import queue, unit
from tests.unit.test_scheduling import World, admits, parked


def eq(
    name: str,
    *,
    min_cpu: str = "0",
    max_cpu: str = "10",
    parent: str = "",
    lends: bool = True,
    weight: str | None = None,
    is_parent: bool = False,
) -> Quota:
    labels: dict[str, str] = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    if not lends:
        labels[names.QUOTA_ALLOW_LENT_LABEL] = "false"
    if is_parent:
        labels[names.QUOTA_IS_PARENT_LABEL] = "true"
    annotations = {names.QUOTA_SHARED_WEIGHT_ANNOTATION: json.dumps({"cpu": weight})} if weight else {}
    return parsing.parse_quota(
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": annotations},
            "spec": {"min": {"cpu": min_cpu}, "max": {"cpu": max_cpu}},
        }
    )


def tree(
    *children: Quota, parent_cpu: str = "10", guarantees_on: bool = True, half_life: float = 0.0
) -> World:
    """A parent quota ``p`` (min = max = ``parent_cpu``) with ``children``, one queue each (usage
    history on with a ``half_life``, docs/compatibility.md#fair-over-time)."""
    w = World(queues=tuple(queue(c.name) for c in children))
    w.cache = Cache(quota_guarantees=guarantees_on, usage_half_life=half_life)
    w.cache.put_quota(eq("p", min_cpu=parent_cpu, max_cpu=parent_cpu, is_parent=True))
    for c in children:
        w.cache.put_quota(dataclasses.replace(c, parent="p"))
    for c in children:
        w.cache.put_queue(queue(c.name).build())
    return w


def jobs(
    w: World, quota_name: str, count: int, *, cpu: str = "1", priority: int = 0, start: int = 0
) -> list[str]:
    made = [f"{quota_name}-{i:02}" for i in range(start, start + count)]
    for i, name in enumerate(made):
        w.add(unit(name).quota(quota_name).priority(priority).created(float(start + i)).cpu(cpu))
    return made


def used(w: World, name: str) -> int:
    return w.cache.ledger.used(name).get("cpu", 0) // 1000


def settle(w: World, rounds: int = 6) -> list[str]:
    """Run cycles until nothing is admitted any more; the admitted names in order."""
    out: list[str] = []
    for _ in range(rounds):
        got = admits(w.cycle())
        if not got:
            break
        out.extend(got)
    return out


# --- water-filling ----------------------------------------------------------------------------------


def test_water_fill_divides_in_proportion_and_gives_back_what_a_small_asker_leaves() -> None:
    assert guarantees.water_fill(9, [("a", 9, 1), ("b", 9, 1), ("c", 9, 1)]) == {"a": 3, "b": 3, "c": 3}
    assert guarantees.water_fill(8, [("a", 9, 2), ("b", 9, 1), ("c", 9, 1)]) == {"a": 4, "b": 2, "c": 2}
    assert guarantees.water_fill(9, [("a", 1, 1), ("b", 9, 1), ("c", 9, 1)]) == {"a": 1, "b": 4, "c": 4}
    assert guarantees.water_fill(5, [("a", 9, 0), ("b", 2, 1)]) == {"a": 3, "b": 2}
    assert guarantees.water_fill(0, [("a", 9, 1)]) == {"a": 0}


@given(
    cap=st.integers(0, 50_000),
    asks=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 5_000)), min_size=1, max_size=8),
)
def test_water_fill_never_exceeds_a_want_and_hands_out_all_it_can(
    cap: int, asks: list[tuple[int, int]]
) -> None:
    named = [(f"q{i}", want, w) for i, (want, w) in enumerate(asks)]
    out = guarantees.water_fill(cap, named)
    assert all(0 <= out[n] <= want for n, want, _ in named)
    assert sum(out.values()) == min(cap, sum(want for _, want, _ in named))


# --- borrowing, lending, guarantees ---------------------------------------------------------------


def test_a_quota_borrows_what_an_idle_sibling_lends() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "a", 10)
    assert len(settle(w)) == 10
    assert used(w, "a") == 10


def test_a_sibling_that_does_not_lend_keeps_its_min() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5", lends=False))
    jobs(w, "a", 10)
    assert len(settle(w)) == 5
    last = parked(w.cycle(apply=False), "a-05")
    assert last is None or "held for sibling quotas" in last.message
    assert "held for sibling quotas" in w.u("a-05").message or used(w, "a") == 5


def test_a_returning_sibling_reclaims_its_min_from_a_borrower_that_is_not_running() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    borrowed = jobs(w, "a", 10, priority=1)
    settle(w)
    for name in borrowed[:5]:
        w.run(name)  # within a's min: running
    jobs(w, "b", 3, start=50)
    plan = w.cycle()
    marks = [m for m in plan.decisions if isinstance(m, MarkVictims)]
    victims = [v.key.split("/")[1] for m in marks for v in m.victims]
    # Lowest priority first, then newest; only what the shortfall needs, never a running one.
    assert victims == ["a-09", "a-08", "a-07"]
    assert all(m.path == "guarantee" and m.queue == "a" for m in marks)
    park = parked(plan, "b-50")
    assert park is not None and "reclaiming borrowed quota from a" in park.message
    for name in victims:
        w.reclaim(name)
    assert sorted(settle(w)) == ["b-50", "b-51", "b-52"]
    assert used(w, "a") == 7 and used(w, "b") == 3


def test_a_running_borrower_is_left_alone_and_the_guarantee_is_met_as_it_finishes() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    borrowed = jobs(w, "a", 10)
    settle(w)
    for name in borrowed:
        w.run(name)
    jobs(w, "a", 2, start=20)  # a keeps asking: it must not get b's share back
    jobs(w, "b", 2, start=50)
    plan = w.cycle()
    assert not plan.marks
    park = parked(plan, "b-50")
    assert park is not None and "waiting for a to return borrowed quota" in park.message
    w.finish("a-00")
    assert admits(w.cycle()) == ["b-50"]
    w.finish("a-01")
    assert admits(w.cycle()) == ["b-51"]
    w.finish("a-02")
    w.finish("a-03")
    # b asks for nothing more: a borrows again what b does not use of its min.
    assert admits(w.cycle()) == ["a-20", "a-21"]
    assert used(w, "a") == 8 and used(w, "b") == 2


def test_three_siblings_share_spare_capacity_by_weight() -> None:
    w = tree(eq("a", weight="2"), eq("b", weight="1"), eq("c", weight="1"), parent_cpu="8")
    for name in ("a", "b", "c"):
        jobs(w, name, 8)
    settle(w)
    assert (used(w, "a"), used(w, "b"), used(w, "c")) == (4, 2, 2)


def test_equal_weights_default_to_max_and_nobody_is_starved() -> None:
    w = tree(eq("a"), eq("b"), eq("c"), parent_cpu="9")
    for name in ("c", "b", "a"):
        jobs(w, name, 9)
    settle(w)
    assert (used(w, "a"), used(w, "b"), used(w, "c")) == (3, 3, 3)


def test_a_unit_larger_than_its_share_lets_siblings_use_the_share_rather_than_idle() -> None:
    w = tree(eq("a", min_cpu="2"), eq("b", min_cpu="2"))
    jobs(w, "a", 10)
    w.add(unit("big").quota("b").cpu("7"))
    settle(w)
    assert used(w, "a") == 10 and used(w, "b") == 0
    assert "big" not in admits(w.cycle())


def test_a_guaranteed_unit_is_admitted_at_once_when_the_parent_has_room() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "a", 6)
    assert len(settle(w)) == 6
    jobs(w, "b", 4, start=50)
    assert admits(w.cycle()) == ["b-50", "b-51", "b-52", "b-53"]


def test_a_borrower_never_takes_what_a_waiting_sibling_is_guaranteed() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "b", 5)
    jobs(w, "a", 10, start=20)
    settle(w)
    assert used(w, "b") == 5 and used(w, "a") == 5


def test_switch_off_restores_max_only_admission() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5", lends=False), guarantees_on=False)
    jobs(w, "a", 10)
    assert len(settle(w)) == 10
    jobs(w, "b", 2, start=50)
    plan = w.cycle()
    assert not plan.marks and admits(plan) == []
    park = parked(plan, "b-50")
    assert park is not None and park.message.startswith(Message.limited("p", "cpu"))


def test_a_parent_quota_takes_no_jobs() -> None:
    w = tree(eq("a", min_cpu="5"))
    w.cache.put_queue(queue("p").build())
    w.add(unit("direct").quota("p").cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []
    park = parked(plan, "direct")
    assert park is not None and park.message == Message.parent_quota("p")


def test_runtime_and_request_are_published_figures() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    jobs(w, "a", 3)
    w.cycle(apply=False)
    assert w.cache.state.requests["a"] == {"cpu": 3000}
    assert w.cache.state.runtime["a"] == {"cpu": 3000}
    assert w.cache.state.guaranteed["a"] == {"cpu": 3000}


# --- properties -------------------------------------------------------------------------------------

_CHILD = st.tuples(st.integers(0, 4), st.integers(0, 6), st.booleans(), st.integers(1, 3))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[tuple[int, int, bool, int]], int, list[tuple[int, int, int]]]:
    children = draw(st.lists(_CHILD, min_size=2, max_size=4))
    parent = draw(st.integers(2, 10))
    mins = [c[0] for c in children]
    if sum(mins) > parent:  # the webhook refuses a tree whose children's min exceed the parent's
        children = [(0, mx, lends, wgt) for (_, mx, lends, wgt) in children]
    work = draw(
        st.lists(
            st.tuples(st.integers(0, len(children) - 1), st.integers(1, 3), st.integers(0, 2)), max_size=16
        )
    )
    return children, parent, work


def _build(spec: list[tuple[int, int, bool, int]], parent: int, *, on: bool) -> World:
    kids = [
        eq(f"c{i}", min_cpu=str(mn), max_cpu=str(mn + extra), lends=lends, weight=str(wgt))
        for i, (mn, extra, lends, wgt) in enumerate(spec)
    ]
    return tree(*kids, parent_cpu=str(parent), guarantees_on=on)


@settings(max_examples=150, deadline=None)
@given(worlds(), st.data())
def test_no_level_exceeds_max_and_no_borrower_takes_a_waiting_sibling_s_guarantee(
    world: tuple[list[tuple[int, int, bool, int]], int, list[tuple[int, int, int]]], data: st.DataObject
) -> None:
    spec, parent, work = world
    w = _build(spec, parent, on=True)
    for n, (child, cpu, prio) in enumerate(work):
        w.add(unit(f"j{n:02}").quota(f"c{child}").priority(prio).created(float(n)).cpu(str(cpu)))
        for _ in range(3):
            before = {f"c{i}": used(w, f"c{i}") for i in range(len(spec))}
            plan = w.cycle()
            _check_plan(w, spec, parent, before, plan)
            if data.draw(st.booleans()):
                for key in sorted(w.cache.units):
                    u = w.cache.units[key]
                    if any(a.reclaim_replicas for a in u.admissions):
                        w.reclaim(u.name)  # the job extension deleted the unbound pods
                    elif u.admissions and data.draw(st.booleans()):
                        w.run(u.name)


def _check_plan(
    w: World, spec: list[tuple[int, int, bool, int]], parent: int, before: dict[str, int], plan: object
) -> None:
    total = sum(used(w, f"c{i}") for i in range(len(spec)))
    assert total <= parent, "the parent's max is never exceeded"
    for i, (mn, extra, _, _) in enumerate(spec):
        assert used(w, f"c{i}") <= mn + extra, "a child's max is never exceeded"
    borrowed_now = [
        f"c{i}" for i, (mn, _, _, _) in enumerate(spec) if used(w, f"c{i}") > max(mn, before[f"c{i}"])
    ]
    if not borrowed_now:
        return
    # Every sibling's waiting work that fits within its min still fits in what is left.
    free = parent - total
    claimed = 0
    for i, (mn, _, lends, _) in enumerate(spec):
        name = f"c{i}"
        if name in borrowed_now:
            continue
        # The waiting work a min can serve: its units that fit in what is left of it, smallest first.
        room = max(0, mn - used(w, name))
        sizes = sorted(
            u.resource.get("cpu", 0) // 1000
            for u in w.cache.units.values()
            if u.quota == name and not u.admissions
        )
        served = 0
        for size in sizes:
            if served + size <= room:
                served += size
        claimed += served if lends else room
    assert claimed <= free, f"{borrowed_now} borrowed into capacity siblings are guaranteed"
    pending_reclaim: dict[str, int] = {}
    for u in w.cache.units.values():
        for a in u.admissions:
            if a.reclaim_replicas:
                assert a.reclaim_replicas <= a.replicas - a.running, "a running replica is never reclaimed"
                pending_reclaim[u.quota] = pending_reclaim.get(u.quota, 0) + a.reclaim_replicas * (
                    u.resource.get("cpu", 0) // 1000 // max(a.replicas, 1)
                )
    for i, (mn, _, _, _) in enumerate(spec):
        name = f"c{i}"
        if pending_reclaim.get(name):
            assert used(w, name) - pending_reclaim[name] >= mn, f"reclaim takes {name} below its min"


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_with_min_equal_to_max_everywhere_decisions_equal_max_only_admission(
    world: tuple[list[tuple[int, int, bool, int]], int, list[tuple[int, int, int]]],
) -> None:
    spec, parent, work = world
    flat = [(mn + extra, 0, lends, wgt) for (mn, extra, lends, wgt) in spec]
    ours, upstream = _build(flat, parent, on=True), _build(flat, parent, on=False)
    for n, (child, cpu, prio) in enumerate(work):
        for w in (ours, upstream):
            w.add(unit(f"j{n:02}").quota(f"c{child}").priority(prio).created(float(n)).cpu(str(cpu)))
        assert admits(ours.cycle()) == admits(upstream.cycle())


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_without_an_oversubscribed_parent_decisions_equal_max_only_admission(
    world: tuple[list[tuple[int, int, bool, int]], int, list[tuple[int, int, int]]],
) -> None:
    spec, _, work = world
    parent = sum(mn + extra for (mn, extra, _, _) in spec)  # the children's max all fit
    ours, upstream = _build(spec, parent, on=True), _build(spec, parent, on=False)
    for n, (child, cpu, prio) in enumerate(work):
        for w in (ours, upstream):
            w.add(unit(f"j{n:02}").quota(f"c{child}").priority(prio).created(float(n)).cpu(str(cpu)))
        assert admits(ours.cycle()) == admits(upstream.cycle())


def test_units_arriving_one_by_one_mark_one_victim_each_and_never_count_twice() -> None:
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    borrowed = []
    for i in range(10):
        borrowed += jobs(w, "a", 1, start=i)
        w.cycle()
    for name in borrowed[:6]:
        w.run(name)
    w.cycle()
    marked: list[str] = []
    for i in range(3):
        jobs(w, "b", 1, start=50 + i)
        marked += [v.key.split("/")[1] for m in w.cycle().marks for v in m.victims]
    for _ in range(3):
        marked += [v.key.split("/")[1] for m in w.cycle().marks for v in m.victims]
    assert marked == ["a-09", "a-08", "a-07"]


# --- the facts the tree policy reads --------------------------------------------------------------


def test_tree_data_lists_parents_mins_sums_and_flat_families() -> None:
    from koord_queue.shared.core import quotaqueues

    quotas = [
        eq("p", min_cpu="10", max_cpu="10", is_parent=True),
        eq("a", min_cpu="4", parent="p"),
        eq("b", min_cpu="500m", parent="p"),
        eq("f", min_cpu="10", max_cpu="10"),
        eq("x", min_cpu="10", max_cpu="10", parent="f"),
        eq("y", min_cpu="10", max_cpu="10", parent="f"),
    ]
    data = quotaqueues.tree_data(quotas)
    assert data["guarantees"] == "true"
    assert data["parent_p"] == "true" and "parent_a" not in data
    assert data["up_a"] == "p" and "up_p" not in data
    assert data["min_a_cpu"] == "4000m" and data["min_b_cpu"] == "500m"
    assert data["sum_p_cpu"] == "4500m" and data["sum_f_cpu"] == "20000m"
    assert data["flat_f"] == "true" and data["flat_p"] == "false"
    assert quotaqueues.tree_data(quotas, guarantees=False)["guarantees"] == "false"
    gpu = dataclasses.replace(quotas[1], min={"nvidia.com/gpu": 2000})
    assert quotaqueues.tree_data([gpu])["min_a_nvidia.com..gpu"] == "2000m"


def test_a_resource_min_does_not_name_does_not_stop_a_guaranteed_unit() -> None:
    """Pods that also ask for memory, under a min naming only cpu: the cpu claim still holds, for
    admission and for reclaim (memory is not what is short)."""
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    for q in ("p", "a", "b"):  # the parent limits memory too
        limits = {"cpu": 10_000, "memory": 10**12}
        w.cache.put_quota(dataclasses.replace(w.cache.ledger.quotas[q], max=limits))
    borrowed = [f"a-{i:02}" for i in range(10)]
    for i, name in enumerate(borrowed):
        w.add(unit(name).quota("a").created(float(i)).podset(name, 1, cpu="1", memory="64Mi"))
    settle(w)
    assert used(w, "a") == 10
    w.add(unit("b-50").quota("b").created(50.0).podset("b-50", 1, cpu="1", memory="64Mi"))
    plan = w.cycle()
    assert [v.key for m in plan.marks for v in m.victims] == ["default/a-09"]
    w.reclaim("a-09")
    assert admits(w.cycle()) == ["b-50"]


# --- read back by kubectl koord-queue explain --------------------------------------------------------


def test_the_guarantee_texts_are_read_back_as_their_own_reasons() -> None:
    from koord_queue.shared.core import reasons
    from koord_queue.shared.core.reasons import Reason

    share = Message.share_limited("a", "p", "cpu") + Message.PREEMPT_FAILED_SUFFIX
    assert reasons.classify(share, "a") == reasons.Classified(Reason.SHARE, "a", "cpu", "failed")
    claim = Message.limited("p", "cpu") + Message.guarantee_reclaiming(["a"])
    assert reasons.classify(claim, "b") == reasons.Classified(Reason.GUARANTEE, "p", "cpu")
    waiting = Message.limited("p", "cpu") + Message.guarantee_waiting(["a"])
    assert reasons.classify(waiting, "b") == reasons.Classified(Reason.GUARANTEE, "p", "cpu")
    assert reasons.classify(Message.parent_quota("p"), "p") == reasons.Classified(Reason.PARENT_ONLY, "p")


# --- exact guarantees (docs/compatibility.md#quota-guarantees) --------------------------------------


def test_rounding_a_share_to_whole_units_never_cuts_it_below_the_min() -> None:
    """a's smallest waiting unit is 2 cpu, so a share of 5 used to be rounded down to 4 and the
    3-cpu unit, which fits a's min of 5 together with the 2-cpu one, was refused while b borrowed."""
    w = tree(eq("a", min_cpu="5"), eq("b", min_cpu="5"))
    w.add(unit("a-2").quota("a").created(1.0).cpu("2"))
    w.add(unit("a-3").quota("a").created(2.0).cpu("3"))
    w.add(unit("a-4").quota("a").created(3.0).cpu("4"))
    jobs(w, "b", 8, start=10)
    got = admits(w.cycle())
    assert "a-2" in got and "a-3" in got
    assert used(w, "a") == 5 and used(w, "b") == 5


def _mem_tree(a_max: dict[str, int], b_max: dict[str, int]) -> World:
    w = tree(eq("a"), eq("b"))
    parent = {"cpu": 10_000, "memory": 10 * 2**30 * 1000}
    w.cache.put_quota(dataclasses.replace(w.cache.ledger.quotas["p"], min=parent, max=parent))
    w.cache.put_quota(dataclasses.replace(w.cache.ledger.quotas["a"], max=a_max))
    w.cache.put_quota(dataclasses.replace(w.cache.ledger.quotas["b"], max=b_max))
    return w


def test_a_resource_absent_from_a_child_s_max_is_weighted_in_that_resource_s_scale() -> None:
    """a names no memory in its max (unlimited there); b's memory weight is 10Gi. a used to be
    weighted one unit of memory against b's 10Gi, got no memory share, and so no cpu either."""
    w = _mem_tree({"cpu": 10_000}, {"cpu": 10_000, "memory": 10 * 2**30 * 1000})
    for q in ("a", "b"):
        for i in range(10):
            w.add(unit(f"{q}-{i}").quota(q).created(float(i)).podset(f"{q}-{i}", 1, cpu="1", memory="1Gi"))
    settle(w)
    assert used(w, "a") == 5 and used(w, "b") == 5


def test_a_child_whose_units_fit_no_share_leaves_it_to_a_sibling_whose_unit_fits() -> None:
    """a's two units are each small on one resource and large on the other: per resource its
    smallest request fits its share, yet no unit does. The share must go to b, not idle."""
    w = _mem_tree({"cpu": 10_000, "memory": 10 * 2**30 * 1000}, {"cpu": 10_000, "memory": 10 * 2**30 * 1000})
    w.add(unit("a-wide").quota("a").created(1.0).podset("a-wide", 1, cpu="6", memory="1Gi"))
    w.add(unit("a-tall").quota("a").created(2.0).podset("a-tall", 1, cpu="1", memory="6Gi"))
    for i in range(2):
        w.add(unit(f"b-{i}").quota("b").created(3.0 + i).podset(f"b-{i}", 1, cpu="5", memory="5Gi"))
    assert sorted(settle(w)) == ["b-0", "b-1"]


def test_a_queue_s_least_units_are_judged_whole_not_per_resource() -> None:
    """``Demand.floors`` keeps every waiting unit no other one is below on every resource: a wide
    and a tall unit both stay (per-resource minimums would invent a unit that is small on both)."""
    from koord_queue.shared.core.charges import Demand, smallest_units

    demand = Demand()
    wide, tall, big = (
        {"cpu": 6000, "memory": 1000},
        {"cpu": 1000, "memory": 6000},
        {"cpu": 7000, "memory": 7000},
    )
    for request in (wide, tall, big, wide):
        demand.add(request)
    assert demand.floors() == (tall, wide)
    assert demand.minimums() == {"cpu": 1000, "memory": 1000}
    demand.remove(tall)
    assert demand.floors() == (wide,)
    assert smallest_units([{"cpu": 0, "memory": 5}, {"memory": 5}, {"memory": 7}]) == ({"memory": 5},)

"""Queue-level preemption: the preemption example (docs/compatibility.md#preemption-example), the
troubleshooting table (docs/operations.md#preemption-not-happening), scenarios S3-S5
(docs/compatibility.md#s3-filter-path-preemption), the victim rules, one round per queue, capacity on
the way (docs/architecture.md#decision-4-asynchronous-preemption), and property tests."""

from __future__ import annotations

import copy

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import quantities
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import Message
from koord_queue.shared.api.predicates import expected_pod_sets
from koord_queue.shared.core.ordering import priority_key
from koord_queue.shared.core.policies import RECLAIM_TIMEOUT, is_waiting
from koord_queue.shared.core.preemption import (
    NO_VICTIMS,
    PREEMPTION_DISABLED,
    PREEMPTION_NEEDS_WAIT,
    MarkVictims,
    Reclaimable,
    reclaimable,
)
from koord_queue.shared.core.scheduling import Admit, Park, Plan
from tests.unit.test_model import BASE_TIME, QueueBuilder, queue, quota, unit
from tests.unit.test_scheduling import World, admits, parked


def _marked(plan: Plan) -> dict[str, dict[str, int]]:
    return {v.key.split("/", 1)[1]: dict(v.reclaim) for m in plan.marks for v in m.victims}


def _example_world(q: QueueBuilder, *, cpu: str = "2", protect: float = 0.0) -> World:
    w = World(quota("team-a", cpu=cpu, memory="8Gi"), queues=(q,), protect=protect)
    w.add(unit("low-priority-job").quota("team-a").priority(10).cpu("2"))
    assert admits(w.cycle()) == ["low-priority-job"]
    return w


# --- the preemption example and S3: the preempt path ---------------------------------------------


def test_the_preemption_example_and_s3_filter_path_preemption() -> None:
    w = _example_world(queue("team-a").preemption())
    w.add(unit("high-priority-job").quota("team-a").priority(100).cpu("2"))
    # Step 2: the quota is exhausted, the low unit is marked, the preemptor waits.
    plan = w.cycle()
    assert _marked(plan) == {"low-priority-job": {"low-priority-job": 1}}
    (mark,) = plan.marks
    assert (mark.preemptor, mark.path, mark.message) == (
        "default/high-priority-job",
        "preempt",
        Message.RECLAIMING,
    )
    park = parked(plan, "high-priority-job")
    assert park is not None
    assert park.message == Message.limited("team-a", "cpu") + Message.PREEMPT_SUCCEED_SUFFIX
    low = w.u("low-priority-job")
    assert low.admissions[0].reclaim_replicas == 1 and low.message == Message.RECLAIMING
    # Requeued while the victim is reclaimed: no further marking, and not admitted.
    plan = w.cycle()
    assert admits(plan) == [] and plan.marks == []
    # Step 3: the job extension reclaims; step 4: the preemptor is admitted.
    assert w.reclaim("low-priority-job") is True
    plan = w.cycle()
    assert admits(plan) == ["high-priority-job"]
    low_park = parked(plan, "low-priority-job")
    assert low_park is not None and low_park.message.endswith(Message.PREEMPT_FAILED_SUFFIX)
    assert w.cache.ledger.used("team-a") == {"cpu": 2000}


def test_the_preemptor_stays_enqueued_until_the_freed_quota_is_reported() -> None:
    w = _example_world(queue("team-a").preemption())
    w.add(unit("high-priority-job").quota("team-a").priority(100).cpu("2"))
    w.cycle()
    for _ in range(3):
        assert admits(w.cycle(dt=30)) == []


# --- S4, S5: the reserve path ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["Priority", "Block"])
def test_s4_reserve_path_marks_then_admits_without_waiting_for_reclaim(policy: str) -> None:
    w = _example_world(queue("team-a").policy(policy).preemption(), cpu="4")
    w.add(unit("high").quota("team-a").priority(100).cpu("1"))
    plan = w.cycle()
    assert _marked(plan) == {"low-priority-job": {"low-priority-job": 1}}
    assert plan.marks[0].path == "reserve"
    park = parked(plan, "high")
    assert park is not None and park.message == Message.waiting_for_victims(["low-priority-job"])
    assert admits(w.cycle()) == ["high"]
    assert w.cache.state.configs["team-a"].policy == policy


def test_s5_the_victim_is_readmitted_after_its_reclaim() -> None:
    w = _example_world(queue("team-a").preemption(), cpu="4")
    w.add(unit("high").quota("team-a").priority(100).cpu("1"))
    w.cycle()
    assert admits(w.cycle()) == ["high"]
    w.run("high")
    assert w.reclaim("low-priority-job") is True
    assert admits(w.cycle()) == ["low-priority-job"]
    low = w.u("low-priority-job")
    assert low.admissions[0].replicas == 1 and low.admissions[0].reclaim_replicas is None


def test_reserve_path_works_with_wait_for_pods_running_alone() -> None:
    w = _example_world(queue("team-a").wait_for_pods_running(), cpu="4")
    w.add(unit("high").quota("team-a").priority(100).cpu("1"))
    assert _marked(w.cycle()) == {"low-priority-job": {"low-priority-job": 1}}


# --- the troubleshooting table (docs/operations.md#preemption-not-happening) -------------------------


def test_no_wait_for_pods_running_means_no_victim() -> None:
    w = _example_world(queue("team-a").annotate("koord-queue/enable-queueunit-preemption", "true"))
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    plan = w.cycle()
    assert plan.marks == []
    assert parked(plan, "high").preempt_error == PREEMPTION_NEEDS_WAIT  # type: ignore[union-attr]


def test_no_enable_preemption_means_no_preempt_path() -> None:
    w = _example_world(queue("team-a").wait_for_pods_running())
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    plan = w.cycle()
    assert plan.marks == []
    park = parked(plan, "high")
    assert park is not None and park.message.endswith(Message.PREEMPT_FAILED_SUFFIX)
    assert park.preempt_error == PREEMPTION_DISABLED


def test_a_job_whose_pods_all_run_is_never_a_victim() -> None:
    w = _example_world(queue("team-a").preemption())
    w.run("low-priority-job")
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    plan = w.cycle()
    assert plan.marks == []
    assert parked(plan, "high").preempt_error == NO_VICTIMS  # type: ignore[union-attr]


def test_a_fresh_admission_is_protected_then_becomes_a_victim() -> None:
    w = _example_world(queue("team-a").preemption(), protect=300)
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    plan = w.cycle(dt=10)
    assert plan.marks == []
    assert plan.wake_at is not None
    w.now = plan.wake_at - 1
    plan = w.cycle(dt=2)  # past the protect time: the timer rescans the queue
    assert _marked(plan) == {"low-priority-job": {"low-priority-job": 1}}


def test_reclaimable_honours_the_rules() -> None:
    base = unit("v").cpu("1", 3)
    assert reclaimable(base.admitted(3, 1).build(), now=BASE_TIME, protect=0) is not None
    found = reclaimable(unit("v").cpu("1", 3).admitted(3, 1).build(), now=BASE_TIME, protect=0)
    assert found is not None and found.reclaim == {"v": 2} and found.resources == {"cpu": 2000}
    assert reclaimable(unit("v").cpu("1").admitted(1, 1).build(), now=BASE_TIME, protect=0) is None
    assert reclaimable(unit("v").cpu("1").admitted(1, 0, reclaim=1).build(), now=BASE_TIME, protect=0) is None
    young = unit("v").cpu("1").admitted(1).allocated_at(0).build()
    assert reclaimable(young, now=BASE_TIME + 59, protect=60) is None
    assert reclaimable(young, now=BASE_TIME + 60, protect=60) is not None


# --- ordering, rounds, capacity on the way --------------------------------------------------------


def test_equal_priority_older_units_are_not_victims_of_newer_ones() -> None:
    w = _example_world(queue("team-a").preemption())
    w.add(unit("same").quota("team-a").priority(10).cpu("2"))
    plan = w.cycle()
    assert plan.marks == []


def test_the_dry_run_takes_the_lowest_priority_first_and_stops_when_covered() -> None:
    w = World(quota("q", cpu="6"), queues=(queue("q").preemption(),))
    for name, prio in (("p1", 1), ("p3", 3), ("p2", 2)):
        w.add(unit(name).quota("q").priority(prio).cpu("2").admitted(1))
    w.add(unit("big").quota("q").priority(50).cpu("3"))
    plan = w.cycle()
    assert _marked(plan) == {"p1": {"p1": 1}, "p2": {"p2": 1}}


def test_a_second_preemptor_is_rejected_while_a_round_is_in_progress() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q").preemption(),))
    w.add(unit("low").quota("q").priority(1).cpu("2"))
    w.cycle()
    w.add(unit("mid").quota("q").priority(50).cpu("2"))
    assert _marked(w.cycle()) == {"low": {"low": 1}}
    w.add(unit("top").quota("q").priority(90).cpu("1"))
    plan = w.cycle()
    assert plan.marks == []
    park = parked(plan, "top")
    assert park is not None and park.preempt_error == Message.queue_preempting("q")


def test_units_behind_a_waiting_preemptor_are_held() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    w.add(unit("low").quota("q").priority(1).cpu("3"))
    w.cycle()
    w.add(unit("high").quota("q").priority(90).cpu("4"), unit("small").quota("q").priority(5).cpu("1"))
    plan = w.cycle()
    assert _marked(plan) == {"low": {"low": 1}}
    assert admits(plan) == []
    assert parked(plan, "small").message == Message.queue_preempting("q")  # type: ignore[union-attr]
    w.reclaim("low")
    assert admits(w.cycle()) == ["high"]


def test_marked_victims_count_as_capacity_on_the_way_until_they_are_not_enough() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    for name in ("a", "b"):
        w.add(unit(name).quota("q").priority(1).cpu("2").admitted(1))
    w.add(unit("p").quota("q").priority(90).cpu("2"))
    assert _marked(w.cycle()) == {"b": {"b": 1}}
    assert w.cycle().marks == []  # b is on the way: nothing more
    # The preemptor now needs more than b frees: a is marked too, never b again.
    w.replace("p", pod_sets=(w.u("p").pod_sets[0].__class__("p", 2, None, {"cpu": 2000}),))
    plan = w.cycle()
    assert _marked(plan) == {"a": {"a": 1}}


def _victim_left_on_the_way(how: str) -> tuple[World, str]:
    """A victim still being reclaimed whose preemptor no longer waits for it (``how``: the
    preemptor was deleted, or admitted when other quota was released meanwhile); returns the world
    and the unit left holding the queue (assumed, not running)."""
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    w.add(
        unit("victim").quota("q").priority(1).cpu("2").admitted(1),
        unit("other").quota("q").priority(50).cpu("2").admitted(1),
        unit("first").quota("q").priority(60).cpu("2"),
    )
    assert _marked(w.cycle()) == {"victim": {"victim": 1}}
    if how == "deleted":
        w.delete("first")
        left = "other"
    else:
        w.finish("other")
        assert admits(w.cycle()) == ["first"]
        left = "first"
    assert w.u("victim").admissions[0].reclaim_replicas == 1
    return w, left


@pytest.mark.parametrize("how", ["deleted", "admitted"])
def test_two_waiting_preemptors_never_count_the_same_victim(how: str) -> None:
    # The victim frees 2 CPU, enough for one of the two: only one may wait for it.
    w, left = _victim_left_on_the_way(how)
    w.add(
        unit("p-high").quota("q").priority(90).cpu("2"),
        unit("p-low").quota("q").priority(80).cpu("2"),
    )
    plan = w.cycle()
    assert plan.marks == [] and admits(plan) == []
    high, low = parked(plan, "p-high"), parked(plan, "p-low")
    assert high is not None and high.message.endswith(Message.PREEMPT_SUCCEED_SUFFIX), high.message
    assert high.promised == ("default/victim",)
    assert low is not None and low.message.endswith(Message.PREEMPT_FAILED_SUFFIX), low.message
    assert low.promised == ()
    # Later cycles do not promise the victim to the other one either.
    assert all(not p.promised for p in w.cycle(dt=30).parks if p.key == "default/p-low")
    w.run(left)
    w.reclaim("victim")
    assert admits(w.cycle()) == ["p-high"]


def test_a_failed_marking_write_can_be_forgotten() -> None:
    w = _example_world(queue("team-a").preemption())
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    plan = w.cycle(apply=False)
    assert _marked(plan) == {"low-priority-job": {"low-priority-job": 1}}
    assert w.cycle(apply=False).marks == []
    w.cache.forget_marks("team-a", {"default/low-priority-job"})
    assert _marked(w.cycle()) == {"low-priority-job": {"low-priority-job": 1}}


def test_an_unobserved_mark_expires() -> None:
    w = _example_world(queue("team-a").preemption())
    w.add(unit("high").quota("team-a").priority(100).cpu("2"))
    w.cycle(apply=False)
    assert _marked(w.cycle(dt=61, apply=False)) == {"low-priority-job": {"low-priority-job": 1}}


def test_no_marking_while_a_higher_unit_holds_the_queue() -> None:
    w = World(quota("q", cpu="10"), queues=(queue("q").wait_for_pods_running(),))
    w.add(unit("top").quota("q").priority(99).cpu("1"))
    w.cycle()
    w.add(unit("low").quota("q").priority(1).cpu("1").admitted(1))  # assumed, after the newcomer
    w.add(unit("mid").quota("q").priority(50).cpu("1"))
    plan = w.cycle()
    assert plan.marks == []
    assert parked(plan, "mid").message == Message.NO_MORE_IN_QUEUE  # type: ignore[union-attr]


# --- property tests -------------------------------------------------------------------------------

_assumed = st.lists(
    st.tuples(st.integers(0, 20), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2)),
    min_size=1,
    max_size=12,
)


def _random_world(assumed: list[tuple[int, int, int, int]], room: int) -> World:
    total = sum(cpu * replicas for _, cpu, replicas, _ in assumed)
    w = World(quota("q", cpu=str(total + room)), queues=(queue("q").preemption(),))
    for i, (prio, cpu, replicas, running) in enumerate(assumed):
        w.add(
            unit(f"a{i}")
            .quota("q")
            .priority(prio)
            .created(i)
            .cpu(str(cpu), replicas)
            .admitted(replicas, min(running, replicas))
        )
    return w


@settings(max_examples=150, deadline=None)
@given(assumed=_assumed, prio=st.integers(0, 25), cpu=st.integers(1, 12), room=st.integers(0, 3))
def test_preempt_path_properties(
    assumed: list[tuple[int, int, int, int]], prio: int, cpu: int, room: int
) -> None:
    w = _random_world(assumed, room)
    w.add(unit("p").quota("q").priority(prio).created(100).cpu(str(cpu)))
    twin = copy.deepcopy(w)
    plan = w.cycle(apply=False)
    assert plan == twin.cycle(apply=False)  # same snapshot -> same plan
    marks: list[MarkVictims] = plan.marks
    if not marks:
        return
    (mark,) = marks
    preemptor = priority_key(w.u("p"))
    keys = [v.key for v in mark.victims]
    assert len(keys) == len(set(keys))
    for v in mark.victims:
        assert priority_key(w.cache.units[v.key]) > preemptor  # a victim never sorts before
    if mark.path != "preempt":
        return
    # The shortest lowest-first prefix of reclaimable candidates that covers the request; among
    # equal priorities, units with no bound pod first
    # (docs/compatibility.md#gangs-and-partial-admission).
    candidates = sorted(
        (u for u in w.cache.units.values() if u.key != "default/p" and priority_key(u) > preemptor),
        key=priority_key,
        reverse=True,
    )
    candidates.sort(key=lambda u: (u.priority, any(a.running > 0 for a in u.admissions)))
    found = [(u.key, reclaimable(u, now=w.now, protect=0)) for u in candidates]
    prefix = [(k, r) for k, r in found if r is not None]
    request = {"cpu": cpu * 1000}
    used = w.cache.ledger.used("q").get("cpu", 0)
    shortfall = {"cpu": cpu * 1000 - (w.cache.ledger.quotas["q"].max["cpu"] - used)}
    target = request if quantities.covers(_sum(prefix), request) else shortfall
    released: dict[str, int] = {}
    expected: list[str] = []
    for k, r in prefix:
        expected.append(k)
        released = quantities.add(released, r.resources)
        if quantities.covers(released, target):
            break
    assert keys == expected


def _sum(items: list[tuple[str, Reclaimable]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for _, r in items:
        total = quantities.add(total, r.resources)
    return total


@settings(max_examples=80, deadline=None)
@given(
    assumed=_assumed,
    arrivals=st.lists(st.tuples(st.integers(0, 25), st.integers(1, 6)), min_size=1, max_size=4),
    steps=st.lists(st.sampled_from(["cycle", "reclaim", "run"]), max_size=10),
)
def test_no_unit_is_ever_marked_twice_and_usage_never_exceeds_max(
    assumed: list[tuple[int, int, int, int]], arrivals: list[tuple[int, int]], steps: list[str]
) -> None:
    w = _random_world(assumed, 0)
    for i, (prio, cpu) in enumerate(arrivals):
        w.add(unit(f"p{i}").quota("q").priority(prio).created(100 + i).cpu(str(cpu)))
    limit = w.cache.ledger.quotas["q"].max["cpu"]
    in_reclaim: set[str] = set()
    for step in ["cycle", *steps, "cycle"]:
        if step == "cycle":
            plan = w.cycle()
            for m in plan.marks:
                for v in m.victims:
                    assert v.key not in in_reclaim, "marked twice"
                    in_reclaim.add(v.key)
        elif step == "reclaim" and in_reclaim:
            key = sorted(in_reclaim)[0]
            w.reclaim(key.split("/", 1)[1])
            in_reclaim.discard(key)
        elif step == "run":
            for key in sorted(w.cache.units):
                if key not in in_reclaim:
                    w.run(key.split("/", 1)[1])
                    break
        assert w.cache.ledger.used("q").get("cpu", 0) <= limit


def _freed(u: Unit) -> int:
    """The milli-CPU a marked unit's reclaim will free."""
    per_pod = {ps.name: ps.per_pod.get("cpu", 0) for ps in expected_pod_sets(u)}
    return sum(per_pod.get(a.name, 0) * (a.reclaim_replicas or 0) for a in u.admissions)


def _is_marked(u: Unit) -> bool:
    return any(a.reclaim_replicas is not None for a in u.admissions)


def _check_promises(w: World, promises: dict[str, set[str]]) -> None:
    """Each marked victim's freed quota is promised to at most one waiting preemptor, so what the
    waiting preemptors are promised never exceeds what the marked victims will free."""
    on_the_way = {k: _freed(u) for k, u in w.cache.units.items() if _is_marked(u)}
    owner: dict[str, str] = {}
    promised = 0
    for preemptor, victims in sorted(promises.items()):
        u = w.cache.units.get(preemptor)
        if u is None or not is_waiting(u):
            continue
        for victim in sorted(victims & on_the_way.keys()):
            assert victim not in owner, f"{victim} promised to {owner[victim]} and {preemptor}"
            owner[victim] = preemptor
            promised += on_the_way[victim]
    assert promised <= sum(on_the_way.values())


_QUEUES = ("a", "b")
_IN_QUEUE = st.sampled_from(("a", "a", "b"))


@settings(max_examples=200, deadline=None)
@given(
    # Arrivals mostly sort before the assumed units, so they preempt and several may wait at once.
    assumed=st.lists(
        st.tuples(_IN_QUEUE, st.integers(0, 4), st.integers(1, 2), st.integers(1, 2)), min_size=2, max_size=6
    ),
    arrivals=st.lists(st.tuples(_IN_QUEUE, st.integers(3, 9), st.integers(1, 2)), min_size=2, max_size=5),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["wait", "arrive", "arrive", "reclaim", "run", "finish", "delete"]),
            st.integers(0, 5),
        ),
        max_size=12,
    ),
)
# The preemptor of a round goes away while its victim is reclaimed; two others then both counted
# on that victim.
@example(
    assumed=[("a", 0, 1, 1), ("a", 0, 1, 1)],
    arrivals=[("a", 4, 1), ("a", 5, 1), ("a", 4, 1)],
    steps=[("arrive", 0), ("delete", 0)],
)
def test_waiting_preemptors_are_never_promised_more_than_the_marked_victims_free(
    assumed: list[tuple[str, int, int, int]],
    arrivals: list[tuple[str, int, int]],
    steps: list[tuple[str, int]],
) -> None:
    # Two queues under one parent quota that is full: every arrival must preempt in its queue.
    total = str(sum(cpu * replicas for _, _, cpu, replicas in assumed))
    w = World(
        quota("p", cpu=total),
        *(quota(q, parent="p", cpu=total) for q in _QUEUES),
        queues=tuple(queue(q).preemption() for q in _QUEUES),
    )
    for i, (q, prio, cpu, replicas) in enumerate(assumed):
        w.add(unit(f"a{i}").quota(q).priority(prio).created(i).cpu(str(cpu), replicas).admitted(replicas))
    pending = list(enumerate(arrivals))
    promises: dict[str, set[str]] = {}

    def arrive() -> None:
        i, (q, prio, cpu) = pending.pop(0)
        w.add(unit(f"p{i}").quota(q).priority(prio).created(100 + i).cpu(str(cpu)))

    def pick(names: list[str], index: int) -> str | None:
        return sorted(names)[index % len(names)] if names else None

    def cycle(dt: float) -> None:
        twin = copy.deepcopy(w)
        plan = w.cycle(dt)
        assert plan == twin.cycle(dt)  # pure and deterministic
        for d in plan.decisions:
            if isinstance(d, Admit):
                promises.pop(d.key, None)
            elif isinstance(d, Park):
                promises[d.key] = set(d.promised)
        _check_promises(w, promises)

    arrive()
    arrive()
    cycle(1)
    # Every event is followed by a cycle, as in the reconciler; "wait" lets time pass.
    for step, index in [*steps, ("wait", 0)]:
        units = w.cache.units
        if step == "arrive" and pending:
            arrive()
        elif step == "reclaim":
            key = pick([k for k, u in units.items() if _is_marked(u)], index)
            if key is not None:
                w.reclaim(key.split("/", 1)[1])
                for victims in promises.values():
                    victims.discard(key)  # that reclaim is done: what it freed was handed out
        elif step in ("run", "finish"):
            key = pick([k for k, u in units.items() if u.admissions and not _is_marked(u)], index)
            if key is not None:
                (w.run if step == "run" else w.finish)(key.split("/", 1)[1])
        elif step == "delete":  # a preemptor goes away, preferably one that waits for victims
            waiting = [k for k, victims in promises.items() if victims and k in units]
            key = pick(waiting or [k for k in units if k.startswith("default/p")], index)
            if key is not None:
                w.delete(key.split("/", 1)[1])
                promises.pop(key, None)
        cycle(30 if step == "wait" else 1)


def test_s21_block_with_wait_for_pods_running_and_a_late_high_priority_job() -> None:
    w = World(quota("q", cpu="10"), queues=(queue("q").policy("Block").wait_for_pods_running(),))
    w.add(unit("pi-1").quota("q").priority(1).cpu("1"), unit("pi-2").quota("q").priority(1).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == ["pi-1"]
    assert parked(plan, "pi-2").message == Message.NO_MORE_IN_QUEUE  # type: ignore[union-attr]
    assert w.cache.state.queues["q"].blocked
    w.add(unit("pi-3").quota("q").priority(100).cpu("1"))
    assert _marked(w.cycle()) == {"pi-1": {"pi-1": 1}}
    assert admits(w.cycle()) == ["pi-3"]


# --- a reclaim nobody carries out expires (docs/compatibility.md#reclaim-by-the-job-extension) ------


def test_a_reclaim_not_carried_out_within_the_bound_expires_and_other_victims_are_chosen() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    for name in ("a", "b"):
        w.add(unit(name).quota("q").priority(1).cpu("2").admitted(1))
    w.add(unit("p").quota("q").priority(90).cpu("2"))
    assert _marked(w.cycle()) == {"b": {"b": 1}}
    assert w.u("b").admissions[0].reclaim_replicas == 1  # observed on the victim
    # Nobody carries it out (its job is no longer managed, say): within the bound p keeps waiting.
    assert w.cycle().marks == []  # the scan that sees the reclaim starts the bound
    assert w.cycle(RECLAIM_TIMEOUT / 2).marks == []
    plan = w.cycle(RECLAIM_TIMEOUT / 2 + 1)
    assert _marked(plan) == {"a": {"a": 1}}  # b is never marked twice; a is chosen instead
    assert w.cycle().marks == []  # a is on the way now


def test_a_reclaim_carried_out_in_time_is_waited_for() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    for name in ("a", "b"):
        w.add(unit(name).quota("q").priority(1).cpu("2").admitted(1))
    w.add(unit("p").quota("q").priority(90).cpu("2"))
    assert _marked(w.cycle()) == {"b": {"b": 1}}
    assert w.cycle(RECLAIM_TIMEOUT - 10).marks == []
    assert w.cycle(5).marks == []  # still within the bound: b is counted on, a is left alone
    assert w.u("a").admissions[0].reclaim_replicas is None

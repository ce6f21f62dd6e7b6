"""Preemption priority (docs/compatibility.md#preemption-priority): a unit is preempted at its
preemption priority and preempts at its scheduling priority, never below the first, so no two
units can preempt each other; without a preemption priority everything is as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import Message, QueuePolicy
from koord_queue.shared.core.ordering import unit_key, victim_key
from koord_queue.shared.core.preemption import NO_VICTIMS, MarkVictims, reclaimable
from koord_queue.shared.core.scheduling import Plan
from tests.unit.test_model import UnitBuilder, queue, quota, unit
from tests.unit.test_scheduling import World, admits, parked

POLICIES = (QueuePolicy.PRIORITY, QueuePolicy.BLOCK, QueuePolicy.INTELLIGENT, None)


def pp(builder: UnitBuilder, value: int) -> UnitBuilder:
    """``builder`` with ``spec.preemptionPriority``."""
    builder.spec["preemptionPriority"] = value
    return builder


def _marked(plan: Plan) -> list[str]:
    return sorted(v.key.split("/", 1)[1] for m in plan.marks for v in m.victims)


# --- the keys: no cycle -----------------------------------------------------------------------------

_names = st.text("abc", min_size=1, max_size=2)


@st.composite
def _units(draw: st.DrawFn, *, rule: bool = True) -> Unit:
    """A unit with an arbitrary priority, preemption priority (>= it with ``rule``), creation time,
    name, namespace and preemptible label."""
    priority = draw(st.integers(-5, 5))
    low = priority if rule else -5
    preemption = draw(st.none() | st.integers(low, 10))
    name, namespace = draw(_names), draw(_names)
    labels = {names.PREEMPTIBLE_LABEL: "true"} if draw(st.booleans()) else {}
    return Unit(
        key=f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        created=float(draw(st.integers(0, 3))),
        priority=priority,
        preemption_priority=preemption,
        labels=labels,
    )


def _may_preempt(p: Unit, v: Unit, policy: QueuePolicy | None) -> bool:
    """Victim rule 1: ``v`` sorts after ``p`` at its preemption priority."""
    return victim_key(v, policy) > unit_key(p, policy)


@settings(max_examples=400, deadline=None)
@given(p=_units(), v=_units(), policy=st.sampled_from(POLICIES))
def test_no_two_units_can_preempt_each_other(p: Unit, v: Unit, policy: QueuePolicy | None) -> None:
    assert not (_may_preempt(p, v, policy) and _may_preempt(v, p, policy))
    # The victim key never sorts after the unit's own key: the whole argument.
    assert victim_key(v, policy) <= unit_key(v, policy)


@settings(max_examples=200, deadline=None)
@given(p=_units(), v=_units(), policy=st.sampled_from(POLICIES))
def test_without_a_preemption_priority_the_victim_key_is_the_unit_key(
    p: Unit, v: Unit, policy: QueuePolicy | None
) -> None:
    plain = Unit(key=v.key, namespace=v.namespace, name=v.name, priority=v.priority, labels=v.labels)
    assert victim_key(plain, policy) == unit_key(plain, policy)
    same = Unit(key=v.key, namespace=v.namespace, name=v.name, priority=3, preemption_priority=3)
    assert victim_key(same, policy) == unit_key(same, policy)


def test_without_the_rule_two_units_preempt_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``>=`` rule is load-bearing: taken at face value, a preemption priority below the
    priority makes a cycle (P preempts V at V's preemption priority 5, V preempts P at P's 0)."""
    p = Unit(key="d/p", namespace="d", name="p", priority=10, preemption_priority=0)
    v = Unit(key="d/v", namespace="d", name="v", priority=5, preemption_priority=5)
    for policy in POLICIES:
        assert not (_may_preempt(p, v, policy) and _may_preempt(v, p, policy))
    raw = property(lambda u: u.priority if u.preemption_priority is None else u.preemption_priority)
    monkeypatch.setattr(Unit, "victim_priority", raw)
    for policy in POLICIES:
        assert _may_preempt(p, v, policy) and _may_preempt(v, p, policy)


def test_hypothesis_finds_a_cycle_without_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = property(lambda u: u.priority if u.preemption_priority is None else u.preemption_priority)
    monkeypatch.setattr(Unit, "victim_priority", raw)
    found: list[tuple[Unit, Unit]] = []

    @settings(max_examples=500, deadline=None, database=None)
    @given(p=_units(rule=False), v=_units(rule=False), policy=st.sampled_from(POLICIES))
    def search(p: Unit, v: Unit, policy: QueuePolicy | None) -> None:
        if _may_preempt(p, v, policy) and _may_preempt(v, p, policy):
            found.append((p, v))

    search()
    assert found, "no cycle without the rule: the property test above would prove nothing"


def test_a_preemption_priority_below_the_priority_is_raised_and_reported() -> None:
    low = pp(unit("low").priority(10), 3).build()
    assert low.preemption_priority == 10 and low.victim_priority == 10
    assert any("spec.preemptionPriority: 3 is below spec.priority 10" in p for p in low.problems)
    high = pp(unit("high").priority(10), 30).build()
    assert high.preemption_priority == 30 and high.victim_priority == 30 and high.problems == ()
    assert unit("plain").priority(7).build().victim_priority == 7


# --- the scheduler: victims by preemption priority ---------------------------------------------------


def test_a_victim_protected_by_its_preemption_priority_is_not_marked() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q").preemption(),))
    w.add(pp(unit("guarded").quota("q").priority(10).cpu("2"), 200))
    assert admits(w.cycle()) == ["guarded"]
    w.add(unit("high").quota("q").priority(100).cpu("2"))
    plan = w.cycle()
    assert plan.marks == []
    park = parked(plan, "high")
    assert park is not None and park.preempt_error == NO_VICTIMS
    assert park.message.endswith(Message.PREEMPT_FAILED_SUFFIX)
    # A preemptor above its preemption priority takes it; it is still queued at 10.
    w.add(unit("top").quota("q").priority(300).cpu("2"))
    assert _marked(w.cycle()) == ["guarded"]


@pytest.mark.parametrize("guard", [200, None])
def test_the_reserve_path_marks_nobody_while_a_guarded_unit_holds_the_queue(guard: int | None) -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    guarded = unit("guarded").quota("q").priority(10).cpu("1").admitted(1)
    w.add(
        pp(guarded, guard) if guard is not None else guarded,
        unit("plain").quota("q").priority(5).cpu("1").admitted(1),
    )
    w.add(unit("high").quota("q").priority(100).cpu("1"))
    plan = w.cycle()
    if guard is None:  # both are marked in one round (the reserve path, S4)
        assert _marked(plan) == ["guarded", "plain"]
        return
    assert plan.marks == [] and admits(plan) == []
    park = parked(plan, "high")
    assert park is not None and park.message == Message.NO_MORE_IN_QUEUE


def test_the_preempt_path_marks_nobody_while_a_guarded_unit_would_still_hold_the_queue() -> None:
    """Marking the plain unit would free quota, but the guarded one (which sorts after the
    preemptor in queue order) would still hold the queue: no useless marking."""
    w = World(quota("q", cpu="2"), queues=(queue("q").preemption(),))
    w.add(
        pp(unit("guarded").quota("q").priority(10).cpu("1").admitted(1), 200),
        unit("plain").quota("q").priority(5).cpu("1").admitted(1),
        unit("high").quota("q").priority(100).cpu("1"),
    )
    plan = w.cycle()
    assert plan.marks == []
    park = parked(plan, "high")
    assert park is not None and park.preempt_error == Message.NO_MORE_IN_QUEUE


def test_the_walk_takes_the_lowest_preemption_priority_first() -> None:
    w = World(quota("q", cpu="6"), queues=(queue("q").preemption(),))
    w.add(
        pp(unit("p1").quota("q").priority(1).cpu("2").admitted(1), 5),
        unit("p2").quota("q").priority(2).cpu("2").admitted(1),
        unit("p3").quota("q").priority(3).cpu("2").admitted(1),
    )
    w.add(unit("big").quota("q").priority(50).cpu("3"))
    # By priority p1 and p2 would go; p1 is preempted at 5, after p3.
    assert _marked(w.cycle()) == ["p2", "p3"]


def test_without_preemption_priorities_the_walk_is_unchanged() -> None:
    w = World(quota("q", cpu="6"), queues=(queue("q").preemption(),))
    for name, prio in (("p1", 1), ("p3", 3), ("p2", 2)):
        w.add(unit(name).quota("q").priority(prio).cpu("2").admitted(1))
    w.add(unit("big").quota("q").priority(50).cpu("3"))
    assert _marked(w.cycle()) == ["p1", "p2"]


_assumed = st.lists(
    st.tuples(
        st.integers(0, 20),
        st.none() | st.integers(0, 30),
        st.integers(1, 4),
        st.integers(1, 3),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=12,
)


def _random_world(assumed: list[tuple[int, int | None, int, int, int]], room: int) -> World:
    total = sum(cpu * replicas for _, _, cpu, replicas, _ in assumed)
    w = World(quota("q", cpu=str(total + room)), queues=(queue("q").preemption(),))
    for i, (prio, preempt_at, cpu, replicas, running) in enumerate(assumed):
        b = unit(f"a{i}").quota("q").priority(prio).created(i).cpu(str(cpu), replicas)
        if preempt_at is not None:
            pp(b, max(prio, preempt_at))
        w.add(b.admitted(replicas, min(running, replicas)))
    return w


def _expected_walk(w: World, preemptor: tuple[Any, ...]) -> list[Unit]:
    """The reference walk: candidates sorting after the preemptor at their preemption priority,
    lowest preemption priority first, among equals unbound first, then the queue order backwards."""
    policy = QueuePolicy.PRIORITY
    candidates = sorted(
        (u for u in w.cache.units.values() if u.key != "default/p" and victim_key(u, policy) > preemptor),
        key=lambda u: victim_key(u, policy),
        reverse=True,
    )
    candidates.sort(key=lambda u: (u.victim_priority, any(a.running > 0 for a in u.admissions)))
    return candidates


@settings(max_examples=150, deadline=None)
@given(assumed=_assumed, prio=st.integers(0, 25), cpu=st.integers(1, 12), room=st.integers(0, 3))
def test_preempt_path_properties_with_preemption_priorities(
    assumed: list[tuple[int, int | None, int, int, int]], prio: int, cpu: int, room: int
) -> None:
    w = _random_world(assumed, room)
    w.add(unit("p").quota("q").priority(prio).created(100).cpu(str(cpu)))
    twin = copy.deepcopy(w)
    plan = w.cycle(apply=False)
    assert plan == twin.cycle(apply=False)
    marks: list[MarkVictims] = plan.marks
    if not marks:
        return
    (mark,) = marks
    preemptor = unit_key(w.u("p"), QueuePolicy.PRIORITY)
    keys = [v.key for v in mark.victims]
    for v in mark.victims:
        assert victim_key(w.cache.units[v.key], QueuePolicy.PRIORITY) > preemptor
    if mark.path != "preempt":
        return
    found = [(u.key, reclaimable(u, now=w.now, protect=0)) for u in _expected_walk(w, preemptor)]
    prefix = [(k, r) for k, r in found if r is not None]
    request = {"cpu": cpu * 1000}
    used = w.cache.ledger.used("q").get("cpu", 0)
    shortfall = {"cpu": cpu * 1000 - (w.cache.ledger.quotas["q"].max["cpu"] - used)}
    total: dict[str, int] = {}
    for _, r in prefix:
        assert r is not None
        total = quantities.add(total, r.resources)
    target = request if quantities.covers(total, request) else shortfall
    released: dict[str, int] = {}
    expected: list[str] = []
    for k, r in prefix:
        assert r is not None
        expected.append(k)
        released = quantities.add(released, r.resources)
        if quantities.covers(released, target):
            break
    assert keys == expected

"""The scheduling cycle at the decision level: the scenarios S1, S2, S7, S8, S9, S13, S29, S30 of
docs/compatibility.md#scenario-list, batch admission, strict queue order, parent quotas, and
determinism.

``World`` is the harness the policy and preemption tests share: it feeds a :class:`Cache`, runs
cycles, and applies each plan the way the reconciler will (assume admissions, write marks), with
helpers that simulate the job extension (pods running, reclaim done, job finished).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api.model import Admission, QueueConfig, Quota, Unit, with_reclaim
from koord_queue.shared.api.names import Message, Phase
from koord_queue.shared.core.policies import unlabelled_message
from koord_queue.shared.core.preemption import MarkVictims
from koord_queue.shared.core.scheduling import Admit, Cache, Park, Plan
from tests.unit.test_model import BASE_TIME, QueueBuilder, UnitBuilder, queue, quota, unit


class World:
    def __init__(
        self, *quotas: Quota, queues: tuple[QueueBuilder | QueueConfig, ...] = (), protect: float = 0.0
    ):
        self.cache = Cache(reclaim_protect_seconds=protect)
        self.now = BASE_TIME + 1000
        for q in quotas:
            self.cache.put_quota(q)
        for qb in queues:
            self.cache.put_queue(qb.build() if isinstance(qb, QueueBuilder) else qb)

    def add(self, *builders: UnitBuilder) -> World:
        for b in builders:
            self.cache.put_unit(b.build())
        return self

    def cycle(self, dt: float = 1.0, *, apply: bool = True) -> Plan:
        self.now += dt
        plan = self.cache.schedule(self.now)
        if apply:
            for decision in plan.decisions:
                if isinstance(decision, Admit):
                    self.cache.assume(decision, now=self.now)
                elif isinstance(decision, MarkVictims):
                    for victim in decision.victims:
                        u = self.cache.units[victim.key]
                        self.cache.put_unit(
                            with_reclaim(u, victim.reclaim, message=decision.message, now=self.now)
                        )
        return plan

    def u(self, name: str) -> Unit:
        return self.cache.units[f"default/{name}"]

    def replace(self, name: str, **changes: object) -> None:
        self.cache.put_unit(dataclasses.replace(self.u(name), **changes))  # type: ignore[arg-type]

    def run(self, name: str) -> None:
        """All admitted pods of ``name`` are bound."""
        u = self.u(name)
        self.replace(name, admissions=tuple(dataclasses.replace(a, running=a.replicas) for a in u.admissions))

    def reclaim(self, name: str) -> bool:
        """The job extension reclaimed the marked replicas; returns the Reclaimed note."""
        u = self.u(name)
        admissions = tuple(
            Admission(a.name, max(a.replicas - (a.reclaim_replicas or 0), 0), a.running, a.resources, None)
            for a in u.admissions
        )
        return self.cache.put_unit(dataclasses.replace(u, admissions=admissions, message="")).reclaimed

    def finish(self, name: str) -> None:
        self.replace(name, phase=Phase.SUCCEED.value, admissions=())

    def delete(self, name: str) -> None:
        self.cache.delete_unit(f"default/{name}")

    def admitted(self, plan: Plan) -> list[str]:
        return [d.key.split("/", 1)[1] for d in plan.admits]


def admits(plan: Plan) -> list[str]:
    return [d.key.split("/", 1)[1] for d in plan.admits]


def parked(plan: Plan, name: str) -> Park | None:
    found = [d for d in plan.parks if d.key == f"default/{name}"]
    return found[-1] if found else None


# --- S1, S2 ---------------------------------------------------------------------------------------


def test_s1_basic_admission() -> None:
    w = World(quota("team-a", cpu="4"), queues=(queue("team-a"),))
    w.add(unit("job").quota("team-a").priority(10).cpu("1"))
    plan = w.cycle()
    (admit,) = plan.admits
    assert admit == Admit(
        key="default/job",
        queue="team-a",
        grants={"job": 1},
        phase=Phase.DEQUEUED,
        message=Message.DEQUEUED,
        admission_checks=(),
        request={"cpu": 1000},
    )
    u = w.u("job")
    assert u.admissions == (Admission("job", 1, 0),)
    assert u.phase == "Dequeued" and u.last_allocate_time == w.now
    assert w.cache.ledger.used("team-a") == {"cpu": 1000}
    assert w.cycle().decisions == ()


def test_s2_quota_exhaustion_then_release() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("2"))
    assert admits(w.cycle()) == ["a"]
    w.add(unit("b").quota("q").cpu("2"))
    plan = w.cycle()
    park = parked(plan, "b")
    assert park is not None
    assert park.message == "limited quotaName:q, limited resKey:cpu,; preempt failed"
    assert park.message.startswith(Message.limited("q", "cpu"))
    assert park.preempt_error == "preemption is disabled because wait-for-pods-running is disabled"
    assert not park.repeated and not park.queue_not_found
    assert w.cycle().decisions == ()  # nothing changed: no rescan, no event spam
    w.finish("a")
    assert admits(w.cycle()) == ["b"]


def test_a_deleted_holder_releases_quota() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("2"))
    w.cycle()
    w.add(unit("b").quota("q").cpu("2"))
    w.cycle()
    w.delete("a")
    assert admits(w.cycle()) == ["b"]


def test_cpu_is_counted_in_milli_units() -> None:
    w = World(quota("q", cpu="1"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("500m"), unit("b").quota("q").cpu("500m"), unit("c").quota("q").cpu("1m"))
    plan = w.cycle()
    assert admits(plan) == ["a", "b"]
    assert parked(plan, "c") is not None


# --- batch, order, hierarchy ----------------------------------------------------------------------


def test_a_cycle_admits_many_units_without_over_admitting() -> None:
    w = World(quota("q", cpu="10"), queues=(queue("q"),))
    for i in range(15):
        w.add(unit(f"u{i:02}").quota("q").cpu("1"))
    plan = w.cycle()
    assert admits(plan) == [f"u{i:02}" for i in range(10)]
    assert w.cache.ledger.used("q") == {"cpu": 10_000}


def test_queues_are_served_strictly_by_priority_then_name_when_they_share_a_parent() -> None:
    w = World(
        quota("parent", cpu="2"),
        quota("low", parent="parent", cpu="2"),
        quota("high", parent="parent", cpu="2"),
        quota("also-high", parent="parent", cpu="2"),
        queues=(queue("low").priority(1), queue("high").priority(5), queue("also-high").priority(5)),
    )
    w.add(
        unit("l").quota("low").cpu("1"),
        unit("h").quota("high").cpu("1"),
        unit("ah").quota("also-high").cpu("1"),
    )
    plan = w.cycle()
    assert admits(plan) == ["ah", "h"]
    assert parked(plan, "l") is not None
    assert parked(plan, "l").message.startswith(Message.limited("parent", "cpu"))  # type: ignore[union-attr]


def test_within_a_queue_priority_then_creation_then_name() -> None:
    w = World(quota("q", cpu="3"), queues=(queue("q"),))
    w.add(
        unit("late").quota("q").priority(1).created(20).cpu("1"),
        unit("b-same").quota("q").priority(1).created(10).cpu("1"),
        unit("a-same").quota("q").priority(1).created(10).cpu("1"),
        unit("top").quota("q").priority(9).created(30).cpu("1"),
    )
    assert admits(w.cycle()) == ["top", "a-same", "b-same"]


def test_partially_admitted_units_ask_only_for_the_rest() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("1", 4).admitted(2, 2))
    plan = w.cycle()
    assert plan.admits[0].grants == {"a": 2}
    assert plan.admits[0].request == {"cpu": 2000}
    assert w.u("a").admissions[0].replicas == 4


# --- S7, S8, S9 -----------------------------------------------------------------------------------


def test_s7_wait_for_pods_running_holds_the_queue_until_pods_run() -> None:
    w = World(quota("q", cpu="100"), queues=(queue("q").wait_for_pods_running(),))
    w.add(unit("a").quota("q").priority(5).cpu("1"), unit("b").quota("q").priority(5).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == ["a"]
    assert parked(plan, "b").message == Message.NO_MORE_IN_QUEUE  # type: ignore[union-attr]
    plan = w.cycle()
    assert admits(plan) == []
    w.run("a")
    assert admits(w.cycle()) == ["b"]


def test_s8_an_inactive_unit_is_never_admitted_and_keeps_its_place() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("idle").quota("q").priority(9).active(False).cpu("2"), unit("rival").quota("q").cpu("2"))
    plan = w.cycle()
    assert admits(plan) == ["rival"]
    assert parked(plan, "idle") is None
    assert [d["name"] for d in w.cache.queue_item_details("q")] == ["idle"]


def test_s9_activation_admits_the_unit() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("a").quota("q").active(False).cpu("1"))
    assert w.cycle().decisions == ()
    w.replace("a", active=True)
    assert admits(w.cycle()) == ["a"]


# --- S13, S29, S30 --------------------------------------------------------------------------------


def test_s13_admission_check_selector_picks_reserved_or_dequeued() -> None:
    selector = {"matchLabels": {"requires-provisioning": "true"}}
    w = World(quota("q", cpu="4"), queues=(queue("q").check("prov", selector),))
    w.add(
        unit("plain").quota("q").cpu("1"),
        unit("gpu").quota("q").label("requires-provisioning", "true").cpu("1"),
    )
    by_key = {d.key: d for d in w.cycle().admits}
    assert by_key["default/plain"].phase is Phase.DEQUEUED
    assert by_key["default/gpu"].phase is Phase.RESERVED
    assert by_key["default/gpu"].message == Message.RESERVED
    assert by_key["default/gpu"].admission_checks == ("prov",)


def test_s29_a_unit_without_a_quota_label_is_ignored() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q"),))
    w.add(unit("nolabel").cpu("1"))
    assert w.cycle().decisions == ()
    assert w.cache.queue_item_details("q") == []


def test_s29_an_unlabelled_unit_is_told_why_once_and_only_while_it_has_no_phase() -> None:
    bare = unit("nolabel").cpu("1").build()
    assert unlabelled_message(bare) == Message.NO_QUOTA_LABEL
    assert unlabelled_message(dataclasses.replace(bare, message=Message.NO_QUOTA_LABEL)) is None
    assert unlabelled_message(dataclasses.replace(bare, phase=Phase.DEQUEUED)) is None
    assert unlabelled_message(unit("labelled").quota("q").cpu("1").build()) is None


def test_s30_unknown_quota_label_parks_once_then_admits_when_the_queue_appears() -> None:
    w = World()
    w.add(unit("a").quota("later").cpu("1"))
    plan = w.cycle()
    assert plan.decisions == (
        Park(key="default/a", queue="later", message="queue later is not exist", queue_not_found=True),
    )
    assert w.cycle().decisions == ()
    w.cache.put_quota(quota("later", cpu="2"))
    w.cache.put_queue(queue("later").build())
    assert admits(w.cycle()) == ["a"]


def test_a_failed_queue_not_found_message_is_decided_again() -> None:
    """The write of the one-off message failed (a connection reset): the unit must not wait in
    silence for as long as its queue is missing."""
    w = World()
    w.add(unit("a").quota("later").cpu("1"))
    [park] = w.cycle().decisions
    assert isinstance(park, Park) and park.queue_not_found
    w.cache.forget_park("default/a")
    assert w.cycle().decisions == (park,)
    assert w.cycle().decisions == ()


def test_a_queue_without_its_quota_reports_the_missing_quota() -> None:
    w = World(queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("1"))
    park = parked(w.cycle(), "a")
    assert park is not None
    assert park.message == Message.quota_missing("default/a", "q", []) + Message.PREEMPT_FAILED_SUFFIX


def test_an_unsupported_policy_makes_the_queue_unusable() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").policy("FIFO"),))
    w.add(unit("a").quota("q").cpu("1"))
    park = parked(w.cycle(), "a")
    assert park is not None and park.queue_not_found


def test_an_invalid_unit_is_parked_with_its_problem() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q"),))
    w.add(unit("bad").quota("q").podset("main", 1, cpu="x"), unit("good").quota("q").cpu("1"))
    plan = w.cycle()
    assert admits(plan) == ["good"]
    park = parked(plan, "bad")
    assert park is not None and "cpu" in park.message


def test_a_failed_write_is_forgotten_and_retried() -> None:
    w = World(quota("q", cpu="1"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("1"))
    plan = w.cycle(apply=False)
    before, _ = w.cache.assume(plan.admits[0], now=w.now)
    assert w.cache.ledger.used("q") == {"cpu": 1000}
    w.cache.forget(before)
    assert w.cache.ledger.used("q") == {}
    assert admits(w.cycle()) == ["a"]


def test_a_repeated_failure_is_flagged_for_the_reconciler() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("a").quota("q").cpu("1"), unit("x").quota("q").cpu("1"), unit("b").quota("q").cpu("2"))
    first = parked(w.cycle(), "b")
    assert first is not None and not first.repeated
    w.add(unit("c").quota("q").cpu("1"))  # a new arrival: only it is examined
    assert [d.key for d in w.cycle().parks] == ["default/c"]
    w.finish("x")  # a release: b is re-examined first (same message), then c fits
    plan = w.cycle()
    again = parked(plan, "b")
    assert again is not None and again.repeated and again.message == first.message
    assert admits(plan) == ["c"]


def test_after_a_restart_a_message_already_in_status_counts_as_repeated() -> None:
    w = World(quota("q", cpu="1"), queues=(queue("q"),))
    message = Message.limited("q", "cpu") + Message.PREEMPT_FAILED_SUFFIX
    w.add(unit("a").quota("q").cpu("1").admitted(1), unit("b").quota("q").cpu("1").message(message))
    park = parked(w.cycle(), "b")
    assert park is not None and park.repeated


def test_the_same_snapshot_and_state_give_the_same_plan() -> None:
    w = World(quota("q", cpu="5"), quota("r", cpu="3"), queues=(queue("q").policy("Block"), queue("r")))
    for i in range(8):
        w.add(
            unit(f"q{i}").quota("q").priority(i % 3).cpu("1"),
            unit(f"r{i}").quota("r").priority(i % 2).cpu("1"),
        )
    twin = copy.deepcopy(w.cache)
    assert w.cache.schedule(w.now) == twin.schedule(w.now)


# --- the Reclaimed event ---------------------------------------------------------------------------


def _two_sets() -> UnitBuilder:
    """Pod sets ``a`` (2 pods) and ``b`` (1 pod, not admitted yet) of 1 CPU each."""
    return unit("v").quota("q").podset("a", 2, cpu="1").podset("b", 1, cpu="1")


RECLAIM_EVENTS = {
    # name: (the unit as marked, the unit as seen next: admissions (name, replicas, running), phase)
    "unbound pods deleted": (_two_sets().admitted(2, podset="a", reclaim=2), ((("a", 0, 0),), None), True),
    "one of two taken back": (
        _two_sets().admitted(2, 1, podset="a", reclaim=1),
        ((("a", 1, 1),), None),
        True,
    ),
    "replicas without pods released": (
        unit("v").quota("q").cpu("1").admitted(1, reclaim=1),
        ((("v", 0, 0),), None),
        True,
    ),
    "pods bound meanwhile: nothing taken back": (
        _two_sets().admitted(2, podset="a", reclaim=2),
        ((("a", 2, 2),), None),
        False,
    ),
    "job finished while marked": (_two_sets().admitted(2, podset="a", reclaim=2), ((), "Succeed"), False),
    "backed off while marked": (
        _two_sets().admitted(2, podset="a", reclaim=2),
        ((), "TimeoutBackoff"),
        False,
    ),
    "still being reclaimed": (_two_sets().admitted(2, podset="a", reclaim=2), (None, None), False),
    "shrunk without a mark": (_two_sets().admitted(2, podset="a"), ((("a", 1, 0),), None), False),
}


@pytest.mark.parametrize("case", sorted(RECLAIM_EVENTS))
def test_reclaimed_is_noted_only_when_a_reclaim_took_back_a_replica(case: str) -> None:
    marked, (admissions, phase), expected = RECLAIM_EVENTS[case]
    cache = Cache()
    cache.put_quota(quota("q", cpu="8"))
    cache.put_queue(queue("q").build())
    before = marked.build()
    assert cache.put_unit(before).reclaimed is False
    after = dataclasses.replace(before, message="")
    if admissions is not None:
        after = dataclasses.replace(after, admissions=tuple(Admission(n, r, run) for n, r, run in admissions))
    if phase is not None:
        after = dataclasses.replace(after, phase=phase)
    assert cache.put_unit(after).reclaimed is expected
    assert cache.put_unit(after).reclaimed is False  # seen once: noted once


# --- properties -----------------------------------------------------------------------------------

_QUOTAS = (("root", None, "6"), ("left", "root", "4"), ("right", "root", "4"), ("solo", None, "3"))
_POLICIES = ("Priority", "Block", "Intelligent")
_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "run", "finish", "delete", "priority", "active", "cycle"]),
        st.integers(0, 11),
        st.sampled_from(["left", "right", "solo", "root", "ghost"]),
        st.integers(0, 6),
        st.sampled_from(["500m", "1", "2"]),
    ),
    max_size=40,
)


def _limits_hold(w: World) -> None:
    for name, _, cpu in _QUOTAS:
        assert w.cache.ledger.used(name).get("cpu", 0) <= int(cpu) * 1000, name


@settings(max_examples=120, deadline=None)
@given(ops=_ops, policies=st.tuples(*(st.sampled_from(_POLICIES) for _ in range(4))), wait=st.booleans())
def test_no_over_admission_and_no_missed_admission(
    ops: list[tuple[str, int, str, int, str]], policies: tuple[str, ...], wait: bool
) -> None:
    queues = []
    for (name, _, _), policy in zip(_QUOTAS, policies, strict=True):
        q = queue(name).policy(policy).priority(len(name))
        queues.append(q.wait_for_pods_running() if wait else q)
    w = World(*(quota(n, parent=p, cpu=c) for n, p, c in _QUOTAS), queues=tuple(queues))
    for op, ident, label, prio, cpu in ops:
        name = f"u{ident}"
        present = f"default/{name}" in w.cache.units
        if op == "add" and not present:
            w.add(unit(name).quota(label).priority(prio).created(ident).cpu(cpu, 1 + prio % 2))
        elif op == "cycle":
            w.cycle()
        elif present and op == "run":
            w.run(name)
        elif present and op == "finish":
            w.finish(name)
        elif present and op == "delete":
            w.delete(name)
        elif present and op == "priority":
            w.replace(name, priority=prio)
        elif present and op == "active":
            w.replace(name, active=not w.u(name).active)
        _limits_hold(w)
    for _ in range(3):
        w.cycle()
        _limits_hold(w)
    # A restarted reconciler (a fresh cache fed the same units) finds nothing more to admit.
    fresh = Cache()
    for n, p, c in _QUOTAS:
        fresh.put_quota(quota(n, parent=p, cpu=c))
    for q in queues:
        fresh.put_queue(q.build())
    for key in sorted(w.cache.units):
        fresh.put_unit(w.cache.units[key])
    for name, _, _ in _QUOTAS:
        assert fresh.ledger.used(name) == w.cache.ledger.used(name)
    assert fresh.schedule(w.now + 1).admits == []

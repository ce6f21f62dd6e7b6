"""Fair order inside a queue (docs/compatibility.md#fair-order-inside-a-queue): with
``koord-queue/fair-order: namespace`` a queue serves, among units of equal priority, the namespace
that used less of the quota lately first; priority still comes first, preemption still compares
priorities only, and the per-namespace history is stored and read back like the quota's."""

from __future__ import annotations

import json

import pytest

from koord_queue.shared.api import names, parsing
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core import history
from koord_queue.shared.core.history import Record
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_model import UnitBuilder, queue
from tests.unit.test_scheduling import World, admits

H = 600.0


def shared_quota(cpu: str = "4", record: str | None = None) -> Quota:
    annotations = {names.QUOTA_NAMESPACES_ANNOTATION: json.dumps(["ns1", "ns2"])}
    if record is not None:
        annotations[names.QUOTA_USAGE_HISTORY_ANNOTATION] = record
    return parsing.parse_quota(
        {
            "metadata": {"name": "q", "namespace": "default", "annotations": annotations},
            "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
        }
    )


def world(*, fair: bool, record: str | None = None) -> World:
    w = World()
    w.cache = Cache(usage_half_life=H)
    w.cache.put_quota(shared_quota(record=record))
    qb = queue("q")
    if fair:
        qb = qb.annotate(names.FAIR_ORDER_ANNOTATION, names.FAIR_ORDER_NAMESPACE)
    w.cache.put_queue(qb.build())
    return w


def add(w: World, ns: str, name: str, created: float, priority: int = 0) -> None:
    w.cache.put_unit(UnitBuilder(name, ns).quota("q").cpu("1").priority(priority).created(created).build())


def heavy_ns1(w: World) -> None:
    """ns1 holds the whole quota for a half-life, then finishes."""
    for i in range(4):
        add(w, "ns1", f"old-{i}", float(i))
    assert len(admits(w.cycle())) == 4
    w.cycle(dt=H)
    for i in range(4):
        w.cache.delete_unit(f"ns1/old-{i}")
    w.cycle()


def order(w: World) -> list[str]:
    return [key for key in (d.key for d in w.cycle().decisions if d.__class__.__name__ == "Admit")]


def test_the_namespace_that_used_less_lately_goes_first_among_equal_priorities() -> None:
    w = world(fair=True)
    heavy_ns1(w)
    for ns, name, created in [("ns1", "a", 100.0), ("ns1", "b", 101.0), ("ns2", "c", 102.0)]:
        add(w, ns, name, created)
    for ns, name, created in [("ns2", "d", 103.0), ("ns1", "e", 104.0), ("ns2", "f", 105.0)]:
        add(w, ns, name, created)
    assert w.cache.state.queues["q"].ranks == {"ns1": 1}  # ns2 has no history: rank 0
    assert order(w) == ["ns2/c", "ns2/d", "ns2/f", "ns1/a"]


def test_without_the_annotation_the_order_is_by_creation() -> None:
    w = world(fair=False)
    heavy_ns1(w)
    add(w, "ns1", "a", 100.0)
    add(w, "ns2", "c", 102.0)
    add(w, "ns1", "b", 101.0)
    add(w, "ns2", "d", 103.0)
    add(w, "ns2", "f", 105.0)
    assert order(w) == ["ns1/a", "ns1/b", "ns2/c", "ns2/d"]


def test_priority_still_comes_first() -> None:
    w = world(fair=True)
    heavy_ns1(w)
    add(w, "ns1", "urgent", 100.0, priority=5)
    add(w, "ns2", "c", 101.0)
    add(w, "ns2", "d", 102.0)
    add(w, "ns2", "e", 103.0)
    add(w, "ns2", "g", 104.0)
    got = order(w)
    assert got[0] == "ns1/urgent"
    assert got[1:] == ["ns2/c", "ns2/d", "ns2/e"]


def test_ranks_use_whole_percent_so_near_equal_namespaces_share_a_rank() -> None:
    w = world(fair=True)
    add(w, "ns1", "x", 1.0)
    add(w, "ns2", "y", 2.0)
    w.cycle()
    w.cycle(dt=H)
    ranks = w.cache.snapshot.history.namespace_ranks(w.cache.ledger.quotas["q"])
    assert ranks == {"ns1": 1, "ns2": 1}


def test_namespace_history_is_stored_and_read_back() -> None:
    w = world(fair=True)
    heavy_ns1(w)
    record = w.cache.snapshot.history.record("q")
    assert record is not None and record.namespaces["ns1"]["cpu"] > 1000
    text = history.render_record(record, H)
    assert json.loads(text)["namespaces"]["ns1"]["cpu"]
    back = history.parse_record(text)
    assert back is not None and back.namespaces == record.namespaces
    fresh = world(fair=True, record=text)
    fresh.now = record.at
    fresh.cycle(dt=0.5)
    fresh.cycle(dt=5)  # at least a grain later (history.FOLD_GRAIN_SECONDS)
    ranks = fresh.cache.snapshot.history.namespace_ranks(fresh.cache.ledger.quotas["q"])
    assert ranks["ns1"] == 1  # ns2 has no history: rank 0, ahead of it
    assert fresh.cache.snapshot.history.usage("q/ns1")["cpu"] == pytest.approx(
        record.namespaces["ns1"]["cpu"] * 2 ** (-5.5 / H), rel=1e-3
    )


def test_a_bad_fair_order_value_is_a_problem_not_a_silent_switch() -> None:
    config = queue("q").annotate(names.FAIR_ORDER_ANNOTATION, "user").build()
    assert not config.fair_order
    assert any(names.FAIR_ORDER_ANNOTATION in p for p in config.problems)
    assert queue("q").annotate(names.FAIR_ORDER_ANNOTATION, "namespace").build().fair_order


def test_the_record_of_a_quota_without_fair_order_names_no_namespaces() -> None:
    w = World(queues=(queue("q"),))
    w.cache = Cache(usage_half_life=H)
    w.cache.put_quota(shared_quota())
    w.cache.put_queue(queue("q").build())
    add(w, "ns1", "x", 1.0)
    w.cycle()
    w.cycle(dt=60)
    record = w.cache.snapshot.history.record("q")
    assert record == Record(at=record.at, usage=record.usage) and record.usage["cpu"] > 0


def test_fair_order_never_makes_an_equal_priority_unit_a_victim() -> None:
    """Preemption compares priority keys: a quiet namespace's unit goes first in line, but an
    older unit of equal priority that holds the quota is no victim of it, as without the order."""
    for fair in (False, True):
        w = World()
        w.cache = Cache(usage_half_life=H)
        w.cache.put_quota(shared_quota(cpu="2"))
        qb = queue("q").wait_for_pods_running().preemption()
        if fair:
            qb = qb.annotate(names.FAIR_ORDER_ANNOTATION, names.FAIR_ORDER_NAMESPACE)
        w.cache.put_queue(qb.build())
        add(w, "ns1", "old-1", 1.0)
        assert admits(w.cycle()) == ["old-1"]  # not running: it holds the queue
        w.cycle(dt=H)
        add(w, "ns2", "new", 10.0)
        plan = w.cycle(dt=2)
        assert not any(d.__class__.__name__ == "MarkVictims" for d in plan.decisions), fair
        assert admits(plan) == [], fair  # old-1 sorts first by priority key: it holds the queue
        if fair:
            assert w.cache.state.queues["q"].ranks == {"ns1": 1}

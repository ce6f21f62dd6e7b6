"""Gangs: whole-or-nothing reclaim and partial admission
(docs/compatibility.md#gangs-and-partial-admission).

Tables for the floor of a pod set and the reclaimable count, the preempt walk's preference for
units with no bound pod, partial admission through the scheduler's own :class:`Cache` (the
``World`` harness), and hypothesis properties: no preemption plan ever leaves a gang broken, and a
partial admission is the largest size that fits.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Unit
from koord_queue.shared.core import gangs
from koord_queue.shared.core.preemption import MarkVictims, reclaimable
from koord_queue.shared.jobs import jobext, registry
from koord_queue.shared.jobs.base import JobSpecError
from tests.unit.test_model import UnitBuilder, queue, quota, unit
from tests.unit.test_scheduling import World, admits


def gang(name: str, *, count: int, min_count: int | None, cpu: str = "1") -> UnitBuilder:
    b = unit(name).quota("q").cpu(cpu, count)
    if min_count is not None:
        b.spec["podSet"][0]["minCount"] = min_count
    return b


def of_kind(u: Unit, kind: str) -> Unit:
    return dataclasses.replace(u, consumer_kind=kind)


# --- floors and counts --------------------------------------------------------------------------


def test_floor_comes_from_min_count_or_the_kind() -> None:
    assert gangs.floor(gang("g", count=8, min_count=3).build(), "g") == 3
    assert gangs.floor(gang("g", count=8, min_count=None).build(), "g") is None
    workers = unit("w").quota("q").podset("worker", 4, cpu="1").podset("master", 1, cpu="1").build()
    assert gangs.floor(of_kind(workers, "PyTorchJob"), "worker") == 4
    assert gangs.floor(of_kind(workers, "PyTorchJob"), "master") is None
    assert gangs.floor(of_kind(workers, "Job"), "worker") is None
    ray = unit("r").quota("q").podset("head", 1, cpu="1").podset("gpu-group", 3, cpu="1").build()
    assert gangs.floor(of_kind(ray, "RayJob"), "gpu-group") == 3
    assert gangs.floor(of_kind(ray, "RayJob"), "head") is None


@pytest.mark.parametrize(
    ("replicas", "running", "floor", "unit_bound", "expected"),
    [
        (4, 0, 4, False, 4),  # nothing bound: the whole gang goes
        (4, 2, 4, True, 0),  # half-bound whole gang: untouchable
        (6, 2, 4, True, 2),  # elastic part above the floor: only unbound ones beyond it
        (6, 5, 4, True, 1),
        (4, 0, 4, True, 0),  # another pod set of the unit is bound: keep this one whole
    ],
)
def test_reclaim_count(replicas: int, running: int, floor: int, unit_bound: bool, expected: int) -> None:
    assert gangs.reclaim_count(replicas, running, floor, unit_bound=unit_bound) == expected


def test_a_half_bound_gang_is_no_victim_and_an_unbound_one_goes_whole() -> None:
    half = gang("g", count=4, min_count=4).admitted(4, 2).build()
    assert reclaimable(half, now=0, protect=0) is None
    idle = gang("g", count=4, min_count=4).admitted(4, 0).build()
    found = reclaimable(idle, now=0, protect=0)
    assert found is not None and found.reclaim == {"g": 4}
    single = unit("s").quota("q").cpu("1", 4).admitted(4, 2).build()
    found = reclaimable(single, now=0, protect=0)
    assert found is not None and found.reclaim == {"s": 2}  # no gang: every unbound replica


def test_the_master_bound_keeps_the_workers_whole() -> None:
    u = unit("w").quota("q").podset("master", 1, cpu="1").podset("worker", 3, cpu="1")
    u.admitted(1, 1, podset="master").admitted(3, 0, podset="worker")
    assert reclaimable(of_kind(u.build(), "TFJob"), now=0, protect=0) is None


# --- the preempt walk ---------------------------------------------------------------------------


def test_among_equal_priorities_a_victim_with_no_bound_pod_goes_first() -> None:
    w = World(quota("q", cpu="4"), queues=(queue("q").preemption(),))
    w.add(
        unit("older").quota("q").priority(1).created(1).cpu("1", 2).admitted(2, 1),
        unit("newer").quota("q").priority(1).created(2).cpu("1", 2).admitted(2, 0),
    )
    w.add(unit("p").quota("q").priority(5).created(10).cpu("1"))
    plan = w.cycle(apply=False)
    (mark,) = plan.marks
    assert [v.key for v in mark.victims] == ["default/newer"]


# --- partial admission --------------------------------------------------------------------------


def test_partial_admission_takes_the_largest_size_that_fits_then_grows() -> None:
    w = World(quota("q", cpu="6"), queues=(queue("q"),))
    w.add(unit("other").quota("q").cpu("1").admitted(1, 1))
    w.add(gang("g", count=8, min_count=3))
    plan = w.cycle()
    (admit,) = plan.admits
    assert admit.grants == {"g": 5} and admit.request == {"cpu": 5000}
    assert w.u("g").admissions[0].replicas == 5
    w.finish("other")
    assert admits(w.cycle()) == []  # its own admission is still being written: not tried again
    w.replace("g", resource_version="2")  # the write landed (the watch shows a newer version)
    assert admits(w.cycle()) == ["g"]  # grows by what was freed
    assert w.u("g").admissions[0].replicas == 6


def test_below_min_count_nothing_is_admitted() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(gang("g", count=8, min_count=3))
    plan = w.cycle()
    assert not plan.admits


def test_without_min_count_the_whole_demand_or_nothing() -> None:
    w = World(quota("q", cpu="6"), queues=(queue("q"),))
    w.add(gang("g", count=8, min_count=None))
    assert not w.cycle().admits


def test_partial_grants_is_the_largest_fitting_size() -> None:
    u = gang("g", count=10, min_count=2).build()
    assert gangs.partial_grants(u, {"g": 10}, lambda r: r.get("cpu", 0) <= 7000) == {"g": 7}
    assert gangs.partial_grants(u, {"g": 10}, lambda r: r.get("cpu", 0) <= 1000) is None
    plain = gang("p", count=10, min_count=None).build()
    assert gangs.partial_grants(plain, {"p": 10}, lambda r: True) is None


@given(
    count=st.integers(1, 40), floor=st.integers(1, 40), room=st.integers(0, 50), admitted=st.integers(0, 40)
)
def test_partial_grants_property(count: int, floor: int, room: int, admitted: int) -> None:
    floor = min(floor, count)
    admitted = min(admitted, count - 1)
    b = gang("g", count=count, min_count=floor)
    if admitted:
        b.admitted(admitted, 0)
    u = b.build()
    missing = count - admitted
    got = gangs.partial_grants(u, {"g": missing}, lambda r: r.get("cpu", 0) <= room * 1000)
    lowest = max(1, floor - admitted)
    if got is None:
        assert room < lowest or missing <= lowest or room >= missing
    else:
        assert lowest <= got["g"] < missing
        assert got["g"] == min(room, missing - 1)


# --- no plan leaves a gang broken -----------------------------------------------------------------

_GANGS = st.lists(
    st.tuples(st.integers(0, 10), st.integers(1, 4), st.integers(0, 4), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(victims=_GANGS, prio=st.integers(0, 12), cpu=st.integers(1, 10))
def test_no_preemption_plan_leaves_a_gang_broken(
    victims: list[tuple[int, int, int, bool]], prio: int, cpu: int
) -> None:
    total = sum(count for _, count, _, _ in victims)
    w = World(quota("q", cpu=str(total)), queues=(queue("q").preemption(),))
    for i, (p, count, running, is_gang) in enumerate(victims):
        b = gang(f"v{i}", count=count, min_count=count if is_gang else None).priority(p).created(i)
        w.add(b.admitted(count, min(running, count)))
    w.add(unit("p").quota("q").priority(prio).created(100).cpu(str(cpu)))
    plan = w.cycle(apply=False)
    for mark in plan.marks:
        assert isinstance(mark, MarkVictims)
        for victim in mark.victims:
            u = w.cache.units[victim.key]
            bound = any(a.running > 0 for a in u.admissions)
            for adm in u.admissions:
                taken = victim.reclaim.get(adm.name, 0)
                assert taken <= adm.replicas - adm.running, "a bound pod is never reclaimed"
                floor = gangs.floor(u, adm.name)
                if floor is not None and taken:
                    whole = taken == adm.replicas and not bound
                    assert whole or adm.replicas - taken >= floor, "a gang is left broken"


# --- batch/v1 Job opt-in ----------------------------------------------------------------------------


def _job(annotations: dict[str, str], parallelism: int = 5) -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns", "annotations": annotations},
        "spec": {
            "parallelism": parallelism,
            "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
        },
    }


def test_a_job_opts_in_with_its_min_parallelism_annotation() -> None:
    adapter = registry.by_extension("job")
    spec = jobext.desired_spec(_job({names.JOB_MIN_PARALLELISM_ANNOTATION: "2"}), adapter, {})
    assert spec["podSet"][0]["count"] == 5 and spec["podSet"][0]["minCount"] == 2
    plain = jobext.desired_spec(_job({}), adapter, {})
    assert "minCount" not in plain["podSet"][0]
    capped = jobext.desired_spec(_job({names.JOB_MIN_PARALLELISM_ANNOTATION: "9"}), adapter, {})
    assert capped["podSet"][0]["minCount"] == 5


@pytest.mark.parametrize("bad", ["0", "-1", "two", ""])
def test_a_bad_min_parallelism_is_refused_with_its_field(bad: str) -> None:
    adapter = registry.by_extension("job")
    with pytest.raises(JobSpecError) as err:
        jobext.desired_spec(_job({names.JOB_MIN_PARALLELISM_ANNOTATION: bad}), adapter, {})
    assert names.JOB_MIN_PARALLELISM_ANNOTATION in str(err.value)


def test_the_door_refuses_a_bad_min_parallelism() -> None:
    adapter = registry.by_extension("job")
    (err,) = adapter.admission_errors(None, _job({names.JOB_MIN_PARALLELISM_ANNOTATION: "many"}))
    assert names.JOB_MIN_PARALLELISM_ANNOTATION in str(err)
    assert adapter.admission_errors(None, _job({names.JOB_MIN_PARALLELISM_ANNOTATION: "3"})) == []

"""Node pools in the scheduler (docs/pools.md): a pool's root admits what its nodes hold, a quota
inside a pool admits into it, a quota with ``koord-queue/pool-quotas`` falls back between pools in
order with its own cap across them, a job narrows the order, a pool the job's own selector
contradicts is skipped, and usage stays the sum of what the units present hold."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import names, parsing
from koord_queue.shared.api.model import Quota, evolve
from koord_queue.shared.api.placement import PoolPlacement, Requirement
from koord_queue.shared.core.plan import Admit, Park
from koord_queue.shared.core.quota import QuotaLedger, Route
from koord_queue.shared.core.usage import UsageView
from tests.unit.test_model import UnitBuilder, queue, unit
from tests.unit.test_scheduling import World

GPU = "nvidia.com/gpu"
UNBOUNDED = "4611686018427387"
PLACEMENTS = {
    "h100": PoolPlacement("h100", "h100-root", {"gpu": "h100"}),
    "a100": PoolPlacement("a100", "a100-root", {"gpu": "a100"}),
}


def pool_root(name: str, gpus: int) -> Quota:
    """A pool's root quota as the profile controller writes it: min = the nodes, max unbounded."""
    labels = {
        names.QUOTA_IS_ROOT_LABEL: "true",
        names.QUOTA_PROFILE_LABEL: name,
        names.QUOTA_TREE_ID_LABEL: "1",
    }
    return parsing.parse_quota(
        {
            "metadata": {"name": f"{name}-root", "namespace": "pools", "labels": labels},
            "spec": {"min": {GPU: str(gpus)}, "max": {GPU: UNBOUNDED}},
        }
    )


def team(name: str, gpus: int, *, parent: str | None = None, pool_quotas: str | None = None) -> Quota:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    annotations = {names.POOL_QUOTAS_ANNOTATION: pool_quotas} if pool_quotas is not None else {}
    return parsing.parse_quota(
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": annotations},
            "spec": {"max": {GPU: str(gpus)}},
        }
    )


def job(name: str, quota: str, gpus: int = 4, *, count: int = 1, **extra: Any) -> UnitBuilder:
    b = unit(name).quota(quota).podset(name, count, **{GPU: str(gpus)})
    template = b.spec["podSet"][0]["template"]["spec"]
    if "node_selector" in extra:
        template["nodeSelector"] = extra["node_selector"]
    if "pools" in extra:
        b.raw()["metadata"]["annotations"] = {names.POOLS_ANNOTATION: extra["pools"]}
    return b


def fallback_world() -> World:
    world = World(
        pool_root("h100", 32),
        pool_root("a100", 32),
        team("team-a", 16, pool_quotas="team-a-h100, team-a-a100"),
        team("team-a-h100", 8, parent="h100-root"),
        team("team-a-a100", 16, parent="a100-root"),
        queues=(queue("team-a"),),
    )
    world.cache.set_placements(PLACEMENTS)
    return world


def admits(plan: Any) -> dict[str, tuple[str, str]]:
    return {d.key.split("/")[1]: (d.pool, d.pool_quota) for d in plan.decisions if isinstance(d, Admit)}


def parks(plan: Any) -> dict[str, str]:
    return {d.key.split("/")[1]: d.message for d in plan.decisions if isinstance(d, Park)}


def test_a_pool_root_admits_what_its_nodes_hold_not_its_unbounded_max() -> None:
    root = pool_root("h100", 8)
    assert root.pool == "h100"
    assert root.max == {GPU: 8000}
    plain = parsing.parse_quota(
        {
            "metadata": {"name": "r", "labels": {names.QUOTA_IS_ROOT_LABEL: "true"}},
            "spec": {"max": {GPU: "99"}},
        }
    )
    assert (plain.pool, plain.max) == ("", {GPU: 99000}), "is-root without a profile is no pool"


def test_a_quota_inside_a_tree_admits_into_its_pool_up_to_the_pools_size() -> None:
    world = World(
        pool_root("h100", 8), team("team-h100", 16, parent="h100-root"), queues=(queue("team-h100"),)
    )
    world.cache.set_placements(PLACEMENTS)
    world.add(*(job(f"j{i}", "team-h100") for i in range(3)))
    plan = world.cycle()
    assert admits(plan) == {"j0": ("h100", ""), "j1": ("h100", "")}
    assert parks(plan)["j2"].startswith(names.Message.limited("h100-root", GPU))
    assert world.u("j0").pool == "h100"


def test_a_pool_without_a_known_profile_is_not_admitted_into_until_it_is_known() -> None:
    world = World(
        pool_root("h100", 8), team("team-h100", 16, parent="h100-root"), queues=(queue("team-h100"),)
    )
    world.add(job("j0", "team-h100"))
    plan = world.cycle()
    assert parks(plan) == {"j0": "pool h100: no ElasticQuotaProfile named h100 is known"}
    world.cache.set_placements(PLACEMENTS)
    assert admits(world.cycle()) == {"j0": ("h100", "")}


def test_fallback_fills_pools_in_order_and_caps_across_them() -> None:
    world = fallback_world()
    world.add(*(job(f"j{i}", "team-a") for i in range(5)))
    plan = world.cycle()
    assert admits(plan) == {
        "j0": ("h100", "team-a-h100"),
        "j1": ("h100", "team-a-h100"),
        "j2": ("a100", "team-a-a100"),
        "j3": ("a100", "team-a-a100"),
    }
    ledger = world.cache.ledger
    assert ledger.used("team-a") == {GPU: 16000}
    assert ledger.used("team-a-h100") == ledger.used("h100-root") == {GPU: 8000}
    assert ledger.used("team-a-a100") == ledger.used("a100-root") == {GPU: 8000}
    message = parks(plan)["j4"]
    assert message.startswith("pool h100: ") and "; pool a100: " in message
    assert names.Message.limited("team-a", GPU) in message


def test_a_finished_job_frees_its_pool_and_the_waiting_job_takes_it() -> None:
    world = fallback_world()
    world.add(*(job(f"j{i}", "team-a") for i in range(5)))
    world.cycle()
    world.finish("j0")
    assert world.cache.ledger.used("team-a-h100") == {GPU: 4000}
    assert admits(world.cycle()) == {"j4": ("h100", "team-a-h100")}


def test_a_job_narrows_and_reorders_the_pools_but_never_reaches_one_its_quota_does_not_list() -> None:
    world = fallback_world()
    world.add(job("only-a100", "team-a", pools="a100"), job("l4", "team-a", pools="l4, h100"))
    world.add(job("nowhere", "team-a", pools="l4"))
    plan = world.cycle()
    assert admits(plan) == {"only-a100": ("a100", "team-a-a100"), "l4": ("h100", "team-a-h100")}
    assert parks(plan)["nowhere"] == (
        "none of the job's pools (l4) is one its quota team-a admits to (h100, a100)"
    )


def test_a_pool_the_jobs_own_selector_contradicts_is_skipped_and_named() -> None:
    world = fallback_world()
    world.add(job("wants-a100", "team-a", node_selector={"gpu": "a100"}))
    world.add(job("wants-l4", "team-a", node_selector={"gpu": "l4"}))
    plan = world.cycle()
    assert admits(plan) == {"wants-a100": ("a100", "team-a-a100")}
    message = parks(plan)["wants-l4"]
    assert message.startswith("pool h100: skipped: ") and "pool a100: skipped: " in message


def test_a_unit_holding_an_admission_stays_in_its_pool() -> None:
    world = fallback_world()
    world.add(job("g", "team-a", gpus=1, count=4))
    world.cycle()
    assert world.u("g").pool == "h100"
    options = world.cache.ledger.routes("team-a")
    assert options == (Route("h100", "team-a-h100"), Route("a100", "team-a-a100"))
    from koord_queue.shared.core import pools

    held = evolve(world.u("g"), pools=("a100",))
    assert [o.route for o in pools.options(held, world.cache.ledger, PLACEMENTS)] == [
        Route("h100", "team-a-h100")
    ]


def test_a_pool_listed_by_a_quota_outside_any_tree_is_skipped() -> None:
    world = World(team("team-a", 16, pool_quotas="loose"), team("loose", 8), queues=(queue("team-a"),))
    world.cache.set_placements(PLACEMENTS)
    world.add(job("j", "team-a"))
    assert parks(world.cycle())["j"] == "pool loose: quota loose is not inside any pool's tree"


def test_the_selector_contradiction_reads_the_pools_expressions_too() -> None:
    world = World(pool_root("h100", 8), team("t", 8, parent="h100-root"), queues=(queue("t"),))
    world.cache.set_placements(
        {"h100": PoolPlacement("h100", "h100-root", {}, (Requirement("gpu", "In", ("h100",)),))}
    )
    world.add(job("j", "t", node_selector={"gpu": "a100"}))
    assert parks(world.cycle())["j"].startswith("pool h100: skipped: ")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(["", "team-a-h100", "team-a-a100"]), st.integers(0, 3)),
        max_size=25,
    )
)
def test_routed_usage_always_equals_the_sum_over_present_units(events: list[tuple[int, str, int]]) -> None:
    ledger = QuotaLedger()
    for q in fallback_world().cache.ledger.quotas.values():
        ledger.put_quota(q)
    present: dict[str, tuple[str, int]] = {}
    for index, via, gpus in events:
        name = f"u{index}"
        if gpus == 0:
            ledger.delete_unit(f"default/{name}")
            present.pop(name, None)
            continue
        u = evolve(job(name, "team-a", gpus).admitted(1).build(), pool_quota=via)
        ledger.put_unit(u)
        present[name] = (via, gpus * 1000)
    for quota_name in ("team-a", "team-a-h100", "team-a-a100", "h100-root", "a100-root"):
        expected = sum(
            g
            for via, g in present.values()
            if quota_name == "team-a"
            or via == quota_name
            or (via and quota_name == f"{via.split('-')[-1]}-root")
        )
        assert ledger.used(quota_name).get(GPU, 0) == expected, quota_name
    view = UsageView(ledger)
    assert view.check({GPU: 0}, "team-a", item="x", via="team-a-h100") is None


def test_the_visibility_api_and_explain_name_the_pool() -> None:
    from koord_queue.shared.core import pools, visibility

    world = fallback_world()
    world.add(*(job(f"j{i}", "team-a") for i in range(5)))
    plan = world.cycle()
    item = visibility._item(world.u("j0"), None)
    assert (item["pool"], item["poolQuota"]) == ("h100", "team-a-h100")
    assert "pool" not in visibility._item(world.u("j4"), 1)
    parts = pools.tried(parks(plan)["j4"])
    assert [p.split(":")[0] for p in parts] == ["pool h100", "pool a100"]
    assert pools.tried("limited quotaName:x, limited resKey:cpu,") == []


def test_the_webhook_refuses_pool_lists_it_cannot_read_with_what_it_expects() -> None:
    from koord_queue.shared.admission import validation

    assert validation.validate_job_annotations({names.POOLS_ANNOTATION: "a100, h100"}) == []
    (error,) = validation.validate_job_annotations({names.POOLS_ANNOTATION: "A100;h100"})
    assert "comma-separated list of pool (ElasticQuotaProfile) names" in str(error)
    assert validation.validate_job_annotations({names.POOLS_ANNOTATION: ","}) != []

    def quota_with(value: str, name: str = "team-a") -> list[Any]:
        meta = {"name": name, "annotations": {names.POOL_QUOTAS_ANNOTATION: value}}
        return validation.validate_elastic_quota({"metadata": meta, "spec": {"max": {"cpu": "1"}}})

    assert quota_with("team-a-h100, team-a-a100") == []
    assert "quota names inside node pools" in str(quota_with("team a h100"))
    assert "cannot fall back through itself" in str(quota_with("team-a-h100, team-a"))


def test_min_borrowing_and_reclaim_work_inside_a_pools_tree_as_in_any_tree() -> None:
    import dataclasses

    from koord_queue.shared.core.preemption import MarkVictims
    from koord_queue.shared.core.scheduling import Cache
    from tests.unit.test_guarantees import eq, jobs, settle, used

    world = World(queues=(queue("a"), queue("b")))
    world.cache = Cache(quota_guarantees=True)
    root = parsing.parse_quota(
        {
            "metadata": {
                "name": "cpu-root",
                "namespace": "pools",
                "labels": {names.QUOTA_IS_ROOT_LABEL: "true", names.QUOTA_PROFILE_LABEL: "cpu-pool"},
            },
            "spec": {"min": {"cpu": "10"}, "max": {"cpu": UNBOUNDED}},
        }
    )
    world.cache.put_quota(root)
    for child in (eq("a", min_cpu="5"), eq("b", min_cpu="5")):
        world.cache.put_quota(dataclasses.replace(child, parent="cpu-root"))
    for name in ("a", "b"):
        world.cache.put_queue(queue(name).build())
    world.cache.set_placements({"cpu-pool": PoolPlacement("cpu-pool", "cpu-root")})
    borrowed = jobs(world, "a", 12, priority=1)
    assert len(settle(world)) == 10, "the pool's 10 CPUs, not the root's unbounded max"
    for name in borrowed[:5]:
        world.run(name)
    jobs(world, "b", 3, start=50)
    plan = world.cycle()
    victims = [v.key.split("/")[1] for m in plan.decisions if isinstance(m, MarkVictims) for v in m.victims]
    assert victims == ["a-09", "a-08", "a-07"]
    for name in victims:
        world.reclaim(name)
    assert sorted(settle(world)) == ["b-50", "b-51", "b-52"]
    assert used(world, "b") == 3 and world.u("b-50").pool == "cpu-pool"

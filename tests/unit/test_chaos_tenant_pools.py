"""The hostile tenant's pool attacks (``chaos/tenant_pools.py``): the objects the harness and she
make, and the judges, which must see a pod out of its pool (or out of the gate) as a bypass and say
when a window proves nothing (docs/pools.md#placement)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from chaos import tenant
from chaos import tenant_pools as tp
from chaos.tenant_common import NAMESPACE
from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv import pools

GATE = {"name": names.ADMISSION_GATE}
UNIT = "mallory-pool-0"


def pod(
    *,
    rv: str = "5",
    gated: bool = False,
    selector: dict[str, str] | None = None,
    node: str | None = None,
    unit: str = f"{NAMESPACE}/{UNIT}",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if gated:
        spec["schedulingGates"] = [GATE]
    if selector is not None:
        spec["nodeSelector"] = selector
    if node:
        spec["nodeName"] = node
    meta = {"name": "p-1", "resourceVersion": rv, "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: unit}}
    return {"metadata": meta, "spec": spec}


def breaches(
    *versions: dict[str, Any], unit_pools: dict[str, set[str]] | None = None
) -> tuple[int, list[str]]:
    return tp.placement_breaches(
        versions, {UNIT: {tp.POOL.name}} if unit_pools is None else unit_pools, tp.POOLS
    )


def test_a_released_pod_with_its_pools_selector_bound_in_the_pool_is_no_breach() -> None:
    placed = dict(tp.POOL.match_labels)
    assert breaches(pod(selector=placed), pod(rv="6", selector=placed, node=tp.POOL.node_name(0))) == (2, [])
    # A selector of its own beside the pool's is the pod's business.
    assert breaches(pod(selector={**placed, "zone": "a"})) == (1, [])


def test_a_released_pod_without_its_pools_selector_or_bound_elsewhere_is_a_breach() -> None:
    checked, found = breaches(pod(rv="7", selector={}))
    assert checked == 1 and "resourceVersion 7" in found[0] and pools.POOL_LABEL in found[0]
    other = dict(tp.OTHER.match_labels)
    assert len(breaches(pod(selector=other))[1]) == 1
    placed = dict(tp.POOL.match_labels)
    _, found = breaches(pod(selector=placed, node=tp.OTHER.node_name(0)))
    assert len(found) == 1 and f"bound to {tp.OTHER.node_name(0)}" in found[0]


def test_gated_pods_and_pods_of_units_without_a_pool_are_not_judged() -> None:
    assert breaches(pod(gated=True, selector={})) == (0, [])
    assert breaches(pod(selector={}, unit=f"{NAMESPACE}/another")) == (0, [])
    # A unit of the same name in another namespace is not hers.
    assert breaches(pod(selector={}, unit=f"chaos/{UNIT}")) == (0, [])


def test_a_unit_admitted_to_a_pool_the_harness_never_made_is_a_breach() -> None:
    _, found = breaches(pod(selector=dict(tp.POOL.match_labels)), unit_pools={UNIT: {"mallory-everything-0"}})
    assert len(found) == 1 and "never made" in found[0]


def test_the_unlisted_pool_judge() -> None:
    said = "none of the job's pools (chaos-pool-other) is one its quota chaos-mallory-fallback admits to"
    assert tp.judge_unlisted(0, [], said, 20.0)[0] == "neutralised"
    assert tp.judge_unlisted(1, [], said, 20.0)[0] == "SUCCEEDED"
    outcome, detail = tp.judge_unlisted(0, ["p-1"], said, 20.0)
    assert outcome == "SUCCEEDED" and "p-1" in detail
    # Waiting for another reason proves nothing about the pools.
    assert tp.judge_unlisted(0, [], "limited quotaName:x", 36.0)[0] == "skipped"


def test_the_gated_pod_judge() -> None:
    narrowed = {pools.POOL_LABEL: tp.OTHER.name}
    kept = [pod(gated=True, selector=narrowed), pod(rv="6", gated=True, selector=narrowed)]
    outcome, detail = tp.judge_gated(kept, grown=True, conflict_seen=True)
    assert outcome == "neutralised" and "PoolPlacementConflict named it" in detail
    assert tp.judge_gated(kept, grown=False, conflict_seen=True)[0] == "skipped"
    assert tp.judge_gated([], grown=True, conflict_seen=False)[0] == "skipped"
    released = [*kept, pod(rv="9", selector=narrowed)]
    outcome, detail = tp.judge_gated(released, grown=True, conflict_seen=True)
    assert outcome == "SUCCEEDED" and "rv 9" in detail and "out of the gate" in detail
    # Bound counts whatever the gate says, and whether the admission grew or not.
    assert tp.judge_gated([pod(gated=True, node="n")], grown=False, conflict_seen=False)[0] == "SUCCEEDED"


def test_the_conflict_event_must_name_the_pod() -> None:
    event = {"reason": "PoolPlacementConflict", "message": "pod p-1 stays gated: it cannot run on pool x"}
    assert tp.conflict_named([event], "p-1")
    assert not tp.conflict_named([event], "p-")
    assert not tp.conflict_named([{**event, "reason": "Other"}], "p-1")


def test_her_quotas_put_the_fallback_over_her_pool_quota_only() -> None:
    inside, fallback = tp.quota_bodies()
    assert inside["metadata"]["labels"] == {names.QUOTA_PARENT_LABEL: tp.POOL.root_quota}
    assert inside["metadata"]["namespace"] == fallback["metadata"]["namespace"] == NAMESPACE
    assert names.QUOTA_PARENT_LABEL not in fallback["metadata"]["labels"]
    assert fallback["metadata"]["annotations"][names.POOL_QUOTAS_ANNOTATION] == tp.POOL_QUOTA


def test_her_widenings_reach_the_other_pool_and_put_back_what_the_harness_gave() -> None:
    inside, fallback = tp.quota_bodies()
    given = {
        tp.FALLBACK_QUOTA: fallback["metadata"]["annotations"][names.POOL_QUOTAS_ANNOTATION],
        tp.POOL_QUOTA: inside["metadata"]["labels"][names.QUOTA_PARENT_LABEL],
    }
    assert {quota: back for quota, (_, _, back) in tp.WIDENINGS.items()} == given
    assert all(tp.OTHER.root_quota in wanted for _, wanted, _ in tp.WIDENINGS.values())


def test_her_jobs_and_profile() -> None:
    job = tp.pool_job_body("j", wants=tp.OTHER.name)
    assert job["metadata"]["labels"] == {names.QUOTA_NAME_LABEL: tp.FALLBACK_QUOTA}
    assert job["metadata"]["annotations"][names.POOLS_ANNOTATION] == tp.OTHER.name
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (1, 2)
    assert "nodeSelector" not in job["spec"]["template"]["spec"]
    assert names.POOLS_ANNOTATION not in tp.pool_job_body("j")["metadata"]["annotations"]
    profile = tp.greedy_profile("mine")
    assert profile["metadata"]["namespace"] == NAMESPACE and profile["spec"]["nodeSelector"] == {}


def test_the_pools_are_apart_and_every_pool_attack_is_registered() -> None:
    assert not set(tp.POOL.node_names) & set(tp.OTHER.node_names)
    assert tp.POOL.match_labels != tp.OTHER.match_labels
    assert set(tp.ATTACKS) <= set(tenant.ATTACKS)
    assert {a: tenant.ATTACKS[a] for a in tp.ATTACKS} == tp.ATTACKS


async def test_the_final_check_counts_and_reports() -> None:
    recorder = tp.PoolRecorder(admin=None)  # type: ignore[arg-type]
    recorder.note_unit({"metadata": {"name": UNIT}, "status": {"pool": tp.POOL.name}})
    recorder.note_unit({"metadata": {"name": "plain"}, "status": {}})
    recorder.note_pod({**pod(rv="3", gated=True), "metadata": {**pod()["metadata"], "uid": "u"}})
    recorder.note_pod({**pod(rv="4", selector={}), "metadata": {**pod(rv="4")["metadata"], "uid": "u"}})
    assert recorder.unit_pools == {UNIT: {tp.POOL.name}} and len(recorder.released) == 1
    checked, found = tp.placement_breaches(recorder.released.values(), recorder.unit_pools, tp.POOLS)
    assert checked == 1 and len(found) == 1
    checks: Counter[str] = Counter()
    assert await tp.final_check(None, checks) == [] and not checks


class FakeAdmin:
    """Lists and watches of her namespace: the first watch of each kind breaks with a 429 after one
    event, the next ones end at once; each list answers what the script holds."""

    def __init__(self) -> None:
        self.lists: Counter[str] = Counter()
        self.watches: Counter[str] = Counter()
        #: set once both kinds are watched again after their break
        self.rewatched = asyncio.Event()

    async def list(self, res: Any, *, namespace: str) -> tuple[list[dict[str, Any]], str]:
        assert namespace == NAMESPACE
        self.lists[res.plural] += 1
        if res.plural == "pods":
            return [{**pod(rv="1", selector={}), "metadata": {**pod(rv="1")["metadata"], "uid": "a"}}], "1"
        return [{"metadata": {"name": UNIT}, "status": {"pool": tp.POOL.name}}], "1"

    async def watch(self, res: Any, **_: Any) -> Any:
        self.watches[res.plural] += 1
        if sum(self.watches.values()) >= 4:
            self.rewatched.set()
        if self.watches[res.plural] == 1 and res.plural == "pods":
            yield (
                "MODIFIED",
                {**pod(rv="2", selector={}), "metadata": {**pod(rv="2")["metadata"], "uid": "a"}},
            )
        if self.watches[res.plural] == 1:
            raise kube.KubeError(429, "TooManyRequests", "slow down")
        await asyncio.sleep(3600)  # a quiet watch: until the recorder is stopped
        yield "BOOKMARK", {}


async def test_the_record_begins_a_broken_watch_again_from_a_fresh_list_and_says_why() -> None:
    admin = FakeAdmin()
    recorder = tp.PoolRecorder(admin=admin)  # type: ignore[arg-type]
    recorder.start()

    await asyncio.wait_for(admin.rewatched.wait(), timeout=10)
    await recorder.stop()
    assert admin.lists == Counter({"pods": 2, "queueunits": 2})
    assert recorder.relists == 2
    assert recorder.breaks == Counter(
        {"pods: HTTP 429 TooManyRequests": 1, "queueunits: HTTP 429 TooManyRequests": 1}
    )
    # Both versions of the released pod were kept (the list's and the watch's), and the unit's pool.
    assert sorted(rv for _, rv in recorder.released) == ["1", "2"]
    assert recorder.unit_pools == {UNIT: {tp.POOL.name}}
    assert recorder.tasks == []

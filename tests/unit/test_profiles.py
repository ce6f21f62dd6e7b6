"""Node pools as pure decisions (shared/core/profiles.py, docs/pools.md#the-tree-of-a-pool): reading
profiles and nodes, the root quota Koordinator's controller would keep, tolerations, placement, the
profile that counts among same-named ones, and the patch that brings a root quota up to date."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from koord_queue.reconciler import main as reconciler_main
from koord_queue.reconciler.profiles import ProfileController, slim_node
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement, Requirement
from koord_queue.shared.core import profiles
from koord_queue.shared.core.profiles import Node, parse_node, parse_profile

UNBOUNDED = "4611686018427387"
GPU = "nvidia.com/gpu"


def profile(
    name: str = "h100",
    *,
    namespace: str = "pools",
    selector: Any = None,
    ratio: Any = None,
    keys: Any = None,
    labels: dict[str, str] | None = None,
    quota_labels: dict[str, str] | None = None,
    quota_name: Any = "h100-root",
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {"pool": "h100"}} if selector is None else selector
    }
    if quota_name is not None:
        spec["quotaName"] = quota_name
    if ratio is not None:
        spec["resourceRatio"] = ratio
    if quota_labels is not None:
        spec["quotaLabels"] = quota_labels
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "creationTimestamp": created}
    if keys is not None:
        meta["annotations"] = {profiles.RESOURCE_KEYS_ANNOTATION: keys}
    if labels is not None:
        meta["labels"] = labels
    return {
        "apiVersion": "quota.koordinator.sh/v1alpha1",
        "kind": "ElasticQuotaProfile",
        "metadata": meta,
        "spec": spec,
    }


def node(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: str | None = "True",
) -> Node:
    raw: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"pool": "h100"} if labels is None else labels},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi"} if allocatable is None else allocatable,
            "conditions": [] if ready is None else [{"type": "Ready", "status": ready}],
        },
    }
    return parse_node(raw)


# --- tree id -------------------------------------------------------------------------------------


def test_tree_id_matches_known_fnv1a_values() -> None:
    # FNV-1a 64: "a" -> 0xaf63dc4c8601ec8c (the published test vector). tree_id hashes
    # "namespace/name", so check the function on its input through a namespace-free vector:
    # hashing "/" is the case namespace="" and name="".
    def fnv(data: bytes) -> int:
        value = 0xCBF29CE484222325
        for byte in data:
            value = ((value ^ byte) * 0x100000001B3) % 2**64
        return value

    assert fnv(b"a") == 0xAF63DC4C8601EC8C
    assert profiles.tree_id("", "") == str(fnv(b"/"))
    assert profiles.tree_id("gpu-pools", "h100") == str(fnv(b"gpu-pools/h100"))
    assert profiles.tree_id("gpu-pools", "h100") != profiles.tree_id("gpu-pool", "sh100")


def test_a_profiles_own_tree_id_label_wins() -> None:
    own = parse_profile(profile(labels={names.QUOTA_TREE_ID_LABEL: "42"}))
    assert own.tree_id == "42"
    assert profiles.tree_id_patch(own) is None
    fresh = parse_profile(profile())
    assert profiles.tree_id_patch(fresh) == {
        "metadata": {"labels": {names.QUOTA_TREE_ID_LABEL: profiles.tree_id("pools", "h100")}}
    }


# --- reading profiles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "ratio", "problem"),
    [
        (None, None, None),
        ("0.9", Fraction(9, 10), None),
        ("1", Fraction(1), None),
        ("1e-1", Fraction(1, 10), None),
        (".5", Fraction(1, 2), None),
        ("0", Fraction(1), "not a decimal in (0, 1]"),
        ("-0.5", Fraction(1), "not a decimal in (0, 1]"),
        ("1.5", Fraction(1), "not a decimal in (0, 1]"),
        ("half", Fraction(1), "not a decimal in (0, 1]"),
        ("1/2", Fraction(1), "not a decimal in (0, 1]"),
        ("nan", Fraction(1), "not a decimal in (0, 1]"),
        ("1e-999999999", Fraction(1), "not a decimal in (0, 1]"),
        ("1e999999999", Fraction(1), "not a decimal in (0, 1]"),
        (0.5, Fraction(1), "not a decimal in (0, 1]"),
    ],
)
def test_resource_ratio(raw: Any, ratio: Fraction | None, problem: str | None) -> None:
    got, why = profiles.parse_ratio(raw)
    assert got == ratio
    assert (why is None) if problem is None else (why is not None and problem in why)


@pytest.mark.parametrize(
    ("annotation", "keys", "bad"),
    [
        (None, ("cpu", "memory"), False),
        ('["cpu","memory","nvidia.com/gpu"]', ("cpu", "memory", GPU), False),
        ('["nvidia.com/gpu","nvidia.com/gpu"]', (GPU,), False),
        ("[]", (), False),
        ("cpu,memory", ("cpu", "memory"), True),
        ('{"cpu": 1}', ("cpu", "memory"), True),
        ('["cpu", 3]', ("cpu", "memory"), True),
    ],
)
def test_resource_keys(annotation: str | None, keys: tuple[str, ...], bad: bool) -> None:
    parsed = parse_profile(profile(keys=annotation))
    assert parsed.resource_keys == keys
    assert any(profiles.RESOURCE_KEYS_ANNOTATION in p for p in parsed.problems) is bad
    assert parsed.writable  # a bad annotation never stops the root quota


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ({"matchLabels": {"a": "b"}}, None),
        ({}, None),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, None),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, None),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs values"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "operator"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "key"),
        ({"matchExpressions": ["junk"]}, "key"),
        ({"matchExpressions": {"a": "b"}}, "not a list"),
        ({"matchLabels": {"a": 1}}, "matchLabels"),
        ({"matchLabels": ["a"]}, "matchLabels"),
        ("pool=h100", "not an object"),
    ],
)
def test_selector_problems_stop_the_pool_but_never_raise(selector: Any, problem: str | None) -> None:
    parsed = parse_profile(profile(selector=selector))
    if problem is None:
        assert parsed.selector_problem is None and parsed.writable
    else:
        assert parsed.selector_problem is not None and problem in parsed.selector_problem
        assert not parsed.writable
        assert not profiles.selects(parsed, {"a": "b", "pool": "h100"})
        assert profiles.placement(parsed, []).problem == parsed.selector_problem


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"metadata": "x", "spec": []},
        {"metadata": {"name": "p", "annotations": {"x": 1}, "labels": ["l"]}, "spec": {"quotaName": 3}},
        {"metadata": {"name": "p"}, "spec": {"quotaLabels": "x", "nodeSelector": None}},
    ],
)
def test_bad_profiles_are_read_with_problems(raw: dict[str, Any]) -> None:
    parsed = parse_profile(raw)
    assert not parsed.writable
    assert any("quotaName" in p for p in parsed.problems)
    assert profiles.placement(parsed, [node("n1")]).problem is not None


def test_an_unset_selector_selects_no_node_and_an_empty_one_every_node() -> None:
    unset = parse_profile(profile(selector={}))
    assert profiles.selects(unset, {})
    raw = profile()
    del raw["spec"]["nodeSelector"]
    none = parse_profile(raw)
    assert none.writable and not profiles.selects(none, {"pool": "h100"})
    assert profiles.root_quota(none, [node("n1")]).min == {"cpu": 0, "memory": 0}
    assert "nodeSelector" in (profiles.placement(none, []).problem or "")


# --- nodes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ready", "unschedulable", "schedulable"),
    [
        ("True", False, True),
        ("True", True, False),
        ("False", False, False),
        ("Unknown", False, False),
        (None, False, False),
    ],
)
def test_a_node_is_schedulable_only_ready_and_uncordoned(
    ready: str | None, unschedulable: bool, schedulable: bool
) -> None:
    assert node("n", ready=ready, unschedulable=unschedulable).schedulable is schedulable


def test_a_nodes_bad_quantity_is_left_out_and_bad_parts_are_ignored() -> None:
    got = node("n", allocatable={"cpu": "4", "memory": "lots", GPU: 8})
    assert got.allocatable == {"cpu": 4000, GPU: 8000}
    junk = parse_node(
        {"metadata": [], "spec": {"taints": ["x", {"key": "k"}]}, "status": {"conditions": "x"}}
    )
    assert junk.taints == (("k", "", ""),) and not junk.ready and junk.allocatable == {}


# --- the root quota ------------------------------------------------------------------------------


def test_the_root_quota_follows_koordinators_controller() -> None:
    pool = parse_profile(
        profile(ratio="0.5", keys=json.dumps(["cpu", "memory", GPU]), quota_labels={"team": "ml"})
    )
    nodes = [
        node("a", allocatable={"cpu": "8", "memory": "32Gi", GPU: "8", "pods": "110"}),
        node("b", allocatable={"cpu": "7500m", "memory": "16Gi", GPU: "7"}, unschedulable=True),
        node("c", labels={"pool": "a100"}, allocatable={"cpu": "100", GPU: "100"}),
    ]
    root = profiles.root_quota(pool, nodes)
    assert (root.namespace, root.name) == ("pools", "h100-root")
    assert root.labels == {
        names.QUOTA_PROFILE_LABEL: "h100",
        "team": "ml",
        names.QUOTA_TREE_ID_LABEL: profiles.tree_id("pools", "h100"),
        names.QUOTA_IS_ROOT_LABEL: "true",
    }
    # cpu 15.5 * 0.5 in milli; gpu 15 * 0.5 in whole units, rounded down; memory 48Gi * 0.5
    assert root.min == {"cpu": 7750, "memory": 24 * 2**30 * 1000, GPU: 7000}
    assert root.max == dict.fromkeys(("cpu", "memory", GPU), int(UNBOUNDED) * 1000)
    assert json.loads(root.annotations[profiles.TOTAL_RESOURCE_ANNOTATION]) == {
        "cpu": "7750m",
        "memory": "24Gi",
        GPU: "7",
        "pods": "55",
    }
    assert json.loads(root.annotations[profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION]) == {
        "cpu": "3750m",
        "memory": "8Gi",
        GPU: "3",
    }
    body = profiles.quota_body(root)
    assert body["spec"]["max"] == {"cpu": UNBOUNDED, "memory": UNBOUNDED, GPU: UNBOUNDED}
    assert body["spec"]["min"] == {"cpu": "7750m", "memory": "24Gi", GPU: "7"}
    assert body["apiVersion"] == names.QUOTA_API_VERSION and body["metadata"]["namespace"] == "pools"


@pytest.mark.parametrize(
    ("ratio", "total", "expected"),
    [
        (None, {"cpu": 1, "memory": 1500}, {"cpu": 1, "memory": 1500}),  # no ratio: as summed
        (Fraction(1), {"cpu": 1, "memory": 1500}, {"cpu": 1, "memory": 2000}),  # a Value() rounds up
        (Fraction(1, 2), {"cpu": 3}, {"cpu": 1}),  # milli, rounded down
        (Fraction(1, 2), {GPU: 3000}, {GPU: 1000}),  # whole units, rounded down
        (Fraction(29, 100), {GPU: 100_000}, {GPU: 29_000}),  # exact: float64 gives 28
        (Fraction(9, 10), {"memory": 10 * 2**30 * 1000}, {"memory": 9663676416 * 1000}),
        (Fraction(1, 3), {"cpu": 10_000, "pods": 110_000}, {"cpu": 3333, "pods": 36_000}),
    ],
)
def test_ratio_rounding(ratio: Fraction | None, total: dict[str, int], expected: dict[str, int]) -> None:
    assert profiles.ratioed(total, ratio) == expected


def test_resource_keys_decide_min_and_max_and_missing_resources_are_zero() -> None:
    pool = parse_profile(profile(keys=json.dumps([GPU, "example.com/fpga"])))
    root = profiles.root_quota(pool, [node("a", allocatable={"cpu": "8", GPU: "4"})])
    assert root.min == {GPU: 4000, "example.com/fpga": 0}
    assert set(root.max) == {GPU, "example.com/fpga"}
    assert json.loads(root.annotations[profiles.TOTAL_RESOURCE_ANNOTATION]) == {"cpu": "8", GPU: "4"}


def test_a_bad_ratio_counts_as_one() -> None:
    pool = parse_profile(profile(ratio="2"))
    assert profiles.root_quota(pool, [node("a")]).min == {"cpu": 8000, "memory": 32 * 2**30 * 1000}
    assert any("resourceRatio" in p for p in pool.problems) and pool.writable


def test_unschedulable_and_not_ready_nodes_still_count_and_are_reported() -> None:
    pool = parse_profile(profile())
    nodes = [node("a"), node("b", ready="False"), node("c", unschedulable=True), node("d", ready=None)]
    root = profiles.root_quota(pool, nodes)
    assert root.min == {"cpu": 32_000, "memory": 128 * 2**30 * 1000}
    unschedulable = json.loads(root.annotations[profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION])
    assert unschedulable == {"cpu": "24", "memory": "96Gi"}
    empty = profiles.root_quota(pool, [node("a")])
    assert empty.annotations[profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION] == "{}"


def test_quota_labels_may_replace_the_profile_label_but_not_the_trees() -> None:
    pool = parse_profile(
        profile(
            quota_labels={
                names.QUOTA_PROFILE_LABEL: "other",
                names.QUOTA_IS_ROOT_LABEL: "false",
                names.QUOTA_TREE_ID_LABEL: "1",
            }
        )
    )
    labels = profiles.root_quota(pool, []).labels
    assert labels[names.QUOTA_PROFILE_LABEL] == "other"
    assert labels[names.QUOTA_IS_ROOT_LABEL] == "true"
    assert labels[names.QUOTA_TREE_ID_LABEL] == profiles.tree_id("pools", "h100")


def test_selector_with_match_expressions_picks_the_pools_nodes() -> None:
    pool = parse_profile(
        profile(
            selector={
                "matchLabels": {"zone": "a"},
                "matchExpressions": [
                    {"key": "gpu", "operator": "In", "values": ["h100", "h200"]},
                    {"key": "spot", "operator": "DoesNotExist"},
                    {"key": "arch", "operator": "NotIn", "values": ["arm64"]},
                ],
            }
        )
    )
    nodes = [
        node("in-1", labels={"zone": "a", "gpu": "h100"}, allocatable={"cpu": "1"}),
        node("in-2", labels={"zone": "a", "gpu": "h200", "arch": "amd64"}, allocatable={"cpu": "2"}),
        node("spot", labels={"zone": "a", "gpu": "h100", "spot": "true"}, allocatable={"cpu": "4"}),
        node("arm", labels={"zone": "a", "gpu": "h100", "arch": "arm64"}, allocatable={"cpu": "8"}),
        node("zone-b", labels={"zone": "b", "gpu": "h100"}, allocatable={"cpu": "16"}),
        node("l4", labels={"zone": "a", "gpu": "l4"}, allocatable={"cpu": "32"}),
    ]
    assert [n.name for n in profiles.pool_nodes(pool, nodes)] == ["in-1", "in-2"]
    assert profiles.root_quota(pool, nodes).min == {"cpu": 3000, "memory": 0}
    assert pool.match_expressions == (
        Requirement("gpu", "In", ("h100", "h200")),
        Requirement("spot", "DoesNotExist"),
        Requirement("arch", "NotIn", ("arm64",)),
    )


# --- tolerations and placement -------------------------------------------------------------------


def test_tolerations_cover_the_pools_own_taints_only() -> None:
    nodes = [
        node(
            "a",
            taints=[
                {"key": "gpu", "value": "h100", "effect": "NoSchedule"},
                {"key": "dedicated", "effect": "NoExecute"},
                {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
            ],
        ),
        node("b", taints=[{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]),
        node("c", taints=[{"key": "gpu", "value": "h100", "effect": "NoExecute"}]),
    ]
    assert profiles.tolerations(nodes) == (
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
        {"key": "gpu", "operator": "Equal", "value": "h100", "effect": "NoExecute"},
        {"key": "gpu", "operator": "Equal", "value": "h100", "effect": "NoSchedule"},
    )


def test_placement_carries_the_selector_and_the_taints_of_the_pools_nodes() -> None:
    pool = parse_profile(
        profile(
            selector={
                "matchLabels": {"pool": "h100"},
                "matchExpressions": [{"key": "x", "operator": "Exists"}],
            }
        )
    )
    nodes = [
        node("in", labels={"pool": "h100", "x": "1"}, taints=[{"key": "gpu", "effect": "NoSchedule"}]),
        node("out", labels={"pool": "a100", "x": "1"}, taints=[{"key": "a100", "effect": "NoSchedule"}]),
    ]
    assert profiles.placement(pool, nodes) == PoolPlacement(
        name="h100",
        quota="h100-root",
        match_labels={"pool": "h100"},
        match_expressions=(Requirement("x", "Exists"),),
        tolerations=({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},),
    )


# --- same-named profiles -------------------------------------------------------------------------


def test_the_oldest_profile_of_a_name_counts_then_the_first_namespace() -> None:
    older = parse_profile(profile(namespace="b", created="2026-01-01T00:00:00Z"))
    newer = parse_profile(profile(namespace="a", created="2026-02-01T00:00:00Z"))
    same_time = parse_profile(profile(namespace="c", created="2026-01-01T00:00:00Z"))
    other = parse_profile(profile("a100", namespace="z"))
    counted = profiles.counting([newer, same_time, older, other])
    assert counted["h100"].namespace == "b"
    assert counted["a100"].namespace == "z"
    message = profiles.duplicate_message(newer, older)
    assert "a/h100" in message and "b/h100" in message


# --- bringing a root quota up to date ------------------------------------------------------------


def _existing(root: profiles.RootQuota, **changes: Any) -> dict[str, Any]:
    body = profiles.quota_body(root)
    body["metadata"]["labels"]["someone"] = "else"
    body["metadata"]["annotations"]["their"] = "note"
    for path, value in changes.items():
        part, key = path.split("__")
        (body["spec"] if part in ("min", "max") else body["metadata"])[part][key] = value
    return body


def test_a_quota_that_shows_the_root_needs_no_write_even_written_otherwise() -> None:
    root = profiles.root_quota(parse_profile(profile()), [node("a")])
    existing = _existing(root, min__cpu="8000m", min__memory="34359738368")
    total = root.annotations[profiles.TOTAL_RESOURCE_ANNOTATION]
    existing["metadata"]["annotations"][profiles.TOTAL_RESOURCE_ANNOTATION] = json.dumps(
        json.loads(total), indent=1
    ).replace('"8"', '"8000m"')
    assert profiles.quota_patch(existing, root) is None


def test_the_patch_sets_what_differs_and_never_removes_others_labels() -> None:
    root = profiles.root_quota(parse_profile(profile()), [node("a")])
    existing = _existing(root, min__cpu="1", labels__team="x")
    existing["metadata"]["labels"].pop(names.QUOTA_IS_ROOT_LABEL)
    existing["spec"]["max"]["nvidia.com/gpu"] = "8"
    existing["metadata"]["annotations"][profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION] = "not json"
    patch = profiles.quota_patch(existing, root)
    assert patch == {
        "metadata": {
            "labels": {names.QUOTA_IS_ROOT_LABEL: "true"},
            "annotations": {profiles.UNSCHEDULABLE_RESOURCE_ANNOTATION: "{}"},
        },
        "spec": {
            "min": {"cpu": "8", "memory": "32Gi"},
            "max": {"cpu": UNBOUNDED, "memory": UNBOUNDED, GPU: None},
        },
    }


def test_a_quota_with_unreadable_parts_is_written_whole() -> None:
    root = profiles.root_quota(parse_profile(profile()), [])
    patch = profiles.quota_patch({"metadata": "x", "spec": {"min": {"cpu": "lots"}, "max": []}}, root)
    assert patch is not None
    assert patch["spec"]["min"] == {"cpu": "0", "memory": "0"}
    assert patch["spec"]["max"] == {"cpu": UNBOUNDED, "memory": UNBOUNDED}
    assert set(patch["metadata"]["labels"]) == {
        names.QUOTA_PROFILE_LABEL,
        names.QUOTA_TREE_ID_LABEL,
        names.QUOTA_IS_ROOT_LABEL,
    }


# --- the shell without a cluster (reconciler/profiles.py) -----------------------------------------


class FakeAPI:
    """Records writes; ``fail`` makes every write raise it."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []
        self.fail: kube.KubeError | None = None
        self.version = 100

    def _done(self, verb: str, what: str, body: Any) -> kube.Obj:
        if self.fail is not None:
            raise self.fail
        self.writes.append((verb, what, body))
        self.version += 1
        return {"metadata": {"resourceVersion": str(self.version)}}

    async def create(self, res: kube.Resource, obj: kube.Obj, *, namespace: str | None = None) -> kube.Obj:
        return self._done("create", f"{res.plural} {namespace}/{obj['metadata']['name']}", obj)

    async def patch(
        self, res: kube.Resource, name: str, patch: Any, *, namespace: str | None = None
    ) -> kube.Obj:
        return self._done("patch", f"{res.plural} {namespace}/{name}", patch)


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        self.recorded.append((f"{meta['namespace']}/{meta['name']}", reason, message))


def raw_node(name: str, cpu: str = "8", **labels: str) -> kube.Obj:
    return {
        "metadata": {"name": name, "labels": labels or {"pool": "h100"}, "resourceVersion": "7"},
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "32Gi"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"}],
        },
    }


def controller(*, write: bool = True) -> tuple[ProfileController, FakeAPI, Events, dict[str, kube.Obj]]:
    api, events = FakeAPI(), Events()
    quotas: dict[str, kube.Obj] = {}
    ctl = ProfileController(api, events, lambda: quotas, write=write, settle_seconds=0.01)  # type: ignore[arg-type]
    return ctl, api, events, quotas


def put(ctl: ProfileController, raw: kube.Obj, *, node: bool = False) -> None:
    """What the informer does with a watch event: store (slimmed for a node), then the handler."""
    informer = ctl.node_informer if node else ctl.profile_informer
    obj = slim_node(raw) if node else raw
    key = raw["metadata"]["name"] if node else f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"
    old = informer.objects.get(key)
    informer.objects[key] = obj
    (ctl.on_node if node else ctl.on_profile)(old, obj)


async def test_a_burst_of_node_events_costs_one_pass_and_one_write() -> None:
    ctl, api, events, _ = controller()
    put(ctl, profile())
    for i in range(50):
        put(ctl, raw_node(f"n{i}"), node=True)
    put(ctl, raw_node("other", pool="a100"), node=True)
    heard: list[dict[str, PoolPlacement]] = []
    ctl.subscribe(lambda pools: heard.append(dict(pools)))
    await ctl.sync_dirty()
    assert ctl.passes == 1
    creates = [w for w in api.writes if w[0] == "create"]
    assert len(creates) == 1 and creates[0][2]["spec"]["min"] == {"cpu": "400", "memory": "1600Gi"}
    label = [w for w in api.writes if w[1] == "elasticquotaprofiles pools/h100"]
    assert label == [
        ("patch", "elasticquotaprofiles pools/h100", profiles.tree_id_patch(parse_profile(profile())))
    ]
    assert heard == [{"h100": profiles.placement(parse_profile(profile()), [])}]
    assert events.recorded == []


async def test_a_heartbeat_marks_nothing_and_a_node_elsewhere_marks_no_pool() -> None:
    ctl, _, _, _ = controller()
    put(ctl, profile())
    put(ctl, raw_node("n1"), node=True)
    await ctl.sync_dirty()
    beat = raw_node("n1")
    beat["metadata"]["resourceVersion"] = "8"
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "t2"
    put(ctl, beat, node=True)
    put(ctl, raw_node("a1", pool="a100"), node=True)
    assert not ctl._dirty
    put(ctl, raw_node("n1", cpu="4"), node=True)
    assert list(ctl._dirty) == ["pools/h100"]


async def test_the_debounce_runs_on_the_event_loop() -> None:
    ctl, api, _, _ = controller()
    put(ctl, profile())
    ctl.profile_informer.synced.set()
    ctl.node_informer.synced.set()
    task = asyncio.create_task(ctl.run())
    try:
        await asyncio.wait_for(ctl.first_pass.wait(), timeout=5)
        assert ctl.passes == 1 and set(ctl.pools) == {"h100"}  # every profile seen by then
        await wait_for(lambda: ctl.passes >= 1 and api.writes)
        before = ctl.passes
        for i in range(20):
            put(ctl, raw_node(f"n{i}"), node=True)
        await wait_for(lambda: ctl.passes > before and len([w for w in api.writes if w[0] == "create"]) == 2)
        assert ctl.passes == before + 1  # twenty node events, one pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for(condition: Callable[[], object], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_failures_duplicates_and_bad_profiles_are_warned_once() -> None:
    ctl, api, events, quotas = controller()
    put(ctl, profile())
    put(ctl, profile(namespace="later", created="2026-06-01T00:00:00Z"))
    put(ctl, profile("broken", quota_name=None))
    api.fail = kube.KubeError(500, "InternalError", "etcd is down")
    await ctl.sync_dirty()
    for key in ("pools/h100", "later/h100", "pools/broken"):  # the retries, and other passes
        put(ctl, ctl.profile_informer.objects[key])
    await ctl.sync_dirty()
    reasons = sorted((key, reason) for key, reason, _ in events.recorded)
    assert reasons == [
        ("later/h100", profiles.DUPLICATE_PROFILE_REASON),
        ("pools/broken", profiles.INVALID_PROFILE_REASON),
        ("pools/h100", profiles.CREATE_QUOTA_FAILED_REASON),
    ]
    assert set(ctl.pools) == {"h100", "broken"} and ctl.pools["broken"].problem is not None
    api.fail = None
    put(ctl, ctl.profile_informer.objects["pools/h100"])
    await ctl.sync_dirty()
    assert [w[0] for w in api.writes] == ["patch", "create"]  # the tree id label, then the root
    # the root exists now, and differs: an update that fails says so
    api.fail = kube.KubeError(500, "InternalError", "etcd is down")
    quotas["pools/h100-root"] = {"metadata": {"name": "h100-root", "namespace": "pools"}, "spec": {}}
    ctl.on_quota(None, quotas["pools/h100-root"])
    await ctl.sync_dirty()
    assert events.recorded[-1][1] == profiles.UPDATE_QUOTA_FAILED_REASON
    assert len(events.recorded) == 4


async def test_without_writes_pools_still_follow_and_a_deleted_holder_hands_over() -> None:
    ctl, api, _, _ = controller(write=False)
    older, newer = profile(), profile(namespace="later", created="2026-06-01T00:00:00Z", selector={})
    put(ctl, older)
    put(ctl, newer)
    put(ctl, raw_node("n1", taint="yes"), node=True)
    await ctl.sync_dirty()
    assert api.writes == []
    assert ctl.pools["h100"].match_labels == {"pool": "h100"}
    ctl.profile_informer.objects.pop("pools/h100")
    ctl.on_profile(older, None)
    await ctl.sync_dirty()
    assert ctl.pools["h100"].match_labels == {}  # the newer one counts now
    ctl.profile_informer.objects.pop("later/h100")
    ctl.on_profile(newer, None)
    await ctl.sync_dirty()
    assert dict(ctl.pools) == {}


@pytest.mark.parametrize(
    ("argv", "write"),
    [
        ([], True),
        (["--quota-profiles"], True),
        (["--quota-profiles=true"], True),
        (["--quota-profiles=false"], False),
        (["--quota-profiles", "False"], False),
        (["--quota-profiles=0"], False),
    ],
)
def test_the_quota_profiles_flag(argv: list[str], write: bool) -> None:
    assert reconciler_main.parse_args(argv).quota_profiles is write


def test_a_bad_quota_profiles_value_stops_the_process() -> None:
    with pytest.raises(SystemExit):
        reconciler_main.parse_args(["--quota-profiles=maybe"])

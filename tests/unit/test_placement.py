"""Placement of a pool's pods (docs/pools.md#placement): label selectors, what a pod spec declares,
when a pod contradicts a pool, and the JSON patch that writes the pool's placement into a gated pod.

The property at the end applies :func:`release_ops` with a small JSON-patch applier and checks, over
every node of a small label universe, that the patched pod matches only nodes the pool selects and
still asks for everything it asked for; and that a contradiction is only ever claimed when no node
can hold both the pod and the pool.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api.placement import (
    PodPlacement,
    PoolPlacement,
    Requirement,
    contradiction,
    matches,
    pod_placement,
    release_ops,
)

Obj = dict[str, Any]
GPU = "nvidia.com/gpu.product"
AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
H100 = PoolPlacement("h100", "h100-root", match_labels={GPU: "h100"})


def req(key: str, operator: str, *values: str) -> Requirement:
    return Requirement(key, operator, tuple(values))


def affinity(*terms: list[Obj]) -> Obj:
    return {"nodeAffinity": {AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}


def expr(key: str, operator: str, *values: str) -> Obj:
    out: Obj = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


# --- matches --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "exprs", "node", "expected"),
    [
        ({}, (), {}, True),  # the empty selector selects every node
        ({"a": "1"}, (), {"a": "1", "b": "2"}, True),
        ({"a": "1"}, (), {"a": "2"}, False),
        ({"a": "1"}, (), {}, False),
        ({}, (req("a", "In", "1", "2"),), {"a": "2"}, True),
        ({}, (req("a", "In", "1"),), {}, False),
        ({}, (req("a", "NotIn", "1"),), {}, True),  # NotIn holds on a node without the label
        ({}, (req("a", "NotIn", "1"),), {"a": "1"}, False),
        ({}, (req("a", "Exists"),), {"a": ""}, True),
        ({}, (req("a", "DoesNotExist"),), {"a": "x"}, False),
        ({}, (req("a", "Gt", "3"),), {"a": "4"}, True),
        ({}, (req("a", "Lt", "3"),), {"a": "4"}, False),
        ({}, (req("a", "Gt", "3"),), {"a": "four"}, False),  # not an integer: not met
        ({}, (req("a", "Like", "1"),), {"a": "1"}, False),  # an unknown operator meets nothing
        ({"a": "1"}, (req("b", "Exists"),), {"a": "1"}, False),  # every part must hold
    ],
)
def test_matches(
    labels: dict[str, str], exprs: tuple[Requirement, ...], node: dict[str, str], expected: bool
) -> None:
    assert matches(labels, exprs, node) is expected


# --- pod_placement --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, PodPlacement()),
        ({}, PodPlacement()),
        ({"nodeSelector": {"a": "1", "b": 2}}, PodPlacement(node_selector={"a": "1"})),  # malformed left out
        (
            {"affinity": affinity([expr("a", "In", "1")], [expr("b", "Exists")])},
            PodPlacement(required_terms=((req("a", "In", "1"),), (req("b", "Exists"),))),
        ),
        (
            {"affinity": {"nodeAffinity": {AFFINITY: {"nodeSelectorTerms": [{"matchFields": []}]}}}},
            PodPlacement(required_terms=((),)),  # matchFields are not read
        ),
        ({"affinity": {"podAffinity": {}}}, PodPlacement()),
        (
            {"affinity": affinity([{"key": "a"}, expr("b", "In", "x", 3)])},
            PodPlacement(required_terms=((req("b", "In", "x"),),)),
        ),
    ],
)
def test_pod_placement(spec: Obj | None, expected: PodPlacement) -> None:
    assert pod_placement(spec) == expected


# --- contradiction --------------------------------------------------------------------------------------

IN_POOL = PoolPlacement("p", match_expressions=(req("zone", "In", "a", "b"),))
NOT_IN_POOL = PoolPlacement("p", match_expressions=(req("zone", "NotIn", "c"),))
NO_SPOT = PoolPlacement("p", match_expressions=(req("spot", "DoesNotExist"),))
HAS_GPU = PoolPlacement("p", match_expressions=(req("gpu", "Exists"),))


@pytest.mark.parametrize(
    ("pod", "pool", "expected"),
    [
        (PodPlacement(), H100, None),
        (PodPlacement(node_selector={GPU: "h100"}), H100, None),
        (
            PodPlacement(node_selector={GPU: "l4"}),
            H100,
            f"the job's nodeSelector asks for {GPU}=l4, the pool has {GPU}=h100",
        ),
        (PodPlacement(node_selector={"other": "x"}), H100, None),  # a label the pool leaves open
        (PodPlacement(node_selector={"zone": "b"}), IN_POOL, None),
        (
            PodPlacement(node_selector={"zone": "c"}),
            IN_POOL,
            "the job's nodeSelector asks for zone=c, the pool has zone In (a, b)",
        ),
        (
            PodPlacement(node_selector={"zone": "c"}),
            NOT_IN_POOL,
            "the job's nodeSelector asks for zone=c, the pool has zone NotIn (c)",
        ),
        (PodPlacement(node_selector={"zone": "a"}), NOT_IN_POOL, None),
        (
            PodPlacement(node_selector={"spot": "true"}),
            NO_SPOT,
            "the job's nodeSelector asks for spot=true, the pool has spot DoesNotExist",
        ),
        (PodPlacement(node_selector={"gpu": "x"}), HAS_GPU, None),
        # required affinity: one term that fails
        (
            PodPlacement(required_terms=((req(GPU, "In", "l4", "a100"),),)),
            H100,
            f"the job's required node affinity asks for {GPU} In (l4, a100), the pool has {GPU}=h100",
        ),
        (PodPlacement(required_terms=((req(GPU, "In", "l4", "h100"),),)), H100, None),
        (
            PodPlacement(required_terms=((req(GPU, "DoesNotExist"),),)),
            H100,
            f"the job's required node affinity asks for {GPU} DoesNotExist, the pool has {GPU}=h100",
        ),
        (PodPlacement(required_terms=((req(GPU, "NotIn", "l4"),),)), H100, None),
        (
            PodPlacement(required_terms=((req(GPU, "NotIn", "h100"), req("x", "Exists")),)),
            H100,
            f"the job's required node affinity asks for {GPU} NotIn (h100), the pool has {GPU}=h100",
        ),
        # terms are ORed: one that may fit is enough
        (PodPlacement(required_terms=((req(GPU, "In", "l4"),), (req("zone", "In", "a"),))), H100, None),
        (
            PodPlacement(
                required_terms=((req(GPU, "In", "l4"),), (req(GPU, "Exists"), req(GPU, "NotIn", "h100")))
            ),
            H100,
            f"the job's required node affinity has no term the pool meets: {GPU} In (l4), the pool has "
            f"{GPU}=h100; {GPU} NotIn (h100), the pool has {GPU}=h100",
        ),
        (PodPlacement(required_terms=((),)), H100, None),  # a term of matchFields only: not judged
        (
            PodPlacement(required_terms=((req("gpu", "DoesNotExist"),),)),
            HAS_GPU,
            "the job's required node affinity asks for gpu DoesNotExist, the pool has gpu Exists",
        ),
        (
            PodPlacement(required_terms=((req("zone", "In", "c"),),)),
            NOT_IN_POOL,
            "the job's required node affinity asks for zone In (c), the pool has zone NotIn (c)",
        ),
        (PodPlacement(required_terms=((req("zone", "In", "c", "d"),),)), NOT_IN_POOL, None),
        (
            PodPlacement(required_terms=((req("spot", "Exists"),),)),
            NO_SPOT,
            "the job's required node affinity asks for spot Exists, the pool has spot DoesNotExist",
        ),
        (
            PodPlacement(required_terms=((req("n", "Gt", "4"),),)),
            PoolPlacement("p", match_labels={"n": "8"}),
            None,
        ),
        (
            PodPlacement(required_terms=((req("n", "Gt", "8"),),)),
            PoolPlacement("p", match_labels={"n": "8"}),
            "the job's required node affinity asks for n Gt (8), the pool has n=8",
        ),
        (PodPlacement(required_terms=((req(GPU, "Like", "l4"),),)), H100, None),  # unknown: never certain
        # a pool pinning a label to nothing selects no node: not the job's contradiction
        (
            PodPlacement(required_terms=((req("zone", "In", "a"),),)),
            PoolPlacement("p", match_labels={"zone": "b"}, match_expressions=(req("zone", "In", "a"),)),
            None,
        ),
        (  # but a nodeSelector value the pool's matchLabels fixes otherwise always contradicts
            PodPlacement(node_selector={"zone": "a"}),
            PoolPlacement("p", match_labels={"zone": "b"}, match_expressions=(req("zone", "In", "a"),)),
            "the job's nodeSelector asks for zone=a, the pool has zone=b, zone In (a)",
        ),
        (
            PodPlacement(node_selector={"zone": "a"}),
            PoolPlacement("p", match_labels={"zone": "b"}, match_expressions=(req("zone", "In", "a", "b"),)),
            "the job's nodeSelector asks for zone=a, the pool has zone=b, zone In (a, b)",
        ),
    ],
)
def test_contradiction(pod: PodPlacement, pool: PoolPlacement, expected: str | None) -> None:
    assert contradiction(pod, pool) == expected


# --- release_ops ----------------------------------------------------------------------------------------

ZONED = PoolPlacement(
    "h100",
    match_labels={GPU: "h100"},
    match_expressions=(req("zone", "In", "a", "b"),),
    tolerations=({"key": "pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"},),
)
POOL_EXPR = expr("zone", "In", "a", "b")
POOL_TOLERATION = {"key": "pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}
SEL = "/spec/nodeSelector"
TERMS = f"/spec/affinity/nodeAffinity/{AFFINITY}/nodeSelectorTerms"


@pytest.mark.parametrize(
    ("spec", "pool", "expected"),
    [
        ({}, PoolPlacement("open"), []),  # a pool of every node places nothing
        (
            {},
            ZONED,
            [
                {"op": "add", "path": SEL, "value": {GPU: "h100"}},
                {
                    "op": "add",
                    "path": "/spec/affinity",
                    "value": {
                        "nodeAffinity": {AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": [POOL_EXPR]}]}}
                    },
                },
                {"op": "add", "path": "/spec/tolerations", "value": [POOL_TOLERATION]},
            ],
        ),
        (
            {"nodeSelector": {"disk": "ssd"}, "tolerations": [{"key": "x", "operator": "Exists"}]},
            H100,
            [{"op": "add", "path": f"{SEL}/nvidia.com~1gpu.product", "value": "h100"}],
        ),
        ({"nodeSelector": {GPU: "h100"}}, H100, []),  # already there: nothing to write
        (
            {"nodeSelector": {GPU: "l4"}},
            H100,
            f"the job's nodeSelector asks for {GPU}=l4, the pool has {GPU}=h100",
        ),
        (
            {"affinity": {"podAffinity": {"x": 1}}},
            PoolPlacement("z", match_expressions=(req("zone", "In", "a", "b"),)),
            [
                {
                    "op": "add",
                    "path": "/spec/affinity/nodeAffinity",
                    "value": {AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": [POOL_EXPR]}]}},
                }
            ],
        ),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            PoolPlacement("z", match_expressions=(req("zone", "In", "a", "b"),)),
            [
                {
                    "op": "add",
                    "path": f"/spec/affinity/nodeAffinity/{AFFINITY}",
                    "value": {"nodeSelectorTerms": [{"matchExpressions": [POOL_EXPR]}]},
                }
            ],
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        AFFINITY: {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [expr("disk", "In", "ssd")]},
                                {
                                    "matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                                    ]
                                },
                                {"matchExpressions": [POOL_EXPR]},
                            ]
                        }
                    }
                }
            },
            PoolPlacement("z", match_expressions=(req("zone", "In", "a", "b"),)),
            [
                {"op": "add", "path": f"{TERMS}/0/matchExpressions/-", "value": POOL_EXPR},
                {"op": "add", "path": f"{TERMS}/1/matchExpressions", "value": [POOL_EXPR]},
            ],
        ),
        (
            {"affinity": {"nodeAffinity": {AFFINITY: {"nodeSelectorTerms": [{"matchExpressions": []}]}}}},
            PoolPlacement("z", match_expressions=(req("zone", "In", "a"),)),
            "term 0 of the pod's required node affinity is empty (it matches no node)",
        ),
        (
            {
                "tolerations": [
                    {"key": "pool", "value": "h100", "effect": "NoSchedule", "tolerationSeconds": 5}
                ]
            },
            PoolPlacement("t", tolerations=(POOL_TOLERATION,)),
            [],  # the same toleration (Equal is the default operator)
        ),
        (
            {"tolerations": []},
            PoolPlacement("t", tolerations=(POOL_TOLERATION, POOL_TOLERATION)),
            [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}],
        ),
        (
            {},
            PoolPlacement("bad", problem="its selector cannot be read"),
            "pool bad cannot place pods: its selector cannot be read",
        ),
    ],
)
def test_release_ops(spec: Obj, pool: PoolPlacement, expected: list[Obj] | str) -> None:
    assert release_ops(spec, pool) == expected


# --- the property ---------------------------------------------------------------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Obj, ops: list[dict[str, object]]) -> Obj:
    """RFC 6902 ``add`` and ``test`` on objects and lists, enough for :func:`release_ops`."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [_unescape(t) for t in str(op["path"]).split("/")[1:]]
        node: Any = out
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if op["op"] == "test":
            assert node[last] == op["value"]
        elif isinstance(node, list):
            node.append(copy.deepcopy(op["value"])) if last == "-" else node.insert(int(last), op["value"])
        else:
            node[last] = copy.deepcopy(op["value"])
    return out


KEYS = ("a", "b", "c")
VALUES = ("1", "2", "3")
#: every node of the universe: each key absent or one of the values
NODES = [
    {k: v for k, v in zip(KEYS, choice, strict=True) if v is not None}
    for choice in itertools.product((None, *VALUES), repeat=len(KEYS))
]

requirements = st.builds(
    Requirement,
    st.sampled_from(KEYS),
    st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True).map(tuple),
).map(lambda r: Requirement(r.key, r.operator, () if r.operator in ("Exists", "DoesNotExist") else r.values))
selectors = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
pools = st.builds(
    PoolPlacement,
    st.just("p"),
    match_labels=selectors,
    match_expressions=st.lists(requirements, max_size=2).map(tuple),
    tolerations=st.lists(
        st.sampled_from(({"key": "t", "effect": "NoSchedule"}, POOL_TOLERATION)), max_size=2
    ).map(tuple),
)
terms = st.lists(requirements, min_size=1, max_size=2).map(
    lambda rs: [expr(r.key, r.operator, *r.values) for r in rs]
)


@st.composite
def specs(draw: st.DrawFn) -> Obj:
    spec: Obj = {"containers": [{"name": "c"}]}
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(selectors)
    shape = draw(st.sampled_from(("none", "pod-affinity", "terms")))
    if shape == "pod-affinity":
        spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    elif shape == "terms":
        spec["affinity"] = affinity(*draw(st.lists(terms, min_size=1, max_size=3)))
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "mine", "operator": "Exists"}]
    return spec


def pod_matches(placement: PodPlacement, node: Mapping[str, str]) -> bool:
    """Whether the scheduler may put a pod of ``placement`` on ``node`` (terms ORed)."""
    return matches(placement.node_selector, (), node) and (
        not placement.required_terms or any(matches({}, term, node) for term in placement.required_terms)
    )


@settings(max_examples=500, deadline=None)
@given(spec=specs(), pool=pools)
def test_a_released_pod_runs_only_on_the_pool_and_keeps_its_own_terms(spec: Obj, pool: PoolPlacement) -> None:
    before = pod_placement(spec)
    ops = release_ops(spec, pool)
    if isinstance(ops, str):
        # a contradiction is never claimed while a node could hold both
        assert not any(
            pod_matches(before, n) and matches(pool.match_labels, pool.match_expressions, n) for n in NODES
        )
        return
    patched = apply_patch({"spec": spec}, ops)["spec"]
    after = pod_placement(patched)
    for node in NODES:
        if pod_matches(after, node):
            assert matches(pool.match_labels, pool.match_expressions, node), node
            assert pod_matches(before, node), node  # never wider than the pod asked
    assert before.node_selector.items() <= after.node_selector.items()
    assert len(after.required_terms) == max(len(before.required_terms), 1 if pool.match_expressions else 0)
    for own, narrowed in zip(before.required_terms, after.required_terms, strict=False):
        assert set(own) <= set(narrowed)
    assert patched.get("affinity", {}).get("podAffinity") == spec.get("affinity", {}).get("podAffinity")
    tolerations = patched.get("tolerations", [])
    assert all(t in tolerations for t in spec.get("tolerations", []))
    assert all(dict(t) in tolerations for t in pool.tolerations)
    assert release_ops(patched, pool) == []  # once placed, nothing more to write

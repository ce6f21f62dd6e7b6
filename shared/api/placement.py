"""Where a pool's pods may run, and what a pod set's template already says about placement
(docs/pools.md#placement).

A pool is an ElasticQuotaProfile: its node selector picks the pool's nodes. Both the scheduler (which
skips a pool that a job's own selector contradicts) and the job path (which writes the pool's
selector and tolerations into every pod it releases) read the same frozen values from here.

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "OPERATORS",
    "PodPlacement",
    "PoolPlacement",
    "Requirement",
    "contradiction",
    "matches",
    "pod_placement",
    "release_ops",
    "requirement_matches",
]

#: Label-selector operators (metav1.LabelSelectorRequirement); node-affinity terms also know Gt
#: and Lt, which :func:`requirement_matches` reads as integers.
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement on a node label: ``key operator values``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolPlacement:
    """A pool as placement sees it.

    ``name`` is the ElasticQuotaProfile's name, ``quota`` its tree's root quota; ``match_labels``
    and ``match_expressions`` are the profile's node selector; ``tolerations`` tolerate the taints
    found on the pool's nodes (``key``/``operator``/``value``/``effect``); ``problem`` says why
    the pool cannot place anything (a selector that cannot be read), None when it can.
    """

    name: str
    quota: str = ""
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()
    tolerations: tuple[Mapping[str, str], ...] = ()
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """What a pod template says about nodes: its ``nodeSelector`` and its required node-affinity
    terms (ORed; the requirements of one term ANDed; ``matchFields`` are not read)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[tuple[Requirement, ...], ...] = ()


def requirement_matches(req: Requirement, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` meets ``req`` (an unknown operator meets nothing)."""
    value = labels.get(req.key)
    if req.operator == "In":
        return value is not None and value in req.values
    if req.operator == "NotIn":
        return value is None or value not in req.values
    if req.operator == "Exists":
        return value is not None
    if req.operator == "DoesNotExist":
        return value is None
    if req.operator in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if req.operator == "Gt" else have < bound
    return False


def matches(
    match_labels: Mapping[str, str], match_expressions: tuple[Requirement, ...], labels: Mapping[str, str]
) -> bool:
    """Whether ``labels`` meet a label selector (every label and every expression)."""
    return all(labels.get(k) == v for k, v in match_labels.items()) and all(
        requirement_matches(r, labels) for r in match_expressions
    )


def _requirements(raw: object) -> tuple[Requirement, ...]:
    out: list[Requirement] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, Mapping):
            continue
        key, operator, values = item.get("key"), item.get("operator"), item.get("values")
        if isinstance(key, str) and isinstance(operator, str):
            kept = tuple(v for v in values if isinstance(v, str)) if isinstance(values, list) else ()
            out.append(Requirement(key, operator, kept))
    return tuple(out)


def pod_placement(spec: Mapping[str, object] | None) -> PodPlacement:
    """The placement a pod spec (or a template's spec) declares; malformed parts are left out
    (the apiserver validated the job's template already)."""
    if not isinstance(spec, Mapping):
        return PodPlacement()
    selector = spec.get("nodeSelector")
    node_selector = (
        {k: v for k, v in selector.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(selector, Mapping)
        else {}
    )
    terms: list[tuple[Requirement, ...]] = []
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    raw_terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    for term in raw_terms if isinstance(raw_terms, list) else ():
        if isinstance(term, Mapping):
            terms.append(_requirements(term.get("matchExpressions")))
    return PodPlacement(node_selector=node_selector, required_terms=tuple(terms))


# --- contradictions (docs/pools.md#placement) ---------------------------------------------------------

#: A node without the label, among the values a pool leaves possible for a key.
_ABSENT: Final = None


def _possible(pool: PoolPlacement, key: str) -> frozenset[str | None] | None:
    """The values label ``key`` can have on the pool's nodes (``_ABSENT``: no such label), when the
    pool's selector pins them to a finite set; None when it leaves the label open."""
    reqs = [r for r in pool.match_expressions if r.key == key]
    candidates: set[str | None] | None = None
    if key in pool.match_labels:
        candidates = {pool.match_labels[key]}
    for req in reqs:
        if req.operator == "In":
            candidates = set(req.values) if candidates is None else candidates & set(req.values)
        elif req.operator == "DoesNotExist":
            candidates = {_ABSENT} if candidates is None else candidates & {_ABSENT}
    if candidates is None:
        return None
    return frozenset(c for c in candidates if all(_meets(r, c) for r in reqs))


def _meets(req: Requirement, value: str | None) -> bool:
    return requirement_matches(req, {} if value is None else {req.key: value})


def _fails_everywhere(req: Requirement, pool: PoolPlacement) -> bool:
    """Whether no node the pool selects can meet ``req``: certain, never a guess. A pool that pins
    the label to nothing selects no node at all; that is the pool's problem, not the job's."""
    if req.operator not in OPERATORS:
        return False
    possible = _possible(pool, req.key)
    if possible is not None:
        return bool(possible) and not any(_meets(req, value) for value in possible)
    on_key = [r for r in pool.match_expressions if r.key == req.key]
    if req.operator == "DoesNotExist" and any(r.operator == "Exists" for r in on_key):
        return True
    excluded = {v for r in on_key if r.operator == "NotIn" for v in r.values}
    return req.operator == "In" and bool(req.values) and set(req.values) <= excluded


def _pool_side(pool: PoolPlacement, key: str) -> str:
    """How the pool's selector constrains ``key``, for a message."""
    parts = [f"{key}={pool.match_labels[key]}"] if key in pool.match_labels else []
    parts += [_describe(r) for r in pool.match_expressions if r.key == key]
    return ", ".join(parts)


def _describe(req: Requirement) -> str:
    if req.operator in ("Exists", "DoesNotExist"):
        return f"{req.key} {req.operator}"
    return f"{req.key} {req.operator} ({', '.join(req.values)})"


def contradiction(pod: PodPlacement, pool: PoolPlacement) -> str | None:
    """Why a pod with ``pod``'s placement can never run on the pool's nodes, or None when it may.

    A ``nodeSelector`` entry is an ``In`` of one value; a required node affinity contradicts only
    when every one of its terms holds a requirement no node of the pool meets (terms are ORed). Only
    what the pool's selector pins down is judged, so None does not promise a node exists."""
    for key, value in sorted(pod.node_selector.items()):
        fixed = pool.match_labels.get(key)
        if (fixed is not None and fixed != value) or _fails_everywhere(
            Requirement(key, "In", (value,)), pool
        ):
            return f"the job's nodeSelector asks for {key}={value}, the pool has {_pool_side(pool, key)}"
    if not pod.required_terms:
        return None
    reasons: list[str] = []
    for term in pod.required_terms:
        failing = next((r for r in term if _fails_everywhere(r, pool)), None)
        if failing is None:
            return None
        reasons.append(f"{_describe(failing)}, the pool has {_pool_side(pool, failing.key)}")
    which = "asks for" if len(reasons) == 1 else "has no term the pool meets:"
    return f"the job's required node affinity {which} {'; '.join(reasons)}"


# --- the write that releases a pod (docs/pools.md#placement) -------------------------------------------

_AFFINITY: Final = "requiredDuringSchedulingIgnoredDuringExecution"
_TOLERATION_FIELDS: Final = ("key", "operator", "value", "effect")


def _pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901): label keys hold ``/``."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _expression(req: Requirement) -> dict[str, object]:
    out: dict[str, object] = {"key": req.key, "operator": req.operator}
    if req.values:
        out["values"] = list(req.values)
    return out


def _toleration_key(toleration: Mapping[str, object]) -> tuple[object, ...]:
    """A toleration as far as sameness goes (``Equal`` is the operator an empty one means)."""
    operator = toleration.get("operator") or "Equal"
    return tuple(operator if f == "operator" else (toleration.get(f) or "") for f in _TOLERATION_FIELDS)


def _selector_ops(spec: Mapping[str, object], pool: PoolPlacement) -> list[dict[str, object]]:
    """The pool's labels the pod's ``nodeSelector`` lacks (one with another value is a contradiction,
    found before)."""
    current = spec.get("nodeSelector")
    have = current if isinstance(current, Mapping) else {}
    missing = {k: v for k, v in sorted(pool.match_labels.items()) if k not in have}
    if not missing:
        return []
    if not isinstance(current, Mapping):
        return [{"op": "add", "path": "/spec/nodeSelector", "value": missing}]
    return [
        {"op": "add", "path": _pointer("spec", "nodeSelector", k), "value": v} for k, v in missing.items()
    ]


def _affinity_ops(spec: Mapping[str, object], pool: PoolPlacement) -> list[dict[str, object]] | str:
    """The pool's expressions ANDed into every required node-affinity term, or the one term when
    there is none. A gated pod may only add expressions to its terms: a new term would widen it
    (terms are ORed), and the apiserver refuses it."""
    wanted = [_expression(r) for r in pool.match_expressions]
    if not wanted:
        return []
    levels = ("affinity", "nodeAffinity", _AFFINITY)
    node: Mapping[str, object] = spec
    for depth, name in enumerate(levels):
        inner = node.get(name)
        if not isinstance(inner, Mapping):
            value: dict[str, object] = {"nodeSelectorTerms": [{"matchExpressions": wanted}]}
            for outer in reversed(levels[depth + 1 :]):
                value = {outer: value}
            return [{"op": "add", "path": _pointer("spec", *levels[: depth + 1]), "value": value}]
        node = inner
    terms = node.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return "the pod's required node affinity has no term the pool's expressions can be added to"
    ops: list[dict[str, object]] = []
    for i, raw in enumerate(terms):
        term: Mapping[str, object] = raw if isinstance(raw, Mapping) else {}
        exprs, fields = term.get("matchExpressions"), term.get("matchFields")
        if not exprs and not fields:
            return f"term {i} of the pod's required node affinity is empty (it matches no node)"
        where = ("spec", *levels, "nodeSelectorTerms", str(i), "matchExpressions")
        if not isinstance(exprs, list):
            ops.append({"op": "add", "path": _pointer(*where), "value": wanted})
        else:
            ops += [
                {"op": "add", "path": _pointer(*where, "-"), "value": w} for w in wanted if w not in exprs
            ]
    return ops


def _toleration_ops(spec: Mapping[str, object], pool: PoolPlacement) -> list[dict[str, object]]:
    """The pool's tolerations the pod lacks, appended (any pod may gain tolerations)."""
    current = spec.get("tolerations")
    have = [t for t in current if isinstance(t, Mapping)] if isinstance(current, list) else []
    seen = {_toleration_key(t) for t in have}
    missing: list[dict[str, object]] = []
    for toleration in pool.tolerations:
        if _toleration_key(toleration) not in seen:
            seen.add(_toleration_key(toleration))
            missing.append(dict(toleration))
    if not missing:
        return []
    if not isinstance(current, list):
        return [{"op": "add", "path": "/spec/tolerations", "value": missing}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]


def release_ops(spec: Mapping[str, object], pool: PoolPlacement) -> list[dict[str, object]] | str:
    """The JSON-patch operations (RFC 6902) that add the pool's placement to a gated pod whose spec is
    ``spec``, or why the pod cannot run on the pool (it stays gated).

    Only what Kubernetes lets a pod with scheduling gates change: ``nodeSelector`` entries added,
    expressions added to every required node-affinity term (or the one term set when there is
    none), tolerations added. Each term keeps its own requirements and is narrowed to the pool, so
    the pod matches only nodes the pool selects. [] when the pod carries the placement already."""
    if pool.problem is not None:
        return f"pool {pool.name} cannot place pods: {pool.problem}"
    conflict = contradiction(pod_placement(spec), pool)
    if conflict is not None:
        return conflict
    affinity = _affinity_ops(spec, pool)
    if isinstance(affinity, str):
        return affinity
    return [*_selector_ops(spec, pool), *affinity, *_toleration_ops(spec, pool)]

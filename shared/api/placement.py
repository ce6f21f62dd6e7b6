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

__all__ = [
    "OPERATORS",
    "PodPlacement",
    "PoolPlacement",
    "Requirement",
    "matches",
    "pod_placement",
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

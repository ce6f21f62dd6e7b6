"""Node pools as pure decisions: an ElasticQuotaProfile, the nodes it selects, the root quota sized
to them and the placement its pods get (docs/pools.md#the-tree-of-a-pool).

Koordinator's quota controller is the reference for the root quota: the same labels, the same
``min`` (the matching nodes' allocatable times ``resourceRatio``), the same "unbounded" ``max`` and
the same two annotations, so a cluster can switch between its controller and ours
(``--quota-profiles=false``) without the quotas moving. Two deliberate differences: the ratio is
applied in exact arithmetic (Koordinator multiplies float64s, so ``0.29`` of 100 gives 28 there and
29 here), and an unreadable selector leaves the root quota alone instead of failing the whole pass.

Everything here reads raw JSON and never raises: what cannot be read becomes a recorded problem.
The reconciler's shell (reconciler/profiles.py) watches, debounces and writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement, Requirement, matches
from koord_queue.shared.api.quantities import (
    QuantityError,
    Resources,
    add,
    format_resource_list,
    parse_milli,
    parse_resource_list,
)

Obj = dict[str, Any]

PROFILE_GROUP: Final = "quota.koordinator.sh"
PROFILE_VERSION: Final = "v1alpha1"
PROFILE_PLURAL: Final = "elasticquotaprofiles"
PROFILE_KIND: Final = "ElasticQuotaProfile"

#: Koordinator's annotations: which resources the root's min and max list (a JSON array), and the
#: ratioed totals of the pool's nodes and of its cordoned or not-Ready nodes (ResourceLists as JSON).
RESOURCE_KEYS_ANNOTATION: Final = "quota.scheduling.koordinator.sh/resource-keys"
TOTAL_RESOURCE_ANNOTATION: Final = "quota.scheduling.koordinator.sh/total-resource"
UNSCHEDULABLE_RESOURCE_ANNOTATION: Final = "quota.scheduling.koordinator.sh/unschedulable-resource"
DEFAULT_RESOURCE_KEYS: Final = ("cpu", "memory")
#: Koordinator's "unbounded" max: MaxInt64 / 2000 whole units, in milli-units here.
UNBOUNDED_MILLI: Final = (2**63 - 1) // 2000 * 1000

#: Warning reasons on a profile (the first two are Koordinator's).
CREATE_QUOTA_FAILED_REASON: Final = "CreateQuotaFailed"
UPDATE_QUOTA_FAILED_REASON: Final = "UpdateQuotaFailed"
DUPLICATE_PROFILE_REASON: Final = "DuplicateProfile"
INVALID_PROFILE_REASON: Final = "InvalidProfile"

#: Taints whose keys start so are the node lifecycle's own (cordon, not-ready, pressure): a pool's
#: pods never get a toleration for them (docs/pools.md#placement).
LIFECYCLE_TAINT_PREFIX: Final = "node.kubernetes.io/"
_TOLERATED_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
_SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")
# What Go's strconv.ParseFloat reads as a finite decimal (Koordinator parses the ratio with it).
_DECIMAL_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3


def tree_id(namespace: str, name: str) -> str:
    """The tree id of a profile: FNV-1a 64-bit of ``namespace/name``, in decimal, as Koordinator
    computes it (so a tree keeps its id whichever controller labelled it)."""
    value = _FNV_OFFSET
    for byte in f"{namespace}/{name}".encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return str(value)


@dataclass(frozen=True, slots=True)
class Profile:
    """An ElasticQuotaProfile as the decisions read it.

    ``ratio`` is None when the profile sets no ``resourceRatio`` (the totals are then summed as
    they are); a ratio that cannot be read or lies outside (0, 1] is 1, as in Koordinator.
    ``selector_problem`` says why the node selector cannot be read (no node then belongs to the
    pool and its root quota is left alone); ``problems`` lists everything that could not be read.
    """

    namespace: str
    name: str
    uid: str = ""
    created: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    quota_name: str = ""
    quota_labels: Mapping[str, str] = field(default_factory=dict)
    ratio: Fraction | None = None
    resource_keys: tuple[str, ...] = DEFAULT_RESOURCE_KEYS
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()
    has_selector: bool = False
    selector_problem: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def tree_id(self) -> str:
        """The tree id the profile carries, else the one computed from its namespace and name."""
        return self.labels.get(names.QUOTA_TREE_ID_LABEL) or tree_id(self.namespace, self.name)

    @property
    def writable(self) -> bool:
        """Whether its root quota can be kept: it names one and its selector can be read."""
        return bool(self.quota_name) and self.selector_problem is None


@dataclass(frozen=True, slots=True)
class Node:
    """What a pool needs of a node: ``allocatable`` in milli-units; ``schedulable`` is False when
    the node is cordoned or not Ready (its resources then also count as unschedulable)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()
    unschedulable: bool = False
    ready: bool = True

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable


@dataclass(frozen=True, slots=True)
class RootQuota:
    """What the root quota of a pool must show: the labels and annotations the reconciler keeps
    (others' are left alone), and the whole of ``spec.min`` and ``spec.max`` (milli-units)."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    min: Mapping[str, int]
    max: Mapping[str, int]


def _part(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``raw[key]`` when it is an object, else empty."""
    value = raw.get(key)
    return value if isinstance(value, Mapping) else {}


def _strings(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def parse_ratio(raw: object) -> tuple[Fraction | None, str | None]:
    """``spec.resourceRatio``: the ratio (None when unset) and a problem when it is not a decimal
    in (0, 1] (it then counts as 1)."""
    if raw is None:
        return None, None
    text = raw if isinstance(raw, str) else ""
    if _DECIMAL_RE.fullmatch(text):
        try:
            number = Decimal(text)
        except InvalidOperation:
            number = Decimal(0)
        # Compared as a Decimal first: an exponent of a million digits never becomes a Fraction.
        # Below 1e-300 float64 (Koordinator's reading) underflows to 0, which counts as 1.
        if 0 < number <= 1 and number.adjusted() >= -300:
            return Fraction(number), None
    return Fraction(1), f"spec.resourceRatio: {raw!r} is not a decimal in (0, 1]; 1 is used"


def parse_resource_keys(annotations: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """The resource keys annotation (a JSON array of names); cpu and memory when absent or
    unreadable (with a problem for the latter)."""
    raw = annotations.get(RESOURCE_KEYS_ANNOTATION)
    if raw is None:
        return DEFAULT_RESOURCE_KEYS, None
    try:
        keys = json.loads(raw)
    except ValueError:
        keys = None
    if isinstance(keys, list) and all(isinstance(k, str) and k for k in keys):
        return tuple(dict.fromkeys(keys)), None
    where = f"metadata.annotations[{RESOURCE_KEYS_ANNOTATION}]"
    return DEFAULT_RESOURCE_KEYS, f"{where}: {raw!r} is not a JSON array of resource names; cpu, memory used"


def parse_selector(raw: object) -> tuple[dict[str, str], tuple[Requirement, ...], str | None]:
    """A label selector (metav1.LabelSelector): its labels, its expressions and why it cannot be
    read (the rules the apiserver's LabelSelectorAsSelector enforces), or None."""
    if not isinstance(raw, Mapping):
        return {}, (), "spec.nodeSelector: not an object"
    labels_raw = raw.get("matchLabels") or {}
    labels = _strings(labels_raw)
    if not isinstance(labels_raw, Mapping) or len(labels) != len(labels_raw):
        return labels, (), "spec.nodeSelector.matchLabels: not a map of strings"
    exprs_raw = raw.get("matchExpressions") or []
    if not isinstance(exprs_raw, list):
        return labels, (), "spec.nodeSelector.matchExpressions: not a list"
    found: list[Requirement] = []
    for i, raw_item in enumerate(exprs_raw):
        where = f"spec.nodeSelector.matchExpressions[{i}]"
        item: Mapping[str, Any] = raw_item if isinstance(raw_item, Mapping) else {}
        key, op, values = item.get("key"), item.get("operator"), item.get("values") or []
        if not isinstance(key, str) or not key:
            return labels, (), f"{where}.key: missing"
        if op not in _SELECTOR_OPERATORS:
            return labels, (), f"{where}.operator: {op!r} is not one of {', '.join(_SELECTOR_OPERATORS)}"
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return labels, (), f"{where}.values: not a list of strings"
        if (op in ("In", "NotIn")) != bool(values):
            need = "needs values" if op in ("In", "NotIn") else "takes no values"
            return labels, (), f"{where}: operator {op} {need}"
        found.append(Requirement(key, str(op), tuple(values)))
    return labels, tuple(found), None


def parse_profile(raw: Mapping[str, Any]) -> Profile:
    """A raw ElasticQuotaProfile; never raises."""
    meta = _part(raw, "metadata")
    spec = _part(raw, "spec")
    problems: list[str] = []
    quota_name = spec.get("quotaName")
    if not isinstance(quota_name, str) or not quota_name:
        problems.append("spec.quotaName: missing; the pool has no root quota")
        quota_name = ""
    ratio, ratio_problem = parse_ratio(spec.get("resourceRatio"))
    keys, keys_problem = parse_resource_keys(_strings(meta.get("annotations")))
    selector = spec.get("nodeSelector")
    match_labels: dict[str, str] = {}
    exprs: tuple[Requirement, ...] = ()
    selector_problem: str | None = None
    if selector is not None:
        match_labels, exprs, selector_problem = parse_selector(selector)
    problems += [p for p in (ratio_problem, keys_problem, selector_problem) if p]
    return Profile(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        labels=_strings(meta.get("labels")),
        quota_name=quota_name,
        quota_labels=_strings(spec.get("quotaLabels")),
        ratio=ratio,
        resource_keys=keys,
        match_labels=match_labels,
        match_expressions=exprs,
        has_selector=selector is not None,
        selector_problem=selector_problem,
        problems=tuple(problems),
    )


def _allocatable(raw: object) -> dict[str, int]:
    """Each readable quantity of ``status.allocatable`` (the kubelet writes valid ones; a bad one
    is left out rather than losing the node)."""
    out: dict[str, int] = {}
    for key, value in raw.items() if isinstance(raw, Mapping) else ():
        if isinstance(key, str) and isinstance(value, str | int):
            try:
                out[key] = parse_milli(value)
            except QuantityError:
                continue
    return out


def parse_node(raw: Mapping[str, Any]) -> Node:
    """A raw Node (or its slimmed copy); never raises."""
    meta = _part(raw, "metadata")
    spec = _part(raw, "spec")
    status = _part(raw, "status")
    taints: list[tuple[str, str, str]] = []
    for taint in spec.get("taints") or []:
        if isinstance(taint, Mapping) and isinstance(taint.get("key"), str):
            taints.append((taint["key"], str(taint.get("value") or ""), str(taint.get("effect") or "")))
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in (status.get("conditions") or [])
    )
    return Node(
        name=str(meta.get("name") or ""),
        labels=_strings(meta.get("labels")),
        allocatable=_allocatable(status.get("allocatable")),
        taints=tuple(taints),
        unschedulable=spec.get("unschedulable") is True,
        ready=ready,
    )


def selects(profile: Profile, labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` belongs to the pool: never without a readable selector
    (Koordinator reads an unset selector as selecting nothing), always for an empty one."""
    if not profile.has_selector or profile.selector_problem is not None:
        return False
    return matches(profile.match_labels, profile.match_expressions, labels)


def pool_nodes(profile: Profile, nodes: Iterable[Node]) -> list[Node]:
    return [n for n in nodes if selects(profile, n.labels)]


def ratioed(total: Mapping[str, int], ratio: Fraction | None) -> Resources:
    """``total`` times ``ratio``, rounded down as Koordinator rounds: cpu in milli-units, every
    other resource in whole units (a fraction of a unit counts as a whole one first, as a
    Quantity's Value() does). No ratio: unchanged."""
    if ratio is None:
        return dict(sorted(total.items()))
    out: Resources = {}
    for name, milli in sorted(total.items()):
        if name == "cpu":
            out[name] = int(milli * ratio // 1)
        else:
            units = -(-milli // 1000)
            out[name] = int(units * ratio // 1) * 1000
    return out


def _json(res: Mapping[str, int]) -> str:
    return json.dumps(format_resource_list(res), sort_keys=True, separators=(",", ":"))


def root_quota(profile: Profile, nodes: Iterable[Node]) -> RootQuota:
    """The root quota a profile keeps (docs/pools.md#the-tree-of-a-pool), over every node given
    (those its selector does not pick are left out here)."""
    total: Resources = {}
    unschedulable: Resources = {}
    for node in pool_nodes(profile, nodes):
        total = add(total, node.allocatable)
        if not node.schedulable:
            unschedulable = add(unschedulable, node.allocatable)
    total = ratioed(total, profile.ratio)
    unschedulable = ratioed(unschedulable, profile.ratio)
    # The order is Koordinator's: quotaLabels may replace the profile label, never the tree's two.
    labels = {names.QUOTA_PROFILE_LABEL: profile.name, **profile.quota_labels}
    labels[names.QUOTA_TREE_ID_LABEL] = profile.tree_id
    labels[names.QUOTA_IS_ROOT_LABEL] = "true"
    return RootQuota(
        namespace=profile.namespace,
        name=profile.quota_name,
        labels=labels,
        annotations={
            TOTAL_RESOURCE_ANNOTATION: _json(total),
            UNSCHEDULABLE_RESOURCE_ANNOTATION: _json(unschedulable),
        },
        min={key: total.get(key, 0) for key in profile.resource_keys},
        max=dict.fromkeys(profile.resource_keys, UNBOUNDED_MILLI),
    )


def tolerations(nodes: Iterable[Node]) -> tuple[Mapping[str, str], ...]:
    """One toleration per distinct NoSchedule or NoExecute taint on ``nodes`` (the pool's), the
    node lifecycle's own taints left out; ``Exists`` for a taint without a value. Sorted."""
    found: set[tuple[str, str, str]] = set()
    for node in nodes:
        for key, value, effect in node.taints:
            if effect in _TOLERATED_EFFECTS and not key.startswith(LIFECYCLE_TAINT_PREFIX):
                found.add((key, value, effect))
    out: list[Mapping[str, str]] = []
    for key, value, effect in sorted(found):
        if value:
            out.append({"key": key, "operator": "Equal", "value": value, "effect": effect})
        else:
            out.append({"key": key, "operator": "Exists", "effect": effect})
    return tuple(out)


def placement(profile: Profile, nodes: Iterable[Node]) -> PoolPlacement:
    """The pool as placement sees it (docs/pools.md#placement): its selector, and tolerations
    for the taints of its nodes; a problem when it cannot place anything."""
    problem = profile.selector_problem
    if problem is None and not profile.has_selector:
        problem = "spec.nodeSelector: not set; the pool has no nodes"
    if problem is None and not profile.quota_name:
        problem = "spec.quotaName: missing; the pool has no root quota"
    return PoolPlacement(
        name=profile.name,
        quota=profile.quota_name,
        match_labels=dict(profile.match_labels),
        match_expressions=profile.match_expressions,
        tolerations=tolerations(pool_nodes(profile, nodes)),
        problem=problem,
    )


def counting(profiles: Iterable[Profile]) -> dict[str, Profile]:
    """Pool name -> the profile that counts for it: of same-named profiles the oldest (creation
    time, then namespace); the others are ignored (docs/pools.md#pools-are-elasticquotaprofiles)."""
    best: dict[str, Profile] = {}
    for profile in profiles:
        held = best.get(profile.name)
        if held is None or (profile.created, profile.namespace) < (held.created, held.namespace):
            best[profile.name] = profile
    return best


def duplicate_message(profile: Profile, holder: Profile) -> str:
    return (
        f"ElasticQuotaProfile {profile.key} is ignored: pool names are unique across namespaces and "
        f"{holder.key} (older) holds the name {profile.name}; rename or delete one of them"
    )


def _same_resources(raw: object, want: Mapping[str, int]) -> bool:
    if not isinstance(raw, Mapping):
        return False
    try:
        return parse_resource_list(raw) == dict(sorted(want.items()))
    except QuantityError:
        return False


def _same_json_resources(text: str | None, want_text: str) -> bool:
    if text is None:
        return False
    try:
        have, want = json.loads(text), json.loads(want_text)
    except ValueError:
        return False
    return isinstance(have, Mapping) and _same_resources(have, parse_resource_list(want))


def _resource_patch(raw: object, want: Mapping[str, int]) -> dict[str, Any]:
    """A merge patch that makes a resource list exactly ``want`` (keys it should not have: null)."""
    patch: dict[str, Any] = dict.fromkeys(raw if isinstance(raw, Mapping) else (), None)
    patch.update(format_resource_list(want))
    return patch


def quota_patch(existing: Mapping[str, Any], want: RootQuota) -> Obj | None:
    """The merge patch that brings an existing root quota to ``want``, None when it shows it
    already. Only our labels and annotations are written (quantities compared by value, the JSON
    annotations by what they say); others' are never removed. ``min``/``max`` are replaced whole,
    as Koordinator's controller replaces them."""
    meta = _part(existing, "metadata")
    spec = _part(existing, "spec")
    labels, annotations = _strings(meta.get("labels")), _strings(meta.get("annotations"))
    patch: Obj = {}
    label_patch = {k: v for k, v in want.labels.items() if labels.get(k) != v}
    note_patch = {
        k: v for k, v in want.annotations.items() if not _same_json_resources(annotations.get(k), v)
    }
    if label_patch or note_patch:
        patch["metadata"] = {}
        if label_patch:
            patch["metadata"]["labels"] = label_patch
        if note_patch:
            patch["metadata"]["annotations"] = note_patch
    spec_patch: Obj = {}
    for field_name, value in (("min", want.min), ("max", want.max)):
        if not _same_resources(spec.get(field_name), value):
            spec_patch[field_name] = _resource_patch(spec.get(field_name), value)
    if spec_patch:
        patch["spec"] = spec_patch
    return patch or None


def quota_body(want: RootQuota) -> Obj:
    """A new root quota."""
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": want.name,
            "namespace": want.namespace,
            "labels": dict(want.labels),
            "annotations": dict(want.annotations),
        },
        "spec": {"min": format_resource_list(want.min), "max": format_resource_list(want.max)},
    }


def tree_id_patch(profile: Profile) -> Obj | None:
    """The label a profile gets when it has no tree id yet (as Koordinator's controller sets it)."""
    if profile.labels.get(names.QUOTA_TREE_ID_LABEL):
        return None
    return {"metadata": {"labels": {names.QUOTA_TREE_ID_LABEL: profile.tree_id}}}

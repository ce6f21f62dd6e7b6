"""ElasticQuota → Queue: the Queue every quota gets (docs/compatibility.md#queues-from-elasticquotas),
as pure decisions.

Each ElasticQuota gets a Queue of the same name in the install namespace (``koord-queue`` by default,
docs/operations.md#install-namespace; :func:`intent` is told which) with priority 1000, the
policy named by the quota's label ``koord-queue/queue-policy`` (Priority when absent), every
``koord-queue/*`` annotation of the quota, and the quota's parent label. On every quota update the
policy is derived again (it overwrites a hand-set ``spec.queuePolicy``, as upstream does), synced
annotations are added or updated while the Queue's other annotations are kept, and the parent label
follows the quota.

Two deliberate differences from upstream: an unsupported policy label (FIFO, Round, a typo) does not
leave a Queue that can never schedule; the Queue uses Priority and the reconciler reports the label
with a Warning ``AddQueueFail`` event on the Queue. And the reconciler marks the Queues it creates,
so deleting a quota never deletes a Queue an admin made by hand.

Same-named ElasticQuotas in several namespaces: only the one that counts (``shared.core.quota.winner``)
configures the Queue, and the Queue records its namespace (``koord-queue/quota-namespace``, read
back by :func:`holder_of`): the claim that keeps the name with that quota until it is deleted,
across restarts and whatever the timestamps say. Each ignored one gets :func:`ignored_patch`'s
annotation saying why (the ElasticQuota has no status field for a message: Koordinator's CRD has
no status subresource and its status holds only ``used``). :func:`binding_data` is what the
quota-binding admission policy reads (the ConfigMap ``koord-queue-quota-bindings``), from the
quotas that count only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core.quota import winner

Obj = dict[str, Any]

#: Marks Queues created from a quota (deleted with it).
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "koord-queue-elasticquota"

SUPPORTED: Final = tuple(p.value for p in names.QueuePolicy)

#: ``koord-queue/*`` quota annotations that configure or describe the quota itself, not its Queue
#: (``koord-queue/borrowed`` and ``koord-queue/usage-history`` change with usage: copying them
#: would write the Queue as often).
NOT_SYNCED: Final = frozenset(
    {
        names.QUEUE_POLICY_LABEL,
        names.MAX_USER_PRIORITY_ANNOTATION,
        names.ALLOWED_PRIORITY_CLASSES_ANNOTATION,
        names.IGNORED_REASON_ANNOTATION,
        names.QUOTA_BORROWED_ANNOTATION,
        names.QUOTA_USAGE_HISTORY_ANNOTATION,
        names.QUOTA_HOLDER_ANNOTATION,
    }
)
#: Longest ConfigMap key (a DNS subdomain's length).
MAX_KEY_LENGTH: Final = 253


@dataclass(frozen=True, slots=True)
class QueueIntent:
    """The Queue a quota implies, and the complaint about its policy label, if any."""

    queue: Obj
    policy_problem: str | None


def _str_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def synced_annotations(quota: Obj) -> dict[str, str]:
    """The quota annotations a Queue carries: every ``koord-queue/*`` key but :data:`NOT_SYNCED`."""
    found = _str_map((quota.get("metadata") or {}).get("annotations"))
    return {
        k: v for k, v in found.items() if k.startswith(names.QUEUE_ANNOTATION_PREFIX) and k not in NOT_SYNCED
    }


def intent(quota: Obj, namespace: str) -> QueueIntent:
    """The Queue ``quota`` implies, in ``namespace`` (where the component is installed)."""
    meta = quota.get("metadata") or {}
    labels = _str_map(meta.get("labels"))
    raw_policy = labels.get(names.QUEUE_POLICY_LABEL, "")
    problem = None
    policy = names.QueuePolicy.PRIORITY.value
    if raw_policy in SUPPORTED:
        policy = raw_policy
    elif raw_policy:
        problem = (
            f'unsupported queue policy "{raw_policy}" in label {names.QUEUE_POLICY_LABEL} of '
            f"ElasticQuota {meta.get('namespace', '')}/{meta.get('name', '')}: supported policies "
            f"are {', '.join(SUPPORTED)}; the queue uses {policy} until the label is fixed"
        )
    queue_labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    parent = labels.get(names.QUOTA_PARENT_LABEL)
    if parent:
        queue_labels[names.QUOTA_PARENT_LABEL] = parent
    queue = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {
            "name": str(meta.get("name", "")),
            "namespace": namespace,
            "labels": queue_labels,
            # The claim on the name: this quota holds it (docs/compatibility.md#same-named-quotas).
            "annotations": synced_annotations(quota)
            | {names.QUOTA_HOLDER_ANNOTATION: str(meta.get("namespace", ""))},
        },
        "spec": {"queuePolicy": policy, "priority": names.DEFAULT_QUEUE_PRIORITY},
    }
    return QueueIntent(queue=queue, policy_problem=problem)


def update_patch(existing: Obj, wanted: Obj) -> Obj | None:
    """A merge patch bringing an existing Queue in line with the quota, or None.

    Only what the quota owns is touched: the policy, the synced annotations and the parent label.
    ``spec.priority`` and other annotations an admin set on the Queue are kept.
    """
    meta = existing.get("metadata") or {}
    spec = existing.get("spec") or {}
    wanted_meta = wanted["metadata"]
    patch: Obj = {}
    if spec.get("queuePolicy") != wanted["spec"]["queuePolicy"]:
        patch["spec"] = {"queuePolicy": wanted["spec"]["queuePolicy"]}
    have_ann = _str_map(meta.get("annotations"))
    ann = {k: v for k, v in wanted_meta["annotations"].items() if have_ann.get(k) != v}
    have_labels = _str_map(meta.get("labels"))
    labels: dict[str, str | None] = {}
    parent = wanted_meta["labels"].get(names.QUOTA_PARENT_LABEL)
    if have_labels.get(names.QUOTA_PARENT_LABEL) != parent:
        labels[names.QUOTA_PARENT_LABEL] = parent  # None removes it
    metadata: Obj = {}
    if ann:
        metadata["annotations"] = ann
    if labels:
        metadata["labels"] = labels
    if metadata:
        patch["metadata"] = metadata
    return patch or None


def created_from_quota(queue: Obj) -> bool:
    labels = _str_map((queue.get("metadata") or {}).get("labels"))
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


# --- same-named quotas and namespace bindings ------------------------------------------------------


def holder_of(queue: Obj | None) -> str | None:
    """The namespace a Queue records as holding its quota name (None: no Queue, or no record)."""
    if queue is None:
        return None
    found = _str_map((queue.get("metadata") or {}).get("annotations"))
    return found.get(names.QUOTA_HOLDER_ANNOTATION) or None


def ignored_patch(quota: Obj, reason: str | None) -> Obj | None:
    """A merge patch giving the ElasticQuota ``reason`` as its ignored-reason annotation (None:
    removing it), or None when it already says so."""
    found = _str_map((quota.get("metadata") or {}).get("annotations"))
    if found.get(names.IGNORED_REASON_ANNOTATION) == reason:
        return None
    return {"metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: reason}}}


def binding_data(quotas: Iterable[Quota], *, enforce: bool) -> dict[str, str]:
    """The data of the ConfigMap the quota-binding admission policy reads.

    Per quota that counts (same-named losers are no binding), ``q.<name>`` = its bound namespaces
    as " ns1 ns2 " (space-delimited, with a leading and trailing space, so CEL tests membership
    with ``contains(' ' + namespace + ' ')``); per namespace, ``ns.<namespace>`` = the quotas usable
    there ("q1, q2", for the denial message); ``enforce`` = the configuration switch. And per quota
    name, ``holder.<name>`` = the namespace of the quota holding it, which the quota-name policy
    reads to refuse a second quota of that name (docs/compatibility.md#same-named-quotas; not
    subject to the switch). A quota whose key would exceed a ConfigMap key's length is left out: the
    door lets its jobs through, and the scheduler still holds them.
    """
    by_name: dict[str, list[Quota]] = {}
    for quota in quotas:
        by_name.setdefault(quota.name, []).append(quota)
    data = {names.QUOTA_BINDING_ENFORCE_KEY: "true" if enforce else "false"}
    usable: dict[str, list[str]] = {}
    for name in sorted(by_name):
        chosen = winner(by_name[name])
        if chosen is None:
            continue
        holder_key = names.QUOTA_BINDING_HOLDER_PREFIX + name
        if len(holder_key) <= MAX_KEY_LENGTH:
            data[holder_key] = chosen.namespace
        bound = sorted(chosen.bound_namespaces)
        for namespace in bound:
            usable.setdefault(namespace, []).append(name)
        key = names.QUOTA_BINDING_QUOTA_PREFIX + name
        if len(key) <= MAX_KEY_LENGTH:
            data[key] = " " + " ".join(bound) + " "
    for namespace in sorted(usable):
        data[names.QUOTA_BINDING_NAMESPACE_PREFIX + namespace] = ", ".join(usable[namespace])
    return data


def resource_key(resource: str) -> str:
    """A resource name as a ConfigMap key part: ``/`` (not allowed in keys) becomes ``..`` (which a
    resource name never contains), as the tree policy's CEL does with ``replace('/', '..')``."""
    return resource.replace("/", "..")


def tree_data(quotas: Iterable[Quota], *, guarantees: bool = True) -> dict[str, str]:
    """The quota-tree facts the tree admission policy reads (docs/compatibility.md#quota-guarantees).

    Per quota that counts: ``up_<q>`` = its parent (when not the root), ``min_<q>_<r>`` = its
    ``min`` per resource in milli units (``"5000m"``), ``parent_<q>`` = ``"true"`` when labelled
    ``is-parent``; per parent, ``sum_<p>_<r>`` = its children's ``min`` added up. ``_`` separates
    the parts because a quota name never contains one. ``flat_<p>`` = ``"true"`` when every child
    of ``p`` has ``min == max``, else ``"false"`` (nobody can borrow in a flat family, so the
    children's ``min`` are not held to the parent's: upstream's usual oversubscribed set-up keeps
    working; a parent with no child yet has no key and counts as flat), and ``guarantees`` =
    the ``quotaGuarantees`` switch (off: only the cycle rule applies). Keys too long for a
    ConfigMap are left out (the policy then lets the change through)."""
    by_name: dict[str, list[Quota]] = {}
    for quota in quotas:
        by_name.setdefault(quota.name, []).append(quota)
    data: dict[str, str] = {"guarantees": "true" if guarantees else "false"}
    sums: dict[str, dict[str, int]] = {}
    flat: dict[str, bool] = {}
    for name in sorted(by_name):
        chosen = winner(by_name[name])
        if chosen is None:
            continue
        if chosen.parent and chosen.parent != names.ROOT_QUOTA:
            flat[chosen.parent] = flat.get(chosen.parent, True) and chosen.min == chosen.max
        if chosen.is_parent:
            data[f"parent_{name}"] = "true"
        if chosen.parent and chosen.parent != names.ROOT_QUOTA:
            data[f"up_{name}"] = chosen.parent
            acc = sums.setdefault(chosen.parent, {})
            for r, v in chosen.min.items():
                acc[r] = acc.get(r, 0) + v
        for r, v in sorted(chosen.min.items()):
            data[f"min_{name}_{resource_key(r)}"] = f"{v}m"
    for parent in sorted(sums):
        for r, v in sorted(sums[parent].items()):
            data[f"sum_{parent}_{resource_key(r)}"] = f"{v}m"
    for parent in sorted(flat):
        data[f"flat_{parent}"] = "true" if flat[parent] else "false"
    return {k: v for k, v in data.items() if len(k) <= MAX_KEY_LENGTH}

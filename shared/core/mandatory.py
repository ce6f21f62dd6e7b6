"""Mandatory queueing: which unlabelled jobs are queued anyway, and on which quota
(docs/operations.md#mandatory-queueing).

Off by default, a job is managed only when it carries a quota label. A cluster admin may name
namespaces (``manageJobsWithoutQuotaName`` with ``managedJobsNamespaceSelector`` in the component
configuration, after Kueue's ``manageJobsWithoutQueueName`` / ``managedJobsNamespaceSelector``)
where every job of an enabled kind is queued. An unlabelled job there is held like a labelled one,
and the reconciler labels it with its namespace's default quota, chosen by Koordinator's rule for a
pod without a quota name (:func:`default_quota`). Nothing a namespace user writes takes such a job
out of the queue: the label cannot be removed while the job is unfinished, and an unlabelled job
counts as labelled for every rule the webhook applies.

Pure: label selectors are matched against labels the caller read, quotas are the parsed ones that
count (``shared.core.quota.QuotaLedger.quotas``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobAdapter

#: Never selected, whatever the selector says, beside the install namespace (:func:`excluded_namespaces`).
SYSTEM_NAMESPACES: Final = frozenset({"kube-system"})
#: The namespace label the apiserver sets on every namespace (its name).
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def excluded_namespaces(component_namespace: str) -> frozenset[str]:
    """The namespaces never selected, whatever the selector says: kube-system and the namespace the
    component is installed in (docs/operations.md#install-namespace), which the webhooks never see
    either (docs/architecture.md#decision-6-a-stateless-scoped-webhook)."""
    return SYSTEM_NAMESPACES | {component_namespace}


class SelectorError(ValueError):
    """A label selector that cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn: a missing key matches, as Kubernetes


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes ``LabelSelector`` (``matchLabels`` and ``matchExpressions``, ANDed). The empty
    selector matches every namespace, as Kubernetes reads it."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def raw(self) -> dict[str, Any]:
        """The selector as Kubernetes JSON (``matchExpressions`` only), for webhook registrations."""
        expressions: list[dict[str, Any]] = []
        for r in self.requirements:
            entry: dict[str, Any] = {"key": r.key, "operator": r.operator}
            if r.operator in ("In", "NotIn"):
                entry["values"] = sorted(r.values)
            expressions.append(entry)
        return {"matchExpressions": expressions}


#: The default ``managedJobsNamespaceSelector``: every namespace. Kueue's default leaves out
#: kube-system and its own namespace; :meth:`MandatoryQueueing.applies` leaves out those two
#: (ours in place of Kueue's) whatever the selector, so the default need not name them.
DEFAULT_SELECTOR: Final = LabelSelector()


def parse_selector(raw: object, where: str) -> LabelSelector:
    """A ``LabelSelector`` from YAML/JSON; raises :class:`SelectorError` naming ``where``."""
    if raw is None:
        return DEFAULT_SELECTOR
    if not isinstance(raw, dict):
        raise SelectorError(
            f"{where}: expected a label selector (matchLabels, matchExpressions), got {raw!r}"
        )
    unknown = sorted(set(raw) - {"matchLabels", "matchExpressions"}, key=str)
    if unknown:
        raise SelectorError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    requirements: list[Requirement] = []
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise SelectorError(f"{where}.matchLabels: expected a mapping of label to value")
    for key, value in sorted(labels.items(), key=lambda kv: str(kv[0])):
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise SelectorError(f"{where}.matchLabels: {key!r}: keys and values must be strings")
        requirements.append(Requirement(key, "In", frozenset({value})))
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError(f"{where}.matchExpressions: expected a list")
    for i, expr in enumerate(expressions):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, dict):
            raise SelectorError(f"{at}: expected a mapping with key, operator and values")
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise SelectorError(f"{at}.key: required")
        if operator not in _OPERATORS:
            raise SelectorError(f"{at}.operator: expected one of {', '.join(sorted(_OPERATORS))}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{at}.values: expected a list of strings")
        if (operator in ("In", "NotIn")) != bool(values):
            raise SelectorError(f"{at}.values: required for In and NotIn, forbidden otherwise")
        requirements.append(Requirement(key, str(operator), frozenset(values)))
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True, slots=True)
class MandatoryQueueing:
    """``manageJobsWithoutQuotaName`` and ``managedJobsNamespaceSelector``, and the namespace the
    component is installed in, which is never selected (the reconciler sets it from its
    ``--namespace``; the configuration file does not name it)."""

    enabled: bool = False
    selector: LabelSelector = field(default_factory=lambda: DEFAULT_SELECTOR)
    component_namespace: str = names.COMPONENT_NAMESPACE

    def applies(self, namespace: str, namespace_labels: Mapping[str, str] | None) -> bool:
        """Whether every job of ``namespace`` is queued. ``namespace_labels`` None: the namespace is
        not known (yet), which selects nothing (the webhook, which sees it, holds the job anyway)."""
        excluded = excluded_namespaces(self.component_namespace)
        if not self.enabled or namespace in excluded or namespace_labels is None:
            return False
        return self.selector.matches(namespace_labels)


def _labelled(job: Job) -> Job:
    """``job`` as if it carried a quota label (the kinds' own "managed" rules then decide)."""
    metadata = job.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    labels = base.labels_of(job)
    metadata["labels"] = {**labels, names.QUOTA_NAME_LABEL: labels.get(names.QUOTA_NAME_LABEL) or "-"}
    return {**job, "metadata": metadata}


def is_managed(adapter: JobAdapter, job: Job, *, mandatory: bool) -> bool:
    """Whether the queue holds ``job``: it carries a quota label, or its namespace makes queueing
    mandatory (``mandatory``) and the kind would manage it if labelled."""
    if adapter.is_managed(job):
        return True
    return mandatory and adapter.quota_name(job) is None and adapter.is_managed(_labelled(job))


@dataclass(frozen=True, slots=True)
class DefaultQuota:
    """The quota an unlabelled job of a namespace is charged to, or why there is none."""

    name: str | None
    message: str | None = None


def default_quota(namespace: str, quotas: Iterable[Quota]) -> DefaultQuota:
    """Koordinator's rule for a pod without a quota name (docs/operations.md#mandatory-queueing):

    1. the quota of the namespace's own name in that namespace;
    2. else the quota whose ``quota.scheduling.koordinator.sh/namespaces`` annotation lists the
       namespace. Koordinator takes the first of several in index order; we refuse to guess and
       name them, since charging the wrong team is worse than waiting.

    Koordinator's last resort, ``koordinator-default-quota``, is not used: a namespace nobody bound
    a quota to gets a waiting reason instead of a quota nobody gave it. Parent quotas take no jobs
    and are skipped. ``quotas`` are those that count (same-named losers excluded).
    """
    usable = sorted((q for q in quotas if not q.is_parent), key=lambda q: (q.name, q.namespace))
    for quota in usable:
        if quota.name == namespace and quota.namespace == namespace:
            return DefaultQuota(quota.name)
    listed = [q.name for q in usable if namespace in q.extra_namespaces]
    if len(listed) == 1:
        return DefaultQuota(listed[0])
    if listed:
        return DefaultQuota(None, names.default_quota_ambiguous_message(namespace, listed))
    return DefaultQuota(None, names.no_default_quota_message(namespace))


def label_patch(job: Job, quota: str) -> dict[str, Any]:
    """Merge patch labelling ``job`` with its default quota, conditional on the version read."""
    metadata: dict[str, Any] = {"labels": {names.QUOTA_NAME_LABEL: quota}}
    version = base.dig(job, "metadata", "resourceVersion")
    if isinstance(version, str) and version:
        metadata["resourceVersion"] = version
    return {"metadata": metadata}

"""Behaviour shared by the concrete adapters: naming, quota label, enqueue stamps, pod-template gating.

Each adapter module subclasses :class:`AdapterBase` and fills in what differs per kind; what every
kind does the same way lives here once, so a fix (say, to how the enqueue stamp is written) reaches
all kinds at the same time. The contract test in ``tests/unit/test_job_adapters.py`` runs over every
registered adapter to keep them consistent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base, patches
from koord_queue.shared.jobs.base import Job, JobPodSet, Segment
from koord_queue.shared.jobs.patches import PatchBuilder
from koord_queue.shared.jobs.podspec import template_requests

_ANNOTATIONS = ("metadata", "annotations")
_HAS_ENQUEUED = (*_ANNOTATIONS, names.JOB_HAS_ENQUEUED_ANNOTATION)
_ENQUEUE_TIMESTAMP = (*_ANNOTATIONS, names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION)
_DEQUEUE_TIMESTAMP = (*_ANNOTATIONS, names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
_GATE = {"name": names.ADMISSION_GATE}


class AdapterBase:
    """Defaults for the :class:`~shared.jobs.base.JobAdapter` protocol; subclasses set the identity."""

    extension: str
    api_version: str
    kind: str
    plural: str
    queue_unit_suffix: str
    synthetic_pods: bool = False
    pods_within_reservation: bool = False
    pods_through_jobs: bool = False
    status_subresource: bool = True
    older_versions: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.api_version}/{self.kind}>"

    def queue_unit_name(self, job: Job) -> str:
        name = base.name_of(job)
        return f"{name}-{self.queue_unit_suffix}" if name and self.queue_unit_suffix else name

    # The shared reader itself (not a method forwarding to it): one call less on every admission.
    quota_name = staticmethod(base.quota_name)

    def is_managed(self, job: Job) -> bool:
        return self.quota_name(job) is not None

    def admission_errors(self, old: Job | None, new: Job) -> list[base.JobSpecError]:
        return []

    def pod_set_of(self, pod: Job) -> str | None:
        """The related-podset annotation the webhook stamped; else the kind's own pod labels."""
        return base.annotations_of(pod).get(names.RELATED_PODSET_ANNOTATION) or self.pod_set_from_labels(pod)

    def pod_set_from_labels(self, pod: Job) -> str | None:
        """Fallback for pods created from a template the webhook never saw (adopted jobs)."""
        return None

    def queue_unit_ref(self, job: Job) -> str | None:
        """``<namespace>/<unit name>``; ``None`` while the name is unknown (``generateName``)."""
        name = self.queue_unit_name(job)
        return f"{base.namespace_of(job)}/{name}" if name else None

    def dequeue_merge(self, now_text: str | None) -> dict[str, Any]:
        """The dequeue-timestamp part of a merge patch (``None`` removes it)."""
        return {"metadata": {"annotations": {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: now_text}}}

    def relink_merge(self, job: Job, targets: Sequence[tuple[Sequence[Segment], str]]) -> dict[str, Any]:
        """Merge patch adding the related-QueueUnit and pod-set annotations where they are missing.

        ``targets`` are ``(path of an annotations map, pod set)`` pairs, one per pod template. The
        webhook writes these annotations on CREATE, except under ``generateName``: the name is not
        known at admission, so the pods would carry the gate but nothing linking them to their
        QueueUnit, and they would never be ungated. The resume patch therefore adds them (a
        suspended Job that never started may change its template's annotations, and the operators'
        CRDs always may). A path through a list (Ray worker groups) patches a copy of the whole
        list, so the patch is then conditional on the job's ``resourceVersion``.
        """
        ref = self.queue_unit_ref(job)
        if ref is None:
            return {}
        patch: dict[str, Any] = {}
        for path, pod_set in targets:
            current = base.dig(job, *path)
            if current is not None and not isinstance(current, Mapping):
                continue
            if base.string_map(current).get(names.RELATED_QUEUEUNIT_ANNOTATION) == ref:
                continue
            wanted = {names.RELATED_QUEUEUNIT_ANNOTATION: ref}
            if pod_set:
                wanted[names.RELATED_PODSET_ANNOTATION] = pod_set
            cut = next((i for i, seg in enumerate(path) if isinstance(seg, int)), None)
            if cut is None:
                _ensure(patch, [str(seg) for seg in path]).update(wanted)
                continue
            holder = _ensure(patch, [str(seg) for seg in path[: cut - 1]])
            key = str(path[cut - 1])
            if key not in holder:
                holder[key] = copy.deepcopy(base.dig(job, *path[:cut]))
                version = base.dig(job, "metadata", "resourceVersion")
                if isinstance(version, str) and version:
                    _ensure(patch, ["metadata"])["resourceVersion"] = version
            node: Any = holder[key]
            for seg in path[cut:]:
                if isinstance(seg, int):
                    node = node[seg]
                else:
                    if not isinstance(node.get(seg), dict):
                        node[seg] = {}
                    node = node[seg]
            node.update(wanted)
        return patch

    # --- helpers for suspend_patch -------------------------------------------------------------

    def begin_suspend(self, job: Job, *, now_text: str) -> PatchBuilder:
        """A builder that has stamped the enqueue annotations.

        A dequeue timestamp supplied by the user on CREATE is removed: it is what marks a job as
        admitted, and leaving it would let the user resume the job past the queue.
        """
        builder = PatchBuilder(job)
        builder.set(_HAS_ENQUEUED, "true")
        builder.set(_ENQUEUE_TIMESTAMP, now_text)
        builder.remove(_DEQUEUE_TIMESTAMP)
        return builder

    def gate_template(
        self, builder: PatchBuilder, template: Sequence[Segment], *, pod_set: str, job: Job
    ) -> None:
        """Gate one pod template and label it with its QueueUnit and pod set.

        The scheduling gate keeps every pod of the template Pending until the reconciler removes it for
        an admitted replica (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones). A
        missing template is left alone: the apiserver or the operator rejects such a job anyway.
        """
        if builder.get(template) is None:
            return
        ref = self.queue_unit_ref(job)
        if ref is not None:
            builder.set((*template, *_ANNOTATIONS, names.RELATED_QUEUEUNIT_ANNOTATION), ref)
        if pod_set:
            builder.set((*template, *_ANNOTATIONS, names.RELATED_PODSET_ANNOTATION), pod_set)
        builder.append_unique((*template, "spec", "schedulingGates"), _GATE, key="name")


def _ensure(doc: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The object at ``keys`` inside ``doc``, creating missing objects on the way."""
    for key in keys:
        child = doc.get(key)
        if not isinstance(child, dict):
            child = doc[key] = {}
        doc = child
    return doc


def template_pod_set(name: str, count: int, template: object, path: str) -> JobPodSet:
    """A pod set made of ``count`` pods created from a real PodTemplateSpec."""
    mapping = base.require_mapping(template, path)
    per_pod = template_requests(mapping, path)
    try:
        copied = patches.clone(dict(mapping))
    except RecursionError:
        raise base.JobSpecError(path, "Invalid value: nested too deeply") from None
    return JobPodSet(name=name, count=count, template=copied, per_pod=per_pod)


def synthetic_template(
    pod_set: str, requests: dict[str, str], *, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A PodTemplateSpec for kinds without real templates (Spark, Workflow): one container asking for
    ``requests`` (also as limits), tagged with the pod set so ``pod_set_of`` maps it back."""
    metadata: dict[str, Any] = {"annotations": {names.RELATED_PODSET_ANNOTATION: pod_set}}
    if labels:
        metadata["labels"] = dict(labels)
    resources = {"requests": dict(requests), "limits": dict(requests)}
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "default", "image": "non-exist", "resources": resources}]},
    }

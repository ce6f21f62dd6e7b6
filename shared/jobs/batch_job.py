"""Adapter for ``batch/v1`` Job (docs/compatibility.md#batchv1-job, upstream ``job.go``).

A Job is held by ``spec.suspend`` and has a single pod template, so it becomes one pod set named
after the job. Two deliberate differences from upstream:

* a nil ``spec.parallelism`` means 1 (upstream dereferences it and can crash);
* a Job whose *controller* is another kind we manage (a RayJob's submitter, a Kubeflow or Argo
  child, an MPIJob's launcher, a JobSet's replicated job) is not managed itself: the parent's
  QueueUnit already accounts for it, and suspending the child would deadlock the parent (Kueue's
  "ancestor is managed" rule, docs/compatibility.md#batchv1-job). The owner reference is only a
  claim (:func:`claimed_parent`): the reconciler resolves it, and a Job whose claimed parent does not
  exist, has another UID or is not managed is queued like any labelled Job. Until it has, the
  Job's pods wait behind the admission gate (:func:`gate_claimed_child`), so a forged claim never
  runs a pod unadmitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp
from koord_queue.shared.jobs.common import AdapterBase, template_pod_set
from koord_queue.shared.jobs.patches import PatchBuilder, deep_merge

_TEMPLATE: Final = ("spec", "template")
_TEMPLATE_ANNOTATIONS: Final = (*_TEMPLATE, "metadata", "annotations")


class BatchJobAdapter(AdapterBase):
    extension = "job"
    api_version = "batch/v1"
    kind = "Job"
    plural = "jobs"
    queue_unit_suffix = ""

    def __init__(self, parent_groups: Iterable[str] = ()) -> None:
        #: The API groups of every other kind we queue: their controllers create Jobs for them, so a
        #: Job one of them controls is that job's child (docs/compatibility.md#batchv1-job). The
        #: registry passes them in (``registry.PARENT_GROUPS``), so this module names no kind.
        self.parent_groups = frozenset(parent_groups)

    def claimed_parent(self, job: Job) -> ParentClaim | None:
        """The parent ``job`` claims by its controller owner reference, among the kinds we queue."""
        return claimed_parent(job, self.parent_groups)

    def is_managed(self, job: Job) -> bool:
        return self.quota_name(job) is not None and self.claimed_parent(job) is None

    def is_suspended(self, job: Job) -> bool:
        return base.dig(job, "spec", "suspend") is True

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {"spec.suspend": self.is_suspended(job)}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("spec", "suspend"), True)
        # The pod set is named after the job; under generateName the name is not known yet and
        # pods are mapped through their owner reference instead.
        self.gate_template(builder, ("spec", "template"), pod_set=base.name_of(job), job=job)
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        """Unsuspend, stamped; the template is relinked to the job's unit only while the Job has
        never started. Once the Job controller has set ``status.startTime`` the apiserver refuses
        any template change (Kubernetes 1.35 resets it on suspend only behind an alpha gate), so
        the whole resume would fail for ever; such a Job's pods (say a Job that claimed a parent it
        does not have and ran before the reconciler held it) still name another unit and are found
        through their controller reference instead (docs/compatibility.md#batchv1-job)."""
        started = base.dig(job, "status", "startTime") is not None
        link = {} if started else self.relink_merge(job, [(_TEMPLATE_ANNOTATIONS, base.name_of(job))])
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), {"spec": {"suspend": False}})

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        return deep_merge(self.dequeue_merge(None), {"spec": {"suspend": True}})

    def admission_errors(self, old: Job | None, new: Job) -> list[base.JobSpecError]:
        """``koord-queue/job-min-parallelism`` must be a positive integer (refused at the door
        with its field, not only reported on the unit later)."""
        value = base.annotations_of(new).get(names.JOB_MIN_PARALLELISM_ANNOTATION)
        if value is None or _min_parallelism(value) is not None:
            return []
        path = f"metadata.annotations[{names.JOB_MIN_PARALLELISM_ANNOTATION}]"
        return [base.JobSpecError(path, f"Invalid value: {value!r}: must be a positive integer")]

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        spec = base.require_mapping(base.dig(job, "spec"), "spec")
        parallelism = base.optional_int(spec.get("parallelism"), "spec.parallelism", default=1)
        completions = base.optional_int(spec.get("completions"), "spec.completions", default=parallelism)
        succeeded = base.optional_int(base.dig(job, "status", "succeeded"), "status.succeeded", default=0)
        count = max(0, min(parallelism, completions - succeeded))
        name = base.name_of(job) or "main"
        found = template_pod_set(name, count, spec.get("template"), "spec.template")
        floor = base.annotations_of(job).get(names.JOB_MIN_PARALLELISM_ANNOTATION)
        if floor is None:
            return [found]
        least = _min_parallelism(floor)
        if least is None:
            path = f"metadata.annotations[{names.JOB_MIN_PARALLELISM_ANNOTATION}]"
            raise base.JobSpecError(path, f"Invalid value: {floor!r}: must be a positive integer")
        return [dataclasses.replace(found, min_count=min(least, count) if count else None)]

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        return base.template_priority(base.dig(job, "spec", "template"))

    def pod_set_from_labels(self, pod: Job) -> str | None:
        for _, kind, owner in base.owner_kinds(pod):
            if kind == "Job":
                return owner
        found = base.labels_of(pod)
        return found.get("batch.kubernetes.io/job-name") or found.get("job-name") or None

    def job_status(self, job: Job) -> JobStatus:
        if base.has_condition(job, "Complete"):
            return JobStatus.SUCCEEDED
        if base.has_condition(job, "Failed"):
            return JobStatus.FAILED
        active = base.dig(job, "status", "active")
        # Upstream tells Running from Pending by looking at the pods; that needs the API, so the
        # reconciler refines this answer. Here "has active pods" counts as running.
        if isinstance(active, int) and not isinstance(active, bool) and active > 0:
            return JobStatus.RUNNING
        if base.is_dequeued(job):
            return JobStatus.PENDING
        if base.annotations_of(job).get(names.JOB_HAS_ENQUEUED_ANNOTATION):
            return JobStatus.QUEUING
        return JobStatus.CREATED


@dataclass(frozen=True, slots=True)
class ParentClaim:
    """The controller owner reference of a Job naming a kind of a group we queue: a claim to check
    (docs/architecture.md#trust-boundaries), not a fact. The reconciler resolves it: only an owner
    that exists with this UID and is itself managed makes the Job its child."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]


def controller_claim(obj: Job, accepts: Callable[[str, str], bool]) -> ParentClaim | None:
    """The first controller owner reference of ``obj`` with a kind and a name whose API group and
    kind ``accepts(group, kind)``, if any: the one parser of the claims below, so a Job's and a
    RayCluster's claims are read alike."""
    refs = base.dig(obj, "metadata", "ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if base.dig(ref, "controller") is not True:
            continue
        api_version, kind, name = (
            base.text(base.dig(ref, "apiVersion")),
            base.text(base.dig(ref, "kind")),
            base.text(base.dig(ref, "name")),
        )
        if kind and name and accepts(api_version.split("/")[0], kind):
            return ParentClaim(api_version, kind, name, base.text(base.dig(ref, "uid")))
    return None


def claimed_parent(job: Job, parent_groups: Iterable[str]) -> ParentClaim | None:
    """The first controller owner reference of ``job`` whose API group is one of ``parent_groups``
    (the kinds we queue), if any."""
    groups = frozenset(parent_groups)
    return controller_claim(job, lambda group, _kind: group in groups)


def gate_claimed_child(job: Job, *, parent_unit_ref: str | None) -> list[JsonPatchOp]:
    """The CREATE patch of a Job that would be queued but claims a parent (:func:`claimed_parent`).

    The webhook has no API client (docs/architecture.md#decision-6-a-stateless-scoped-webhook), so
    it cannot tell a real child from a forged one; suspending it would deadlock a real child's
    parent, and letting it in as it is let a forged one's pods run until the reconciler resolved
    the claim (docs/architecture.md#trust-boundaries). So its pod template gets the admission gate
    (never twice: a JobSet's child inherits it from its gated parent) and names the claimed
    parent's QueueUnit (``parent_unit_ref``, None when the kind has no adapter), and the Job is
    not suspended. Its pods are created gated; the reconciler then releases them under the parent's
    admission when the claim is genuine, or queues the Job as its own when it is not
    (docs/compatibility.md#batchv1-job). Pure.
    """
    builder = PatchBuilder(job)
    if builder.get(_TEMPLATE) is None:
        return []
    if parent_unit_ref:
        builder.set((*_TEMPLATE_ANNOTATIONS, names.RELATED_QUEUEUNIT_ANNOTATION), parent_unit_ref)
    builder.append_unique((*_TEMPLATE, "spec", "schedulingGates"), {"name": names.ADMISSION_GATE}, key="name")
    return builder.ops


def _min_parallelism(text: str) -> int | None:
    """The annotation's value as a positive integer, or None when it is not one."""
    value = text.strip()
    return int(value) if value.isdigit() and 0 < int(value) < 2**31 else None

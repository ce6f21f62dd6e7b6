"""Adapters for KubeRay: RayJob (``ray.io/v1`` and ``ray.io/v1alpha1``) and RayCluster (``ray.io/v1``).

Both kinds are held by ``spec.suspend`` (REFERENCE §2.5, ``rayjob.go``) and carry a cluster spec
with one head group and any number of worker groups, each a pod template. The pod sets are ``head``
(count 1) and one per worker group, named ``lower(groupName)`` (default ``worker``), count
``replicas`` (default 1). Upstream also raises each count to the live RayCluster's replicas; that
needs the API and is left to the reconciler.

Not managed, on purpose:

* a RayJob with a ``clusterSelector`` runs on an existing cluster that it neither owns nor can
  suspend (KubeRay rejects ``suspend`` in that mode), so queueing it would only wedge it;
* a RayCluster created by a RayJob or RayService (owner reference, or KubeRay's
  ``ray.io/originated-from-crd`` label): the parent's QueueUnit already accounts for it.

The submitter pod KubeRay starts for a RayJob is not a pod set (as upstream); it is small and short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from shared.jobs import base
from shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp, Segment
from shared.jobs.common import AdapterBase, template_pod_set
from shared.jobs.patches import deep_merge

_PARENT_KINDS: Final = frozenset({"RayJob", "RayService"})
_ORIGIN_LABEL: Final = "ray.io/originated-from-crd"


class _RayAdapter(AdapterBase):
    """Shared behaviour; ``cluster`` is where the RayClusterSpec lives in the object."""

    cluster: tuple[str, ...]

    def _cluster_path(self) -> str:
        return base.field_path(self.cluster)

    def _groups(self, job: Job) -> list[tuple[Sequence[Segment], str]]:
        """``(template path, pod set name)`` of every group, leniently (for gating)."""
        found: list[tuple[Sequence[Segment], str]] = []
        if isinstance(base.dig(job, *self.cluster, "headGroupSpec"), Mapping):
            found.append(((*self.cluster, "headGroupSpec", "template"), "head"))
        workers = base.dig(job, *self.cluster, "workerGroupSpecs")
        for i, group in enumerate(workers if isinstance(workers, list) else []):
            if isinstance(group, Mapping):
                pod_set = (base.text(group.get("groupName")) or "worker").lower()
                found.append(((*self.cluster, "workerGroupSpecs", i, "template"), pod_set))
        return found

    def is_suspended(self, job: Job) -> bool:
        return base.dig(job, "spec", "suspend") is True

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {"spec.suspend": self.is_suspended(job)}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("spec", "suspend"), True)
        for template, pod_set in self._groups(job):
            self.gate_template(builder, template, pod_set=pod_set, job=job)
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        link = self.relink_merge(
            job,
            [((*template, "metadata", "annotations"), pod_set) for template, pod_set in self._groups(job)],
        )
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), {"spec": {"suspend": False}})

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        return deep_merge(self.dequeue_merge(None), {"spec": {"suspend": True}})

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        path = self._cluster_path()
        cluster = base.require_mapping(base.dig(job, *self.cluster), path)
        head = base.require_mapping(cluster.get("headGroupSpec"), f"{path}.headGroupSpec")
        result = [template_pod_set("head", 1, head.get("template"), f"{path}.headGroupSpec.template")]
        workers = base.optional_list(cluster.get("workerGroupSpecs"), f"{path}.workerGroupSpecs")
        for i, raw in enumerate(workers):
            where = f"{path}.workerGroupSpecs[{i}]"
            group = base.require_mapping(raw, where)
            name = group.get("groupName")
            if name is not None and not isinstance(name, str):
                raise base.JobSpecError(f"{where}.groupName", "Invalid value: must be a string")
            count = base.optional_int(group.get("replicas"), f"{where}.replicas", default=1)
            pod_set = (name or "worker").lower()
            result.append(template_pod_set(pod_set, count, group.get("template"), f"{where}.template"))
        return base.check_unique_names(result, f"{path}.workerGroupSpecs")

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        return base.template_priority(base.dig(job, *self.cluster, "headGroupSpec", "template"))

    def pod_set_from_labels(self, pod: Job) -> str | None:
        found = base.labels_of(pod)
        if found.get("ray.io/node-type") == "head":
            return "head"
        group = found.get("ray.io/group")
        if group is None:
            return None
        return "head" if group == "headgroup" else (group or "worker").lower()

    def _by_timestamps(self, job: Job) -> JobStatus:
        if base.is_dequeued(job):
            return JobStatus.PENDING
        if base.is_enqueued(job):
            return JobStatus.QUEUING
        return JobStatus.CREATED


class RayJobAdapter(_RayAdapter):
    """A RayJob; one instance per served API version (``rayjob`` and ``rayjobv1alpha1``)."""

    kind = "RayJob"
    plural = "rayjobs"
    queue_unit_suffix = "ray-qu"
    cluster = ("spec", "rayClusterSpec")

    def __init__(self, *, api_version: str = "ray.io/v1", extension: str = "rayjob") -> None:
        self.api_version = api_version
        self.extension = extension

    def is_managed(self, job: Job) -> bool:
        return self.quota_name(job) is not None and not base.dig(job, "spec", "clusterSelector")

    def has_started(self, job: Job) -> bool:
        deployment = base.text(base.dig(job, "status", "jobDeploymentStatus"))
        return bool(base.dig(job, "status", "startTime")) or deployment not in ("", "New", "Suspended")

    def job_status(self, job: Job) -> JobStatus:
        # Upstream keeps a finished job Running while its RayCluster still exists; that check needs
        # the API and belongs to the reconciler.
        deployment = base.dig(job, "status", "jobDeploymentStatus")
        if deployment == "Complete":
            return JobStatus.SUCCEEDED
        if deployment == "Failed":
            return JobStatus.FAILED
        if deployment == "Running":
            return JobStatus.RUNNING
        return self._by_timestamps(job)


class RayClusterAdapter(_RayAdapter):
    extension = "raycluster"
    api_version = "ray.io/v1"
    kind = "RayCluster"
    plural = "rayclusters"
    queue_unit_suffix = "raycluster-qu"
    cluster = ("spec",)

    def is_managed(self, job: Job) -> bool:
        if self.quota_name(job) is None:
            return False
        if any(kind in _PARENT_KINDS for _, kind, _ in base.owner_kinds(job)):
            return False
        return base.labels_of(job).get(_ORIGIN_LABEL) not in _PARENT_KINDS

    def has_started(self, job: Job) -> bool:
        return base.text(base.dig(job, "status", "state")) not in ("", "suspended")

    def job_status(self, job: Job) -> JobStatus:
        state = base.dig(job, "status", "state")
        if state == "failed":
            return JobStatus.FAILED
        if state == "ready":
            return JobStatus.RUNNING
        return self._by_timestamps(job)

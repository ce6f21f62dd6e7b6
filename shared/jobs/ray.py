"""Adapters for KubeRay: RayJob (``ray.io/v1`` and ``ray.io/v1alpha1``) and RayCluster (``ray.io/v1``).

Both kinds are held by ``spec.suspend`` (docs/compatibility.md#rayjob, upstream ``rayjob.go``) and carry
a cluster spec with one head group and any number of worker groups, each a pod template. The pod sets
are ``head`` (count 1) and one per worker group, named ``lower(groupName)`` (default ``worker``), count
``replicas`` (default 1).

A RayJob's spec is only the *template* of the RayCluster KubeRay creates for it (named in
``status.rayClusterName``); KubeRay's autoscaler then scales that live cluster, not the RayJob. So, as
upstream does (docs/compatibility.md#s27-rayjob-follows-its-live-raycluster), each pod set count is
raised to the live cluster's replicas of the same group when those are larger (:func:`follow_cluster`),
and the unit charges what really runs. Finding the cluster is pure too (:func:`live_cluster`,
:func:`parent_job`); the reconciler only watches RayClusters and hands them in.

Not managed, on purpose:

* a RayJob with a ``clusterSelector`` runs on an existing cluster that it neither owns nor can
  suspend (KubeRay rejects ``suspend`` in that mode), so queueing it would only wedge it;
* a RayCluster whose controller is a RayJob or RayService: the parent's QueueUnit accounts for it.
  That controller owner reference is only a claim (:func:`claimed_parent`, as for a ``batch/v1``
  Job's): the webhook gates the cluster's pod templates at the door (:func:`gate_claimed_cluster`)
  and the reconciler resolves it; a cluster whose claimed parent does not exist, has another UID or
  is not managed is queued like any labelled RayCluster (docs/compatibility.md#raycluster). KubeRay's
  ``ray.io/originated-from-crd`` label is no claim at all: any user can write it.

What runs is what is charged, submitter included (docs/compatibility.md#rayjob). In KubeRay's default
``K8sJobMode`` the RayJob runs ``ray job submit`` in a ``batch/v1`` Job it controls; that pod is the
pod set ``submitter`` (count 1), shaped by ``spec.submitterPodTemplate`` or, without one, by KubeRay's
own default (:func:`submitter_template`). In ``SidecarMode`` KubeRay adds the same default container
to the head pod, so the head pod set is charged with it. Upstream charges neither. A pod belongs to
the submitter pod set because its *controller* is a Job (:meth:`RayJobAdapter.pod_set_of`), never
because of what its annotations say, and it counts only if that Job is itself controlled by the
RayJob (``shared.jobs.podlinks``): so a Job a user makes to look like a submitter is released, like
any pod, only within the submitter's admitted count and per-pod size.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base, podlinks
from koord_queue.shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp, Segment
from koord_queue.shared.jobs.batch_job import ParentClaim, controller_claim
from koord_queue.shared.jobs.common import AdapterBase, template_pod_set
from koord_queue.shared.jobs.patches import PatchBuilder, deep_merge

_PARENT_KINDS: Final = frozenset({"RayJob", "RayService"})
_ORIGIN_LABEL: Final = "ray.io/originated-from-crd"
_ORIGIN_NAME_LABEL: Final = "ray.io/originated-from-cr-name"

#: The pod set of the submitter pod in ``K8sJobMode`` (docs/compatibility.md#rayjob).
SUBMITTER: Final = "submitter"
#: KubeRay's default submitter container: its name and requests (``GetDefaultSubmitterContainer``
#: in KubeRay v1.5: requests 500m CPU and 200Mi memory, limits 1 CPU and 1Gi). Only the requests are
#: charged, like any container's.
_SUBMITTER_CONTAINER: Final = "ray-job-submitter"
_SUBMITTER_RESOURCES: Final = {
    "requests": {"cpu": "500m", "memory": "200Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
_K8S_JOB_MODE: Final = "K8sJobMode"
_SIDECAR_MODE: Final = "SidecarMode"


def submission_mode(job: Job) -> str:
    """``spec.submissionMode``; KubeRay's default, ``K8sJobMode``, when it is not set."""
    return base.text(base.dig(job, "spec", "submissionMode")) or _K8S_JOB_MODE


def default_submitter_container() -> dict[str, Any]:
    """KubeRay's default submitter container, as far as the charge goes (name and resources)."""
    return {"name": _SUBMITTER_CONTAINER, "resources": copy.deepcopy(_SUBMITTER_RESOURCES)}


def submitter_template(job: Job) -> object:
    """The pod template KubeRay runs the submitter from in ``K8sJobMode``: the RayJob's
    ``spec.submitterPodTemplate`` as written, else KubeRay's default (one container with
    :func:`default_submitter_container`'s resources, ``restartPolicy: Never``)."""
    declared = base.dig(job, "spec", "submitterPodTemplate")
    if declared is not None:
        return declared
    return {"spec": {"containers": [default_submitter_container()], "restartPolicy": "Never"}}


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
    """A RayJob; one instance per served API version (``rayjob`` and ``rayjobv1alpha1``).

    ``pods_through_jobs``: KubeRay runs the submitter in a ``batch/v1`` Job it controls, so the
    reconciler watches Jobs to find the submitter's pods (pod set ``submitter``) through that Job.
    """

    kind = "RayJob"
    plural = "rayjobs"
    queue_unit_suffix = "ray-qu"
    cluster = ("spec", "rayClusterSpec")
    pods_through_jobs = True

    def __init__(self, *, api_version: str = "ray.io/v1", extension: str = "rayjob") -> None:
        self.api_version = api_version
        self.extension = extension

    def is_managed(self, job: Job) -> bool:
        return self.quota_name(job) is not None and not base.dig(job, "spec", "clusterSelector")

    def _groups(self, job: Job) -> list[tuple[Sequence[Segment], str]]:
        """The cluster's groups, and a declared ``spec.submitterPodTemplate`` in ``K8sJobMode``:
        KubeRay copies it into the submitter Job, whose pods are then born gated and linked in any
        namespace (docs/compatibility.md#rayjob). KubeRay's default submitter has no template to gate."""
        found = super()._groups(job)
        declared = base.dig(job, "spec", "submitterPodTemplate")
        if submission_mode(job) == _K8S_JOB_MODE and isinstance(declared, Mapping):
            found.append((("spec", "submitterPodTemplate"), SUBMITTER))
        return found

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        """The cluster's pod sets, plus what the submission mode runs (docs/compatibility.md#rayjob):
        the ``submitter`` pod set in ``K8sJobMode``, the submitter container in the head pod in
        ``SidecarMode``; ``HTTPMode`` and ``InteractiveMode`` run nothing more."""
        found = super().pod_sets(job)
        mode = submission_mode(job)
        if mode == _K8S_JOB_MODE:
            where = "spec.submitterPodTemplate"
            found.append(template_pod_set(SUBMITTER, 1, submitter_template(job), where))
            return base.check_unique_names(found, f"{self._cluster_path()}.workerGroupSpecs")
        if mode == _SIDECAR_MODE:
            found[0] = _with_sidecar(found[0])
        return found

    def pod_set_of(self, pod: Job) -> str | None:
        """A pod whose controller is a ``batch/v1`` Job is the submitter's, whatever its annotations
        say; whether that Job is the RayJob's own is proved when the pod is counted
        (``shared.jobs.podlinks``). Any other pod: by its annotation, else KubeRay's labels."""
        ref = podlinks.controller_of(pod)
        if ref is not None and ref[0] == "Job":
            return SUBMITTER
        return super().pod_set_of(pod)

    def job_status(self, job: Job) -> JobStatus:
        # Upstream keeps a finished job Running while its RayCluster still exists; that needs the
        # cluster, which the reconciler has: see ``hold_while_cluster_lives``.
        deployment = base.dig(job, "status", "jobDeploymentStatus")
        if deployment == "Complete":
            return JobStatus.SUCCEEDED
        # KubeRay never leaves ``ValidationFailed`` (it has no transition out of it, even once the
        # spec is valid): such a job will start no pod, so it must not hold quota. KubeRay sets it,
        # for one, on a held RayJob without ``shutdownAfterJobFinishes: true``, which it refuses to
        # suspend (docs/development.md#real-operators-in-e2e).
        if deployment in ("Failed", "ValidationFailed"):
            return JobStatus.FAILED
        if deployment == "Running":
            return JobStatus.RUNNING
        return self._by_timestamps(job)


def _with_sidecar(head: JobPodSet) -> JobPodSet:
    """The head pod set with KubeRay's submitter container added, as ``SidecarMode`` runs it."""
    template = copy.deepcopy(head.template)
    spec = template.setdefault("spec", {})
    containers = spec.get("containers")
    spec["containers"] = [
        *(containers if isinstance(containers, list) else []),
        default_submitter_container(),
    ]
    return template_pod_set(head.name, head.count, template, "spec.rayClusterSpec.headGroupSpec.template")


class RayClusterAdapter(_RayAdapter):
    extension = "raycluster"
    api_version = "ray.io/v1"
    kind = "RayCluster"
    plural = "rayclusters"
    queue_unit_suffix = "raycluster-qu"
    cluster = ("spec",)
    #: KubeRay releases before v1 serve RayClusters only in ``v1alpha1`` (same paths)
    older_versions = ("v1alpha1",)

    def is_managed(self, job: Job) -> bool:
        """Labelled and claiming no parent (:func:`claimed_parent`). Neither a non-controller owner
        reference nor KubeRay's origin label takes a cluster out of the queue: a user writes both on
        CREATE, and only a controller reference can be resolved (docs/architecture.md#trust-boundaries)."""
        return self.quota_name(job) is not None and claimed_parent(job) is None

    def job_status(self, job: Job) -> JobStatus:
        state = base.dig(job, "status", "state")
        if state == "failed":
            return JobStatus.FAILED
        if state == "ready":
            return JobStatus.RUNNING
        return self._by_timestamps(job)


# --- a RayCluster's claimed parent --------------------------------------------------------------


def claimed_parent(cluster: Job) -> ParentClaim | None:
    """The first controller owner reference of ``cluster`` naming a RayJob or RayService of
    ``ray.io``, if any: a claim for the reconciler to resolve, not a fact."""
    return controller_claim(cluster, lambda group, kind: group == "ray.io" and kind in _PARENT_KINDS)


def gate_claimed_cluster(cluster: Job, *, parent_unit_ref: str | None) -> list[JsonPatchOp]:
    """The CREATE patch of a RayCluster that would be queued but claims a parent
    (:func:`claimed_parent`): every head and worker template gets the admission gate (never twice)
    and names the claimed parent's QueueUnit (``parent_unit_ref``; None for a RayService, which
    has no unit), and the cluster is not suspended.

    The webhook cannot read the parent (docs/architecture.md#decision-6-a-stateless-scoped-webhook):
    suspending a real child would deadlock its RayJob, and letting a forged one in as it is would run
    its pods until the reconciler resolved the claim. A cluster KubeRay creates for a RayJob copies
    the RayJob's templates, already gated and naming its unit, so for it this patch is empty; its
    pods are released under the RayJob's admission (pod → RayCluster → RayJob). A forged one's pods
    wait until the reconciler queues and admits the cluster as its own
    (docs/compatibility.md#raycluster). Pure.
    """
    builder = PatchBuilder(cluster)
    for template, _ in RayClusterAdapter()._groups(cluster):
        if not isinstance(builder.get(template), Mapping):
            continue
        if parent_unit_ref:
            builder.set(
                (*template, "metadata", "annotations", names.RELATED_QUEUEUNIT_ANNOTATION), parent_unit_ref
            )
        builder.append_unique(
            (*template, "spec", "schedulingGates"), {"name": names.ADMISSION_GATE}, key="name"
        )
    return builder.ops


# --- the live RayCluster of a RayJob ------------------------------------------------------------


def cluster_name(job: Job) -> str | None:
    """The RayCluster KubeRay created for this RayJob (``status.rayClusterName``), once it has one."""
    return base.text(base.dig(job, "status", "rayClusterName")) or None


def parent_job(cluster: Job) -> str | None:
    """The name of the RayJob that created ``cluster``, if a RayJob did.

    The controller owner reference says so; KubeRay's origin labels are the fallback for a cluster
    whose owner reference was removed (an orphaning delete of the RayJob leaves the labels). The
    fallback only ever guards (the webhook's refusals for a RayJob's cluster) or wakes the named
    RayJob; it releases nothing and takes no cluster out of the queue (:func:`claimed_parent` does
    not read it).
    """
    for _, kind, name in base.owner_kinds(cluster, controller_only=True):
        if kind == "RayJob":
            return name
    labels = base.labels_of(cluster)
    if labels.get(_ORIGIN_LABEL) == "RayJob":
        return labels.get(_ORIGIN_NAME_LABEL) or None
    return None


def _belongs_to(cluster: Job, job: Job) -> bool:
    """``cluster`` is not controlled by another object than ``job``.

    ``status.rayClusterName`` is written by KubeRay and normally right; the check only keeps a
    stale or hand-edited name from charging a RayJob with somebody else's cluster.
    """
    uid = base.text(base.dig(job, "metadata", "uid"))
    refs = base.dig(cluster, "metadata", "ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if base.dig(ref, "controller") is not True:
            continue
        if base.dig(ref, "kind") != "RayJob" or base.dig(ref, "name") != base.name_of(job):
            return False
        ref_uid = base.text(base.dig(ref, "uid"))
        return not (uid and ref_uid and ref_uid != uid)
    return True


def live_cluster(job: Job, clusters: Mapping[str, Job]) -> Job | None:
    """The RayJob's live RayCluster from ``clusters`` (a store keyed ``namespace/name``), or None
    when the job names none, the cluster is not there (yet, or any more) or is not the job's."""
    name = cluster_name(job)
    if name is None:
        return None
    cluster = clusters.get(f"{base.namespace_of(job)}/{name}")
    return cluster if cluster is not None and _belongs_to(cluster, job) else None


def hold_while_cluster_lives(job_status: JobStatus, cluster: Job | None) -> JobStatus:
    """A finished RayJob whose RayCluster still exists still holds its pods: it counts as running
    until the cluster is gone (upstream's rule; KubeRay keeps the cluster after the job for
    ``shutdownAfterJobFinishes: false`` or a TTL), so its quota is not released under live pods."""
    if cluster is not None and job_status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        return JobStatus.RUNNING
    return job_status


def cluster_replicas(cluster: Job) -> dict[str, int]:
    """Replicas per pod set of a live RayCluster: ``head`` 1, each worker group its ``replicas``.

    Read leniently (the cluster is KubeRay's, not ours to validate): a group without a readable
    ``replicas`` is left out, so it never raises a count.
    """
    found: dict[str, int] = {}
    if isinstance(base.dig(cluster, "spec", "headGroupSpec"), Mapping):
        found["head"] = 1
    workers = base.dig(cluster, "spec", "workerGroupSpecs")
    for group in workers if isinstance(workers, list) else []:
        replicas = base.dig(group, "replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            continue
        name = (base.text(base.dig(group, "groupName")) or "worker").lower()
        found[name] = max(found.get(name, 0), replicas)
    return found


def follow_cluster(pod_sets: Sequence[JobPodSet], cluster: Job) -> list[JobPodSet]:
    """``pod_sets`` with each count raised to the live cluster's replicas of the same group when
    those are larger (upstream's rule). The count is ``max(spec, live)``: it follows the
    autoscaler up and back down, but never below what the RayJob itself asks for. Groups only
    the cluster has are ignored: the unit's pod sets come from the RayJob."""
    live = cluster_replicas(cluster)
    return [
        dataclasses.replace(ps, count=live[ps.name]) if live.get(ps.name, 0) > ps.count else ps
        for ps in pod_sets
    ]

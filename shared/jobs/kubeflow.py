"""Adapters for the Kubeflow kinds TFJob, PyTorchJob, PaddleJob, XGBoostJob and JAXJob
(``kubeflow.org/v1``, the training operator) and MPIJob (``kubeflow.org/v2beta1``, the MPI operator)
(docs/compatibility.md#kubeflow-jobs, upstream ``tfjob.go``). The kinds differ only in the rows of
:data:`KINDS`; one adapter class serves them all.

A Kubeflow job is held two ways at once: the operators honour ``spec.runPolicy.suspend``, and
upstream Koord-Queue reads the annotation ``scheduling.x-k8s.io/suspend``. We write both, so
either reader sees the job held, and the validating webhook watches both (``suspend_state``).

Each replica type (``Chief``, ``PS``, ``Worker``, ``Master``, ``Launcher``, ...) is one pod set named
after the lowercased type; unlike upstream, which skips ``Master`` when it labels templates, every
replica's template is gated, because a Master pod that starts early holds resources the queue never
granted. Replica types are visited in sorted order so pod sets and priorities are deterministic.

The MPI operator runs an MPIJob's launcher as a ``batch/v1`` Job it creates from the ``Launcher``
template (the workers are pods it creates itself), so the launcher pod is owned by that Job, not by
the MPIJob: the row says so (``pods_through_jobs``) and the reconciler links such pods through the Job
(docs/compatibility.md#pod-gating).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp
from koord_queue.shared.jobs.common import AdapterBase, template_pod_set
from koord_queue.shared.jobs.patches import deep_merge

_SUSPEND_PATH = f"metadata.annotations[{names.SUSPEND_ANNOTATION}]"
_OPERATOR_ROLE_LABEL = "training.kubeflow.org/replica-type"


@dataclass(frozen=True)
class KubeflowKind:
    """What differs between the Kubeflow kinds: identity, unit-name suffix, replica-spec field, the
    other pod labels that name a replica type (tried after ``training.kubeflow.org/replica-type``),
    the served version (the MPI operator's is not the training operator's) and whether the operator
    creates ``batch/v1`` Jobs that own some of the job's pods."""

    extension: str
    kind: str
    plural: str
    queue_unit_suffix: str
    replica_field: str
    role_labels: tuple[str, ...] = ()
    api_version: str = "kubeflow.org/v1"
    pods_through_jobs: bool = False


class KubeflowAdapter(AdapterBase):
    """One Kubeflow kind, described by a :class:`KubeflowKind` row of :data:`KINDS`."""

    def __init__(self, row: KubeflowKind) -> None:
        self.extension = row.extension
        self.api_version = row.api_version
        self.kind = row.kind
        self.plural = row.plural
        self.queue_unit_suffix = row.queue_unit_suffix
        self.replica_field = row.replica_field
        self.role_labels = row.role_labels
        self.pods_through_jobs = row.pods_through_jobs

    def _replicas(self, job: Job) -> list[tuple[str, Mapping[str, Any]]]:
        """Replica specs in sorted order, skipping malformed entries (lenient)."""
        specs = base.dig(job, "spec", self.replica_field)
        if not isinstance(specs, Mapping):
            return []
        return [(role, specs[role]) for role in sorted(specs) if isinstance(specs[role], Mapping)]

    def is_suspended(self, job: Job) -> bool:
        return any(self.suspend_state(job).values())

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {
            "spec.runPolicy.suspend": base.dig(job, "spec", "runPolicy", "suspend") is True,
            _SUSPEND_PATH: base.annotations_of(job).get(names.SUSPEND_ANNOTATION) == "true",
        }

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("metadata", "annotations", names.SUSPEND_ANNOTATION), "true")
        builder.set(("spec", "runPolicy", "suspend"), True)
        for role, _ in self._replicas(job):
            template = ("spec", self.replica_field, role, "template")
            self.gate_template(builder, template, pod_set=role.lower(), job=job)
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        body = {
            "metadata": {"annotations": {names.SUSPEND_ANNOTATION: "false"}},
            "spec": {"runPolicy": {"suspend": False}},
        }
        targets = [
            (("spec", self.replica_field, role, "template", "metadata", "annotations"), role.lower())
            for role, _ in self._replicas(job)
        ]
        link = self.relink_merge(job, targets)
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), body)

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        body = {
            "metadata": {"annotations": {names.SUSPEND_ANNOTATION: "true"}},
            "spec": {"runPolicy": {"suspend": True}},
        }
        return deep_merge(self.dequeue_merge(None), body)

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        path = f"spec.{self.replica_field}"
        specs = base.require_mapping(base.dig(job, "spec", self.replica_field), path)
        result = []
        for role in sorted(specs):
            where = f"{path}[{role}]"
            spec = base.require_mapping(specs[role], where)
            count = base.optional_int(spec.get("replicas"), f"{where}.replicas", default=1)
            result.append(template_pod_set(role.lower(), count, spec.get("template"), f"{where}.template"))
        return base.check_unique_names(result, path)

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        replicas = self._replicas(job)
        # Upstream reads the first non-Master role; a Master-only job falls back to Master.
        preferred = [spec for role, spec in replicas if role != "Master"] or [spec for _, spec in replicas]
        return base.template_priority(preferred[0].get("template")) if preferred else (None, None)

    def pod_set_from_labels(self, pod: Job) -> str | None:
        found = base.labels_of(pod)
        for key in (_OPERATOR_ROLE_LABEL, *self.role_labels):
            if found.get(key):
                return found[key].lower()
        return None

    def job_status(self, job: Job) -> JobStatus:
        if base.has_condition(job, "Succeeded"):
            return JobStatus.SUCCEEDED
        if base.has_condition(job, "Failed"):
            return JobStatus.FAILED
        if base.has_condition(job, "Running") or base.has_condition(job, "Scheduled"):
            return JobStatus.RUNNING
        if not self.is_suspended(job):
            return JobStatus.PENDING
        if base.has_condition(job, "Queuing") or base.is_enqueued(job):
            return JobStatus.QUEUING
        return JobStatus.CREATED


#: Every Kubeflow kind that shares TFJob's run policy, one row per kind; a new kind is a row here (the
#: registry takes every row). Replica-spec fields are the training operator's (v1.9.0 CRDs) and the
#: MPI operator's (``v2beta1``). Unit names follow upstream's ``<name>-<short framework>-qu`` rule
#: (``tf-qu``, ``py-qu``, and ``mpi-qu`` of upstream's MPIJob extension); the kinds upstream has no
#: extension for use the framework name (``paddle``, ``jax``) or the CRD's own abbreviation (``xgb``,
#: as in ``xgbReplicaSpecs``). The MPI operator labels its pods ``training.kubeflow.org/job-role``
#: (``launcher``, ``worker``), not with the replica type.
KINDS: Final[tuple[KubeflowKind, ...]] = (
    KubeflowKind("tfjob", "TFJob", "tfjobs", "tf-qu", "tfReplicaSpecs", ("job-role",)),
    KubeflowKind(
        "pytorchjob",
        "PyTorchJob",
        "pytorchjobs",
        "py-qu",
        "pytorchReplicaSpecs",
        ("pytorch-replica-type", "job-role"),
    ),
    KubeflowKind("paddlejob", "PaddleJob", "paddlejobs", "paddle-qu", "paddleReplicaSpecs", ()),
    KubeflowKind("xgboostjob", "XGBoostJob", "xgboostjobs", "xgb-qu", "xgbReplicaSpecs", ()),
    KubeflowKind("jaxjob", "JAXJob", "jaxjobs", "jax-qu", "jaxReplicaSpecs", ()),
    KubeflowKind(
        "mpijob",
        "MPIJob",
        "mpijobs",
        "mpi-qu",
        "mpiReplicaSpecs",
        ("training.kubeflow.org/job-role",),
        api_version="kubeflow.org/v2beta1",
        pods_through_jobs=True,
    ),
)


def adapters() -> tuple[KubeflowAdapter, ...]:
    """One adapter per row of :data:`KINDS`, in table order."""
    return tuple(KubeflowAdapter(row) for row in KINDS)

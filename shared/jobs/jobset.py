"""Adapter for JobSet, ``jobset.x-k8s.io/v1alpha2`` (docs/compatibility.md#jobset).

A JobSet is held by ``spec.suspend``: the JobSet controller creates its child Jobs suspended while it
is set and suspends (or resumes) them when it changes. Upstream Koord-Queue has no JobSet extension;
the unit name follows its ``<name>-<kind>-qu`` style (``<name>-jobset-qu``).

Each entry of ``spec.replicatedJobs`` is one pod set named after the entry: the controller runs
``replicas`` (default 1) Jobs from the entry's Job template, each with ``parallelism`` pods (default 1)
unless ``completions`` asks for fewer, all from the pod template at ``template.spec.template``. That
template is gated and linked to the unit, and the controller copies it into every child Job, so each
pod is born gated and names its unit and pod set. The pods are owned by the child Jobs, not by the
JobSet, so they are linked to the unit through those Jobs (``pods_through_jobs``,
docs/compatibility.md#pod-gating); the child Jobs themselves are not managed (``batch_job``).

The JobSet webhook allows a suspended JobSet's pod template metadata and scheduling gates to change
and nothing else of ``replicatedJobs``, which is all the resume patch may add (the links of a
``generateName`` JobSet, written with the release in one patch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp, Segment
from koord_queue.shared.jobs.common import AdapterBase, template_pod_set
from koord_queue.shared.jobs.patches import deep_merge

#: The label the JobSet controller puts on every child Job's pods: the replicated job's name.
REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
_JOBS: Final = ("spec", "replicatedJobs")


class JobSetAdapter(AdapterBase):
    extension = "jobset"
    api_version = "jobset.x-k8s.io/v1alpha2"
    kind = "JobSet"
    plural = "jobsets"
    queue_unit_suffix = "jobset-qu"
    pods_through_jobs = True

    def _templates(self, job: Job) -> list[tuple[Sequence[Segment], str]]:
        """``(pod template path, pod set name)`` of every named replicated job, leniently (for
        gating); an entry without a name is never stored (the JobSet CRD requires one)."""
        found: list[tuple[Sequence[Segment], str]] = []
        entries = base.dig(job, *_JOBS)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            name = base.text(base.dig(entry, "name"))
            if name:
                found.append(((*_JOBS, i, "template", "spec", "template"), name))
        return found

    def is_suspended(self, job: Job) -> bool:
        return base.dig(job, "spec", "suspend") is True

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {"spec.suspend": self.is_suspended(job)}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("spec", "suspend"), True)
        for template, pod_set in self._templates(job):
            self.gate_template(builder, template, pod_set=pod_set, job=job)
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        link = self.relink_merge(
            job,
            [((*template, "metadata", "annotations"), pod_set) for template, pod_set in self._templates(job)],
        )
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), {"spec": {"suspend": False}})

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        return deep_merge(self.dequeue_merge(None), {"spec": {"suspend": True}})

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        path = base.field_path(_JOBS)
        base.require_mapping(base.dig(job, "spec"), "spec")
        entries = base.optional_list(base.dig(job, *_JOBS), path)
        result = []
        for i, raw in enumerate(entries):
            where = f"{path}[{i}]"
            entry = base.require_mapping(raw, where)
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise base.JobSpecError(f"{where}.name", "Required value: a replicated job needs a name")
            replicas = base.optional_int(entry.get("replicas"), f"{where}.replicas", default=1)
            spec = base.require_mapping(base.dig(entry, "template", "spec"), f"{where}.template.spec")
            parallelism = base.optional_int(
                spec.get("parallelism"), f"{where}.template.spec.parallelism", default=1
            )
            completions = base.optional_int(
                spec.get("completions"), f"{where}.template.spec.completions", default=parallelism
            )
            per_job = min(parallelism, completions)
            result.append(
                template_pod_set(
                    name, replicas * per_job, spec.get("template"), f"{where}.template.spec.template"
                )
            )
        return base.check_unique_names(result, path)

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        """From the first replicated job (in spec order) whose pod template names a priority class
        (a template's raw priority is ignored, ``base.template_priority``): the replicated jobs
        of one JobSet rarely differ, and spec order is the only order the JobSet itself gives them."""
        for template, _ in self._templates(job):
            found = base.template_priority(base.dig(job, *template))
            if found != (None, None):
                return found
        return None, None

    def pod_set_from_labels(self, pod: Job) -> str | None:
        return base.labels_of(pod).get(REPLICATED_JOB_LABEL) or None

    def job_status(self, job: Job) -> JobStatus:
        terminal = base.dig(job, "status", "terminalState")
        if terminal == "Completed" or base.has_condition(job, "Completed"):
            return JobStatus.SUCCEEDED
        if terminal == "Failed" or base.has_condition(job, "Failed"):
            return JobStatus.FAILED
        # A child Job with pods pending or running counts as active, gated pods included: the
        # reconciler reports Pending until one of the pods is bound, as for a batch/v1 Job.
        if any(_active(entry) for entry in _statuses(job)):
            return JobStatus.RUNNING
        if base.is_dequeued(job):
            return JobStatus.PENDING
        if base.is_enqueued(job):
            return JobStatus.QUEUING
        return JobStatus.CREATED


def _statuses(job: Job) -> list[Mapping[str, Any]]:
    found = base.dig(job, "status", "replicatedJobsStatus")
    return [entry for entry in found if isinstance(entry, Mapping)] if isinstance(found, list) else []


def _active(entry: Mapping[str, Any]) -> bool:
    value = entry.get("active")
    return isinstance(value, int) and not isinstance(value, bool) and value > 0

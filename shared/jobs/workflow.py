"""Adapter for Argo ``argoproj.io/v1alpha1`` Workflow (REFERENCE §2.5, ``argoworkflow.go``).

A Workflow is held by ``spec.suspend: true``. Upstream also recognises its workflows by a template
named ``koord-queue-suspend`` with a ``suspend`` block, so the webhook appends
``{name: koord-queue-suspend, suspend: {}}`` to ``spec.templates`` when it is missing; a step may
reference it to pause the workflow again later.

A workflow's pods are created one step at a time from many templates, so there is no pod template
the webhook could gate and no pod count known up front. The demand is declared instead by the
annotation ``koord-queue/min-resources`` (a ResourceList in JSON or YAML) and becomes one pod set
``default`` with count 1 whose synthetic template asks for exactly that. Without the annotation the
workflow asks for nothing and is admitted as soon as its queue lets it through.

Status differs from upstream in one detail: upstream reads a status condition ``Enqueued`` that its
controller writes; here the webhook's ``koord-queue/job-has-enqueued`` annotation counts as well, so
a workflow the webhook held is Queuing from its first reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shared import names, quantities
from shared.jobs import base
from shared.jobs.base import Job, JobPodSet, JobStatus, JsonPatchOp
from shared.jobs.common import AdapterBase, synthetic_template
from shared.jobs.patches import deep_merge
from shared.jobs.podspec import parse_min_resources

POD_SET: Final = "default"
_WORKFLOW_LABEL: Final = "workflows.argoproj.io/workflow"
_MIN_RESOURCES_PATH: Final = f"metadata.annotations[{names.MIN_RESOURCES_ANNOTATION}]"


class WorkflowAdapter(AdapterBase):
    extension = "workflow"
    api_version = "argoproj.io/v1alpha1"
    kind = "Workflow"
    plural = "workflows"
    queue_unit_suffix = ""
    #: No pod of a workflow is linked to its unit; upstream reports one synthetic bound pod.
    synthetic_pods = True

    def has_started(self, job: Job) -> bool:
        phase = base.dig(job, "status", "phase")
        return bool(base.dig(job, "status", "startedAt")) or phase in (
            "Running",
            "Succeeded",
            "Failed",
            "Error",
        )

    def is_suspended(self, job: Job) -> bool:
        if base.dig(job, "spec", "suspend") is True:
            return True
        nodes = base.dig(job, "status", "nodes")
        if not isinstance(nodes, Mapping):
            return False
        return any(
            base.dig(node, "type") == "Suspend" and base.dig(node, "phase") == "Running"
            for node in nodes.values()
        )

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {"spec.suspend": base.dig(job, "spec", "suspend") is True}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("spec", "suspend"), True)
        builder.append_unique(
            ("spec", "templates"), {"name": names.WORKFLOW_SUSPEND_TEMPLATE, "suspend": {}}, key="name"
        )
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        # A merge patch cannot remove one list item; the suspend template stays, unreferenced.
        return deep_merge(self.dequeue_merge(now_text), {"spec": {"suspend": False}})

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        return deep_merge(self.dequeue_merge(None), {"spec": {"suspend": True}})

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        raw = base.annotations_of(job).get(names.MIN_RESOURCES_ANNOTATION)
        per_pod = parse_min_resources(raw, _MIN_RESOURCES_PATH) if raw is not None else {}
        template = synthetic_template(POD_SET, quantities.format_resource_list(per_pod))
        class_name, value = self.priority(job)
        if class_name:
            template["spec"]["priorityClassName"] = class_name
        if value is not None:
            template["spec"]["priority"] = value
        return [JobPodSet(name=POD_SET, count=1, template=template, per_pod=per_pod)]

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        value = base.dig(job, "spec", "priority")
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        class_name = base.text(base.dig(job, "spec", "podPriorityClassName"))
        if not class_name:
            entrypoint = base.dig(job, "spec", "entrypoint")
            templates = base.dig(job, "spec", "templates")
            for template in templates if isinstance(templates, list) else []:
                if entrypoint and base.dig(template, "name") == entrypoint:
                    class_name = base.text(base.dig(template, "priorityClassName"))
                    break
        return class_name or None, number

    def pod_set_from_labels(self, pod: Job) -> str | None:
        return POD_SET if base.labels_of(pod).get(_WORKFLOW_LABEL) else None

    def job_status(self, job: Job) -> JobStatus:
        phase = base.dig(job, "status", "phase")
        if phase == "Succeeded":
            return JobStatus.SUCCEEDED
        if phase in ("Failed", "Error"):
            return JobStatus.FAILED
        enqueued = base.has_condition(job, "Enqueued") or bool(
            base.annotations_of(job).get(names.JOB_HAS_ENQUEUED_ANNOTATION)
        )
        if not enqueued:
            return JobStatus.CREATED
        return JobStatus.QUEUING if self.is_suspended(job) else JobStatus.RUNNING

"""Adapter for Argo ``argoproj.io/v1alpha1`` Workflow (docs/compatibility.md#argo-workflow, upstream
``argoworkflow.go``).

A Workflow is held by ``spec.suspend: true``. Upstream also recognises its workflows by a template
named ``koord-queue-suspend`` with a ``suspend`` block, so the webhook appends
``{name: koord-queue-suspend, suspend: {}}`` to ``spec.templates`` when it is missing.

A workflow's pods are created one step at a time from many templates, so there is no pod template
the webhook could gate and no pod count known up front. The demand is declared instead by the
annotation ``koord-queue/min-resources`` (a ResourceList in JSON or YAML) and becomes one pod set
``default`` with count 1 whose synthetic template asks for exactly that. Unlike upstream (where a
workflow without it asks for nothing and is admitted at once, charged nothing), the annotation is
required: the webhook refuses a managed Workflow without a non-empty one, with an example value,
and refuses any change of it until the workflow finishes (the QueueUnit follows it, so lowering it
while the workflow runs would release quota the workflow still uses). The reconciler enforces the
same: :meth:`WorkflowAdapter.pod_sets` raises for a Workflow without it, so such a workflow (stored
before the rule) gets no QueueUnit but an ``InvalidJob`` event, and stays held.

The annotation is a reservation, never a ceiling the user sets on their own charge: the workflow's
pods run only within it (docs/compatibility.md#argo-workflow). The webhook puts the label
``koord-queue/gated-pod: "true"`` and the unit's ``koord-queue/related-queueunit`` and
``koord-queue/related-podset-name`` annotations into ``spec.podMetadata``, which Argo's controller
copies onto every pod it creates; the pod webhook (``shared.admission.podgate``) gates each such
pod, as it does a SparkApplication's. The reconciler releases a pod only when the Workflow is its
controller and the requests of the workflow's live released or bound pods plus this one fit the
admitted reservation (``shared.jobs.podbudget``, :attr:`WorkflowAdapter.pods_within_reservation`):
steps larger in sum than the reservation run one after another within it, and a step larger than
the whole reservation stays gated with a Warning saying so. The label and the annotations cannot be
removed or changed while the workflow is managed (:meth:`WorkflowAdapter.admission_errors`); the
resume patch writes them again (a Workflow created under ``generateName``, or stored before the
rule, gets them then, before Argo creates any pod).

Trust: Argo's CRD has no status subresource, so anyone who may update a Workflow may write its
status with it (``status_subresource = False``). The webhook removes a status sent on CREATE and
lets only Argo's controller change it afterwards. The readers here depend as little as possible
on status even so:

* :meth:`WorkflowAdapter.is_suspended` reads ``spec.suspend`` only, the one field that holds the
  whole workflow (and the one the queue writes). Upstream also counts a Running ``Suspend`` node,
  but such a node is one *step* waiting (an approval step the user wrote, possibly next to branches
  that keep running pods), so it would make an admitted, running workflow look held: its unit would
  report nothing running and be open to reclaim, and a deleted unit would be re-queued instead of
  adopted while the workflow kept running uncharged.
* :meth:`WorkflowAdapter.job_status` reports a workflow the queue still holds (enqueued,
  ``spec.suspend: true``, no dequeue stamp) as Queuing whatever its phase says: the admission
  rules stop applying to a finished job, so a phase that could be made to read ``Succeeded`` or
  ``Failed`` must not end the hold. A workflow that really fails while queued (``argo stop``, a
  deadline) is therefore released once more when admitted, then seen Failed and its quota freed.

Status differs from upstream in one more detail: upstream reads a status condition ``Enqueued`` that
its controller writes; here the webhook's enqueue annotations (``koord-queue/job-has-enqueued``,
``koord-queue/job-enqueue-timestamp``) count as well, so a workflow the webhook held is Queuing
from its first reconcile.
"""

from __future__ import annotations

from typing import Any, Final

from koord_queue.shared.api import names, quantities
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobPodSet, JobSpecError, JobStatus, JsonPatchOp
from koord_queue.shared.jobs.common import AdapterBase, synthetic_template
from koord_queue.shared.jobs.patches import deep_merge
from koord_queue.shared.jobs.podspec import parse_min_resources

POD_SET: Final = "default"
_WORKFLOW_LABEL: Final = "workflows.argoproj.io/workflow"
_MIN_RESOURCES_PATH: Final = f"metadata.annotations[{names.MIN_RESOURCES_ANNOTATION}]"
_FINISHED: Final = (JobStatus.SUCCEEDED, JobStatus.FAILED)
#: ``spec.podMetadata``: labels and annotations Argo's controller copies onto every pod it creates.
_POD_METADATA: Final = ("spec", "podMetadata")
#: What the queue writes into ``spec.podMetadata`` and freezes there: the gate's label, the unit link.
_FROZEN_POD_METADATA: Final = (
    ("labels", names.GATED_POD_LABEL),
    ("annotations", names.RELATED_QUEUEUNIT_ANNOTATION),
    ("annotations", names.RELATED_PODSET_ANNOTATION),
)
#: Why the annotation is needed and what to write, for every message that asks for it.
_MIN_RESOURCES_HELP: Final = (
    "koord-queue charges a Workflow to its quota by this annotation, because a Workflow's pods are "
    "created step by step from its templates and cannot be counted up front; set it to the "
    "resources to reserve while the workflow runs, as a resource list in JSON or YAML, for example "
    f"""{names.MIN_RESOURCES_ANNOTATION}: '{{"cpu": "4", "memory": "8Gi"}}'"""
)

_EMPTY_MIN_RESOURCES: Final = (
    f"Required value: the value names no resource with a quantity above zero; {_MIN_RESOURCES_HELP}"
)


def min_resources(job: Job) -> dict[str, int] | None:
    """The declared demand, or ``None`` when the annotation is missing, unreadable or names no
    resource with a quantity above zero (none of which sizes the workflow)."""
    raw = base.annotations_of(job).get(names.MIN_RESOURCES_ANNOTATION)
    if raw is None:
        return None
    try:
        parsed = parse_min_resources(raw, _MIN_RESOURCES_PATH)
    except JobSpecError:
        return None
    return parsed if any(value > 0 for value in parsed.values()) else None


class WorkflowAdapter(AdapterBase):
    extension = "workflow"
    api_version = "argoproj.io/v1alpha1"
    kind = "Workflow"
    plural = "workflows"
    queue_unit_suffix = ""
    #: The unit reports its admitted replica as running while the workflow is released, as
    #: upstream's synthetic bound pod does (its real pods come and go step by step).
    synthetic_pods = True
    #: Its pods are released while their summed requests fit the reservation, not one per replica
    #: (module docstring, ``shared.jobs.podbudget``).
    pods_within_reservation = True
    #: Argo's CRD serves no status subresource: status is written with the object.
    status_subresource = False

    def admission_errors(self, old: Job | None, new: Job) -> list[JobSpecError]:
        """``koord-queue/min-resources`` is required, then frozen until the workflow finishes; the
        pod gating in ``spec.podMetadata`` is frozen while the workflow is managed
        (:func:`_pod_metadata_errors`).

        ``old`` is None on CREATE and when the workflow joins the queue by gaining a quota label:
        then the annotation must size it. An annotation that does not parse is reported by the
        webhook's annotation checks already, so it is not reported again here. A workflow whose
        old annotation did not size it was stored before the rule: its updates (Argo's own status
        writes among them) are not refused for that, and it may still get one, which only raises
        what it is charged; until then the reconciler keeps it held (:meth:`pod_sets`).
        """
        if old is not None and (errors := _pod_metadata_errors(old, new)):
            return errors
        raw = base.annotations_of(new).get(names.MIN_RESOURCES_ANNOTATION)
        if old is not None and min_resources(old) is None:
            return []
        if old is None:
            if raw is None:
                return [JobSpecError(_MIN_RESOURCES_PATH, f"Required value: {_MIN_RESOURCES_HELP}")]
            try:
                parsed = parse_min_resources(raw, _MIN_RESOURCES_PATH)
            except JobSpecError:
                return []
            if not any(value > 0 for value in parsed.values()):
                return [JobSpecError(_MIN_RESOURCES_PATH, _EMPTY_MIN_RESOURCES)]
            return []
        if self.job_status(old) in _FINISHED or min_resources(new) == min_resources(old):
            return []
        detail = (
            f"Forbidden: {names.MIN_RESOURCES_ANNOTATION} is the size the Workflow was queued with "
            "and what its QueueUnit reserves in the quota; it cannot change until the workflow "
            "finishes (delete and re-create the Workflow to resize it)"
        )
        return [JobSpecError(_MIN_RESOURCES_PATH, detail)]

    def is_suspended(self, job: Job) -> bool:
        """``spec.suspend`` alone; a Running ``Suspend`` node is one waiting step (module docstring)."""
        return base.dig(job, "spec", "suspend") is True

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {"spec.suspend": base.dig(job, "spec", "suspend") is True}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("spec", "suspend"), True)
        builder.append_unique(
            ("spec", "templates"), {"name": names.WORKFLOW_SUSPEND_TEMPLATE, "suspend": {}}, key="name"
        )
        builder.set((*_POD_METADATA, "labels", names.GATED_POD_LABEL), "true")
        ref = self.queue_unit_ref(job)
        if ref is not None:
            builder.set((*_POD_METADATA, "annotations", names.RELATED_QUEUEUNIT_ANNOTATION), ref)
        builder.set((*_POD_METADATA, "annotations", names.RELATED_PODSET_ANNOTATION), POD_SET)
        return builder.ops

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        """Release the workflow, with its pods' gate label and unit link in ``spec.podMetadata``.

        Written in the same write as ``spec.suspend: false``, so every pod Argo creates afterwards
        carries them: a Workflow named by ``generateName`` has no unit link from the webhook, and
        one stored before the rule has no label. A merge patch cannot remove one list item; the
        suspend template stays, unreferenced.
        """
        link = self.relink_merge(job, [((*_POD_METADATA, "annotations"), POD_SET)])
        gate = {"spec": {"suspend": False, "podMetadata": {"labels": {names.GATED_POD_LABEL: "true"}}}}
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), gate)

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        return deep_merge(self.dequeue_merge(None), {"spec": {"suspend": True}})

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        raw = base.annotations_of(job).get(names.MIN_RESOURCES_ANNOTATION)
        if raw is None:
            raise JobSpecError(_MIN_RESOURCES_PATH, f"Required value: {_MIN_RESOURCES_HELP}")
        per_pod = parse_min_resources(raw, _MIN_RESOURCES_PATH)
        if not any(value > 0 for value in per_pod.values()):
            raise JobSpecError(_MIN_RESOURCES_PATH, _EMPTY_MIN_RESOURCES)
        template = synthetic_template(POD_SET, quantities.format_resource_list(per_pod))
        class_name, _ = self.priority(job)
        if class_name:
            template["spec"]["priorityClassName"] = class_name
        return [JobPodSet(name=POD_SET, count=1, template=template, per_pod=per_pod)]

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        """The class from ``spec.podPriorityClassName``, else the entrypoint template's; the claim
        is ``spec.priority`` (Argo's own ordering field, upstream's unit priority), which the queue
        caps like the priority annotation (docs/compatibility.md#argo-workflow)."""
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
        """Upstream's reading, except that a workflow the queue holds is Queuing whatever its
        phase says (module docstring)."""
        annotations = base.annotations_of(job)
        enqueued = base.has_condition(job, "Enqueued") or base.enqueued_in(annotations)
        suspended = self.is_suspended(job)
        if enqueued and suspended and not base.dequeued_in(annotations):
            return JobStatus.QUEUING
        phase = base.dig(job, "status", "phase")
        if phase == "Succeeded":
            return JobStatus.SUCCEEDED
        if phase in ("Failed", "Error"):
            return JobStatus.FAILED
        if not enqueued:
            return JobStatus.CREATED
        return JobStatus.QUEUING if suspended else JobStatus.RUNNING


def _pod_metadata_errors(old: Job, new: Job) -> list[JobSpecError]:
    """The gate's label and the unit link in ``spec.podMetadata``, once there, may be neither
    removed nor changed while the workflow is managed, finished or not (``argo retry`` runs a
    finished workflow's steps again): without the label Argo's next pods would be born ungated,
    and without the link they would name no unit and never be released.

    A value the old object lacked may be added (the reconciler's resume patch adds them, and a
    Workflow stored before the rule has none).
    """
    errors: list[JobSpecError] = []
    for part, key in _FROZEN_POD_METADATA:
        before = base.string_map(base.dig(old, *_POD_METADATA, part)).get(key)
        after = base.string_map(base.dig(new, *_POD_METADATA, part)).get(key)
        if before is None or after == before:
            continue
        detail = (
            f"Forbidden: koord-queue puts {key} into spec.podMetadata.{part} so that Argo's "
            "controller copies it onto every pod of the workflow, which keeps each pod gated until "
            "it fits the workflow's admitted koord-queue/min-resources; it cannot be removed or "
            "changed while the Workflow is managed; delete and re-create the Workflow instead"
        )
        errors.append(JobSpecError(f"spec.podMetadata.{part}[{key}]", detail))
    return errors

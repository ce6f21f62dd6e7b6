"""Adapter for ``sparkoperator.k8s.io/v1beta2`` SparkApplication
(docs/compatibility.md#sparkapplication, upstream ``sparkapp.go``).

What holds a SparkApplication, and its pods, until its QueueUnit is admitted:

* The annotation ``scheduling.x-k8s.io/suspend: "true"`` (upstream's contract with its patched
  operator). It is only advisory: the stock Spark operator ignores it and runs spark-submit at once,
  so the driver pod (and, through the driver, the executor pods) would be created right away.
* The pods themselves, which is what actually holds them whatever the operator does. A
  SparkApplication has no PodTemplateSpec the webhook could gate: the operator builds the driver
  pod from ``spec.driver`` and the driver builds the executors from ``spec.executor``. So the
  webhook puts the label ``koord-queue/gated-pod: "true"`` into ``spec.driver.labels`` and
  ``spec.executor.labels`` (the operator turns them into ``spark.kubernetes.{driver,executor}.label.*``
  and Spark copies them onto every pod it creates), and the pod webhook (``shared.admission.podgate``,
  ``failurePolicy: Fail`` for pods carrying that label) adds the scheduling gate
  ``koord-queue/admission`` to each such pod when it is created, whatever the label's value. A gated
  pod stays Pending and is never scheduled. The reconciler removes the gate from at most the
  admitted number of pods per pod set: it links a pod to the unit by the related-QueueUnit
  annotation and to its pod set by the related-podset annotation (both put into
  ``spec.driver.annotations`` and ``spec.executor.annotations`` here, which Spark copies onto the
  pods likewise) or else by the ``spark-role`` label, and counts only the application's own pods
  (the driver is owned by the application, each executor by the driver).

The label may not be removed or changed while the application is managed, even once it has
finished (:meth:`SparkApplicationAdapter.admission_errors`): the operator re-runs a
SparkApplication whose spec changes, a finished one included, and without the label the new pods
would not be gated.

Pod sets: ``driver`` (count 1, cluster mode only, the default mode) and ``executor`` (count
``executor.instances``, else ``dynamicAllocation.initialExecutors`` when dynamic allocation is on,
else 1). Executors beyond the admitted count (dynamic allocation scaling up) stay gated. Per-pod
requests follow upstream: cpu from ``coreRequest``, else ``cores``, else ``coreLimit``; memory is
``memory + memoryOverhead`` after turning JVM sizes into quantities (``512m`` -> ``512Mi``, ``2g`` ->
``2Gi``; a bare number means MiB, as Spark reads it); a ``gpu`` block adds ``{name: quantity}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from koord_queue.shared.api import names, quantities
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, JobPodSet, JobSpecError, JobStatus, JsonPatchOp
from koord_queue.shared.jobs.common import AdapterBase, synthetic_template
from koord_queue.shared.jobs.patches import deep_merge

_JVM_SIZE: Final = re.compile(r"([0-9]+)([kmgtp]?)b?", re.IGNORECASE)
_JVM_UNITS: Final = {"": "Mi", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti", "p": "Pi"}
_RUNNING: Final = frozenset(
    {"SUBMITTED", "RUNNING", "SUCCEEDING", "FAILING", "PENDING_RERUN", "INVALIDATING", "UNKNOWN", "RESUMING"}
)
_FAILED: Final = frozenset({"FAILED", "SUBMISSION_FAILED"})
_ROLES: Final = ("driver", "executor")


def jvm_memory(value: object, path: str) -> int:
    """A JVM memory size (``512m``, ``2g``, ``1024``) in milli-units of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise JobSpecError(path, "Invalid value: must be a JVM memory size such as 512m or 2g")
    match = _JVM_SIZE.fullmatch(value.strip())
    if match is None:
        raise JobSpecError(path, f"Invalid value: {value!r}: must be a JVM memory size such as 512m or 2g")
    return quantities.parse_milli(match[1] + _JVM_UNITS[match[2].lower()])


def _quantity(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise JobSpecError(path, "Invalid value: must be a quantity such as 500m or 2")
    try:
        return quantities.parse_milli(value)
    except quantities.QuantityError as err:
        raise JobSpecError(path, f"Invalid value: {err}") from None


def role_requests(role: Mapping[str, Any], path: str) -> dict[str, int]:
    """Requests of one driver or executor pod."""
    per_pod: dict[str, int] = {}
    for key in ("coreRequest", "cores", "coreLimit"):
        if role.get(key) is not None:
            per_pod["cpu"] = _quantity(role[key], f"{path}.{key}")
            break
    memory = 0
    for key in ("memory", "memoryOverhead"):
        if role.get(key) is not None:
            memory += jvm_memory(role[key], f"{path}.{key}")
    if memory:
        per_pod["memory"] = memory
    gpu = base.optional_mapping(role.get("gpu"), f"{path}.gpu")
    if gpu:
        gpu_name = base.text(gpu.get("name"))
        if not gpu_name:
            raise JobSpecError(f"{path}.gpu.name", "Required value")
        per_pod[gpu_name] = base.optional_int(gpu.get("quantity"), f"{path}.gpu.quantity", default=1) * 1000
    return dict(sorted(per_pod.items()))


class SparkApplicationAdapter(AdapterBase):
    extension = "sparkapp"
    api_version = "sparkoperator.k8s.io/v1beta2"
    kind = "SparkApplication"
    plural = "sparkapplications"
    queue_unit_suffix = "spark-qu"

    def is_suspended(self, job: Job) -> bool:
        return base.annotations_of(job).get(names.SUSPEND_ANNOTATION) == "true"

    def suspend_state(self, job: Job) -> dict[str, bool]:
        return {f"metadata.annotations[{names.SUSPEND_ANNOTATION}]": self.is_suspended(job)}

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        """Hold the application and label both roles so their pods are gated (module docstring).

        A missing ``spec.driver`` or ``spec.executor`` is created: the operator runs a driver
        with default settings without one, and that pod must carry the label too.
        """
        builder = self.begin_suspend(job, now_text=now_text)
        builder.set(("metadata", "annotations", names.SUSPEND_ANNOTATION), "true")
        ref = self.queue_unit_ref(job)
        for role in _ROLES:
            builder.set(("spec", role, "labels", names.GATED_POD_LABEL), "true")
            if ref is not None:
                builder.set(("spec", role, "annotations", names.RELATED_QUEUEUNIT_ANNOTATION), ref)
            builder.set(("spec", role, "annotations", names.RELATED_PODSET_ANNOTATION), role)
        return builder.ops

    def admission_errors(self, old: Job | None, new: Job) -> list[JobSpecError]:
        """The pod-gating label must be on both roles, and stay there while the job is managed.

        ``old`` is None on CREATE and when the application joins the queue by gaining a quota
        label. On CREATE the mutating webhook has just added the label, so a missing one means
        something removed it after us. On UPDATE a label the old object carried may be neither
        removed nor changed, finished or not: a spec change makes the operator run the application
        again. A SparkApplication stored before the label existed is not required to gain it.
        """
        errors: list[JobSpecError] = []
        for role in _ROLES:
            path = f"spec.{role}.labels[{names.GATED_POD_LABEL}]"
            after = _role_labels(new, role).get(names.GATED_POD_LABEL)
            if old is None:
                if after is None:
                    detail = (
                        f"Required value: koord-queue holds the {role} pods of a queued "
                        f'SparkApplication by the label {names.GATED_POD_LABEL}: "true", which its '
                        "mutating webhook adds when a SparkApplication is created with a quota label; "
                        "set it yourself when adding a quota label to an existing SparkApplication"
                    )
                    errors.append(JobSpecError(path, detail))
                continue
            before = _role_labels(old, role).get(names.GATED_POD_LABEL)
            if before is not None and after != before:
                detail = (
                    f"Forbidden: the label {names.GATED_POD_LABEL} makes koord-queue hold the {role} "
                    "pods until the QueueUnit admits them; it cannot be removed or changed while "
                    "the SparkApplication is managed (the Spark operator re-runs an application "
                    "whose spec changes); delete and re-create the SparkApplication instead"
                )
                errors.append(JobSpecError(path, detail))
        return errors

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        body = {"metadata": {"annotations": {names.SUSPEND_ANNOTATION: "false"}}}
        roles = [role for role in _ROLES if isinstance(base.dig(job, "spec", role), Mapping)]
        link = self.relink_merge(job, [(("spec", role, "annotations"), role) for role in roles])
        return deep_merge(deep_merge(link, self.dequeue_merge(now_text)), body)

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        body = {"metadata": {"annotations": {names.SUSPEND_ANNOTATION: "true"}}}
        return deep_merge(self.dequeue_merge(None), body)

    def _executor_count(self, spec: Mapping[str, Any]) -> int:
        executor = base.optional_mapping(spec.get("executor"), "spec.executor")
        if executor.get("instances") is not None:
            return base.optional_int(executor["instances"], "spec.executor.instances", default=1)
        dynamic = base.optional_mapping(spec.get("dynamicAllocation"), "spec.dynamicAllocation")
        if dynamic.get("enabled") is True:
            path = "spec.dynamicAllocation.initialExecutors"
            return base.optional_int(dynamic.get("initialExecutors"), path, default=1)
        return 1

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        spec = base.require_mapping(base.dig(job, "spec"), "spec")
        roles = []
        if spec.get("mode", "cluster") != "client":
            roles.append(("driver", 1))
        roles.append(("executor", self._executor_count(spec)))
        result = []
        for role, count in roles:
            per_pod = role_requests(base.optional_mapping(spec.get(role), f"spec.{role}"), f"spec.{role}")
            requests = quantities.format_resource_list(per_pod)
            template = synthetic_template(role, requests, labels={"spark-role": role})
            result.append(JobPodSet(name=role, count=count, template=template, per_pod=per_pod))
        return result

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        class_name = base.text(base.dig(job, "spec", "batchSchedulerOptions", "priorityClassName"))
        return (class_name or base.text(base.dig(job, "spec", "driver", "priorityClassName")) or None), None

    def pod_set_from_labels(self, pod: Job) -> str | None:
        role = base.labels_of(pod).get("spark-role")
        return role if role in _ROLES else None

    def job_status(self, job: Job) -> JobStatus:
        state = base.text(base.dig(job, "status", "applicationState", "state"))
        if state == "COMPLETED":
            return JobStatus.SUCCEEDED
        if state in _FAILED:
            return JobStatus.FAILED
        if state in _RUNNING:
            return JobStatus.RUNNING
        if base.is_dequeued(job):
            return JobStatus.PENDING
        if base.is_enqueued(job):
            return JobStatus.QUEUING
        return JobStatus.CREATED


def _role_labels(job: Job, role: str) -> dict[str, str]:
    """``spec.<role>.labels`` (string entries only; ``{}`` when missing or malformed)."""
    return base.string_map(base.dig(job, "spec", role, "labels"))

"""The rules a namespace user's UPDATE of a queued job must pass, beyond its annotations: the
queue's hold, the admitted size, owners and labels that would take it out of the queue, a status
its controller alone writes, and a queued RayJob's RayCluster (docs/architecture.md#trust-boundaries).

Each guard compares the old object with the new one and returns field errors naming what may not
change and why; ``shared.admission.decisions`` decides which guards a write meets. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from koord_queue.shared.admission import validation
from koord_queue.shared.admission.validation import FieldError
from koord_queue.shared.api import names
from koord_queue.shared.jobs import base, ray
from koord_queue.shared.jobs.base import JobAdapter, JobSpecError, JobStatus

_FINISHED: Final = (JobStatus.SUCCEEDED, JobStatus.FAILED)


def guard_status(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[FieldError]:
    """A CRD without a status subresource stores whatever status its writer sends; only the kind's
    controller (``status_writers``) and the reconciler may change it, or a user could mark a queued
    job finished and release its quota while it runs."""
    before = old.get("status") if old is not None else None
    if new.get("status") == before:
        return []
    detail = (
        f"the status of a queued {adapter.kind} is written by its controller; "
        "it cannot be set or changed by users"
    )
    return [validation.forbidden("status", detail)]


def guard_arrival(
    adapter: JobAdapter,
    new: Mapping[str, Any],
    new_annotations: Mapping[str, str],
    old_annotations: Mapping[str, str] | None,
    *,
    joining: bool,
) -> list[FieldError]:
    """A managed job enters the queue held, without an admission stamp.

    On CREATE the mutating webhook has just held it, so this only fails when something mutated the
    job after us; on UPDATE it stops a running job from being labelled into a queue it never
    waited in (the label would make it count as admitted).
    """
    errors: list[FieldError] = []
    how = "gains a quota label" if joining else "is created"
    for path, held in adapter.suspend_state(new).items():
        if not held:
            detail = (
                f"a {adapter.kind} that {how} is queued by koord-queue and must stay held until its "
                "QueueUnit is admitted"
            )
            errors.append(validation.forbidden(path, detail))
    key = names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
    if new_annotations.get(key) and new_annotations.get(key) != (old_annotations or {}).get(key):
        errors.append(
            validation.forbidden(annotation_path(key), "set only by koord-queue when it admits the job")
        )
    return errors


def annotation_path(key: str) -> str:
    return f"metadata.annotations[{key}]"


def gate_paths(adapter: JobAdapter, job: Mapping[str, Any]) -> list[str]:
    """Pod templates of ``job`` that lack the admission gate (the field path of each gate list).

    Asks the adapter's own suspend patch, which emits an operation only where something is missing,
    so every kind's templates (Ray worker groups, Kubeflow replica specs, ...) are covered.
    """
    try:
        ops = adapter.suspend_patch(job, now_text="")
    except JobSpecError:
        return []
    found: list[str] = []
    for op in ops:
        path = op["path"]
        cut = path.find("/schedulingGates")
        if cut >= 0:
            found.append(path[: cut + len("/schedulingGates")])
    return found


def guard_queue_hold(
    adapter: JobAdapter,
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    new_annotations: Mapping[str, str],
    old_annotations: Mapping[str, str],
    *,
    reconciler: str,
) -> list[FieldError]:
    """The rules that keep a user from starting a managed job past the queue.

    None of them depends on anything the job's owner can edit: whether the job is "queued" is not
    read from the enqueue annotations (the owner could delete them first), it is the fact that the
    job is managed and unfinished. While it is, only the reconciler may release a hold, touch the
    system annotations, remove a pod template's scheduling gate or change the quota label.
    """
    errors: list[FieldError] = []
    unit = f"{base.namespace_of(old)}/{adapter.queue_unit_name(old)}"
    dequeue_key = names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
    if (new_annotations.get(dequeue_key) or "") != (old_annotations.get(dequeue_key) or ""):
        detail = f"set only by {reconciler} when koord-queue admits the job"
        errors.append(validation.forbidden(annotation_path(dequeue_key), detail))
    if adapter.job_status(old) in _FINISHED:
        return errors
    after = adapter.suspend_state(new)
    for path, held in adapter.suspend_state(old).items():
        if held and not after.get(path, False):
            detail = (
                f"the job is queued by koord-queue; it is resumed automatically when its "
                f"QueueUnit {unit} is admitted; only {reconciler} may resume it"
            )
            errors.append(validation.forbidden(path, detail))
    for key in _SYSTEM_ANNOTATIONS:
        if new_annotations.get(key) != old_annotations.get(key):
            detail = "written by koord-queue to track the job in its queue; it cannot be changed"
            errors.append(validation.forbidden(annotation_path(key), detail))
    missing_before = set(gate_paths(adapter, old))
    for path in gate_paths(adapter, new):
        if path not in missing_before:
            detail = (
                f"the scheduling gate {names.ADMISSION_GATE} holds the job's pods until koord-queue "
                "admits them; it cannot be removed from a managed job's pod template"
            )
            errors.append(validation.forbidden(_pointer_to_field(path), detail))
    if base.dequeued_in(old_annotations):
        errors += guard_admitted_size(adapter, new, old)
    old_labels, new_labels = base.labels_of(old), base.labels_of(new)
    for label in (names.QUOTA_NAME_LABEL, names.QUOTA_NAME_LABEL_FALLBACK):
        if old_labels.get(label) != new_labels.get(label):
            detail = (
                f"the job is queued or admitted under quota {adapter.quota_name(old)!r}; the quota "
                "cannot change until the job finishes (delete and re-create the job to move it)"
            )
            errors.append(validation.forbidden(f"metadata.labels[{label}]", detail))
    return errors


def guard_still_managed(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any]
) -> list[FieldError]:
    """Nothing a user writes takes a queued job out of the queue (docs/architecture.md#trust-boundaries).

    A quota label change is refused by its own rule; what else can make a job stop being managed
    is an owner reference (a batch Job whose controller is a kind we queue is its parent's), so a
    user adding one to a queued job could release it on the next write, when neither version would
    count as managed any more.
    """
    if adapter.quota_name(old) != adapter.quota_name(new):
        return []  # the quota label rule reports it
    detail = (
        f"the {adapter.kind} is queued by koord-queue; a change that takes it out of the queue (here: "
        "a controller owner reference) cannot be made until it finishes"
    )
    return [validation.forbidden("metadata.ownerReferences", detail)]


#: Users acting for kube-controller-manager: the garbage collector removes the owner references of
#: dependents it orphans. Namespace users cannot act as kube-system's ServiceAccounts.
_CONTROLLER_MANAGER: Final = "system:kube-controller-manager"
_KUBE_SYSTEM_ACCOUNTS: Final = "system:serviceaccount:kube-system:"


def system_controller(user: str) -> bool:
    return user == _CONTROLLER_MANAGER or user.startswith(_KUBE_SYSTEM_ACCOUNTS)


def guard_owners(adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    """A queued job's owner references are frozen for users until it finishes.

    Whose child a job is decides whether the queue holds it (a batch Job controlled by a queued
    kind is its parent's), and a user can read any UID of their namespace, so an owner reference
    written later is a claim that could take the job out of the queue (docs/architecture.md#trust-boundaries).
    """
    if base.metadata_field(new, "ownerReferences") == base.metadata_field(old, "ownerReferences"):
        return []
    detail = (
        f"the {adapter.kind} is queued by koord-queue; its owner references decide whose job it is and "
        "cannot change until it finishes"
    )
    return [validation.forbidden("metadata.ownerReferences", detail)]


def guard_admitted_size(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any]
) -> list[FieldError]:
    """An admitted job's pods keep the size they were admitted with.

    The quota is charged per pod as admitted; a template edited to larger requests would create
    pods bigger than their admission (the operators' CRDs allow such edits at any time). Counts may
    change: the unit follows them and the scheduler admits or releases the difference.
    """
    try:
        before = {ps.name: ps for ps in adapter.pod_sets(old)}
        after = {ps.name: ps for ps in adapter.pod_sets(new)}
    except JobSpecError:
        return []  # unreadable: the other checks (or the adapter on the next reconcile) report it
    changed = sorted(
        name for name, ps in after.items() if name in before and before[name].per_pod != ps.per_pod
    )
    errors: list[FieldError] = []
    if changed:
        detail = (
            f"the job is admitted with pods of the size it was queued with; the resource requests of pod "
            f"set(s) {', '.join(changed)} cannot change until it finishes (delete and re-create the job "
            "to resize it)"
        )
        errors.append(validation.forbidden("spec", detail))
    for name in sorted(n for n in after if n in before and n not in changed):
        fields = _charged_shape_changes(before[name].template, after[name].template)
        if fields:
            detail = (
                f"the job is admitted with pods of the shape it was queued with; the {', '.join(fields)} "
                f"of pod set {name} cannot change until it finishes, as they decide what the apiserver "
                "adds to each pod (LimitRange default requests, RuntimeClass overhead) or which "
                "admission a pod counts for (delete and re-create the job to change them)"
            )
            errors.append(validation.forbidden("spec", detail))
    return errors


def guard_rayjob_cluster(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any], *, user: str
) -> list[FieldError]:
    """A RayJob's RayCluster is guarded like its admitted RayJob (docs/compatibility.md#rayjob).

    The RayJob's QueueUnit charges the pods KubeRay creates from this cluster's templates, so a
    user's edit of the cluster would bypass every rule on the RayJob: larger worker requests, a new
    container (LimitRange defaults), another runtime class, a removed scheduling gate, an owner
    reference or quota label taking it out of the queue (the label also carries the cluster's
    updates to this webhook). The webhook reads no other object, so it decides from the cluster
    itself, whether or not the RayJob is admitted yet: a cluster exists only once its RayJob was
    admitted, and KubeRay never edits its templates (it writes replicas, ``workersToDelete``,
    ``suspend`` and finalizers, which stay free; pods beyond the admission stay gated). The
    garbage collector may still drop the owner reference when it orphans the cluster.
    """
    parent = ray.parent_job(old)
    why = f"the {adapter.kind} runs the pods of RayJob {parent}, which koord-queue queued and admitted"
    errors: list[FieldError] = []
    if not system_controller(user) and base.metadata_field(new, "ownerReferences") != base.metadata_field(
        old, "ownerReferences"
    ):
        errors.append(
            validation.forbidden(
                "metadata.ownerReferences",
                f"{why}; its owner references tie it to that RayJob and cannot change",
            )
        )
    for label in (names.QUOTA_NAME_LABEL, names.QUOTA_NAME_LABEL_FALLBACK):
        if base.labels_of(old).get(label) != base.labels_of(new).get(label):
            detail = f"{why}; its quota label, copied from the RayJob, cannot change"
            errors.append(validation.forbidden(f"metadata.labels[{label}]", detail))
    missing_before = set(gate_paths(adapter, old))
    for path in gate_paths(adapter, new):
        if path not in missing_before:
            detail = (
                f"{why}; the scheduling gate {names.ADMISSION_GATE} holds its pods until koord-queue "
                "releases them and cannot be removed from its pod templates"
            )
            errors.append(validation.forbidden(_pointer_to_field(path), detail))
    for error in guard_admitted_size(adapter, new, old):
        errors.append(
            FieldError(
                error.path,
                error.message.replace(
                    "Forbidden: the job is admitted", f"Forbidden: {why}; it is admitted", 1
                ).replace("delete and re-create the job", "delete and re-create the RayJob"),
            )
        )
    return errors


def _charged_shape_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What of a pod template that decides its charge beyond its written requests changed: the
    names of its containers and init containers (a new one gets the namespace's LimitRange
    defaults), its ``runtimeClassName`` (the class's overhead) and its pod-set annotation (the
    admission its pods count for). The reconciler charges such a change as a resize where it got
    past the door (``shared.jobs.poddefaults``, docs/compatibility.md#admitted-pod-size)."""
    old_spec, new_spec = base.dig(before, "spec"), base.dig(after, "spec")
    changes: list[str] = []
    for field_name in ("containers", "initContainers"):
        if _container_names(old_spec, field_name) != _container_names(new_spec, field_name):
            changes.append(f"{field_name} (names)")
    if base.dig(before, "spec", "runtimeClassName") != base.dig(after, "spec", "runtimeClassName"):
        changes.append("runtimeClassName")
    key = names.RELATED_PODSET_ANNOTATION
    if base.dig(before, "metadata", "annotations", key) != base.dig(after, "metadata", "annotations", key):
        changes.append(f"annotation {key}")
    return changes


def _container_names(spec: object, field_name: str) -> list[object]:
    listed = spec.get(field_name) if isinstance(spec, Mapping) else None
    if not isinstance(listed, list):
        return []
    return [c.get("name") if isinstance(c, Mapping) else None for c in listed]


#: Annotations koord-queue keeps on a managed job; the dequeue stamp has its own rule above.
_SYSTEM_ANNOTATIONS: Final = (names.JOB_HAS_ENQUEUED_ANNOTATION, names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION)


def _pointer_to_field(pointer: str) -> str:
    """``/spec/template/spec/schedulingGates`` → ``spec.template.spec.schedulingGates``."""
    segments: list[str | int] = []
    for token in pointer.lstrip("/").split("/"):
        text = token.replace("~1", "/").replace("~0", "~")
        segments.append(int(text) if text.isdigit() else text)
    return base.field_path(segments)

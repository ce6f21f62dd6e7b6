"""The job adapter protocol: how the queue sees one kind of job
(docs/architecture.md#decision-7-one-adapter-per-job-kind).

Every supported job kind (batch Job, the Kubeflow kinds such as TFJob, PyTorchJob and MPIJob,
JobSet, RayJob/RayCluster, Argo Workflow, SparkApplication) is reduced to the same few answers: is it ours
(``is_managed``), how is it held and released (``suspend_patch``/``resume_patch``), what does it ask
for (``pod_sets``: pod sets x per-pod requests x counts), how important is it (``priority``), which
pod set does a pod belong to (``pod_set_of``) and where is it in its life (``job_status``). The
webhook uses the first two on the admission path; the reconciler's job extensions use all of them.

Everything here is pure: functions over the raw job JSON (``Mapping[str, Any]``) returning plain
values, no I/O, no clock (a timestamp is always a parameter). Two kinds of readers exist on purpose:

* the *lenient* readers (:func:`dig`, :func:`annotations_of`, ...) never raise; predicates such as
  ``is_managed`` or ``job_status`` use them because they run on every admission request, including
  objects the apiserver has not validated yet, and must be total;
* the *strict* readers (:func:`require_mapping`, :func:`optional_int`, ...) raise
  :class:`JobSpecError` with a field path; ``pod_sets`` uses them because a wrong-typed replica count
  must be reported to the user, not silently read as 1.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict

from koord_queue.shared.api import names, quantities

Job = Mapping[str, Any]
"""A job (or pod) as raw Kubernetes JSON."""

Segment = str | int
"""One step of a path into a JSON document: an object key or a list index."""


class JobSpecError(ValueError):
    """The job's spec cannot be read: ``path`` names the field, ``detail`` says what is wrong."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class JobStatus(enum.StrEnum):
    """Where a job is in its life, as the job extensions see it (docs/compatibility.md#job-states)."""

    CREATED = "Created"
    QUEUING = "Queuing"
    PENDING = "Pending"
    RUNNING = "Running"
    FAILED = "Failed"
    SUCCEEDED = "Succeeded"


@dataclass(frozen=True, slots=True)
class JobPodSet:
    """One group of identical pods: ``count`` pods shaped like ``template``.

    ``per_pod`` holds the milli-unit requests of one pod (see ``podspec.pod_requests``), so the
    demand of the set is ``per_pod x count``.
    """

    name: str
    count: int
    template: dict[str, Any]
    per_pod: dict[str, int]
    #: the fewest pods the set may start with (partial admission); None: all of them
    min_count: int | None = None


class JsonPatchOp(TypedDict):
    """One RFC 6902 operation. ``value`` is absent for ``remove``."""

    op: str
    path: str
    value: NotRequired[Any]


class JobAdapter(Protocol):
    """What the queue needs to know about one job kind. Implementations are stateless."""

    @property
    def extension(self) -> str:
        """Name used by ``--enabled-extensions`` (``job``, ``tfjob``, ...)."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def queue_unit_suffix(self) -> str:
        """Appended to the job name (with a dash) to name its QueueUnit; may be empty."""

    @property
    def synthetic_pods(self) -> bool:
        """The kind's pods come and go step by step (Argo Workflow), so its pod sets are reported
        running while the released job runs, as upstream's synthetic ``mocked-node`` pod makes
        them (docs/compatibility.md#argo-workflow)."""

    @property
    def pods_within_reservation(self) -> bool:
        """The kind's pods are released while the summed requests of its live released or bound
        pods fit the admission (replicas times the admitted per-pod size), not one pod per
        replica: a Workflow declares a reservation, not a pod count
        (docs/compatibility.md#argo-workflow, ``shared.jobs.podbudget``)."""

    @property
    def pods_through_jobs(self) -> bool:
        """The kind's controller creates ``batch/v1`` Jobs that own some or all of its pods (an
        MPIJob's launcher, every pod of a JobSet). Such a pod is linked to the unit through its Job
        (``shared.jobs.podlinks``), so the reconciler watches Jobs for it, and the Job itself is not
        managed (docs/compatibility.md#pod-gating)."""

    @property
    def older_versions(self) -> tuple[str, ...]:
        """Other versions of the same resource that the admission rules must also match, though no
        adapter reads them (an operator release that serves only those). The RayCluster's
        ``v1alpha1``: the webhook guards a queued RayJob's cluster in any ``ray.io`` version
        (``shared.admission.jobguards``), and a rule naming only ``v1`` would not send it a cluster
        served in ``v1alpha1`` alone."""

    @property
    def status_subresource(self) -> bool:
        """The kind's CRD serves ``status`` as a subresource. Where it does not (Argo Workflow), a
        namespace user can write the status with the object, so the webhook strips it on CREATE
        and lets only the kind's controller change it (docs/architecture.md#trust-boundaries)."""

    def admission_errors(self, old: Job | None, new: Job) -> list[JobSpecError]:
        """Kind-specific rules for a namespace user's write of a managed, unfinished job.

        ``old`` is None on CREATE. The rules every kind shares (the hold, the system annotations,
        the gate, the quota label) live in ``shared.admission.decisions``; this hook adds what only one kind
        needs (a Workflow must declare ``koord-queue/min-resources`` and may not change it while
        queued). Each error names its field path.
        """

    def queue_unit_name(self, job: Job) -> str: ...
    def is_managed(self, job: Job) -> bool: ...
    def quota_name(self, job: Job) -> str | None: ...
    def is_suspended(self, job: Job) -> bool: ...

    def suspend_state(self, job: Job) -> dict[str, bool]:
        """Every field that can hold the job, by field path, and whether it currently does.

        The validating webhook forbids a user to flip *any* of them from held to released while
        the job is queued: releasing one of two markers (Kubeflow's annotation vs.
        ``runPolicy.suspend``) is enough to start some operators.
        """

    def suspend_patch(self, job: Job, *, now_text: str) -> list[JsonPatchOp]:
        """JSON Patch for CREATE: hold the job, gate its pod templates, stamp the enqueue time."""

    def resume_patch(self, job: Job, *, now_text: str) -> dict[str, Any]:
        """Merge patch releasing the job and stamping the dequeue time."""

    def suspend_merge_patch(self, job: Job) -> dict[str, Any]:
        """Merge patch holding the job again (preemption, deactivation) and clearing the dequeue time."""

    def pod_sets(self, job: Job) -> list[JobPodSet]:
        """The job's pod sets; raises :class:`JobSpecError` when the spec cannot be read."""

    def priority(self, job: Job) -> tuple[str | None, int | None]:
        """``(priorityClassName, claimed priority)`` as written on the job; either may be missing.

        The claim is a job-level priority field of the kind's own (an Argo Workflow's
        ``spec.priority``), which the owner writes and the queue caps like the priority annotation.
        A pod template's ``priority`` is never a claim: the apiserver refuses it on pods, so only
        a PriorityClass gives a template's priority (docs/compatibility.md#priority-cap)."""

    def pod_set_of(self, pod: Job) -> str | None: ...
    def job_status(self, job: Job) -> JobStatus: ...


# --- lenient readers: never raise ---------------------------------------------------------------


def dig(obj: object, *keys: Segment) -> Any:
    """Follow ``keys`` into ``obj``; ``None`` as soon as a step is missing or has the wrong type."""
    for key in keys:
        if type(obj) is dict:  # fast path: parsed JSON objects (the ABC check below is slow)
            if not isinstance(key, str):
                return None
            obj = obj.get(key)
        elif obj is None:  # a missing field: neither a mapping nor a list
            return None
        elif isinstance(key, str):
            if not isinstance(obj, Mapping):
                return None
            obj = obj.get(key)
        else:
            if not isinstance(obj, list) or not 0 <= key < len(obj):
                return None
            obj = obj[key]
    return obj


def metadata_field(obj: object, key: str) -> Any:
    """``dig(obj, "metadata", key)``, short-cut for parsed JSON (read on every admission).

    The readers below inline the same two lines: they run several times per admission review.
    """
    metadata = obj.get("metadata") if type(obj) is dict else None
    return metadata.get(key) if type(metadata) is dict else dig(obj, "metadata", key)


def string_map(value: object) -> dict[str, str]:
    """The string-to-string entries of ``value`` (labels, annotations); ``{}`` for anything else."""
    if type(value) is not dict and (value is None or not isinstance(value, Mapping)):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def annotations_of(obj: Job) -> dict[str, str]:
    metadata = obj.get("metadata") if type(obj) is dict else None
    return string_map(
        metadata.get("annotations") if type(metadata) is dict else dig(obj, "metadata", "annotations")
    )


def labels_of(obj: Job) -> dict[str, str]:
    metadata = obj.get("metadata") if type(obj) is dict else None
    return string_map(metadata.get("labels") if type(metadata) is dict else dig(obj, "metadata", "labels"))


def text(value: object) -> str:
    """``value`` if it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def name_of(obj: Job) -> str:
    metadata = obj.get("metadata") if type(obj) is dict else None
    value = metadata.get("name") if type(metadata) is dict else dig(obj, "metadata", "name")
    return value if isinstance(value, str) else ""  # text(), inlined


def namespace_of(obj: Job) -> str:
    metadata = obj.get("metadata") if type(obj) is dict else None
    value = metadata.get("namespace") if type(metadata) is dict else dig(obj, "metadata", "namespace")
    return value if isinstance(value, str) else ""  # text(), inlined


def quota_name(obj: Job) -> str | None:
    """The quota the job is charged to: the Koordinator label, else the legacy Alibaba one."""
    metadata = obj.get("metadata") if type(obj) is dict else None
    labels = metadata.get("labels") if type(metadata) is dict else dig(obj, "metadata", "labels")
    if type(labels) is dict:  # fast path: look the two keys up instead of copying every label
        primary, fallback = labels.get(names.QUOTA_NAME_LABEL), labels.get(names.QUOTA_NAME_LABEL_FALLBACK)
        return (
            (primary if isinstance(primary, str) else None)
            or (fallback if isinstance(fallback, str) else None)
            or None
        )
    found = string_map(labels)
    return found.get(names.QUOTA_NAME_LABEL) or found.get(names.QUOTA_NAME_LABEL_FALLBACK) or None


def has_condition(obj: Job, kind: str, *, status: str = "True") -> bool:
    """True when ``status.conditions`` holds a condition of type ``kind`` with ``status``."""
    conditions = dig(obj, "status", "conditions")
    if not isinstance(conditions, list):
        return False
    return any(dig(c, "type") == kind and dig(c, "status") == status for c in conditions)


def owner_kinds(obj: Job, *, controller_only: bool = False) -> list[tuple[str, str, str]]:
    """``(apiVersion, kind, name)`` of every well-formed owner reference."""
    metadata = obj.get("metadata") if type(obj) is dict else None
    refs = (
        metadata.get("ownerReferences") if type(metadata) is dict else dig(obj, "metadata", "ownerReferences")
    )
    found: list[tuple[str, str, str]] = []
    for ref in refs if isinstance(refs, list) else []:
        if controller_only and dig(ref, "controller") is not True:
            continue
        api_version, kind, owner = (
            text(dig(ref, "apiVersion")),
            text(dig(ref, "kind")),
            text(dig(ref, "name")),
        )
        if kind and owner:
            found.append((api_version, kind, owner))
    return found


def owner_uids(obj: Job) -> list[tuple[str, str, str]]:
    """``(kind, name, uid)`` of every owner reference that has all three: who owns ``obj``, by the
    UID the apiserver assigned (a name alone can be claimed by anyone)."""
    refs = dig(obj, "metadata", "ownerReferences")
    found: list[tuple[str, str, str]] = []
    for ref in refs if isinstance(refs, list) else []:
        kind, name, uid = text(dig(ref, "kind")), text(dig(ref, "name")), text(dig(ref, "uid"))
        if kind and name and uid:
            found.append((kind, name, uid))
    return found


def is_enqueued(obj: Job) -> bool:
    """The webhook (or an upstream extension) has put the job in the queue."""
    return enqueued_in(annotations_of(obj))


def enqueued_in(annotations: Mapping[str, str]) -> bool:
    """:func:`is_enqueued` on already read annotations (``annotations_of``)."""
    return bool(
        annotations.get(names.JOB_HAS_ENQUEUED_ANNOTATION)
        or annotations.get(names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION)
    )


def is_dequeued(obj: Job) -> bool:
    """The reconciler has admitted and resumed the job (an empty value counts as absent)."""
    return dequeued_in(annotations_of(obj))


def dequeued_in(annotations: Mapping[str, str]) -> bool:
    """:func:`is_dequeued` on already read annotations (``annotations_of``)."""
    return bool(annotations.get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION))


class PriorityClassTable(dict[str, int]):
    """The cluster's PriorityClasses, name → value, as the reconciler keeps them from its watch, with
    the names of those whose ``preemptionPolicy`` is ``Never`` (``never``): a job taking its priority
    from one does not preempt (docs/compatibility.md#non-preempting-jobs). A plain mapping of values
    stands for a cluster whose classes all preempt."""

    def __init__(self, values: Mapping[str, int] | None = None, never: Iterable[str] = ()) -> None:
        super().__init__(values or {})
        self.never: set[str] = set(never)


def never_preempting_classes(priority_classes: Mapping[str, int]) -> frozenset[str]:
    """The classes of ``priority_classes`` whose ``preemptionPolicy`` is ``Never``."""
    return (
        frozenset(priority_classes.never) if isinstance(priority_classes, PriorityClassTable) else frozenset()
    )


def template_priority(template: object) -> tuple[str | None, int | None]:
    """``(priorityClassName, None)`` from a pod template's spec: its raw ``priority`` is ignored.

    The apiserver refuses a pod whose ``priority`` differs from its class's value, so a raw value
    in a template is either that value already or a claim no pod will ever run with; taking it
    would let a namespace user queue above every PriorityClass (docs/compatibility.md#priority-cap).
    """
    return text(dig(template, "spec", "priorityClassName")) or None, None


# --- strict readers: raise JobSpecError with a field path --------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def field_path(segments: Sequence[Segment]) -> str:
    """Kubernetes-style field path: ``spec.template.spec.containers[0]``, ``metadata.labels[a/b]``."""
    out = ""
    for seg in segments:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif _IDENTIFIER.fullmatch(seg):
            out += f".{seg}" if out else seg
        else:
            out += f"[{seg}]"
    return out


def require_mapping(value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        raise JobSpecError(path, "Required value")
    if type(value) is not dict and not isinstance(value, Mapping):
        raise JobSpecError(path, f"Invalid value: must be an object, not {_type_name(value)}")
    return value


def optional_mapping(value: object, path: str) -> Mapping[str, Any]:
    """``value`` as an object; ``{}`` when missing or null."""
    return {} if value is None else require_mapping(value, path)


def optional_list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise JobSpecError(path, f"Invalid value: must be a list, not {_type_name(value)}")
    return value


def optional_int(value: object, path: str, *, default: int, minimum: int = 0) -> int:
    """An integer field (JSON numbers only; ``2.0`` is accepted as the apiserver does)."""
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(path, f"Invalid value: must be an integer, not {_type_name(value)}")
    if value < minimum:
        raise JobSpecError(path, f"Invalid value: {value}: must be greater than or equal to {minimum}")
    return value


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def check_unique_names(pod_sets: Iterable[JobPodSet], path: str) -> list[JobPodSet]:
    """Pod set names key the QueueUnit's ``podSet`` list, so two sets may not share one."""
    result = list(pod_sets)
    seen: set[str] = set()
    for pod_set in result:
        if pod_set.name in seen:
            raise JobSpecError(path, f'Duplicate value: pod set "{pod_set.name}"')
        seen.add(pod_set.name)
    return result


def total_request(adapter: JobAdapter, job: Job) -> dict[str, int]:
    """Σ per_pod x count over the job's pod sets (the QueueUnit's ``spec.resource``)."""
    total: dict[str, int] = {}
    for pod_set in adapter.pod_sets(job):
        total = quantities.add(total, quantities.scale(pod_set.per_pod, pod_set.count))
    return total

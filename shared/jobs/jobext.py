"""Pure decisions of the job extensions about a job's QueueUnit: what unit a job should have.

The reconciler's job-extension half
(docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own) answers its questions from
plain values so they can be table-tested; this module answers the first one:

* :func:`build_queue_unit` / :func:`spec_drift`: what QueueUnit a job should have
  (docs/compatibility.md#queueunit-construction), including a RayJob's pod sets raised to its live
  RayCluster (docs/compatibility.md#rayjob) and the unit re-created for a released job
  (docs/compatibility.md#adoption-of-released-jobs, see ``shared.jobs.adoption``), except where an
  admitted pod set changed size (:func:`admitted_resize`, docs/compatibility.md#admitted-pod-size);
* :func:`slim_batch_job`: what the Job informer keeps, the same scheduling view the unit is built from.

The others live apart: the unit's pods (release, reclaim, usage report) in ``shared.jobs.podplan``,
deactivation and the execution budget in ``shared.jobs.lifecycle``. Every function returns ``None``
when nothing needs writing, so the I/O side writes only on change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api import podtemplates as podspec
from koord_queue.shared.api.goparse import parse_go_bool, parse_lenient_int
from koord_queue.shared.jobs import adoption, poddefaults, podplan, ray
from koord_queue.shared.jobs.base import (
    Job,
    JobAdapter,
    JobPodSet,
    JobSpecError,
    annotations_of,
    dig,
    labels_of,
    never_preempting_classes,
    text,
)
from koord_queue.shared.jobs.podspec import template_requests

Obj = dict[str, Any]

#: Annotations never copied from a job to its QueueUnit: large, and meaningless on the unit; the
#: adoption marker is ours to set (copied from a job it would hide a new unit from the scheduler).
_SKIPPED_ANNOTATIONS = frozenset(
    {"kubectl.kubernetes.io/last-applied-configuration", adoption.ADOPTED_ANNOTATION}
)


def resolve_priority(
    job: Job,
    adapter: JobAdapter,
    priority_classes: Mapping[str, int],
    *,
    max_user_priority: int | None = None,
    allowed_classes: frozenset[str] | None = None,
    default_class: str | None = None,
) -> tuple[str | None, int | None]:
    """``(className, value)`` of the job's unit (docs/compatibility.md#priority-cap).

    Only admins' objects give a priority as it stands: a PriorityClass's value, when the class
    exists and its quota allows it (``allowed_classes``, None: every class). A class the quota
    does not allow counts as none, and the unit drops its name. What the job's owner writes is a
    claim clamped to ``max_user_priority`` (the smaller of the cluster's ``maxUserPriority`` and the
    quota's ``koord-queue/max-user-priority``, chosen by the caller): the kind's own priority field
    (an Argo Workflow's ``spec.priority``) when no class gives a value, and the priority annotation,
    which wins over both. A pod template's raw ``priority`` is never read (``base.template_priority``).

    A job that names no class and claims nothing takes ``default_class``, the cluster's
    ``globalDefault`` PriorityClass, as its pods will.
    """
    class_name, claim = adapter.priority(job)
    if not class_name and claim is None:
        class_name = default_class
    if class_name and refused_class(class_name, allowed_classes):
        class_name = None
    value = priority_classes.get(class_name) if class_name else None
    if value is None and claim is not None:
        value = _clamp(claim, max_user_priority)
    override = parse_lenient_int(annotations_of(job).get(names.PRIORITY_ANNOTATION), bits=32)
    if override is not None:
        value = _clamp(override, max_user_priority)
    return class_name, value


def refused_class(class_name: str, allowed_classes: frozenset[str] | None) -> bool:
    """The quota allows only some PriorityClasses, and not this one."""
    return allowed_classes is not None and class_name not in allowed_classes


def refused_priority_class(
    job: Job, adapter: JobAdapter, allowed_classes: frozenset[str] | None
) -> str | None:
    """The PriorityClass the job names that its quota does not allow, None when there is none."""
    class_name, _ = adapter.priority(job)
    return class_name if class_name and refused_class(class_name, allowed_classes) else None


def refused_class_message(class_name: str, quota: str, allowed: frozenset[str]) -> str:
    """The Warning on a job whose PriorityClass its quota does not allow: what, why, what next."""
    listed = ", ".join(sorted(allowed)) or "none"
    return (
        f"PriorityClass {class_name!r} is not allowed for quota {quota!r} (allowed: {listed}), so "
        "this job is queued as if it named no class; use an allowed class, or ask a cluster admin "
        "to add it to the quota's koord-queue/allowed-priority-classes"
    )


def _clamp(value: int, cap: int | None) -> int:
    return value if cap is None else min(value, cap)


def preemption_spec(
    job: Job,
    class_name: str | None,
    value: int | None,
    *,
    max_user_priority: int | None = None,
    never_classes: frozenset[str] = frozenset(),
) -> Obj:
    """``spec.preemptionPriority`` and ``spec.preemptionPolicy`` of the job's unit, each only when it
    says something (docs/compatibility.md#preemption-priority,
    docs/compatibility.md#non-preempting-jobs).

    The preemption priority is the owner's claim (``koord-queue/preemption-priority``): clamped to
    ``max_user_priority`` as the priority annotation is, then raised to the unit's priority
    ``value`` (absent: 0), so the unit is never preempted below the priority it preempts at. The
    policy is ``Never`` when the job's PriorityClass ``class_name`` (the one its priority is taken
    from) is in ``never_classes``, or when its annotation says so; the annotation cannot lift a
    class's ``Never``."""
    annotations = annotations_of(job)
    out: Obj = {}
    claim = parse_lenient_int(annotations.get(names.PREEMPTION_PRIORITY_ANNOTATION), bits=32)
    if claim is not None:
        out["preemptionPriority"] = max(_clamp(claim, max_user_priority), value or 0)
    asked = annotations.get(names.PREEMPTION_POLICY_ANNOTATION)
    if asked == names.PREEMPTION_POLICY_NEVER or (class_name and class_name in never_classes):
        out["preemptionPolicy"] = names.PREEMPTION_POLICY_NEVER
    return out


def raised_preemption_priority(job: Job, spec: Mapping[str, Any], cap: int | None) -> str | None:
    """The Warning on a job whose preemption priority (capped) was below its unit's priority and was
    raised to it (:func:`preemption_spec`); None when it was not."""
    claim = parse_lenient_int(annotations_of(job).get(names.PREEMPTION_PRIORITY_ANNOTATION), bits=32)
    priority = spec.get("priority")
    if claim is None or not isinstance(priority, int) or _clamp(claim, cap) >= priority:
        return None
    return (
        f"{names.PREEMPTION_PRIORITY_ANNOTATION} {_clamp(claim, cap)} is below the job's priority "
        f"{priority}, so its QueueUnit is preempted at {priority}: a job is never preempted below "
        "the priority it preempts at"
    )


def desired_spec(
    job: Job,
    adapter: JobAdapter,
    priority_classes: Mapping[str, int],
    *,
    live_cluster: Job | None = None,
    max_user_priority: int | None = None,
    allowed_classes: frozenset[str] | None = None,
    default_class: str | None = None,
    defaults: poddefaults.PodDefaults | None = None,
    admitted: Obj | None = None,
    never_classes: frozenset[str] | None = None,
) -> Obj:
    """The QueueUnit ``spec`` the job implies. Raises ``JobSpecError`` for an unreadable job.

    ``max_user_priority`` caps the owner's priority claims and ``allowed_classes`` are the
    PriorityClasses the job's quota allows; ``default_class`` is the cluster's ``globalDefault``
    PriorityClass (:func:`resolve_priority`); ``never_classes`` the classes whose
    ``preemptionPolicy`` is ``Never`` (None: as ``priority_classes`` says, :func:`preemption_spec`).

    ``defaults`` are what the apiserver fills into the namespace's pods (LimitRange requests,
    RuntimeClass overhead, ``shared.jobs.poddefaults``); each pod set's template and per-pod
    requests include them. ``admitted`` is the unit when it holds an admission: then a pod set
    keeps what its template on the unit already carries, not the current defaults.

    ``live_cluster`` is a RayJob's running RayCluster (``ray.live_cluster``): KubeRay's autoscaler
    scales it, not the RayJob, so its replicas raise the pod set counts
    (docs/compatibility.md#s27-rayjob-follows-its-live-raycluster).
    """
    pod_sets = adapter.pod_sets(job)
    if live_cluster is not None:
        pod_sets = ray.follow_cluster(pod_sets, live_cluster)
    templates = [podspec.scheduling_template(ps.template) for ps in pod_sets]
    if defaults or admitted is not None:
        pod_sets, templates = _with_defaults(
            pod_sets, templates, defaults or poddefaults.PodDefaults(), admitted
        )
    total: dict[str, int] = {}
    for ps in pod_sets:
        total = quantities.add(total, quantities.scale(ps.per_pod, ps.count))
    class_name, value = resolve_priority(
        job,
        adapter,
        priority_classes,
        max_user_priority=max_user_priority,
        allowed_classes=allowed_classes,
        default_class=default_class,
    )
    resource = quantities.format_resource_list(total)
    spec: Obj = {
        "consumerRef": {
            "apiVersion": adapter.api_version,
            "kind": adapter.kind,
            "name": text(dig(job, "metadata", "name")),
            "namespace": text(dig(job, "metadata", "namespace")),
        },
        "resource": resource,
        "request": dict(resource),
        "podSet": [
            {"name": ps.name, "count": ps.count, "template": template}
            | ({"minCount": ps.min_count} if ps.min_count is not None else {})
            for ps, template in zip(pod_sets, templates, strict=True)
        ],
    }
    quota = adapter.quota_name(job)
    if quota:
        # Upstream fills spec.queue at admission; knowing it at creation saves a write per job.
        spec["queue"] = quota
    if class_name:
        spec["priorityClassName"] = class_name
    if value is not None:
        spec["priority"] = value
    if never_classes is None:
        never_classes = never_preempting_classes(priority_classes)
    spec |= preemption_spec(
        job, class_name, value, max_user_priority=max_user_priority, never_classes=never_classes
    )
    annotations = annotations_of(job)
    active = parse_go_bool(annotations.get(names.ACTIVE_ANNOTATION))
    if active is not None:
        spec["active"] = active
    budget = parse_lenient_int(annotations.get(names.MAX_EXEC_TIME_ANNOTATION), bits=32)
    if budget is not None and budget > 0:
        spec["maximumExecutionTimeSeconds"] = budget
    return spec


def build_queue_unit(
    job: Job,
    adapter: JobAdapter,
    priority_classes: Mapping[str, int],
    *,
    live_cluster: Job | None = None,
    adopted: bool = False,
    max_user_priority: int | None = None,
    allowed_classes: frozenset[str] | None = None,
    default_class: str | None = None,
    defaults: poddefaults.PodDefaults | None = None,
) -> Obj:
    """The QueueUnit to create for a job: owned by it (garbage-collected with it), labels and
    annotations copied, spec from :func:`desired_spec` (with the namespace's ``defaults``). The
    status is written by the scheduler, or, for a unit ``adopted`` by a released job, by the job
    extension (``shared.jobs.adoption``)."""
    meta = job.get("metadata") or {}
    annotations = {k: v for k, v in annotations_of(job).items() if k not in _SKIPPED_ANNOTATIONS}
    if adopted:
        annotations[adoption.ADOPTED_ANNOTATION] = "true"
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": adapter.queue_unit_name(job),
            "namespace": text(meta.get("namespace")),
            "labels": labels_of(job),
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": adapter.api_version,
                    "kind": adapter.kind,
                    "name": text(meta.get("name")),
                    "uid": text(meta.get("uid")),
                }
            ],
        },
        "spec": desired_spec(
            job,
            adapter,
            priority_classes,
            live_cluster=live_cluster,
            max_user_priority=max_user_priority,
            allowed_classes=allowed_classes,
            default_class=default_class,
            defaults=defaults,
        ),
    }


def _with_defaults(
    pod_sets: list[JobPodSet],
    templates: list[dict[str, object]],
    defaults: poddefaults.PodDefaults,
    admitted: Obj | None,
) -> tuple[list[JobPodSet], list[dict[str, object]]]:
    """Each template with the apiserver's fill-ins, and its pod set's per-pod requests read again
    where something was filled in (``shared.jobs.poddefaults.apply``)."""
    frozen: dict[str, Any] = {}
    if admitted is not None:
        for entry in _pod_sets_of(admitted):
            if isinstance(entry.get("name"), str):
                frozen[entry["name"]] = entry.get("template") or {}
    out_sets: list[JobPodSet] = []
    out_templates: list[dict[str, object]] = []
    for ps, template in zip(pod_sets, templates, strict=True):
        sticky = frozen.get(ps.name, {}) if admitted is not None else None
        filled = poddefaults.apply(template, defaults, frozen=sticky)
        if filled is not template:
            ps = dataclasses.replace(ps, per_pod=template_requests(filled, f"podSet[{ps.name}].template"))
        out_sets.append(ps)
        out_templates.append(dict(filled))
    return out_sets, out_templates


def _pod_sets_of(unit: Obj) -> list[Mapping[str, Any]]:
    """The unit's ``spec.podSet`` entries that are objects (none when unreadable)."""
    spec = unit.get("spec")
    listed = spec.get("podSet") if isinstance(spec, Mapping) else None
    return [p for p in listed if isinstance(p, Mapping)] if isinstance(listed, list) else []


def holds_admission(unit: Obj) -> bool:
    """Whether the unit holds quota for its job: an admission with replicas, or a ``dequeued``
    phase without admissions (the pre-admissions API); never once finished."""
    phase = podplan.phase_of(unit)
    if phase in (names.Phase.SUCCEED, names.Phase.FAILED):
        return False
    admissions = podplan.admissions_of(unit)
    if not admissions:
        return phase in podplan.ADMITTED_PHASES
    return any(a.replicas > 0 for a in admissions)


def _pod_set_shape(pod_set: object) -> tuple[object, object, dict[str, int] | None]:
    """``(name, count, per-pod requests)`` of a unit's pod set; requests None when unreadable."""
    try:
        per_pod = template_requests(dig(pod_set, "template"), "template")
    except JobSpecError:
        per_pod = None
    return dig(pod_set, "name"), dig(pod_set, "count"), per_pod


#: The unit's preemption fields, kept in step with the job (docs/compatibility.md#preemption-priority).
_PREEMPTION_KEYS = ("preemptionPriority", "preemptionPolicy")


def spec_drift(unit: Obj, desired: Obj) -> Obj | None:
    """A merge patch bringing the unit's pod sets, priority and activation in line with the job, or
    None. Pod sets differ when a name, a count or a pod's requests differ: a queued job whose
    template grows must be charged its new size when admitted, not the size it was queued with.
    ``spec.resource`` follows pod set changes except while Running (docs/compatibility.md#pod-set-drift);
    the whole ``podSet`` list is replaced because merge patches replace lists."""
    spec = unit.get("spec")
    current: Mapping[str, Any] = spec if isinstance(spec, Mapping) else {}
    patch: Obj = {}
    listed = current.get("podSet")
    old_shape = [_pod_set_shape(p) for p in listed] if isinstance(listed, list) else []
    new_shape = [_pod_set_shape(p) for p in desired["podSet"]]
    if old_shape != new_shape:
        patch["podSet"] = desired["podSet"]
        if podplan.phase_of(unit) != names.Phase.RUNNING:
            patch["resource"] = desired["resource"]
    keys = ("priority", "priorityClassName", "active", "maximumExecutionTimeSeconds", *_PREEMPTION_KEYS)
    for key in keys:
        if current.get(key) != desired.get(key):
            if key == "active" and key not in desired:
                continue  # an absent annotation leaves a hand-set spec.active alone
            patch[key] = desired.get(key)
    return {"spec": patch} if patch else None


def admitted_resize(unit: Obj, desired: Obj) -> tuple[str, ...]:
    """The pod sets the unit holds an admission for whose per-pod requests the job has changed
    since, sorted; empty when none (docs/compatibility.md#admitted-pod-size).

    The quota is charged per pod as admitted and the pods already made keep their size, so such a
    change is not followed like other drift: the reconciler queues the job again at its new size.
    The webhook refuses the edit from users (``_guard_admitted_size``); this is the same rule
    where the door was bypassed. Both sides are read with the same code from the same template
    view (:func:`_pod_set_shape`), so a change in how requests are computed changes neither. A
    unit with a ``dequeued`` phase and no admissions (the pre-admissions API) holds every pod set.
    """
    if not holds_admission(unit):
        return ()
    admissions = podplan.admissions_of(unit)
    held = {a.name for a in admissions if a.replicas > 0}
    current: dict[str, dict[str, int] | None] = {}
    for name, _, per_pod in map(_pod_set_shape, _pod_sets_of(unit)):
        if isinstance(name, str):
            current[name] = per_pod
    if not admissions:
        held = set(current)
    changed = set()
    for name, _, per_pod in map(_pod_set_shape, desired.get("podSet") or []):
        before = current.get(name) if isinstance(name, str) else None
        if name in held and before is not None and per_pod is not None and per_pod != before:
            changed.add(str(name))
    return tuple(sorted(changed))


# --- what the Job informer keeps ----------------------------------------------------------------


def slim_batch_job(job: Obj) -> Obj:
    """A ``batch/v1`` Job whose pod template keeps only its scheduling view
    (:func:`shared.api.podtemplates.scheduling_template`, the same the QueueUnit gets): the only template
    fields the Job adapter reads are requests and priority. Template annotations stay (the
    webhook's pod-set annotation is read back from them)."""
    spec = job.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(template, dict):
        return job
    slim = podspec.scheduling_template(template, metadata=("labels", "annotations"))
    return {**job, "spec": {**spec, "template": slim}}

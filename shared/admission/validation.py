"""Pure validation of our annotations and objects, reporting *every* error with its field path.

The validating webhook turns these lists into one denial message, in the shape Kubernetes users
know from ``field.ErrorList`` (``spec.queuePolicy: Unsupported value: "FIFO": supported values:
"Priority", "Block", "Intelligent"``), so a user fixes everything in one round. Checked here:

* job annotations read by the job extensions (docs/compatibility.md#queueunit-construction,
  docs/compatibility.md#activation-and-execution-budget): priority, active, max-exec-time-seconds,
  min-resources, and the preemption priority and policy, which are immutable
  (docs/compatibility.md#preemption-priority);
* Queue: policy and the ``koord-queue/*`` tuning annotations (docs/compatibility.md#queue-annotations);
* QueueUnit: pod sets and quantities (docs/compatibility.md#queueunit-spec);
* ElasticQuota: quantities, ``min <= max``, a parent that is not itself, the namespaces it is
  bound to (a JSON array), its cap on users' priorities; and, because an
  ElasticQuota's ``koord-queue/*`` annotations and policy label are copied onto the Queue created
  for it (docs/compatibility.md#queues-from-elasticquotas), the same Queue checks on those.

Scalars are parsed the way upstream's Go code parses them (``strconv.ParseBool``,
``strconv.ParseInt``, ``time.ParseDuration``), so we neither reject what upstream accepted nor accept
what it would silently ignore. Everything here is pure and total: any JSON value yields a list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.shared.api import durations, names, parsing, quantities
from koord_queue.shared.api.goparse import INT32_MAX, INT32_MIN, parse_go_bool, parse_go_int
from koord_queue.shared.jobs import base, podspec
from koord_queue.shared.jobs.base import JobSpecError

MAX_POD_SETS: Final = 8
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_POLICIES: Final = tuple(policy.value for policy in names.QueuePolicy)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem: ``path`` is the field, ``message`` what is wrong (``Invalid value: ...``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _show(value: object) -> str:
    """A value as Kubernetes prints it in errors (Go ``%#v``-like), cut short when long.

    Containers are summarised, never dumped: they can be huge or nested deeper than the
    recursion limit, and the field path already says where they are.
    """
    if isinstance(value, Mapping):
        return "{...}"
    if isinstance(value, list):
        return "[...]"
    if isinstance(value, str | bool | float) or value is None:
        shown = json.dumps(value, ensure_ascii=False)
    else:
        shown = str(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def invalid(path: str, value: object, detail: str) -> FieldError:
    return FieldError(path, f"Invalid value: {_show(value)}: {detail}")


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, f"Required value: {detail}" if detail else "Required value")


def not_supported(path: str, value: object, supported: Iterable[str]) -> FieldError:
    listed = ", ".join(f'"{s}"' for s in supported)
    return FieldError(path, f"Unsupported value: {_show(value)}: supported values: {listed}")


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, f"Forbidden: {detail}")


def too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError(path, f"Too many: {actual}: must have at most {limit} items")


def duplicate(path: str, value: object) -> FieldError:
    return FieldError(path, f"Duplicate value: {_show(value)}")


def from_spec_error(err: JobSpecError) -> FieldError:
    return FieldError(err.path, err.detail)


def aggregate(errors: Iterable[FieldError]) -> str:
    """One message for many errors, as ``ErrorList.ToAggregate().Error()`` prints it."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"


def ratchet(new: list[FieldError], old: Iterable[FieldError]) -> list[FieldError]:
    """Errors of an updated object that its previous version did not already have.

    On UPDATE only *new* problems are reported, so an object stored before the webhook existed
    (or before a rule was added) can still get its finalizers removed or its status moved on.
    """
    seen = set(old)
    return [e for e in new if e not in seen]


# --- Go scalar parsing ---------------------------------------------------------------------------


def _annotation(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _int_field(value: object, path: str, *, minimum: int = INT32_MIN) -> list[FieldError]:
    """An optional int32 field of a CRD (the schema may be missing, so check the type too)."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [invalid(path, value, "must be an integer")]
    if not minimum <= value <= INT32_MAX:
        return [invalid(path, value, f"must be between {minimum} and {INT32_MAX}")]
    return []


# --- resource lists ------------------------------------------------------------------------------


def validate_resource_list(raw: object, path: str) -> tuple[dict[str, int], list[FieldError]]:
    """Parse a ResourceList, collecting one error per bad entry; returns the good entries too."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [invalid(path, raw, "must be a map of resource names to quantities")]
    parsed: dict[str, int] = {}
    errors: list[FieldError] = []
    for name, value in raw.items():
        try:
            parsed.update(podspec.parse_resources({name: value}, path))
        except JobSpecError as err:
            errors.append(from_spec_error(err))
    return parsed, errors


def _pod_template_quantities(template: Mapping[str, Any], path: str) -> list[FieldError]:
    spec = base.dig(template, "spec")
    if spec is None:
        return []
    if not isinstance(spec, Mapping):
        return [invalid(f"{path}.spec", spec, "must be an object")]
    errors: list[FieldError] = []
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if containers is not None and not isinstance(containers, list):
            errors.append(invalid(f"{path}.spec.{field}", containers, "must be a list"))
            continue
        for i, container in enumerate(containers or []):
            for kind in ("requests", "limits"):
                raw = base.dig(container, "resources", kind)
                errors += validate_resource_list(raw, f"{path}.spec.{field}[{i}].resources.{kind}")[1]
    errors += validate_resource_list(spec.get("overhead"), f"{path}.spec.overhead")[1]
    return errors


# --- jobs ----------------------------------------------------------------------------------------


def validate_job_annotations(
    annotations: Mapping[str, str],
    *,
    unchanged: Mapping[str, str] | None = None,
    max_priority: int | None = None,
) -> list[FieldError]:
    """The scheduling annotations of a managed job; entries equal in ``unchanged`` are skipped.

    ``max_priority`` is the cluster's cap on the priority a user may ask for by annotation
    (``maxUserPriority``): the annotation overrides the PriorityClass, which admins control, so
    without a cap anyone could put their job ahead of everyone else's.
    """
    old = unchanged or {}
    errors: list[FieldError] = []

    def changed(key: str) -> str | None:
        value = annotations.get(key)
        return None if value is None or old.get(key) == value else value

    if (value := changed(names.PRIORITY_ANNOTATION)) is not None:
        path = _annotation(names.PRIORITY_ANNOTATION)
        number = parse_go_int(value, bits=32)
        if number is None:
            errors.append(invalid(path, value, "must be a 32-bit integer"))
        elif max_priority is not None and number > max_priority:
            detail = (
                f"must be at most {max_priority}, the highest priority jobs may ask for in this cluster "
                "(maxUserPriority); use a lower value, or ask a cluster admin for a PriorityClass"
            )
            errors.append(invalid(path, value, detail))
    if (value := changed(names.ACTIVE_ANNOTATION)) is not None and parse_go_bool(value) is None:
        errors.append(invalid(_annotation(names.ACTIVE_ANNOTATION), value, 'must be "true" or "false"'))
    if (value := changed(names.MAX_EXEC_TIME_ANNOTATION)) is not None:
        number = parse_go_int(value, bits=32)
        if number is None or number <= 0:
            detail = "must be a positive 32-bit integer (seconds)"
            errors.append(invalid(_annotation(names.MAX_EXEC_TIME_ANNOTATION), value, detail))
    if (value := changed(names.POOLS_ANNOTATION)) is not None:
        errors += _name_list(
            names.POOLS_ANNOTATION, value, "pool (ElasticQuotaProfile) names, such as a100, h100"
        )
    if (value := changed(names.MIN_RESOURCES_ANNOTATION)) is not None:
        path = _annotation(names.MIN_RESOURCES_ANNOTATION)
        try:
            errors += validate_resource_list(podspec.load_resource_text(value, path), path)[1]
        except JobSpecError as err:
            errors.append(from_spec_error(err))
    return errors + _preemption_annotations(annotations, unchanged, max_priority)


def _preemption_annotations(
    annotations: Mapping[str, str], unchanged: Mapping[str, str] | None, max_priority: int | None
) -> list[FieldError]:
    """The preemption priority and policy of a job (docs/compatibility.md#preemption-priority,
    docs/compatibility.md#non-preempting-jobs).

    Both are fixed when the job is created: an UPDATE (``unchanged`` is the old object's
    annotations) may not add, change or remove them, or an owner could make a queued or admitted
    job unpreemptable, or make a non-preempting one preempt, once it has its place. The preemption
    priority is a 32-bit integer, capped like the priority (``max_priority``), and not below the
    job's priority annotation; a priority from a PriorityClass is known to the reconciler only,
    which raises the unit's preemption priority to it."""
    errors: list[FieldError] = []
    keys = (names.PREEMPTION_PRIORITY_ANNOTATION, names.PREEMPTION_POLICY_ANNOTATION)
    if unchanged is not None:
        for key in keys:
            if annotations.get(key) != unchanged.get(key):
                detail = f"{key} is immutable: it is set when the job is created and cannot change afterwards"
                errors.append(forbidden(_annotation(key), detail))
        return errors
    policy = annotations.get(names.PREEMPTION_POLICY_ANNOTATION)
    if policy is not None and policy not in names.PREEMPTION_POLICIES:
        path = _annotation(names.PREEMPTION_POLICY_ANNOTATION)
        errors.append(not_supported(path, policy, names.PREEMPTION_POLICIES))
    if (value := annotations.get(names.PREEMPTION_PRIORITY_ANNOTATION)) is None:
        return errors
    path = _annotation(names.PREEMPTION_PRIORITY_ANNOTATION)
    number = parse_go_int(value, bits=32)
    priority = parse_go_int(annotations.get(names.PRIORITY_ANNOTATION) or "", bits=32)
    if number is None:
        errors.append(invalid(path, value, "must be a 32-bit integer"))
    elif max_priority is not None and number > max_priority:
        detail = (
            f"must be at most {max_priority}, the highest priority jobs may ask for in this cluster "
            "(maxUserPriority), as for the priority itself"
        )
        errors.append(invalid(path, value, detail))
    elif priority is not None and number < priority:
        detail = (
            f"must not be below the job's priority ({names.PRIORITY_ANNOTATION}: {priority}): a job "
            "is never preempted below the priority it preempts at"
        )
        errors.append(invalid(path, value, detail))
    return errors


# --- Queue ---------------------------------------------------------------------------------------


def validate_queue_annotations(annotations: Mapping[str, str]) -> list[FieldError]:
    """The ``koord-queue/*`` tuning annotations a Queue is configured by
    (docs/compatibility.md#queue-annotations)."""
    errors: list[FieldError] = []
    bools = (
        names.WAIT_FOR_PODS_RUNNING_ANNOTATION,
        names.ENABLE_PREEMPTION_ANNOTATION,
        names.STOPPED_ANNOTATION,
    )
    for key in bools:
        if (value := annotations.get(key)) is not None and parse_go_bool(value) is None:
            errors.append(invalid(_annotation(key), value, 'must be "true" or "false"'))
    if (value := annotations.get(names.MAX_DEPTH_ANNOTATION)) is not None and parse_go_int(value) is None:
        errors.append(invalid(_annotation(names.MAX_DEPTH_ANNOTATION), value, "must be an integer"))
    key = names.PRIORITY_THRESHOLD_ANNOTATION
    if (value := annotations.get(key)) is not None and parse_go_int(value, bits=32) is None:
        errors.append(invalid(_annotation(key), value, "must be a 32-bit integer"))
    if (value := annotations.get(names.QUEUE_ITEMS_REFRESH_ANNOTATION)) is not None:
        path = _annotation(names.QUEUE_ITEMS_REFRESH_ANNOTATION)
        try:
            if durations.parse_duration_ns(value) <= 0:
                errors.append(invalid(path, value, "must be a positive duration such as 15s or 1m30s"))
        except ValueError:  # DurationError, or a number too long for int()
            errors.append(invalid(path, value, "must be a Go duration such as 100ms, 15s or 1m30s"))
    value = annotations.get(names.FAIR_ORDER_ANNOTATION)
    if value not in (None, "", names.FAIR_ORDER_NAMESPACE):
        detail = f'must be "{names.FAIR_ORDER_NAMESPACE}" (order by namespace usage) or empty'
        errors.append(invalid(_annotation(names.FAIR_ORDER_ANNOTATION), value, detail))
    return errors


def _policy(value: object, path: str) -> list[FieldError]:
    if value is None or value == "":
        return []
    if not isinstance(value, str) or value not in _POLICIES:
        return [not_supported(path, value, _POLICIES)]
    return []


def validate_queue(obj: Mapping[str, Any]) -> list[FieldError]:
    """A ``scheduling.x-k8s.io/v1alpha1`` Queue."""
    errors = validate_queue_annotations(base.annotations_of(obj))
    spec = obj.get("spec")
    if spec is None:
        return errors
    if not isinstance(spec, Mapping):
        return [*errors, invalid("spec", spec, "must be an object")]
    errors += _policy(spec.get("queuePolicy"), "spec.queuePolicy")
    errors += _int_field(spec.get("priority"), "spec.priority")
    checks = spec.get("admissionChecks")
    if checks is not None and not isinstance(checks, list):
        errors.append(invalid("spec.admissionChecks", checks, "must be a list"))
        checks = None
    seen: set[str] = set()
    for i, check in enumerate(checks or []):
        path = f"spec.admissionChecks[{i}]"
        name = base.dig(check, "name")
        if not isinstance(check, Mapping):
            errors.append(invalid(path, check, "must be an object"))
        elif not isinstance(name, str) or not name:
            errors.append(required(f"{path}.name", "the name of an admission check"))
        elif name in seen:
            errors.append(duplicate(f"{path}.name", name))
        else:
            seen.add(name)
        selector = base.dig(check, "labelSelector")
        if selector is not None and not isinstance(selector, Mapping):
            errors.append(invalid(f"{path}.labelSelector", selector, "must be a label selector object"))
    return errors


# --- QueueUnit -----------------------------------------------------------------------------------


def _pod_set(item: object, path: str, seen: set[str]) -> list[FieldError]:
    if not isinstance(item, Mapping):
        return [invalid(path, item, "must be an object")]
    errors: list[FieldError] = []
    name = item.get("name", "main")
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        detail = "must be a DNS label: at most 63 lowercase letters, digits and '-'"
        errors.append(invalid(f"{path}.name", name, detail))
    elif name in seen:
        errors.append(duplicate(f"{path}.name", name))
    else:
        seen.add(name)
    count, min_count = item.get("count"), item.get("minCount")
    count_errors = _int_field(count, f"{path}.count", minimum=0)
    errors += count_errors
    errors += _int_field(min_count, f"{path}.minCount", minimum=1)
    number = 1 if count is None else count
    if (
        not count_errors
        and isinstance(min_count, int)
        and not isinstance(min_count, bool)
        and min_count > number
    ):
        detail = f"must be less than or equal to count ({number})"
        errors.append(invalid(f"{path}.minCount", min_count, detail))
    template = item.get("template")
    if template is None:
        errors.append(required(f"{path}.template", "the pod template of this pod set"))
    elif not isinstance(template, Mapping):
        errors.append(invalid(f"{path}.template", template, "must be a pod template object"))
    else:
        errors += _pod_template_quantities(template, f"{path}.template")
    return errors


def validate_queue_unit(obj: Mapping[str, Any]) -> list[FieldError]:
    """A ``scheduling.x-k8s.io/v1alpha1`` QueueUnit."""
    spec = obj.get("spec")
    if spec is None:
        return []
    if not isinstance(spec, Mapping):
        return [invalid("spec", spec, "must be an object")]
    errors = _int_field(spec.get("priority"), "spec.priority")
    errors += _int_field(
        spec.get("maximumExecutionTimeSeconds"), "spec.maximumExecutionTimeSeconds", minimum=1
    )
    errors += _int_field(spec.get("preemptionPriority"), "spec.preemptionPriority")
    policy = spec.get("preemptionPolicy")
    if policy is not None and policy not in names.PREEMPTION_POLICIES:
        errors.append(not_supported("spec.preemptionPolicy", policy, names.PREEMPTION_POLICIES))
    if "active" in spec and spec["active"] is not None and not isinstance(spec["active"], bool):
        errors.append(invalid("spec.active", spec["active"], "must be true or false"))
    for field in ("resource", "request"):
        errors += validate_resource_list(spec.get(field), f"spec.{field}")[1]
    pod_sets = spec.get("podSet")
    if pod_sets is None:
        return errors
    if not isinstance(pod_sets, list):
        return [*errors, invalid("spec.podSet", pod_sets, "must be a list")]
    if len(pod_sets) > MAX_POD_SETS:
        errors.append(too_many("spec.podSet", len(pod_sets), MAX_POD_SETS))
    seen: set[str] = set()
    for i, item in enumerate(pod_sets):
        errors += _pod_set(item, f"spec.podSet[{i}]", seen)
    return errors


# --- ElasticQuota --------------------------------------------------------------------------------


def _name_list(key: str, value: str, what: str) -> list[FieldError]:
    """A comma-separated list of object names (docs/pools.md#fallback-between-pools)."""
    listed = parsing.name_list(value)
    if listed and all(len(n) <= 253 and _DNS_SUBDOMAIN.fullmatch(n) for n in listed):
        return []
    detail = f"must be a comma-separated list of {what}"
    return [invalid(_annotation(key), value, detail)]


def _quota_namespaces(value: str) -> list[FieldError]:
    """Koordinator's namespaces annotation: a JSON array of namespace names (empty: none)."""
    path = _annotation(names.QUOTA_NAMESPACES_ANNOTATION)
    detail = 'must be a JSON array of namespace names, such as ["team-a","team-b"]'
    if not value.strip():
        return []
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return [invalid(path, value, detail)]
    if parsed is None:
        return []
    if not isinstance(parsed, list):
        return [invalid(path, value, detail)]
    name_detail = "must be a namespace name: at most 63 lowercase letters, digits and '-'"
    return [
        invalid(f"{path}[{i}]", item, name_detail)
        for i, item in enumerate(parsed)
        if not (isinstance(item, str) and len(item) <= 63 and _DNS_LABEL.fullmatch(item))
    ]


def validate_elastic_quota(obj: Mapping[str, Any]) -> list[FieldError]:
    """A ``scheduling.sigs.k8s.io/v1alpha1`` ElasticQuota (and the Queue it will configure)."""
    annotations = base.annotations_of(obj)
    errors = validate_queue_annotations(annotations)
    if (value := annotations.get(names.QUOTA_NAMESPACES_ANNOTATION)) is not None:
        errors += _quota_namespaces(value)
    key = names.MAX_USER_PRIORITY_ANNOTATION
    if (value := annotations.get(key)) is not None and parse_go_int(value, bits=32) is None:
        detail = "must be a 32-bit integer: the highest priority this quota's jobs may ask for"
        errors.append(invalid(_annotation(key), value, detail))
    key = names.ALLOWED_PRIORITY_CLASSES_ANNOTATION
    if (value := annotations.get(key)) is not None and parsing.parse_allowed_priority_classes(value)[1]:
        detail = (
            'must be a JSON array of PriorityClass names, such as ["batch-low","batch-high"]: the '
            "classes this quota's jobs may take their priority from"
        )
        errors.append(invalid(_annotation(key), value, detail))
    found_labels = base.labels_of(obj)
    errors += _policy(
        found_labels.get(names.QUEUE_POLICY_LABEL), f"metadata.labels[{names.QUEUE_POLICY_LABEL}]"
    )
    for label in (names.QUOTA_IS_PARENT_LABEL, names.QUOTA_ALLOW_LENT_LABEL):
        value = found_labels.get(label)
        if value is not None and value not in ("true", "false"):
            errors.append(invalid(f"metadata.labels[{label}]", value, 'must be "true" or "false"'))
    weight = annotations.get(names.QUOTA_SHARED_WEIGHT_ANNOTATION)
    if weight is not None and isinstance(parsing.parse_shared_weight(weight), str):
        detail = 'must be a ResourceList as JSON with non-negative quantities, such as {"cpu":"4"}'
        errors.append(invalid(_annotation(names.QUOTA_SHARED_WEIGHT_ANNOTATION), weight, detail))
    if (value := annotations.get(names.POOL_QUOTAS_ANNOTATION)) is not None:
        errors += _name_list(
            names.POOL_QUOTAS_ANNOTATION,
            value,
            "quota names inside node pools, such as team-a-h100, team-a-a100",
        )
        if base.name_of(obj) in parsing.name_list(value):
            detail = "a quota cannot fall back through itself; list quotas inside the pools' trees"
            errors.append(invalid(_annotation(names.POOL_QUOTAS_ANNOTATION), value, detail))
    parent = found_labels.get(names.QUOTA_PARENT_LABEL)
    if parent and parent == base.name_of(obj):
        detail = (
            "a quota cannot be its own parent; name another quota, "
            f"or remove the label to use {names.ROOT_QUOTA}"
        )
        errors.append(invalid(f"metadata.labels[{names.QUOTA_PARENT_LABEL}]", parent, detail))
    spec = obj.get("spec")
    if spec is None:
        return errors
    if not isinstance(spec, Mapping):
        return [*errors, invalid("spec", spec, "must be an object")]
    minimum, min_errors = validate_resource_list(spec.get("min"), "spec.min")
    maximum, max_errors = validate_resource_list(spec.get("max"), "spec.max")
    errors += min_errors + max_errors
    for name in quantities.less_or_equal(minimum, maximum):
        shown_max = _show(spec["max"][name])
        detail = f"must be less than or equal to spec.max[{name}] ({shown_max})"
        errors.append(invalid(f"spec.min[{name}]", spec["min"][name], detail))
    return errors

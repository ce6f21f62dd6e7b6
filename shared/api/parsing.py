"""Raw QueueUnits, Queues and ElasticQuotas (plain dicts from the API) parsed into ``shared.api.model``.

Raw Kubernetes objects are parsed here exactly once, at the edge, so that no decision module digs in raw
dicts (docs/development.md#code-style). Parsing never raises on user data: a malformed field is replaced
by its documented default and a human-readable entry is appended to ``problems`` (with the field path),
which the reconciler turns into a status message and an event. One bad object must never stop the
reconcile loop. When a bad field makes a unit's demand unknowable (an unparsable quantity) the unit also
gets ``invalid``: the scheduler parks it with that text instead of guessing and over-admitting.

Quantities become exact milli-units (``shared.api.quantities``); times float epoch seconds parsed from
RFC 3339 text. Pure: standard library and sibling ``shared`` modules only, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from koord_queue.shared.api import model, names, placement, quantities
from koord_queue.shared.api import podtemplates as podspec
from koord_queue.shared.api.admission_checks import CheckState, QueueAdmissionCheck, parse_selector
from koord_queue.shared.api.durations import DurationError, parse_duration, parse_time
from koord_queue.shared.api.goparse import parse_go_bool, parse_go_int, parse_lenient_int
from koord_queue.shared.api.model import Admission, PodSet, QueueConfig, Quota, Unit
from koord_queue.shared.api.quantities import QuantityError, Resources

__all__ = [
    "parse_namespaces_annotation",
    "parse_queue",
    "parse_quota",
    "parse_unit",
    "parse_user_priority_cap",
]

_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_INT32 = re.compile(r"[+-]?[0-9]{1,11}")
#: A PriorityClass name is a DNS subdomain.
_PRIORITY_CLASS_NAME = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


# --- small tolerant readers -----------------------------------------------------------------------


class _Reader:
    """Collects problems while reading one object; every getter returns a safe default."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def obj(self, raw: object, path: str) -> Mapping[str, object]:
        if raw is None:
            return {}
        if isinstance(raw, Mapping):
            return raw
        self.problems.append(f"{path}: expected an object, got {type(raw).__name__}")
        return {}

    def str_map(self, raw: object, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self.obj(raw, path).items():
            if isinstance(key, str) and isinstance(value, str):
                out[key] = value
            else:
                self.problems.append(f"{path}.{key}: expected a string value")
        return out

    def text(self, raw: object, path: str, default: str = "") -> str:
        if raw is None:
            return default
        if isinstance(raw, str):
            return raw
        self.problems.append(f"{path}: expected a string, got {type(raw).__name__}")
        return default

    def integer(self, raw: object, path: str, default: int) -> int:
        if raw is None:
            return default
        if isinstance(raw, bool) or not isinstance(raw, int | float) or int(raw) != raw:
            self.problems.append(f"{path}: expected an integer, got {raw!r}")
            return default
        return int(raw)

    def boolean(self, raw: object, path: str, default: bool) -> bool:
        if raw is None:
            return default
        if isinstance(raw, bool):
            return raw
        self.problems.append(f"{path}: expected a boolean, got {raw!r}")
        return default

    def go_bool(self, annotations: Mapping[str, str], key: str, default: bool) -> bool:
        value = annotations.get(key)
        if value is None:
            return default
        parsed = parse_go_bool(value)
        if parsed is not None:
            return parsed
        self.problems.append(f'metadata.annotations[{key}]: {value!r} is not a boolean, using "{default}"')
        return default

    def go_int(self, annotations: Mapping[str, str], key: str, default: int) -> int:
        value = annotations.get(key)
        if value is None:
            return default
        parsed = parse_lenient_int(value)
        if parsed is None:
            self.problems.append(f"metadata.annotations[{key}]: {value!r} is not an integer, using {default}")
            return default
        return parsed

    def resources(self, raw: object, path: str) -> tuple[Resources, bool]:
        """Parse a resource list; a bad entry is recorded and makes the second value False."""
        mapping = self.obj(raw, path)
        try:
            return quantities.parse_resource_list(mapping, path=path), True
        except QuantityError as err:
            self.problems.append(str(err))
        # Keep the good entries so that logs and visibility still show something useful.
        out: Resources = {}
        for key, value in mapping.items():
            try:
                out[str(key)] = quantities.parse_milli(value)  # type: ignore[arg-type]
            except QuantityError:
                continue
        return dict(sorted(out.items())), False

    def items(self, raw: object, path: str) -> list[Mapping[str, object]]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.problems.append(f"{path}: expected a list, got {type(raw).__name__}")
            return []
        return [self.obj(item, f"{path}[{i}]") for i, item in enumerate(raw)]


def _metadata(r: _Reader, raw: Mapping[str, object]) -> tuple[str, str, Mapping[str, object]]:
    meta = r.obj(raw.get("metadata"), "metadata")
    name = r.text(meta.get("name"), "metadata.name")
    if not name:
        r.problems.append("metadata.name: missing")
    namespace = r.text(meta.get("namespace"), "metadata.namespace")
    return name, namespace, meta


# --- QueueUnit -------------------------------------------------------------------------------------


def _pod_sets(r: _Reader, spec: Mapping[str, object], invalid: list[str]) -> list[PodSet]:
    """``spec.podSet`` of a QueueUnit; a pod set whose requests cannot be read is kept with no
    per-pod size, and the reason goes to ``invalid`` (the unit then waits as invalid)."""
    pod_sets: list[PodSet] = []
    for i, item in enumerate(r.items(spec.get("podSet"), "spec.podSet")):
        path = f"spec.podSet[{i}]"
        ps_name = r.text(item.get("name"), f"{path}.name", "main") or "main"
        count = max(0, r.integer(item.get("count"), f"{path}.count", 1))
        min_count = item.get("minCount")
        template = r.obj(item.get("template"), f"{path}.template")
        try:
            per_pod = podspec.pod_requests(r.obj(template.get("spec"), f"{path}.template.spec"), path=path)
        except QuantityError as err:
            r.problems.append(str(err))
            invalid.append(str(err))
            per_pod = {}
        template_spec = template.get("spec")
        placed = (
            placement.pod_placement(template_spec)
            if isinstance(template_spec, Mapping)
            and ("nodeSelector" in template_spec or "affinity" in template_spec)
            else None
        )
        pod_sets.append(
            PodSet(
                name=ps_name,
                count=count,
                min_count=None if min_count is None else r.integer(min_count, f"{path}.minCount", 1),
                per_pod=per_pod,
                placement=placed
                if placed is not None and (placed.node_selector or placed.required_terms)
                else None,
            )
        )
    return pod_sets


def _admissions(r: _Reader, status: Mapping[str, object]) -> list[Admission]:
    """``status.admissions`` of a QueueUnit."""
    admissions: list[Admission] = []
    for i, item in enumerate(r.items(status.get("admissions"), "status.admissions")):
        path = f"status.admissions[{i}]"
        reclaim = r.obj(item.get("reclaimState"), f"{path}.reclaimState") if "reclaimState" in item else None
        res, _ = r.resources(item.get("resources"), f"{path}.resources")
        admissions.append(
            Admission(
                name=r.text(item.get("name"), f"{path}.name"),
                replicas=r.integer(item.get("replicas"), f"{path}.replicas", 0),
                running=r.integer(item.get("running"), f"{path}.running", 0),
                resources=res,
                reclaim_replicas=(
                    None
                    if reclaim is None or item.get("reclaimState") is None
                    else r.integer(reclaim.get("replicas"), f"{path}.reclaimState.replicas", 0)
                ),
            )
        )
    return admissions


def parse_unit(raw: Mapping[str, object]) -> Unit:
    """Parse a QueueUnit object. Never raises on malformed content (see the module docstring)."""
    r = _Reader()
    raw = r.obj(raw, "")
    name, namespace, meta = _metadata(r, raw)
    spec = r.obj(raw.get("spec"), "spec")
    status = r.obj(raw.get("status"), "status")
    labels = r.str_map(meta.get("labels"), "metadata.labels")
    created = parse_time(meta.get("creationTimestamp"))
    if created is None:
        r.problems.append(f"metadata.creationTimestamp: {meta.get('creationTimestamp')!r} is not RFC 3339")
    invalid: list[str] = []
    pod_sets = _pod_sets(r, spec, invalid)
    request, ok = r.resources(spec.get("request"), "spec.request")
    if not ok and not pod_sets:
        invalid.append("spec.request has an invalid quantity")
    resource, _ = r.resources(spec.get("resource"), "spec.resource")
    admissions = _admissions(r, status)
    checks = tuple(
        CheckState(
            name=r.text(item.get("name"), f"status.admissionChecks[{i}].name"),
            state=r.text(item.get("state"), f"status.admissionChecks[{i}].state"),
            message=r.text(item.get("message"), f"status.admissionChecks[{i}].message"),
            last_transition_time=r.text(
                item.get("lastTransitionTime"), f"status.admissionChecks[{i}].lastTransitionTime"
            ),
        )
        for i, item in enumerate(r.items(status.get("admissionChecks"), "status.admissionChecks"))
    )
    requeue = r.obj(status.get("requeueState"), "status.requeueState")
    consumer = r.obj(spec.get("consumerRef"), "spec.consumerRef")
    priority = r.integer(spec.get("priority"), "spec.priority", 0)
    preemption_priority, preemption_policy = _preemption(r, spec, priority)
    return Unit(
        key=f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        uid=r.text(meta.get("uid"), "metadata.uid"),
        created=created or 0.0,
        priority=priority,
        quota=model.quota_name_of(labels),
        labels=labels,
        annotations=r.str_map(meta.get("annotations"), "metadata.annotations"),
        active=r.boolean(spec.get("active"), "spec.active", True),
        pod_sets=tuple(pod_sets),
        admissions=tuple(admissions),
        phase=r.text(status.get("phase"), "status.phase"),
        message=r.text(status.get("message"), "status.message"),
        request=request,
        resource=resource,
        last_allocate_time=parse_time(status.get("lastAllocateTime")),
        last_update_time=parse_time(status.get("lastUpdateTime")),
        admission_checks=checks,
        consumer_kind=r.text(consumer.get("kind"), "spec.consumerRef.kind") or None,
        attempts=r.integer(status.get("attempts"), "status.attempts", 0),
        conditions=tuple(r.items(status.get("conditions"), "status.conditions")),
        requeue_count=(
            r.integer(requeue.get("count"), "status.requeueState.count", 0) if "count" in requeue else None
        ),
        requeue_at=parse_time(requeue.get("requeueAt")),
        queue=r.text(spec.get("queue"), "spec.queue"),
        resource_version=r.text(meta.get("resourceVersion"), "metadata.resourceVersion"),
        problems=tuple(r.problems),
        invalid="; ".join(invalid) or None,
        pool=r.text(status.get("pool"), "status.pool"),
        pool_quota=r.text(status.get("poolQuota"), "status.poolQuota"),
        pools=_pools_of(meta),
        preemption_priority=preemption_priority,
        preemption_policy=preemption_policy,
    )


def _preemption(r: _Reader, spec: Mapping[str, object], priority: int) -> tuple[int | None, str]:
    """``spec.preemptionPriority`` (None when absent) and ``spec.preemptionPolicy``.

    A preemption priority below the unit's priority is raised to it, with a problem saying so: a
    unit preempted below the priority it preempts at could be the victim of its own victim
    (docs/compatibility.md#preemption-priority). An unknown policy counts as Kubernetes' default."""
    raw = spec.get("preemptionPriority")
    preemption_priority = None if raw is None else r.integer(raw, "spec.preemptionPriority", priority)
    if preemption_priority is not None and preemption_priority < priority:
        r.problems.append(
            f"spec.preemptionPriority: {preemption_priority} is below spec.priority {priority}; "
            f"the unit is preempted at {priority}"
        )
        preemption_priority = priority
    policy = r.text(spec.get("preemptionPolicy"), "spec.preemptionPolicy") or names.PREEMPTION_POLICY_PREEMPT
    if policy not in names.PREEMPTION_POLICIES:
        r.problems.append(
            f"spec.preemptionPolicy: {policy!r} is not one of {', '.join(names.PREEMPTION_POLICIES)}; "
            f"{names.PREEMPTION_POLICY_PREEMPT} applies"
        )
        policy = names.PREEMPTION_POLICY_PREEMPT
    return preemption_priority, policy


def name_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of names, blanks dropped, each kept once in its first place."""
    out: list[str] = []
    for part in text.split(","):
        item = part.strip()
        if item and item not in out:
            out.append(item)
    return tuple(out)


def _pools_of(meta: Mapping[str, object]) -> tuple[str, ...] | None:
    """The job's pools in its order (``koord-queue/pools``, copied to its unit), None when absent."""
    annotations = meta.get("annotations")
    text = annotations.get(names.POOLS_ANNOTATION) if isinstance(annotations, Mapping) else None
    return name_list(text) if isinstance(text, str) else None


# --- Queue and ElasticQuota ----------------------------------------------------------------------


def parse_queue(raw: Mapping[str, object]) -> QueueConfig:
    """Parse a Queue object; unsupported policies and bad annotations become ``problems``."""
    r = _Reader()
    raw = r.obj(raw, "")
    name, _, meta = _metadata(r, raw)
    spec = r.obj(raw.get("spec"), "spec")
    annotations = r.str_map(meta.get("annotations"), "metadata.annotations")
    labels = r.str_map(meta.get("labels"), "metadata.labels")
    policy_text = r.text(spec.get("queuePolicy"), "spec.queuePolicy")
    policy: names.QueuePolicy | None
    policy_error: str | None = None
    if not policy_text:
        policy = names.QueuePolicy.PRIORITY  # an unset policy defaults to Priority
    elif policy_text in names.QueuePolicy.__members__.values():
        policy = names.QueuePolicy(policy_text)
    else:
        policy = None
        policy_error = "unsupported strategy"
        r.problems.append(f"spec.queuePolicy: unsupported strategy {policy_text!r}")
    checks: list[QueueAdmissionCheck] = []
    for i, item in enumerate(r.items(spec.get("admissionChecks"), "spec.admissionChecks")):
        path = f"spec.admissionChecks[{i}]"
        selector = None
        if item.get("labelSelector") is not None:
            selector, errors = parse_selector(item.get("labelSelector"), path=f"{path}.labelSelector")
            r.problems.extend(errors)
        checks.append(QueueAdmissionCheck(name=r.text(item.get("name"), f"{path}.name"), selector=selector))
    refresh = model.DEFAULT_ITEMS_REFRESH_SECONDS
    refresh_text = annotations.get(names.QUEUE_ITEMS_REFRESH_ANNOTATION)
    if refresh_text is not None:
        try:
            refresh = parse_duration(refresh_text)
        except DurationError as err:
            r.problems.append(f"metadata.annotations[{names.QUEUE_ITEMS_REFRESH_ANNOTATION}]: {err}")
        if refresh <= 0:
            refresh = model.DEFAULT_ITEMS_REFRESH_SECONDS
    fair_order = annotations.get(names.FAIR_ORDER_ANNOTATION)
    if fair_order not in (None, "", names.FAIR_ORDER_NAMESPACE):
        r.problems.append(
            f"metadata.annotations[{names.FAIR_ORDER_ANNOTATION}]: expected "
            f"{names.FAIR_ORDER_NAMESPACE!r} (or nothing), got {fair_order!r}; the plain order stays"
        )
    stopped = r.go_bool(annotations, names.STOPPED_ANNOTATION, False)  # before problems are taken
    return QueueConfig(
        name=name,
        policy=policy,
        policy_error=policy_error,
        priority=r.integer(spec.get("priority"), "spec.priority", 0),
        wait_for_pods_running=r.go_bool(annotations, names.WAIT_FOR_PODS_RUNNING_ANNOTATION, False),
        enable_preemption=r.go_bool(annotations, names.ENABLE_PREEMPTION_ANNOTATION, False),
        max_depth=r.go_int(annotations, names.MAX_DEPTH_ANNOTATION, -1),
        priority_threshold=r.go_int(
            annotations, names.PRIORITY_THRESHOLD_ANNOTATION, names.DEFAULT_PRIORITY_THRESHOLD
        ),
        admission_checks=tuple(checks),
        items_refresh_seconds=refresh,
        disable_show_items=names.DISABLE_SHOW_QUEUE_ITEMS_ANNOTATION in annotations,
        parent=labels.get(names.QUOTA_PARENT_LABEL, ""),
        problems=tuple(r.problems),
        quota_holder=annotations.get(names.QUOTA_HOLDER_ANNOTATION, ""),
        fair_order=fair_order == names.FAIR_ORDER_NAMESPACE,
        stopped=stopped,
    )


def parse_namespaces_annotation(text: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """The namespaces listed by ``quota.scheduling.koordinator.sh/namespaces`` and the problems.

    Lenient, as koord-scheduler is: the value is a JSON array of namespace names; anything else
    binds no extra namespace, and an entry that is not a namespace name is skipped. Each problem
    says what was ignored (the reconciler shows it in a Warning event, the webhook denies it).
    An empty value lists nothing and is no problem.
    """
    key = f"metadata.annotations[{names.QUOTA_NAMESPACES_ANNOTATION}]"
    if not text.strip():
        return frozenset(), ()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return frozenset(), (
            f"{key}: not valid JSON; expected an array of namespace names such as "
            '["team-a","team-b"], so the quota is bound to its own namespace only',
        )
    if value is None:
        return frozenset(), ()
    if not isinstance(value, list):
        return frozenset(), (
            f"{key}: expected a JSON array of namespace names, got a {type(value).__name__}; "
            "the quota is bound to its own namespace only",
        )
    found: set[str] = set()
    problems: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and _NAMESPACE_NAME.fullmatch(item):
            found.add(item)
        else:
            shown = (
                json.dumps(item)[:80]
                if isinstance(item, str | int | float | bool | None)
                else type(item).__name__
            )
            problems.append(f"{key}[{i}]: {shown} is not a namespace name; it is ignored")
    return frozenset(found), tuple(problems)


def parse_allowed_priority_classes(text: str | None) -> tuple[frozenset[str] | None, str | None]:
    """The ``koord-queue/allowed-priority-classes`` annotation: a JSON array of PriorityClass names.

    Absent: every class is allowed. It fails *closed*: a value that cannot be read allows no class
    (the quota's jobs get no class priority) and an entry that is not a name is skipped, each with
    a problem saying so (docs/compatibility.md#priority-cap).
    """
    if text is None:
        return None, None
    key = f"metadata.annotations[{names.ALLOWED_PRIORITY_CLASSES_ANNOTATION}]"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, list):
        return frozenset(), (
            f"{key}: {text[:80]!r} is not a JSON array of PriorityClass names such as "
            '["batch-low","batch-high"]; no PriorityClass is allowed for this quota until it is fixed'
        )
    names_ = [item for item in value if isinstance(item, str) and _PRIORITY_CLASS_NAME.fullmatch(item)]
    if len(names_) != len(value):
        skipped = [item for item in value if item not in names_]
        return frozenset(names_), (
            f"{key}: {json.dumps(skipped)[:80]} are not PriorityClass names; they are ignored"
        )
    return frozenset(names_), None


def parse_user_priority_cap(text: str | None) -> tuple[int | None, str | None]:
    """The ``koord-queue/max-user-priority`` annotation: a 32-bit integer, else no cap + a problem."""
    if text is None:
        return None, None
    value = text.strip()
    number = parse_go_int(value, bits=32) if _INT32.fullmatch(value) else None
    if number is None:
        return None, (
            f"metadata.annotations[{names.MAX_USER_PRIORITY_ANNOTATION}]: {text[:80]!r} is not a 32-bit "
            "integer; no per-quota priority cap applies until it is fixed"
        )
    return number, None


def parse_shared_weight(text: str | None) -> Resources | str | None:
    """The ``shared-weight`` annotation: a ResourceList as JSON; None when absent, else the problem
    text when it cannot be read (the quota then weighs its ``max``, the default)."""
    if text is None or not text.strip():
        return None
    key = f"metadata.annotations[{names.QUOTA_SHARED_WEIGHT_ANNOTATION}]"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return (
            f'{key}: not valid JSON; expected a ResourceList such as {{"cpu":"4"}}; the quota weighs its max'
        )
    if not isinstance(value, dict):
        return f"{key}: expected a JSON object (a ResourceList); the quota weighs its max"
    try:
        weight = quantities.parse_resource_list(value, path=key)
    except QuantityError as err:
        return f"{err}; the quota weighs its max"
    if any(v < 0 for v in weight.values()):
        return f"{key}: a weight may not be negative; the quota weighs its max"
    return weight


def parse_quota(raw: Mapping[str, object]) -> Quota:
    """Parse an ElasticQuota.

    A malformed ``max`` entry fails *closed*: that resource gets a max of 0 (nothing requesting it
    is admitted) rather than silently becoming unlimited by being dropped. A malformed namespaces
    annotation fails closed too: the quota is bound to its own namespace only.
    """
    r = _Reader()
    raw = r.obj(raw, "")
    name, namespace, meta = _metadata(r, raw)
    spec = r.obj(raw.get("spec"), "spec")
    labels = r.str_map(meta.get("labels"), "metadata.labels")
    annotations = r.str_map(meta.get("annotations"), "metadata.annotations")
    extra, problems = parse_namespaces_annotation(annotations.get(names.QUOTA_NAMESPACES_ANNOTATION, ""))
    r.problems.extend(problems)
    cap, problem = parse_user_priority_cap(annotations.get(names.MAX_USER_PRIORITY_ANNOTATION))
    if problem is not None:
        r.problems.append(problem)
    allowed, problem = parse_allowed_priority_classes(
        annotations.get(names.ALLOWED_PRIORITY_CLASSES_ANNOTATION)
    )
    if problem is not None:
        r.problems.append(problem)
    weight = parse_shared_weight(annotations.get(names.QUOTA_SHARED_WEIGHT_ANNOTATION))
    if isinstance(weight, str):
        r.problems.append(weight)
        weight = None
    minimum, _ = r.resources(spec.get("min"), "spec.min")
    maximum, ok = r.resources(spec.get("max"), "spec.max")
    if not ok:
        for key in r.obj(spec.get("max"), "spec.max"):
            maximum.setdefault(str(key), 0)
        maximum = dict(sorted(maximum.items()))
    pool = labels.get(names.QUOTA_PROFILE_LABEL, "") if _is_pool_root(labels) else ""
    if pool:
        maximum = dict(minimum)  # a pool's root admits what its nodes hold (docs/pools.md#a-tree-roots-limit)
    return Quota(
        name=name,
        namespace=namespace,
        parent=labels.get(names.QUOTA_PARENT_LABEL, "") or "",
        min=minimum,
        max=maximum,
        labels=labels,
        annotations=annotations,
        problems=tuple(r.problems),
        uid=r.text(meta.get("uid"), "metadata.uid"),
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        extra_namespaces=extra,
        max_user_priority=cap,
        is_parent=labels.get(names.QUOTA_IS_PARENT_LABEL, "").strip().lower() == "true",
        lends=labels.get(names.QUOTA_ALLOW_LENT_LABEL, "").strip().lower() != "false",
        shared_weight=weight,
        allowed_priority_classes=allowed,
        pool=pool,
        pool_quotas=name_list(annotations.get(names.POOL_QUOTAS_ANNOTATION, "")),
    )


def _is_pool_root(labels: Mapping[str, str]) -> bool:
    return labels.get(names.QUOTA_IS_ROOT_LABEL, "").strip().lower() == "true" and bool(
        labels.get(names.QUOTA_PROFILE_LABEL)
    )

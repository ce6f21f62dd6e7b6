"""Admission decisions: AdmissionReview in, AdmissionReview response out, no I/O
(docs/architecture.md#decision-6-a-stateless-scoped-webhook).

The webhook server (``webhook/server.py``) parses the HTTP body and calls :func:`review`; everything
that decides lives here so it can be tested as a table and fuzzed without a socket.

* **mutate** (CREATE only): a job of an enabled, managed kind gets its adapter's ``suspend_patch``
  as a JSON Patch, always: nothing the user sends on CREATE (a status, a deletion timestamp) counts
  as a sign that it already runs. Anything else is allowed untouched, so an outage of our logic can
  never change an unrelated object.
* **validate** (CREATE and UPDATE): job scheduling annotations; the queue's hold on a job, which
  depends on nothing the job's owner can edit (docs/architecture.md#trust-boundaries): a managed
  job arrives held, and while it is unfinished only the reconciler may release it, change the
  system annotations, remove a template's scheduling gate or change the quota label; the status of
  a kind without a status subresource belongs to its controller; kind-specific rules from the
  adapter (``admission_errors``); Queue, QueueUnit and ElasticQuota objects. On UPDATE only
  problems the old object did not already have are reported for our own objects
  (``validation.ratchet``), so finalizer removal and status moves on legacy objects are never
  blocked. The reconciler's own writes skip validation: it must be able to act on whatever users
  created before the webhook existed. The guards an UPDATE of a queued job meets are
  ``shared.admission.jobguards``.

A body that is not an ``admission.k8s.io/v1`` AdmissionReview raises :class:`MalformedReview`; the
server answers HTTP 400 with its message. Every other input yields a well-formed response: job
adapters report unreadable specs as :class:`~shared.jobs.base.JobSpecError`, which becomes a denial
with the field path.
"""

from __future__ import annotations

import binascii
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, TypeGuard

import orjson

from koord_queue.shared.admission import jobguards, validation
from koord_queue.shared.admission.validation import FieldError
from koord_queue.shared.api import names
from koord_queue.shared.core import mandatory, workloadref
from koord_queue.shared.jobs import base, batch_job, patches, ray, registry
from koord_queue.shared.jobs.base import JobAdapter, JobSpecError, JobStatus

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
DEFAULT_RECONCILER_USERNAME: Final = "system:serviceaccount:koord-queue:koord-queue-reconciler"
#: Argo's workflow controller (the ServiceAccount of its default install): it writes Workflow status,
#: which has no subresource, so it is trusted with that field.
DEFAULT_STATUS_WRITERS: Final = frozenset({"system:serviceaccount:argo:argo"})
_OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
_UPDATE: Final = "UPDATE"
_WRITES: Final = ("CREATE", _UPDATE)
_QUEUE: Final = (names.API_VERSION, "Queue")
_QUEUE_UNIT: Final = (names.API_VERSION, "QueueUnit")
_ELASTIC_QUOTA: Final = (names.QUOTA_API_VERSION, "ElasticQuota")
_FINISHED: Final = (JobStatus.SUCCEEDED, JobStatus.FAILED)
_OBJECT_CHECKS: Final = {
    _QUEUE: validation.validate_queue,
    _QUEUE_UNIT: validation.validate_queue_unit,
    _ELASTIC_QUOTA: validation.validate_elastic_quota,
}


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Parsed JSON objects are plain dicts; the ABC check is only needed for other mappings (slow).
    return type(value) is dict or isinstance(value, Mapping)


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 we can answer (HTTP 400)."""


class Operation(enum.StrEnum):
    MUTATE = "mutate"
    VALIDATE = "validate"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """What the webhook is told at start-up; unknown extension names fail construction."""

    enabled_extensions: frozenset[str] = field(default_factory=lambda: frozenset(registry.DEFAULT_EXTENSIONS))
    reconciler_username: str = DEFAULT_RECONCILER_USERNAME
    status_writers: frozenset[str] = DEFAULT_STATUS_WRITERS
    #: The cluster's cap on the priority annotation (``maxUserPriority``); None: no cap.
    max_user_priority: int | None = None
    #: Native gang hand-off (``shared.core.workloadref``): whether the Workload API is served; None: off.
    native_gangs: workloadref.ServedProbe | None = None

    def __post_init__(self) -> None:
        registry.enabled_adapters(self.enabled_extensions)


class AdmissionRequest(NamedTuple):
    """The parts of ``AdmissionReview.request`` the decisions read, type-checked.

    A named tuple (immutable like a frozen dataclass, but built in a fraction of the time: one is
    made per review).
    """

    uid: str
    api_version: str
    kind: str
    operation: str
    sub_resource: str
    namespace: str
    name: str
    username: str
    obj: Mapping[str, Any] | None
    old_obj: Mapping[str, Any] | None


def _string(request: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    value = request.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise MalformedReview(f"request.{key} must be a {'non-empty ' if required else ''}string")
    return value


def _object(request: Mapping[str, Any], key: str, *, required: bool) -> Mapping[str, Any] | None:
    value = request.get(key)
    if value is None and not required:
        return None
    if not _is_mapping(value):
        raise MalformedReview(f"request.{key} must be an object")
    return value


def parse_review(body: object) -> AdmissionRequest:
    """Check the envelope of an AdmissionReview and extract its request."""
    # ``type(x) is dict`` / ``type(x) is str`` short-cut the checks for what orjson produces; the
    # general checks (``_is_mapping``, ``_string``, ``_object``) decide everything else.
    if type(body) is not dict and not _is_mapping(body):
        raise MalformedReview("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != REVIEW_API_VERSION or body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"only {REVIEW_API_VERSION} AdmissionReview is supported")
    request = body.get("request")
    if type(request) is not dict and not _is_mapping(request):
        raise MalformedReview("request must be an object")
    uid = request.get("uid")
    if type(uid) is not str or not uid:
        uid = _string(request, "uid", required=True)
    kind = request.get("kind")
    if type(kind) is not dict and not _is_mapping(kind):
        raise MalformedReview("request.kind must be an object")
    group, version, kind_name = kind.get("group", ""), kind.get("version"), kind.get("kind")
    if (
        not (isinstance(group, str) and isinstance(version, str) and isinstance(kind_name, str))
        or not version
        or not kind_name
    ):
        raise MalformedReview("request.kind must hold string group, version and kind")
    operation = request.get("operation")
    if type(operation) is not str or not operation:
        operation = _string(request, "operation", required=True)
    if operation not in _OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {', '.join(sorted(_OPERATIONS))}")
    user = request.get("userInfo")
    if user is not None and type(user) is not dict and not _is_mapping(user):
        raise MalformedReview("request.userInfo must be an object")
    username = (user or {}).get("username", "")
    if not isinstance(username, str):
        raise MalformedReview("request.userInfo.username must be a string")
    sub_resource, namespace, name = request.get("subResource"), request.get("namespace"), request.get("name")
    obj, old_obj = request.get("object"), request.get("oldObject")
    return AdmissionRequest(
        uid=uid,
        api_version=f"{group}/{version}" if group else str(version),
        kind=str(kind_name),
        operation=operation,
        sub_resource=sub_resource if type(sub_resource) is str else _string(request, "subResource"),
        namespace=namespace if type(namespace) is str else _string(request, "namespace"),
        name=name if type(name) is str else _string(request, "name"),
        username=username,
        obj=obj if type(obj) is dict else _object(request, "object", required=operation in _WRITES),
        old_obj=old_obj
        if type(old_obj) is dict
        else _object(request, "oldObject", required=operation == _UPDATE),
    )


# --- responses -----------------------------------------------------------------------------------


def allow(uid: str) -> dict[str, Any]:
    return {"uid": uid, "allowed": True}


def deny(uid: str, errors: list[FieldError]) -> dict[str, Any]:
    """A denial listing every error; 403 when every error is a policy refusal, else 422."""
    forbidden = all(e.message.startswith("Forbidden") for e in errors)
    code, reason = (403, "Forbidden") if forbidden else (422, "Invalid")
    status = {"code": code, "reason": reason, "message": validation.aggregate(errors)}
    return {"uid": uid, "allowed": False, "status": status}


def patched(uid: str, ops: list[base.JsonPatchOp]) -> dict[str, Any]:
    # Compact UTF-8 JSON: orjson, with the standard library for what orjson refuses.
    try:
        encoded = orjson.dumps(ops)
    except orjson.JSONEncodeError:  # lone surrogates, integers over 64 bits, non-string keys, ...
        encoded = json.dumps(ops, separators=(",", ":"), ensure_ascii=False).encode()
    return {
        "uid": uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": binascii.b2a_base64(encoded, newline=False).decode("ascii"),  # = base64.b64encode
    }


# --- decisions -----------------------------------------------------------------------------------


def review(
    body: object, *, operation: Operation, config: AdmissionConfig, now_text: str, all_jobs: bool = False
) -> dict[str, Any]:
    """A full AdmissionReview answer to ``body``; raises :class:`MalformedReview` only."""
    request = parse_review(body)
    response = decide(request, operation=operation, config=config, now_text=now_text, all_jobs=all_jobs)
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def decide(
    request: AdmissionRequest,
    *,
    operation: Operation,
    config: AdmissionConfig,
    now_text: str,
    all_jobs: bool = False,
) -> dict[str, Any]:
    """The ``response`` part for an already parsed request.

    ``all_jobs``: the review came through the webhooks registered for the namespaces where queueing
    is mandatory (``/mutate-unlabelled``, ``/validate-unlabelled``), so an unlabelled job is managed
    as if it carried a quota label (docs/operations.md#mandatory-queueing). The webhook cannot read
    namespace labels; the registration's namespace selector made that choice.
    """
    if operation is Operation.MUTATE:
        return _mutate(request, config=config, now_text=now_text, all_jobs=all_jobs)
    errors = _validate(request, config=config, all_jobs=all_jobs)
    return deny(request.uid, errors) if errors else allow(request.uid)


def _adapter(request: AdmissionRequest, config: AdmissionConfig) -> JobAdapter | None:
    adapter = registry.by_kind(request.api_version, request.kind)
    return adapter if adapter is not None and adapter.extension in config.enabled_extensions else None


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    return bool(base.metadata_field(obj, "deletionTimestamp"))


def _with_namespace(job: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """On CREATE the namespace often lives only in the request; the adapters read it from the job."""
    metadata = job.get("metadata")
    if not namespace or not _is_mapping(metadata) or base.namespace_of(job):
        return job
    return {**job, "metadata": {**metadata, "namespace": namespace}}


def _mutate(
    request: AdmissionRequest, *, config: AdmissionConfig, now_text: str, all_jobs: bool = False
) -> dict[str, Any]:
    """Hold every managed job on CREATE, whatever else it claims.

    Nothing a user sends on CREATE counts as a sign that the job has already started: the
    apiserver drops ``status`` and ``deletionTimestamp`` only *after* mutating admission, so a job
    created with a made-up ``status.startTime`` would otherwise be stored unsuspended. For a kind
    whose CRD has no status subresource the apiserver keeps what the user sent, so the status is
    removed here (docs/architecture.md#trust-boundaries).
    """
    adapter = _adapter(request, config)
    job = request.obj
    if request.operation != "CREATE" or request.sub_resource or adapter is None or job is None:
        return allow(request.uid)
    if not mandatory.is_managed(adapter, job, mandatory=all_jobs):
        ops = _gate_claimed_child(adapter, _with_namespace(job, request.namespace), all_jobs=all_jobs)
        return patched(request.uid, ops) if ops else allow(request.uid)
    job = _with_namespace(job, request.namespace)
    try:
        ops = adapter.suspend_patch(job, now_text=now_text)
    except JobSpecError as err:
        return deny(request.uid, [validation.from_spec_error(err)])
    if config.native_gangs is not None:  # docs/compatibility.md#native-gang-hand-off
        ops = [*ops, *workloadref.stamp_ops(adapter, job, ops, config.native_gangs)]
    if not adapter.status_subresource and job.get("status") is not None:
        ops = [*ops, {"op": "remove", "path": "/status"}]
    if request.username != config.reconciler_username:
        # The validating webhook's CREATE checks, on the job as it will be stored: the validating
        # webhook is called on UPDATE only (docs/architecture.md#decision-6-a-stateless-scoped-webhook).
        try:
            held = patches.applied(job, ops)
        except JobSpecError as err:
            return deny(request.uid, [validation.from_spec_error(err)])
        refused = _validate_job(adapter, held, None, config=config, user=request.username, all_jobs=all_jobs)
        if refused:
            return deny(request.uid, refused)
    return patched(request.uid, ops) if ops else allow(request.uid)


def _gate_claimed_child(
    adapter: JobAdapter, job: Mapping[str, Any], *, all_jobs: bool
) -> list[base.JsonPatchOp]:
    """A ``batch/v1`` Job or a RayCluster that would be queued (a quota label, or a namespace where
    queueing is mandatory) but claims a parent of a kind we queue: its pods are gated, unsuspended,
    naming the claimed parent's QueueUnit (``batch_job.gate_claimed_child``,
    ``ray.gate_claimed_cluster``). The webhook cannot read the
    parent, so the claim is the reconciler's to resolve; until it has, no pod of the Job can be
    scheduled (docs/architecture.md#trust-boundaries)."""
    if isinstance(adapter, batch_job.BatchJobAdapter):
        claim = batch_job.claimed_parent(job, registry.PARENT_GROUPS)
    elif isinstance(adapter, ray.RayClusterAdapter):  # docs/compatibility.md#raycluster
        claim = ray.claimed_parent(job)
    else:
        return []
    if claim is None or (adapter.quota_name(job) is None and not all_jobs):
        return []
    parent = registry.by_kind(claim.api_version, claim.kind)
    unit = parent.queue_unit_name({"metadata": {"name": claim.name}}) if parent is not None else ""
    ref = f"{base.namespace_of(job)}/{unit}" if unit and base.namespace_of(job) else None
    if isinstance(adapter, ray.RayClusterAdapter):
        return ray.gate_claimed_cluster(job, parent_unit_ref=ref)
    return batch_job.gate_claimed_child(job, parent_unit_ref=ref)


def _guard_claimed_gate(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any] | None, *, all_jobs: bool
) -> list[FieldError]:
    """The gate the mutating webhook put on the template of a Job claiming a parent
    (:func:`_gate_claimed_child`) stays until the Job finishes; only the reconciler (whose writes
    skip validation) may lift it.

    Such a Job is not managed at the door, so no other rule holds it: once the reconciler has held
    a forged one (its template may change while it is suspended), its owner could otherwise remove
    the gate and unsuspend it, and its pods would be schedulable until the reconciler held it
    again (docs/architecture.md#trust-boundaries). A real child's controller never removes it: the
    parent's own template, which it copies, keeps its gate (pods are released one by one).
    """
    if old is None or not isinstance(adapter, batch_job.BatchJobAdapter):
        return []
    if batch_job.claimed_parent(old, registry.PARENT_GROUPS) is None or (
        adapter.quota_name(old) is None and not all_jobs
    ):
        return []
    if adapter.job_status(old) in _FINISHED or not _template_gated(old) or _template_gated(new):
        return []
    detail = (
        f"the scheduling gate {names.ADMISSION_GATE} holds the pods of a Job claiming a parent until "
        "koord-queue has resolved the claim and admits them; it cannot be removed from the pod template"
    )
    return [validation.forbidden("spec.template.spec.schedulingGates", detail)]


def _template_gated(job: Mapping[str, Any]) -> bool:
    gates = base.dig(job, "spec", "template", "spec", "schedulingGates")
    return isinstance(gates, list) and any(base.dig(g, "name") == names.ADMISSION_GATE for g in gates)


def _validate(
    request: AdmissionRequest, *, config: AdmissionConfig, all_jobs: bool = False
) -> list[FieldError]:
    new = request.obj
    if request.operation not in ("CREATE", "UPDATE") or new is None or request.sub_resource:
        return []
    if request.username == config.reconciler_username:
        return []
    old = request.old_obj if request.operation == "UPDATE" else None
    check = _OBJECT_CHECKS.get((request.api_version, request.kind))
    if check is not None:
        if _being_deleted(new):
            return []
        return validation.ratchet(check(new), check(old) if old is not None else [])
    if old is not None and _queued_rayjobs_cluster(request, old, config=config, all_jobs=all_jobs):
        return jobguards.guard_rayjob_cluster(_RAY_CLUSTERS, new, old, user=request.username)
    adapter = _adapter(request, config)
    if adapter is None:
        return []
    return _validate_job(adapter, new, old, config=config, user=request.username, all_jobs=all_jobs)


def _validate_job(
    adapter: JobAdapter,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    *,
    config: AdmissionConfig,
    user: str,
    all_jobs: bool = False,
) -> list[FieldError]:
    """Every rule a namespace user's write of a job of a managed kind must pass.

    The hold rules are checked whether or not the job is being deleted: a finalizer keeps a
    deleted job in the API, and it must not be released past the queue meanwhile.
    """
    managed_new = mandatory.is_managed(adapter, new, mandatory=all_jobs)
    managed_old = old is not None and mandatory.is_managed(adapter, old, mandatory=all_jobs)
    if not managed_new and not managed_old:
        return _guard_claimed_gate(adapter, new, old, all_jobs=all_jobs)
    errors: list[FieldError] = []
    new_annotations = base.annotations_of(new)
    old_annotations = base.annotations_of(old) if old is not None else None
    if managed_new:
        errors += validation.validate_job_annotations(
            new_annotations, unchanged=old_annotations, max_priority=config.max_user_priority
        )
    if not adapter.status_subresource and user not in config.status_writers:
        errors += jobguards.guard_status(adapter, new, old)
    if old is None or not managed_old:
        # CREATE, or a job joining the queue by gaining a quota label: it must arrive held.
        errors += jobguards.guard_arrival(
            adapter, new, new_annotations, old_annotations, joining=old is not None
        )
        errors += _kind_rules(adapter, None, new)
        return errors
    assert old_annotations is not None
    errors += jobguards.guard_queue_hold(
        adapter, new, old, new_annotations, old_annotations, reconciler=config.reconciler_username
    )
    if adapter.job_status(old) not in _FINISHED:
        if not managed_new:
            errors += jobguards.guard_still_managed(adapter, new, old)
        elif not jobguards.system_controller(user):
            errors += jobguards.guard_owners(adapter, new, old)
    # Every write: a kind may need a rule after its job finished (the Spark operator re-runs a
    # finished application whose spec changes), and each adapter decides what "finished" frees.
    errors += _kind_rules(adapter, old, new)
    return errors


def _kind_rules(
    adapter: JobAdapter, old: Mapping[str, Any] | None, new: Mapping[str, Any]
) -> list[FieldError]:
    return [validation.from_spec_error(err) for err in adapter.admission_errors(old, new)]


#: The RayCluster adapter, whether or not the ``raycluster`` extension is on: a RayJob's cluster is
#: guarded whenever RayJobs are queued. Its paths are the same in ``ray.io/v1alpha1``.
_RAY_CLUSTERS: Final = ray.RayClusterAdapter()
_RAYJOB_EXTENSIONS: Final = frozenset(
    a.extension for a in registry.ADAPTERS if isinstance(a, ray.RayJobAdapter)
)
#: A cluster claiming a RayJob is guarded where RayJobs are queued, and where RayClusters are: there
#: a forged claim's cluster, gated at the door, must keep its gates until the reconciler queues it.
_RAY_CLUSTER_GUARDS: Final = _RAYJOB_EXTENSIONS | {_RAY_CLUSTERS.extension}


def _queued_rayjobs_cluster(
    request: AdmissionRequest, old: Mapping[str, Any], *, config: AdmissionConfig, all_jobs: bool
) -> bool:
    """``old`` is the RayCluster KubeRay made for a queued RayJob: RayJobs are queued
    (an enabled ``rayjob`` extension; or ``raycluster``, so that a cluster claiming a RayJob keeps
    its gates until its claim is resolved), its controller (or, once orphaned, KubeRay's origin
    labels) names a RayJob, it is not queued as its own (the origin label alone claims nothing,
    docs/compatibility.md#raycluster), and it would be queued itself but for that parent (KubeRay
    copies the RayJob's labels, the quota label included, onto the cluster; where queueing is
    mandatory the unlabelled webhook sends it here)."""
    if request.kind != "RayCluster" or request.api_version.partition("/")[0] != "ray.io":
        return False
    if not _RAY_CLUSTER_GUARDS & config.enabled_extensions or ray.parent_job(old) is None:
        return False
    if "raycluster" in config.enabled_extensions and mandatory.is_managed(
        _RAY_CLUSTERS, old, mandatory=all_jobs
    ):
        return False  # queued as its own (an origin label alone claims nothing): a managed job's rules
    return all_jobs or _RAY_CLUSTERS.quota_name(old) is not None

"""Admission decisions: AdmissionReview in, AdmissionReview response out, no I/O (decision 6).

The webhook server (``webhook/server.py``) parses the HTTP body and calls :func:`review`; everything
that decides lives here so it can be tested as a table and fuzzed without a socket.

* **mutate** (CREATE only): an enabled, managed job kind that has not started and is not being
  deleted gets its adapter's ``suspend_patch`` as a JSON Patch. Anything else is allowed untouched,
  so an outage of our logic can never change an unrelated object.
* **validate** (CREATE and UPDATE): job scheduling annotations; the queue's hold on a job (a queued
  job may be resumed only by the reconciler, the dequeue stamp is the reconciler's, the quota label
  is frozen while the job holds quota); Queue, QueueUnit and ElasticQuota objects. On UPDATE only
  problems the old object did not already have are reported (``validation.ratchet``), so finalizer
  removal and status moves on legacy objects are never blocked. The reconciler's own writes skip
  validation: it must be able to act on whatever users created before the webhook existed.

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

from shared import names, validation
from shared.jobs import base, registry
from shared.jobs.base import JobAdapter, JobSpecError, JobStatus
from shared.validation import FieldError

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
DEFAULT_RECONCILER_USERNAME: Final = "system:serviceaccount:koord-queue:koord-queue-reconciler"
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


def review(body: object, *, operation: Operation, config: AdmissionConfig, now_text: str) -> dict[str, Any]:
    """A full AdmissionReview answer to ``body``; raises :class:`MalformedReview` only."""
    request = parse_review(body)
    response = decide(request, operation=operation, config=config, now_text=now_text)
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def decide(
    request: AdmissionRequest, *, operation: Operation, config: AdmissionConfig, now_text: str
) -> dict[str, Any]:
    """The ``response`` part for an already parsed request."""
    if operation is Operation.MUTATE:
        return _mutate(request, config=config, now_text=now_text)
    errors = _validate(request, config=config)
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


def _mutate(request: AdmissionRequest, *, config: AdmissionConfig, now_text: str) -> dict[str, Any]:
    adapter = _adapter(request, config)
    job = request.obj
    if request.operation != "CREATE" or request.sub_resource or adapter is None or job is None:
        return allow(request.uid)
    if not adapter.is_managed(job) or _being_deleted(job) or adapter.has_started(job):
        return allow(request.uid)
    try:
        ops = adapter.suspend_patch(_with_namespace(job, request.namespace), now_text=now_text)
    except JobSpecError as err:
        return deny(request.uid, [validation.from_spec_error(err)])
    return patched(request.uid, ops) if ops else allow(request.uid)


def _validate(request: AdmissionRequest, *, config: AdmissionConfig) -> list[FieldError]:
    new = request.obj
    if request.operation not in ("CREATE", "UPDATE") or new is None or request.sub_resource:
        return []
    if _being_deleted(new) or request.username == config.reconciler_username:
        return []
    old = request.old_obj if request.operation == "UPDATE" else None
    check = _OBJECT_CHECKS.get((request.api_version, request.kind))
    if check is not None:
        return validation.ratchet(check(new), check(old) if old is not None else [])
    adapter = _adapter(request, config)
    if adapter is None:
        return []
    return _validate_job(adapter, new, old, reconciler=config.reconciler_username)


def _validate_job(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any] | None, *, reconciler: str
) -> list[FieldError]:
    managed_old = old is not None and adapter.is_managed(old)
    errors: list[FieldError] = []
    # Each object's annotations are read once (``annotations_of`` copies the string entries).
    new_annotations: dict[str, str] | None = None
    old_annotations = base.annotations_of(old) if old is not None else None
    if adapter.is_managed(new):
        new_annotations = base.annotations_of(new)
        errors += validation.validate_job_annotations(new_annotations, unchanged=old_annotations)
    if old is not None and old_annotations is not None and managed_old:
        if new_annotations is None:
            new_annotations = base.annotations_of(new)
        errors += _guard_queue_hold(
            adapter, new, old, new_annotations, old_annotations, reconciler=reconciler
        )
    return errors


def _guard_queue_hold(
    adapter: JobAdapter,
    new: Mapping[str, Any],
    old: Mapping[str, Any],
    new_annotations: Mapping[str, str],
    old_annotations: Mapping[str, str],
    *,
    reconciler: str,
) -> list[FieldError]:
    """The rules that keep a user from starting a queued job past the queue."""
    errors: list[FieldError] = []
    dequeue_key = names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
    dequeued = base.dequeued_in(old_annotations)
    if base.enqueued_in(old_annotations) and not dequeued:
        after = adapter.suspend_state(new)
        for path, held in adapter.suspend_state(old).items():
            if held and not after.get(path, False):
                unit = f"{base.namespace_of(old)}/{adapter.queue_unit_name(old)}"
                detail = (
                    f"the job is queued by koord-queue; it is resumed automatically when its "
                    f"QueueUnit {unit} is admitted; only {reconciler} may resume it"
                )
                errors.append(validation.forbidden(path, detail))
    before_stamp = old_annotations.get(dequeue_key) or ""
    if (new_annotations.get(dequeue_key) or "") != before_stamp:
        detail = f"set only by {reconciler} when koord-queue admits the job"
        errors.append(validation.forbidden(f"metadata.annotations[{dequeue_key}]", detail))
    if not dequeued:  # (checked first: the quota names are only compared for an admitted job)
        return errors
    old_quota, new_quota = adapter.quota_name(old), adapter.quota_name(new)
    if old_quota != new_quota and adapter.job_status(old) not in _FINISHED:
        label = names.QUOTA_NAME_LABEL
        if names.QUOTA_NAME_LABEL not in base.labels_of(old) | base.labels_of(new):
            label = names.QUOTA_NAME_LABEL_FALLBACK
        detail = (
            f"the job is admitted and holds resources of quota {old_quota!r}; the quota cannot change "
            "until the job finishes (delete and re-create the job to move it)"
        )
        errors.append(validation.forbidden(f"metadata.labels[{label}]", detail))
    return errors

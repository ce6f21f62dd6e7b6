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

import base64
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shared import names, validation
from shared.jobs import base, registry
from shared.jobs.base import JobAdapter, JobSpecError, JobStatus
from shared.validation import FieldError

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
DEFAULT_RECONCILER_USERNAME: Final = "system:serviceaccount:koord-queue:koord-queue-reconciler"
_OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
_QUEUE: Final = (names.API_VERSION, "Queue")
_QUEUE_UNIT: Final = (names.API_VERSION, "QueueUnit")
_ELASTIC_QUOTA: Final = (names.QUOTA_API_VERSION, "ElasticQuota")
_FINISHED: Final = (JobStatus.SUCCEEDED, JobStatus.FAILED)


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


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The parts of ``AdmissionReview.request`` the decisions read, type-checked."""

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
    if not isinstance(value, Mapping):
        raise MalformedReview(f"request.{key} must be an object")
    return value


def parse_review(body: object) -> AdmissionRequest:
    """Check the envelope of an AdmissionReview and extract its request."""
    if not isinstance(body, Mapping):
        raise MalformedReview("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != REVIEW_API_VERSION or body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"only {REVIEW_API_VERSION} AdmissionReview is supported")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise MalformedReview("request must be an object")
    uid = _string(request, "uid", required=True)
    kind = request.get("kind")
    if not isinstance(kind, Mapping):
        raise MalformedReview("request.kind must be an object")
    group, version, kind_name = kind.get("group", ""), kind.get("version"), kind.get("kind")
    if not all(isinstance(v, str) for v in (group, version, kind_name)) or not version or not kind_name:
        raise MalformedReview("request.kind must hold string group, version and kind")
    operation = _string(request, "operation", required=True)
    if operation not in _OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {', '.join(sorted(_OPERATIONS))}")
    user = request.get("userInfo")
    if user is not None and not isinstance(user, Mapping):
        raise MalformedReview("request.userInfo must be an object")
    username = (user or {}).get("username", "")
    if not isinstance(username, str):
        raise MalformedReview("request.userInfo.username must be a string")
    return AdmissionRequest(
        uid=uid,
        api_version=f"{group}/{version}" if group else str(version),
        kind=str(kind_name),
        operation=operation,
        sub_resource=_string(request, "subResource"),
        namespace=_string(request, "namespace"),
        name=_string(request, "name"),
        username=username,
        obj=_object(request, "object", required=operation in ("CREATE", "UPDATE")),
        old_obj=_object(request, "oldObject", required=operation == "UPDATE"),
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
    encoded = json.dumps(ops, separators=(",", ":"), ensure_ascii=False).encode()
    return {
        "uid": uid,
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(encoded).decode("ascii"),
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
    return bool(base.dig(obj, "metadata", "deletionTimestamp"))


def _with_namespace(job: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """On CREATE the namespace often lives only in the request; the adapters read it from the job."""
    metadata = job.get("metadata")
    if not namespace or not isinstance(metadata, Mapping) or base.namespace_of(job):
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
    key = (request.api_version, request.kind)
    checks = {
        _QUEUE: validation.validate_queue,
        _QUEUE_UNIT: validation.validate_queue_unit,
        _ELASTIC_QUOTA: validation.validate_elastic_quota,
    }
    if key in checks:
        check = checks[key]
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
    if adapter.is_managed(new):
        unchanged = base.annotations_of(old) if old is not None else None
        errors += validation.validate_job_annotations(base.annotations_of(new), unchanged=unchanged)
    if old is not None and managed_old:
        errors += _guard_queue_hold(adapter, new, old, reconciler=reconciler)
    return errors


def _guard_queue_hold(
    adapter: JobAdapter, new: Mapping[str, Any], old: Mapping[str, Any], *, reconciler: str
) -> list[FieldError]:
    """The rules that keep a user from starting a queued job past the queue."""
    errors: list[FieldError] = []
    unit = f"{base.namespace_of(old)}/{adapter.queue_unit_name(old)}"
    dequeue_key = names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
    if base.is_enqueued(old) and not base.is_dequeued(old):
        after = adapter.suspend_state(new)
        for path, held in adapter.suspend_state(old).items():
            if held and not after.get(path, False):
                detail = (
                    f"the job is queued by koord-queue; it is resumed automatically when its "
                    f"QueueUnit {unit} is admitted; only {reconciler} may resume it"
                )
                errors.append(validation.forbidden(path, detail))
    before_stamp = base.annotations_of(old).get(dequeue_key) or ""
    if (base.annotations_of(new).get(dequeue_key) or "") != before_stamp:
        detail = f"set only by {reconciler} when koord-queue admits the job"
        errors.append(validation.forbidden(f"metadata.annotations[{dequeue_key}]", detail))
    old_quota, new_quota = adapter.quota_name(old), adapter.quota_name(new)
    if old_quota != new_quota and base.is_dequeued(old) and adapter.job_status(old) not in _FINISHED:
        label = names.QUOTA_NAME_LABEL
        if names.QUOTA_NAME_LABEL not in base.labels_of(old) | base.labels_of(new):
            label = names.QUOTA_NAME_LABEL_FALLBACK
        detail = (
            f"the job is admitted and holds resources of quota {old_quota!r}; the quota cannot change "
            "until the job finishes (delete and re-create the job to move it)"
        )
        errors.append(validation.forbidden(f"metadata.labels[{label}]", detail))
    return errors

"""Just enough of Kubernetes' protobuf storage encoding to read Pods and Jobs straight from etcd.

The apiserver stores built-in kinds as ``k8s\\x00`` + a ``runtime.Unknown`` message whose ``raw``
field holds the object's protobuf encoding (custom resources are stored as JSON and need none of
this). The observer reads etcd directly so that its history has no gaps when the apiserver
restarts or a watch expires; it needs only a handful of fields, so instead of generated code this
module walks the wire format and picks them by field number (from ``k8s.io/api`` v0.35
``generated.proto``; these numbers are frozen by the API's compatibility rules).

The result is a small JSON-shaped dict with the same field names as the API, e.g.
``{"metadata": {"name": ..., "annotations": {...}}, "spec": {"nodeName": ...}}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"


class DecodeError(ValueError):
    """The bytes are not the protobuf encoding this module expects."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise DecodeError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` pairs: ints for varints, bytes for length-delimited fields."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise DecodeError("truncated field")
            yield number, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise DecodeError("expected a length-delimited field")
    return value


def _map_entry(data: bytes) -> tuple[str, str]:
    key = value = ""
    for number, item in fields(data):
        if number == 1:
            key = _text(item)
        elif number == 2:
            value = _text(item)
    return key, value


def _time(data: bytes) -> int:
    return next((int(v) for n, v in fields(data) if n == 1 and isinstance(v, int)), 0)


def object_meta(data: bytes) -> dict[str, Any]:
    """``ObjectMeta``: name 1, namespace 3, uid 5, deletionTimestamp 9, labels 11, annotations 12,
    ownerReferences 13."""
    meta: dict[str, Any] = {"labels": {}, "annotations": {}, "ownerReferences": []}
    for number, value in fields(data):
        if number == 1:
            meta["name"] = _text(value)
        elif number == 3:
            meta["namespace"] = _text(value)
        elif number == 5:
            meta["uid"] = _text(value)
        elif number == 9:
            meta["deletionTimestamp"] = _time(_bytes(value))
        elif number == 11:
            k, v = _map_entry(_bytes(value))
            meta["labels"][k] = v
        elif number == 12:
            k, v = _map_entry(_bytes(value))
            meta["annotations"][k] = v
        elif number == 13:
            owner: dict[str, Any] = {}
            for n, item in fields(_bytes(value)):
                if n == 1:
                    owner["kind"] = _text(item)
                elif n == 3:
                    owner["name"] = _text(item)
                elif n == 4:
                    owner["uid"] = _text(item)
                elif n == 5:
                    owner["apiVersion"] = _text(item)
                elif n == 6:
                    owner["controller"] = bool(item)
            meta["ownerReferences"].append(owner)
    return meta


def _unwrap(value: bytes) -> bytes:
    """The object bytes inside the ``runtime.Unknown`` envelope (field 2, ``raw``)."""
    if not value.startswith(MAGIC):
        raise DecodeError("not a protobuf-encoded object (no k8s magic)")
    for number, item in fields(value[len(MAGIC) :]):
        if number == 2:
            return _bytes(item)
    raise DecodeError("no raw object in the envelope")


def pod(value: bytes) -> dict[str, Any]:
    """A Pod: metadata; spec.nodeName (10) and spec.schedulingGates (38, name 1); status.phase (1)."""
    out: dict[str, Any] = {"metadata": {}, "spec": {"nodeName": "", "schedulingGates": []}, "status": {}}
    for number, item in fields(_unwrap(value)):
        if number == 1:
            out["metadata"] = object_meta(_bytes(item))
        elif number == 2:
            for n, v in fields(_bytes(item)):
                if n == 10:
                    out["spec"]["nodeName"] = _text(v)
                elif n == 38:
                    gate = next((_text(g) for gn, g in fields(_bytes(v)) if gn == 1), "")
                    out["spec"]["schedulingGates"].append({"name": gate})
        elif number == 3:
            for n, v in fields(_bytes(item)):
                if n == 1:
                    out["status"]["phase"] = _text(v)
    return out


def job(value: bytes) -> dict[str, Any]:
    """A batch/v1 Job: metadata; spec.suspend (10); status conditions (1: type 1, status 2, reason 5),
    active (4), succeeded (5), failed (6)."""
    out: dict[str, Any] = {"metadata": {}, "spec": {"suspend": False}, "status": {"conditions": []}}
    for number, item in fields(_unwrap(value)):
        if number == 1:
            out["metadata"] = object_meta(_bytes(item))
        elif number == 2:
            for n, v in fields(_bytes(item)):
                if n == 10:
                    out["spec"]["suspend"] = bool(v)
        elif number == 3:
            status = out["status"]
            for n, v in fields(_bytes(item)):
                if n == 1:
                    cond = {"type": "", "status": "", "reason": ""}
                    for cn, cv in fields(_bytes(v)):
                        if cn == 1:
                            cond["type"] = _text(cv)
                        elif cn == 2:
                            cond["status"] = _text(cv)
                        elif cn == 5:
                            cond["reason"] = _text(cv)
                    status["conditions"].append(cond)
                elif n in (4, 5, 6):
                    status[{4: "active", 5: "succeeded", 6: "failed"}[n]] = (
                        int(v) if isinstance(v, int) else 0
                    )
    return out

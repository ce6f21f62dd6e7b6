"""Build RFC 6902 JSON Patches that apply cleanly to the object the apiserver holds.

The mutating webhook answers with a JSON Patch, and the apiserver rejects the whole admission if
one operation fails: adding ``/metadata/annotations/x`` when the object has no annotations map, or
appending to a ``schedulingGates`` list that does not exist. :class:`PatchBuilder` therefore keeps a
private (copy-on-write) view of the job, emits an ``add`` for every missing parent object *before* the
operation that needs it, applies each operation to the copy, and escapes every path segment
(``~`` -> ``~0``, ``/`` -> ``~1``, as annotation keys contain slashes). Operations that would not
change anything are not emitted, so mutating an already-mutated object yields a short, valid patch.

Merge patches (RFC 7386) for the reconciler are plain nested dicts; :func:`deep_merge` combines them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from shared.jobs.base import JobSpecError, JsonPatchOp, Segment, dig, field_path


def escape(segment: Segment) -> str:
    """One JSON Pointer reference token (RFC 6901 §3)."""
    return str(segment).replace("~", "~0").replace("/", "~1")


def pointer(segments: Sequence[Segment]) -> str:
    return "".join("/" + escape(s) for s in segments)


def _same(a: object, b: object) -> bool:
    # True == 1 in Python; a patch must still turn 1 into true.
    return type(a) is type(b) and a == b


class PatchBuilder:
    """Accumulates operations against a working view of ``doc``; read the result from ``ops``.

    The view is copy-on-write: only the containers along a touched path are (shallowly) copied, so
    the caller's object is never modified and a large or deeply nested job costs no deep copy.
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc: dict[str, Any] = dict(doc)
        self._owned: set[int] = {id(self._doc)}
        self.ops: list[JsonPatchOp] = []

    def get(self, segments: Sequence[Segment]) -> Any:
        """The current value (after the operations so far) at ``segments``, or ``None``."""
        return dig(self._doc, *segments)

    def _own(self, value: Any) -> Any:
        """A private shallow copy of a container from the original document (once)."""
        if id(value) in self._owned:
            return value
        copied: Any = dict(value) if isinstance(value, Mapping) else list(value)
        self._owned.add(id(copied))
        return copied

    def ensure_object(self, segments: Sequence[Segment]) -> dict[str, Any]:
        """The object at ``segments``, creating it and every missing (or null) parent object.

        The builder walks into existing lists (worker groups) but never invents list items.
        """
        node: Any = self._doc
        for depth, seg in enumerate(segments):
            here = segments[: depth + 1]
            wants_list = depth + 1 < len(segments) and isinstance(segments[depth + 1], int)
            if isinstance(seg, int):
                if not isinstance(node, list) or not 0 <= seg < len(node):
                    raise JobSpecError(field_path(here), "Not found")
                child = node[seg]
            else:
                child = node.get(seg)
                if child is None and not wants_list:
                    child = {}
                    self._owned.add(id(child))
                    self._emit("add", here, {})
            if wants_list and isinstance(child, list):
                pass
            elif not isinstance(child, Mapping):
                raise JobSpecError(field_path(here), "Invalid value: must be an object")
            child = self._own(child)
            node[seg] = child
            node = child
        result: dict[str, Any] = node
        return result

    def set(self, segments: Sequence[Segment], value: Any) -> None:
        """Set an object member (``add`` replaces an existing member per RFC 6902 §4.1)."""
        *parent_path, key = segments
        if not isinstance(key, str):
            raise TypeError("set() addresses object members; use append_unique() for lists")
        parent = self.ensure_object(parent_path)
        if key in parent and _same(parent[key], value):
            return
        self._emit("add", segments, value)
        parent[key] = copy.deepcopy(value)

    def remove(self, segments: Sequence[Segment]) -> None:
        """Remove an object member when present."""
        *parent_path, key = segments
        current = self.get(parent_path)
        if isinstance(current, Mapping) and isinstance(key, str) and key in current:
            parent = self.ensure_object(parent_path)
            self.ops.append({"op": "remove", "path": pointer(segments)})
            del parent[key]

    def append_unique(self, segments: Sequence[Segment], item: Mapping[str, Any], *, key: str) -> None:
        """Append ``item`` to the list at ``segments`` unless an item with the same ``key`` exists.

        A missing or null list is created holding ``item`` in a single ``add``.
        """
        *parent_path, last = segments
        if not isinstance(last, str):
            raise TypeError("append_unique() addresses a list held by an object member")
        parent = self.ensure_object(parent_path)
        current = parent.get(last)
        if current is None:
            self._emit("add", segments, [item])
            parent[last] = [copy.deepcopy(dict(item))]
            return
        if not isinstance(current, list):
            raise JobSpecError(field_path(segments), "Invalid value: must be a list")
        if any(isinstance(x, Mapping) and x.get(key) == item.get(key) for x in current):
            return
        self.ops.append({"op": "add", "path": pointer(segments) + "/-", "value": copy.deepcopy(dict(item))})
        owned = self._own(current)
        owned.append(copy.deepcopy(dict(item)))
        parent[last] = owned

    def _emit(self, op: str, segments: Sequence[Segment], value: Any) -> None:
        self.ops.append({"op": op, "path": pointer(segments), "value": copy.deepcopy(value)})


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Combine two merge-patch bodies; values of ``extra`` win, nested objects merge."""
    merged: dict[str, Any] = dict(base)
    for key, value in extra.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = value
    return merged

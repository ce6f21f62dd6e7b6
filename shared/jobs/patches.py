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
from typing import Any, Final

from koord_queue.shared.jobs.base import JobSpecError, JsonPatchOp, Segment, dig, field_path


def escape(segment: Segment) -> str:
    """One JSON Pointer reference token (RFC 6901 §3)."""
    text = segment if type(segment) is str else str(segment)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


_POINTERS: dict[tuple[Segment, ...], str] = {}
_POINTERS_MAX: Final = 4096  # paths hold keys from the job (replica types): keep the memo bounded


def pointer(segments: Sequence[Segment]) -> str:
    """The JSON Pointer of ``segments`` (memoised for paths of plain strings, the common case)."""
    key = segments if type(segments) is tuple else tuple(segments)
    found = _POINTERS.get(key)
    if found is not None:
        return found
    tokens = []
    plain = True
    for segment in key:
        if type(segment) is str:
            text = segment
        else:
            plain = False
            text = str(segment)
        if "~" in text or "/" in text:
            text = text.replace("~", "~0").replace("/", "~1")
        tokens.append(text)
    result = "/" + "/".join(tokens) if tokens else ""
    if plain:  # only exact ``str`` paths: (1,) == (True,), but their pointers differ
        if len(_POINTERS) >= _POINTERS_MAX:
            _POINTERS.clear()
        _POINTERS[key] = result
    return result


_ATOMS: Final = frozenset({str, int, float, bool, type(None)})


def clone(value: Any) -> Any:
    """``copy.deepcopy`` for a decoded JSON document such as a pod template (several times faster:
    no memo, no dispatch per value); past 32 levels, or for any other type, it is deepcopy's."""
    return _clone(value, 0, 32)


def _clone(value: Any, depth: int = 0, limit: int = 4) -> Any:
    """``copy.deepcopy`` for the JSON values a patch carries, without its per-call overhead.

    Plain dicts, lists and immutable scalars are copied here (``limit`` levels deep); anything else,
    and anything deeper, is left to ``copy.deepcopy``.
    """
    kind = type(value)
    if kind in _ATOMS:
        return value
    if depth < limit:
        deeper = depth + 1
        if kind is dict:
            return {k: v if type(v) in _ATOMS else _clone(v, deeper, limit) for k, v in value.items()}
        if kind is list:
            return [v if type(v) in _ATOMS else _clone(v, deeper, limit) for v in value]
    return copy.deepcopy(value)


def _is_object(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


class PatchBuilder:
    """Accumulates operations against a working view of ``doc``; read the result from ``ops``.

    The view is copy-on-write: only the containers along a touched path are (shallowly) copied, so
    the caller's object is never modified and a large or deeply nested job costs no deep copy.
    The objects reached by :meth:`ensure_object` are remembered by path, so the next operation
    under the same parent (the common case: several annotations) does not walk from the root again;
    an operation that replaces or removes a container forgets the paths at and below it.
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc: dict[str, Any] = dict(doc)
        self._owned: set[int] = {id(self._doc)}
        self._objects: dict[tuple[Segment, ...], dict[str, Any]] = {(): self._doc}
        self.ops: list[JsonPatchOp] = []

    def get(self, segments: Sequence[Segment]) -> Any:
        """The current value (after the operations so far) at ``segments``, or ``None``."""
        return dig(self._doc, *segments)

    def _own(self, value: Any) -> Any:
        """A private shallow copy of a container from the original document (once)."""
        if id(value) in self._owned:
            return value
        copied: Any = dict(value) if _is_object(value) else list(value)
        self._owned.add(id(copied))
        return copied

    def ensure_object(self, segments: Sequence[Segment]) -> dict[str, Any]:
        """The object at ``segments``, creating it and every missing (or null) parent object.

        The builder walks into existing lists (worker groups) but never invents list items.
        """
        path = tuple(segments)
        objects = self._objects
        known = objects.get(path)
        if known is not None:
            return known
        return self._walk(path)

    def _walk(self, path: tuple[Segment, ...]) -> dict[str, Any]:
        """:meth:`ensure_object` from the deepest object already known on ``path``."""
        objects, owned = self._objects, self._owned
        size = len(path)
        depth = size - 1
        while depth and path[:depth] not in objects:
            depth -= 1
        node: Any = objects[path[:depth]]
        for seg in path[depth:]:
            depth += 1
            if type(seg) is str:
                child = node.get(seg)
                if type(child) is dict:  # the common step: an existing object member
                    if id(child) not in owned:
                        child = dict(child)
                        owned.add(id(child))
                        node[seg] = child
                    node = objects[path[:depth]] = child
                    continue
                if child is None and (depth == size or type(path[depth]) is str):
                    # a missing object member (not a list: no index follows): create it
                    child = {}
                    owned.add(id(child))
                    here = path[:depth]
                    self.ops.append({"op": "add", "path": pointer(here), "value": {}})
                    node[seg] = child
                    node = objects[here] = child
                    continue
            node = self._step(node, path, depth - 1)
        result: dict[str, Any] = node
        return result

    def _step(self, node: Any, path: tuple[Segment, ...], depth: int) -> Any:
        """One step of :meth:`_walk` into ``path[depth]``, in general (lists, nulls, other mappings)."""
        seg = path[depth]
        here = path[: depth + 1]
        wants_list = depth + 1 < len(path) and isinstance(path[depth + 1], int)
        if isinstance(seg, int):
            if not isinstance(node, list) or not 0 <= seg < len(node):
                raise JobSpecError(field_path(here), "Not found")
            child = node[seg]
        else:
            child = node.get(seg)
            if child is None and not wants_list:
                child = {}
                self._owned.add(id(child))
                self.ops.append({"op": "add", "path": pointer(here), "value": {}})
        if wants_list and isinstance(child, list):
            pass
        elif not _is_object(child):
            raise JobSpecError(field_path(here), "Invalid value: must be an object")
        child = self._own(child)
        node[seg] = child
        if type(child) is dict:
            self._objects[here] = child
        return child

    def _forget(self, segments: Sequence[Segment]) -> None:
        """The container at ``segments`` was replaced or removed: drop what is known at and below it."""
        prefix = tuple(segments)
        size = len(prefix)
        for path in [p for p in self._objects if p[:size] == prefix]:
            del self._objects[path]

    def set(self, segments: Sequence[Segment], value: Any) -> None:
        """Set an object member (``add`` replaces an existing member per RFC 6902 §4.1)."""
        if not segments:
            raise ValueError("set() needs a path")
        key = segments[-1]
        if not isinstance(key, str):
            raise TypeError("set() addresses object members; use append_unique() for lists")
        parent_path = tuple(segments[:-1])
        parent = self._objects.get(parent_path)
        if parent is None:
            parent = self._walk(parent_path)
        if key in parent:
            current = parent[key]
            if type(current) is type(value) and current == value:  # True == 1, yet 1 must become true
                return
            if type(current) in (dict, list):
                self._forget(segments)
        path = _POINTERS.get(segments) if type(segments) is tuple else None  # pointer(), memo inlined
        if path is None:
            path = pointer(segments)
        if type(value) in _ATOMS:
            self.ops.append({"op": "add", "path": path, "value": value})
            parent[key] = value
        else:
            self.ops.append({"op": "add", "path": path, "value": _clone(value)})
            parent[key] = _clone(value)

    def remove(self, segments: Sequence[Segment]) -> None:
        """Remove an object member when present."""
        *parent_path, key = segments
        current = self._objects.get(tuple(parent_path))
        if current is None:
            current = self.get(parent_path)
        if _is_object(current) and isinstance(key, str) and key in current:
            parent = self.ensure_object(parent_path)
            self.ops.append({"op": "remove", "path": pointer(segments)})
            if type(parent[key]) in (dict, list):
                self._forget(segments)
            del parent[key]

    def append_unique(self, segments: Sequence[Segment], item: Mapping[str, Any], *, key: str) -> None:
        """Append ``item`` to the list at ``segments`` unless an item with the same ``key`` exists.

        A missing or null list is created holding ``item`` in a single ``add``.
        """
        if not segments:
            raise ValueError("append_unique() needs a path")
        parent_path, last = segments[:-1], segments[-1]
        if not isinstance(last, str):
            raise TypeError("append_unique() addresses a list held by an object member")
        parent = self.ensure_object(parent_path)
        current = parent.get(last)
        if current is None:
            self.ops.append({"op": "add", "path": pointer(segments), "value": [_clone(item)]})
            parent[last] = [_clone(dict(item))]
            return
        if not isinstance(current, list):
            raise JobSpecError(field_path(segments), "Invalid value: must be a list")
        wanted = item.get(key)
        if any(_is_object(x) and x.get(key) == wanted for x in current):
            return
        self.ops.append({"op": "add", "path": pointer(segments) + "/-", "value": _clone(dict(item))})
        owned = self._own(current)
        if owned is not current:
            self._forget(segments)
        owned.append(_clone(dict(item)))
        parent[last] = owned


def unescape(token: str) -> str:
    """The inverse of :func:`escape`."""
    return token.replace("~1", "/").replace("~0", "~") if "~" in token else token


def applied(doc: Mapping[str, Any], ops: Sequence[JsonPatchOp]) -> dict[str, Any]:
    """``doc`` as the apiserver stores it after ``ops`` (``doc`` itself is left alone).

    Covers what :class:`PatchBuilder` and the webhook emit: ``add`` (``-`` appends to a list),
    ``replace``, ``remove``, and ``test`` (not checked: the ops come from the same view of the
    object). The webhook validates the held job it is about to answer with, so a job's CREATE
    needs one webhook call instead of two (docs/architecture.md#decision-6-a-stateless-scoped-webhook).
    A path that does not resolve raises ``JobSpecError``.
    """
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in ops:
        kind, path = op["op"], str(op["path"])
        if kind == "test":
            continue
        tokens = [unescape(t) for t in path.split("/")[1:]]
        node: Any = out
        try:
            for token in tokens[:-1]:
                node = node[int(token)] if isinstance(node, list) else node[token]
            last = tokens[-1]
            if isinstance(node, list):
                index = len(node) if last == "-" else int(last)
                if kind == "add":
                    node.insert(index, copy.deepcopy(op.get("value")))
                elif kind == "replace":
                    node[index] = copy.deepcopy(op.get("value"))
                else:
                    del node[index]
            elif kind == "remove":
                del node[last]
            else:
                node[last] = copy.deepcopy(op.get("value"))
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise JobSpecError(path, f"Internal error: the patch does not apply ({err!r})") from err
    return out


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

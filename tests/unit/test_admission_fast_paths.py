"""The admission request path's fast paths answer exactly what the plain code answers.

The webhook's hot path (``PatchBuilder``, ``dig``/``string_map``/``metadata_field``,
``parse_review``, the patch encoding, the per-second timestamp and the cached metric children) has
short-cuts for what orjson produces (plain ``dict``/``str``) and memoises what repeats. These tests
hold each short-cut to the straightforward version it replaces: the previous ``PatchBuilder``
(copy.deepcopy, a walk from the root for every operation) is kept below as the oracle and both are
run over generated documents and operation sequences, including other ``Mapping`` types, ``str``
subclasses, nulls and lists where objects are expected.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.api import names
from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import JobSpecError, JsonPatchOp, Segment, dig, field_path
from koord_queue.shared.jobs.patches import PatchBuilder, pointer
from koord_queue.webhook import server
from koord_queue.webhook.metrics import FLUSH_EVERY, Result, WebhookMetrics

# --- the oracle: the builder as it was before the fast paths -------------------------------------


def _ref_pointer(segments: Sequence[Segment]) -> str:
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in segments)


def _ref_same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


class ReferenceBuilder:
    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc: dict[str, Any] = dict(doc)
        self._owned: set[int] = {id(self._doc)}
        self.ops: list[JsonPatchOp] = []

    def get(self, segments: Sequence[Segment]) -> Any:
        return dig(self._doc, *segments)

    def _own(self, value: Any) -> Any:
        if id(value) in self._owned:
            return value
        copied: Any = dict(value) if isinstance(value, Mapping) else list(value)
        self._owned.add(id(copied))
        return copied

    def ensure_object(self, segments: Sequence[Segment]) -> dict[str, Any]:
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
        *parent_path, key = segments
        if not isinstance(key, str):
            raise TypeError("set() addresses object members; use append_unique() for lists")
        parent = self.ensure_object(parent_path)
        if key in parent and _ref_same(parent[key], value):
            return
        self._emit("add", segments, value)
        parent[key] = copy.deepcopy(value)

    def remove(self, segments: Sequence[Segment]) -> None:
        *parent_path, key = segments
        current = self.get(parent_path)
        if isinstance(current, Mapping) and isinstance(key, str) and key in current:
            parent = self.ensure_object(parent_path)
            self.ops.append({"op": "remove", "path": _ref_pointer(segments)})
            del parent[key]

    def append_unique(self, segments: Sequence[Segment], item: Mapping[str, Any], *, key: str) -> None:
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
        self.ops.append(
            {"op": "add", "path": _ref_pointer(segments) + "/-", "value": copy.deepcopy(dict(item))}
        )
        owned = self._own(current)
        owned.append(copy.deepcopy(dict(item)))
        parent[last] = owned

    def _emit(self, op: str, segments: Sequence[Segment], value: Any) -> None:
        self.ops.append({"op": op, "path": _ref_pointer(segments), "value": copy.deepcopy(value)})


# --- generated documents and operations -----------------------------------------------------------


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping that is not a dict (the fast paths must fall back for it)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrozenMap) and self._data == other._data

    __hash__ = None  # type: ignore[assignment]


class Sub(str):
    """A ``str`` subclass (``isinstance`` says string, ``type() is str`` does not)."""


KEYS = ["metadata", "annotations", "spec", "template", "a/b", "x~y", "gates", "name"]
SEGMENTS = st.one_of(
    st.sampled_from(["spec", "template", "metadata"]),
    st.sampled_from(KEYS),
    st.integers(min_value=0, max_value=1),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["", "v", "w", Sub("v")]))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=3).map(FrozenMap),
    ),
    max_leaves=12,
)
PATHS = st.lists(SEGMENTS, min_size=1, max_size=4).map(tuple)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), PATHS, JSON),
        st.tuples(
            st.just("set"), PATHS, st.sampled_from([{}, {"spec": {}}, [], {"template": {"metadata": None}}])
        ),
        st.tuples(st.just("remove"), PATHS, st.none()),
        st.tuples(st.just("append"), PATHS, st.sampled_from([{"name": "g"}, {"name": "h", "x": {}}])),
        st.tuples(st.just("ensure"), PATHS.map(lambda p: p[:-1]), st.none()),
        st.tuples(st.just("get"), PATHS, st.none()),
    ),
    max_size=10,
)


def _tagged(value: Any) -> Any:
    """``value`` with its types spelled out (``True`` != ``1``, ``FrozenMap`` != ``dict``)."""
    if isinstance(value, Mapping):
        return (type(value).__name__, [(_tagged(k), _tagged(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_tagged(v) for v in value])
    return (type(value).__name__, value)


def _run(builder: Any, operations: list[tuple[str, tuple[Segment, ...], Any]]) -> list[Any]:
    trace: list[Any] = []
    for kind, path, value in operations:
        try:
            if kind == "set":
                builder.set(path, value)
            elif kind == "remove":
                builder.remove(path)
            elif kind == "append":
                builder.append_unique(path, value, key="name")
            elif kind == "ensure":
                trace.append(_tagged(builder.ensure_object(path)))
            else:
                trace.append(_tagged(builder.get(path)))
        except (JobSpecError, TypeError, ValueError, AttributeError) as err:
            trace.append((type(err).__name__, str(err)))
        trace.append(_tagged(builder.ops))
    trace.append(_tagged(builder._doc))
    return trace


@settings(max_examples=400, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=5), operations=OPERATIONS)
def test_patch_builder_matches_the_reference(doc: dict[str, Any], operations: list[Any]) -> None:
    before = _tagged(doc)
    assert _run(PatchBuilder(doc), operations) == _run(ReferenceBuilder(copy.deepcopy(doc)), operations)
    assert _tagged(doc) == before, "the caller's document must never change"


def test_replacing_a_container_forgets_what_was_known_below_it() -> None:
    builder = PatchBuilder({"spec": {"template": {"metadata": {"annotations": {"a": "1"}}}}})
    builder.set(("spec", "template", "metadata", "annotations", "b"), "2")
    builder.set(("spec", "template"), {"spec": {}})
    builder.set(("spec", "template", "metadata", "annotations", "c"), "3")
    builder.remove(("spec", "template", "metadata"))
    builder.set(("spec", "template", "metadata", "x"), "4")
    assert [(op["op"], op["path"], op.get("value")) for op in builder.ops] == [
        ("add", "/spec/template/metadata/annotations/b", "2"),
        ("add", "/spec/template", {"spec": {}}),
        ("add", "/spec/template/metadata", {}),
        ("add", "/spec/template/metadata/annotations", {}),
        ("add", "/spec/template/metadata/annotations/c", "3"),
        ("remove", "/spec/template/metadata", None),
        ("add", "/spec/template/metadata", {}),
        ("add", "/spec/template/metadata/x", "4"),
    ]
    assert builder.ops[1]["value"] == {"spec": {}} and builder.ops[2]["value"] == {}, (
        "ops never alias the view"
    )


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        (("a", "b~c/d"), "/a/b~0c~1d"),
        (("a", 1), "/a/1"),
        (("a", True), "/a/True"),  # (1,) == (True,): the memo must not mix them up
        (["a", "b"], "/a/b"),
        ((), ""),
        ((Sub("s/"),), "/s~1"),
    ],
)
def test_pointer_is_memoised_without_mixing_up_equal_paths(
    segments: Sequence[Segment], expected: str
) -> None:
    assert pointer(segments) == expected == _ref_pointer(segments)
    assert pointer(segments) == expected  # a second time, from the memo when it may be


# --- lenient readers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"a": "1", "b": "2"},
        {"a": "1", "b": 2, 3: "c", "d": None},
        {"a": Sub("x"), Sub("k"): "v"},
        FrozenMap({"a": "1", "b": 2}),
        {},
        None,
        ["a"],
        "text",
    ],
)
def test_string_map_and_metadata_readers_match_the_plain_rules(value: Any) -> None:
    expected = (
        {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(value, Mapping)
        else {}
    )
    assert base.string_map(value) == expected
    for job in (
        {"metadata": {"labels": value}},
        {"metadata": FrozenMap({"labels": value})},
        {"metadata": value},
    ):
        assert base.metadata_field(job, "labels") == dig(job, "metadata", "labels")
        assert base.labels_of(job) == base.string_map(dig(job, "metadata", "labels"))
        found = base.string_map(dig(job, "metadata", "labels"))
        legacy = found.get(names.QUOTA_NAME_LABEL) or found.get(names.QUOTA_NAME_LABEL_FALLBACK) or None
        assert base.quota_name(job) == legacy


@pytest.mark.parametrize("labels", [{names.QUOTA_NAME_LABEL: ""}, {names.QUOTA_NAME_LABEL_FALLBACK: "b"}])
def test_quota_name_fast_path_keeps_the_fallback_rules(labels: dict[str, Any]) -> None:
    job = {
        "metadata": {
            "labels": {
                **labels,
                names.QUOTA_NAME_LABEL_FALLBACK: labels.get(names.QUOTA_NAME_LABEL_FALLBACK, 7),
            }
        }
    }
    found = base.string_map(job["metadata"]["labels"])
    assert base.quota_name(job) == (
        found.get(names.QUOTA_NAME_LABEL) or found.get(names.QUOTA_NAME_LABEL_FALLBACK) or None
    )


@pytest.mark.parametrize(
    ("obj", "keys"),
    [
        ({"a": {"b": 1}}, ("a", "b")),
        ({"a": [1, 2]}, ("a", 1)),
        ({"a": {"1": 2}}, ("a", 1)),
        ({"a": [1, 2]}, ("a", True)),
        (FrozenMap({"a": {"b": 1}}), ("a", "b")),
        ({"a": 1}, ("a", "b")),
        ({"a": {"b": 1}}, (Sub("a"), "b")),
    ],
)
def test_dig_fast_path(obj: Any, keys: tuple[Segment, ...]) -> None:
    node: Any = obj
    for key in keys:  # the rule, spelled out
        if isinstance(key, str):
            node = node.get(key) if isinstance(node, Mapping) else None
        else:
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
    assert dig(obj, *keys) == node


# --- the review envelope, the patch encoding, the timestamp and the metrics -----------------------


def test_parse_review_fast_path_and_general_path_agree() -> None:
    request: dict[str, Any] = {
        "uid": "u",
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "operation": "UPDATE",
        "namespace": Sub("ns"),
        "name": "n",
        "userInfo": FrozenMap({"username": "me"}),
        "object": FrozenMap({"a": 1}),
        "oldObject": {"b": 2},
    }
    body = {"apiVersion": admission.REVIEW_API_VERSION, "kind": "AdmissionReview", "request": request}
    parsed = admission.parse_review(body)
    assert parsed == admission.parse_review(FrozenMap({**body, "request": FrozenMap(request)}))
    assert (parsed.api_version, parsed.kind, parsed.namespace, parsed.sub_resource) == (
        "batch/v1",
        "Job",
        "ns",
        "",
    )
    assert parsed.obj is request["object"] and parsed.old_obj is request["oldObject"]
    with pytest.raises(admission.MalformedReview, match=r"request\.oldObject must be an object"):
        admission.parse_review({**body, "request": {**request, "oldObject": None}})
    with pytest.raises(admission.MalformedReview, match=r"request\.name must be a string"):
        admission.parse_review({**body, "request": {**request, "name": 1}})


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "add", "path": "/metadata/annotations/a~1b", "value": 'ä \u2028 \x01 "q"'}],
        [{"op": "add", "path": "/spec/suspend", "value": True}, {"op": "remove", "path": "/x"}],
        [{"op": "add", "path": "/x", "value": "\ud800"}],  # orjson refuses lone surrogates
        [{"op": "add", "path": "/x", "value": 2**70}],  # and integers over 64 bits
    ],
)
def test_patch_encoding_means_what_json_dumps_meant(ops: list[Any]) -> None:
    try:
        expected = json.dumps(ops, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # what the plain encoding did with a lone surrogate: so must we
        with pytest.raises(UnicodeEncodeError):
            admission.patched("uid", ops)
        return
    answer = admission.patched("uid", ops)
    decoded = base64.b64decode(answer["patch"])
    assert answer["patch"] == base64.b64encode(decoded).decode("ascii")
    assert json.loads(decoded) == json.loads(expected)


def test_now_text_is_the_current_second_in_rfc3339() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = server.now_text()
    after = datetime.now(UTC)
    parsed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= parsed <= after
    assert server.now_text() in (stamp, server.now_text())


def test_cached_metric_children_count_like_labels() -> None:
    metrics = WebhookMetrics()
    for kind in ("Job", "Job", "NotAKind", "unknown"):
        metrics.observe(operation="mutate", kind=kind, result=Result.PATCHED, seconds=0.001)
    metrics.observe_since("validate", "Job", Result.ALLOWED, 0.0)
    assert metrics.requests.labels("mutate", "Job", "patched")._value.get() == 2
    assert metrics.requests.labels("mutate", "other", "patched")._value.get() == 1
    assert metrics.requests.labels("mutate", "unknown", "patched")._value.get() == 1
    text = metrics.render().decode()
    assert 'koord_queue_webhook_requests_total{kind="Job",operation="validate",result="allowed"} 1.0' in text
    count = "koord_queue_webhook_request_duration_seconds_count"
    assert count + '{kind="Job",operation="mutate",result="patched"} 2.0' in text


@pytest.mark.parametrize(("current", "value"), [(1, True), (True, 1), (0, False), (1, 1.0), ("1", 1)])
def test_set_turns_equal_values_of_another_type_into_an_add(current: Any, value: Any) -> None:
    for builder in (PatchBuilder({"a": current}), ReferenceBuilder({"a": current})):
        builder.set(("a",), value)
        assert builder.ops == [{"op": "add", "path": "/a", "value": value}]
        builder.set(("a",), value)
        assert len(builder.ops) == 1


def test_recorded_reviews_reach_the_collectors_in_batches_and_before_every_scrape() -> None:
    metrics = WebhookMetrics()
    patched = metrics.requests.labels("mutate", "Job", "patched")
    for _ in range(FLUSH_EVERY - 1):
        metrics.observe_since("mutate", "Job", Result.PATCHED, 0.0)
    assert patched._value.get() == 0, "not applied yet"
    metrics.observe_since("mutate", "Job", Result.PATCHED, 0.0)
    assert patched._value.get() == FLUSH_EVERY, "a full batch is applied at once"
    metrics.observe_since("mutate", "NotAKind", Result.DENIED, 0.0)
    text = metrics.render().decode()
    assert 'koord_queue_webhook_requests_total{kind="other",operation="mutate",result="denied"} 1.0' in text
    total = "koord_queue_webhook_requests_total"
    assert f'{total}{{kind="Job",operation="mutate",result="patched"}} {FLUSH_EVERY}.0' in text

"""Fuzzing every parser of user-supplied fields: random and perturbed input never escapes the
parser's documented error type: hostile or broken input is reported, never crashes the caller.

What may come out, per parser:

* ``shared.api.quantities.parse_milli`` / ``parse_resource_list``: a value or ``QuantityError``;
* ``shared.api.parsing.parse_unit`` / ``parse_queue`` / ``parse_quota``: always a value (bad fields become
  ``problems``; one bad object must never stop the reconcile loop);
* ``shared.jobs.jobext.desired_spec`` with the apiserver's fill-ins (``shared.jobs.poddefaults``), on a
  queued unit or a perturbed admitted one: a value or ``JobSpecError``;
* ``shared.admission.validation``: always a list of field errors, never an exception;
* every job adapter's ``pod_sets`` / ``priority`` / ``job_status`` (and the suspend patch the
  webhook builds): a value or ``JobSpecError``; the lenient predicates never raise;
* ``shared.jobs.podspec.parse_min_resources``: a value or ``JobSpecError``;
* ``shared.api.durations.parse_duration``: a value or ``DurationError``;
* ``shared.core.config.parse``: ``Settings`` or ``ConfigError``.

Inputs are random JSON values, random text (quantity-, duration- and YAML-shaped as well as
arbitrary unicode), and *perturbed valid objects*: a realistic QueueUnit, Queue, ElasticQuota or job
of every kind with a few fields replaced by values of the wrong type or removed. Example counts are
bounded so the whole module runs in well under 20 seconds. Regressions for the crashes this fuzzing
found are at the end, as regression tests.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import validation
from koord_queue.shared.api import durations, names, parsing, quantities
from koord_queue.shared.core import config
from koord_queue.shared.jobs import jobext, poddefaults, podspec, registry
from koord_queue.shared.jobs.base import JobSpecError
from tests.unit.test_job_adapters import SAMPLES

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies -----------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
quantity_like = st.from_regex(
    r"[+-]?([0-9]{0,6}(\.[0-9]{0,4})?|\.[0-9]{1,3})([eE][+-]?[0-9]{1,8}|[KMGTPE]i|[numkMGTPE]|[a-zA-Z]{0,2})?",
    fullmatch=True,
)
duration_like = st.from_regex(
    r"[+-]?(([0-9]{0,6}(\.[0-9]{0,6})?)(ns|us|µs|μs|ms|s|m|h|d|x|)){0,4}", fullmatch=True
)
texts = (
    st.text(max_size=40)
    | quantity_like
    | duration_like
    | st.sampled_from(
        [
            "",
            "0",
            "true",
            "false",
            "null",
            "~",
            "[]",
            "{}",
            "-",
            ".",
            "1e",
            "0x10",
            "1_000",
            "∞",
            "\x00",
            "١٢",
        ]
    )
)
resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods", ""]) | st.text(max_size=6)
resource_lists = st.dictionaries(resource_names, texts | scalars, max_size=4)
annotation_keys = st.sampled_from(
    [
        names.PRIORITY_ANNOTATION,
        names.ACTIVE_ANNOTATION,
        names.MAX_EXEC_TIME_ANNOTATION,
        names.MIN_RESOURCES_ANNOTATION,
        names.WAIT_FOR_PODS_RUNNING_ANNOTATION,
        names.ENABLE_PREEMPTION_ANNOTATION,
        names.MAX_DEPTH_ANNOTATION,
        names.PRIORITY_THRESHOLD_ANNOTATION,
        names.QUEUE_ITEMS_REFRESH_ANNOTATION,
        names.DISABLE_SHOW_QUEUE_ITEMS_ANNOTATION,
        names.QUEUE_ARGS_ANNOTATION,
    ]
)
yaml_like = st.sampled_from(
    [
        "cpu: 2\nmemory: 4Gi",
        '{"cpu": "2", "memory": "4Gi"}',
        "{cpu: [1, 2]}",
        "- a\n- b",
        "a: &a [*a, *a]",
        "cpu: !!python/object:os.system ls",
        "cpu: .nan",
        "cpu: .inf",
        "cpu: 1e999",
        "cpu: 0x1F",
        "? [a]\n: b",
        "{" * 50,
        "cpu: '" + "9" * 40 + "'",
        "a: b: c",
        "\t",
    ]
)
annotation_maps = st.dictionaries(annotation_keys | st.text(max_size=8), texts | yaml_like, max_size=6)


def _container(cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    return {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": memory}}}


def _unit() -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": "u",
            "namespace": "ns",
            "uid": "uid-u",
            "resourceVersion": "12",
            "creationTimestamp": "2025-01-02T03:04:05Z",
            "labels": {names.QUOTA_NAME_LABEL: "team-a"},
            "annotations": {names.PRIORITY_ANNOTATION: "5"},
        },
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "u", "namespace": "ns"},
            "priority": 3,
            "active": True,
            "queue": "team-a",
            "resource": {"cpu": "2", "memory": "2Gi"},
            "request": {"cpu": "2", "memory": "2Gi"},
            "podSet": [
                {
                    "name": "main",
                    "count": 2,
                    "minCount": 1,
                    "template": {
                        "spec": {
                            "initContainers": [_container("2", "1Gi")],
                            "containers": [_container("500m", "512Mi")],
                            "overhead": {"cpu": "10m"},
                        }
                    },
                }
            ],
        },
        "status": {
            "phase": "Running",
            "message": "Running",
            "attempts": 2,
            "lastAllocateTime": "2025-01-02T03:04:06Z",
            "lastUpdateTime": "2025-01-02T03:04:07Z",
            "admissions": [
                {
                    "name": "main",
                    "replicas": 2,
                    "running": 1,
                    "resources": {"cpu": "1"},
                    "reclaimState": {"replicas": 1},
                }
            ],
            "admissionChecks": [
                {"name": "c", "state": "Ready", "message": "", "lastTransitionTime": "2025-01-02T03:04:06Z"}
            ],
            "requeueState": {"count": 1, "requeueAt": "2025-01-02T03:05:00Z"},
            "conditions": [{"type": "Admitted", "status": "True"}],
            "podState": {"running": 1, "pending": 1},
        },
    }


def _queue() -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {
            "name": "team-a",
            "namespace": names.COMPONENT_NAMESPACE,
            "labels": {names.QUOTA_PARENT_LABEL: "root"},
            "annotations": {
                names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
                names.ENABLE_PREEMPTION_ANNOTATION: "true",
                names.MAX_DEPTH_ANNOTATION: "10",
                names.PRIORITY_THRESHOLD_ANNOTATION: "4",
                names.QUEUE_ITEMS_REFRESH_ANNOTATION: "1m30s",
            },
        },
        "spec": {
            "queuePolicy": "Priority",
            "priority": 1000,
            "admissionChecks": [
                {"name": "check", "labelSelector": {"matchLabels": {"a": "b"}}},
                {
                    "name": "other",
                    "labelSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]},
                },
            ],
        },
    }


def _quota() -> dict[str, Any]:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": "team-a",
            "namespace": "ns",
            "labels": {names.QUOTA_PARENT_LABEL: "parent", names.QUEUE_POLICY_LABEL: "Priority"},
            "annotations": {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"},
        },
        "spec": {"min": {"cpu": "1", "memory": "1Gi"}, "max": {"cpu": "4", "memory": "8Gi"}},
    }


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``node`` (objects and lists included, not only leaves)."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, (*prefix, i))
    return found


@st.composite
def perturbed(draw: st.DrawFn, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A valid object with 1-4 of its fields replaced by random values, retyped or removed."""
    obj = make()
    targets = _paths(obj)
    for path in draw(st.lists(st.sampled_from(targets), min_size=1, max_size=4)):
        node: Any = obj
        try:
            for key in path[:-1]:
                node = node[key]
            action = draw(st.sampled_from(["replace", "remove", "retype"]))
            if action == "remove" and isinstance(node, dict):
                node.pop(path[-1], None)
            elif action == "retype":
                value = node[path[-1]]
                node[path[-1]] = [value] if not isinstance(value, list) else {"x": value}
            else:
                node[path[-1]] = draw(json_values | texts)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or retyped this path
    return obj


def objects(make: Callable[[], dict[str, Any]]) -> st.SearchStrategy[Any]:
    return perturbed(make) | json_values


# --- quantities -----------------------------------------------------------------------------------


@FUZZ
@given(value=texts | scalars | st.lists(scalars, max_size=2))
def test_parse_milli_raises_only_quantity_error(value: Any) -> None:
    try:
        milli = quantities.parse_milli(value)
    except quantities.QuantityError:
        return
    assert isinstance(milli, int) and not isinstance(milli, bool)
    # What parses is written back exactly and negates symmetrically.
    assert quantities.parse_milli(quantities.format_milli(milli)) == milli
    if isinstance(value, str) and value and value[0] not in "+-":
        assert quantities.parse_milli("-" + value) == -milli


@FUZZ
@given(raw=resource_lists | st.dictionaries(st.integers() | st.none(), scalars, max_size=3))
def test_parse_resource_list_raises_only_quantity_error(raw: dict[Any, Any]) -> None:
    try:
        parsed = quantities.parse_resource_list(raw, path="spec.max")
    except quantities.QuantityError as err:
        assert str(err)
        return
    assert list(parsed) == sorted(parsed)
    assert all(isinstance(v, int) for v in parsed.values())


# --- parsing: never raises ------------------------------------------------------------------------


@FUZZ
@given(raw=objects(_unit))
def test_parse_unit_never_raises(raw: Any) -> None:
    unit = parsing.parse_unit(raw)
    assert isinstance(unit.problems, tuple)
    assert all(ps.count >= 0 for ps in unit.pod_sets)


@FUZZ
@given(raw=objects(_queue), refresh=st.none() | texts)
def test_parse_queue_never_raises(raw: Any, refresh: str | None) -> None:
    if refresh is not None and isinstance(raw, dict) and isinstance(raw.get("metadata"), dict):
        found = raw["metadata"].get("annotations")
        if isinstance(found, dict):
            found[names.QUEUE_ITEMS_REFRESH_ANNOTATION] = refresh
    queue = parsing.parse_queue(raw)
    assert queue.items_refresh_seconds > 0


@FUZZ
@given(raw=objects(_quota))
def test_parse_quota_never_raises(raw: Any) -> None:
    quota = parsing.parse_quota(raw)
    assert all(isinstance(v, int) for v in quota.max.values())


# --- validation: never raises ---------------------------------------------------------------------


@FUZZ
@given(new=annotation_maps, old=st.none() | annotation_maps)
def test_annotation_validation_never_raises(new: dict[str, str], old: dict[str, str] | None) -> None:
    for errors in (
        validation.validate_job_annotations(new, unchanged=old),
        validation.validate_queue_annotations(new),
    ):
        assert all(isinstance(e, validation.FieldError) and e.path for e in errors)
        validation.aggregate(errors)


@FUZZ
@given(
    queue=objects(_queue),
    unit=objects(_unit),
    quota=objects(_quota),
)
def test_object_validation_never_raises(queue: Any, unit: Any, quota: Any) -> None:
    for validate, obj in (
        (validation.validate_queue, queue),
        (validation.validate_queue_unit, unit),
        (validation.validate_elastic_quota, quota),
    ):
        if not isinstance(obj, dict):
            continue  # the webhook hands these functions a decoded JSON object
        errors = validate(obj)
        assert isinstance(errors, list)
        assert all(isinstance(e, validation.FieldError) for e in errors)
        validation.aggregate(errors)


@FEW
@given(
    limits=st.dictionaries(st.sampled_from(["cpu", "memory", "x"]), quantity_like | scalars, max_size=3),
    requests=st.dictionaries(st.sampled_from(["cpu", "memory", "x"]), quantity_like | scalars, max_size=3),
)
def test_validated_resource_lists_agree_with_the_parser(
    limits: dict[str, Any], requests: dict[str, Any]
) -> None:
    """Whatever validation accepts, the scheduler's parser reads without a problem (and vice versa
    no entry is silently lost): a quota the webhook admits can never park units for a parse error."""
    quota = _quota()
    quota["spec"] = {"max": limits, "min": {}}
    errors = validation.validate_elastic_quota(quota)
    parsed = parsing.parse_quota(quota)
    if not errors:
        assert not parsed.problems, parsed.problems
        assert set(parsed.max) == set(limits)


# --- job adapters ---------------------------------------------------------------------------------

ADAPTERS = {adapter.extension: adapter for adapter in registry.ADAPTERS}


@FUZZ
@given(data=st.data(), extension=st.sampled_from(registry.EXTENSIONS))
def test_adapters_raise_only_job_spec_errors(data: st.DataObject, extension: str) -> None:
    adapter = ADAPTERS[extension]
    job = data.draw(perturbed(SAMPLES[extension]))
    # The lenient readers run on every admission request: they must be total.
    adapter.is_managed(job)
    adapter.quota_name(job)
    adapter.queue_unit_name(job)
    adapter.is_suspended(job)
    adapter.suspend_state(job)
    adapter.pod_set_of(job)
    for call in (
        lambda: adapter.pod_sets(job),
        lambda: adapter.priority(job),
        lambda: adapter.job_status(job),
        lambda: adapter.suspend_patch(job, now_text="2025-01-02T03:04:05Z"),
        lambda: adapter.resume_patch(job, now_text="2025-01-02T03:04:05Z"),
        lambda: adapter.suspend_merge_patch(job),
    ):
        try:
            call()
        except JobSpecError as err:
            assert err.path and err.detail


@FUZZ
@given(data=st.data(), extension=st.sampled_from(registry.EXTENSIONS), admitted=st.booleans())
def test_the_unit_spec_with_the_apiservers_fill_ins_raises_only_job_spec_errors(
    data: st.DataObject, extension: str, admitted: bool
) -> None:
    """``jobext.desired_spec`` with a namespace's LimitRange defaults and RuntimeClass overheads
    (``shared.jobs.poddefaults``), for a queued unit and for one holding an admission whose own
    templates are perturbed too: what is filled in never turns a bad template into a crash."""
    adapter = ADAPTERS[extension]
    job = data.draw(perturbed(SAMPLES[extension]))
    defaults = poddefaults.PodDefaults(
        requests=data.draw(st.dictionaries(resource_names, texts, max_size=3)),
        overheads={"kata": data.draw(st.dictionaries(resource_names, texts, max_size=2))},
    )
    unit: Any = None
    if admitted:
        with contextlib.suppress(JobSpecError):
            unit = {"spec": jobext.desired_spec(job, adapter, {}), "status": {"phase": "Running"}}
        if unit is not None:
            unit = data.draw(perturbed(lambda: copy.deepcopy(unit)))
    try:
        spec = jobext.desired_spec(job, adapter, {}, defaults=defaults, admitted=unit)
    except JobSpecError as err:
        assert err.path and err.detail
        return
    if unit is not None:
        jobext.admitted_resize(unit, spec)
        jobext.spec_drift(unit, spec)


@FEW
@given(junk=st.lists(json_values, max_size=3))
def test_limit_ranges_and_runtime_classes_of_any_shape_are_read_without_raising(junk: list[Any]) -> None:
    objects = [j if isinstance(j, dict) else {"spec": j, "overhead": j} for j in junk]
    poddefaults.limit_range_requests(objects)
    for obj in objects:
        poddefaults.runtime_class_overhead(obj)


@FEW
@given(extension=st.sampled_from(registry.EXTENSIONS), junk=json_values)
def test_adapters_on_arbitrary_json(extension: str, junk: Any) -> None:
    adapter = ADAPTERS[extension]
    job = junk if isinstance(junk, dict) else {"spec": junk}
    adapter.is_managed(job)
    adapter.suspend_state(job)
    for call in (
        lambda: adapter.pod_sets(job),
        lambda: adapter.priority(job),
        lambda: adapter.job_status(job),
    ):
        with contextlib.suppress(JobSpecError):
            call()


@FUZZ
@given(value=texts | yaml_like | st.builds(str, json_values))
def test_parse_min_resources_raises_only_job_spec_error(value: str) -> None:
    path = f"metadata.annotations[{names.MIN_RESOURCES_ANNOTATION}]"
    try:
        parsed = podspec.parse_min_resources(value, path)
    except JobSpecError as err:
        assert err.path.startswith(path)
        return
    assert all(isinstance(v, int) and v >= 0 for v in parsed.values())


# --- durations and the component configuration ----------------------------------------------------


@FUZZ
@given(text=texts | duration_like)
def test_parse_duration_raises_only_duration_error(text: str) -> None:
    try:
        seconds = durations.parse_duration(text)
    except durations.DurationError as err:
        assert str(err).startswith("time: ")
        return
    assert math.isfinite(seconds)


def _config_text(value: Any) -> str:
    import yaml

    doc = {"apiVersion": config.API_VERSION, "kind": config.KINDS[0], "defaultReclaimProtectTime": value}
    return yaml.safe_dump(doc)


@FUZZ
@given(
    text=st.text(max_size=80) | yaml_like | json_values.map(_config_text) | duration_like.map(_config_text)
)
def test_config_parse_raises_only_config_error(text: str) -> None:
    try:
        parsed = config.parse(text, source="fuzz.yaml")
    except config.ConfigError as err:
        assert str(err).startswith("fuzz.yaml")
        return
    assert isinstance(parsed, config.Settings)


# --- regressions found by this fuzzing (product bugs, now fixed) -----------------------------------

LONG_NUMBER = "1" * 5000  # more digits than int() converts by default (sys.get_int_max_str_digits)


def test_a_duration_with_thousands_of_digits_is_a_duration_error() -> None:
    with pytest.raises(durations.DurationError):
        durations.parse_duration(LONG_NUMBER + "s")


def test_parse_queue_survives_a_refresh_interval_with_thousands_of_digits() -> None:
    queue = _queue()
    queue["metadata"]["annotations"][names.QUEUE_ITEMS_REFRESH_ANNOTATION] = LONG_NUMBER + "s"
    parsed = parsing.parse_queue(queue)
    assert parsed.problems


@pytest.mark.parametrize("operator", [["In"], {"op": "In"}], ids=["list", "object"])
def test_parse_queue_survives_an_operator_that_is_a_list(operator: Any) -> None:
    queue = _queue()
    queue["spec"]["admissionChecks"][1]["labelSelector"]["matchExpressions"][0]["operator"] = operator
    assert parsing.parse_queue(queue).problems


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        _config_text(LONG_NUMBER + "s"),
    ],
    ids=["deep-yaml", "long-duration"],
)
def test_config_parse_refuses_hostile_yaml_with_a_config_error(text: str) -> None:
    with pytest.raises(config.ConfigError):
        config.parse(text, source="fuzz.yaml")


@pytest.mark.parametrize("value", [math.nan, True], ids=["nan", "bool"])
def test_config_parse_refuses_a_nan_or_boolean_protect_time(value: Any) -> None:
    with pytest.raises(config.ConfigError):
        config.parse(_config_text(value), source="fuzz.yaml")


def test_the_samples_are_valid() -> None:
    """The perturbation starts from objects every parser accepts cleanly."""
    assert parsing.parse_unit(_unit()).problems == ()
    assert parsing.parse_queue(_queue()).problems == ()
    assert parsing.parse_quota(_quota()).problems == ()
    assert validation.validate_queue(_queue()) == []
    assert validation.validate_queue_unit(_unit()) == []
    assert validation.validate_elastic_quota(_quota()) == []
    for extension, make in SAMPLES.items():
        assert ADAPTERS[extension].pod_sets(copy.deepcopy(make()))

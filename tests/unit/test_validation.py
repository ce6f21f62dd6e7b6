"""Validation of annotations, Queue, QueueUnit and ElasticQuota (the Go scalar parsers it uses are
tested in ``test_goparse.py``).

Every rule is a named table row; messages are checked in full where users read them (the policy
list, ``min <= max``), by path elsewhere. Property tests check that validators are total on arbitrary
JSON.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import validation
from koord_queue.shared.admission.validation import FieldError
from koord_queue.shared.api import names

ANN = "metadata.annotations"


def paths(errors: list[FieldError]) -> list[str]:
    return [e.path for e in errors]


# --- messages -------------------------------------------------------------------------------------


def test_messages_follow_kubernetes_field_error_format() -> None:
    error = validation.not_supported("spec.queuePolicy", "FIFO", ["Priority", "Block", "Intelligent"])
    assert (
        str(error)
        == 'spec.queuePolicy: Unsupported value: "FIFO": supported values: "Priority", "Block", "Intelligent"'
    )
    assert (
        str(validation.too_many("spec.podSet", 9, 8)) == "spec.podSet: Too many: 9: must have at most 8 items"
    )
    assert str(validation.invalid("a", True, "x")) == "a: Invalid value: true: x"
    assert str(validation.invalid("a", {"deep": [1]}, "x")) == "a: Invalid value: {...}: x"
    assert validation.aggregate([error]) == str(error)
    two = validation.aggregate([validation.required("a"), validation.forbidden("b", "no")])
    assert two == "[a: Required value, b: Forbidden: no]"


def test_ratchet_reports_only_new_errors() -> None:
    old = [validation.required("a")]
    new = [validation.required("a"), validation.required("b")]
    assert validation.ratchet(new, old) == [validation.required("b")]


# --- job annotations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        (names.PRIORITY_ANNOTATION, "100", True),
        (names.PRIORITY_ANNOTATION, "-5", True),
        (names.PRIORITY_ANNOTATION, "high", False),
        (names.PRIORITY_ANNOTATION, "3000000000", False),
        (names.ACTIVE_ANNOTATION, "False", True),
        (names.ACTIVE_ANNOTATION, "no", False),
        (names.MAX_EXEC_TIME_ANNOTATION, "3600", True),
        (names.MAX_EXEC_TIME_ANNOTATION, "0", False),
        (names.MAX_EXEC_TIME_ANNOTATION, "-1", False),
        (names.MAX_EXEC_TIME_ANNOTATION, "1h", False),
        (names.MIN_RESOURCES_ANNOTATION, '{"cpu": "2", "memory": "4Gi"}', True),
        (names.MIN_RESOURCES_ANNOTATION, "cpu: 2\nnvidia.com/gpu: 1", True),
        (names.MIN_RESOURCES_ANNOTATION, "cpu: two", False),
        (names.MIN_RESOURCES_ANNOTATION, "{broken", False),
        (names.MIN_RESOURCES_ANNOTATION, "[cpu]", False),
        ("unrelated/annotation", "anything", True),
    ],
)
def test_job_annotations(key: str, value: str, ok: bool) -> None:
    errors = validation.validate_job_annotations({key: value})
    assert (errors == []) is ok, errors
    if not ok:
        assert errors[0].path.startswith(f"{ANN}[{key}]")


def test_every_bad_min_resource_is_reported() -> None:
    errors = validation.validate_job_annotations(
        {names.MIN_RESOURCES_ANNOTATION: "cpu: x\nmemory: y\npods: 3"}
    )
    key = f"{ANN}[{names.MIN_RESOURCES_ANNOTATION}]"
    assert paths(errors) == [f"{key}[cpu]", f"{key}[memory]"]


def test_unchanged_job_annotations_are_not_reported_again() -> None:
    bad = {names.PRIORITY_ANNOTATION: "high"}
    assert validation.validate_job_annotations(bad, unchanged=bad) == []
    assert validation.validate_job_annotations(bad, unchanged={}) != []


# --- Queue ----------------------------------------------------------------------------------------


def queue(spec: Any = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "q", "annotations": annotations or {}}}
    if spec is not None:
        obj["spec"] = spec
    return obj


@pytest.mark.parametrize("policy", ["Priority", "Block", "Intelligent", "", None])
def test_supported_queue_policies(policy: str | None) -> None:
    assert validation.validate_queue(queue({"queuePolicy": policy})) == []


@pytest.mark.parametrize("policy", ["FIFO", "Round", "priority", 3])
def test_unsupported_queue_policies_list_the_supported_ones(policy: object) -> None:
    [error] = validation.validate_queue(queue({"queuePolicy": policy}))
    assert error.path == "spec.queuePolicy"
    assert error.message.endswith('supported values: "Priority", "Block", "Intelligent"')


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        (names.WAIT_FOR_PODS_RUNNING_ANNOTATION, "true", True),
        (names.WAIT_FOR_PODS_RUNNING_ANNOTATION, "sure", False),
        (names.ENABLE_PREEMPTION_ANNOTATION, "0", True),
        (names.ENABLE_PREEMPTION_ANNOTATION, "", False),
        (names.MAX_DEPTH_ANNOTATION, "-1", True),
        (names.MAX_DEPTH_ANNOTATION, "ten", False),
        (names.PRIORITY_THRESHOLD_ANNOTATION, "4", True),
        (names.PRIORITY_THRESHOLD_ANNOTATION, "99999999999", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "1m30s", True),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "100ms", True),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "15", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "0s", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "-1s", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "1d", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "9" * 5000 + "h", False),
        (names.QUEUE_ITEMS_REFRESH_ANNOTATION, "2562047h47m16.854775808s", False),
        (names.DISABLE_SHOW_QUEUE_ITEMS_ANNOTATION, "whatever", True),
        ("koord-queue/quota-koord-queue-enable", "x", True),
    ],
)
def test_queue_tuning_annotations(key: str, value: str, ok: bool) -> None:
    errors = validation.validate_queue(queue(annotations={key: value}))
    assert (errors == []) is ok, errors
    if not ok:
        assert paths(errors) == [f"{ANN}[{key}]"]


def test_queue_reports_every_error() -> None:
    obj = queue(
        {"queuePolicy": "FIFO", "priority": "high", "admissionChecks": [{"name": "a"}, {"name": "a"}, {}, 5]},
        {names.MAX_DEPTH_ANNOTATION: "x", names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "y"},
    )
    assert paths(validation.validate_queue(obj)) == [
        f"{ANN}[{names.WAIT_FOR_PODS_RUNNING_ANNOTATION}]",
        f"{ANN}[{names.MAX_DEPTH_ANNOTATION}]",
        "spec.queuePolicy",
        "spec.priority",
        "spec.admissionChecks[1].name",
        "spec.admissionChecks[2].name",
        "spec.admissionChecks[3]",
    ]


# --- QueueUnit ------------------------------------------------------------------------------------


def pod_set(name: str = "main", count: Any = 1, **extra: Any) -> dict[str, Any]:
    tpl = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    return {"name": name, "count": count, "template": tpl, **extra}


def unit(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "u"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"podSet": [pod_set()], "resource": {"cpu": "1"}}, []),
        ({"podSet": [pod_set(name=f"p{i}") for i in range(9)]}, ["spec.podSet"]),
        ({"podSet": [pod_set(count=-1)]}, ["spec.podSet[0].count"]),
        ({"podSet": [pod_set(count=2, minCount=3)]}, ["spec.podSet[0].minCount"]),
        ({"podSet": [pod_set(count=2, minCount=0)]}, ["spec.podSet[0].minCount"]),
        ({"podSet": [pod_set(count=2, minCount=2)]}, []),
        ({"podSet": [pod_set(), pod_set()]}, ["spec.podSet[1].name"]),
        ({"podSet": [pod_set(name="Not_DNS")]}, ["spec.podSet[0].name"]),
        ({"podSet": [{"name": "a", "count": 1}]}, ["spec.podSet[0].template"]),
        ({"podSet": "x"}, ["spec.podSet"]),
        (
            {"resource": {"cpu": "1x"}, "request": {"memory": -1}},
            ["spec.resource[cpu]", "spec.request[memory]"],
        ),
        ({"priority": 2**31}, ["spec.priority"]),
        (
            {"maximumExecutionTimeSeconds": 0, "active": "yes"},
            ["spec.maximumExecutionTimeSeconds", "spec.active"],
        ),
    ],
)
def test_queue_unit(spec: dict[str, Any], expected: list[str]) -> None:
    assert paths(validation.validate_queue_unit(unit(**spec))) == expected


def test_queue_unit_template_quantities_are_checked() -> None:
    bad = pod_set()
    bad["template"]["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"memory": "lots"}}}]
    bad["template"]["spec"]["overhead"] = {"cpu": "x"}
    assert paths(validation.validate_queue_unit(unit(podSet=[bad]))) == [
        "spec.podSet[0].template.spec.initContainers[0].resources.limits[memory]",
        "spec.podSet[0].template.spec.overhead[cpu]",
    ]


# --- ElasticQuota ---------------------------------------------------------------------------------


def quota(name: str = "team-a", labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-system", "labels": labels or {}}, "spec": spec}


def test_elastic_quota_min_above_max_names_both_values() -> None:
    [error] = validation.validate_elastic_quota(quota(min={"cpu": "4", "memory": "1Gi"}, max={"cpu": "2"}))
    assert (
        str(error) == 'spec.min[cpu]: Invalid value: "4": must be less than or equal to spec.max[cpu] ("2")'
    )


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (quota(min={"cpu": "2"}, max={"cpu": "2", "memory": "8Gi"}), []),
        (quota(min={"cpu": "two"}, max={"cpu": "-1"}), ["spec.min[cpu]", "spec.max[cpu]"]),
        (
            quota(labels={names.QUOTA_PARENT_LABEL: "team-a"}),
            [f"metadata.labels[{names.QUOTA_PARENT_LABEL}]"],
        ),
        (quota(labels={names.QUOTA_PARENT_LABEL: "root"}), []),
        (quota(labels={names.QUEUE_POLICY_LABEL: "FIFO"}), [f"metadata.labels[{names.QUEUE_POLICY_LABEL}]"]),
        (
            {"metadata": {"annotations": {names.MAX_DEPTH_ANNOTATION: "x"}}},
            [f"{ANN}[{names.MAX_DEPTH_ANNOTATION}]"],
        ),
        ({"spec": []}, ["spec"]),
    ],
)
def test_elastic_quota(obj: dict[str, Any], expected: list[str]) -> None:
    assert paths(validation.validate_elastic_quota(obj)) == expected


# --- totality -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
fields = st.sampled_from(
    ["spec", "metadata", "podSet", "min", "max", "queuePolicy", "count", "template", "labels"]
)
shaped = st.recursive(
    json_values,
    lambda inner: st.dictionaries(fields, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(shaped)
def test_validators_are_total(obj: Any) -> None:
    for check in (
        validation.validate_queue,
        validation.validate_queue_unit,
        validation.validate_elastic_quota,
    ):
        candidate = obj if isinstance(obj, dict) else {"spec": obj}
        for error in check(candidate):
            assert isinstance(error, FieldError) and error.path and error.message

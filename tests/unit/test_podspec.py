"""The scheduling view of a pod template keeps every answer the quota rules give."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.api import podtemplates as podspec
from koord_queue.shared.api.quantities import QuantityError

QUANTITY = st.sampled_from(["100m", "1", "2Gi", "500Mi", "3", "bad", 7, None])
RESOURCES = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), QUANTITY, max_size=3)
CONTAINER = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=5), "image": st.just("busybox")},
    optional={
        "resources": st.fixed_dictionaries({}, optional={"requests": RESOURCES, "limits": RESOURCES}),
        "restartPolicy": st.sampled_from(["Always", "Never"]),
        "env": st.lists(st.fixed_dictionaries({"name": st.just("A"), "value": st.text(max_size=50)})),
        "command": st.lists(st.text(max_size=20)),
    },
)
SPEC = st.fixed_dictionaries(
    {"containers": st.lists(CONTAINER, max_size=3)},
    optional={
        "initContainers": st.lists(CONTAINER, max_size=2),
        "overhead": RESOURCES,
        "resources": st.fixed_dictionaries({}, optional={"requests": RESOURCES, "limits": RESOURCES}),
        "nodeSelector": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
        "volumes": st.lists(st.just({"name": "v", "emptyDir": {}}), max_size=2),
        "priorityClassName": st.text(max_size=5),
    },
)


def requests_or_error(spec: object) -> object:
    try:
        return podspec.pod_requests(spec)  # type: ignore[arg-type]
    except QuantityError as err:
        return ("error", str(err))


@settings(max_examples=300, deadline=None)
@given(spec=SPEC, labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
def test_the_scheduling_view_gives_the_same_requests_and_placement(
    spec: dict[str, Any], labels: dict[str, str]
) -> None:
    template = {"metadata": {"labels": labels, "annotations": {"big": "x" * 100}}, "spec": spec}
    slim = podspec.scheduling_template(template)
    assert requests_or_error(slim["spec"]) == requests_or_error(spec)
    for field in podspec.SCHEDULING_FIELDS:
        assert slim["spec"].get(field) == spec.get(field)
    assert "volumes" not in slim["spec"] and "annotations" not in slim.get("metadata", {})
    assert (slim.get("metadata") or {}).get("labels", {}) == labels
    for container in slim["spec"]["containers"]:
        assert set(container) <= set(podspec.CONTAINER_FIELDS)


def test_a_typical_template_shrinks_to_its_scheduling_fields() -> None:
    template = {
        "metadata": {"annotations": {"note": "n" * 500}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1.2",
                    "command": ["python", "train.py"],
                    "env": [{"name": f"V{i}", "value": "x" * 40} for i in range(10)],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
                }
            ],
        },
    }
    assert podspec.scheduling_template(template) == {
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}
            ],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        }
    }


def test_shapes_it_cannot_read_are_passed_on_for_the_parser_to_reject() -> None:
    assert podspec.scheduling_template({"spec": "nonsense"}) == {"spec": "nonsense"}
    assert podspec.scheduling_template({"spec": {"containers": "x"}}) == {"spec": {"containers": "x"}}
    assert podspec.scheduling_template({}) == {}


@settings(max_examples=300, deadline=None)
@given(spec=SPEC)
def test_a_remembered_answer_is_the_answer(spec: dict[str, Any]) -> None:
    """``pod_requests`` remembers answers by what it reads of the spec: asked again (or for an
    equal spec), it answers as the full computation does, and no caller can change what the next
    one gets."""

    def computed(spec: object) -> object:
        try:
            return podspec._pod_requests(spec, "spec")  # type: ignore[arg-type]
        except QuantityError as err:
            return ("error", str(err))

    expected = computed(spec)
    first = requests_or_error(spec)
    assert first == expected
    if isinstance(first, dict):
        first["cpu"] = -1  # a caller's own copy
    assert requests_or_error(spec) == expected
    assert requests_or_error(copy.deepcopy(spec)) == expected


def test_what_the_rule_reads_tells_remembered_answers_apart() -> None:
    sidecar = {"name": "s", "resources": {"requests": {"cpu": "1"}}, "restartPolicy": "Always"}
    plain = {**sidecar, "restartPolicy": "Never"}
    main = [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]
    assert podspec.pod_requests({"containers": main, "initContainers": [sidecar]}) == {"cpu": 3000}
    assert podspec.pod_requests({"containers": main, "initContainers": [plain]}) == {"cpu": 2000}
    with_overhead = {"containers": main, "overhead": {"cpu": "250m"}}
    assert podspec.pod_requests(with_overhead) == {"cpu": 2250}
    pod_level = {"containers": main, "resources": {"requests": {"cpu": "4"}}}
    assert podspec.pod_requests(pod_level) == {"cpu": 4000}
    assert podspec.pod_requests({"containers": main}) == {"cpu": 2000}

"""The pod gate (``shared.admission.podgate``): labelled pods are created behind the admission gate.

A table of requests (what is gated, what is left alone, what is refused), the patch applied the way
the apiserver applies it (strict RFC 6902, from ``test_job_adapters``), and a property: whatever
gates a labelled pod already has, after the patch it has ours exactly once and keeps the others.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission import podgate
from koord_queue.shared.api import names
from tests.unit.test_admission import review_body
from tests.unit.test_job_adapters import apply_patch

GATE = {"name": names.ADMISSION_GATE}
LABEL = {names.GATED_POD_LABEL: "true"}


def pod(*, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod as the Spark operator creates the driver of a queued SparkApplication."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "sp-driver",
            "namespace": "ns",
            "labels": {"spark-role": "driver", **(LABEL if labels is None else labels)},
            "annotations": {
                names.RELATED_QUEUEUNIT_ANNOTATION: "ns/sp-spark-qu",
                names.RELATED_PODSET_ANNOTATION: "driver",
            },
        },
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark"}], **spec},
    }


def answer(obj: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    full = podgate.review(review_body(obj, **kw))
    assert full["apiVersion"] == "admission.k8s.io/v1" and full["kind"] == "AdmissionReview"
    response: dict[str, Any] = full["response"]
    assert response["uid"] == "uid-1"
    return response


def stored(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """``obj`` after the webhook's patch (unchanged when allowed without one)."""
    response = answer(obj, **kw)
    assert response["allowed"] is True, response
    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    return apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


@pytest.mark.parametrize(
    ("spec", "labels", "gates"),
    [
        ({}, None, [GATE]),
        ({"schedulingGates": []}, None, [GATE]),
        ({"schedulingGates": None}, None, [GATE]),
        ({"schedulingGates": [{"name": "other"}]}, None, [{"name": "other"}, GATE]),
        ({"schedulingGates": [GATE]}, None, [GATE]),
        ({"schedulingGates": [{"name": "other"}, GATE]}, None, [{"name": "other"}, GATE]),
        # The label's presence gates, not its value (a sparkConf entry could set another value).
        ({}, {names.GATED_POD_LABEL: "false"}, [GATE]),
        ({}, {names.GATED_POD_LABEL: ""}, [GATE]),
    ],
)
def test_a_labelled_pod_is_created_gated(
    spec: dict[str, Any], labels: dict[str, str] | None, gates: list[dict[str, str]]
) -> None:
    obj = pod(labels=labels, **spec)
    original = copy.deepcopy(obj)
    result = stored(obj)
    assert obj == original, "the decision must not modify its input"
    assert result["spec"]["schedulingGates"] == gates
    assert {k: v for k, v in result["spec"].items() if k != "schedulingGates"} == {
        k: v for k, v in original["spec"].items() if k != "schedulingGates"
    }
    assert result["metadata"] == original["metadata"]


def test_an_already_gated_pod_gets_no_patch() -> None:
    response = answer(pod(schedulingGates=[GATE]))
    assert response == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize(
    ("obj", "kw"),
    [
        (pod(labels={}), {}),  # not labelled (a mis-scoped configuration)
        (pod(labels={"koord-queue/gated-pod-other": "true"}), {}),
        (pod(), {"operation": "UPDATE", "old": pod()}),
        (None, {"operation": "DELETE", "old": pod()}),
        (pod(), {"sub_resource": "ephemeralcontainers"}),
        ({**pod(), "apiVersion": "batch/v1", "kind": "Job"}, {}),
        ({**pod(), "apiVersion": "example.com/v1", "kind": "Pod"}, {}),
    ],
    ids=["unlabelled", "other-label", "update", "delete", "subresource", "other-kind", "other-group"],
)
def test_everything_else_is_allowed_untouched(obj: dict[str, Any] | None, kw: dict[str, Any]) -> None:
    response = answer(obj, **kw)
    assert response == {"uid": "uid-1", "allowed": True}


def test_a_labelled_pod_created_bound_to_a_node_is_refused() -> None:
    response = answer(pod(nodeName="node-1"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith("spec.nodeName: Forbidden: ")
    assert names.GATED_POD_LABEL in message and names.ADMISSION_GATE in message


def test_unreadable_scheduling_gates_are_refused_with_the_path() -> None:
    response = answer(pod(schedulingGates={"name": names.ADMISSION_GATE}))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.schedulingGates: Invalid value")


@pytest.mark.parametrize(
    "body", [{}, [], {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}]
)
def test_a_malformed_review_raises_like_the_job_webhook(body: object) -> None:
    with pytest.raises(admission.MalformedReview):
        podgate.review(body)


_gates = st.lists(
    st.one_of(
        st.fixed_dictionaries({"name": st.sampled_from(["a", "b/c", names.ADMISSION_GATE, "x~y"])}),
        st.just(GATE),
    ),
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(
    gates=st.one_of(st.none(), _gates), extra_labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5))
)
def test_the_gate_is_added_once_when_missing_and_other_gates_stay(
    gates: list[dict[str, str]] | None, extra_labels: dict[str, str]
) -> None:
    obj = pod(labels={**extra_labels, **LABEL})
    if gates is not None:
        obj["spec"]["schedulingGates"] = gates
    result = stored(obj)
    after = result["spec"]["schedulingGates"]
    assert sum(1 for g in after if g.get("name") == names.ADMISSION_GATE) == max(
        1, sum(1 for g in gates or [] if g.get("name") == names.ADMISSION_GATE)
    )
    assert after[: len(gates or [])] == (gates or [])

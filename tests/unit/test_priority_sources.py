"""Where a unit's priority comes from (docs/compatibility.md#priority-cap): PriorityClasses the
job's quota allows, and the owner's claims (the priority annotation, an Argo Workflow's
``spec.priority``) clamped to the cap. A pod template's raw ``priority`` never counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from koord_queue.shared.admission import validation
from koord_queue.shared.api import names, parsing
from koord_queue.shared.jobs import jobext, registry
from tests.unit.test_job_adapters import batch_job, job_set, kubeflow_job, ray_job, workflow

RAW = 1_000_000


def _templates(node: Any) -> list[dict[str, Any]]:
    """Every pod template spec inside a job (a dict with ``containers``)."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            found.append(node)
        for value in node.values():
            found += _templates(value)
    elif isinstance(node, list):
        for value in node:
            found += _templates(value)
    return found


def with_raw_priority(job: dict[str, Any], class_name: str | None = None) -> dict[str, Any]:
    """The job with ``priority: 1000000`` (and the class, if any) in every pod template."""
    for spec in _templates(job["spec"]):
        spec["priority"] = RAW
        if class_name:
            spec["priorityClassName"] = class_name
    return job


KINDS: dict[str, Callable[[], dict[str, Any]]] = {
    "job": batch_job,
    "tfjob": lambda: kubeflow_job("TFJob", "tfReplicaSpecs", {"Worker": 2}),
    "pytorchjob": lambda: kubeflow_job("PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 2}),
    "mpijob": lambda: kubeflow_job("MPIJob", "mpiReplicaSpecs", {"Launcher": 1, "Worker": 2}),
    "jobset": job_set,
    "rayjob": ray_job,
}


@pytest.mark.parametrize("extension", sorted(KINDS))
def test_a_raw_template_priority_without_a_class_gives_the_unit_no_priority(extension: str) -> None:
    adapter = registry.by_extension(extension)
    job = with_raw_priority(KINDS[extension]())
    spec = jobext.desired_spec(job, adapter, {"high": 100})
    assert "priority" not in spec and "priorityClassName" not in spec


@pytest.mark.parametrize("extension", sorted(KINDS))
def test_a_raw_template_priority_beside_a_class_gives_the_class_value(extension: str) -> None:
    adapter = registry.by_extension(extension)
    job = with_raw_priority(KINDS[extension](), "low")
    spec = jobext.desired_spec(job, adapter, {"low": 10})
    assert (spec["priorityClassName"], spec["priority"]) == ("low", 10)


def test_a_class_that_does_not_exist_gives_no_value_not_the_raw_one() -> None:
    spec = jobext.desired_spec(with_raw_priority(batch_job(), "missing"), registry.by_extension("job"), {})
    assert spec["priorityClassName"] == "missing" and "priority" not in spec


def _workflow(priority: int, class_name: str | None = None) -> dict[str, Any]:
    wf = workflow()
    wf["spec"]["priority"] = priority
    if class_name:
        wf["spec"]["podPriorityClassName"] = class_name
    return wf


@pytest.mark.parametrize(
    ("cap", "expected"), [(None, RAW), (500, 500), (2_000_000, RAW)], ids=["no-cap", "capped", "under-cap"]
)
def test_a_workflow_priority_is_a_claim_clamped_to_the_cap(cap: int | None, expected: int) -> None:
    spec = jobext.desired_spec(_workflow(RAW), registry.by_extension("workflow"), {}, max_user_priority=cap)
    assert spec["priority"] == expected
    # The synthetic template carries no raw priority either.
    assert "priority" not in spec["podSet"][0]["template"]["spec"]


def test_a_workflow_class_wins_over_its_priority_and_the_annotation_over_both() -> None:
    adapter = registry.by_extension("workflow")
    assert jobext.resolve_priority(_workflow(RAW, "low"), adapter, {"low": 10}, max_user_priority=5) == (
        "low",
        10,
    )
    wf = _workflow(RAW, "low")
    wf["metadata"]["annotations"][names.PRIORITY_ANNOTATION] = "900"
    assert jobext.resolve_priority(wf, adapter, {"low": 10}, max_user_priority=50) == ("low", 50)


def test_a_class_the_quota_does_not_allow_counts_as_none() -> None:
    adapter = registry.by_extension("job")
    classes = {"low": 10, "urgent": 100_000}
    job = with_raw_priority(batch_job(), "urgent")
    allowed = frozenset({"low"})
    assert jobext.resolve_priority(job, adapter, classes, allowed_classes=allowed) == (None, None)
    assert jobext.resolve_priority(job, adapter, classes, allowed_classes=None) == ("urgent", 100_000)
    assert jobext.resolve_priority(job, adapter, classes, allowed_classes=frozenset()) == (None, None)
    assert jobext.refused_priority_class(job, adapter, allowed) == "urgent"
    assert jobext.refused_priority_class(job, adapter, None) is None
    allowed_job = with_raw_priority(batch_job(), "low")
    assert jobext.resolve_priority(allowed_job, adapter, classes, allowed_classes=allowed) == ("low", 10)
    assert jobext.refused_priority_class(allowed_job, adapter, allowed) is None


def test_a_refused_class_still_lets_the_capped_annotation_decide() -> None:
    adapter = registry.by_extension("job")
    job = with_raw_priority(batch_job(), "urgent")
    job["metadata"]["annotations"] = {names.PRIORITY_ANNOTATION: "700"}
    got = jobext.resolve_priority(
        job, adapter, {"urgent": 100_000}, max_user_priority=300, allowed_classes=frozenset({"low"})
    )
    assert got == (None, 300)


def test_the_refusal_message_says_what_why_and_what_next() -> None:
    text = jobext.refused_class_message("urgent", "team-a", frozenset({"b", "a"}))
    assert "'urgent'" in text and "'team-a'" in text and "allowed: a, b" in text
    assert names.ALLOWED_PRIORITY_CLASSES_ANNOTATION in text
    assert "allowed: none" in jobext.refused_class_message("urgent", "team-a", frozenset())


@pytest.mark.parametrize(
    ("text", "allowed", "problem"),
    [
        (None, None, False),
        ("[]", frozenset(), False),
        ('["low", "batch.high"]', frozenset({"low", "batch.high"}), False),
        ('["low", "Not A Name", 3]', frozenset({"low"}), True),
        ("low,high", frozenset(), True),  # fails closed: no class allowed
        ('{"low": true}', frozenset(), True),
    ],
)
def test_the_allowed_classes_annotation_fails_closed(
    text: str | None, allowed: frozenset[str] | None, problem: bool
) -> None:
    got, why = parsing.parse_allowed_priority_classes(text)
    assert got == allowed and (why is not None) == problem


def test_a_quota_carries_its_allowed_classes_and_the_webhook_checks_them() -> None:
    def quota(value: str) -> dict[str, Any]:
        return {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {
                "name": "team-a",
                "namespace": "ns",
                "annotations": {names.ALLOWED_PRIORITY_CLASSES_ANNOTATION: value},
            },
            "spec": {"max": {"cpu": "4"}},
        }

    assert parsing.parse_quota(quota('["low"]')).allowed_priority_classes == frozenset({"low"})
    assert parsing.parse_quota({"metadata": {"name": "q"}}).allowed_priority_classes is None
    assert validation.validate_elastic_quota(quota('["low"]')) == []
    errors = validation.validate_elastic_quota(quota("low"))
    assert len(errors) == 1 and names.ALLOWED_PRIORITY_CLASSES_ANNOTATION in str(errors[0])


def test_a_job_naming_no_class_takes_the_clusters_default_class_as_its_pods_will() -> None:
    adapter = registry.by_extension("job")
    classes = {"standard": 50, "low": 10}
    raw = with_raw_priority(batch_job())
    assert jobext.resolve_priority(raw, adapter, classes, default_class="standard") == ("standard", 50)
    named = with_raw_priority(batch_job(), "low")
    assert jobext.resolve_priority(named, adapter, classes, default_class="standard") == ("low", 10)
    # The default is a class like any other: a quota that does not allow it gives nothing.
    assert jobext.resolve_priority(
        raw, adapter, classes, default_class="standard", allowed_classes=frozenset({"low"})
    ) == (None, None)
    spec = jobext.desired_spec(raw, adapter, classes, default_class="standard")
    assert (spec["priorityClassName"], spec["priority"]) == ("standard", 50)


def test_a_workflows_own_priority_comes_before_the_default_class() -> None:
    adapter = registry.by_extension("workflow")
    got = jobext.resolve_priority(
        _workflow(700), adapter, {"standard": 50}, default_class="standard", max_user_priority=100
    )
    assert got == (None, 100)

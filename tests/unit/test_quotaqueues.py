"""ElasticQuota → Queue (docs/compatibility.md#queues-from-elasticquotas,
docs/compatibility.md#s31-queue-from-an-elasticquota) as pure decisions."""

from __future__ import annotations

from typing import Any

from koord_queue.shared.api import names
from koord_queue.shared.core import quotaqueues


def quota(
    *, policy: str | None = None, annotations: dict[str, str] | None = None, parent: str | None = None
) -> dict[str, Any]:
    labels = {}
    if policy is not None:
        labels[names.QUEUE_POLICY_LABEL] = policy
    if parent is not None:
        labels[names.QUOTA_PARENT_LABEL] = parent
    return {
        "metadata": {
            "name": "team-a",
            "namespace": "kube-system",
            "labels": labels,
            "annotations": annotations or {},
        }
    }


def test_a_quota_gets_a_queue_of_its_name_with_its_policy_annotations_and_parent() -> None:
    intent = quotaqueues.intent(
        quota(
            policy="Block",
            parent="root-a",
            annotations={names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", "unrelated/key": "x"},
        ),
        names.COMPONENT_NAMESPACE,
    )
    queue = intent.queue
    assert intent.policy_problem is None
    assert queue["metadata"]["name"] == "team-a"
    assert queue["metadata"]["namespace"] == names.COMPONENT_NAMESPACE
    assert queue["spec"] == {"queuePolicy": "Block", "priority": 1000}
    assert queue["metadata"]["annotations"] == {
        names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
        names.QUOTA_HOLDER_ANNOTATION: "kube-system",  # the claim on the name
    }
    assert queue["metadata"]["labels"][names.QUOTA_PARENT_LABEL] == "root-a"
    assert quotaqueues.created_from_quota(queue)


def test_without_a_policy_label_the_queue_uses_priority() -> None:
    assert quotaqueues.intent(quota(), names.COMPONENT_NAMESPACE).queue["spec"]["queuePolicy"] == "Priority"


def test_an_unsupported_policy_falls_back_to_priority_and_says_why() -> None:
    intent = quotaqueues.intent(quota(policy="FIFO"), names.COMPONENT_NAMESPACE)
    assert intent.queue["spec"]["queuePolicy"] == "Priority"
    assert intent.policy_problem is not None
    assert '"FIFO"' in intent.policy_problem and "Intelligent" in intent.policy_problem


def test_an_update_reverts_a_hand_set_policy_and_keeps_other_annotations() -> None:
    existing = {
        "metadata": {
            "annotations": {"mine": "keep", names.MAX_DEPTH_ANNOTATION: "3"},
            "labels": {names.QUOTA_PARENT_LABEL: "old"},
        },
        "spec": {"queuePolicy": "Block", "priority": 5},
    }
    wanted = quotaqueues.intent(quota(annotations={names.MAX_DEPTH_ANNOTATION: "4"}), "ns").queue
    patch = quotaqueues.update_patch(existing, wanted)
    assert patch == {
        "spec": {"queuePolicy": "Priority"},
        "metadata": {
            "annotations": {names.MAX_DEPTH_ANNOTATION: "4", names.QUOTA_HOLDER_ANNOTATION: "kube-system"},
            "labels": {names.QUOTA_PARENT_LABEL: None},
        },
    }


def test_no_patch_when_the_queue_is_in_step() -> None:
    wanted = quotaqueues.intent(quota(policy="Block"), "ns").queue
    assert quotaqueues.update_patch(wanted, wanted) is None


def test_the_queue_lives_in_the_namespace_the_component_is_installed_in() -> None:
    """docs/operations.md#install-namespace: an install in ``platform-queue`` keeps its Queues there."""
    queue = quotaqueues.intent(quota(), "platform-queue").queue
    assert queue["metadata"]["namespace"] == "platform-queue"

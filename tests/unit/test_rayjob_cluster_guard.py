"""A RayJob's RayCluster is guarded like its admitted RayJob (docs/compatibility.md#rayjob).

KubeRay creates the cluster from the RayJob's ``rayClusterSpec``, controlled by the RayJob and with
its labels (quota label included) copied; the cluster is not managed itself, and the RayJob's unit
charges the pods KubeRay makes from the cluster's templates. So a user's edit of the cluster's
templates, owner references, quota label or gates is refused as it would be on the admitted
RayJob, while KubeRay's own writes (replicas, ``workersToDelete``, worker-group ``suspend``,
finalizers) and the reconciler's pass (``shared.admission.jobguards.guard_rayjob_cluster``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import AdmissionConfig, Operation
from koord_queue.shared.api import names
from tests.unit.test_admission import CONFIG, NOW, RECONCILER, decoded_patch, mutate, review_body, validate
from tests.unit.test_job_adapters import SAMPLES, apply_patch

KUBERAY = "system:serviceaccount:ray-system:kuberay-operator"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"
Edit = Callable[[dict[str, Any]], None]


def rayjobs_cluster(api_version: str = "ray.io/v1") -> dict[str, Any]:
    """The RayCluster KubeRay makes for the sample RayJob once admitted: the RayJob's gated
    cluster spec, its labels plus KubeRay's origin labels, controlled by the RayJob."""
    job = SAMPLES["rayjob"]()
    held = apply_patch(job, decoded_patch(mutate(job)))
    labels = {
        **held["metadata"].get("labels", {}),
        "ray.io/originated-from-cr-name": "ray",
        "ray.io/originated-from-crd": "RayJob",
    }
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "ray", "uid": "ray-uid", "controller": True}
    return {
        "apiVersion": api_version,
        "kind": "RayCluster",
        "metadata": {
            "name": "ray-raycluster-x",
            "namespace": "ns",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": copy.deepcopy(held["spec"]["rayClusterSpec"]),
    }


def worker(cluster: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = cluster["spec"]["workerGroupSpecs"][0]
    return group


def raise_worker_requests(c: dict[str, Any]) -> None:
    worker(c)["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"


def add_container(c: dict[str, Any]) -> None:
    worker(c)["template"]["spec"]["containers"].append({"name": "miner", "image": "busybox"})


def set_runtime_class(c: dict[str, Any]) -> None:
    worker(c)["template"]["spec"]["runtimeClassName"] = "kata"


def remove_gate(c: dict[str, Any]) -> None:
    worker(c)["template"]["spec"]["schedulingGates"] = []


def drop_owner(c: dict[str, Any]) -> None:
    c["metadata"]["ownerReferences"] = []


def relabel(c: dict[str, Any]) -> None:
    del c["metadata"]["labels"][names.QUOTA_NAME_LABEL]


def edited(edit: Edit, api_version: str = "ray.io/v1") -> tuple[dict[str, Any], dict[str, Any]]:
    old = rayjobs_cluster(api_version)
    new = copy.deepcopy(old)
    edit(new)
    return old, new


REFUSED = [
    pytest.param(raise_worker_requests, "spec", "resource requests of pod set(s) small-group", id="requests"),
    pytest.param(add_container, "spec", "containers (names)", id="container"),
    pytest.param(set_runtime_class, "spec", "runtimeClassName", id="runtime-class"),
    pytest.param(
        remove_gate, "spec.workerGroupSpecs[0].template.spec.schedulingGates", "scheduling gate", id="gate"
    ),
    pytest.param(drop_owner, "metadata.ownerReferences", "owner references", id="owner"),
    pytest.param(relabel, f"metadata.labels[{names.QUOTA_NAME_LABEL}]", "quota label", id="quota-label"),
]


@pytest.mark.parametrize(("edit", "path", "said"), REFUSED)
@pytest.mark.parametrize("api_version", ["ray.io/v1", "ray.io/v1alpha1"])
def test_a_user_cannot_change_what_a_rayjobs_cluster_is_charged_for(
    edit: Edit, path: str, said: str, api_version: str
) -> None:
    old, new = edited(edit, api_version)
    response = validate(new, operation="UPDATE", old=old, user="alice")
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith(f"{path}: Forbidden: the RayCluster runs the pods of RayJob ray"), message
    assert said in message, message


@pytest.mark.parametrize(("edit", "path", "said"), [p for p in REFUSED if p.id != "owner"])
def test_kuberay_is_held_to_the_same_rules_but_keeps_its_own_writes(edit: Edit, path: str, said: str) -> None:
    """KubeRay never edits a cluster's templates, labels or owners; what it does write passes."""
    old, new = edited(edit)
    assert validate(new, operation="UPDATE", old=old, user=KUBERAY)["allowed"] is False


def kuberay_writes(c: dict[str, Any]) -> None:
    worker(c)["replicas"] = 5
    worker(c)["scaleStrategy"] = {"workersToDelete": ["ray-worker-0"]}
    worker(c)["suspend"] = True
    c["metadata"]["finalizers"] = ["ray.io/gcs-ft-redis-cleanup-finalizer"]
    c["metadata"]["annotations"] = {"example.com/note": "x"}
    worker(c)["template"]["spec"]["containers"][0]["image"] = "rayproject/ray:2"


@pytest.mark.parametrize("user", [KUBERAY, "alice"])
def test_replicas_suspend_finalizers_and_free_fields_may_change(user: str) -> None:
    old, new = edited(kuberay_writes)
    assert validate(new, operation="UPDATE", old=old, user=user)["allowed"] is True


def test_the_reconciler_and_the_garbage_collector_keep_their_rights() -> None:
    old, new = edited(raise_worker_requests)
    assert validate(new, operation="UPDATE", old=old, user=RECONCILER)["allowed"] is True
    old, new = edited(drop_owner)  # an orphaning delete of the RayJob
    assert validate(new, operation="UPDATE", old=old, user=GC)["allowed"] is True


def test_a_cluster_without_a_quota_label_is_guarded_only_where_queueing_is_mandatory() -> None:
    """Where queueing is mandatory an unlabelled RayJob is queued, and its unlabelled cluster's
    updates come through ``/validate-unlabelled`` (docs/operations.md#mandatory-queueing)."""
    old, new = edited(raise_worker_requests)
    for c in (old, new):
        del c["metadata"]["labels"][names.QUOTA_NAME_LABEL]
    assert validate(new, operation="UPDATE", old=old, user="alice")["allowed"] is True
    body = review_body(new, operation="UPDATE", old=old, user="alice")
    answer = admission.review(body, operation=Operation.VALIDATE, config=CONFIG, now_text=NOW, all_jobs=True)
    assert answer["response"]["allowed"] is False


def test_a_standalone_cluster_is_left_to_its_own_rules() -> None:
    old, new = edited(raise_worker_requests)
    for c in (old, new):
        c["metadata"]["ownerReferences"] = []
        for key in ("ray.io/originated-from-cr-name", "ray.io/originated-from-crd"):
            del c["metadata"]["labels"][key]
    # Not a RayJob's, and the raycluster extension is off: not ours to guard.
    assert validate(new, operation="UPDATE", old=old, user="alice")["allowed"] is True


def test_no_guard_while_rayjobs_are_not_queued() -> None:
    old, new = edited(raise_worker_requests)
    only_jobs = AdmissionConfig(enabled_extensions=frozenset({"job"}))
    assert validate(new, only_jobs, operation="UPDATE", old=old, user="alice")["allowed"] is True

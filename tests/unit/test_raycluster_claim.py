"""A RayCluster's parent is resolved, not read (docs/compatibility.md#raycluster,
docs/architecture.md#trust-boundaries).

With the ``raycluster`` extension on, a labelled RayCluster is queued unless its controller owner
reference names a RayJob or RayService, and that reference is only a claim: any namespace user can
write it on CREATE, as they can KubeRay's ``ray.io/originated-from-crd`` label, which claims nothing.
The webhook has no API client, so a cluster that claims a parent is stored unsuspended with every
head and worker template behind the admission gate, naming the claimed parent's QueueUnit; the
reconciler resolves the claim (``JobExtensions._genuine_child``): a RayJob's real cluster is
released under the RayJob's admission, a forged one queued as its own.
"""

from __future__ import annotations

import copy
from typing import Any

from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import AdmissionConfig, Operation
from koord_queue.shared.api import names
from koord_queue.shared.jobs import patches, ray
from tests.unit.test_admission import CONFIG, NOW, decoded_patch, mutate, review_body, validate
from tests.unit.test_rayjob_cluster_guard import rayjobs_cluster

GATE = {"name": names.ADMISSION_GATE}
RAYCLUSTERS = AdmissionConfig(enabled_extensions=CONFIG.enabled_extensions | {"raycluster"})
#: Only RayClusters queued: a claim on a RayJob can then never be genuine.
ONLY_RAYCLUSTERS = AdmissionConfig(enabled_extensions=frozenset({"raycluster"}))
FORGED = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "name": "ghost",
    "uid": "no-such-uid",
    "controller": True,
}


def labelled_cluster(*, owner: dict[str, Any] | None = None, origin: bool = False) -> dict[str, Any]:
    """A user's own labelled RayCluster (a head and one worker group, nothing gated)."""

    def template() -> dict[str, Any]:
        return {
            "spec": {"containers": [{"name": "ray", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}
        }

    meta: dict[str, Any] = {"name": "rc", "namespace": "ns", "labels": {names.QUOTA_NAME_LABEL: "q"}}
    if origin:
        meta["labels"]["ray.io/originated-from-crd"] = "RayJob"
        meta["labels"]["ray.io/originated-from-cr-name"] = "ghost"
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": meta,
        "spec": {
            "headGroupSpec": {"template": template()},
            "workerGroupSpecs": [{"groupName": "workers", "replicas": 2, "template": template()}],
        },
    }


def stored(cluster: dict[str, Any], config: AdmissionConfig = RAYCLUSTERS, **kw: Any) -> dict[str, Any]:
    response = mutate(cluster, config, **kw)
    assert response["allowed"] is True
    return patches.applied(cluster, decoded_patch(response)) if "patch" in response else cluster


def templates(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


# --- which clusters are queued --------------------------------------------------------------------


def test_only_a_controller_reference_to_a_rayjob_or_rayservice_claims_a_parent() -> None:
    assert ray.claimed_parent(labelled_cluster(origin=True)) is None
    assert ray.claimed_parent(labelled_cluster(owner={**FORGED, "controller": False})) is None
    assert ray.claimed_parent(labelled_cluster(owner={**FORGED, "apiVersion": "example.com/v1"})) is None
    claim = ray.claimed_parent(labelled_cluster(owner=FORGED))
    assert claim is not None and (claim.kind, claim.name, claim.uid) == ("RayJob", "ghost", "no-such-uid")
    service = ray.claimed_parent(labelled_cluster(owner={**FORGED, "kind": "RayService"}))
    assert service is not None and service.kind == "RayService"


def test_the_reconciler_resolves_a_clusters_claim_like_a_jobs() -> None:
    """``JobExtensions.managed`` counts a claiming cluster in, and ``_genuine_child`` resolves the
    claim it is handed here."""
    adapter = ray.RayClusterAdapter()
    claim = JobExtensions._claim(adapter, labelled_cluster(owner=FORGED))
    assert claim is not None and claim.name == "ghost"
    assert JobExtensions._claim(adapter, labelled_cluster(origin=True)) is None


# --- at the door ----------------------------------------------------------------------------------


def test_a_labelled_cluster_claiming_a_rayjob_is_stored_gated_naming_the_rayjobs_unit_unsuspended() -> None:
    after = stored(labelled_cluster(owner=FORGED))
    unit = f"ns/{ray.RayJobAdapter().queue_unit_name({'metadata': {'name': 'ghost'}})}"
    for template in templates(after):
        assert template["spec"]["schedulingGates"] == [GATE]
        assert template["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == unit
    assert "suspend" not in after["spec"]  # a real RayJob's cluster must not be held


def test_a_cluster_with_only_the_origin_label_is_held_like_any_labelled_cluster() -> None:
    after = stored(labelled_cluster(origin=True))
    assert after["spec"]["suspend"] is True
    for template in templates(after):
        assert GATE in template["spec"]["schedulingGates"]
    assert names.JOB_HAS_ENQUEUED_ANNOTATION in after["metadata"]["annotations"]


def test_kuberays_cluster_for_a_rayjob_already_carries_the_rayjobs_gates_and_gets_nothing() -> None:
    response = mutate(
        rayjobs_cluster(), RAYCLUSTERS, user="system:serviceaccount:ray-system:kuberay-operator"
    )
    assert response["allowed"] is True and "patch" not in response


def test_a_rayservice_claim_gates_the_pods_without_naming_a_unit() -> None:
    after = stored(labelled_cluster(owner={**FORGED, "kind": "RayService"}))
    for template in templates(after):
        assert template["spec"]["schedulingGates"] == [GATE]
        assert names.RELATED_QUEUEUNIT_ANNOTATION not in (template.get("metadata") or {}).get(
            "annotations", {}
        )
    assert "suspend" not in after["spec"]


def test_an_unlabelled_claiming_cluster_is_gated_only_where_queueing_is_mandatory() -> None:
    cluster = labelled_cluster(owner=FORGED)
    del cluster["metadata"]["labels"][names.QUOTA_NAME_LABEL]
    response = mutate(cluster, RAYCLUSTERS)
    assert response["allowed"] is True and "patch" not in response
    body = review_body(cluster)
    answer = admission.review(
        body, operation=Operation.MUTATE, config=RAYCLUSTERS, now_text=NOW, all_jobs=True
    )
    after = patches.applied(cluster, decoded_patch(answer["response"]))
    assert all(t["spec"]["schedulingGates"] == [GATE] for t in templates(after))


def test_no_gate_while_rayclusters_are_not_queued() -> None:
    response = mutate(labelled_cluster(owner=FORGED), CONFIG)
    assert response["allowed"] is True and "patch" not in response


# --- the gate stays until the claim is resolved ---------------------------------------------------


def test_its_owner_cannot_take_the_gate_off_a_claiming_cluster_where_only_rayclusters_are_queued() -> None:
    old = stored(labelled_cluster(owner=FORGED), ONLY_RAYCLUSTERS)
    new = copy.deepcopy(old)
    new["spec"]["workerGroupSpecs"][0]["template"]["spec"]["schedulingGates"] = []
    response = validate(new, ONLY_RAYCLUSTERS, operation="UPDATE", old=old, user="alice")
    assert response["allowed"] is False
    assert names.ADMISSION_GATE in response["status"]["message"]


def test_a_held_cluster_with_only_the_origin_label_keeps_a_managed_jobs_rules() -> None:
    """The origin label does not turn the RayJob cluster guard on in place of the managed job's
    rules (which leave a held job's templates free but refuse a user's release)."""
    old = stored(labelled_cluster(origin=True))
    unsuspended = copy.deepcopy(old)
    unsuspended["spec"]["suspend"] = False
    assert validate(unsuspended, RAYCLUSTERS, operation="UPDATE", old=old, user="alice")["allowed"] is False
    resized = copy.deepcopy(old)
    resized["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "cpu"
    ] = "2"
    assert validate(resized, RAYCLUSTERS, operation="UPDATE", old=old, user="alice")["allowed"] is True

"""A Job claiming a parent is gated at the door, not let in as it is
(docs/architecture.md#trust-boundaries, docs/compatibility.md#batchv1-job).

The webhook has no API client, so it cannot tell a JobSet's or an MPIJob's real child Job (or a
RayJob's submitter) from a Job a user made with a controller reference to a parent that does not
exist. A Job that would be queued (a quota label, or a namespace where queueing is mandatory) but
claims a parent is therefore stored unsuspended with its pod template behind the admission gate and
naming the claimed parent's QueueUnit: its pods exist but cannot be scheduled until the reconciler
resolved the claim. A real child released under its parent's admission, a forged one queued as
its own job; and the RayJob submitter, which is no pod set, is released one pod at a time while its
RayJob is admitted (``shared.jobs.ray.submitter_release``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared.admission import decisions as admission
from shared.admission.decisions import Operation
from shared.api import names
from shared.jobs import patches, ray
from tests.unit.test_admission import CONFIG, NOW, decoded_patch, mutate, review_body, validate

GATE = {"name": names.ADMISSION_GATE}
TFJOB = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "parent", "uid": "u-1", "controller": True}
JOBSET = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "name": "js",
    "uid": "u-2",
    "controller": True,
}


def claiming_job(
    owner: dict[str, Any] | None, *, quota: str | None = "q", **template_meta: Any
) -> dict[str, Any]:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    meta: dict[str, Any] = {"name": "child", "namespace": "ns"}
    if quota is not None:
        meta["labels"] = {names.QUOTA_NAME_LABEL: quota}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    template: dict[str, Any] = {"spec": {"containers": [container]}}
    if template_meta:
        template["metadata"] = template_meta
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": template}}


def stored(job: dict[str, Any], **kw: Any) -> dict[str, Any]:
    response = mutate(job, **kw)
    assert response["allowed"] is True
    return patches.applied(job, decoded_patch(response)) if "patch" in response else job


# --- at the door ----------------------------------------------------------------------------------


def test_a_labelled_job_claiming_a_parent_is_stored_gated_naming_the_parents_unit_and_unsuspended() -> None:
    after = stored(claiming_job(TFJOB))
    template = after["spec"]["template"]
    assert template["spec"]["schedulingGates"] == [GATE]
    assert template["metadata"]["annotations"] == {names.RELATED_QUEUEUNIT_ANNOTATION: "ns/parent-tf-qu"}
    assert "suspend" not in after["spec"]  # a real child must not be held: its parent would wait forever
    assert names.JOB_HAS_ENQUEUED_ANNOTATION not in (after["metadata"].get("annotations") or {})


def test_a_real_child_that_inherited_its_parents_gate_and_unit_gets_nothing_twice() -> None:
    unit = {names.RELATED_QUEUEUNIT_ANNOTATION: "ns/js-jobset-qu", names.RELATED_PODSET_ANNOTATION: "workers"}
    job = claiming_job(JOBSET, annotations=dict(unit))
    job["spec"]["template"]["spec"]["schedulingGates"] = [GATE]
    response = mutate(job)
    assert response["allowed"] is True and "patch" not in response  # nothing to add


def test_the_claimed_parents_unit_replaces_any_unit_the_template_names() -> None:
    """Only the claimed parent's admission could release the pods, whatever the template says."""
    job = claiming_job(TFJOB, annotations={names.RELATED_QUEUEUNIT_ANNOTATION: "ns/someone-elses"})
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "other"}]
    template = stored(job)["spec"]["template"]
    assert template["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == "ns/parent-tf-qu"
    assert template["spec"]["schedulingGates"] == [{"name": "other"}, GATE]


def test_a_parent_kind_without_an_adapter_gates_the_pods_without_naming_a_unit() -> None:
    """A Katib Trial (``kubeflow.org``) queues nothing; the Job is queued on its own label and the
    reconciler names its unit when it releases it."""
    trial = {**TFJOB, "kind": "Trial", "apiVersion": "kubeflow.org/v1beta1"}
    template = stored(claiming_job(trial))["spec"]["template"]
    assert template["spec"]["schedulingGates"] == [GATE]
    assert names.RELATED_QUEUEUNIT_ANNOTATION not in (template.get("metadata") or {}).get("annotations", {})


@pytest.mark.parametrize(
    ("quota", "all_jobs", "gated"),
    [("q", False, True), (None, False, False), (None, True, True)],
    ids=["labelled", "unlabelled", "unlabelled-where-queueing-is-mandatory"],
)
def test_only_a_job_that_would_be_queued_is_gated(quota: str | None, all_jobs: bool, gated: bool) -> None:
    job = claiming_job(TFJOB, quota=quota)
    answer = admission.review(
        review_body(job), operation=Operation.MUTATE, config=CONFIG, now_text=NOW, all_jobs=all_jobs
    )["response"]
    assert ("patch" in answer) is gated


def test_a_job_claiming_no_parent_of_a_queued_group_is_held_as_before() -> None:
    foreign = {**TFJOB, "apiVersion": "example.com/v1", "kind": "Thing"}
    after = stored(claiming_job(foreign))
    assert after["spec"]["suspend"] is True


def test_updates_of_a_gated_real_child_pass_the_validating_rules() -> None:
    """Its controller keeps writing it (a JobSet suspends, resumes and relabels its child, KubeRay
    leaves it be); none of the hold rules apply to a Job that is not queued itself, and the one rule
    it has, that the gate stays, never bites a controller: the parent's template it copies keeps
    the gate."""
    old = stored(claiming_job(JOBSET))
    for change in ({"suspend": True}, {"suspend": False}, {"parallelism": 3}):
        new = copy.deepcopy(old)
        new["spec"].update(change)
        new["spec"]["template"]["metadata"]["labels"] = {"jobset.sigs.k8s.io/restart-attempt": "1"}
        assert validate(new, operation="UPDATE", old=old, user="system:serviceaccount:jobset:jobset")[
            "allowed"
        ]


# --- the RayJob submitter --------------------------------------------------------------------------

RAYJOB_UID = "ray-uid"
ADAPTER = ray.RayJobAdapter()


def rayjob() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj", "namespace": "ns", "uid": RAYJOB_UID},
    }


def submitter_job(name: str = "rj", *, owner_uid: str = RAYJOB_UID) -> dict[str, Any]:
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rj", "uid": owner_uid, "controller": True}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"job-{name}", "ownerReferences": [owner]}}


def pod(
    name: str, job: str = "rj", *, gated: bool = True, created: str = "2026-01-01T00:00:00Z", **extra: Any
) -> dict[str, Any]:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"job-{job}", "controller": True}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "ownerReferences": [owner],
        "creationTimestamp": created,
    }
    meta.update(extra.pop("meta", {}))
    spec: dict[str, Any] = {"schedulingGates": [GATE] if gated else [], **extra.pop("spec", {})}
    return {"metadata": meta, "spec": spec, **extra}


def released(pods: list[dict[str, Any]], jobs: list[dict[str, Any]] | None = None) -> list[str]:
    stores = {j["metadata"]["name"]: j for j in (jobs if jobs is not None else [submitter_job()])}

    def parent(kind: str, name: str) -> dict[str, Any] | None:
        return stores.get(name) if kind == "Job" else None

    return [p["metadata"]["name"] for p in ray.submitter_release(rayjob(), pods, parent, adapter=ADAPTER)]


def test_the_oldest_gated_submitter_pod_is_released() -> None:
    pods = [pod("b", created="2026-01-01T00:00:02Z"), pod("a", created="2026-01-01T00:00:01Z")]
    assert released(pods) == ["a"]


def test_no_second_submitter_pod_is_released_while_one_is_live() -> None:
    assert released([pod("a", gated=False), pod("b")]) == []
    bound_leaving = pod("a", gated=False, spec={"nodeName": "n"}, meta={"deletionTimestamp": "x"})
    assert released([bound_leaving, pod("b")]) == []
    finished = pod("a", gated=False, status={"phase": "Failed"})
    unbound_leaving = pod("c", gated=False, meta={"deletionTimestamp": "x"})
    assert released([finished, unbound_leaving, pod("b")]) == ["b"]


def test_only_the_job_kuberay_names_after_the_rayjob_and_the_rayjob_controls_counts() -> None:
    other_name = [submitter_job("rj"), submitter_job("extra")]
    assert released([pod("a", job="extra")], other_name) == []  # another Job of the RayJob
    assert released([pod("a")], [submitter_job(owner_uid="someone-else")]) == []  # not the RayJob's
    assert released([pod("a")], []) == []  # the Job is not known (yet)


def test_a_pod_in_a_pod_set_of_the_rayjob_is_left_to_the_pod_set_release() -> None:
    assert released([pod("a", meta={"labels": {"ray.io/node-type": "head"}})]) == []


# --- the gate stays ------------------------------------------------------------------------------


def held_forged_job() -> dict[str, Any]:
    """A forged child as the reconciler left it: held (suspended), its template still gated."""
    job = stored(claiming_job(TFJOB))
    job["spec"]["suspend"] = True
    return job


def test_its_owner_cannot_take_the_gate_off_a_held_forged_child_to_release_it() -> None:
    old = held_forged_job()
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    new["spec"]["template"]["spec"]["schedulingGates"] = []
    response = validate(new, operation="UPDATE", old=old, user="alice")
    assert response["allowed"] is False
    assert "spec.template.spec.schedulingGates" in response["status"]["message"]
    # Unsuspending alone is hers to do: its pods are born gated and the reconciler holds it again.
    unsuspended = copy.deepcopy(old)
    unsuspended["spec"]["suspend"] = False
    assert validate(unsuspended, operation="UPDATE", old=old, user="alice")["allowed"] is True


def test_the_reconciler_and_a_finished_job_are_free_and_unclaimed_jobs_untouched() -> None:
    old = held_forged_job()
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["schedulingGates"] = []
    assert validate(new, operation="UPDATE", old=old, user=admission.DEFAULT_RECONCILER_USERNAME)["allowed"]
    finished = copy.deepcopy(old)
    finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert validate(new, operation="UPDATE", old=finished, user="alice")["allowed"] is True
    unlabelled = claiming_job(TFJOB, quota=None)
    unlabelled["spec"]["template"]["spec"]["schedulingGates"] = [GATE]
    free = copy.deepcopy(unlabelled)
    free["spec"]["template"]["spec"]["schedulingGates"] = []
    assert validate(free, operation="UPDATE", old=unlabelled, user="alice")["allowed"] is True

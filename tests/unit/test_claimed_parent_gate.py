"""A Job claiming a parent is gated at the door, not let in as it is
(docs/architecture.md#trust-boundaries, docs/compatibility.md#batchv1-job).

The webhook has no API client, so it cannot tell a JobSet's or an MPIJob's real child Job (or a
RayJob's submitter) from a Job a user made with a controller reference to a parent that does not
exist. A Job that would be queued (a quota label, or a namespace where queueing is mandatory) but
claims a parent is therefore stored unsuspended with its pod template behind the admission gate and
naming the claimed parent's QueueUnit: its pods exist but cannot be scheduled until the reconciler
resolved the claim. A real child released under its parent's admission, a forged one queued as
its own job. A RayJob's submitter is its pod set ``submitter``, charged like any other: a Job a user
makes to look like one is released only within that pod set's admitted count and per-pod size
(docs/compatibility.md#rayjob).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from koord_queue.reconciler import job_pods
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import Operation
from koord_queue.shared.api import names
from koord_queue.shared.jobs import batch_job, jobext, patches, podplan, ray
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


def rayjob(**spec: Any) -> dict[str, Any]:
    head = {
        "template": {"spec": {"containers": [{"name": "ray-head", "resources": {"requests": {"cpu": "2"}}}]}}
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj", "namespace": "ns", "uid": RAYJOB_UID},
        "spec": {"rayClusterSpec": {"headGroupSpec": head}, **spec},
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
        "uid": f"pod-{name}",
        "ownerReferences": [owner],
        "creationTimestamp": created,
    }
    meta.update(extra.pop("meta", {}))
    cpu = extra.pop("cpu", "500m")
    containers = [{"name": "ray-job-submitter", "resources": {"requests": {"cpu": cpu, "memory": "200Mi"}}}]
    spec: dict[str, Any] = {"schedulingGates": [GATE] if gated else [], "containers": containers}
    spec.update(extra.pop("spec", {}))
    return {"metadata": meta, "spec": spec, **extra}


def per_pod(job: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {ps.name: ps.per_pod for ps in ADAPTER.pod_sets(job)}


def test_the_submitter_is_a_pod_set_of_kuberays_default_size_in_k8s_job_mode() -> None:
    assert per_pod(rayjob())["submitter"] == {"cpu": 500, "memory": 200 * 2**20 * 1000}
    assert per_pod(rayjob(submissionMode="K8sJobMode"))["submitter"] == {
        "cpu": 500,
        "memory": 200 * 2**20 * 1000,
    }
    declared = {"spec": {"containers": [{"name": "s", "resources": {"requests": {"cpu": "3"}}}]}}
    assert per_pod(rayjob(submitterPodTemplate=declared))["submitter"] == {"cpu": 3000}
    assert "submitter" not in per_pod(rayjob(submissionMode="HTTPMode"))
    assert "submitter" not in per_pod(rayjob(submissionMode="InteractiveMode"))


def test_in_sidecar_mode_the_head_pod_is_charged_with_the_submitter_container() -> None:
    sizes = per_pod(rayjob(submissionMode="SidecarMode"))
    assert "submitter" not in sizes
    assert sizes["head"] == {"cpu": 2500, "memory": 200 * 2**20 * 1000}


def test_a_declared_submitter_template_is_gated_and_linked_like_the_clusters() -> None:
    declared = {"spec": {"containers": [{"name": "s", "resources": {"requests": {"cpu": "1"}}}]}}
    job = rayjob(submitterPodTemplate=declared)
    job["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: "q"}
    stored = patches.applied(job, ADAPTER.suspend_patch(job, now_text=NOW))
    template = stored["spec"]["submitterPodTemplate"]
    assert template["spec"]["schedulingGates"] == [GATE]
    assert template["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] == "submitter"


def test_a_pod_a_job_controls_is_the_submitters_whatever_its_annotations_say() -> None:
    head_claim = pod("a", meta={"annotations": {names.RELATED_PODSET_ANNOTATION: "head"}})
    assert ADAPTER.pod_set_of(head_claim) == "submitter"
    cluster_pod = {"metadata": {"annotations": {names.RELATED_PODSET_ANNOTATION: "head"}}}
    assert ADAPTER.pod_set_of(cluster_pod) == "head"


def test_the_submitter_job_is_the_one_named_after_the_rayjob_that_the_rayjob_controls() -> None:
    assert job_pods.submitter_job({"ns/rj": submitter_job()}, rayjob()) == "job-rj"
    assert job_pods.submitter_job({"ns/rj": submitter_job(owner_uid="someone-else")}, rayjob()) is None
    assert job_pods.submitter_job({"ns/extra": submitter_job("extra")}, rayjob()) is None
    assert job_pods.submitter_job({}, rayjob()) is None


def admitted_unit(job: dict[str, Any]) -> dict[str, Any]:
    unit = jobext.build_queue_unit(job, ADAPTER, {})
    admissions = [
        {"name": ps["name"], "replicas": ps["count"], "running": 0} for ps in unit["spec"]["podSet"]
    ]
    return {**unit, "status": {"phase": "Dequeued", "admissions": admissions}}


def test_a_forged_submitter_larger_than_the_admitted_one_stays_gated() -> None:
    """The attack: a Job the user made, named after her admitted RayJob and controlled by it, with
    one large pod. It is counted in the submitter pod set and held to its admitted size."""
    unit = admitted_unit(rayjob())
    big = podplan.pod_view(pod("big", cpu="32"), "submitter")
    plan = podplan.plan_pods(unit, [big])
    assert plan.ungate == []
    [(withheld, why)] = plan.withheld
    assert withheld.name == "big"
    assert why == "it asks for more than pod set submitter was admitted with per pod (cpu 32 > 500m)"


def test_one_submitter_pod_of_the_admitted_size_is_released_and_no_second() -> None:
    unit = admitted_unit(rayjob())
    first = podplan.pod_view(pod("a", created="2026-01-01T00:00:01Z"), "submitter")
    second = podplan.pod_view(pod("b", created="2026-01-01T00:00:02Z"), "submitter")
    assert [p.name for p in podplan.plan_pods(unit, [second, first]).ungate] == ["a"]
    running = podplan.pod_view(pod("a", gated=False, spec={"nodeName": "n"}), "submitter")
    assert podplan.plan_pods(unit, [running, second]).ungate == []


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


# --- a held forged child that already ran -----------------------------------------------------------


def test_a_started_job_is_resumed_without_touching_its_template() -> None:
    """The apiserver refuses any template change once a Job has started (``status.startTime``), so a
    forged child the Job controller started before the reconciler held it is resumed with its
    template as it is; its pods are found through their controller reference
    (docs/compatibility.md#batchv1-job). One that never started is relinked to its own unit."""
    adapter = batch_job.BatchJobAdapter()
    job = claiming_job(TFJOB)
    job["metadata"].update(name="child", namespace="ns")
    fresh = adapter.resume_patch(job, now_text=NOW)
    assert (
        fresh["spec"]["template"]["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == "ns/child"
    )
    started = adapter.resume_patch({**job, "status": {"startTime": NOW}}, now_text=NOW)
    assert "template" not in started["spec"] and started["spec"]["suspend"] is False

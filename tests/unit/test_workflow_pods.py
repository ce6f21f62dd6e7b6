"""A Workflow's pods are born gated and released only within what it was admitted for
(docs/compatibility.md#argo-workflow): ``koord-queue/min-resources`` is a reservation the summed
requests of its running pods never exceed (``shared.jobs.podbudget`` through
``shared.jobs.podplan.plan_pods``), the webhook's gating in ``spec.podMetadata`` (``shared.jobs.workflow``)
cannot be taken off, and only pods the Workflow controls count (``reconciler.job_pods.pods_of``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from koord_queue.reconciler import job_pods
from koord_queue.shared.api import names
from koord_queue.shared.jobs import podplan, registry
from koord_queue.shared.jobs.base import JobAdapter
from koord_queue.shared.jobs.patches import applied
from tests.unit.test_job_adapters import merge_patch


def _workflow_adapter() -> JobAdapter:
    found = registry.by_kind("argoproj.io/v1alpha1", "Workflow")
    assert found is not None
    return found


WF = _workflow_adapter()
WORKFLOW_UID = "uid-wf"


def unit(reservation: dict[str, str], *, phase: str = "Running", replicas: int = 1) -> dict[str, Any]:
    """A Workflow's admitted unit, as the reconciler builds it: one pod set ``default`` of one
    replica sized ``reservation`` (its min-resources)."""
    container = {"name": "default", "resources": {"requests": reservation, "limits": reservation}}
    return {
        "metadata": {"name": "wf", "namespace": "ns"},
        "spec": {
            "consumerRef": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf"},
            "podSet": [{"name": "default", "count": 1, "template": {"spec": {"containers": [container]}}}],
        },
        "status": {"phase": phase, "admissions": [{"name": "default", "replicas": replicas, "running": 1}]},
    }


def step(
    name: str,
    cpu: str,
    *,
    gated: bool = True,
    bound: bool = False,
    deleting: bool = False,
    phase: str = "Pending",
    owner_uid: str = WORKFLOW_UID,
    owner_kind: str = "Workflow",
) -> dict[str, Any]:
    """A step pod as Argo's controller creates it from the gated ``spec.podMetadata``."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "creationTimestamp": f"2026-01-01T00:00:0{name[-1]}Z",
        "labels": {"workflows.argoproj.io/workflow": "wf", names.GATED_POD_LABEL: "true"},
        "annotations": {
            names.RELATED_QUEUEUNIT_ANNOTATION: "ns/wf",
            names.RELATED_PODSET_ANNOTATION: "default",
        },
        "ownerReferences": [
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": owner_kind,
                "name": "wf",
                "uid": owner_uid,
                "controller": True,
            }
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": names.ADMISSION_GATE}]
    if bound:
        spec["nodeName"] = "node-1"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def views(*pods: dict[str, Any]) -> list[podplan.PodView]:
    """The unit's pods as the reconciler finds them: only those the Workflow controls count."""
    store = {f"ns/{p['metadata']['name']}": p for p in pods}
    job = {"metadata": {"name": "wf", "namespace": "ns", "uid": WORKFLOW_UID}}
    return job_pods.pods_of(store, sorted(store), {}, "ns/wf", WF, job)


def released(plan: podplan.PodPlan) -> list[str]:
    return [p.name for p in plan.ungate]


# --- the release decision ------------------------------------------------------------------------


def test_a_step_that_fits_the_reservation_is_released() -> None:
    plan = podplan.plan_pods(unit({"cpu": "1"}), views(step("p1", "1")))
    assert released(plan) == ["p1"]
    assert plan.waiting == [] and plan.withheld == []


def test_parallel_steps_that_fit_together_are_released_together() -> None:
    plan = podplan.plan_pods(unit({"cpu": "2"}), views(step("p1", "1"), step("p2", "1")))
    assert released(plan) == ["p1", "p2"]


def test_parallel_steps_larger_in_sum_than_the_reservation_run_one_after_another() -> None:
    """Two 1-CPU steps under a 1-CPU reservation: the older runs, the younger waits with a reason
    (a Normal event), and is released once the first has finished."""
    reservation = unit({"cpu": "1"})
    plan = podplan.plan_pods(reservation, views(step("p1", "1"), step("p2", "1")))
    assert released(plan) == ["p1"]
    [(pod, why)] = plan.waiting
    assert pod.name == "p2"
    assert (
        why == "it asks for cpu 1 and the job's running pods use cpu 1 of its reservation (cpu 1); "
        "it is released when they leave room"
    )
    assert plan.withheld == []

    running = step("p1", "1", gated=False, bound=True, phase="Running")
    assert released(podplan.plan_pods(reservation, views(running, step("p2", "1")))) == []
    finished = step("p1", "1", gated=False, bound=True, phase="Succeeded")
    assert released(podplan.plan_pods(reservation, views(finished, step("p2", "1")))) == ["p2"]


def test_a_step_released_but_not_yet_bound_holds_its_share() -> None:
    out_of_gate = step("p1", "1", gated=False)
    plan = podplan.plan_pods(unit({"cpu": "1"}), views(out_of_gate, step("p2", "1")))
    assert released(plan) == [] and [p.name for p, _ in plan.waiting] == ["p2"]
    assert plan.unadmitted == []


def test_a_terminating_step_counts_until_it_is_gone() -> None:
    """A bound pod being deleted runs on for its grace period (docs/compatibility.md#pod-gating)."""
    reservation = unit({"cpu": "1"})
    leaving = step("p1", "1", gated=False, bound=True, deleting=True, phase="Running")
    assert released(podplan.plan_pods(reservation, views(leaving, step("p2", "1")))) == []
    assert released(podplan.plan_pods(reservation, views(step("p2", "1")))) == ["p2"]


def test_a_step_larger_than_the_whole_reservation_never_runs_and_a_warning_says_so() -> None:
    plan = podplan.plan_pods(unit({"cpu": "1"}), views(step("p1", "4"), step("p2", "500m")))
    assert released(plan) == ["p2"]  # it blocks nobody: it can never fit
    [(pod, why)] = plan.withheld
    assert pod.name == "p1"
    assert "more than the whole reservation of its job (cpu 1), so it can never run" in why
    assert "koord-queue/min-resources" in why


def test_a_resource_the_reservation_does_not_name_is_reserved_at_zero() -> None:
    asks_memory = step("p1", "500m")
    asks_memory["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Gi"
    plan = podplan.plan_pods(unit({"cpu": "1"}), views(asks_memory))
    assert released(plan) == [] and [p.name for p, _ in plan.withheld] == ["p1"]


def test_an_older_step_waiting_for_room_is_not_overtaken_by_a_younger_one_that_fits() -> None:
    """First come, first served: a large step is never starved by small ones that keep fitting."""
    running = step("p1", "1", gated=False, bound=True, phase="Running")
    plan = podplan.plan_pods(unit({"cpu": "2"}), views(running, step("p2", "2"), step("p3", "500m")))
    assert released(plan) == []
    assert [(p.name, why) for p, why in plan.waiting][1] == ("p3", "it waits behind the older pod p2")


def test_a_pod_the_workflow_does_not_control_is_never_released() -> None:
    """Proof of ownership is the controller reference to the Workflow (docs/architecture.md#trust-boundaries):
    a pod naming the unit whose controller is something else, or a reference to the Workflow's
    name with another UID, is no pod of the workflow and takes none of its reservation."""
    foreign = step("p1", "1", owner_kind="ReplicaSet", owner_uid="uid-rs")
    forged = step("p2", "1", owner_uid="uid-other")
    assert views(foreign, forged) == []
    plan = podplan.plan_pods(unit({"cpu": "1"}), views(foreign, forged, step("p3", "1")))
    assert released(plan) == ["p3"]


def test_nothing_is_released_while_the_unit_does_not_hold_its_admission() -> None:
    """Reserved (admission checks pending) holds quota but releases nothing; a released unbound
    pod is then past the admission and deleted."""
    plan = podplan.plan_pods(
        unit({"cpu": "1"}, phase="Reserved"), views(step("p1", "1"), step("p2", "1", gated=False))
    )
    assert released(plan) == [] and [p.name for p in plan.unadmitted] == ["p2"]


def test_released_pods_past_the_reservation_are_deleted_and_bound_ones_reported() -> None:
    pods = views(
        step("p1", "1", gated=False, bound=True, phase="Running"),
        step("p2", "1", gated=False, bound=True, phase="Running"),
        step("p3", "1", gated=False),
    )
    plan = podplan.plan_pods(unit({"cpu": "1"}), pods)
    assert [p.name for p in plan.beyond] == ["p2"]
    assert [p.name for p in plan.unadmitted] == ["p3"]


def test_a_reclaim_takes_the_reservation_back_only_while_no_step_is_out_of_the_gate() -> None:
    """No step pod is deleted for a reclaim (Argo fails a step whose pod is deleted); gated pods
    hold nothing and wait for the next admission."""
    marked = unit({"cpu": "1"})
    marked["status"]["admissions"][0]["reclaimState"] = {"replicas": 1}
    idle = podplan.plan_pods(marked, views(step("p1", "1")))
    assert idle.delete == [] and idle.ungate == []
    assert idle.status is not None and idle.status["status"]["admissions"][0]["replicas"] == 0
    busy = podplan.plan_pods(marked, views(step("p1", "1", gated=False, bound=True, phase="Running")))
    assert busy.delete == [] and busy.status is not None
    assert busy.status["status"]["admissions"][0]["replicas"] == 1


def test_other_kinds_keep_one_pod_per_replica() -> None:
    """The reservation is the Workflow's: a Job's unit of one replica still releases one pod."""
    job_unit = unit({"cpu": "2"})
    job_unit["spec"]["consumerRef"] = {"apiVersion": "batch/v1", "kind": "Job", "name": "wf"}
    pods = [dataclasses.replace(p, pod_set="default") for p in views(step("p1", "1"), step("p2", "1"))]
    assert released(podplan.plan_pods(job_unit, pods)) == ["p1"]


# --- the webhook's gating and its freeze ---------------------------------------------------------


def workflow() -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": "wf",
            "namespace": "ns",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {names.MIN_RESOURCES_ANNOTATION: json.dumps({"cpu": "1"})},
        },
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox"}}]},
    }


def held(job: dict[str, Any]) -> dict[str, Any]:
    return applied(job, WF.suspend_patch(job, now_text="2026-01-01T00:00:00Z"))


def test_the_webhook_gates_every_pod_argo_will_create_and_links_it_to_the_unit() -> None:
    meta = held(workflow())["spec"]["podMetadata"]
    assert meta["labels"] == {names.GATED_POD_LABEL: "true"}
    assert meta["annotations"] == {
        names.RELATED_QUEUEUNIT_ANNOTATION: "ns/wf",
        names.RELATED_PODSET_ANNOTATION: "default",
    }


def test_the_resume_links_a_generate_name_workflow_and_gates_one_stored_before_the_rule() -> None:
    """Under ``generateName`` the webhook cannot name the unit, and a Workflow stored before the
    rule has no gating at all: the resume writes both with ``spec.suspend: false``, before Argo
    creates any pod."""
    unnamed = workflow()
    unnamed["metadata"] = {**unnamed["metadata"], "generateName": "wf-"}
    del unnamed["metadata"]["name"]
    stored = held(unnamed)
    assert names.RELATED_QUEUEUNIT_ANNOTATION not in stored["spec"]["podMetadata"]["annotations"]
    stored["metadata"]["name"] = "wf-x1"
    legacy = held(workflow())
    del legacy["spec"]["podMetadata"]
    for job, ref in ((stored, "ns/wf-x1"), (legacy, "ns/wf")):
        resumed = merge_patch(job, WF.resume_patch(job, now_text="t"))
        assert resumed["spec"]["suspend"] is False
        assert resumed["spec"]["podMetadata"]["labels"] == {names.GATED_POD_LABEL: "true"}
        assert resumed["spec"]["podMetadata"]["annotations"] == {
            names.RELATED_QUEUEUNIT_ANNOTATION: ref,
            names.RELATED_PODSET_ANNOTATION: "default",
        }


@pytest.mark.parametrize(
    ("part", "key", "value"),
    [
        ("labels", names.GATED_POD_LABEL, None),
        ("labels", names.GATED_POD_LABEL, "false"),
        ("annotations", names.RELATED_QUEUEUNIT_ANNOTATION, None),
        ("annotations", names.RELATED_QUEUEUNIT_ANNOTATION, "ns/other"),
        ("annotations", names.RELATED_PODSET_ANNOTATION, "x"),
    ],
)
def test_the_gating_in_pod_metadata_cannot_be_removed_or_changed(
    part: str, key: str, value: str | None
) -> None:
    old = held(workflow())
    for finished in (False, True):
        new = json.loads(json.dumps(old))
        if finished:
            old = {**old, "status": {"phase": "Succeeded"}}
            new["status"] = {"phase": "Succeeded"}
        if value is None:
            del new["spec"]["podMetadata"][part][key]
        else:
            new["spec"]["podMetadata"][part][key] = value
        [error] = WF.admission_errors(old, new)
        assert error.path == f"spec.podMetadata.{part}[{key}]"
        assert error.detail.startswith("Forbidden:") and "delete and re-create the Workflow" in error.detail


def test_other_pod_metadata_stays_the_users() -> None:
    old = held(workflow())
    new = json.loads(json.dumps(old))
    new["spec"]["podMetadata"]["labels"]["team"] = "a"
    assert WF.admission_errors(old, new) == []

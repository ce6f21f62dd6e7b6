"""The uninstall's pure decisions (docs/operations.md#uninstall): which jobs the queue holds, by the
marks it leaves on them and not by their QueueUnits alone; which pod templates the API keeps as
they are; and that every kind of the registry is listed once."""

from __future__ import annotations

from typing import Any

from koord_queue.cli import uninstall
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.jobs import patches, registry

NOW = "2026-01-01T00:00:00Z"
JOB = registry.by_kind("batch/v1", "Job")
JOBS = kube.Resource("batch", "v1", "jobs", "Job")
assert JOB is not None


def job(*, labelled: bool = True, suspend: bool | None = None) -> dict[str, Any]:
    labels = {names.QUOTA_NAME_LABEL: "team-a"} if labelled else {}
    spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "labels": labels},
        "spec": spec,
    }


def held() -> dict[str, Any]:
    assert JOB is not None
    raw = job()
    return patches.applied(raw, JOB.suspend_patch(raw, now_text=NOW))


def test_a_job_the_webhook_held_is_held_without_a_unit() -> None:
    assert JOB is not None
    assert uninstall.held_job(None, held(), JOB)


def test_an_admitted_job_is_not_held_and_a_preempted_one_is() -> None:
    assert JOB is not None
    admitted = patches.deep_merge(held(), JOB.resume_patch(held(), now_text=NOW))
    assert not uninstall.held_job(None, admitted, JOB)
    preempted = patches.deep_merge(admitted, JOB.suspend_merge_patch(admitted))
    assert uninstall.held_job(None, preempted, JOB)


def test_a_job_suspended_by_its_owner_outside_the_queue_is_not_held() -> None:
    assert JOB is not None
    assert not uninstall.held_job(None, job(labelled=False, suspend=True), JOB)
    # a QueueUnit naming it is a mark of its own (the reconciler held a job that ran unadmitted)
    assert uninstall.held_job({"status": {"phase": "Enqueued"}}, job(labelled=False, suspend=True), JOB)


def test_finished_jobs_and_units_are_not_held() -> None:
    assert JOB is not None
    assert not uninstall.held_job({"status": {"phase": "Succeed"}}, held(), JOB)
    done = {**held(), "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    assert not uninstall.held_job(None, done, JOB)


def test_only_a_started_batch_job_keeps_its_template() -> None:
    started = {**held(), "status": {"startTime": NOW}}
    assert uninstall.template_locked(JOBS, started)
    assert not uninstall.template_locked(JOBS, held())
    tfjobs = kube.Resource("kubeflow.org", "v1", "tfjobs", "TFJob")
    assert not uninstall.template_locked(tfjobs, started)


def test_gate_ops_take_the_gate_off_every_template_and_keep_other_gates() -> None:
    gated = held()
    gated["spec"]["template"]["spec"]["schedulingGates"].append({"name": "other"})
    ops = uninstall.gate_ops(gated["spec"], "/spec")
    after = patches.applied(gated, [o for o in ops if o["op"] != "test"])  # type: ignore[misc]
    assert after["spec"]["template"]["spec"]["schedulingGates"] == [{"name": "other"}]
    assert uninstall.gate_ops(after["spec"]) == []


def test_every_registered_kind_is_listed_once() -> None:
    kinds = uninstall.job_kinds()
    first = [(tries[0][0].group, tries[0][0].kind) for tries in kinds]
    assert (
        len(first)
        == len(set(first))
        == len({(a.api_version.rpartition("/")[0], a.kind) for a in registry.ADAPTERS})
    )
    rayjob = next(tries for tries in kinds if tries[0][0].kind == "RayJob")
    assert [res.version for res, _ in rayjob] == ["v1", "v1alpha1"]

"""Events on the job (reconciler/job_events.py): whose job a unit is, the texts, and that they yield
to the unit's own events when the recorder's writers are behind."""

from __future__ import annotations

from typing import Any

from koord_queue.reconciler import job_events
from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared.api.names import EventReason


def unit(owners: list[dict[str, Any]], kind: str | None = "Job") -> dict[str, Any]:
    spec = {"consumerRef": {"apiVersion": "batch/v1", "kind": kind, "name": "train"}} if kind else {}
    return {"metadata": {"name": "train", "namespace": "team", "ownerReferences": owners}, "spec": spec}


JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1"}


def test_job_ref_is_the_owner_matching_the_consumer() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-2"}
    assert job_events.job_ref(unit([other, JOB_OWNER])) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "team", "uid": "u-1"},
    }
    assert job_events.job_ref(unit([])) is None
    assert job_events.job_ref(unit([{**JOB_OWNER, "uid": ""}])) is None


def test_messages() -> None:
    assert job_events.queued_message("q", (2, 5), "why") == "queued in quota q at position 2 of 5: why"
    assert job_events.queued_message("q", None, "why") == "queued in quota q: why"
    admitted = job_events.admitted_message("q", 12.4)
    assert admitted == "admitted in quota q after waiting 12s; the job is released"
    assert "2 replica(s) are reclaimed" in job_events.preempted_message("q", 2, "hi")


def test_optional_events_yield_when_the_writers_are_behind() -> None:
    recorder = EventRecorder(client=None, max_queue=4, writers=1)  # type: ignore[arg-type]
    job = unit([JOB_OWNER])
    assert job_events.record(recorder, job, EventReason.QUEUED, "a")  # queue 0 of 4
    assert job_events.record(recorder, job, EventReason.ADMITTED, "b")  # 1 of 4
    assert not job_events.record(recorder, job, EventReason.ADMITTED, "c")  # half full: skipped
    assert recorder.skipped_optional == 1
    recorder.record(job, type_="Normal", reason="Scheduled", message="d")  # a unit's event still goes
    assert recorder.dropped == 0
    assert not job_events.record(recorder, unit([]), EventReason.QUEUED, "no job")


def test_admitted_is_left_to_controllers_that_announce_the_resume_themselves() -> None:
    """A ``batch/v1`` Job's controller records ``Resumed``; other kinds get ``Admitted`` from us."""
    recorder = EventRecorder(client=None, max_queue=100, writers=1)  # type: ignore[arg-type]
    assert not job_events.record_admitted(recorder, unit([JOB_OWNER]), "q", 3.0)
    torch_owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "u-3"}
    torch = unit([torch_owner], kind="PyTorchJob")
    torch["spec"]["consumerRef"]["apiVersion"] = "kubeflow.org/v1"
    assert job_events.record_admitted(recorder, torch, "q", 3.0)

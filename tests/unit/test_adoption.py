"""Adoption of a released job whose QueueUnit was deleted
(docs/compatibility.md#adoption-of-released-jobs): the marker on the re-created unit, the status that
finishes the adoption, and what the scheduler makes of a marked unit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.shared.api import names
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.api.predicates import satisfied
from koord_queue.shared.core.policies import is_waiting
from koord_queue.shared.jobs import adoption, jobext, podplan, registry
from koord_queue.shared.jobs.base import JobStatus

JOB = registry.by_extension("job")
NOW = "2024-05-01T10:00:00Z"


def released_job(*, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {names.QUOTA_NAME_LABEL: "team-a"},
            "annotations": {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: NOW, **(annotations or {})},
        },
        "spec": {"parallelism": 2, "suspend": False, "template": {"spec": {"containers": [container]}}},
    }


def created(unit: dict[str, Any]) -> dict[str, Any]:
    """``unit`` as the apiserver returns it from a create: metadata filled in, no status."""
    meta = {**unit["metadata"], "resourceVersion": "7", "creationTimestamp": NOW, "uid": "qu-1"}
    return {**unit, "metadata": meta}


@pytest.mark.parametrize(
    ("job_status", "adopt"),
    [
        (JobStatus.CREATED, False),
        (JobStatus.QUEUING, False),
        (JobStatus.PENDING, True),
        (JobStatus.RUNNING, True),
        (JobStatus.SUCCEEDED, False),
        (JobStatus.FAILED, False),
    ],
)
def test_only_a_released_job_is_adopted(job_status: JobStatus, adopt: bool) -> None:
    assert adoption.needs_adoption(job_status, suspended=False, stamped=True) is adopt
    # Held again (preempted, deactivated) while its pods still count: it queues, never adopts.
    assert adoption.needs_adoption(job_status, suspended=True, stamped=True) is False
    # Released without the reconciler's stamp: it never waited in the queue, so it is queued.
    assert adoption.needs_adoption(job_status, suspended=False, stamped=False) is False


@pytest.mark.parametrize(
    ("job_status", "suspended", "stamped", "escaped"),
    [
        (JobStatus.RUNNING, False, False, True),
        (JobStatus.PENDING, False, False, True),
        (JobStatus.CREATED, False, False, True),
        (JobStatus.RUNNING, False, True, False),
        (JobStatus.RUNNING, True, False, False),
        (JobStatus.SUCCEEDED, False, False, False),
        (JobStatus.FAILED, False, False, False),
    ],
)
def test_a_job_released_without_the_reconcilers_stamp_has_escaped_its_hold(
    job_status: JobStatus, suspended: bool, stamped: bool, escaped: bool
) -> None:
    assert adoption.escaped_hold(job_status, suspended=suspended, stamped=stamped) is escaped


def test_the_unit_of_an_adopted_job_is_marked_and_only_then() -> None:
    adopted = jobext.build_queue_unit(released_job(), JOB, {}, adopted=True)
    plain = jobext.build_queue_unit(released_job(), JOB, {})
    assert adopted["metadata"]["annotations"][adoption.ADOPTED_ANNOTATION] == "true"
    assert adoption.ADOPTED_ANNOTATION not in plain["metadata"]["annotations"]
    assert adoption.awaiting_status(created(adopted)) and not adoption.awaiting_status(created(plain))


def test_a_marker_copied_from_the_job_is_dropped() -> None:
    """A user cannot hide a queued job's new unit from the scheduler by annotating the job."""
    job = released_job(annotations={adoption.ADOPTED_ANNOTATION: "true"})
    unit = jobext.build_queue_unit(job, JOB, {})
    assert adoption.ADOPTED_ANNOTATION not in unit["metadata"]["annotations"]


def test_a_released_job_gets_its_unit_back_dequeued_with_every_pod_set_admitted() -> None:
    unit = created(jobext.build_queue_unit(released_job(), JOB, {}, adopted=True))
    patch = adoption.completion_status(unit, JobStatus.PENDING, suspended=False, stamped=True, now_text=NOW)
    assert patch is not None
    status = patch["status"]
    assert (status["phase"], status["message"]) == ("Dequeued", names.Message.ADOPTED)
    assert status["admissions"] == [{"name": "train", "replicas": 2, "running": 0}]
    assert status["lastAllocateTime"] == status["lastUpdateTime"] == NOW
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds[names.ConditionType.QUOTA_RESERVED] == conds[names.ConditionType.ADMITTED] == "True"

    # Once written, the unit holds its quota and competes for nothing more.
    after = parse_unit({**unit, "status": status})
    assert satisfied(after) and not is_waiting(after)
    assert not adoption.awaiting_status({**unit, "status": status})
    assert (
        adoption.completion_status(
            {**unit, "status": status}, JobStatus.PENDING, suspended=False, stamped=True, now_text=NOW
        )
        is None
    )


@pytest.mark.parametrize(
    ("job_status", "suspended"),
    [(JobStatus.QUEUING, False), (JobStatus.QUEUING, True), (JobStatus.RUNNING, True)],
)
def test_a_job_suspended_again_before_the_status_write_is_queued_instead(
    job_status: JobStatus, suspended: bool
) -> None:
    unit = created(jobext.build_queue_unit(released_job(), JOB, {}, adopted=True))
    patch = adoption.completion_status(unit, job_status, suspended=suspended, stamped=True, now_text=NOW)
    assert patch is not None
    assert (patch["status"]["phase"], patch["status"]["message"]) == ("Enqueued", names.Message.ENQUEUED)
    assert "admissions" not in patch["status"]


@pytest.mark.parametrize("job_status", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_a_finished_job_leaves_the_marked_unit_to_the_report(job_status: JobStatus) -> None:
    unit = created(jobext.build_queue_unit(released_job(), JOB, {}, adopted=True))
    assert adoption.completion_status(unit, job_status, suspended=False, stamped=True, now_text=NOW) is None
    report = podplan.report(unit, [], job_status, now_text=NOW)
    assert report is not None and report["status"]["admissions"] == []


@given(
    counts=st.lists(
        st.one_of(st.none(), st.integers(-3, 50), st.booleans(), st.text(max_size=2)), max_size=6
    ),
    phase=st.sampled_from(["", "Enqueued", "Dequeued", "Running", None]),
    marked=st.booleans(),
)
def test_completion_is_total_and_admits_what_the_scheduler_would_read(
    counts: list[Any], phase: str | None, marked: bool
) -> None:
    """Any spec (also one edited by hand) gives a well-formed status or None, never an error;
    the admissions satisfy the unit exactly as the scheduler parses it."""
    pod_sets = [{"name": f"ps{i}", "count": c} for i, c in enumerate(counts)]
    unit: dict[str, Any] = {
        "metadata": {
            "name": "u",
            "namespace": "ns",
            "creationTimestamp": NOW,
            "annotations": {adoption.ADOPTED_ANNOTATION: "true"} if marked else {},
        },
        "spec": {"podSet": pod_sets},
    }
    if phase is not None:
        unit["status"] = {"phase": phase}
    patch = adoption.completion_status(unit, JobStatus.RUNNING, suspended=False, stamped=True, now_text=NOW)
    if not marked or phase:
        assert patch is None
        return
    assert patch is not None
    admissions = patch["status"]["admissions"]
    assert [a["name"] for a in admissions] == [p["name"] for p in pod_sets]
    assert all(isinstance(a["replicas"], int) and a["replicas"] >= 0 for a in admissions)
    parsed = parse_unit({**unit, "status": patch["status"]})
    assert satisfied(parsed) and not is_waiting(parsed)

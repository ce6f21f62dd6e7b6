"""The job extensions' pure decisions: job → QueueUnit, pod release, reclaim and usage reports."""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.jobs import jobext, podplan, registry
from koord_queue.shared.jobs.base import JobStatus

JOB = registry.by_extension("job")


def job(
    name: str = "train",
    *,
    parallelism: int = 2,
    cpu: str = "1",
    priority_class: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": "u-1",
            "labels": {names.QUOTA_NAME_LABEL: "team-a"},
            "annotations": annotations or {},
        },
        "spec": {"parallelism": parallelism, "suspend": True, "template": {"spec": spec}},
    }


def test_a_job_becomes_a_queue_unit_owned_by_it_with_priority_from_its_class() -> None:
    unit = jobext.build_queue_unit(job(priority_class="high"), JOB, {"high": 100})
    assert unit["metadata"]["name"] == "train"
    assert unit["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1"}
    ]
    assert unit["metadata"]["labels"] == {names.QUOTA_NAME_LABEL: "team-a"}
    spec = unit["spec"]
    assert spec["consumerRef"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "train",
        "namespace": "ns",
    }
    assert spec["priority"] == 100 and spec["priorityClassName"] == "high"
    assert [(p["name"], p["count"]) for p in spec["podSet"]] == [("train", 2)]
    assert spec["resource"] == spec["request"] == {"cpu": "2"}


@pytest.mark.parametrize(("annotation", "expected"), [("99", 99), ("not-a-number", 20), ("-5", -5)])
def test_the_priority_annotation_overrides_the_class_value_unless_unparsable(
    annotation: str, expected: int
) -> None:
    unit = jobext.build_queue_unit(
        job(priority_class="mid", annotations={names.PRIORITY_ANNOTATION: annotation}), JOB, {"mid": 20}
    )
    assert unit["spec"]["priority"] == expected


def test_activation_and_budget_annotations_reach_the_spec() -> None:
    unit = jobext.build_queue_unit(
        job(annotations={names.ACTIVE_ANNOTATION: "false", names.MAX_EXEC_TIME_ANNOTATION: "2"}), JOB, {}
    )
    assert unit["spec"]["active"] is False
    assert unit["spec"]["maximumExecutionTimeSeconds"] == 2


def test_spec_drift_is_none_when_in_step_and_a_patch_when_the_class_changes() -> None:
    unit = jobext.build_queue_unit(job(priority_class="a"), JOB, {"a": 1, "b": 2})
    assert jobext.spec_drift(unit, jobext.desired_spec(job(priority_class="a"), JOB, {"a": 1})) is None
    patch = jobext.spec_drift(unit, jobext.desired_spec(job(priority_class="b"), JOB, {"b": 2}))
    assert patch == {"spec": {"priority": 2, "priorityClassName": "b"}}


def pod(
    name: str,
    *,
    bound: bool = False,
    gated: bool = True,
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
) -> podplan.PodView:
    return podplan.PodView(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        pod_set="main",
        created=created,
        bound=bound,
        gated=gated,
        terminal=phase in ("Succeeded", "Failed"),
        deleting=False,
    )


def unit_with(
    replicas: int, *, running: int = 0, reclaim: int | None = None, phase: str = "Dequeued", count: int = 9
) -> dict[str, Any]:
    admission: dict[str, Any] = {"name": "main", "replicas": replicas, "running": running}
    status: dict[str, Any] = {"phase": phase, "admissions": [admission]}
    if reclaim is not None:
        admission["reclaimState"] = {"replicas": reclaim}
        # As the scheduler leaves a marked victim (conditions.evicted).
        status["conditions"] = [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
            {"type": "Admitted", "status": "False", "reason": "Preempted", "message": ""},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": ""},
        ]
    return {
        "metadata": {"name": "u", "resourceVersion": "7"},
        "spec": {"podSet": [{"name": "main", "count": count, "template": {}}]},
        "status": status,
    }


def without_conditions(patch: dict[str, Any] | None) -> dict[str, Any]:
    assert patch is not None
    return {"status": {k: v for k, v in patch["status"].items() if k != "conditions"}}


def condition_states(patch: dict[str, Any] | None) -> dict[str, str]:
    assert patch is not None
    return {c["type"]: c["status"] for c in patch["status"].get("conditions", [])}


@pytest.mark.parametrize(("replicas", "released"), [(2, 2), (5, 5), (0, 0)])
def test_exactly_the_admitted_number_of_pods_is_released(replicas: int, released: int) -> None:
    pods = [pod(f"p{i}", created=f"2026-01-01T00:00:0{i}Z") for i in range(5)]
    plan = podplan.plan_pods(unit_with(replicas), pods)
    assert [p.name for p in plan.ungate] == [f"p{i}" for i in range(released)]
    assert plan.delete == [] and plan.status is None


def test_already_released_and_bound_pods_count_toward_the_admitted_number() -> None:
    pods = [pod("a", bound=True, gated=False), pod("b", gated=False), pod("c"), pod("d")]
    plan = podplan.plan_pods(unit_with(3), pods)
    assert [p.name for p in plan.ungate] == ["c"]


def test_reclaim_deletes_only_unbound_pods_and_shrinks_replicas() -> None:
    pods = [pod("bound", bound=True, gated=False), pod("pending-1", gated=False), pod("pending-2")]
    plan = podplan.plan_pods(unit_with(3, running=1, reclaim=2), pods)
    assert sorted(p.name for p in plan.delete) == ["pending-1", "pending-2"]
    assert without_conditions(plan.status) == {
        "status": {"admissions": [{"name": "main", "replicas": 1, "running": 1}]}
    }
    # Still holding a replica: the conditions say admitted again (the marking said Admitted=False).
    assert condition_states(plan.status) == {"QuotaReserved": "True", "Admitted": "True", "Evicted": "False"}


def test_reclaim_never_takes_back_bound_replicas() -> None:
    pods = [pod("a", bound=True, gated=False), pod("b", bound=True, gated=False)]
    plan = podplan.plan_pods(unit_with(2, running=2, reclaim=2), pods)
    assert plan.delete == []
    assert without_conditions(plan.status) == {
        "status": {"admissions": [{"name": "main", "replicas": 2, "running": 2}]}
    }


def test_reclaim_of_replicas_whose_pods_do_not_exist_needs_no_delete_and_requeues_the_unit() -> None:
    plan = podplan.plan_pods(unit_with(2, reclaim=2), [])
    assert plan.delete == []
    assert condition_states(plan.status) == {
        "QuotaReserved": "False",
        "Admitted": "False",
        "Evicted": "False",
    }
    assert without_conditions(plan.status) == {
        "status": {
            "admissions": [{"name": "main", "replicas": 0, "running": 0}],
            "phase": "Enqueued",
            "message": names.Message.ENQUEUED_AFTER_PREEMPTED,
        }
    }


@pytest.mark.parametrize(
    ("replicas", "pods", "deleted", "ungated"),
    [
        # Two released pods for one admitted replica: the newest released pod goes.
        (1, [("a", False, False), ("b", False, False)], ["b"], []),
        # A bound pod uses the one replica: the released unbound pod is beyond the admission.
        (1, [("a", True, False), ("b", False, False)], ["b"], []),
        # Released within the admission: nothing deleted, the rest released.
        (3, [("a", False, False), ("b", False, True)], [], ["b"]),
        # Gated pods are never deleted for this, however many exist.
        (0, [("a", False, True), ("b", False, True)], [], []),
    ],
)
def test_pods_released_beyond_the_admission_are_deleted(
    replicas: int, pods: list[tuple[str, bool, bool]], deleted: list[str], ungated: list[str]
) -> None:
    views = [
        pod(name, bound=bound, gated=gated, created=f"2026-01-01T00:00:0{i}Z")
        for i, (name, bound, gated) in enumerate(pods)
    ]
    plan = podplan.plan_pods(unit_with(replicas), views)
    assert [p.name for p in plan.unadmitted] == deleted
    assert [p.name for p in plan.ungate] == ungated
    assert plan.delete == [] and plan.status is None


def test_every_released_unbound_pod_of_a_unit_without_admission_is_deleted() -> None:
    waiting = {"metadata": {"name": "u"}, "status": {"phase": "Enqueued"}}
    views = [pod("a", gated=False), pod("b"), pod("c", bound=True, gated=False)]
    plan = podplan.plan_pods(waiting, views)
    assert [p.name for p in plan.unadmitted] == ["a"]
    assert plan.ungate == [] and plan.delete == []


@pytest.mark.parametrize("phase", ["Reserved", "TimeoutBackoff", "Enqueued", ""])
def test_pods_are_released_only_in_an_admitted_phase(phase: str) -> None:
    views = [pod("a", created="2026-01-01T00:00:01Z"), pod("b", gated=False, created="2026-01-01T00:00:02Z")]
    plan = podplan.plan_pods(unit_with(2, phase=phase), views)
    assert plan.ungate == []
    assert [p.name for p in plan.unadmitted] == ["b"]  # back behind the gate: deleted, replaced gated


def test_an_admission_larger_than_its_pod_set_shrinks_to_what_is_still_needed() -> None:
    # A Job of 4 whose 3 pods completed: its pod set counts 1; the admission gives back 3 replicas.
    unit = unit_with(4, running=0, count=1)
    patch = podplan.report(unit, [pod("a", bound=True, gated=False)], JobStatus.RUNNING, now_text="T")
    assert patch is not None
    assert patch["status"]["admissions"] == [{"name": "main", "replicas": 1, "running": 1}]
    # Never below what runs.
    unit = unit_with(4, running=0, count=1)
    two = [pod("a", bound=True, gated=False), pod("b", bound=True, gated=False)]
    patch = podplan.report(unit, two, JobStatus.RUNNING, now_text="T")
    assert patch is not None and patch["status"]["admissions"][0]["replicas"] == 2


def test_an_admission_never_shrinks_below_a_released_pod_not_yet_bound() -> None:
    # The Job's count fell to 0 (its pod succeeded) while its controller, which lost a status write,
    # started one more pod, and the unit released it: that pod holds its replica until it is gone.
    unit = unit_with(1, running=0, count=0)
    released = [pod("done", phase="Succeeded", gated=False, bound=True), pod("extra", gated=False)]
    patch = podplan.report(unit, released, JobStatus.RUNNING, now_text="T")
    assert patch is None or patch["status"].get("admissions", [{"replicas": 1}])[0]["replicas"] == 1
    # A gated extra pod holds nothing: the replica is given back.
    gated = [pod("done", phase="Succeeded", gated=False, bound=True), pod("extra")]
    patch = podplan.report(unit_with(1, running=0, count=0), gated, JobStatus.RUNNING, now_text="T")
    assert patch is not None and patch["status"]["admissions"][0]["replicas"] == 0


def test_spec_drift_follows_a_grown_template_of_a_queued_job() -> None:
    unit = jobext.build_queue_unit(job(cpu="1"), JOB, {})
    patch = jobext.spec_drift(unit, jobext.desired_spec(job(cpu="4"), JOB, {}))
    assert patch is not None
    assert patch["spec"]["resource"] == {"cpu": "8"}
    assert patch["spec"]["podSet"][0]["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "4"
    }


def test_report_counts_bound_pods_and_moves_a_running_job_to_running() -> None:
    pods = [pod("a", bound=True, gated=False), pod("b")]
    patch = podplan.report(unit_with(2), pods, JobStatus.RUNNING, now_text="T")
    assert patch is not None
    status = patch["status"]
    assert status["admissions"][0]["running"] == 1
    assert status["podState"] == {"running": 1, "pending": 1}
    assert status["phase"] == names.Phase.RUNNING and status["message"] == "Running"


def test_a_finished_job_releases_its_quota() -> None:
    patch = podplan.report(unit_with(2, running=2), [], JobStatus.SUCCEEDED, now_text="T")
    assert patch is not None
    assert patch["status"]["phase"] == names.Phase.SUCCEED
    assert patch["status"]["admissions"] == []


def test_report_is_silent_when_nothing_changed() -> None:
    unit = unit_with(1, running=1)
    unit["status"]["podState"] = {"running": 1, "pending": 0}
    unit["status"]["phase"] = names.Phase.RUNNING
    assert podplan.report(unit, [pod("a", bound=True, gated=False)], JobStatus.RUNNING, now_text="T") is None


# --- coalesced pod reports (docs/compatibility.md#coalesced-pod-reports) -------------------------


def test_a_created_pod_alone_may_wait_for_a_write_that_matters() -> None:
    unit = unit_with(1)
    patch = podplan.report(unit, [pod("a")], JobStatus.PENDING, now_text="T")
    assert patch is not None and set(patch["status"]) == {"podState", "lastUpdateTime"}
    assert podplan.can_wait(unit, patch)


def test_a_bound_pod_and_the_running_phase_are_written_at_once() -> None:
    unit = unit_with(1)
    unit["status"]["podState"] = {"running": 0, "pending": 1}
    patch = podplan.report(unit, [pod("a", bound=True, gated=False)], JobStatus.RUNNING, now_text="T")
    assert patch is not None and not podplan.can_wait(unit, patch)
    # A bound pod of a job that is not Running yet raises ``running``: also at once.
    pending = podplan.report(unit, [pod("a", bound=True, gated=False)], JobStatus.PENDING, now_text="T")
    assert pending is not None and "phase" not in pending["status"]
    assert not podplan.can_wait(unit, pending)


def test_finished_pods_may_wait_for_the_job_to_finish() -> None:
    unit = unit_with(1, running=1, phase=names.Phase.RUNNING)
    unit["status"]["podState"] = {"running": 1, "pending": 0}
    patch = podplan.report(
        unit, [pod("a", bound=True, gated=False, phase="Succeeded")], JobStatus.RUNNING, now_text="T"
    )
    assert patch is not None and patch["status"]["admissions"][0]["running"] == 0
    assert podplan.can_wait(unit, patch)
    finished = podplan.report(unit, [], JobStatus.SUCCEEDED, now_text="T")
    assert finished is not None and not podplan.can_wait(unit, finished)


def test_giving_back_replicas_is_never_delayed() -> None:
    unit = unit_with(3, running=1, count=1)
    patch = podplan.report(unit, [pod("a", bound=True, gated=False)], JobStatus.PENDING, now_text="T")
    assert patch is not None and patch["status"]["admissions"][0]["replicas"] == 1
    assert not podplan.can_wait(unit, patch)


# --- what the informers keep ----------------------------------------------------------------------


def test_a_slim_job_gives_the_same_queue_unit_and_resume_patch() -> None:
    full = job(priority_class="high", annotations={names.PRIORITY_ANNOTATION: "7"})
    template = full["spec"]["template"]
    template["metadata"] = {"annotations": {names.RELATED_PODSET_ANNOTATION: "train"}, "labels": {"a": "b"}}
    template["spec"]["containers"][0].update(command=["run"], env=[{"name": "X", "value": "y" * 200}])
    template["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    slim = jobext.slim_batch_job(full)
    assert "volumes" not in slim["spec"]["template"]["spec"]
    assert slim["spec"]["template"]["metadata"] == template["metadata"]
    assert jobext.build_queue_unit(slim, JOB, {"high": 1}) == jobext.build_queue_unit(full, JOB, {"high": 1})
    assert JOB.resume_patch(slim, now_text="t") == JOB.resume_patch(full, now_text="t")
    assert JOB.is_suspended(slim) and JOB.job_status(slim) == JOB.job_status(full)
    assert full["spec"]["template"]["spec"]["volumes"], "the informer's input is not changed"


def test_a_slim_pod_keeps_what_the_pod_view_reads() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "5",
            "finalizers": [names.JOB_TRACKING_FINALIZER],
            "annotations": {names.RELATED_PODSET_ANNOTATION: "main"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": "n1",
            "schedulingGates": [{"name": names.ADMISSION_GATE}],
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "env": [{"name": "A", "value": "b" * 500}],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
            "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always"}],
            "overhead": {"memory": "10Mi"},
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    slim = podplan.slim_pod(pod)
    assert podplan.pod_view(slim, "main") == podplan.pod_view(pod, "main")
    assert podplan.pod_view(slim, "main").requests == (("cpu", 1000), ("memory", 10 * 2**20 * 1000))
    assert slim["metadata"] == pod["metadata"]
    assert slim["spec"] == {
        "nodeName": "n1",
        "schedulingGates": [{"name": names.ADMISSION_GATE}],
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [{"restartPolicy": "Always"}],
        "overhead": {"memory": "10Mi"},
    }
    assert slim["status"] == {"phase": "Running"}
    assert podplan.slim_pod({"metadata": {"name": "bare"}}) == {"metadata": {"name": "bare"}}

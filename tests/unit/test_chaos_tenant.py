"""The hostile-tenant phase's pure parts: how it reads targets and how it tallies outcomes."""

from __future__ import annotations

from typing import Any

from chaos import run, tenant
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core import config


def job(
    *, suspend: bool, stamp: bool = False, done: bool = False, label: str | None = "chaos-a"
) -> dict[str, Any]:
    annotations = {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "t"} if stamp else {}
    return {
        "metadata": {
            "name": "j",
            "labels": {names.QUOTA_NAME_LABEL_FALLBACK: label} if label else {},
            "annotations": annotations,
        },
        "spec": {"suspend": suspend},
        "status": {"conditions": [{"type": "Complete", "status": "True"}] if done else []},
    }


def test_queued_jobs_as_mallory_sees_them() -> None:
    assert tenant.queued(job(suspend=True))
    assert not tenant.queued(job(suspend=True, label=None))
    assert not tenant.queued(job(suspend=True, done=True))
    assert not tenant.queued(job(suspend=False))
    assert not tenant.queued(job(suspend=True, stamp=True))
    assert tenant.quota_label(job(suspend=True)) == (names.QUOTA_NAME_LABEL_FALLBACK, "chaos-a")


def test_running_count_reads_the_admissions_not_the_pod_state() -> None:
    unit = {"status": {"admissions": [{"replicas": 1, "running": 1}], "podState": {"running": 7}}}
    assert tenant.running_reported(unit) == 1
    assert tenant.is_admitted_unit(unit)
    assert not tenant.is_admitted_unit({"status": {"phase": "Succeed", "admissions": [{"replicas": 1}]}})


def test_gated_reads_the_admission_gate_only() -> None:
    assert tenant.gated({"schedulingGates": [{"name": names.ADMISSION_GATE}]})
    assert not tenant.gated({"schedulingGates": [{"name": "other"}]})
    assert not tenant.gated(None)


def test_summary_counts_every_outcome_per_attack_and_keeps_a_refusal() -> None:
    attempts = [
        tenant.Attempt("ungate-pod-of-queued-job", 0, "chaos/p", "refused", "HTTP 403: denied"),
        tenant.Attempt("ungate-pod-of-queued-job", 1, "-", "skipped", "no gated pod"),
        tenant.Attempt("ungate-pod-of-queued-job", 2, "chaos/q", "undone", "deleted", 1.25),
    ]
    row = tenant.summarize(attempts)["ungate-pod-of-queued-job"]
    assert (row["tried"], row["refused"], row["undone"], row["skipped"]) == (2, 1, 1, 1)
    assert row["sample"] == "HTTP 403: denied"
    assert row["undone_s"] == [1.2]
    assert set(tenant.summarize([])) == set(tenant.ATTACKS)


def test_her_forged_pods_are_born_gated_and_carry_just_the_reference_given() -> None:
    plain = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}
    pod = tenant.forged_pod_body("p", annotations={"a": "b"}, owner=plain, cpu="1")
    assert tenant.gated(pod["spec"])
    assert pod["metadata"]["ownerReferences"] == [plain]
    assert "labels" not in pod["metadata"]  # no Job controller selects it
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}


def test_every_pod_release_attack_has_its_defence_written_down() -> None:
    for attack in (
        "gated-pod-with-plain-owner-reference",
        "oversized-pod-controlled-by-job",
        "annotate-existing-pod-into-unit",
    ):
        assert tenant.ATTACKS[attack]


def test_her_units_priority_is_judged_on_the_runs_settings_alone() -> None:
    """docs/compatibility.md#priority-cap: the bound is worked out from the run's caps and the one
    class her quota allows, not from what the reconciler computes."""
    assert max(tenant.CLUSTER_PRIORITY_CAP, tenant.ALLOWED_CLASS_VALUE) == tenant.OWN_PRIORITY_BOUND
    assert tenant.RAW_TEMPLATE_PRIORITY > tenant.OWN_PRIORITY_BOUND
    assert tenant.FORBIDDEN_CLASS_VALUE > tenant.OWN_PRIORITY_BOUND
    bound = tenant.OWN_PRIORITY_BOUND
    assert tenant.priority_above({"spec": {"priority": tenant.RAW_TEMPLATE_PRIORITY}}, bound) == 1_000_000
    assert tenant.priority_above({"spec": {"priority": bound}}, bound) is None
    assert tenant.priority_above({"spec": {}}, bound) is None
    assert tenant.priority_above({}, bound) is None
    assert tenant.priority_above({"spec": {"priority": True}}, bound) is None


def test_the_priority_attacks_are_in_the_report() -> None:
    for attack in ("raw-template-priority", "disallowed-priority-class"):
        assert attack in tenant.ATTACKS
        row = tenant.summarize([tenant.Attempt(attack, 0, "chaos-mallory/j", "neutralised", "stayed low")])
        assert row[attack]["neutralised"] == 1 and row[attack]["tried"] == 1


def test_a_forged_owner_is_judged_on_the_stored_job_alone() -> None:
    """docs/operations.md#mandatory-queueing: a queued job cannot gain a controller reference that
    would make it another managed job's child; the judgement reads only the stored object."""
    assert "forged-owner-on-queued-job" in tenant.ATTACKS
    assert "child-of-missing-parent" in tenant.ATTACKS
    job = {"metadata": {"ownerReferences": [dict(tenant.FORGED_OWNER)]}}
    assert tenant.forged_controller(job)
    plain = {**tenant.FORGED_OWNER, "controller": False}
    assert not tenant.forged_controller({"metadata": {"ownerReferences": [plain]}})
    assert not tenant.forged_controller({"metadata": {}})
    row = tenant.summarize([tenant.Attempt("forged-owner-on-queued-job", 0, "chaos/j", "refused", "no")])
    assert row["forged-owner-on-queued-job"]["refused"] == 1


def test_a_pod_runs_while_bound_even_terminating_or_once_out_of_the_gate() -> None:
    gate = {"schedulingGates": [{"name": names.ADMISSION_GATE}]}
    assert tenant.runs({"spec": {"nodeName": "n"}})
    assert tenant.runs({"metadata": {"deletionTimestamp": "t"}, "spec": {"nodeName": "n"}})
    assert tenant.runs({"spec": {}})  # released, about to be bound
    assert not tenant.runs({"spec": gate})
    assert not tenant.runs({"metadata": {"deletionTimestamp": "t"}, "spec": {}})
    assert not tenant.runs({"spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}})


def test_what_a_unit_holds_is_its_admitted_replicas_times_its_containers_cpu() -> None:
    container = {"resources": {"requests": {"cpu": "500m"}}}
    unit = {
        "spec": {"podSet": [{"name": "main", "template": {"spec": {"containers": [container, container]}}}]},
        "status": {"admissions": [{"name": "main", "replicas": 3}, {"name": "gone", "replicas": 9}]},
    }
    assert tenant.held_cpu_milli(unit) == 3000
    assert tenant.held_cpu_milli({}) == 0


def test_the_mandatory_namespace_is_queued_on_the_quota_named_after_it() -> None:
    """docs/operations.md#mandatory-queueing: the run's configuration selects her second namespace by
    label, and its default quota is the one of its own name (the load creates it there)."""
    assert "unlabelled-job-in-mandatory-namespace" in tenant.ATTACKS
    settings = config.parse(run.RECONCILER_CONFIG)
    labels = {tenant.MANDATORY_LABEL: "true"}
    assert settings.mandatory_queueing.applies(tenant.MANDATORY_NAMESPACE, labels)
    assert not settings.mandatory_queueing.applies(tenant.NAMESPACE, {})


def test_an_admitted_tfjob_is_judged_on_what_its_pods_would_take_with_the_limit_range() -> None:
    """The container she adds asks for nothing, so its pods get the LimitRange default: while the
    unit holds an admission its worker charge must cover it (docs/compatibility.md#admitted-pod-size).
    Judged from the stored TFJob, the stored unit and the run's LimitRange alone."""
    assert "add-container-to-admitted-job" in tenant.ATTACKS
    main = {"name": "main", "resources": {"requests": {"cpu": "100m"}}}
    sidecar = {"name": "sidecar"}
    limited = {"name": "limited", "resources": {"limits": {"cpu": "2"}}}

    def tf(*containers: dict[str, Any]) -> dict[str, Any]:
        template = {"spec": {"containers": list(containers)}}
        return {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}}}

    def unit(cpu: str, replicas: int = 1) -> dict[str, Any]:
        container = {"name": "main", "resources": {"requests": {"cpu": cpu}}}
        return {
            "spec": {"podSet": [{"name": "worker", "template": {"spec": {"containers": [container]}}}]},
            "status": {"phase": "Running", "admissions": [{"name": "worker", "replicas": replicas}]},
        }

    assert tenant.undercharged(tf(main), unit("100m"), default_cpu_milli=1000) == []
    assert tenant.undercharged(tf(main, sidecar), unit("100m"), default_cpu_milli=1000) == ["worker"]
    assert tenant.undercharged(tf(main, sidecar), unit("1100m"), default_cpu_milli=1000) == []
    assert tenant.undercharged(tf(main, limited), unit("1100m"), default_cpu_milli=1000) == ["worker"]
    assert tenant.undercharged(tf(main, sidecar), unit("100m", replicas=0), default_cpu_milli=1000) == []
    assert tenant.undercharged(tf(main, sidecar), {}, default_cpu_milli=1000) == []


async def test_a_create_that_meets_its_own_earlier_try_is_not_counted_as_refused() -> None:
    """A create whose answer a fault cut off was stored all the same: its retry answers 409
    AlreadyExists, which is no refusal of the system's (the object exists and may run)."""
    mallory = tenant.Tenant(None, None, None, violate=lambda *_: None, log=lambda _: None)  # type: ignore[arg-type]
    tries = iter(
        [
            kube.KubeError(0, "", "connection reset by peer"),
            kube.Conflict(409, "AlreadyExists", 'jobs.batch "mallory-x-0" already exists'),
        ]
    )

    async def create() -> dict[str, Any]:
        raise next(tries)

    sent = await mallory.send(create)
    assert sent.status == "exists", sent
    assert mallory.transient["HTTP 0"] == 1

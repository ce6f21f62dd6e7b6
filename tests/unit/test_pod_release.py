"""A pod is released only when it fits what its pod set was admitted with (``shared.jobs.podplan``),
and the reasons a pod stays gated (docs/compatibility.md#pod-gating)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from koord_queue.shared.jobs import podplan
from koord_queue.shared.jobs.base import JobStatus

ADMITTED = {"cpu": "1", "memory": "1Gi"}


def unit(requests: dict[str, str] | None = None, *, replicas: int = 2) -> dict[str, Any]:
    """An admitted unit of one pod set whose pods were queued asking for ``requests``."""
    container = {"name": "c", "resources": {"requests": requests or ADMITTED}}
    return {
        "metadata": {"name": "u"},
        "spec": {
            "podSet": [{"name": "main", "count": replicas, "template": {"spec": {"containers": [container]}}}]
        },
        "status": {"phase": "Dequeued", "admissions": [{"name": "main", "replicas": replicas, "running": 0}]},
    }


def gated_pod(name: str, spec: dict[str, Any]) -> podplan.PodView:
    """A gated, unbound pod as the apiserver stored it."""
    pod = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": f"2026-01-01T00:00:0{name[-1]}Z",
        },
        "spec": {"schedulingGates": [{"name": "koord-queue/admission"}], **spec},
    }
    return podplan.pod_view(podplan.slim_pod(pod), "main")


def asking(**requests: str) -> dict[str, Any]:
    return {"containers": [{"name": "c", "resources": {"requests": requests}}]}


@pytest.mark.parametrize(
    ("spec", "released"),
    [
        (asking(cpu="1", memory="1Gi"), True),  # exactly what was admitted
        (asking(cpu="500m"), True),  # smaller fits
        (asking(cpu="2", memory="1Gi"), False),  # a container larger than admitted
        (asking(cpu="1", memory="1Gi", **{"nvidia.com/gpu": "1"}), False),  # a resource never admitted
        ({**asking(cpu="1"), "resources": {"requests": {"cpu": "4"}}}, False),  # pod-level requests win
        ({**asking(cpu="1"), "overhead": {"cpu": "250m"}}, False),  # RuntimeClass overhead counts
        (
            {**asking(cpu="1"), "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]},
            False,
        ),  # an init container's peak
        (asking(cpu="lots"), False),  # unreadable requests prove nothing
    ],
)
def test_a_gated_pod_is_released_only_when_its_stored_requests_fit_the_admitted_size(
    spec: dict[str, Any], released: bool
) -> None:
    pod = gated_pod("p1", spec)
    plan = podplan.plan_pods(unit(), [pod])
    assert [p.name for p in plan.ungate] == (["p1"] if released else [])
    assert [p.name for p, _ in plan.withheld] == ([] if released else ["p1"])


def test_a_pod_too_large_does_not_take_the_place_of_one_that_fits() -> None:
    big = gated_pod("p1", asking(cpu="8"))
    fits = gated_pod("p2", asking(cpu="1"))
    plan = podplan.plan_pods(unit(replicas=1), [big, fits])
    assert [p.name for p in plan.ungate] == ["p2"]
    [(pod, why)] = plan.withheld
    assert pod.name == "p1"
    assert why == "it asks for more than pod set main was admitted with per pod (cpu 8 > 1)"


def test_nothing_fits_a_pod_set_whose_admitted_template_cannot_be_read() -> None:
    broken = unit({"cpu": "many"})
    plan = podplan.plan_pods(broken, [gated_pod("p1", asking(cpu="1"))])
    assert plan.ungate == []
    assert [why for _, why in plan.withheld] == ["the admitted size of pod set main cannot be read"]


def test_pods_are_not_judged_while_the_admission_has_no_room() -> None:
    plan = podplan.plan_pods(unit(replicas=0), [gated_pod("p1", asking(cpu="8"))])
    assert plan.ungate == [] and plan.withheld == []


def bound_pod(name: str, *, deleting: bool = False, pod_set: str = "main") -> podplan.PodView:
    return podplan.PodView(
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        pod_set=pod_set,
        created=f"2026-01-01T00:00:0{name[-1]}Z",
        bound=True,
        gated=False,
        terminal=False,
        deleting=deleting,
    )


def test_bound_pods_beyond_the_admission_are_reported_and_never_charged() -> None:
    """Only the scheduler changes what a unit holds (docs/compatibility.md#reclaim-and-usage-reports):
    three bound pods under an admission of two leave ``replicas`` at two and are named, newest first."""
    admitted = unit(replicas=2)
    pods = [bound_pod("p1"), bound_pod("p2"), bound_pod("p3")]
    plan = podplan.plan_pods(admitted, pods)
    assert [p.name for p in plan.beyond] == ["p3"]
    patch = podplan.report(admitted, pods, JobStatus.RUNNING, now_text="t")
    assert patch is not None
    assert [a["replicas"] for a in patch["status"]["admissions"]] == [2]
    assert [a["running"] for a in patch["status"]["admissions"]] == [3]


def test_bound_pods_of_a_pod_set_the_unit_holds_nothing_for_are_beyond_it() -> None:
    plan = podplan.plan_pods(unit(replicas=1), [bound_pod("p1", pod_set="other")])
    assert [p.name for p in plan.beyond] == ["p1"]


def test_a_terminating_bound_pod_counts_until_it_is_gone() -> None:
    """A bound pod being deleted runs on for its grace period (docs/compatibility.md#pod-gating):
    its replacement stays gated meanwhile, and it is still reported running."""
    admitted = unit(replicas=1)
    leaving = bound_pod("p1", deleting=True)
    replacement = gated_pod("p2", asking(cpu="1"))
    plan = podplan.plan_pods(admitted, [leaving, replacement])
    assert plan.ungate == []
    patch = podplan.report(admitted, [leaving, replacement], JobStatus.RUNNING, now_text="t")
    assert patch is not None and patch["status"]["admissions"][0]["running"] == 1
    assert podplan.plan_pods(admitted, [replacement]).ungate == [replacement]


def test_an_unbound_pod_being_deleted_counts_for_nothing() -> None:
    going = dataclasses.replace(gated_pod("p1", asking(cpu="1")), deleting=True)
    assert not going.live
    assert podplan.still_running([going]) == []
    plan = podplan.plan_pods(unit(replicas=1), [going])
    assert plan.ungate == [] and plan.delete == []


@pytest.mark.parametrize(
    ("pod", "runs"),
    [
        (bound_pod("p1"), True),
        (bound_pod("p1", deleting=True), True),  # terminating: runs for its grace period
        (dataclasses.replace(bound_pod("p1"), terminal=True), False),
        (dataclasses.replace(bound_pod("p1"), bound=False), True),  # released, about to be bound
        (dataclasses.replace(bound_pod("p1"), bound=False, deleting=True), False),
        (dataclasses.replace(bound_pod("p1"), bound=False, gated=True), False),  # never released
    ],
)
def test_quota_taken_back_from_a_held_job_waits_for_every_pod_that_runs(
    pod: podplan.PodView, runs: bool
) -> None:
    assert podplan.still_running([pod]) == ([pod] if runs else [])

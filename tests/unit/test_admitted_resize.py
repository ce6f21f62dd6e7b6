"""A job whose admitted pods change size is queued again, not followed
(docs/compatibility.md#admitted-pod-size): the pure decision (``jobext.admitted_resize``) and the
status it writes (``lifecycle.requeue_resized``).

The webhook refuses the edit from users; these are the reconciler's side, for when the door was
bypassed. At the end, the loop's writes with a fake API (the job held before the unit gives its
quota back, a failed second write finished on the next pass); the real apiserver case is in
tests/integration/test_tenant_pod_size.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.jobs import jobext, lifecycle, registry
from koord_queue.shared.jobs.running_timeout import RunningTimeout
from tests.unit.test_jobext import job
from tests.unit.test_running_timeout import KEY, FakeClient, admitted_unit, extensions, released_job

JOB = registry.by_extension("job")
Obj = dict[str, Any]


def unit_of(
    *, cpu: str = "1", phase: str = "Running", replicas: int | None = 2, reclaim: int | None = None
) -> Obj:
    unit = jobext.build_queue_unit(job(cpu=cpu), JOB, {})
    status: Obj = {"phase": phase}
    if replicas is not None:
        admission: Obj = {"name": "train", "replicas": replicas, "running": 0}
        if reclaim is not None:
            admission["reclaimState"] = {"replicas": reclaim}
        status["admissions"] = [admission]
    unit["status"] = status
    return unit


def desired(**kwargs: Any) -> Obj:
    return jobext.desired_spec(job(**kwargs), JOB, {})


@pytest.mark.parametrize(
    ("unit", "want", "why"),
    [
        (unit_of(), desired(cpu="4"), "grown"),
        (unit_of(cpu="4"), desired(cpu="1"), "shrunk: running pods keep the size they were admitted with"),
        (unit_of(phase="Dequeued"), desired(cpu="4"), "admitted, not running yet"),
        (unit_of(phase="Reserved"), desired(cpu="4"), "reserved for admission checks"),
        (
            unit_of(phase="Dequeued", replicas=None),
            desired(cpu="4"),
            "admitted under the API without admissions",
        ),
    ],
)
def test_a_changed_per_pod_size_of_an_admitted_pod_set_is_found(unit: Obj, want: Obj, why: str) -> None:
    assert jobext.admitted_resize(unit, want) == ("train",), why


@pytest.mark.parametrize(
    ("unit", "want", "why"),
    [
        (unit_of(), desired(), "in step"),
        (unit_of(), desired(parallelism=5), "only the count changed: the scheduler admits the difference"),
        (unit_of(phase="Enqueued", replicas=None), desired(cpu="4"), "queued: the unit follows"),
        (unit_of(phase="Enqueued", replicas=0), desired(cpu="4"), "nothing admitted"),
        (unit_of(phase="Succeed"), desired(cpu="4"), "finished"),
        (unit_of(phase="Failed"), desired(cpu="4"), "finished"),
    ],
)
def test_other_changes_are_left_to_the_ordinary_drift(unit: Obj, want: Obj, why: str) -> None:
    assert jobext.admitted_resize(unit, want) == (), why
    if why != "in step":
        assert jobext.spec_drift(unit, want) is not None, why


def test_an_unreadable_template_on_either_side_decides_nothing() -> None:
    unit = unit_of()
    bad = copy.deepcopy(desired(cpu="4"))
    bad["podSet"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert jobext.admitted_resize(unit, bad) == ()
    broken_unit = unit_of()
    broken_unit["spec"]["podSet"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = (
        "x"
    )
    assert jobext.admitted_resize(broken_unit, desired(cpu="4")) == ()


def test_only_the_changed_admitted_pod_sets_are_named() -> None:
    unit = unit_of()
    extra = copy.deepcopy(unit["spec"]["podSet"][0])
    extra["name"] = "aux"
    unit["spec"]["podSet"].append(extra)  # a second pod set, never admitted
    want = desired(cpu="4")
    grown_aux = copy.deepcopy(want["podSet"][0])
    grown_aux["name"] = "aux"
    want["podSet"].append(grown_aux)
    assert jobext.admitted_resize(unit, want) == ("train",)


def test_the_unit_is_queued_again_with_its_quota_released_and_says_why() -> None:
    unit = unit_of()
    unit["status"]["conditions"] = [
        {
            "type": "PodsReady",
            "status": "True",
            "reason": "Running",
            "lastTransitionTime": "2026-12-02T00:00:00Z",
        }
    ]
    ran_from = 1_796_169_600.0  # 2026-12-02T00:00:00Z
    patch = lifecycle.requeue_resized(unit, ("train",), now=ran_from + 90, now_text="2026-12-02T00:01:30Z")
    assert patch is not None
    status = patch["status"]
    assert status["phase"] == names.Phase.ENQUEUED and status["admissions"] == []
    assert status["message"] == f"{names.Message.RESIZED_PREFIX} train"
    evicted = next(c for c in status["conditions"] if c["type"] == "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("True", names.EVICTED_RESIZED_REASON)
    assert status["accumulatedPastExecutionTimeSeconds"] == 90  # the time it ran counts for its budget


def test_a_reclaim_in_progress_finishes_first() -> None:
    assert lifecycle.requeue_resized(unit_of(reclaim=1), ("train",), now=0.0, now_text="T") is None
    assert lifecycle.requeue_resized(unit_of(), (), now=0.0, now_text="T") is None


# --- the loop's writes ---------------------------------------------------------------------------


def grown(job: Obj) -> Obj:
    out = copy.deepcopy(job)
    out["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    return out


async def test_the_job_is_held_before_its_unit_gives_the_quota_back_and_the_pods_are_not_followed() -> None:
    job = released_job()
    client = FakeClient()
    jobs, events = extensions(grown(job), admitted_unit(job), RunningTimeout(), client)
    await jobs.reconcile(KEY)
    [(first, first_sub, suspend), (second, second_sub, status), (third, third_sub, drift)] = client.patches
    assert (first, first_sub, suspend["spec"]) == ("jobs", "", {"suspend": True})
    assert (second, second_sub) == ("queueunits", "status")
    assert status["metadata"] == {"resourceVersion": "7"}
    assert status["status"]["phase"] == "Enqueued" and status["status"]["admissions"] == []
    # Only then the pod sets, conditional (the fake answers no version: the one seen stands in).
    assert (third, third_sub) == ("queueunits", "")
    assert drift["metadata"] == {"resourceVersion": "7"} and drift["spec"]["resource"] == {"cpu": "6"}
    assert events.recorded == [("Job", "Warning", names.EventReason.ADMITTED_JOB_RESIZED)]


class VersionedClient(FakeClient):
    """Answers each write with the next resourceVersion, as the apiserver does."""

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        await super().patch(res, name, patch, **kwargs)
        return {"metadata": {"resourceVersion": str(100 + len(self.patches))}}


async def test_the_pod_sets_follow_on_the_version_the_requeue_made() -> None:
    job = released_job()
    client = VersionedClient()
    jobs, _ = extensions(grown(job), admitted_unit(job), RunningTimeout(), client)
    await jobs.reconcile(KEY)
    [_, _, (_, _, drift)] = client.patches
    assert drift["metadata"] == {"resourceVersion": "102"}  # the status write's


async def test_an_ordinary_drift_is_conditional_on_the_version_seen() -> None:
    held = released_job(suspended=True)
    unit = admitted_unit(held)
    unit["status"] = {"phase": "Enqueued"}
    client = FakeClient()
    scaled = copy.deepcopy(held)
    scaled["spec"]["parallelism"] = 3
    jobs, _ = extensions(scaled, unit, RunningTimeout(), client)
    await jobs.reconcile(KEY)
    [(plural, subresource, drift)] = client.patches
    assert (plural, subresource) == ("queueunits", "")
    assert drift["metadata"] == {"resourceVersion": "7"} and drift["spec"]["podSet"][0]["count"] == 3


async def test_a_failed_status_write_is_finished_on_the_next_pass_and_the_job_stays_held() -> None:
    job = released_job()
    client = FakeClient(fail_status=True)
    jobs, _ = extensions(grown(job), admitted_unit(job), RunningTimeout(), client)
    with pytest.raises(kube.Conflict):
        await jobs.reconcile(KEY)
    [(plural, _, _)] = client.patches
    assert plural == "jobs"
    held = released_job(suspended=True)
    client = FakeClient()
    jobs, _ = extensions(grown(held), admitted_unit(held), RunningTimeout(), client)
    await jobs.reconcile(KEY)
    [(plural, subresource, status), (_, drift_sub, _)] = client.patches  # not resumed
    assert (plural, subresource, drift_sub) == ("queueunits", "status", "")
    assert status["status"]["phase"] == "Enqueued"


async def test_once_queued_again_the_unit_follows_the_new_size() -> None:
    held = released_job(suspended=True)
    unit = admitted_unit(held)
    unit["status"] = {"phase": "Enqueued", "admissions": []}
    client = FakeClient()
    jobs, events = extensions(grown(held), unit, RunningTimeout(), client)
    await jobs.reconcile(KEY)
    [(plural, subresource, drift)] = client.patches
    assert (plural, subresource) == ("queueunits", "")
    assert drift["spec"]["resource"] == {"cpu": "6"} and drift["metadata"] == {"resourceVersion": "7"}
    assert events.recorded == []


async def test_queued_again_the_pod_sets_take_the_current_limit_range_not_the_frozen_one() -> None:
    """Admitted when the namespace's LimitRange gave 500m, resized past the webhook after it was
    raised to 1: the unit is queued at the default its next pods will get."""

    def with_requests(base: Obj, requests: dict[str, str]) -> Obj:
        out = copy.deepcopy(base)
        out["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = requests
        return out

    job = released_job()
    unit = admitted_unit(with_requests(job, {"memory": "1Gi", "cpu": "500m"}))  # filled at admission
    client = FakeClient()
    jobs, _ = extensions(with_requests(job, {"memory": "2Gi"}), unit, RunningTimeout(), client)
    jobs.limit_ranges.objects["ns/defaults"] = {
        "metadata": {"name": "defaults", "namespace": "ns"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "1"}}]},
    }
    await jobs.reconcile(KEY)
    [_, (_, _, status), (_, _, drift)] = client.patches
    assert status["status"]["phase"] == "Enqueued"
    container = drift["spec"]["podSet"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"memory": "2Gi", "cpu": "1"}
    assert drift["spec"]["resource"] == {"cpu": "2", "memory": "4Gi"}

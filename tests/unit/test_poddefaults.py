"""What the apiserver fills into pods, applied to a unit's templates
(docs/compatibility.md#requests-the-apiserver-fills-in): LimitRange default requests and
RuntimeClass overhead, current while queued, frozen once admitted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.jobs import jobext, poddefaults, registry
from koord_queue.shared.jobs.poddefaults import PodDefaults

JOB = registry.by_extension("job")
Obj = dict[str, Any]


def limit_range(name: str, **item: Any) -> Obj:
    return {"metadata": {"name": name}, "spec": {"limits": [{"type": "Container", **item}]}}


@pytest.mark.parametrize(
    ("ranges", "expected", "why"),
    [
        ([limit_range("a", defaultRequest={"cpu": "500m"})], {"cpu": "500m"}, "as stored"),
        ([limit_range("a", default={"cpu": "2"})], {"cpu": "2"}, "no defaultRequest: the default"),
        ([limit_range("a", min={"memory": "64Mi"})], {"memory": "64Mi"}, "then the min"),
        (
            [limit_range("a", default={"cpu": "2"}, defaultRequest={"cpu": "1"})],
            {"cpu": "1"},
            "defaultRequest wins over default",
        ),
        (
            [
                limit_range("a", defaultRequest={"cpu": "1"}),
                limit_range("b", defaultRequest={"cpu": "1500m"}),
            ],
            {"cpu": "1500m"},
            "several: the largest",
        ),
        (
            [{"spec": {"limits": [{"type": "Pod", "max": {"cpu": "4"}}]}}],
            {},
            "only Container items give container defaults",
        ),
        (
            [limit_range("a", defaultRequest={"cpu": "lots", "memory": "1Gi"})],
            {"memory": "1Gi"},
            "bad skipped",
        ),
        ([{"spec": "nonsense"}, {}], {}, "unreadable objects"),
    ],
)
def test_limit_range_defaults(ranges: list[Obj], expected: dict[str, str], why: str) -> None:
    assert poddefaults.limit_range_requests(ranges) == expected, why


def job(containers: list[Obj], *, parallelism: int = 3, **pod: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "labels": {names.QUOTA_NAME_LABEL: "q"}},
        "spec": {"parallelism": parallelism, "template": {"spec": {"containers": containers, **pod}}},
    }


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Obj:
    resources: Obj = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "image": "i", "resources": resources}


LR = PodDefaults(requests={"cpu": "1", "memory": "1Gi"})


@pytest.mark.parametrize(
    ("containers", "expected", "why"),
    [
        ([container()], {"cpu": "3", "memory": "3Gi"}, "nothing asked: both defaults, per pod"),
        ([container({"cpu": "2"})], {"cpu": "6", "memory": "3Gi"}, "an explicit request stays"),
        ([container(limits={"cpu": "4"})], {"cpu": "12", "memory": "3Gi"}, "a limit is the request"),
        ([container({"cpu": "0"})], {"memory": "3Gi"}, "an explicit zero stays zero"),
    ],
)
def test_a_queued_unit_is_charged_the_limit_range_defaults(
    containers: list[Obj], expected: dict[str, str], why: str
) -> None:
    spec = jobext.desired_spec(job(containers), JOB, {}, defaults=LR)
    assert spec["resource"] == expected, why
    assert jobext.desired_spec(job(containers), JOB, {})["resource"] != expected or why.startswith("a limit")


def test_init_containers_get_them_too_and_the_template_shows_them() -> None:
    init = {**container(), "name": "setup"}
    spec = jobext.desired_spec(job([container({"cpu": "1"})], initContainers=[init]), JOB, {}, defaults=LR)
    template = spec["podSet"][0]["template"]["spec"]
    assert template["initContainers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert template["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}


def test_runtime_class_overhead_is_added_unless_the_template_sets_its_own() -> None:
    defaults = PodDefaults(overheads={"kata": {"cpu": "250m"}})
    spec = jobext.desired_spec(
        job([container({"cpu": "1"})], runtimeClassName="kata"), JOB, {}, defaults=defaults
    )
    assert spec["resource"] == {"cpu": "3750m"}
    own = job([container({"cpu": "1"})], runtimeClassName="kata", overhead={"cpu": "100m"})
    assert jobext.desired_spec(own, JOB, {}, defaults=defaults)["resource"] == {"cpu": "3300m"}
    other = job([container({"cpu": "1"})], runtimeClassName="runc")
    assert jobext.desired_spec(other, JOB, {}, defaults=defaults)["resource"] == {"cpu": "3"}
    assert poddefaults.runtime_class_overhead({"overhead": {"podFixed": {"cpu": "250m"}}}) == {"cpu": "250m"}
    assert poddefaults.runtime_class_overhead({"handler": "runc"}) == {}
    assert poddefaults.runtime_class_overhead({"overhead": "bad"}) == {}


def admitted_unit(spec: Obj) -> Obj:
    return {
        "spec": copy.deepcopy(spec),
        "status": {"phase": "Running", "admissions": [{"name": "j", "replicas": 3, "running": 3}]},
    }


def test_an_admitted_unit_keeps_what_was_filled_in_when_the_limit_range_changes() -> None:
    the_job = job([container()])
    queued = jobext.desired_spec(the_job, JOB, {}, defaults=LR)
    unit = admitted_unit(queued)
    raised = PodDefaults(requests={"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"})
    now = jobext.desired_spec(the_job, JOB, {}, defaults=raised, admitted=unit)
    assert now["resource"] == queued["resource"] == {"cpu": "3", "memory": "3Gi"}
    assert jobext.spec_drift(unit, now) is None
    assert jobext.admitted_resize(unit, now) == ()
    # While queued it follows the new defaults.
    assert jobext.desired_spec(the_job, JOB, {}, defaults=raised)["resource"]["cpu"] == "6"


def test_an_admitted_unit_from_before_the_defaults_were_read_is_not_taken_for_a_resize() -> None:
    the_job = job([container()])
    unit = admitted_unit(jobext.desired_spec(the_job, JOB, {}))  # nothing filled in back then
    now = jobext.desired_spec(the_job, JOB, {}, defaults=LR, admitted=unit)
    assert jobext.admitted_resize(unit, now) == () and jobext.spec_drift(unit, now) is None


def test_a_job_resized_while_admitted_is_still_found_with_defaults_in_play() -> None:
    unit = admitted_unit(jobext.desired_spec(job([container()]), JOB, {}, defaults=LR))
    grown = job([container({"cpu": "4"})])
    now = jobext.desired_spec(grown, JOB, {}, defaults=LR, admitted=unit)
    assert jobext.admitted_resize(unit, now) == ("j",)


def test_nothing_to_fill_leaves_the_template_as_it_is() -> None:
    template = {"spec": {"containers": [container({"cpu": "1", "memory": "1Gi"})]}}
    assert poddefaults.apply(template, LR) == template
    assert poddefaults.apply({"spec": "bad"}, LR) == {"spec": "bad"}
    assert poddefaults.apply({"spec": {"containers": [{"name": "c", "resources": "bad"}]}}, LR)


def test_an_admitted_unit_with_an_unreadable_template_fills_in_nothing() -> None:
    template = {"spec": {"containers": [container()], "runtimeClassName": "kata"}}
    frozen = {
        "spec": {
            "containers": [{"name": "c", "resources": "bad"}],
            "overhead": "bad",
            "runtimeClassName": "kata",
        }
    }
    defaults = PodDefaults(requests={"cpu": "1"}, overheads={"kata": {"cpu": "1"}})
    assert poddefaults.apply(template, defaults, frozen=frozen) == template
    assert poddefaults.apply(template, defaults, frozen={"spec": "bad"}) == template


# An admitted template changed in what the apiserver fills in (docs/compatibility.md#admitted-pod-size):
# what is new since the admission takes the namespace's current fill-ins, so the charge it brings is
# seen as a resize instead of riding along uncharged.


def test_a_container_added_to_an_admitted_template_gets_the_current_limit_range_and_is_a_resize() -> None:
    unit = admitted_unit(jobext.desired_spec(job([container({"cpu": "1"})]), JOB, {}, defaults=LR))
    sidecar = {**container(), "name": "sidecar"}
    now = jobext.desired_spec(job([container({"cpu": "1"}), sidecar]), JOB, {}, defaults=LR, admitted=unit)
    assert now["podSet"][0]["template"]["spec"]["containers"][1]["resources"]["requests"] == {
        "cpu": "1",
        "memory": "1Gi",
    }
    assert jobext.admitted_resize(unit, now) == ("j",)


def test_an_init_container_added_or_a_container_renamed_is_new_too() -> None:
    small = container({"cpu": "1", "memory": "100Mi"})
    unit = admitted_unit(jobext.desired_spec(job([small]), JOB, {}, defaults=LR))
    init = {**container(), "name": "setup"}  # asks for nothing: the default 1Gi outgrows 100Mi
    added = job([small], initContainers=[init])
    assert jobext.admitted_resize(unit, jobext.desired_spec(added, JOB, {}, defaults=LR, admitted=unit)) == (
        "j",
    )
    unit = admitted_unit(jobext.desired_spec(job([container({"cpu": "1"})]), JOB, {}, defaults=LR))
    renamed = job([{**container({"cpu": "1"}), "name": "other"}])
    assert (
        jobext.admitted_resize(unit, jobext.desired_spec(renamed, JOB, {}, defaults=LR, admitted=unit)) == ()
    )
    raised = PodDefaults(requests={"cpu": "1", "memory": "2Gi"})
    now = jobext.desired_spec(renamed, JOB, {}, defaults=raised, admitted=unit)
    assert jobext.admitted_resize(unit, now) == ("j",), "renamed, it gets the memory default of today"


def test_a_changed_runtime_class_is_charged_the_new_class_overhead() -> None:
    defaults = PodDefaults(overheads={"kata": {"cpu": "250m"}, "gvisor": {"cpu": "1"}})
    before = job([container({"cpu": "1"})], runtimeClassName="kata")
    unit = admitted_unit(jobext.desired_spec(before, JOB, {}, defaults=defaults))
    after = job([container({"cpu": "1"})], runtimeClassName="gvisor")
    now = jobext.desired_spec(after, JOB, {}, defaults=defaults, admitted=unit)
    assert now["podSet"][0]["template"]["spec"]["overhead"] == {"cpu": "1"}
    assert jobext.admitted_resize(unit, now) == ("j",)
    plain = job([container({"cpu": "1"})])
    unit = admitted_unit(jobext.desired_spec(plain, JOB, {}, defaults=defaults))
    now = jobext.desired_spec(before, JOB, {}, defaults=defaults, admitted=unit)
    assert jobext.admitted_resize(unit, now) == ("j",), "a class named only after the admission"


def test_an_unchanged_container_set_and_class_still_keep_the_frozen_fill_ins() -> None:
    defaults = PodDefaults(requests={"cpu": "1"}, overheads={"kata": {"cpu": "250m"}})
    the_job = job([container(), {**container(), "name": "log"}], runtimeClassName="kata")
    unit = admitted_unit(jobext.desired_spec(the_job, JOB, {}, defaults=defaults))
    raised = PodDefaults(requests={"cpu": "3"}, overheads={"kata": {"cpu": "2"}})
    now = jobext.desired_spec(the_job, JOB, {}, defaults=raised, admitted=unit)
    assert jobext.admitted_resize(unit, now) == () and jobext.spec_drift(unit, now) is None

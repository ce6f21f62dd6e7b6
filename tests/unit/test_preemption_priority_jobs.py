"""The job side of preemption priority and non-preempting jobs
(docs/compatibility.md#preemption-priority, docs/compatibility.md#non-preempting-jobs): the
annotations become the unit's ``spec.preemptionPriority`` / ``spec.preemptionPolicy`` (capped like
the priority, never below it, a PriorityClass's ``Never`` kept), the reconciler follows and says
when it raised a preemption priority, and the webhook refuses what a namespace user may not do."""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.reconciler.priorities import PriorityClasses
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission import validation
from koord_queue.shared.api import names, parsing
from koord_queue.shared.jobs import jobext
from koord_queue.shared.jobs import jobsteps as steps
from koord_queue.shared.jobs.base import PriorityClassTable
from koord_queue.shared.jobs.jobpath import Settings, decide
from tests.unit.test_job_path import ADAPTER, QUIET, kinds, unit_of, view
from tests.unit.test_job_path import job as queued_job
from tests.unit.test_jobext import JOB, job

PP = names.PREEMPTION_PRIORITY_ANNOTATION
POLICY = names.PREEMPTION_POLICY_ANNOTATION
NEVER = names.PREEMPTION_POLICY_NEVER


def spec_of(annotations: dict[str, str], classes: Any = None, **kwargs: Any) -> dict[str, Any]:
    source = job(annotations=annotations, priority_class=kwargs.pop("priority_class", None))
    return jobext.desired_spec(source, JOB, classes if classes is not None else {}, **kwargs)


# --- the unit's spec --------------------------------------------------------------------------------


def test_without_the_annotations_the_spec_has_no_preemption_fields() -> None:
    spec = spec_of({names.PRIORITY_ANNOTATION: "5"})
    assert "preemptionPriority" not in spec and "preemptionPolicy" not in spec


@pytest.mark.parametrize(
    ("annotations", "cap", "expected"),
    [
        ({PP: "50"}, None, 50),
        ({PP: "50", names.PRIORITY_ANNOTATION: "10"}, None, 50),
        ({PP: "5000"}, 100, 100),  # capped like the priority
        ({PP: "5", names.PRIORITY_ANNOTATION: "10"}, None, 10),  # never below the priority
        ({PP: "500", names.PRIORITY_ANNOTATION: "50"}, 20, 20),  # both capped
        ({PP: "-3"}, None, 0),  # no priority counts as 0
    ],
)
def test_the_preemption_priority_is_capped_and_never_below_the_priority(
    annotations: dict[str, str], cap: int | None, expected: int
) -> None:
    spec = spec_of(annotations, max_user_priority=cap)
    assert spec["preemptionPriority"] == expected
    unit = parsing.parse_unit({"metadata": {"name": "u", "namespace": "ns"}, "spec": spec})
    assert unit.victim_priority == expected and unit.victim_priority >= unit.priority


def test_a_class_priority_above_the_claim_raises_it_and_the_job_is_told() -> None:
    spec = spec_of({PP: "50"}, {"gold": 1000}, priority_class="gold")
    assert (spec["priority"], spec["preemptionPriority"]) == (1000, 1000)
    source = job(annotations={PP: "50"}, priority_class="gold")
    message = jobext.raised_preemption_priority(source, spec, None)
    assert message is not None and PP in message and "preempted at 1000" in message
    assert jobext.raised_preemption_priority(job(annotations={PP: "2000"}), spec, None) is None
    assert jobext.raised_preemption_priority(job(), spec, None) is None


@pytest.mark.parametrize(
    ("annotation", "class_never", "expected"),
    [
        (None, False, None),
        (NEVER, False, NEVER),
        (None, True, NEVER),
        (names.PREEMPTION_POLICY_PREEMPT, True, NEVER),  # the owner cannot lift the class's Never
        (names.PREEMPTION_POLICY_PREEMPT, False, None),
    ],
)
def test_the_policy_comes_from_the_annotation_or_the_class(
    annotation: str | None, class_never: bool, expected: str | None
) -> None:
    classes = PriorityClassTable({"gold": 100}, never={"gold"} if class_never else ())
    spec = spec_of({POLICY: annotation} if annotation else {}, classes, priority_class="gold")
    assert spec.get("preemptionPolicy") == expected


def test_a_class_the_quota_refuses_gives_no_policy_and_the_default_class_gives_its_own() -> None:
    classes = PriorityClassTable({"gold": 100, "base": 1}, never={"gold", "base"})
    refused = spec_of({}, classes, priority_class="gold", allowed_classes=frozenset())
    assert "preemptionPolicy" not in refused
    defaulted = spec_of({}, classes, default_class="base")
    assert defaulted["preemptionPolicy"] == NEVER
    explicit = spec_of({}, {"gold": 100}, priority_class="gold", never_classes=frozenset({"gold"}))
    assert explicit["preemptionPolicy"] == NEVER


def test_the_unit_follows_and_drift_patches_the_preemption_fields() -> None:
    unit = jobext.build_queue_unit(job(), JOB, {})
    desired = spec_of({PP: "40", POLICY: NEVER})
    patch = jobext.spec_drift(unit, desired)
    assert patch is not None
    assert patch["spec"]["preemptionPriority"] == 40 and patch["spec"]["preemptionPolicy"] == NEVER
    unit["spec"] |= patch["spec"]
    assert jobext.spec_drift(unit, desired) is None


# --- the reconciler: the event, and the classes' policies ------------------------------------------


def test_the_reconciler_tells_the_job_when_it_raised_the_preemption_priority() -> None:
    asking = queued_job()
    asking["metadata"]["annotations"][PP] = "5"
    asking["spec"]["template"]["spec"]["priorityClassName"] = "gold"
    settings = Settings(priority_classes={"gold": 100}, timeouts=QUIET.timeouts)
    actions = decide(view(asking, settings=settings))
    assert kinds(actions) == ["CreateUnit", "RecordEvent"]
    event = actions[1]
    assert isinstance(event, steps.RecordEvent) and event.reason == names.PREEMPTION_PRIORITY_RAISED_REASON
    created = actions[0]
    assert isinstance(created, steps.CreateUnit) and created.unit["spec"]["preemptionPriority"] == 100
    # A class created later raises it on the unit that exists: the same Warning with the patch.
    unit = unit_of(asking, phase=None)
    assert "priority" not in unit["spec"] and unit["spec"]["preemptionPriority"] == 5
    actions = decide(view(asking, unit, settings=settings))
    assert isinstance(actions[0], steps.PatchUnit) and actions[0].patch["spec"]["preemptionPriority"] == 100
    assert any(
        isinstance(a, steps.RecordEvent) and a.reason == names.PREEMPTION_PRIORITY_RAISED_REASON
        for a in actions
    )


def test_priority_classes_keep_their_preemption_policy() -> None:
    calls: list[int] = []
    classes = PriorityClasses(changed=lambda: calls.append(1))
    gold = {"metadata": {"name": "gold"}, "value": 100, "preemptionPolicy": NEVER}
    classes.on_event(None, gold)
    assert classes.values == {"gold": 100} and classes.values.never == {"gold"}
    classes.on_event(gold, gold)  # nothing new: no pass over every job
    assert len(calls) == 1
    plain = {**gold, "preemptionPolicy": names.PREEMPTION_POLICY_PREEMPT}
    classes.on_event(gold, plain)
    assert classes.values.never == set() and len(calls) == 2
    classes.on_event(None, gold)
    classes.on_event(gold, None)
    assert classes.values == {} and classes.values.never == set()
    spec = jobext.desired_spec(job(priority_class="gold"), ADAPTER, classes.values)
    assert "preemptionPolicy" not in spec


# --- the webhook ----------------------------------------------------------------------------------


def _errors(new: dict[str, str], old: dict[str, str] | None = None, cap: int | None = None) -> list[str]:
    return [str(e) for e in validation.validate_job_annotations(new, unchanged=old, max_priority=cap)]


def test_the_webhook_accepts_sound_annotations_at_creation() -> None:
    assert _errors({PP: "50", names.PRIORITY_ANNOTATION: "50", POLICY: NEVER}, cap=50) == []
    assert _errors({PP: "7", POLICY: names.PREEMPTION_POLICY_PREEMPT}) == []


@pytest.mark.parametrize(
    ("annotations", "cap", "text"),
    [
        ({PP: "high"}, None, "must be a 32-bit integer"),
        ({PP: "101"}, 100, "must be at most 100"),
        ({PP: "5", names.PRIORITY_ANNOTATION: "10"}, None, "must not be below the job's priority"),
        ({POLICY: "never"}, None, 'supported values: "PreemptLowerPriority", "Never"'),
    ],
)
def test_the_webhook_refuses_unsound_annotations_at_creation(
    annotations: dict[str, str], cap: int | None, text: str
) -> None:
    (error,) = _errors(annotations, cap=cap)
    assert text in error


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({PP: "10"}, {PP: "1000"}),  # raised after creation
        ({}, {PP: "1000"}),  # added after creation
        ({PP: "10"}, {}),  # removed
        ({POLICY: NEVER}, {POLICY: names.PREEMPTION_POLICY_PREEMPT}),  # made to preempt
        ({POLICY: NEVER}, {}),
        ({}, {POLICY: NEVER}),
    ],
)
def test_the_annotations_are_immutable(old: dict[str, str], new: dict[str, str]) -> None:
    (error,) = _errors(new, old)
    key = next(iter(new or old))
    assert error.startswith(f"metadata.annotations[{key}]: Forbidden: {key} is immutable")
    assert _errors(dict(old), dict(old)) == []


def _review(operation: str, new: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    request = {
        "uid": "r1",
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "operation": operation,
        "namespace": "ns",
        "name": "first",
        "userInfo": {"username": "alice"},
        "object": new,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_the_webhook_refuses_flipping_the_policy_of_a_queued_job() -> None:
    before = queued_job()
    before["metadata"]["annotations"][POLICY] = NEVER
    after = queued_job()
    after["metadata"]["annotations"][POLICY] = names.PREEMPTION_POLICY_PREEMPT
    config = admission.AdmissionConfig()
    answer = admission.review(
        _review("UPDATE", after, before), operation=admission.Operation.VALIDATE, config=config, now_text="t"
    )["response"]
    assert answer["allowed"] is False and f"{POLICY} is immutable" in answer["status"]["message"]
    answer = admission.review(
        _review("UPDATE", before, before), operation=admission.Operation.VALIDATE, config=config, now_text="t"
    )["response"]
    assert answer["allowed"] is True, answer


def test_a_queue_unit_with_unsound_preemption_fields_is_refused() -> None:
    unit = {"spec": {"preemptionPriority": "high", "preemptionPolicy": "Sometimes"}}
    paths = [e.path for e in validation.validate_queue_unit(unit)]
    assert paths == ["spec.preemptionPriority", "spec.preemptionPolicy"]
    assert (
        validation.validate_queue_unit({"spec": {"preemptionPriority": 5, "preemptionPolicy": NEVER}}) == []
    )

"""Admission checks (docs/compatibility.md#admission-checks; scenarios S10, S12
and S13 of docs/compatibility.md#scenario-list): selectors, the list written at admission,
and the state machine from check states to the next phase."""

from __future__ import annotations

import pytest

from koord_queue.shared.api.admission_checks import (
    CHECK_REMOVED_MESSAGE,
    CheckOutcome,
    CheckState,
    QueueAdmissionCheck,
    checks_for_admission,
    matched_checks,
    next_phase,
    parse_selector,
)
from koord_queue.shared.api.names import Message, Phase
from tests.unit.test_model import unit

NOW = "2024-05-01T00:00:00Z"
OLD = "2024-01-01T00:00:00Z"


def _sel(raw: object) -> QueueAdmissionCheck:
    selector, problems = parse_selector(raw)
    assert problems == []
    return QueueAdmissionCheck("c", selector)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": {"requires-provisioning": "true"}}, {"requires-provisioning": "true"}, True),
        ({"matchLabels": {"requires-provisioning": "true"}}, {}, False),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]}, {"t": "b"}, True),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {"t": "a"}, False),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"t": ""}, True),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {"t": ""}, False),
    ],
)
def test_label_selectors(selector: object, labels: dict[str, str], matches: bool) -> None:
    assert _sel(selector).matches(labels) is matches


def test_a_nil_selector_matches_everything_and_a_bad_one_matches_nothing() -> None:
    assert QueueAdmissionCheck("c").matches({})
    selector, problems = parse_selector(
        {"matchExpressions": [{"key": "t", "operator": "Like", "values": ["a"]}]}
    )
    assert problems and not selector.matches({"t": "a"})


def test_s13_matched_checks_follow_the_queue_order() -> None:
    checks = [
        QueueAdmissionCheck("prov", _sel({"matchLabels": {"requires-provisioning": "true"}}).selector),
        QueueAdmissionCheck("all"),
        QueueAdmissionCheck("all"),
    ]
    assert matched_checks(checks, {}) == ("all",)
    assert matched_checks(checks, {"requires-provisioning": "true"}) == ("prov", "all")


def test_checks_written_at_admission_reset_append_and_retire() -> None:
    existing = [
        CheckState("ad1", "Rejected", "no", OLD),
        CheckState("gone", "Pending", "", OLD),
        CheckState("ad2", "Pending", "", OLD),
    ]
    out = checks_for_admission(
        [QueueAdmissionCheck("ad1"), QueueAdmissionCheck("ad2"), QueueAdmissionCheck("new")],
        {},
        existing,
        now=NOW,
    )
    assert out == [
        {"name": "ad1", "state": "Pending", "lastTransitionTime": NOW, "message": "", "podSetUpdates": []},
        {
            "name": "gone",
            "state": "Ready",
            "lastTransitionTime": NOW,
            "message": CHECK_REMOVED_MESSAGE,
            "podSetUpdates": [],
        },
        {"name": "ad2", "state": "Pending", "lastTransitionTime": OLD, "message": "", "podSetUpdates": []},
        {"name": "new", "state": "Pending", "lastTransitionTime": NOW, "message": "", "podSetUpdates": []},
    ]


@pytest.mark.parametrize(
    ("case", "states", "outcome"),
    [
        (
            "qu1 both ready",
            [("ad1", "Ready"), ("ad2", "Ready")],
            CheckOutcome(Phase.DEQUEUED, Message.CHECKS_READY),
        ),
        (
            "qu2 ad2 rejected",
            [("ad1", "Pending"), ("ad2", "Rejected")],
            CheckOutcome(Phase.TIMEOUT_BACKOFF, Message.CHECK_FAILED, "ad2"),
        ),
        (
            "qu3 ad2 retry",
            [("ad1", "Ready"), ("ad2", "Retry")],
            CheckOutcome(Phase.TIMEOUT_BACKOFF, Message.CHECK_FAILED, "ad2"),
        ),
        ("qu4 ad1 pending", [("ad1", "Pending"), ("ad2", "Ready")], None),
        (
            "first failing check decides",
            [("ad1", "Retry"), ("ad2", "Rejected")],
            CheckOutcome(Phase.TIMEOUT_BACKOFF, Message.CHECK_FAILED, "ad1"),
        ),
    ],
)
def test_s12_mixed_outcomes(case: str, states: list[tuple[str, str]], outcome: CheckOutcome | None) -> None:
    u = unit("qu").cpu("1").admitted(1).phase("Reserved").checks(*states).build()
    assert next_phase(u.phase, u.admission_checks) == outcome, case


def test_s10_rejection_moves_a_reserved_unit_to_backoff() -> None:
    u = unit("qu").cpu("1").admitted(1).phase("Reserved").checks(("conditions-check", "Rejected")).build()
    result = next_phase(u.phase, u.admission_checks)
    assert result is not None and result.phase is Phase.TIMEOUT_BACKOFF


def test_only_reserved_units_are_evaluated() -> None:
    u = unit("qu").cpu("1").admitted(1).phase("Dequeued").checks(("a", "Rejected")).build()
    assert next_phase(u.phase, u.admission_checks) is None

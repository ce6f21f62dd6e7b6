"""Conditions derived from the phase (docs/compatibility.md#conditions), the Evicted helper, and the
structured requeue backoff (docs/compatibility.md#attempts-and-backoff,
docs/compatibility.md#s11-structured-backoff)."""

from __future__ import annotations

import pytest

from koord_queue.shared.api.conditions import (
    MAX_REQUEUE_DELAY,
    evicted,
    next_requeue_state,
    set_condition,
    sync_conditions,
)
from koord_queue.shared.api.names import Phase

T0 = "2024-01-01T00:00:00Z"
T1 = "2024-01-01T00:01:00Z"


def _by_type(conds: list[dict[str, object]]) -> dict[str, tuple[object, object]]:
    return {str(c["type"]): (c["status"], c["reason"]) for c in conds}


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (Phase.ENQUEUED, {"QuotaReserved": ("False", "Pending"), "Admitted": ("False", "Pending")}),
        (
            Phase.RESERVED,
            {"QuotaReserved": ("True", "QuotaReserved"), "Admitted": ("False", "WaitingForAdmissionChecks")},
        ),
        (Phase.DEQUEUED, {"QuotaReserved": ("True", "QuotaReserved"), "Admitted": ("True", "Admitted")}),
        (Phase.SCHED_READY, {"QuotaReserved": ("True", "QuotaReserved"), "Admitted": ("True", "Admitted")}),
        (
            Phase.RUNNING,
            {
                "QuotaReserved": ("True", "QuotaReserved"),
                "Admitted": ("True", "Admitted"),
                "PodsReady": ("True", "PodsRunning"),
            },
        ),
        (Phase.SUCCEED, {"Finished": ("True", "Succeeded")}),
        (Phase.FAILED, {"Finished": ("True", "Failed")}),
        (
            Phase.TIMEOUT_BACKOFF,
            {
                "QuotaReserved": ("False", "BackoffTimeout"),
                "Admitted": ("False", "BackoffTimeout"),
                "Evicted": ("True", "BackoffTimeout"),
            },
        ),
        (Phase.SCHED_FAILED, {"Admitted": ("False", "SchedulingFailed")}),
        ("", {}),
    ],
)
def test_phase_to_conditions_table(phase: str, expected: dict[str, tuple[str, str]]) -> None:
    conds, _ = sync_conditions([], phase=phase, message="m", now=T0)
    assert _by_type(conds) == expected
    for cond in conds:
        assert cond["reason"] and cond["lastTransitionTime"] == T0


def test_s1_dequeued_conditions_have_reasons_and_transition_times() -> None:
    conds, clear = sync_conditions([], phase=Phase.DEQUEUED, message="", now=T0)
    assert not clear
    assert all(c["lastTransitionTime"] for c in conds)


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    conds, _ = sync_conditions([], phase=Phase.RESERVED, message="", now=T0)
    conds, _ = sync_conditions(conds, phase=Phase.DEQUEUED, message="", now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in conds}
    assert times == {"QuotaReserved": T0, "Admitted": T1}


def test_enqueued_touches_pods_ready_and_evicted_only_if_present() -> None:
    conds, _ = sync_conditions([], phase=Phase.RUNNING, message="", now=T0)
    conds = evicted(conds, reason="Preempted", message="Waiting job extension to reclaim resources.", now=T0)
    conds, _ = sync_conditions(conds, phase=Phase.ENQUEUED, message="", now=T1)
    assert _by_type(conds)["PodsReady"] == ("False", "Pending")
    assert _by_type(conds)["Evicted"] == ("False", "Requeued")


def test_running_clears_the_requeue_state() -> None:
    assert sync_conditions([], phase=Phase.RUNNING, message="", now=T0)[1] is True


def test_s10_rejection_gives_evicted_backoff_and_quota_released() -> None:
    conds, _ = sync_conditions([], phase=Phase.RESERVED, message="", now=T0)
    conds, _ = sync_conditions(conds, phase=Phase.TIMEOUT_BACKOFF, message="admission check failed", now=T1)
    table = _by_type(conds)
    assert table["Evicted"] == ("True", "BackoffTimeout")
    assert table["QuotaReserved"] == ("False", "BackoffTimeout")
    assert [c["message"] for c in conds if c["type"] == "Evicted"] == ["admission check failed"]


def test_evicted_sets_admitted_false_with_the_same_reason() -> None:
    conds = evicted([], reason="Preempted", message="x", now=T0)
    assert _by_type(conds) == {"Evicted": ("True", "Preempted"), "Admitted": ("False", "Preempted")}


def test_set_condition_keeps_unknown_keys_and_reports_changes() -> None:
    conds: list[dict[str, object]] = [
        {
            "type": "Admitted",
            "status": "True",
            "reason": "Admitted",
            "message": "m",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]
    assert not set_condition(conds, "Admitted", "True", "Admitted", "m", now=T1)
    assert conds[0]["observedGeneration"] == 3 and conds[0]["lastTransitionTime"] == T0


def test_input_conditions_are_not_modified() -> None:
    original = [
        {"type": "Admitted", "status": "False", "reason": "Pending", "message": "", "lastTransitionTime": T0}
    ]
    sync_conditions(original, phase=Phase.DEQUEUED, message="", now=T1)
    assert original[0]["status"] == "False"


# --- requeue backoff ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "jitter", "count", "delay"),
    [
        (None, 0.5, 1, 10.0),
        (1, 0.5, 2, 20.0),
        (2, 0.0, 3, 36.0),
        (3, 0.99, 4, 80 * 1.098),
        (20, 0.5, 21, MAX_REQUEUE_DELAY),
        (20, 0.99, 21, MAX_REQUEUE_DELAY),
    ],
)
def test_s11_requeue_state_doubles_with_jitter_and_a_cap(
    previous: int | None, jitter: float, count: int, delay: float
) -> None:
    state = next_requeue_state(previous, now=1000.0, jitter=jitter)
    assert state.count == count
    assert state.delay == pytest.approx(delay)
    assert state.requeue_at == pytest.approx(1000.0 + delay)
    assert state.delay <= MAX_REQUEUE_DELAY


def test_s11_a_second_backoff_lands_later() -> None:
    first = next_requeue_state(None, now=0.0, jitter=0.9)
    second = next_requeue_state(first.count, now=first.requeue_at, jitter=0.1)
    assert second.count == 2 and second.requeue_at > first.requeue_at
    assert first.to_status() == {"count": 1, "requeueAt": "1970-01-01T00:00:10Z"}


def test_a_non_positive_base_means_ten_seconds() -> None:
    assert next_requeue_state(None, now=0, jitter=0.5, base=0).delay == 10.0

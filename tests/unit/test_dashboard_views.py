"""The dashboard's figures (docs/dashboard.md#what-it-shows): wait percentiles and preemption counts
from what the cluster already records, queues in scheduling order, a job's pods."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.dashboard import views
from koord_queue.shared.api.model import Unit

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
DAY = views.DAY


@given(st.lists(st.floats(min_value=0, max_value=1e7, allow_nan=False), min_size=1), st.floats(1, 100))
def test_a_percentile_is_one_of_the_values_and_grows_with_q(values: list[float], q: float) -> None:
    p = views.percentile(values, q)
    assert p in values
    assert min(values) <= p <= views.percentile(values, 100) == max(values)
    assert views.percentile(values, 50) <= views.percentile(values, 95)
    at_most = sum(1 for v in values if v <= p)
    assert at_most >= math.ceil(q / 100 * len(values))  # nearest rank: q% of the values are <= p


def test_percentiles_by_nearest_rank() -> None:
    waits = [float(s) for s in range(1, 21)]  # 1..20 s
    assert views.percentile(waits, 50) == 10
    assert views.percentile(waits, 95) == 19
    assert views.percentile([7.0], 95) == 7
    with pytest.raises(ValueError):
        views.percentile([], 50)


def unit(name: str, quota: str | None, created: float, admitted: float | None) -> Unit:
    return Unit(
        key=f"ns/{name}", namespace="ns", name=name, quota=quota, created=created, last_allocate_time=admitted
    )


def test_waits_are_counted_per_queue_and_day_from_the_units_status() -> None:
    units = [
        unit("a", "team-a", NOW - 3600, NOW - 3000),  # waited 600 s, today
        unit("b", "team-a", NOW - 3600, NOW - 3590),  # waited 10 s, today
        unit("c", "team-a", NOW - DAY - 100, NOW - DAY - 40),  # 60 s, yesterday
        unit("d", "team-b", NOW - 50, NOW - 50),  # admitted at once
        unit("waiting", "team-a", NOW - 100, None),  # not admitted: no wait yet
        unit("old", "team-a", NOW - 9 * DAY, NOW - 8 * DAY),  # outside a 7-day window
        unit("no-queue", None, NOW - 100, NOW - 10),
    ]
    rows = {(w.queue, w.day): w for w in views.wait_history(units, NOW, 7)}
    assert set(rows) == {
        ("team-a", "2025-12-30"),
        ("team-a", "2025-12-31"),
        ("team-a", "all"),
        ("team-b", "2025-12-31"),
        ("team-b", "all"),
    }
    today = rows[("team-a", "2025-12-31")]
    assert (today.admitted, today.p50, today.p95, today.longest) == (2, 10, 600, 600)
    overall = rows[("team-a", "all")]
    assert (overall.admitted, overall.p50, overall.p95) == (3, 60, 600)
    assert rows[("team-b", "all")].p95 == 0
    order = [(w.queue, w.day) for w in views.wait_history(units, NOW, 7)]
    assert order.index(("team-a", "2025-12-30")) < order.index(("team-a", "all"))  # days, then all


@given(
    st.lists(
        st.tuples(st.floats(0, 30 * DAY), st.floats(0, 10 * DAY), st.sampled_from(["q1", "q2"])), max_size=40
    ),
    st.integers(1, 31),
)
def test_every_unit_admitted_in_the_window_is_counted_once(
    stamps: list[tuple[float, float, str]], days: int
) -> None:
    units = [
        unit(f"u{i}", q, NOW - ago - wait, NOW - ago) for i, (ago, wait, q) in enumerate(stamps) if ago + wait
    ]
    rows = views.wait_history(units, NOW, days)
    for queue in ("q1", "q2"):
        expected = sum(
            1 for u in units if u.quota == queue and (u.last_allocate_time or 0) >= NOW - days * DAY
        )
        overall = [w for w in rows if w.queue == queue and w.day == "all"]
        assert (overall[0].admitted if overall else 0) == expected
        assert sum(w.admitted for w in rows if w.queue == queue and w.day != "all") == expected


def event(name: str, reason: str, when: str, *, kind: str = "QueueUnit", **extra: Any) -> dict[str, Any]:
    return {
        "reason": reason,
        "involvedObject": {"kind": kind, "namespace": "ns", "name": name},
        "lastTimestamp": when,
        "message": extra.pop("message", ""),
        **extra,
    }


def test_preemptions_are_counted_from_preempted_events_on_queueunits() -> None:
    events = [
        event("a", "Preempted", "2025-12-31T10:00:00Z"),
        event("a", "Preempted", "2025-12-31T11:00:00Z", count=3),
        event("gone", "Preempted", "2025-12-30T11:00:00Z", message="1 replica(s) marked in queue team-b so"),
        event("gone2", "Preempted", "2025-12-30T11:00:00Z", message="no queue named here"),
        event("a", "Preempted", "2025-12-31T10:00:00Z", kind="Job"),  # the job's copy: not twice
        event("a", "Scheduled", "2025-12-31T10:00:00Z"),
        event("a", "Preempted", "2025-12-01T10:00:00Z"),  # outside the window
        event("a", "Preempted", ""),  # no time: not placed on a day
    ]
    counts = views.preemption_history(events, {"ns/a": "team-a"}, NOW, 7)
    assert [(c.queue, c.day, c.count) for c in counts] == [
        ("-", "2025-12-30", 1),
        ("team-a", "2025-12-31", 4),
        ("team-b", "2025-12-30", 1),
    ]


def test_queues_are_shown_in_scheduling_order() -> None:
    def row(name: str, queue: str, position: int | None, waiting: bool, priority: int = 0) -> dict[str, Any]:
        phase = "Enqueued" if waiting else "Running"
        return {
            "name": name,
            "queue": queue,
            "position": position,
            "waiting": waiting,
            "priority": priority,
            "phase": phase,
        }

    rows = [
        row("running", "b", None, False),
        row("second", "b", 2, True),
        row("unnumbered-low", "b", None, True, 1),
        row("first", "b", 1, True),
        row("unnumbered-high", "b", None, True, 9),
        row("orphan", "", None, True),
        row("only", "a", 1, True),
    ]
    groups = views.queue_order(rows)
    assert [g.queue for g in groups] == ["a", "b", ""]
    assert [r["name"] for r in groups[1].rows] == [
        "first",
        "second",
        "unnumbered-high",
        "unnumbered-low",
        "running",
    ]
    assert groups[1].waiting == 4


def test_a_jobs_pods_are_those_it_owns() -> None:
    def pod(name: str, owner_kind: str, owner: str, phase: str | None = None) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "ownerReferences": [{"kind": owner_kind, "name": owner}]},
            "status": {"phase": phase} if phase else {},
            "spec": {"nodeName": "node-1"} if phase == "Running" else {},
        }

    pods = [
        pod("j-2", "Job", "j", "Running"),
        pod("j-1", "Job", "j"),
        pod("x", "Job", "other"),
        pod("y", "RayJob", "j"),
    ]
    assert views.pods_of(pods, "Job", "j") == [
        {"name": "j-1", "phase": "Pending", "node": "-"},
        {"name": "j-2", "phase": "Running", "node": "node-1"},
    ]

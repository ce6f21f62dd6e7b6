"""What the dashboard's pages show, computed from what the plugin read: pure functions, no I/O, no
clock (``now`` is given), so each figure is tested on its own (docs/dashboard.md#what-it-shows).

* :func:`queue_order` groups the plugin's ``list`` rows by queue in scheduling order: the units with
  a position first (as the visibility API numbers them), then the other waiting units, then the
  admitted and the finished ones.
* :func:`wait_history` and :func:`preemption_history` are the history page. Nothing new is stored
  for them: a wait is what an admitted QueueUnit's status already records (created, then last
  admitted), a preemption is a ``Preempted`` event on a QueueUnit, kept as long as the API server
  keeps events (its ``--event-ttl``, one hour by default).
* :func:`first_rows` and :func:`row` are the queue page at any size: the first units of each
  queue in that same order, and only their rows are built.
* :func:`pods_of` picks the pods a job owns, for one unit's story.
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from koord_queue.cli import render
from koord_queue.cli.commands import short_reason
from koord_queue.cli.listing import wait_of
from koord_queue.shared.api.durations import parse_time
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import EventReason
from koord_queue.shared.api.predicates import TERMINAL_PHASES
from koord_queue.shared.core.charges import remaining_request, reserved_resources
from koord_queue.shared.core.policies import is_waiting

Obj = Mapping[str, Any]
DAY: Final = 86400.0
#: The queue named in a ``Preempted`` event's message ("... in queue team-a so that ...").
_QUEUE_IN_MESSAGE: Final = re.compile(r"\bin (?:queue|quota) (\S+?)[:;,]?(?:\s|$)")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0 < q <= 100) of ``values``: always one of the values,
    so a p95 of waits is a wait someone really had. ``values`` must not be empty."""
    if not values:
        raise ValueError("percentile of nothing")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def day_of(epoch: float) -> str:
    """The UTC day of ``epoch``, as ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


@dataclass(frozen=True, slots=True)
class WaitStats:
    """Waits of the units a queue admitted on one day (``day`` "all": over the whole window)."""

    queue: str
    day: str
    admitted: int
    p50: float
    p95: float
    longest: float


def wait_history(units: Iterable[Unit], now: float, days: int) -> list[WaitStats]:
    """p50/p95 of the waits of units admitted in the last ``days`` days, per queue and day and per
    queue over the window; a wait runs from the unit's creation to its last admission."""
    since = now - days * DAY
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for unit in units:
        admitted = unit.last_allocate_time
        if admitted is None or not unit.created or not unit.quota or admitted < since or admitted > now:
            continue
        wait = max(0.0, admitted - unit.created)
        waits[(unit.quota, day_of(admitted))].append(wait)
        waits[(unit.quota, "all")].append(wait)
    return [
        WaitStats(queue, day, len(v), percentile(v, 50), percentile(v, 95), max(v))
        for (queue, day), v in sorted(waits.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all", kv[0][1]))
    ]


@dataclass(frozen=True, slots=True)
class PreemptionCount:
    """How many times units of ``queue`` were preempted on ``day``."""

    queue: str
    day: str
    count: int


def event_time(event: Obj) -> float | None:
    meta = event.get("metadata") or {}
    return parse_time(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
    )


def preemption_history(
    events: Iterable[Obj], queue_of: Mapping[str, str], now: float, days: int
) -> list[PreemptionCount]:
    """``Preempted`` events on QueueUnits in the last ``days`` days, per queue and day. The queue is
    the unit's (``queue_of``: ``namespace/name`` to queue), else the one the message names; an event
    repeated by the API server counts ``count`` times."""
    since = now - days * DAY
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for event in events:
        involved = event.get("involvedObject") or {}
        if event.get("reason") != EventReason.PREEMPTED or involved.get("kind") != "QueueUnit":
            continue
        when = event_time(event)
        if when is None or when < since or when > now + 60:
            continue
        key = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        queue = queue_of.get(key)
        if queue is None:
            found = _QUEUE_IN_MESSAGE.search(str(event.get("message") or ""))
            queue = found.group(1) if found else "-"
        repeated = event.get("count")
        counts[(queue, day_of(when))] += repeated if isinstance(repeated, int) and repeated > 0 else 1
    return [PreemptionCount(q, d, n) for (q, d), n in sorted(counts.items())]


@dataclass(frozen=True, slots=True)
class QueueGroup:
    """One queue's rows in the order the scheduler considers them."""

    queue: str
    waiting: int
    rows: tuple[Obj, ...]


def _standing(row: Obj) -> tuple[int, float, int, str, str]:
    position = row.get("position")
    if isinstance(position, int):
        return (0, float(position), 0, "", "")
    if row.get("waiting"):  # not numbered (the visibility API unreadable): higher priority first
        priority = row.get("priority")
        return (1, 0.0, -(priority if isinstance(priority, int) else 0), "", str(row.get("name", "")))
    return (2, 0.0, 0, str(row.get("phase", "")), str(row.get("name", "")))


def queue_order(rows: Iterable[Obj]) -> list[QueueGroup]:
    """The plugin's ``list -o json`` rows grouped by queue (sorted by name, units of no queue
    last), each in scheduling order: numbered positions, the other waiting units, then the rest."""
    by_queue: dict[str, list[Obj]] = defaultdict(list)
    for row in rows:
        by_queue[str(row.get("queue") or "")].append(row)
    groups = []
    for queue in sorted(by_queue, key=lambda q: (q == "", q)):
        members = sorted(by_queue[queue], key=_standing)
        groups.append(QueueGroup(queue, sum(1 for r in members if r.get("waiting")), tuple(members)))
    return groups


def pods_of(pods: Iterable[Obj], kind: str, name: str) -> list[dict[str, str]]:
    """The pods whose owner is the job ``kind``/``name``: name, phase, node."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        if not any(o.get("kind") == kind and o.get("name") == name for o in owners):
            continue
        found.append(
            {
                "name": str(meta.get("name", "")),
                "phase": str((pod.get("status") or {}).get("phase") or "Pending"),
                "node": str((pod.get("spec") or {}).get("nodeName") or "-"),
            }
        )
    return sorted(found, key=lambda p: p["name"])


@dataclass(frozen=True, slots=True)
class Held:
    """One QueueUnit as the dashboard keeps it (``dashboard.cache``): the parsed unit and the job
    text ``list`` prints for it (``kind/name``, or ``-``)."""

    unit: Unit
    job: str


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a unit stands on the queue page, before its row is built."""

    queue: str
    standing: tuple[int, float, int, str, str]
    waiting: bool
    key: str


def slot(unit: Unit, position: int | None) -> Slot:
    """The unit's place: the same order :func:`queue_order` gives ``list``'s rows."""
    waiting = is_waiting(unit) and unit.phase not in TERMINAL_PHASES
    standing = _standing(
        {
            "position": position,
            "waiting": waiting,
            "priority": unit.priority,
            "phase": unit.phase or "Pending",
            "name": unit.name,
        }
    )
    return Slot(unit.quota or "", standing, waiting, unit.key)


@dataclass(frozen=True, slots=True)
class PageGroup:
    """One queue on the queue page: its first ``limit`` units in scheduling order."""

    queue: str
    waiting: int
    total: int
    keys: tuple[str, ...]


def first_rows(units: Mapping[str, Unit], positions: Mapping[str, int], limit: int) -> list[PageGroup]:
    """Per queue (sorted by name, units of no queue last) the keys of its first ``limit`` units in
    scheduling order, with how many it has and how many wait: the queue page at any size only
    builds, explains and sends these (docs/dashboard.md#what-it-costs)."""
    by_queue: dict[str, list[Slot]] = defaultdict(list)
    for key, unit in units.items():
        by_queue[unit.quota or ""].append(slot(unit, positions.get(key)))
    groups = []
    for queue in sorted(by_queue, key=lambda q: (q == "", q)):
        members = by_queue[queue]
        waiting = sum(1 for s in members if s.waiting)
        shown = heapq.nsmallest(limit, members, key=lambda s: s.standing)
        groups.append(PageGroup(queue, waiting, len(members), tuple(s.key for s in shown)))
    return groups


def row(unit: Unit, job: str, position: int | None, now: float) -> dict[str, Any]:
    """One unit's row, the fields ``kubectl koord-queue list -o json`` gives it."""
    waiting, waited = wait_of(unit, now)
    return {
        "namespace": unit.namespace,
        "name": unit.name,
        "job": job,
        "queue": unit.quota or "",
        "phase": unit.phase or "Pending",
        "priority": unit.priority,
        "position": position,
        "waitSeconds": None if waited is None else round(waited, 1),
        "waiting": waiting,
        "reason": short_reason(unit),
        "message": unit.message,
        "request": render.resources(remaining_request(unit)),
        "holds": render.resources(reserved_resources(unit)),
    }

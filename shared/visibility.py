"""The visibility API's answers: which units wait, in what order, for what, and why.

Served as ``visibility.koord-queue.x-k8s.io/v1alpha1`` (REFERENCE §7.2) with two read-only
resources: ``queues/{queue}/queueunits`` (the queue's waiting units in scheduling order) and
``elasticquotas/{quota}/queueunits`` (every unit charged to the quota, optionally filtered by
``phase``). Both honour ``offset`` and ``limit`` (upstream ignores them) and report ``podState``
with its fields the right way round (upstream swaps them). Each item carries its 1-based position
while it waits, its priority, what it still asks for, what it holds, and ``status.message`` — the
reason it waits.

Pure: built from the scheduler's cache (``shared.scheduling.Cache``) by the reconciler's server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shared import quantities
from shared.model import Unit
from shared.policies import SchedulerState, queue_item_details
from shared.quota import remaining_request, reserved_resources

GROUP: Final = "visibility.koord-queue.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10_000


class NotFound(LookupError):
    """The queue or quota does not exist; the message names it."""


class BadRequest(ValueError):
    """A query parameter is malformed; the message names it."""


def _page(raw: Mapping[str, str]) -> tuple[int, int]:
    try:
        offset = int(raw.get("offset", "0"))
        limit = int(raw.get("limit", str(DEFAULT_LIMIT)))
    except ValueError:
        raise BadRequest("offset and limit must be whole numbers") from None
    if offset < 0 or limit < 1 or limit > MAX_LIMIT:
        raise BadRequest(f"offset must be >= 0 and limit between 1 and {MAX_LIMIT}")
    return offset, limit


def _item(unit: Unit, position: int | None) -> dict[str, Any]:
    bound = sum(a.running for a in unit.admissions)
    admitted = sum(a.replicas for a in unit.admissions)
    item: dict[str, Any] = {
        "metadata": {"name": unit.name, "namespace": unit.namespace},
        "quotaName": unit.quota or "",
        "queueName": unit.quota or "",
        "priority": unit.priority,
        "phase": unit.phase or "Pending",
        "request": quantities.format_resource_list(remaining_request(unit)),
        "resources": quantities.format_resource_list(reserved_resources(unit)),
        "podState": {"running": bound, "pending": max(admitted - bound, 0)},
        "message": unit.message,
    }
    if position is not None:
        item["position"] = position
    return item


def _summary(items: list[dict[str, Any]], offset: int, limit: int) -> dict[str, Any]:
    return {
        "kind": "QueueUnitsSummary",
        "apiVersion": API_VERSION,
        "metadata": {"total": len(items)},
        "items": items[offset : offset + limit],
    }


def queue_units(
    state: SchedulerState, units: Mapping[str, Unit], queue: str, query: Mapping[str, str]
) -> dict[str, Any]:
    """The waiting units of ``queue`` in scheduling order, with their positions."""
    offset, limit = _page(query)
    qs = state.queues.get(queue)
    if qs is None:
        raise NotFound(f'queue "{queue}" not found')
    items = []
    for entry in queue_item_details(qs):
        key = f"{entry['namespace']}/{entry['name']}"
        unit = units.get(key)
        if unit is not None:
            items.append(_item(unit, int(str(entry["position"]))))
    return _summary(items, offset, limit)


def quota_units(
    state: SchedulerState,
    units: Mapping[str, Unit],
    quota: str,
    known_quotas: set[str],
    query: Mapping[str, str],
) -> dict[str, Any]:
    """Every unit charged to ``quota``: waiting ones first in queue order, then the rest by name."""
    offset, limit = _page(query)
    if quota not in known_quotas:
        raise NotFound(f'elasticquota "{quota}" not found')
    phase = query.get("phase")
    positions: dict[str, int] = {}
    qs = state.queues.get(quota)
    if qs is not None:
        for entry in queue_item_details(qs):
            positions[f"{entry['namespace']}/{entry['name']}"] = int(str(entry["position"]))
    charged = [u for u in units.values() if u.quota == quota]
    if phase:
        charged = [u for u in charged if (u.phase or "Enqueued") == phase]
    charged.sort(key=lambda u: (positions.get(u.key, 1 << 62), u.namespace, u.name))
    return _summary([_item(u, positions.get(u.key)) for u in charged], offset, limit)


def discovery() -> dict[str, Any]:
    """``APIResourceList`` for ``/apis/visibility.koord-queue.x-k8s.io/v1alpha1``."""

    def resource(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "singularName": "",
            "namespaced": False,
            "kind": "QueueUnitsSummary",
            "verbs": ["get"],
        }

    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": API_VERSION,
        "resources": [resource("queues/queueunits"), resource("elasticquotas/queueunits")],
    }

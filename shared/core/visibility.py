"""The visibility API's answers: which units wait, in what order, for what, and why.

Served as ``visibility.koord-queue.x-k8s.io/v1alpha1`` (docs/compatibility.md#visibility-api).
Cluster-wide, for whoever RBAC grants it without a namespace (admins):

* ``queues/{queue}/queueunits``: the queue's waiting units in scheduling order;
* ``elasticquotas/{quota}/queueunits``: every unit charged to the quota, optionally filtered by
  ``phase``.

Namespaced, for namespace users (their ``view``/``edit``/``admin`` roles carry it, see
``manifests/rbac/user-roles.yaml``), each restricted to the namespace in the path:

* ``namespaces/{namespace}/queueunits`` (RBAC: ``list`` on ``queueunits``): the namespace's waiting
  units across every queue, ordered by queue, then position;
* ``namespaces/{namespace}/queues/{queue}/queueunits`` (RBAC: ``get`` on ``queues/queueunits``):
  the namespace's units waiting in that queue;
* ``namespaces/{namespace}/quotas`` (RBAC: ``list`` on ``quotas``): the figures of the quotas bound
  to the namespace (its own and those whose ``quota.scheduling.koordinator.sh/namespaces`` lists it),
  the quotas its jobs may use. ``quotas`` without a namespace lists every quota (cluster-wide grant).

The kube-apiserver authorizes a namespaced path for the namespace it names, so these answers must
never reach past it; positions stay global within each queue, so a user learns how many units wait
ahead of theirs but not whose, and a quota's figures are totals that name no unit. All answers
honour ``offset`` and ``limit`` (upstream ignores them) and report ``podState`` with its fields the
right way round (upstream swaps them). Each unit item carries its 1-based position while it waits,
its priority, what it still asks for, what it holds, and ``status.message`` — the reason it waits.

Pure: built from the scheduler's cache (``shared.core.scheduling.Cache``) by the reconciler's server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from koord_queue.shared.api import quantities
from koord_queue.shared.api.durations import format_duration, format_time
from koord_queue.shared.api.model import Unit
from koord_queue.shared.core import fairness, quotastatus
from koord_queue.shared.core.charges import remaining_request, reserved_resources
from koord_queue.shared.core.history import UsageHistory
from koord_queue.shared.core.policies import SchedulerState, queue_item_details
from koord_queue.shared.core.quota import QuotaLedger

GROUP: Final = "visibility.koord-queue.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 10_000
#: A namespace name (an RFC 1123 label), as the apiserver validates it on every namespace.
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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


def _check_namespace(value: str) -> None:
    """Raise ``BadRequest`` unless ``value`` can name a namespace.

    The apiserver authorized the request for the namespace segment of the path and does not check
    that it is a valid name; refusing anything that is not one keeps our reading of the path and
    the apiserver's from ever disagreeing (an escaped ``/``, say).
    """
    if not _NAMESPACE.fullmatch(value):
        raise BadRequest(f'"{value}" is not a namespace name (a lowercase RFC 1123 label)')


def _waiting(state: SchedulerState, queue: str) -> Iterator[tuple[str, int]]:
    """``(unit key, 1-based position)`` of every unit waiting in ``queue``, in scheduling order."""
    qs = state.queues.get(queue)
    if qs is None:
        return
    for entry in queue_item_details(qs):
        yield f"{entry['namespace']}/{entry['name']}", int(str(entry["position"]))


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
    if unit.pool:  # docs/pools.md#what-users-see
        item["pool"] = unit.pool
        if unit.pool_quota:
            item["poolQuota"] = unit.pool_quota
    return item


def _summary(items: list[dict[str, Any]], offset: int, limit: int) -> dict[str, Any]:
    return {
        "kind": "QueueUnitsSummary",
        "apiVersion": API_VERSION,
        "metadata": {"total": len(items)},
        "items": items[offset : offset + limit],
    }


def queue_units(
    state: SchedulerState,
    units: Mapping[str, Unit],
    queue: str,
    query: Mapping[str, str],
    *,
    namespace: str | None = None,
) -> dict[str, Any]:
    """The waiting units of ``queue`` in scheduling order, with their positions in the queue.

    With ``namespace`` only that namespace's units are listed (``total`` counts only them), still
    numbered by their place in the whole queue.
    """
    offset, limit = _page(query)
    if namespace is not None:
        _check_namespace(namespace)
    if queue not in state.queues:
        raise NotFound(f'queue "{queue}" not found')
    items = []
    for key, position in _waiting(state, queue):
        unit = units.get(key)
        if unit is not None and namespace in (None, unit.namespace):
            items.append(_item(unit, position))
    return _summary(items, offset, limit)


def namespace_units(
    state: SchedulerState, units: Mapping[str, Unit], namespace: str, query: Mapping[str, str]
) -> dict[str, Any]:
    """Every unit of ``namespace`` waiting in any queue, by queue name then position in it.

    A namespace with nothing waiting has an empty list, not NotFound: whether a namespace exists
    is not this API's to tell.
    """
    offset, limit = _page(query)
    _check_namespace(namespace)
    items = []
    for queue in sorted(state.queues):
        for key, position in _waiting(state, queue):
            unit = units.get(key)
            if unit is not None and unit.namespace == namespace:
                items.append(_item(unit, position))
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
    positions = dict(_waiting(state, quota))
    charged = [u for u in units.values() if u.quota == quota]
    if phase:
        charged = [u for u in charged if (u.phase or "Enqueued") == phase]
    charged.sort(key=lambda u: (positions.get(u.key, 1 << 62), u.namespace, u.name))
    return _summary([_item(u, positions.get(u.key)) for u in charged], offset, limit)


def counted(ledger: QuotaLedger, history: UsageHistory, now: float | None) -> UsageHistory:
    """The history to answer from: the scheduler's own once it has counted (the leader), else, on
    a replica that never led (a follower folds nothing), the one a reconciler taking over would
    count on from: the quotas' ``koord-queue/usage-history`` records, decayed to ``now`` by the
    same fold (docs/compatibility.md#fair-over-time)."""
    if not history.enabled or now is None or any(history.record(n) for n in ledger.quotas):
        return history
    restored = UsageHistory(history.half_life)
    for quota in ledger.quotas.values():
        restored.remember(quota)
    restored.fold(ledger, now)
    return restored


def _usage_history(history: UsageHistory, name: str) -> dict[str, Any]:
    """``usageHistory``: the decayed average as quantities, the half-life and when it was taken."""
    record = history.record(name)
    out: dict[str, Any] = {"halfLife": format_duration(history.half_life)}
    usage = record.usage if record is not None else {}
    out["usage"] = quantities.format_resource_list({r: v for r, v in usage.items() if v > 0})
    if record is not None:
        out["at"] = format_time(record.at)
    return out


def _fair_share(ranks: fairness.Ranks, name: str, visible: Sequence[str] | None) -> dict[str, Any] | None:
    """``fairShare`` of a quota below a parent: its share per resource, factor, standing (lower is
    served first), its 1-based position among its siblings and those ahead of it. ``visible``
    (a namespaced answer) keeps only the names of siblings the namespace may see already; the
    count of those ahead is always given."""
    ledger = ranks.ledger
    parent = ledger.quotas[name].parent
    if parent not in ledger.children():
        return None
    standing = ranks.standing(parent)
    mine = standing.get(name)
    if mine is None:
        return None
    ahead = sorted((s for s in standing.values() if s.score < mine.score), key=lambda s: (s.score, s.name))
    names_ahead = [s.name for s in ahead if visible is None or s.name in visible]
    return {
        "parent": parent,
        "share": {r: round(v, 6) for r, v in sorted(mine.share.items())},
        "factor": {r: round(v, 6) for r, v in sorted(mine.factor.items())},
        "score": round(mine.score, 6) if math.isfinite(mine.score) else None,
        "position": len(ahead) + 1,
        "siblings": len(standing),
        "aheadCount": len(ahead),
        "ahead": names_ahead,
    }


def quotas(
    ledger: QuotaLedger,
    state: SchedulerState,
    query: Mapping[str, str],
    *,
    namespace: str | None = None,
    history: UsageHistory | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The figures of every quota that counts, by name (``shared.core.quotastatus``, the same ones
    the reconciler publishes on the quotas): ``min``, ``max``, ``used``, ``borrowed``, ``runtime``
    and ``request``, plus the parent; with usage history on, ``usageHistory`` and, below a parent,
    ``fairShare`` (docs/compatibility.md#visibility-api), from the standings the scheduler orders
    queues by (``fairness.Ranks``).

    With ``namespace`` only the quotas bound to it are listed: those its jobs may use, which is
    what its users need to read their own units' waiting reasons. Other quotas, parents included,
    stay out of sight (their names already appear in those reasons where they matter): a
    ``fairShare`` there names only siblings the namespace may see and counts the others.
    """
    offset, limit = _page(query)
    wanted: list[str] | tuple[str, ...] = sorted(ledger.quotas)
    if namespace is not None:
        _check_namespace(namespace)
        wanted = ledger.usable_in(namespace)
    figures = quotastatus.published(ledger, state)
    used_history = counted(ledger, history, now) if history is not None and history.enabled else None
    ranks = fairness.Ranks(ledger, used_history) if used_history is not None else None
    items = []
    for name in wanted:
        quota, fig = ledger.quotas.get(name), figures.get(name)
        if quota is None or fig is None:
            continue
        item: dict[str, Any] = {
            "metadata": {"name": quota.name, "namespace": quota.namespace},
            "parent": quota.parent,
            "min": quantities.format_resource_list(quota.min),
            "max": quantities.format_resource_list(quota.max),
            "used": quantities.format_resource_list(fig.used),
            "borrowed": quantities.format_resource_list(fig.borrowed),
            "runtime": quantities.format_resource_list(fig.runtime),
            "request": quantities.format_resource_list(fig.request),
        }
        if used_history is not None and ranks is not None:
            item["usageHistory"] = _usage_history(used_history, name)
            share = _fair_share(ranks, name, None if namespace is None else wanted)
            if share is not None:
                item["fairShare"] = share
        items.append(item)
    return {
        "kind": "QuotaSummary",
        "apiVersion": API_VERSION,
        "metadata": {"total": len(items)},
        "items": items[offset : offset + limit],
    }


def discovery() -> dict[str, Any]:
    """``APIResourceList`` for ``/apis/visibility.koord-queue.x-k8s.io/v1alpha1``.

    ``queues/queueunits`` is namespaced as ``pods`` is: the namespaced path shows one namespace,
    the path without a namespace every namespace. It cannot be listed twice, cluster-scoped and
    namespaced: the apiserver's aggregated discovery refuses a group whose subresources disagree
    with their parent's scope. The aggregator proxies every path of the group either way;
    discovery tells clients (``kubectl api-resources``, ``kubectl auth can-i``) what exists.
    """

    def resource(
        name: str, *, namespaced: bool, verb: str, kind: str = "QueueUnitsSummary"
    ) -> dict[str, Any]:
        return {
            "name": name,
            "singularName": "",
            "namespaced": namespaced,
            "kind": kind,
            "verbs": [verb],
        }

    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": API_VERSION,
        "resources": [
            resource("queues/queueunits", namespaced=True, verb="get"),
            resource("elasticquotas/queueunits", namespaced=False, verb="get"),
            # A collection path: the apiserver authorizes a GET of it as ``list``.
            resource("queueunits", namespaced=True, verb="list"),
            # Like ``queueunits``: the namespaced path shows the namespace's quotas, the other all.
            resource("quotas", namespaced=True, verb="list", kind="QuotaSummary"),
        ],
    }

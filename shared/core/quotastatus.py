"""The figures each ElasticQuota shows: usage, runtime, request and what it borrows
(docs/compatibility.md#quota-guarantees, "Published figures").

Admins and users read a quota's state with ``kubectl get elasticquota`` and tools read it where
koord-scheduler writes it (``status.used``, the annotations ``quota.scheduling.koordinator.sh/runtime``
and ``.../request``), so the reconciler publishes the same figures the scheduler decides with. This
module says *what* they are, from the scheduler's ledger and state; ``reconciler/quotas.py``
compares them with what the quota shows and writes the difference. The visibility API
(``shared.core.visibility``) answers with the same figures, so the two can never disagree.

Per quota that counts (``QuotaLedger.quotas``):

* ``used``: usage including every descendant's (``QuotaLedger.used``);
* ``request``: the cycle's figure where the guarantee model computed one (below a parent quota
  whose children can borrow); elsewhere usage plus the waiting demand of the quota's subtree,
  capped at ``max`` per resource, which is the same definition;
* ``runtime``: the cycle's figure where computed; elsewhere the request (a top-level quota, or one
  below a parent whose children all have ``min == max``, may use what it asks for up to ``max``:
  nobody lends or borrows there);
* ``borrowed``: ``used - min`` where positive;
* ``history`` (usage history on): the decayed average and when it was taken
  (``koord-queue/usage-history``, docs/compatibility.md#fair-over-time). It changes with every
  cycle, so it is written only when the quota shows none, or one at least
  :data:`HISTORY_WRITE_SECONDS` older: a restart loses at most that much counting, and a quota
  costs one history write a minute at most.

Each list names every resource of the quota's ``min`` or ``max`` (0 when unused, so a column reads
``cpu: 0`` rather than nothing and a figure does not flap between absent and zero) and any other
resource with a non-zero value.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.quantities import QuantityError, Resources
from koord_queue.shared.core import history as usage_history
from koord_queue.shared.core.history import Record, UsageHistory
from koord_queue.shared.core.policies import SchedulerState
from koord_queue.shared.core.quota import QuotaLedger

__all__ = [
    "HISTORY_WRITE_SECONDS",
    "PUBLISHED_ANNOTATIONS",
    "Figures",
    "Writes",
    "borrowed",
    "changes",
    "published",
    "read",
    "render",
    "shown_equal",
    "status_shows",
    "subtree_demand",
]

#: The annotations the reconciler writes (and the only ones its admission policy lets it change,
#: besides ``koord-queue/ignored-reason``).
PUBLISHED_ANNOTATIONS = (
    names.QUOTA_RUNTIME_ANNOTATION,
    names.QUOTA_REQUEST_ANNOTATION,
    names.QUOTA_BORROWED_ANNOTATION,
    names.QUOTA_USAGE_HISTORY_ANNOTATION,
)
#: A quota's usage history is written again once what it shows is this old (seconds).
HISTORY_WRITE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Figures:
    """One quota's published figures, in milli units (see the module docstring)."""

    used: Resources
    runtime: Resources
    request: Resources
    borrowed: Resources
    #: the decayed average to store (None: history off, or not counted yet) and the half-life
    history: Record | None = None
    half_life: float = 0.0

    def annotations(self) -> dict[str, str | None]:
        """The annotation values to show; ``None`` removes one (nothing borrowed)."""
        return {
            names.QUOTA_RUNTIME_ANNOTATION: render(self.runtime),
            names.QUOTA_REQUEST_ANNOTATION: render(self.request),
            names.QUOTA_BORROWED_ANNOTATION: render(self.borrowed) if self.borrowed else None,
        }


def render(res: Mapping[str, int]) -> str:
    """A ResourceList as JSON with quantities as strings and keys sorted, as koord-scheduler writes
    its annotations (``{"cpu":"5","memory":"8Gi"}``)."""
    return json.dumps(quantities.format_resource_list(res), separators=(",", ":"), sort_keys=True)


def borrowed(quota: Quota, used: Mapping[str, int]) -> Resources:
    """``used - min`` where positive, over the resources the quota's ``min`` or ``max`` names (a
    resource absent from ``min`` has a ``min`` of 0, as the guarantee model reads it; one named by
    neither is not managed by the quota and borrows nothing)."""
    out: Resources = {}
    for r in sorted(quota.min.keys() | quota.max.keys()):
        over = used.get(r, 0) - quota.min.get(r, 0)
        if over > 0:
            out[r] = over
    return out


def _shape(quota: Quota, values: Mapping[str, int]) -> Resources:
    keys = quota.min.keys() | quota.max.keys() | {r for r, v in values.items() if v}
    return {r: values.get(r, 0) for r in sorted(keys)}


def subtree_demand(ledger: QuotaLedger, state: SchedulerState) -> dict[str, Resources]:
    """Per quota, the waiting demand of the queues in its subtree (itself and every descendant):
    each queue's demand is added to every quota on its chain. O(queues x depth)."""
    out: dict[str, dict[str, int]] = {}
    for name, qs in state.queues.items():
        total = qs.demand.total
        if not total or name not in ledger.quotas:
            continue
        for level in ledger.chain(name).names:
            acc = out.setdefault(level, {})
            for r, v in total.items():
                acc[r] = acc.get(r, 0) + v
    return dict(out)


def published(
    ledger: QuotaLedger, state: SchedulerState, history: UsageHistory | None = None
) -> dict[str, Figures]:
    """The figures of every quota that counts, by name (see the module docstring)."""
    demand = subtree_demand(ledger, state)
    out: dict[str, Figures] = {}
    for name in sorted(ledger.quotas):
        quota = ledger.quotas[name]
        used = ledger.used(name)
        request = state.requests.get(name)
        if request is None:
            want = quantities.add(used, demand.get(name, {}))
            request = {r: min(v, quota.max[r]) if r in quota.max else v for r, v in want.items()}
        runtime = state.runtime.get(name, request)
        out[name] = Figures(
            used=_shape(quota, used),
            runtime=_shape(quota, runtime),
            request=_shape(quota, request),
            borrowed=borrowed(quota, used),
            history=history.record(name) if history is not None else None,
            half_life=history.half_life if history is not None else 0.0,
        )
    return out


# --- comparing with what a quota shows ----------------------------------------------------------


def _parsed(raw: object) -> Resources | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        return quantities.parse_resource_list(raw)
    except QuantityError:
        return None


def shown_equal(shown: str | None, wanted: str | None, figures: Mapping[str, int] | None) -> bool:
    """Whether an annotation value ``shown`` already says ``wanted`` (``figures`` parsed): the same
    text, or a ResourceList with the same quantities written another way (koord-scheduler's)."""
    if shown == wanted:
        return True
    if shown is None or wanted is None or figures is None:
        return False
    try:
        value = json.loads(shown)
    except ValueError:
        return False
    return _parsed(value) == dict(figures)


def read(annotations: Mapping[str, str], key: str) -> Resources | None:
    """A published ResourceList annotation read back (``kubectl koord-queue quotas``); None when
    absent or unreadable."""
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        return _parsed(json.loads(raw))
    except ValueError:
        return None


def history_due(shown: str | None, record: Record) -> bool:
    """Whether the history a quota shows should be replaced by ``record``: it shows none (or an
    unreadable one), or one taken :data:`HISTORY_WRITE_SECONDS` or more before ``record`` with
    other figures."""
    old = usage_history.parse_record(shown)
    if old is None:
        return True
    return record.at - old.at >= HISTORY_WRITE_SECONDS and dict(old.usage) != {
        r: v for r, v in record.usage.items() if v > 0
    }


def status_shows(raw_used: object, used: Mapping[str, int]) -> bool:
    """Whether a quota's raw ``status.used`` holds exactly ``used`` (however the quantities are
    written)."""
    return _parsed(raw_used) == dict(used)


@dataclass(frozen=True, slots=True)
class Writes:
    """The merge patches that make a quota show its figures; ``None`` when that part is current.

    ``status`` is ``{"status": {"used": ...}}`` with ``None`` for resources to drop (a merge patch
    keeps map entries it does not name); ``annotations`` is ``{"metadata": {"annotations": ...}}``.
    """

    status: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return self.status is None and self.annotations is None


def changes(obj: Mapping[str, Any], figures: Figures) -> Writes:
    """What differs between the quota object ``obj`` (as watched) and ``figures``."""
    meta = obj.get("metadata") or {}
    current = meta.get("annotations") or {}
    annotations: dict[str, str | None] = {}
    parsed = {
        names.QUOTA_RUNTIME_ANNOTATION: figures.runtime,
        names.QUOTA_REQUEST_ANNOTATION: figures.request,
        names.QUOTA_BORROWED_ANNOTATION: figures.borrowed,
    }
    for key, wanted in figures.annotations().items():
        shown = current.get(key) if isinstance(current, Mapping) else None
        if not shown_equal(shown if isinstance(shown, str) else None, wanted, parsed[key]):
            annotations[key] = wanted
    if figures.history is not None:
        shown = current.get(names.QUOTA_USAGE_HISTORY_ANNOTATION) if isinstance(current, Mapping) else None
        if history_due(shown if isinstance(shown, str) else None, figures.history):
            text = usage_history.render_record(figures.history, figures.half_life)
            annotations[names.QUOTA_USAGE_HISTORY_ANNOTATION] = text
    raw_used = (obj.get("status") or {}).get("used")
    status = None
    if not status_shows(raw_used, figures.used):
        used: dict[str, str | None] = dict(quantities.format_resource_list(figures.used))
        if isinstance(raw_used, Mapping):
            for key in raw_used:
                if isinstance(key, str) and key not in used:
                    used[key] = None
        status = {"status": {"used": used}}
    return Writes(
        status=status,
        annotations={"metadata": {"annotations": annotations}} if annotations else None,
    )

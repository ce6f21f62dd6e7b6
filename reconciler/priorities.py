"""What the job extensions need to know about priorities: the cluster's PriorityClasses (their
values, which of them never preempt, and the ``globalDefault`` one) and each quota's priority rules
(its cap and the classes it allows), kept from watch events (docs/compatibility.md#priority-cap).

Both are read when a job's unit is sized. When either changes, the units already made from it may
be out of step, so ``changed`` is called and the reconciler looks at every job again.
"""

from __future__ import annotations

from collections.abc import Callable

from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core import quota as quota_rules
from koord_queue.shared.core.quota import QuotaLedger
from koord_queue.shared.jobs import base


class PriorityClasses:
    """The cluster's PriorityClasses by name, and those marked ``globalDefault``."""

    def __init__(self, changed: Callable[[], None]) -> None:
        #: name → value, and (``values.never``) the classes whose ``preemptionPolicy`` is ``Never``
        #: (docs/compatibility.md#non-preempting-jobs): the job extensions get this one table.
        self.values = base.PriorityClassTable()
        #: the classes marked globalDefault (normally one) and their values
        self._defaults: dict[str, int] = {}
        self._changed = changed

    def on_event(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """The informer's handler: a class created, changed or deleted."""
        obj = new or old or {}
        name = str((obj.get("metadata") or {}).get("name"))
        value = obj.get("value")
        default = new is not None and obj.get("globalDefault") is True and isinstance(value, int)
        never = new is not None and obj.get("preemptionPolicy") == names.PREEMPTION_POLICY_NEVER
        if new is None:
            self.values.pop(name, None)
        elif isinstance(value, int):
            if (
                self.values.get(name) == value
                and (name in self._defaults) == default
                and (name in self.values.never) == never
            ):
                return
            self.values[name] = value
        if never and isinstance(value, int):
            self.values.never.add(name)
        else:
            self.values.never.discard(name)
        if default and isinstance(value, int):
            self._defaults[name] = value
        else:
            self._defaults.pop(name, None)
        # A class created or changed after its jobs: their units' priorities follow.
        self._changed()

    def default(self) -> str | None:
        """The cluster's globalDefault PriorityClass; of several (a race the apiserver allows), the
        lowest, as the apiserver's priority admission picks it."""
        return min(self._defaults, key=lambda n: (self._defaults[n], n), default=None)


class QuotaPriorityRules:
    """Each quota's priority cap and allowed classes, read from the scheduler's quota ledger."""

    def __init__(
        self, ledger: QuotaLedger, max_user_priority: int | None, changed: Callable[[], None]
    ) -> None:
        self._ledger = ledger
        self._max_user_priority = max_user_priority
        self._changed = changed
        self._seen: dict[str, tuple[int | None, frozenset[str] | None]] = {}

    def priority_cap(self, job: base.Job) -> int | None:
        """The smaller of the cluster's maxUserPriority and the job's quota's own cap."""
        return quota_rules.priority_cap(
            self._max_user_priority, self._ledger.quotas.get(base.quota_name(job) or "")
        )

    def allowed_classes(self, job: base.Job) -> frozenset[str] | None:
        """The PriorityClasses the job's quota allows (docs/compatibility.md#priority-cap)."""
        quota = self._ledger.quotas.get(base.quota_name(job) or "")
        return quota.allowed_priority_classes if quota is not None else None

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A quota's cap or allowed classes changed: its jobs' unit priorities follow. Runs after
        the scheduler has folded the event into the ledger, which decides which same-named quota
        counts."""
        now = {
            name: (q.max_user_priority, q.allowed_priority_classes)
            for name, q in self._ledger.quotas.items()
            if q.max_user_priority is not None or q.allowed_priority_classes is not None
        }
        if now != self._seen:
            self._seen = now
            self._changed()

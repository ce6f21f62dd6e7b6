"""The scan of one scheduling cycle: each due queue walked from its head, unit by unit.

:func:`shared.core.scheduling.schedule` drives a :class:`Cycle` over the queues that need a scan; how
a scan decides (filter, preemption, policies, cost control) is described there.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import enum

from koord_queue.shared.api.admission_checks import matched_checks
from koord_queue.shared.api.names import (
    NON_PREEMPTING_ERROR,
    NON_PREEMPTING_SUFFIX,
    Message,
    Phase,
    QueuePolicy,
)
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import gangs, pools
from koord_queue.shared.core.charges import grants_request, remaining_grants
from koord_queue.shared.core.ordering import unit_key
from koord_queue.shared.core.plan import Admit, Decision, Park, Snapshot
from koord_queue.shared.core.policies import (
    Entry,
    Item,
    Mark,
    ParkRecord,
    QueueState,
    SchedulerState,
    beyond_depth_message,
    inactive_message,
    invalid_message,
)
from koord_queue.shared.core.preemption import (
    MarkVictims,
    PreemptOutcome,
    disabled_reason,
    failed_suffix,
    first_holder,
    may_preempt,
    plan_preempt,
    plan_reserve,
    record_outcome,
    skip_reason,
)
from koord_queue.shared.core.quota import Route
from koord_queue.shared.core.reclaim import Reclaim, may_claim, plan_reclaim
from koord_queue.shared.core.usage import UsageView

__all__ = ["BLOCK_STALE_SECONDS", "Cycle"]

#: Block/Intelligent: blocked quotas are cleared after this long without any attempt (upstream).
BLOCK_STALE_SECONDS = 180.0


class _Stop(enum.Enum):
    BLOCKED = "blocked"  # Block/Intelligent quota blocked, or Block holding after a preemption
    EXHAUSTED = "exhausted"  # no pending request fits the headroom any more
    HELD = "held"  # wait-for-pods-running: a unit sorting earlier holds the queue
    PREEMPTING = "preempting"  # behind a preemptor whose round is in progress
    HIGH_WAITING = "high-waiting"  # Intelligent: high units still wait


class Cycle:
    """One cycle's decisions, queue by queue (:func:`shared.core.scheduling.schedule` drives it)."""

    def __init__(self, snapshot: Snapshot, state: SchedulerState, now: float) -> None:
        self.units = snapshot.units
        self.ledger = snapshot.ledger
        self.protect = snapshot.reclaim_protect_seconds
        self.state = state
        self.now = now
        self.guarantees = snapshot.guarantees
        self.placements = snapshot.placements
        self.view: UsageView = (
            UsageView(snapshot.ledger, state.runtime, state.guaranteed)
            if snapshot.guarantees
            else UsageView(snapshot.ledger)
        )
        self.decisions: list[Decision] = []
        self.examined = 0
        self.admitted: dict[str, list[Item]] = {}
        self.epochs: dict[str, int] = {}
        self.levels: set[str | None] = set()
        #: victims a unit waiting for its guarantee counts on in this cycle (promised once)
        self.claimed: set[str] = set()

    # --- helpers ------------------------------------------------------------------------------------

    def epoch(self, qs: QueueState) -> int:
        value = self.epochs.get(qs.name)
        if value is None:
            value = self.ledger.epoch(qs.name) + self.state.share_epochs.get(qs.name, 0)
            self.epochs[qs.name] = value
        return value

    def park(
        self,
        qs: QueueState,
        key: str,
        message: str,
        *,
        quota_failure: bool,
        preempt_error: str | None = None,
        protected: tuple[str, ...] = (),
        promised: tuple[str, ...] = (),
    ) -> None:
        previous = qs.parked.get(key)
        repeated = message in (self.units[key].message, previous.message if previous else None)
        level = self.view.level if quota_failure else None
        if quota_failure:
            self.levels.add(level)
        qs.parked[key] = ParkRecord(message, self.epoch(qs), quota_failure, level)
        qs.unparked.discard(key)
        self.decisions.append(
            Park(
                key=key,
                queue=qs.name,
                message=message,
                repeated=repeated,
                preempt_error=preempt_error,
                protected=protected,
                promised=promised,
            )
        )

    def stop_reason(self, qs: QueueState, key: str, item: Item) -> _Stop | None:
        if qs.config.wait_for_pods_running:
            holder = first_holder(qs, self.admitted.get(qs.name, []), key)
            if holder is not None and holder < item:
                return _Stop.HELD
        minimums = qs.demand.minimums()
        # Whether the queue may be skipped from ``key`` on: a non-preempting ``key`` does not stop
        # it, since a unit sorting after may preempt (docs/compatibility.md#non-preempting-jobs).
        if (
            self.view.exhausted(qs.name, minimums, any_empty=qs.demand.empty > 0)
            and not may_preempt(qs, key, item)
            and not (self.guarantees and may_claim(self.view, qs.name))
        ):
            self.levels.add(self.view.level)
            return _Stop.EXHAUSTED
        return None

    # --- one queue ----------------------------------------------------------------------------------

    def scan(self, qs: QueueState) -> None:
        qs.expire(self.now)
        qs.dirty = False
        qs.wake_at = None
        self.levels = set()
        if qs.config.stopped:
            self.park_stopped(qs)
            qs.limiting = frozenset()  # no release can let it admit: only resuming wakes it
            self.set_timer(qs)
            return
        if qs.config.policy is QueuePolicy.INTELLIGENT:
            stop = self.scan_lane(qs, 0)
            high_left = qs.active_in_lane[0] - sum(
                1 for k in qs.updating if k in qs.entries and qs.entries[k].lane == 0
            )
            if stop is None and high_left > 0:
                stop = _Stop.HIGH_WAITING
            if stop is None:
                self.scan_lane(qs, 1)
            else:
                low = stop if stop in (_Stop.BLOCKED, _Stop.HELD) else _Stop.HIGH_WAITING
                self.park_unparked(qs, 1, 0, low)
        else:
            self.scan_lane(qs, 0)
        qs.limiting = None if None in self.levels else frozenset(str(n) for n in self.levels)
        self.set_timer(qs)

    def park_stopped(self, qs: QueueState) -> None:
        """A stopped queue admits nothing: each unit not parked since it (re)entered the queue is
        told so once (inactive or invalid units keep their own reason). Changing the Queue rebuilds
        its state, so stopping re-parks every unit and resuming lets all compete again, in their
        places (docs/compatibility.md#stopping-a-queue)."""
        for key in sorted(k for k in qs.unparked if k not in qs.updating):
            entry = qs.entries[key]
            text = Message.queue_stopped(qs.name) if entry.active else self.idle_reason(qs, entry)
            self.park(qs, key, text, quota_failure=False)

    def scan_lane(self, qs: QueueState, lane_no: int) -> _Stop | None:
        lane = qs.lanes[lane_no]
        depth = qs.config.max_depth
        limit = len(lane) if depth <= 0 else min(len(lane), depth)
        policy = qs.config.policy
        # Priority lets later units bypass one that fails; so does Intelligent's low sub-queue,
        # which upstream polls round-robin (only a high unit's failure blocks the quota).
        bypass = policy is QueuePolicy.PRIORITY or (policy is QueuePolicy.INTELLIGENT and lane_no == 1)
        check_stop = True
        pos = 0
        while pos < limit:
            item = lane[pos]
            pos += 1
            key = str(item[-1])
            entry = qs.entries[key]
            if key in qs.updating:
                continue
            if not entry.active:
                if key in qs.unparked:
                    self.park(qs, key, self.idle_reason(qs, entry), quota_failure=False)
                continue
            stop: _Stop | None = None
            round_ = qs.round
            if qs.config.fair_order:  # preemption and holding compare priority keys, not ranks
                item = (*unit_key(self.units[key], policy), key)
            if qs.blocked:
                stop = _Stop.BLOCKED
            elif (
                round_ is not None
                and round_.preemptor != key
                and round_.preemptor in qs.entries
                and qs.entries[round_.preemptor].item < lane[pos - 1]
            ):
                stop = _Stop.PREEMPTING
            elif check_stop:
                stop = self.stop_reason(qs, key, item)
                check_stop = False
            if stop is not None:
                self.park_unparked(qs, lane_no, pos - 1, stop)
                return stop
            record = qs.parked.get(key)
            if (
                record is not None
                and record.quota_failure
                and record.epoch == self.epoch(qs)
                and not may_preempt(qs, key, item, preempts=self.units[key].preempts)
            ):
                self.levels.add(record.level)
                if bypass:
                    continue
                qs.last_attempt_at = self.now
                qs.blocked = True  # still failing: Block/Intelligent stop here as upstream would
                self.park_unparked(qs, lane_no, pos, _Stop.BLOCKED)
                return _Stop.BLOCKED
            qs.last_attempt_at = self.now
            preempted = self.attempt(qs, key, item)
            if preempted is None:
                continue  # admitted
            check_stop = True
            if bypass:
                continue
            if not preempted:
                qs.blocked = True
            self.park_unparked(qs, lane_no, pos, _Stop.BLOCKED)
            return _Stop.BLOCKED
        self.park_unparked(qs, lane_no, limit, None)
        return None

    def attempt(self, qs: QueueState, key: str, item: Item) -> bool | None:
        """Try one unit. ``None``: admitted; otherwise whether a preemption is under way for it."""
        self.examined += 1
        cfg = qs.config
        entry = qs.entries[key]
        admitted = self.admitted.setdefault(qs.name, [])
        unit = self.units[key]
        if self.ledger.pooled or unit.pools is not None or unit.pool:
            failure, grants, request, route, plain = self.fit(qs, key, entry.request)
        else:  # no pools anywhere: the plain route, as before pools existed
            failure, grants, request = self.fit_route(qs, key, entry.request, pools.NO_POOL)
            route, plain = pools.NO_POOL, True
        if failure is not None and not plain:
            # Several pools, or a pool that was skipped: queue-level preemption and reclaim look at
            # the quota's own chain only (docs/pools.md#limits-of-this-version).
            self.park(qs, key, failure, quota_failure=True, preempt_error=pools.NOT_ACROSS_POOLS)
            return False
        if failure is not None and self.guarantees:
            claim = plan_reclaim(
                entry.request,
                qs.name,
                view=self.view,
                units=self.units,
                queues=self.state.queues,
                now=self.now,
                protect=self.protect,
                claimed=self.claimed,
                preempts=unit.preempts,
            )
            if claim is not None:
                return self.claim(qs, key, failure, claim)
        if failure is not None:
            why = disabled_reason(cfg) if unit.preempts else NON_PREEMPTING_ERROR
            outcome = (
                PreemptOutcome(error=why)
                if why is not None
                else plan_preempt(
                    item,
                    entry.request,
                    state=qs,
                    units=self.units,
                    view=self.view,
                    now=self.now,
                    protect=self.protect,
                    admitted=admitted,
                )
            )
            self.apply_outcome(qs, key, outcome, path="preempt")
            suffix = Message.PREEMPT_SUCCEED_SUFFIX if outcome.succeeded else failed_suffix(unit)
            self.park(
                qs,
                key,
                failure + suffix,
                quota_failure=True,
                preempt_error=outcome.error,
                protected=outcome.protected,
                promised=outcome.promised,
            )
            return outcome.succeeded
        if cfg.wait_for_pods_running and first_holder(qs, admitted, key) is not None:
            outcome = plan_reserve(
                item, state=qs, units=self.units, now=self.now, protect=self.protect, admitted=admitted
            )
            self.apply_outcome(qs, key, outcome, path="reserve")
            names = [v.name for v in outcome.victims] or [self.units[k].name for k in outcome.waiting_for]
            message = outcome.error or Message.waiting_for_victims(names)
            if outcome.error == NON_PREEMPTING_ERROR:  # docs/compatibility.md#non-preempting-jobs
                message = Message.NO_MORE_IN_QUEUE + NON_PREEMPTING_SUFFIX
            self.park(
                qs,
                key,
                message,
                quota_failure=False,
                preempt_error=outcome.error,
                protected=outcome.protected,
                promised=outcome.promised,
            )
            return outcome.succeeded
        checks = matched_checks(cfg.admission_checks, unit.labels)
        self.view.reserve(qs.name, request, route.via)
        admitted.append(item)
        qs.updating.add(key)
        qs.updating_versions[key] = unit.resource_version
        qs.parked.pop(key, None)
        qs.unparked.discard(key)
        self.decisions.append(
            Admit(
                key=key,
                queue=qs.name,
                grants=grants if grants is not None else remaining_grants(unit),
                phase=Phase.RESERVED if checks else Phase.DEQUEUED,
                message=Message.RESERVED if checks else Message.DEQUEUED,
                admission_checks=checks,
                request=request,
                pool=route.pool,
                pool_quota=route.via,
            )
        )
        return None

    def fit(
        self, qs: QueueState, key: str, request: Resources, *, partial: bool = True
    ) -> tuple[str | None, dict[str, int] | None, Resources, Route, bool]:
        """Whether ``key`` fits, and where: ``(failure, grants, request, route, plain)``.

        ``plain`` is a unit with one route and nothing skipped (every unit before pools): its
        failure text is the quota's own. Otherwise each route is tried in order and a failure
        names every pool and why it did not fit (docs/pools.md#what-users-see)."""
        unit = self.units[key]
        choices = pools.options(unit, self.ledger, self.placements)
        if len(choices) == 1 and choices[0].skip is None and not choices[0].route.via:
            route = choices[0].route
            return (*self.fit_route(qs, key, request, route, partial=partial), route, True)
        texts: list[str] = []
        for choice in choices:
            if choice.skip is not None:
                texts.append(pools.describe(choice.route, choice.skip))
                continue
            failure, grants, fitted = self.fit_route(qs, key, request, choice.route, partial=partial)
            if failure is None:
                return None, grants, fitted, choice.route, False
            texts.append(pools.describe(choice.route, failure))
        self.view.level = None  # any release on any route may help
        text = "; ".join(texts) if texts else pools.nothing_to_try(unit, self.ledger)
        return text, None, request, pools.NO_POOL, False

    def fit_route(
        self, qs: QueueState, key: str, request: Resources, route: Route, *, partial: bool = True
    ) -> tuple[str | None, dict[str, int] | None, Resources]:
        """One route: the whole request, else (``partial``) a partial admission (a pod set with
        ``minCount`` may start smaller, without any reclaim)."""
        failure = self.view.check(request, qs.name, item=key, via=route.via)
        if failure is None or not partial:
            return failure, None, request
        unit = self.units[key]
        grants = gangs.partial_grants(
            unit,
            remaining_grants(unit),
            lambda req: self.view.check(req, qs.name, item=key, via=route.via) is None,
        )
        if grants is None:
            return failure, None, request
        return None, grants, grants_request(unit, grants)

    def claim(self, qs: QueueState, key: str, failure: str, claim: Reclaim) -> bool:
        """A unit within its quota's ``min`` was refused because siblings borrowed: mark their
        victims in their own queues (so nothing is marked twice) and park the unit saying whom it
        waits for (docs/compatibility.md#reclaim-across-quotas)."""
        for queue, victims in claim.victims.items():
            owner = self.state.queues[queue]
            for victim in victims:
                owner.marks[victim.key] = Mark(dict(victim.reclaim), self.now)
            self.decisions.append(MarkVictims(queue=queue, preemptor=key, victims=victims, path="guarantee"))
        if claim.wake_at is not None and (qs.wake_at is None or claim.wake_at < qs.wake_at):
            qs.wake_at = claim.wake_at
        if claim.victims:
            qs.dirty = True  # re-check once the marks are written
        if claim.succeeded:
            self.claimed.update(v.key for vs in claim.victims.values() for v in vs)
            self.claimed.update(claim.waiting_for)
        names = list(claim.borrowers)
        suffix = Message.guarantee_reclaiming(names) if claim.succeeded else Message.guarantee_waiting(names)
        self.park(
            qs,
            key,
            failure + suffix,
            quota_failure=True,
            protected=claim.protected,
            promised=(*(v.key for vs in claim.victims.values() for v in vs), *claim.waiting_for),
        )
        return claim.succeeded

    def apply_outcome(self, qs: QueueState, key: str, outcome: PreemptOutcome, *, path: str) -> None:
        mark = record_outcome(qs, key, outcome, now=self.now, path=path)
        if mark is not None:
            self.decisions.append(mark)

    def idle_reason(self, qs: QueueState, entry: Entry) -> str:
        """Why a unit that does not compete waits: its namespace may not use the quota, its spec
        is invalid, or it is inactive."""
        text = self.ledger.binding_problem(qs.name, entry.namespace)
        if text is not None:
            return text
        return invalid_message(entry.invalid) if entry.invalid is not None else inactive_message(qs.name)

    def park_unparked(self, qs: QueueState, lane_no: int, start: int, stop: _Stop | None) -> None:
        """Give every unit not examined since it (re)entered the queue its own reason, once.

        Units that do not compete get theirs wherever they stand (the scan may never reach them)."""
        if not qs.unparked:
            return
        idle = sorted(
            k
            for k in qs.unparked
            if qs.entries[k].lane == lane_no and k not in qs.updating and not qs.entries[k].active
        )
        for key in idle:
            self.park(qs, key, self.idle_reason(qs, qs.entries[key]), quota_failure=False)
        lane = qs.lanes[lane_no]
        depth = qs.config.max_depth
        waits = {_Stop.HELD: Message.NO_MORE_IN_QUEUE, _Stop.PREEMPTING: Message.queue_preempting(qs.name)}
        pending = sorted(
            (qs.entries[k].item, k)
            for k in qs.unparked
            if qs.entries[k].lane == lane_no and k not in qs.updating and qs.entries[k].active
        )
        for item, key in pending:
            pos = bisect.bisect_left(lane, item)
            if pos < start:
                continue
            if depth > 0 and pos >= depth:
                self.park(qs, key, beyond_depth_message(qs.name, depth), quota_failure=False)
                continue
            if stop is None:
                continue
            unit = self.units[key]
            if self.ledger.pooled or unit.pools is not None or unit.pool:
                failure, _, _, _, plain = self.fit(qs, key, qs.entries[key].request, partial=False)
            else:  # no pools anywhere: the quota's own check, as before pools existed
                failure, plain = self.view.check(qs.entries[key].request, qs.name, item=key), True
            if failure is not None and not plain:
                self.park(qs, key, failure, quota_failure=True, preempt_error=pools.NOT_ACROSS_POOLS)
            elif failure is not None:
                text, why = failure + failed_suffix(unit), skip_reason(qs, key, preempts=unit.preempts)
                self.park(qs, key, text, quota_failure=True, preempt_error=why)
            elif stop is not _Stop.EXHAUSTED:  # it fits but was not tried: say what it waits for
                self.park(qs, key, waits.get(stop, Message.BLOCKED_BY_HIGHER), quota_failure=False)

    def set_timer(self, qs: QueueState) -> None:
        times = [t for t in (qs.wake_at,) if t is not None]
        if qs.blocked and qs.last_attempt_at is not None:
            times.append(qs.last_attempt_at + BLOCK_STALE_SECONDS)
        if qs.marks:
            times.append(min(m.marked_at for m in qs.marks.values()) + 60.0)
        deadline = qs.reclaim_deadline()
        if deadline is not None:
            times.append(deadline)
        if times:
            self.state.timers[qs.name] = max(min(times), self.now)
        else:
            self.state.timers.pop(qs.name, None)
        if qs.dirty:
            self.state.dirty.add(qs.name)

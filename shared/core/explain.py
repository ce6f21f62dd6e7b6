"""Why a QueueUnit waits, in structured form, from the scheduler's own decision code.

``kubectl koord-queue explain`` must say what the scheduler decides, not what a second copy of its
rules would guess. So nothing here decides anything itself: ``shared.core.replay`` feeds the objects a
reader can see into the scheduler's own cache and runs one cycle, and :func:`explain` reads the outcome
from what the scheduler left behind: the :class:`~shared.core.plan.Park` or
:class:`~shared.core.plan.Admit` decision for the unit, the queue's
:class:`~shared.core.policies.ParkRecord` (``level``: the quota that refused it), its preemption round,
its blocked flag and its lanes (the figures are gathered by ``shared.core.explanation``). The
scheduler's texts are mapped to a :class:`~shared.core.reasons.Reason` by
``shared.core.reasons.classify``, which also reads the ``status.message`` the real scheduler last
wrote.

A reader may not see everything (``shared.core.replay.View`` says what was seen): :func:`explain` then
trusts the scheduler's recorded message where the replay lacks information, shows usage as a lower
bound, and lists every unknown in ``Explanation.unknowns`` instead of guessing.

``Queued`` events on jobs use :func:`position` (where a unit stands in its queue, O(log n)).

Pure: standard library and sibling modules only; the clock is a parameter.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message, Phase
from koord_queue.shared.api.predicates import TERMINAL_PHASES, all_running, has_reclaim
from koord_queue.shared.core import explanation, reasons, replay
from koord_queue.shared.core.charges import remaining_request, reserved_resources
from koord_queue.shared.core.explanation import Explanation, Level, Round
from koord_queue.shared.core.plan import Admit, Park
from koord_queue.shared.core.policies import QueueState, inactive_message, is_waiting
from koord_queue.shared.core.preemption import disabled_reason, plan_preempt
from koord_queue.shared.core.reasons import Classified, Reason
from koord_queue.shared.core.replay import View
from koord_queue.shared.core.scheduling import Cache
from koord_queue.shared.core.usage import UsageView

__all__ = [
    "explain",
    "explain_many",
    "position",
]


def position(state: QueueState, key: str) -> tuple[int, int] | None:
    """``(1-based position, units waiting)`` of ``key`` in its queue's order (Intelligent: the high
    sub-queue first, as ``queue_item_details`` numbers them); None when it does not wait there."""
    entry = state.entries.get(key)
    if entry is None:
        return None
    high, low = state.lanes
    place = bisect.bisect_left(state.lanes[entry.lane], entry.item) + 1
    if entry.lane == 1:
        place += len(high)
    return place, len(high) + len(low)


def explain(view: View, key: str, now: float) -> Explanation:
    """Why the unit ``key`` (``namespace/name``) is where it is, and what would let it run."""
    return explain_many(view, (key,), now)[key]


def explain_many(view: View, keys: Iterable[str], now: float) -> dict[str, Explanation]:
    """:func:`explain` of each of ``keys`` from ONE replay of the scheduler: the dashboard's queue
    page gives every row explain's "Why" at the cost of one cycle (docs/dashboard.md#what-it-costs)."""
    cache, decisions = replay.replay(view, now)
    first: dict[str, Admit | Park] = {}
    for decision in decisions:
        first.setdefault(decision.key, decision)
    answers: dict[str, Explanation] = {}
    for key in keys:
        story = _Story(view, cache, key)
        answers[key] = _not_waiting(story) or _unqueued(story) or _waiting(story, first, now)
    return answers


class _Story:
    """What every answer about one unit shares: the replayed cache, the unit, its queue, the
    fields every :class:`Explanation` carries (``base``) and what the reader could not see."""

    def __init__(self, view: View, cache: Cache, key: str) -> None:
        self.view, self.cache, self.key = view, cache, key
        self.unit = unit = cache.units[key]
        self.quota = quota = unit.quota or ""
        self.qs = qs = cache.state.queues.get(quota)
        self.request = remaining_request(unit)
        self.unknowns = list(view.unknowns)
        #: the quota chain with its figures, and the units ahead the reader cannot see (set by
        #: :func:`_unqueued` for a waiting unit)
        self.levels: tuple[Level, ...] = ()
        self.unseen = 0
        self.base: dict[str, object] = {
            "key": key,
            "phase": unit.phase or "Pending",
            "quota": quota,
            "recorded": unit.message,
            "request": self.request,
            "holds": reserved_resources(unit),
            "waited_since": unit.created or None,
            "round": explanation.preemption_round(qs),
        }
        if qs is not None:
            config = qs.config
            why_not = disabled_reason(config)
            self.base.update(
                policy=str(config.policy or ""),
                blocked=qs.blocked,
                wait_for_pods_running=config.wait_for_pods_running,
                preemption="enabled" if why_not is None else why_not,
            )
            if not view.queues_known:
                self.unknowns.append(
                    f"Queue {quota} could not be read; its settings are those the reconciler derives "
                    f"from ElasticQuota {quota} (a hand-made Queue may differ)"
                )
        timeout = view.running_timeout
        if timeout is not None and timeout.running_timeout > 0:
            self.base["running_timeout"] = timeout.running_timeout
        elif timeout is None and not any("running timeout" in u for u in self.unknowns):
            self.unknowns.append(
                "the running timeout could not be read (the component configuration is admins')"
            )

    def done(self, reason: Reason, summary: str, steps: Sequence[str] = (), **extra: object) -> Explanation:
        """The explanation with ``base`` and ``extra`` (``extra`` wins)."""
        fields = {**self.base, **extra}
        fields.setdefault("message", self.unit.message)
        return Explanation(
            reason=reason,
            summary=summary,
            next_steps=tuple(steps),
            unknowns=tuple(dict.fromkeys(self.unknowns)),
            **fields,  # type: ignore[arg-type]
        )


def _not_waiting(story: _Story) -> Explanation | None:
    """A unit that does not wait in its queue: finished, unlabelled, being reclaimed, reserved for its
    admission checks, backing off, or admitted; None for a waiting unit."""
    unit, quota, done = story.unit, story.quota, story.done
    if unit.phase in TERMINAL_PHASES:
        return done(Reason.FINISHED, f"finished ({unit.phase}); it holds no quota")
    if not quota:
        return done(
            Reason.NO_QUOTA_LABEL,
            "it has no quota label, so it belongs to no queue and is never admitted",
            [f"label its job with {names.QUOTA_NAME_LABEL}=<quota> (delete and re-create it)"],
        )
    if has_reclaim(unit):
        reclaim = sum(a.reclaim_replicas or 0 for a in unit.admissions)
        return done(
            Reason.RECLAIMING,
            f"it is being preempted: {reclaim} replica(s) are being reclaimed in queue {quota} so that a "
            "higher-priority unit can be admitted",
            [
                "its unbound pods are deleted (bound pods never are); it then waits in its queue again "
                "for its next admission"
            ],
        )
    if unit.phase == Phase.RESERVED:
        checks = tuple((c.name, c.state, c.message) for c in unit.admission_checks)
        pending = [c for c in unit.admission_checks if c.state != names.AdmissionCheckState.READY]
        names_pending = ", ".join(f"{c.name} ({c.state or 'Pending'})" for c in pending) or "none"
        return done(
            Reason.ADMISSION_CHECK,
            f"its quota is reserved in {quota}; it waits for admission check(s): {names_pending}",
            [
                "the controller of each check must set it Ready in status.admissionChecks; all Ready "
                "releases the job, Rejected or Retry backs it off"
            ],
            checks=checks,
        )
    if unit.phase == Phase.TIMEOUT_BACKOFF:
        cause = (
            "an admission check failed"
            if unit.message == Message.CHECK_FAILED
            else "its pods did not all run within the running timeout"
            if unit.message == Message.BACKOFF_RUNNING_TIMEOUT
            else unit.message or "it backed off"
        )
        checks = tuple((c.name, c.state, c.message) for c in unit.admission_checks)
        return done(
            Reason.BACKOFF,
            f"backing off ({cause}); it is queued again at requeueAt",
            ["nothing to do: it re-enters its queue by itself at requeueAt"],
            requeue_at=unit.requeue_at,
            checks=checks,
        )
    if is_waiting(unit):
        return None
    admitted_at = unit.last_allocate_time
    timeout = story.view.running_timeout
    timeout_at = (
        admitted_at + timeout.running_timeout
        if timeout is not None and timeout.running_timeout > 0 and admitted_at is not None
        else None
    )
    if all_running(unit):
        return done(Reason.RUNNING, f"admitted in {quota}; all its pods run", admitted_at=admitted_at)
    return done(
        Reason.ADMITTED,
        f"admitted in {quota}; it holds {explanation.resources_text(reserved_resources(unit))} and its "
        "pods are not all running yet",
        ["its pods need nodes to run on; the running timeout (if set) requeues it if they never do"],
        admitted_at=admitted_at,
        timeout_at=timeout_at,
    )


def _unqueued(story: _Story) -> Explanation | None:
    """A waiting unit the scheduler never considers: its queue is missing or unreadable, or its
    entry is inactive (a parent quota, an unbound namespace, an unreadable spec, ``spec.active``
    false). Fills in the waiting fields of ``base`` on the way; None for an active entry."""
    view, cache, unit, quota, qs, key, done = (
        story.view,
        story.cache,
        story.unit,
        story.quota,
        story.qs,
        story.key,
        story.done,
    )
    place = position(qs, key) if qs is not None else None
    seen_position = view.positions.get(key) or (place[0] if place else None)
    story.base["position"] = seen_position
    story.base["waiting"] = place[1] if place else None
    ahead = explanation.units_ahead(qs, cache, key) if qs is not None else ()
    unseen = 0
    if seen_position is not None and not view.complete:
        unseen = max(0, seen_position - 1 - len(ahead))
    story.unseen = unseen
    story.levels = explanation.level_chain(cache, view, unit, story.request)
    story.base["ahead"], story.base["unseen_ahead"], story.base["levels"] = ahead, unseen, story.levels

    if quota in view.queue_missing or (qs is None and quota not in view.unreadable_quotas):
        found = cache.state.configs.get(quota)
        unusable = f" (its policy is unusable: {found.policy_error})" if found and found.policy_error else ""
        return done(
            Reason.QUEUE_NOT_FOUND,
            f"its quota label names queue {quota}, which does not exist{unusable}",
            [
                f"create ElasticQuota {quota} (the reconciler creates its Queue), or re-create the job "
                "with the label of an existing quota"
            ],
            message=Message.queue_not_exist(quota),
        )
    if qs is None:
        return done(
            Reason.UNKNOWN,
            f"its quota {quota} cannot be read, so its queue cannot be replayed",
            unknowns_steps(reasons.classify(unit.message, quota)),
        )
    if qs.entries[key].active:
        return None
    refusal = cache.ledger.binding_problem(quota, unit.namespace)
    if refusal is not None and refusal == Message.parent_quota(quota):
        return done(
            Reason.PARENT_ONLY,
            f"its quota {quota} is a parent quota (is-parent): it takes no jobs",
            ["label the job with one of its child quotas"],
            message=refusal,
        )
    if refusal is not None:
        return done(
            Reason.NOT_BOUND,
            f"its namespace {unit.namespace} may not use quota {quota}",
            [refusal.split("; ", 1)[-1]],
            message=refusal,
        )
    invalid = qs.entries[key].invalid
    if invalid is not None:
        return done(
            Reason.INVALID,
            f"its spec cannot be read: {invalid}",
            ["fix the job's spec (delete and re-create it)"],
        )
    return done(
        Reason.INACTIVE,
        f"it is inactive (spec.active is false): it keeps its place in queue {quota} but is never admitted",
        [f'set the job\'s annotation {names.ACTIVE_ANNOTATION} to "true" (kubectl koord-queue release)'],
        message=inactive_message(quota),
    )


def _waiting(story: _Story, decisions: Mapping[str, Admit | Park], now: float) -> Explanation:
    """An active waiting unit: the reason the replayed cycle gives (or, for a reader who cannot see
    every unit, the one the scheduler last recorded), in words from ``shared.core.explanation``."""
    view, cache, unit, quota, key, base = (
        story.view,
        story.cache,
        story.unit,
        story.quota,
        story.key,
        story.base,
    )
    qs = story.qs
    assert qs is not None  # _unqueued answered for a unit without a queue
    replayed = decisions.get(key)
    recorded = reasons.classify(unit.message, quota)
    record = qs.parked.get(key)
    from_replay: Classified | None = None
    park = replayed if isinstance(replayed, Park) else None
    if park is not None:
        from_replay = reasons.classify(park.message, quota)
        if (
            record is not None
            and record.quota_failure
            and from_replay is not None
            and record.level
            and from_replay.reason not in (Reason.SHARE, Reason.GUARANTEE)
        ):
            # The ParkRecord names the refusing level structurally; prefer it to the text.
            reason = Reason.QUOTA if record.level == quota else Reason.PARENT_QUOTA
            if from_replay.reason is Reason.PREEMPTOR:
                reason = Reason.PREEMPTOR
            from_replay = Classified(reason, record.level, from_replay.resource, from_replay.preempt)
        base["preempt_error"] = park.preempt_error or ""
    upgraded = False
    if from_replay is not None and from_replay.reason in (Reason.QUOTA, Reason.PARENT_QUOTA):
        # A round lives in the scheduler's memory; what it waits for is on the units (their
        # reclaimState). The preempt path itself says whether this unit counts on such victims.
        counted = _counting_on(qs, cache, key, now, view.reclaim_protect_seconds)
        if counted:
            from_replay = Classified(
                Reason.PREEMPTOR, from_replay.quota, from_replay.resource, "succeed", counted
            )
            upgraded = True
            if base["round"] is None:
                victims = tuple((v, sum(qs.reclaim_on_the_way(v).values())) for v in counted)
                base["round"] = Round(key, victims, 0.0)
            base["preempt_error"] = ""
    replay_fits = isinstance(replayed, Admit)

    chosen = from_replay
    if (
        not view.complete
        and recorded is not None
        and (from_replay is None or replay_fits or _weaker(from_replay, recorded))
    ):
        # Units the reader cannot see hold quota or stand ahead: the scheduler's own word wins.
        chosen = recorded
        story.unknowns.append(
            "the QueueUnits of other namespaces cannot be read: usage shown is a lower bound, and the "
            "reason is the one the scheduler last recorded"
        )
    agrees = None
    if recorded is not None and from_replay is not None:
        agrees = recorded.reason == from_replay.reason
    elif replay_fits and recorded is not None:
        agrees = False
    base["replay_agrees"] = agrees
    fair, fair_unknowns = explanation.fair_levels(cache, view, quota)
    story.unknowns.extend(fair_unknowns)
    base["fairness"] = fair

    if chosen is None:
        if replay_fits:
            return story.done(
                Reason.NEXT_CYCLE,
                f"it fits in {quota} now ({explanation.resources_text(story.request)}); the scheduler admits "
                "it in its next cycle",
                ["nothing to do"],
                message="",
            )
        return story.done(
            Reason.UNKNOWN,
            "it waits, but the scheduler has not written a reason yet and the replay gives none",
            ["look again in a moment"],
        )
    message = park.message if chosen is from_replay and park is not None else unit.message
    if upgraded and chosen is from_replay and message.endswith(Message.PREEMPT_FAILED_SUFFIX):
        message = message.removesuffix(Message.PREEMPT_FAILED_SUFFIX) + Message.PREEMPT_SUCCEED_SUFFIX
    result = explanation.for_waiting(
        story.done, chosen, message, quota, story.levels, qs, cache, unit, story.request, story.unseen
    )
    return _with_fairness(result)


def _with_fairness(result: Explanation) -> Explanation:
    """The standing among siblings at each level, as a step: it says who gets spare capacity first
    and why, which is what a unit waiting for spare capacity waits behind
    (docs/compatibility.md#fair-over-time)."""
    if not result.fairness:
        return result
    steps = tuple(f"spare capacity {level.text}" for level in result.fairness)
    return dataclasses.replace(result, next_steps=result.next_steps + steps)


def _counting_on(qs: QueueState, cache: Cache, key: str, now: float, protect: float) -> tuple[str, ...]:
    """The victims already being reclaimed that ``key`` counts on, by ``plan_preempt`` (the preempt
    path the scheduler runs for a unit the quota filter refused); empty when it counts on none."""
    entry = qs.entries.get(key)
    if entry is None or disabled_reason(qs.config) is not None:
        return ()
    outcome = plan_preempt(
        entry.item,
        entry.request,
        state=qs,
        units=cache.units,
        view=UsageView(cache.ledger),
        now=now,
        protect=protect,
        admitted=[],
    )
    return outcome.waiting_for if outcome.error is None else ()


def _weaker(from_replay: Classified, recorded: Classified) -> bool:
    """Whether the recorded reason explains more than a partial replay: the replay saw less usage,
    so a quota refusal recorded by the scheduler outranks any non-quota replay reason."""
    quota_reasons = {Reason.QUOTA, Reason.PARENT_QUOTA, Reason.PREEMPTOR, Reason.QUOTA_STRUCTURE}
    return recorded.reason in quota_reasons and from_replay.reason not in quota_reasons


def unknowns_steps(recorded: Classified | None) -> list[str]:
    if recorded is None:
        return ["ask a cluster admin to run kubectl koord-queue explain for it"]
    return [f"the scheduler last recorded: {recorded.reason.value}"]

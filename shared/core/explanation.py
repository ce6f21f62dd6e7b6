"""The parts of an answer to "why does this unit wait?" and their wording.

``shared.core.explain`` decides which :class:`~shared.core.reasons.Reason` applies; this module
gathers the figures that back it, each read from the replayed scheduler rather than recomputed: the
quota chain with ``shared.core.quota.UsageView.check``'s verdict at each level (the same call the
quota filter makes), the units ahead in the queue's own order, the units holding the refusing quota,
and the queue's preemption round. :func:`for_waiting` words the summary and next steps of a waiting
unit from those figures, so the plugin prints the scheduler's reasoning, not a second opinion.
:func:`fair_levels` reads the replayed usage history the same way: each level of the unit's chain
that divides spare capacity, with the standings ``shared.core.fairness`` computes for the scheduler
(docs/compatibility.md#fair-over-time).

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from koord_queue.shared.api import quantities
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.predicates import has_reclaim
from koord_queue.shared.api.quantities import Resources
from koord_queue.shared.core import fairness, quotastatus
from koord_queue.shared.core.policies import QueueState
from koord_queue.shared.core.preemption import disabled_reason
from koord_queue.shared.core.reasons import WAITING_REASONS, Classified, Reason
from koord_queue.shared.core.replay import UNKNOWN_RESOURCE, ServedStanding, View
from koord_queue.shared.core.scheduling import Cache
from koord_queue.shared.core.usage import UsageView

__all__ = [
    "Ahead",
    "Explanation",
    "FairLevel",
    "Finish",
    "Holder",
    "Level",
    "Round",
    "Sibling",
    "fair_levels",
    "for_waiting",
    "level_chain",
    "preempt_reason",
    "preemption_round",
    "resources_text",
    "units_ahead",
]


@dataclass(frozen=True, slots=True)
class Level:
    """One quota of the chain from the unit's quota up to the root, against the unit's request.

    ``used`` is what the reader can see (``used_complete``: every unit was seen). ``refuses`` says
    ``UsageView.check`` refuses the request at this very level (None: not known, the quota could
    not be read). ``over_min`` is used above ``min``: what the quota borrows
    (``shared.core.quotastatus.borrowed``, docs/compatibility.md#quota-guarantees).
    """

    name: str
    namespace: str
    min: Resources
    max: Resources
    used: Resources
    request: Resources
    free: Resources
    over_min: Resources
    refuses: bool | None
    readable: bool = True
    used_complete: bool = True


@dataclass(frozen=True, slots=True)
class Ahead:
    """A unit ahead in the queue (``None`` fields: not readable)."""

    position: int
    key: str
    priority: int
    request: Resources
    phase: str = ""


@dataclass(frozen=True, slots=True)
class Holder:
    """A unit holding quota on the refusing level: what it holds and how many pods run."""

    key: str
    quota: str
    holds: Resources
    admitted: int
    running: int
    phase: str
    reclaiming: bool


@dataclass(frozen=True, slots=True)
class Round:
    """The queue's preemption round: who preempts and the victims it waits for."""

    preemptor: str
    victims: tuple[tuple[str, int], ...]  # (unit key, replicas being reclaimed)
    started_at: float


@dataclass(frozen=True, slots=True)
class Sibling:
    """A quota among its siblings below one parent: its decayed usage (milli units), its share of
    the siblings' weights per resource, its standing (largest ``u / s``; lower is served first),
    and whether it is served before the unit's quota (``ahead``) or is it (``own``)."""

    name: str
    usage: Resources
    share: Mapping[str, float]
    score: float
    ahead: bool
    own: bool


@dataclass(frozen=True, slots=True)
class FairLevel:
    """One level of the unit's chain that divides spare capacity: the parent, the quota of the
    chain at this level, the parent's limit, the siblings in the order they get spare capacity, and
    the sentence ``fairness.describe_level`` words it in. ``served``: the parent cannot be read,
    and the figures are those the visibility API served (the quota alone among ``siblings``;
    ``unseen_ahead`` counts the siblings ahead the reader cannot see)."""

    parent: str
    quota: str
    limit: Resources
    siblings: tuple[Sibling, ...]
    text: str
    served: bool = False
    unseen_ahead: int = 0


@dataclass(frozen=True, slots=True)
class Explanation:
    key: str
    reason: Reason
    summary: str
    phase: str
    quota: str
    message: str  # the scheduler's text (replayed, or recorded when the replay cannot tell)
    recorded: str  # status.message as the scheduler last wrote it
    refusing_quota: str = ""
    refusing_resource: str = ""
    position: int | None = None
    waiting: int | None = None  # units waiting in the queue, as far as the reader can see
    request: Resources = field(default_factory=dict)
    holds: Resources = field(default_factory=dict)
    levels: tuple[Level, ...] = ()
    ahead: tuple[Ahead, ...] = ()
    unseen_ahead: int = 0
    holders: tuple[Holder, ...] = ()
    round: Round | None = None
    policy: str = ""
    blocked: bool = False
    wait_for_pods_running: bool = False
    preemption: str = ""  # "enabled", or why the preempt path cannot run
    preempt_error: str = ""
    checks: tuple[tuple[str, str, str], ...] = ()  # (name, state, message)
    requeue_at: float | None = None
    admitted_at: float | None = None
    running_timeout: float = 0.0
    timeout_at: float | None = None
    waited_since: float | None = None
    next_steps: tuple[str, ...] = ()
    unknowns: tuple[str, ...] = ()
    replay_agrees: bool | None = None
    fairness: tuple[FairLevel, ...] = ()  # docs/compatibility.md#fair-over-time

    @property
    def waiting_now(self) -> bool:
        return self.reason in WAITING_REASONS


def resources_text(res: Mapping[str, int]) -> str:
    shown = quantities.format_resource_list({k: v for k, v in res.items() if k != UNKNOWN_RESOURCE})
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "nothing"


def level_chain(cache: Cache, view: View, unit: Unit, request: Resources) -> tuple[Level, ...]:
    """The chain from the unit's quota up, each level with ``UsageView.check``'s verdict at it."""
    assert unit.quota is not None
    ledger = cache.ledger
    levels: list[Level] = []
    check_view = UsageView(ledger)  # usage as the units hold it, without this cycle's admissions
    for name in ledger.chain(unit.quota).names:
        quota = ledger.quotas[name]
        readable = name not in view.unreadable_quotas or any(q.name == name for q in view.quotas)
        refusal = check_view.check(request, name, item=unit.key)
        refuses = refusal is not None and check_view.level == name
        used = ledger.used(name)
        limits = {} if not readable else dict(quota.max)
        free = {r: cap - used.get(r, 0) for r, cap in sorted(limits.items())}
        over = quotastatus.borrowed(quota, used)
        levels.append(
            Level(
                name=name,
                namespace=quota.namespace,
                min=dict(quota.min),
                max=limits,
                used=used,
                request=request,
                free=free,
                over_min=over,
                refuses=refuses if readable else None,
                readable=readable,
                used_complete=view.complete,
            )
        )
    return tuple(levels)


def fair_levels(cache: Cache, view: View, quota: str) -> tuple[tuple[FairLevel, ...], list[str]]:
    """The levels of ``quota``'s chain that divide spare capacity, from the top, with the replayed
    history's standings (``fairness.levels``, what orders the scheduler's queues), and what the
    reader could not see to back them. A level below a parent the reader cannot read shows the
    standing the visibility API served when there is one, else it is left out rather than guessed."""
    ledger, history = cache.ledger, cache.snapshot.history
    if quota not in ledger.quotas:
        return (), []
    children = ledger.children()
    chain = [q for q in reversed(ledger.chain(quota).names) if ledger.quotas[q].parent in children]
    computed = {level.quota: level for level in fairness.levels(ledger, history, quota)}
    unknowns: list[str] = []
    out: list[FairLevel] = []
    for q in chain:
        parent = ledger.quotas[q].parent
        served = view.standings.get(q)
        if parent in view.unreadable_quotas:
            if served is not None and served.parent == parent:
                out.append(_served_level(q, served))
            else:
                unknowns.append(
                    f"ElasticQuota {parent} cannot be read: how its spare capacity is ordered among {q} and "
                    "its siblings is not shown"
                )
            continue
        level = computed.get(q)
        if level is None:
            if view.usage_half_life is None:
                unknowns.append(
                    "no usage history (koord-queue/usage-history) can be read on the quotas: the order in "
                    "which sibling quotas get spare capacity is not shown"
                )
            continue
        out.append(_replayed_level(level))
    if any(not lv.served for lv in out) and not view.quotas_complete:
        unknowns.append(
            "ElasticQuotas outside your namespace cannot be read: the sibling quotas, and their usage "
            "history, shown for spare capacity are only those you can read"
        )
    return tuple(out), list(dict.fromkeys(unknowns))


def _replayed_level(level: fairness.Level) -> FairLevel:
    ahead = {s.name for s in level.ahead}
    siblings = tuple(
        Sibling(s.name, dict(s.usage), dict(s.share), s.score, s.name in ahead, s.name == level.quota)
        for s in level.order
    )
    return FairLevel(level.parent, level.quota, dict(level.limit), siblings, fairness.describe_level(level))


def _served_level(quota: str, served: ServedStanding) -> FairLevel:
    """A level from the visibility API's ``fairShare``: the quota's own figures, the siblings
    ahead that the reader may see by name, and a count of those they may not."""
    score = served.score if served.score is not None else float("inf")
    mine = Sibling(quota, dict(served.usage), dict(served.share), score, ahead=False, own=True)
    named = tuple(Sibling(n, {}, {}, 0.0, ahead=True, own=False) for n in served.ahead)
    unseen = max(0, served.ahead_count - len(named))
    held = resources_text(served.usage) if served.usage else "nothing"
    share = ", ".join(f"{r} {v:.0%}" for r, v in sorted(served.share.items())) or "no"
    head = (
        f"below {served.parent}: {quota} has held {held} lately against a {share} share, "
        f"{_ordinal(served.position)} of {served.siblings} sibling quotas"
    )
    if not served.ahead_count:
        text = head + "; no sibling is ahead of it for spare capacity"
    else:
        who = ", ".join([*served.ahead, *([f"{unseen} you cannot read"] if unseen else [])])
        text = f"{head}; ahead of it for spare capacity, because they used less of their share lately: {who}"
    return FairLevel(served.parent, quota, {}, (*named, mine), text, served=True, unseen_ahead=unseen)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def units_ahead(qs: QueueState, cache: Cache, key: str) -> tuple[Ahead, ...]:
    """The units in front of ``key`` in its queue's order (Intelligent: all of the high sub-queue
    comes before a low unit)."""
    entry = qs.entries.get(key)
    if entry is None:
        return ()
    lane = qs.lanes[entry.lane]
    items = (list(qs.lanes[0]) if entry.lane == 1 else []) + lane[: bisect.bisect_left(lane, entry.item)]
    out: list[Ahead] = []
    for place, item in enumerate(items, start=1):
        other = str(item[-1])
        found = qs.entries[other]
        unit = cache.units.get(other)
        out.append(Ahead(place, other, found.priority, dict(found.request), unit.phase if unit else ""))
    return tuple(out)


def _holders(cache: Cache, quota: str) -> tuple[Holder, ...]:
    """Units whose usage counts on ``quota`` (charged to it or to a quota below it)."""
    ledger = cache.ledger
    out: list[Holder] = []
    for key in sorted(cache.units):
        unit = cache.units[key]
        contribution = ledger.contribution(key)
        if contribution is None or quota not in ledger.chain(contribution[0]).names:
            continue
        out.append(
            Holder(
                key=key,
                quota=contribution[0],
                holds=dict(contribution[1]),
                admitted=sum(a.replicas for a in unit.admissions),
                running=sum(a.running for a in unit.admissions),
                phase=unit.phase,
                reclaiming=has_reclaim(unit),
            )
        )
    return tuple(out)


def preemption_round(qs: QueueState | None) -> Round | None:
    if qs is None or qs.round is None:
        return None
    victims = tuple((v, sum(qs.reclaim_on_the_way(v).values())) for v in sorted(qs.round.victims))
    return Round(qs.round.preemptor, victims, qs.round.started_at)


def _name(key: str) -> str:
    return key.split("/", 1)[-1]


Finish = Callable[..., Explanation]


#: Waiting reasons that are the queue's state, not the unit's: (summary, next step), ``{q}`` the queue.
_QUEUE_UNUSABLE: Final = {
    Reason.STOPPED: (  # docs/compatibility.md#stopping-a-queue
        "queue {q} is stopped by an administrator: it admits nothing until it is resumed; the job "
        "keeps its place",
        "a cluster admin resumes it: kubectl koord-queue resume {q}",
    ),
    Reason.QUEUE_NOT_FOUND: (
        "its quota label names queue {q}, which does not exist",
        "create ElasticQuota {q}, or re-create the job with an existing quota's label",
    ),
}


def for_waiting(
    finish: Finish,
    c: Classified,
    message: str,
    quota: str,
    levels: tuple[Level, ...],
    qs: QueueState,
    cache: Cache,
    unit: Unit,
    request: Resources,
    unseen: int,
) -> Explanation:
    """Summary and next steps for a waiting unit whose reason is ``c``."""
    level = c.quota or quota
    holders = (
        _holders(cache, level) if c.reason in (Reason.QUOTA, Reason.PARENT_QUOTA, Reason.PREEMPTOR) else ()
    )
    if c.reason in (Reason.QUOTA, Reason.PARENT_QUOTA):
        return _no_room(finish, c, message, quota, levels, qs, unit, request, holders)
    if c.reason is Reason.PREEMPTOR:
        keys = c.victims or tuple(sorted(qs.round.victims if qs.round is not None else ()))
        victims = [f"{_name(v)} ({sum(qs.reclaim_on_the_way(v).values())} replica(s))" for v in keys]
        return finish(
            Reason.PREEMPTOR,
            f"preemption in progress for it in queue {quota}: it waits for victims to give back quota"
            + (f": {', '.join(victims)}" if victims else ""),
            [
                "the victims' unbound pods are deleted by their job extension; once the freed quota is "
                "seen on them, it is admitted in a later cycle"
            ],
            message=message,
            refusing_quota=level if c.quota else "",
            refusing_resource=c.resource,
            holders=holders,
        )
    if c.reason is Reason.PREEMPTING:
        who = _name(qs.round.preemptor) if qs.round else "another unit"
        return finish(
            Reason.PREEMPTING,
            f"queue {quota} is preempting for {who}, which is first in line for the quota being freed",
            [f"{who} is admitted once its victims give back quota; units after it wait until then"],
            message=message,
        )
    if c.reason is Reason.BLOCKED:
        head = _head(qs, unit)
        ahead_text = f" ({head} is at the head and cannot be admitted)" if head else ""
        return finish(
            Reason.BLOCKED,
            f"queue {quota} uses the {qs.config.policy} policy and is blocked by a unit ahead of it"
            f"{ahead_text}",
            [
                "the unit at the head must be admitted first (it fits once its quota frees room); the block "
                "lifts on any release, addition or deletion in the quota, or after 3 minutes "
                "without an attempt"
            ],
            message=message,
        )
    if c.reason is Reason.HELD:
        holding = [k for k in (str(i[-1]) for i in qs.assumed) if k != unit.key]
        shown = ", ".join(_name(k) for k in holding[:5]) or "units admitted this cycle"
        return finish(
            Reason.HELD,
            f"queue {quota} waits for pods to run (wait-for-pods-running): admitted units whose pods do not "
            f"all run hold the queue: {shown}",
            ["their pods must be bound to nodes and run; a higher-priority unit may reclaim them instead"],
            message=message,
        )
    if c.reason is Reason.BEYOND_DEPTH:
        return finish(
            Reason.BEYOND_DEPTH,
            f"it stands beyond queue {quota}'s max-depth {qs.config.max_depth}: the scheduler looks only "
            "that far",
            ["units ahead must be admitted or leave the queue"],
            message=message,
        )
    if c.reason is Reason.QUOTA_STRUCTURE:
        return finish(
            Reason.QUOTA_STRUCTURE,
            f"its quota tree is broken at {c.quota or quota} (a missing parent, a cycle, or an empty "
            "spec.max)",
            ["a cluster admin must fix the ElasticQuota tree"],
            message=message,
        )
    if c.reason in _QUEUE_UNUSABLE:
        summary, step = _QUEUE_UNUSABLE[c.reason]
        return finish(c.reason, summary.format(q=quota), [step.format(q=quota)], message=message)
    if c.reason is Reason.INACTIVE:
        return finish(
            Reason.INACTIVE,
            "it is inactive (spec.active is false)",
            ['set the job\'s annotation scheduling.x-k8s.io/active to "true"'],
            message=message,
        )
    return finish(c.reason, message or c.reason.value, [], message=message)


def _no_room(
    finish: Finish,
    c: Classified,
    message: str,
    quota: str,
    levels: tuple[Level, ...],
    qs: QueueState,
    unit: Unit,
    request: Resources,
    holders: tuple[Holder, ...],
) -> Explanation:
    """A unit its own quota, or a parent quota, has no room for: the figures at the refusing level
    and what would free it."""
    level = c.quota or quota
    found = next((lv for lv in levels if lv.name == level), None)
    where = "its own quota" if c.reason is Reason.QUOTA else f"parent quota {level} of {quota}"
    resource = c.resource or "a resource"
    numbers = ""
    if found is not None and found.readable and c.resource in found.max:
        used = found.used.get(c.resource, 0)
        bound = "" if found.used_complete else "at least "
        numbers = (
            f": it asks for {quantities.format_milli(request.get(c.resource, 0), resource=c.resource)} "
            f"{c.resource}, {level} has max "
            f"{quantities.format_milli(found.max[c.resource], resource=c.resource)}"
            f" and {bound}{quantities.format_milli(used, resource=c.resource)} in use"
        )
    why = preempt_reason(qs) or ("it does not preempt (preemptionPolicy Never)" if not unit.preempts else "")
    steps = [
        f"{level} must free {resource}: units holding it finish or are preempted"
        + (" (preemption cannot help here: " + why + ")" if why else ""),
        f"or a cluster admin raises spec.max of ElasticQuota {level}",
    ]
    if c.preempt == "failed" and qs.round is not None and qs.round.preemptor != unit.key:
        steps.insert(0, f"the preemption round of {_name(qs.round.preemptor)} must finish first")
    return finish(
        c.reason,
        f"{where} has no room for {resource}{numbers}",
        steps,
        message=message,
        refusing_quota=level,
        refusing_resource=c.resource,
        holders=holders,
    )


def preempt_reason(qs: QueueState) -> str:
    """Why the preempt path cannot help in this queue ('' when it can run)."""
    return disabled_reason(qs.config) or ""


def _head(qs: QueueState, unit: Unit) -> str:
    entry = qs.entries.get(unit.key)
    lane = qs.lanes[entry.lane if entry else 0]
    for item in lane:
        key = str(item[-1])
        if key != unit.key and qs.entries[key].active:
            return _name(key)
    return ""

"""Why a QueueUnit waits, in structured form, from the scheduler's own decision code.

``kubectl koord-queue explain`` must say what the scheduler decides, not what a second copy of its
rules would guess. So nothing here decides anything itself: :func:`replay` feeds the objects a
reader can see into the scheduler's own cache (``shared.core.scheduling.Cache``) and runs one cycle of
``shared.core.scheduling.schedule``, and :func:`explain` reads the outcome from what the scheduler left
behind: the :class:`~shared.core.plan.Park` or :class:`~shared.core.plan.Admit` decision for the unit, the
queue's :class:`~shared.core.policies.ParkRecord` (``level``: the quota that refused it), its preemption
round, its blocked flag and its lanes. The per-level quota figures come from
``shared.core.quota.UsageView.check`` asked about each level of the chain, the same call the filter
makes. The scheduler's texts (``shared.api.names.Message``) are mapped to a :class:`Reason` by
:func:`classify`, which also reads the ``status.message`` the real scheduler last wrote.

A reader may not see everything: a namespace user reads the QueueUnits and ElasticQuotas of their
namespace only, not the other namespaces' units that share the quota, nor (usually) the Queues in
``koord-queue``. :class:`View` says what was seen (``complete``: every unit of the cluster) and what
could not be read; :func:`explain` then trusts the scheduler's recorded message where the replay
lacks information, shows usage as a lower bound, and lists every unknown in ``Explanation.unknowns``
instead of guessing.

``Queued`` events on jobs use :func:`position` (where a unit stands in its queue, O(log n)).

Pure: standard library and sibling modules only; the clock is a parameter.
"""

from __future__ import annotations

import bisect
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shared.api import names, quantities
from shared.api.model import QueueConfig, Quota, Unit
from shared.api.names import Message, Phase
from shared.api.predicates import TERMINAL_PHASES, all_running, has_reclaim
from shared.api.quantities import Resources
from shared.core.plan import Admit, Park
from shared.core.policies import QueueState, inactive_message, is_waiting
from shared.core.preemption import disabled_reason, plan_preempt
from shared.core.quota import remaining_request, reserved_resources
from shared.core.scheduling import Cache
from shared.jobs.running_timeout import RunningTimeout

__all__ = [
    "UNKNOWN_RESOURCE",
    "WAITING_REASONS",
    "Ahead",
    "Explanation",
    "Holder",
    "Level",
    "QuotaRow",
    "Reason",
    "Round",
    "View",
    "classify",
    "explain",
    "position",
    "quota_rows",
    "replay",
]

#: The only resource a placeholder quota (one the reader cannot read) limits: resources absent from
#: ``max`` are unlimited, so the placeholder refuses nothing and the walk up the tree goes on.
UNKNOWN_RESOURCE = "koord-queue.x-k8s.io/unknown"


class Reason(enum.StrEnum):
    """Why a unit is where it is. The first group are waiting reasons the scheduler produces."""

    QUOTA = "quota"  # its own quota has no room for its request
    PARENT_QUOTA = "parent-quota"  # an ancestor quota has no room
    QUOTA_STRUCTURE = "quota-structure"  # a missing quota, a cycle, or a quota with an empty max
    BLOCKED = "blocked"  # Block/Intelligent: a unit ahead failed and holds the queue
    HELD = "held"  # wait-for-pods-running: admitted units whose pods do not run hold the queue
    PREEMPTING = "preempting"  # another unit's preemption round is in progress in its queue
    PREEMPTOR = "preemptor"  # its own preemption round: it waits for its victims to give back
    ADMISSION_CHECK = "admission-check"  # quota reserved, waiting for the queue's admission checks
    INACTIVE = "inactive"  # spec.active is false (scheduling.x-k8s.io/active: "false")
    QUEUE_NOT_FOUND = "queue-not-found"  # its quota label names no usable queue
    NOT_BOUND = "not-bound"  # its namespace may not use the quota
    INVALID = "invalid"  # its spec cannot be read
    BEYOND_DEPTH = "beyond-max-depth"  # past the queue's max-depth window
    BACKOFF = "backoff"  # TimeoutBackoff: queued again at requeueAt
    NEXT_CYCLE = "next-cycle"  # it fits now: the next cycle admits it
    NO_QUOTA_LABEL = "no-quota-label"  # belongs to no queue
    UNKNOWN = "unknown"  # not enough could be read to tell
    # Not waiting:
    RECLAIMING = "being-preempted"  # a victim: its unbound pods are being reclaimed
    ADMITTED = "admitted"  # holds its quota, pods not all running yet
    RUNNING = "running"
    FINISHED = "finished"


WAITING_REASONS = frozenset(
    {
        Reason.QUOTA,
        Reason.PARENT_QUOTA,
        Reason.QUOTA_STRUCTURE,
        Reason.BLOCKED,
        Reason.HELD,
        Reason.PREEMPTING,
        Reason.PREEMPTOR,
        Reason.ADMISSION_CHECK,
        Reason.INACTIVE,
        Reason.QUEUE_NOT_FOUND,
        Reason.NOT_BOUND,
        Reason.INVALID,
        Reason.BEYOND_DEPTH,
        Reason.BACKOFF,
        Reason.NEXT_CYCLE,
        Reason.NO_QUOTA_LABEL,
        Reason.UNKNOWN,
    }
)

_LIMITED = re.compile(
    r"^limited quotaName:(?P<quota>[^,]*), (?:limited resKey:(?P<resource>[^,]*),|quota spec)"
)
_STRUCTURE = re.compile(
    r"^CheckUsage found (?:cycle reference|quota not exist), item:[^,]*, quotaName:(?P<quota>[^,]*),"
)
_VICTIMS = re.compile(r"^preemption: waiting for queueUnit preempted, victims: \[(?P<victims>[^\]]*)\]")
_PREEMPTING = re.compile(r"^queue (?P<queue>.+) is preempting, not allowed to preempt again$")
_NOT_EXIST = re.compile(r"^queue (?P<queue>.+) is not exist$")
_BEYOND = re.compile(r"^waiting in queue .+: position is beyond the queue's max-depth (?P<depth>-?\d+)$")


@dataclass(frozen=True, slots=True)
class Classified:
    """A scheduler text mapped to a reason; ``quota``/``resource`` name the refusing level."""

    reason: Reason
    quota: str = ""
    resource: str = ""
    preempt: str = ""  # "succeed" or "failed" when the text carries a preemption suffix
    victims: tuple[str, ...] = ()


def classify(message: str, unit_quota: str | None) -> Classified | None:
    """Map one of the scheduler's waiting texts (``shared.api.names.Message``, the policies' texts) to
    a :class:`Reason`; None for a text that is not a waiting reason (or is empty)."""
    text = message.strip()
    if not text:
        return None
    preempt = ""
    for suffix, word in (
        (Message.PREEMPT_SUCCEED_SUFFIX, "succeed"),
        (Message.PREEMPT_FAILED_SUFFIX, "failed"),
    ):
        if text.endswith(suffix):
            text, preempt = text[: -len(suffix)], word
    if found := _LIMITED.match(text):
        quota = found["quota"]
        if found["resource"] is None:
            return Classified(Reason.QUOTA_STRUCTURE, quota=quota, preempt=preempt)
        reason = Reason.QUOTA if quota == unit_quota else Reason.PARENT_QUOTA
        if preempt == "succeed":
            reason = Reason.PREEMPTOR
        return Classified(reason, quota=quota, resource=found["resource"], preempt=preempt)
    if found := _STRUCTURE.match(text):
        return Classified(Reason.QUOTA_STRUCTURE, quota=found["quota"], preempt=preempt)
    if found := _VICTIMS.match(text):
        victims = tuple(v for v in found["victims"].split(",") if v)
        return Classified(Reason.PREEMPTOR, victims=victims)
    if _PREEMPTING.match(text):
        return Classified(Reason.PREEMPTING)
    if found := _NOT_EXIST.match(text):
        return Classified(Reason.QUEUE_NOT_FOUND, quota=found["queue"])
    if found := _BEYOND.match(text):
        return Classified(Reason.BEYOND_DEPTH)
    if text == Message.BLOCKED_BY_HIGHER:
        return Classified(Reason.BLOCKED)
    if text == Message.NO_MORE_IN_QUEUE:
        return Classified(Reason.HELD)
    if text == Message.NO_QUOTA_LABEL:
        return Classified(Reason.NO_QUOTA_LABEL)
    if unit_quota and text == inactive_message(unit_quota):
        return Classified(Reason.INACTIVE)
    if text.startswith("QueueUnit cannot be scheduled: "):
        return Classified(Reason.INVALID)
    if text.startswith(f'quota "{unit_quota}" is not bound to namespace'):
        return Classified(Reason.NOT_BOUND, quota=unit_quota or "")
    return None


# --- what a reader saw ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class View:
    """The objects a reader could see, parsed, and what could not be read.

    ``complete``: the units are every unit of the cluster (an admin's view); otherwise usage and
    the units ahead are lower bounds. ``unreadable_quotas`` are quota names referenced (a unit's
    label, a parent label) that could not be read: they enter the replay as placeholders that refuse
    nothing. ``queues_known``: the Queues themselves were read (else they were derived from the
    quotas, as the reconciler derives them). ``positions`` are the 1-based places the visibility API
    gave (unit key -> position); ``queue_missing`` the queues it answered 404 for.
    """

    units: Mapping[str, Unit]
    quotas: Sequence[Quota] = ()
    queues: Sequence[QueueConfig] = ()
    reclaim_protect_seconds: float = 0.0
    namespace_binding: bool = True
    complete: bool = False
    unreadable_quotas: frozenset[str] = frozenset()
    queues_known: bool = True
    positions: Mapping[str, int] = field(default_factory=dict)
    queue_missing: frozenset[str] = frozenset()
    running_timeout: RunningTimeout | None = None
    unknowns: tuple[str, ...] = ()


def replay(view: View, now: float) -> tuple[Cache, list[Admit | Park]]:
    """The scheduler's cache filled with ``view`` and one cycle run over it (nothing is written
    anywhere: the plan is returned). Placeholders stand in for the unreadable quotas."""
    cache = Cache(
        reclaim_protect_seconds=view.reclaim_protect_seconds,
        quota_namespace_binding=view.namespace_binding,
    )
    known = {q.name for q in view.quotas}
    for quota in view.quotas:
        cache.put_quota(quota)
    for name in sorted(view.unreadable_quotas - known):
        cache.put_quota(Quota(name=name, max={UNKNOWN_RESOURCE: 0}))
    configs = {c.name: c for c in view.queues}
    if not view.queues_known:
        # Queues not read: each quota has one (the reconciler makes it); settings unknown.
        names_seen = view.unreadable_quotas | {q.name for q in view.quotas}
        for name in sorted(names_seen - configs.keys() - view.queue_missing):
            configs[name] = QueueConfig(name=name)
    for name in sorted(configs):
        cache.put_queue(configs[name])
    for key in sorted(view.units):
        cache.put_unit(view.units[key])
    plan = cache.schedule(now)
    return cache, [d for d in plan.decisions if isinstance(d, Admit | Park)]


# --- the answer -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Level:
    """One quota of the chain from the unit's quota up to the root, against the unit's request.

    ``used`` is what the reader can see (``used_complete``: every unit was seen). ``refuses`` says
    ``UsageView.check`` refuses the request at this very level (None: not known, the quota could
    not be read). ``over_min`` is used above ``min`` (what Koordinator would call borrowed; ``min``
    is not enforced here yet, docs/architecture.md#decision-11-quota-model).
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

    @property
    def waiting_now(self) -> bool:
        return self.reason in WAITING_REASONS


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


def _fmt(res: Mapping[str, int]) -> str:
    shown = quantities.format_resource_list({k: v for k, v in res.items() if k != UNKNOWN_RESOURCE})
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "nothing"


def _levels(cache: Cache, view: View, unit: Unit, request: Resources) -> tuple[Level, ...]:
    """The chain from the unit's quota up, each level with ``UsageView.check``'s verdict at it."""
    assert unit.quota is not None
    ledger = cache.ledger
    levels: list[Level] = []
    check_view = ledger.view()  # usage as the units hold it, without this cycle's admissions
    for name in ledger.chain(unit.quota).names:
        quota = ledger.quotas[name]
        readable = name not in view.unreadable_quotas or any(q.name == name for q in view.quotas)
        refusal = check_view.check(request, name, item=unit.key)
        refuses = refusal is not None and check_view.level == name
        used = ledger.used(name)
        limits = {} if not readable else dict(quota.max)
        free = {r: cap - used.get(r, 0) for r, cap in sorted(limits.items())}
        over = {r: used.get(r, 0) - m for r, m in sorted(quota.min.items()) if used.get(r, 0) > m}
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


def _ahead(qs: QueueState, cache: Cache, key: str) -> tuple[Ahead, ...]:
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


def _round(qs: QueueState | None) -> Round | None:
    if qs is None or qs.round is None:
        return None
    victims = tuple((v, sum(qs.reclaim_on_the_way(v).values())) for v in sorted(qs.round.victims))
    return Round(qs.round.preemptor, victims, qs.round.started_at)


def _name(key: str) -> str:
    return key.split("/", 1)[-1]


def explain(view: View, key: str, now: float) -> Explanation:
    """Why the unit ``key`` (``namespace/name``) is where it is, and what would let it run."""
    unit = view.units[key]
    cache, decisions = replay(view, now)
    unit = cache.units[key]
    quota = unit.quota or ""
    qs = cache.state.queues.get(quota)
    request = remaining_request(unit)
    unknowns = list(view.unknowns)
    base: dict[str, object] = {
        "key": key,
        "phase": unit.phase or "Pending",
        "quota": quota,
        "recorded": unit.message,
        "request": request,
        "holds": reserved_resources(unit),
        "waited_since": unit.created or None,
        "round": _round(qs),
    }
    if qs is not None:
        config = qs.config
        why_not = disabled_reason(config)
        base.update(
            policy=str(config.policy or ""),
            blocked=qs.blocked,
            wait_for_pods_running=config.wait_for_pods_running,
            preemption="enabled" if why_not is None else why_not,
        )
        if not view.queues_known:
            unknowns.append(
                f"Queue {names.COMPONENT_NAMESPACE}/{quota} could not be read; its settings are those the "
                f"reconciler derives from ElasticQuota {quota} (a hand-made Queue may differ)"
            )
    timeout = view.running_timeout
    if timeout is not None and timeout.running_timeout > 0:
        base["running_timeout"] = timeout.running_timeout
    elif timeout is None and not any("running timeout" in u for u in unknowns):
        unknowns.append("the running timeout could not be read (the component configuration is admins')")

    def done(reason: Reason, summary: str, steps: Sequence[str] = (), **extra: object) -> Explanation:
        """The explanation with ``base`` and ``extra`` (``extra`` wins)."""
        fields = {**base, **extra}
        fields.setdefault("message", unit.message)
        return Explanation(
            reason=reason,
            summary=summary,
            next_steps=tuple(steps),
            unknowns=tuple(dict.fromkeys(unknowns)),
            **fields,  # type: ignore[arg-type]
        )

    # --- not waiting -----------------------------------------------------------------------------
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
    if not is_waiting(unit):
        admitted_at = unit.last_allocate_time
        timeout_at = (
            admitted_at + timeout.running_timeout
            if timeout is not None and timeout.running_timeout > 0 and admitted_at is not None
            else None
        )
        if all_running(unit):
            return done(Reason.RUNNING, f"admitted in {quota}; all its pods run", admitted_at=admitted_at)
        return done(
            Reason.ADMITTED,
            f"admitted in {quota}; it holds {_fmt(reserved_resources(unit))} and its pods are not all "
            "running yet",
            ["its pods need nodes to run on; the running timeout (if set) requeues it if they never do"],
            admitted_at=admitted_at,
            timeout_at=timeout_at,
        )

    # --- waiting ---------------------------------------------------------------------------------
    replayed = next((d for d in decisions if d.key == key), None)
    recorded = classify(unit.message, quota)
    place = position(qs, key) if qs is not None else None
    seen_position = view.positions.get(key) or (place[0] if place else None)
    base["position"] = seen_position
    base["waiting"] = place[1] if place else None
    ahead = _ahead(qs, cache, key) if qs is not None else ()
    unseen = 0
    if seen_position is not None and not view.complete:
        unseen = max(0, seen_position - 1 - len(ahead))
    base["ahead"], base["unseen_ahead"] = ahead, unseen
    levels = _levels(cache, view, unit, request)
    base["levels"] = levels

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
            unknowns_steps(recorded),
        )

    entry = qs.entries[key]
    if not entry.active:
        refusal = cache.ledger.binding_problem(quota, unit.namespace)
        if refusal is not None:
            return done(
                Reason.NOT_BOUND,
                f"its namespace {unit.namespace} may not use quota {quota}",
                [refusal.split("; ", 1)[-1]],
                message=refusal,
            )
        if entry.invalid is not None:
            return done(
                Reason.INVALID,
                f"its spec cannot be read: {entry.invalid}",
                ["fix the job's spec (delete and re-create it)"],
            )
        return done(
            Reason.INACTIVE,
            f"it is inactive (spec.active is false): it keeps its place in queue {quota} but is never "
            "admitted",
            [f'set the job\'s annotation {names.ACTIVE_ANNOTATION} to "true" (kubectl koord-queue release)'],
            message=inactive_message(quota),
        )

    record = qs.parked.get(key)
    from_replay: Classified | None = None
    park = replayed if isinstance(replayed, Park) else None
    if park is not None:
        from_replay = classify(park.message, quota)
        if record is not None and record.quota_failure and from_replay is not None and record.level:
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
        unknowns.append(
            "the QueueUnits of other namespaces cannot be read: usage shown is a lower bound, and the "
            "reason is the one the scheduler last recorded"
        )
    agrees = None
    if recorded is not None and from_replay is not None:
        agrees = recorded.reason == from_replay.reason
    elif replay_fits and recorded is not None:
        agrees = False
    base["replay_agrees"] = agrees

    if chosen is None:
        if replay_fits:
            return done(
                Reason.NEXT_CYCLE,
                f"it fits in {quota} now ({_fmt(request)}); the scheduler admits it in its next cycle",
                ["nothing to do"],
                message="",
            )
        return done(
            Reason.UNKNOWN,
            "it waits, but the scheduler has not written a reason yet and the replay gives none",
            ["look again in a moment"],
        )
    message = park.message if chosen is from_replay and park is not None else unit.message
    if upgraded and chosen is from_replay and message.endswith(Message.PREEMPT_FAILED_SUFFIX):
        message = message.removesuffix(Message.PREEMPT_FAILED_SUFFIX) + Message.PREEMPT_SUCCEED_SUFFIX
    return _waiting(done, chosen, message, quota, levels, qs, cache, unit, request, unseen)


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
        view=cache.ledger.view(),
        now=now,
        protect=protect,
        admitted=[],
    )
    return outcome.waiting_for if outcome.error is None else ()


def _weaker(replay: Classified, recorded: Classified) -> bool:
    """Whether the recorded reason explains more than a partial replay: the replay saw less usage,
    so a quota refusal recorded by the scheduler outranks any non-quota replay reason."""
    quota_reasons = {Reason.QUOTA, Reason.PARENT_QUOTA, Reason.PREEMPTOR, Reason.QUOTA_STRUCTURE}
    return recorded.reason in quota_reasons and replay.reason not in quota_reasons


def unknowns_steps(recorded: Classified | None) -> list[str]:
    if recorded is None:
        return ["ask a cluster admin to run kubectl koord-queue explain for it"]
    return [f"the scheduler last recorded: {recorded.reason.value}"]


Finish = Callable[..., Explanation]


def _waiting(
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
    ahead_text = ""
    if c.reason in (Reason.QUOTA, Reason.PARENT_QUOTA):
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
        steps = [
            f"{level} must free {resource}: units holding it finish or are preempted"
            + (" (preemption cannot help here: " + preempt_reason(qs) + ")" if preempt_reason(qs) else ""),
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
    if c.reason is Reason.QUEUE_NOT_FOUND:
        return finish(
            Reason.QUEUE_NOT_FOUND,
            f"its quota label names queue {quota}, which does not exist",
            [f"create ElasticQuota {quota}, or re-create the job with an existing quota's label"],
            message=message,
        )
    if c.reason is Reason.INACTIVE:
        return finish(
            Reason.INACTIVE,
            "it is inactive (spec.active is false)",
            ['set the job\'s annotation scheduling.x-k8s.io/active to "true"'],
            message=message,
        )
    return finish(c.reason, message or c.reason.value, [], message=message)


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


# --- quotas -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One quota for ``kubectl koord-queue quotas``: limits, usage and the work waiting in it."""

    name: str
    namespace: str
    parent: str
    depth: int
    min: Resources
    max: Resources
    used: Resources
    over_min: Resources
    waiting: int
    waiting_request: Resources
    admitted: int
    used_complete: bool
    ignored: bool = False


def quota_rows(view: View) -> list[QuotaRow]:
    """Every readable quota in tree order (parents before children, then by name), with the usage
    the scheduler's ledger computes from the units seen and the demand of the units waiting."""
    cache, _ = replay(view, 0.0)
    ledger = cache.ledger
    waiting: dict[str, tuple[int, Resources]] = {}
    admitted: dict[str, int] = {}
    for unit in cache.units.values():
        if not unit.quota:
            continue
        if is_waiting(unit) and unit.phase not in (Phase.RESERVED,):
            count, total = waiting.get(unit.quota, (0, {}))
            waiting[unit.quota] = (count + 1, quantities.add(total, remaining_request(unit)))
        elif ledger.contribution(unit.key) is not None:
            admitted[unit.quota] = admitted.get(unit.quota, 0) + 1
    quotas = ledger.quotas
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for name in sorted(quotas):
        parent = quotas[name].parent
        if parent and parent in quotas and parent != name:
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)
    rows: list[QuotaRow] = []
    seen: set[str] = set()

    def walk(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        quota = quotas[name]
        used = ledger.used(name)
        count, total = waiting.get(name, (0, {}))
        rows.append(
            QuotaRow(
                name=name,
                namespace=quota.namespace,
                parent=quota.parent,
                depth=depth,
                min=dict(quota.min),
                max=dict(quota.max),
                used=used,
                over_min={r: used.get(r, 0) - m for r, m in sorted(quota.min.items()) if used.get(r, 0) > m},
                waiting=count,
                waiting_request=total,
                admitted=admitted.get(name, 0),
                used_complete=view.complete,
            )
        )
        for child in children.get(name, []):
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    for name in sorted(quotas):  # cycles: whatever the walk did not reach
        walk(name, 0)
    for quota in ledger.ignored():
        rows.append(
            QuotaRow(
                name=quota.name,
                namespace=quota.namespace,
                parent=quota.parent,
                depth=0,
                min=dict(quota.min),
                max=dict(quota.max),
                used={},
                over_min={},
                waiting=0,
                waiting_request={},
                admitted=0,
                used_complete=view.complete,
                ignored=True,
            )
        )
    return rows

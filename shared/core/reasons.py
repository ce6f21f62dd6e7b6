"""The scheduler's waiting texts read back as a :class:`Reason`.

The scheduler says why a unit waits only in text (``shared.api.names.Message`` and the policies'
messages, written to ``status.message``). ``kubectl koord-queue explain`` must name the same reason
the scheduler gave, both for the cycle it replays and for the ``status.message`` the real scheduler
last wrote, so :func:`classify` parses exactly those texts back instead of re-deciding anything. A
text this module does not know is no reason (None), never a guess.

Pure: standard library and sibling modules only.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from koord_queue.shared.api.names import NON_PREEMPTING_SUFFIX, Message
from koord_queue.shared.core.policies import inactive_message

__all__ = [
    "WAITING_REASONS",
    "Classified",
    "Reason",
    "classify",
]


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
    STOPPED = "queue-stopped"  # an administrator stopped its queue (docs/compatibility.md#stopping-a-queue)
    NOT_BOUND = "not-bound"  # its namespace may not use the quota
    PARENT_ONLY = "parent-takes-no-jobs"  # its quota is labelled is-parent: it takes no jobs
    SHARE = "share"  # room exists, but it is held for siblings (their min or fair share)
    GUARANTEE = "guarantee"  # within its min: borrowed quota is reclaimed, or awaited, for it
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
        Reason.STOPPED,
        Reason.NOT_BOUND,
        Reason.PARENT_ONLY,
        Reason.SHARE,
        Reason.GUARANTEE,
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
_STOPPED = re.compile(r"^queue (?P<queue>.+) is stopped by an administrator; ")
_GUARANTEE = re.compile(r"; (?:reclaiming borrowed quota from |within min, waiting for )")
_SHARE_TAIL = "is held for sibling quotas (their min or fair share)"
_BEYOND = re.compile(r"^waiting in queue .+: position is beyond the queue's max-depth (?P<depth>-?\d+)$")


@dataclass(frozen=True, slots=True)
class Classified:
    """A scheduler text mapped to a reason; ``quota``/``resource`` name the refusing level."""

    reason: Reason
    quota: str = ""
    resource: str = ""
    preempt: str = ""  # "succeed", "failed" or "never" when the text carries a preemption suffix
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
        (NON_PREEMPTING_SUFFIX, "never"),  # docs/compatibility.md#non-preempting-jobs
    ):
        if text.endswith(suffix):
            text, preempt = text[: -len(suffix)], word
    if found := _LIMITED.match(text):
        quota = found["quota"]
        if _GUARANTEE.search(text):  # docs/compatibility.md#reclaim-across-quotas
            return Classified(Reason.GUARANTEE, quota=quota, resource=found["resource"] or "")
        if text.endswith(_SHARE_TAIL):  # docs/compatibility.md#quota-guarantees
            return Classified(Reason.SHARE, quota=quota, resource=found["resource"] or "", preempt=preempt)
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
    if found := _STOPPED.match(text):
        return Classified(Reason.STOPPED, quota=found["queue"])
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
    if unit_quota and text == Message.parent_quota(unit_quota):
        return Classified(Reason.PARENT_ONLY, quota=unit_quota)
    if text.startswith(f'quota "{unit_quota}" is not bound to namespace'):
        return Classified(Reason.NOT_BOUND, quota=unit_quota or "")
    return None

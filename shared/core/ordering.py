"""Total orders over units and queues: who is served first, and who may preempt whom.

Every ordering here ends with a tie-breaker so that the same snapshot always yields the same plan
(docs/architecture.md#decision-9-deterministic-order); the keys are plain tuples so that sorted lists
can be maintained with ``bisect`` instead of re-sorting on every cycle.

Unit order for the Priority and Block policies (upstream ``less``,
docs/compatibility.md#priority-and-block-policies):

1. higher ``spec.priority`` first (nil counts as 0);
2. earlier ``creationTimestamp`` first (upstream's ``InitialAttemptTimestamp``);
3. name ascending;
4. then namespace and uid, which upstream lacks: two units with the same name in different
   namespaces created in the same second would otherwise compare equal.

Intelligent policy (docs/compatibility.md#intelligent-policy): units with priority >= the queue's
threshold form the *high* sub-queue, the others the *low* one; each is ordered by priority desc, then a
non-preemptible unit before a preemptible one (label ``quota.scheduling.alibabacloud.com/preemptible``
== ``"true"``), then creation time, name, namespace, uid.

The preemption rule "a victim sorts after its preemptor" compares the preemptor's unit key with the
victim's *victim key* (:func:`victim_key`): the same key with the unit's preemption priority in
place of its priority (docs/compatibility.md#preemption-priority). A unit's preemption priority is
never below its priority, so its victim key never sorts after its unit key; with keys total and
strict, P may preempt V means ``unit_key(P) < victim_key(V) <= unit_key(V)``, and V may preempt P
would need ``unit_key(V) < victim_key(P) <= unit_key(P)``: both cannot hold, so no two units can
preempt each other. Without a preemption priority the victim key is the unit key, as before.

Queues are served in order of ``spec.priority`` (higher first), then name.
"""

from __future__ import annotations

from collections.abc import Iterable

from koord_queue.shared.api.model import QueueConfig, Unit
from koord_queue.shared.api.names import QueuePolicy

__all__ = [
    "SortKey",
    "intelligent_key",
    "is_high",
    "lane_of",
    "priority_key",
    "queue_key",
    "queues_in_order",
    "unit_key",
    "victim_key",
]

SortKey = tuple[int | float | str, ...]
"""A unit's position key; smaller sorts first."""


def priority_key(unit: Unit) -> SortKey:
    """Priority and Block: (-priority, created, name, namespace, uid)."""
    return (-unit.priority, unit.created, unit.name, unit.namespace, unit.uid)


def intelligent_key(unit: Unit) -> SortKey:
    """Intelligent: (-priority, preemptible, created, name, namespace, uid)."""
    return (-unit.priority, 1 if unit.preemptible else 0, unit.created, unit.name, unit.namespace, unit.uid)


def unit_key(unit: Unit, policy: QueuePolicy | None) -> SortKey:
    """The key of ``unit`` under ``policy`` (an unsupported policy sorts like Priority)."""
    if policy is QueuePolicy.INTELLIGENT:
        return intelligent_key(unit)
    return priority_key(unit)


def victim_key(unit: Unit, policy: QueuePolicy | None) -> SortKey:
    """The key ``unit`` is compared with as a victim: :func:`unit_key` with its preemption priority
    (``Unit.victim_priority``, never below its priority) in place of its priority, same tie-breakers."""
    pp = unit.victim_priority
    if policy is QueuePolicy.INTELLIGENT:
        return (-pp, 1 if unit.preemptible else 0, unit.created, unit.name, unit.namespace, unit.uid)
    return (-pp, unit.created, unit.name, unit.namespace, unit.uid)


def is_high(unit: Unit, threshold: int) -> bool:
    """Intelligent: priority >= threshold belongs to the high sub-queue (S17: p4 with threshold 4)."""
    return unit.priority >= threshold


def lane_of(unit: Unit, config: QueueConfig) -> int:
    """The sub-queue of ``unit``: 0 (the only one, or Intelligent's high), or 1 (Intelligent's low)."""
    if config.policy is QueuePolicy.INTELLIGENT and not is_high(unit, config.priority_threshold):
        return 1
    return 0


def queue_key(config: QueueConfig) -> tuple[int, str]:
    """Queues: higher ``spec.priority`` first, then name."""
    return (-config.priority, config.name)


def queues_in_order(configs: Iterable[QueueConfig]) -> list[QueueConfig]:
    return sorted(configs, key=queue_key)

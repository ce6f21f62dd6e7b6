"""Parsed, immutable views of QueueUnits, Queues and ElasticQuotas: the only input of the core.

Every decision module reads these typed, frozen values and never digs in raw dicts
(docs/development.md#code-style); ``shared.api.parsing`` builds them from the API's raw objects exactly
once, at the edge, and records what was malformed in ``problems`` (and, when a unit's demand cannot be
known, in ``invalid``) instead of raising. :func:`evolve`, :func:`with_grants` and :func:`with_reclaim`
derive the unit an API write will produce, so the reconciler can assume it into its cache before the
write lands.

Quantities are exact milli-units (``shared.api.quantities``); times are float epoch seconds. Pure:
standard library and sibling ``shared`` modules only, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from koord_queue.shared.api import names
from koord_queue.shared.api.admission_checks import CheckState, QueueAdmissionCheck
from koord_queue.shared.api.placement import PodPlacement
from koord_queue.shared.api.quantities import Resources

__all__ = [
    "Admission",
    "CheckState",
    "PodSet",
    "QueueConfig",
    "Quota",
    "Unit",
    "evolve",
    "quota_name_of",
    "with_grants",
    "with_reclaim",
]

DEFAULT_ITEMS_REFRESH_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class Admission:
    """One ``status.admissions`` entry: replicas admitted for a pod set and how many run."""

    name: str
    replicas: int
    running: int
    resources: Resources = field(default_factory=dict)
    reclaim_replicas: int | None = None


@dataclass(frozen=True, slots=True)
class PodSet:
    """One ``spec.podSet`` entry reduced to ``count`` pods of ``per_pod`` resources."""

    name: str
    count: int
    min_count: int | None
    per_pod: Resources
    #: What the pod set's template says about nodes, None when it says nothing
    #: (docs/pools.md#fallback-between-pools).
    placement: PodPlacement | None = None


@dataclass(frozen=True, slots=True)
class Unit:
    """A QueueUnit as the scheduler sees it. ``key`` is ``namespace/name``."""

    key: str
    namespace: str
    name: str
    uid: str = ""
    created: float = 0.0
    priority: int = 0
    quota: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    active: bool = True
    pod_sets: tuple[PodSet, ...] = ()
    admissions: tuple[Admission, ...] = ()
    phase: str = ""
    message: str = ""
    request: Resources = field(default_factory=dict)
    resource: Resources = field(default_factory=dict)
    last_allocate_time: float | None = None
    last_update_time: float | None = None
    admission_checks: tuple[CheckState, ...] = ()
    consumer_kind: str | None = None
    attempts: int = 0
    conditions: tuple[Mapping[str, object], ...] = ()
    requeue_count: int | None = None
    requeue_at: float | None = None
    queue: str = ""
    resource_version: str = ""
    problems: tuple[str, ...] = ()
    invalid: str | None = None
    #: The pool the unit was admitted to (``status.pool``) and the quota inside that pool it was
    #: charged through (``status.poolQuota``, empty when its own quota is in the pool); ``pools``
    #: the job's own list of pools in its order (``koord-queue/pools``), None for no preference
    #: (docs/pools.md#fallback-between-pools).
    pool: str = ""
    pool_quota: str = ""
    pools: tuple[str, ...] | None = None
    #: The priority the unit is preempted at (``spec.preemptionPriority``), None: its ``priority``;
    #: never below it once parsed (docs/compatibility.md#preemption-priority).
    preemption_priority: int | None = None
    #: ``spec.preemptionPolicy``: ``Never`` makes it wait for room and never mark a victim.
    preemption_policy: str = names.PREEMPTION_POLICY_PREEMPT

    @property
    def victim_priority(self) -> int:
        """The priority a preemptor must beat to take this unit's replicas: its preemption
        priority, never below its scheduling priority (so no two units can preempt each other)."""
        pp = self.preemption_priority
        return self.priority if pp is None or pp < self.priority else pp

    @property
    def preempts(self) -> bool:
        """Whether the unit may mark victims (queue-level preemption and reclaim across quotas)."""
        return self.preemption_policy != names.PREEMPTION_POLICY_NEVER

    @property
    def preemptible(self) -> bool:
        """Upstream ``IsJobPreemptible``: the preemptible label equals ``"true"``."""
        return self.labels.get(names.PREEMPTIBLE_LABEL) == "true"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A Queue's spec and tuning annotations (docs/compatibility.md#queue,
    docs/compatibility.md#queue-annotations).

    ``policy`` is ``None`` when ``spec.queuePolicy`` names an unsupported strategy; ``policy_error``
    then carries upstream's text for the ``AddQueueFail`` event and the queue admits nothing.
    """

    name: str
    policy: names.QueuePolicy | None = names.QueuePolicy.PRIORITY
    policy_error: str | None = None
    priority: int = 0
    wait_for_pods_running: bool = False
    enable_preemption: bool = False
    max_depth: int = -1
    priority_threshold: int = names.DEFAULT_PRIORITY_THRESHOLD
    admission_checks: tuple[QueueAdmissionCheck, ...] = ()
    items_refresh_seconds: float = DEFAULT_ITEMS_REFRESH_SECONDS
    disable_show_items: bool = False
    parent: str = ""
    problems: tuple[str, ...] = ()
    #: the namespace of the ElasticQuota holding the Queue's name (``koord-queue/quota-namespace``,
    #: written by the reconciler; empty: none recorded). docs/compatibility.md#same-named-quotas
    quota_holder: str = ""
    #: ``koord-queue/fair-order: namespace``: among units of equal priority, those of the namespace
    #: that used less of the quota lately go first (docs/compatibility.md#fair-order-inside-a-queue)
    fair_order: bool = False
    #: ``koord-queue/stopped: "true"``: an administrator stopped the queue; it admits nothing and
    #: its waiting units keep their places (docs/compatibility.md#stopping-a-queue)
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class Quota:
    """An ElasticQuota: ``max`` limits admission, ``min`` is guaranteed; ``parent`` empty means the root.

    ``extra_namespaces`` are the namespaces its ``quota.scheduling.koordinator.sh/namespaces``
    annotation binds besides its own; ``created`` and ``uid`` decide which of several same-named
    quotas counts (``shared.core.quota.winner_key``); ``max_user_priority`` is the admin's cap on the
    priority its jobs may ask for by annotation.

    ``is_parent``, ``lends`` and ``shared_weight`` are Koordinator's labels and annotation for the
    guarantee model (docs/compatibility.md#quota-guarantees): a parent takes no jobs, a quota that
    does not lend keeps its unused ``min`` to itself, and the weight divides spare capacity.
    """

    name: str
    namespace: str = ""
    parent: str = ""
    min: Resources = field(default_factory=dict)
    max: Resources = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    uid: str = ""
    created: float = 0.0
    extra_namespaces: frozenset[str] = frozenset()
    max_user_priority: int | None = None
    is_parent: bool = False
    lends: bool = True
    shared_weight: Resources | None = None
    #: The PriorityClasses its jobs may take their priority from; None: every class
    #: (docs/compatibility.md#priority-cap).
    allowed_priority_classes: frozenset[str] | None = None
    #: The pool (ElasticQuotaProfile) this quota is the root of, empty when it roots none; such a
    #: root's ``max`` is read as its ``min`` (docs/pools.md#a-tree-roots-limit).
    pool: str = ""
    #: ``koord-queue/pool-quotas``: the quotas inside pools its units are admitted through, in order
    #: (docs/pools.md#fallback-between-pools).
    pool_quotas: tuple[str, ...] = ()

    @property
    def bound_namespaces(self) -> frozenset[str]:
        """The namespaces whose units may use this quota: its own plus the annotation's."""
        return self.extra_namespaces | {self.namespace}


def quota_name_of(labels: Mapping[str, str]) -> str | None:
    """The quota (and so queue) a unit maps to: the koordinator label, else the fallback label."""
    return labels.get(names.QUOTA_NAME_LABEL) or labels.get(names.QUOTA_NAME_LABEL_FALLBACK) or None


_UNIT_FIELDS = tuple(f.name for f in dataclasses.fields(Unit))
_UNIT_FIELD_SET = frozenset(_UNIT_FIELDS)


def evolve(unit: Unit, **changes: object) -> Unit:
    """``dataclasses.replace`` for :class:`Unit`, about 4x faster (it is on the admission path):
    fields are copied slot by slot instead of through ``__init__``. Values are not re-validated."""
    unknown = changes.keys() - _UNIT_FIELD_SET
    if unknown:
        raise TypeError(f"Unit has no field(s) {sorted(unknown)}")
    new = object.__new__(Unit)
    for name in _UNIT_FIELDS:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(unit, name))
    return new


def with_grants(unit: Unit, grants: Mapping[str, int], *, phase: str, message: str, now: float) -> Unit:
    """The unit as it looks once an admission is written: ``replicas += granted`` per pod set.

    Missing pod sets are appended with ``running=0`` (upstream's dequeue). The reconciler uses this
    to *assume* the admission into its cache before the API write (docs/architecture.md#assume-and-forget).
    """
    admissions = list(unit.admissions)
    for podset in sorted(grants):
        granted = grants[podset]
        for i, adm in enumerate(admissions):
            if adm.name == podset:
                admissions[i] = dataclasses.replace(adm, replicas=adm.replicas + granted)
                break
        else:
            admissions.append(Admission(name=podset, replicas=granted, running=0))
    return evolve(
        unit,
        admissions=tuple(admissions),
        phase=phase,
        message=message,
        last_allocate_time=now,
        last_update_time=now,
    )


def with_reclaim(unit: Unit, reclaim: Mapping[str, int], *, message: str, now: float) -> Unit:
    """The victim as it looks once marked: ``reclaimState.replicas`` set on the named admissions."""
    admissions = tuple(
        dataclasses.replace(adm, reclaim_replicas=reclaim[adm.name]) if adm.name in reclaim else adm
        for adm in unit.admissions
    )
    return evolve(unit, admissions=admissions, message=message, last_update_time=now)

"""The component configuration file, ``KoordQueueConfiguration``
(docs/compatibility.md#component-configuration).

``--config`` names a YAML file of ``apiVersion: scheduling.k8s.io/v1``, ``kind:
KoordQueueConfiguration`` (the older ``KubeQueueConfiguration`` is accepted too). What changes our
behaviour:

* ``defaultReclaimProtectTime``: a unit admitted less than this long ago is no preemption victim;
* ``quotaNamespaceBinding`` (default true): a quota serves only jobs of its own namespace and of the
  namespaces its ``quota.scheduling.koordinator.sh/namespaces`` annotation lists; false restores
  upstream's unchecked behaviour (any job may name any quota);
* ``quotaGuarantees`` (default true): below a parent quota, ``min`` is guaranteed, unused ``min``
  is lent, spare capacity is shared by weight and a quota within its ``min`` reclaims from borrowing
  siblings (docs/compatibility.md#quota-guarantees); false restores upstream's max-only admission;
* ``publishQuotaStatus`` (default true): the reconciler writes ``status.used`` and the runtime,
  request and borrowed annotations on ElasticQuotas; false where koord-scheduler owns them;
* ``maxUserPriority`` (default unset: no cap): the largest priority a job may ask for with the
  ``scheduling.x-k8s.io/priority`` annotation; larger values are clamped (PriorityClass values,
  which admins control, are not);
* ``jobRunningTimeout`` (default: all off): per job extension, ``runningTimeout``,
  ``backoffTimeout`` and ``partialRunningTimeout`` (upstream's per-extension argument names), with
  a ``default`` entry whose fields an extension's entry overrides one by one
  (docs/compatibility.md#running-timeout, ``shared.jobs.running_timeout``); ours, ``noPodsTimeout``
  (default 60s, 0 off): how long an admitted, resumed batch/v1 Job may have no pod at all before it
  is requeued (docs/compatibility.md#jobs-without-pods, ``shared.jobs.stranded``);
* ``nativeGangHandoff`` (default false): hand the all-or-nothing placement of gang pod sets to
  kube-scheduler's own gang scheduling through the alpha Workload API (``scheduling.k8s.io/v1alpha1``,
  feature gates ``GenericWorkload`` and ``GangScheduling``); refused with an error at start-up when
  the cluster does not serve it (docs/compatibility.md#native-gang-hand-off,
  ``shared.core.workloadref``).
* ``scheduledEvents`` (default ``AfterWait``): when a QueueUnit gets the Normal event ``Scheduled``
  "dequeue success". ``AfterWait`` records it only for a unit that waited first (it was parked with a
  reason, requeued, or went through admission checks), so its ``FailedScheduling`` history ends with
  the admission; a unit admitted by the first cycle that sees it gets none, because its status already
  says so and the event is one apiserver write per job. ``Always`` restores upstream's event on every
  admission (docs/compatibility.md#events).

* ``usageHalfLife`` (default ``1h``; ``0s`` turns it off): the half-life of each quota's decayed
  usage, which orders spare capacity among sibling quotas by what they used lately
  (docs/compatibility.md#fair-over-time, ``shared.core.history``).

* ``manageJobsWithoutQuotaName`` (default false) with ``managedJobsNamespaceSelector`` (default:
  every namespace but ``kube-system`` and the install namespace): every job of an enabled kind in a selected
  namespace is queued, an unlabelled one on the namespace's default quota
  (docs/operations.md#mandatory-queueing, ``shared.core.mandatory``).

``plugins`` and ``pluginConfigs`` are accepted for compatibility with upstream files and otherwise
ignored. Unknown keys are reported, not ignored silently, so a typo does not turn protection off
without a word.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from koord_queue.shared.api.durations import DurationError, parse_duration
from koord_queue.shared.api.goparse import INT32_MAX, INT32_MIN
from koord_queue.shared.core import mandatory
from koord_queue.shared.core.history import DEFAULT_HALF_LIFE_SECONDS
from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.running_timeout import RunningTimeout, RunningTimeouts

API_VERSION: Final = "scheduling.k8s.io/v1"
KINDS: Final = ("KoordQueueConfiguration", "KubeQueueConfiguration")
_KNOWN: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "plugins",
        "pluginConfigs",
        "defaultReclaimProtectTime",
        "quotaNamespaceBinding",
        "quotaGuarantees",
        "publishQuotaStatus",
        "maxUserPriority",
        "jobRunningTimeout",
        "nativeGangHandoff",
        "scheduledEvents",
        "manageJobsWithoutQuotaName",
        "managedJobsNamespaceSelector",
        "usageHalfLife",
    }
)
#: ``jobRunningTimeout`` entries: field name in the file -> ``RunningTimeout`` attribute.
_TIMEOUT_FIELDS: Final = {
    "runningTimeout": "running_timeout",
    "backoffTimeout": "backoff_timeout",
    "partialRunningTimeout": "partial_running_timeout",
    "noPodsTimeout": "no_pods_timeout",
}
#: The ``jobRunningTimeout`` entry every extension inherits from.
DEFAULT_TIMEOUTS: Final = "default"


class ScheduledEvents(enum.StrEnum):
    """Which admissions get the unit event ``Scheduled`` (``scheduledEvents``)."""

    AFTER_WAIT = "AfterWait"
    ALWAYS = "Always"


class ConfigError(ValueError):
    """The configuration file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Settings:
    #: Seconds after ``lastAllocateTime`` during which a unit cannot be a preemption victim.
    reclaim_protect_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: A quota serves only units of the namespaces it is bound to (``quotaNamespaceBinding``).
    quota_namespace_binding: bool = True
    #: ``min`` guaranteed, lending and fair shares below parent quotas (``quotaGuarantees``).
    quota_guarantees: bool = True
    #: Write ``status.used`` and the runtime/request/borrowed annotations (``publishQuotaStatus``).
    publish_quota_status: bool = True
    #: Cluster-wide cap on the priority a job may ask for by annotation (``maxUserPriority``).
    max_user_priority: int | None = None
    #: Per job extension running, backoff and partial running timeouts (``jobRunningTimeout``).
    running_timeouts: RunningTimeouts = field(default_factory=RunningTimeouts)
    #: Hand gangs to kube-scheduler through the Workload API (``nativeGangHandoff``, default off).
    native_gang_handoff: bool = False
    #: Which admissions get the unit event ``Scheduled`` (``scheduledEvents``, default ``AfterWait``).
    scheduled_events: ScheduledEvents = ScheduledEvents.AFTER_WAIT
    #: Namespaces where unlabelled jobs are queued too (``manageJobsWithoutQuotaName``,
    #: ``managedJobsNamespaceSelector``; docs/operations.md#mandatory-queueing). Off by default.
    mandatory_queueing: mandatory.MandatoryQueueing = field(default_factory=mandatory.MandatoryQueueing)
    #: The half-life of the quotas' usage history in seconds (``usageHalfLife``; 0: off).
    usage_half_life_seconds: float = DEFAULT_HALF_LIFE_SECONDS


def _duration(doc: dict[str, Any], key: str, source: str, default: float) -> float:
    """A non-negative Go duration field (``5m``, ``1h``), or a number of seconds."""
    raw = doc.get(key)
    return default if raw is None else duration(raw, f"{source}: {key}")


def duration(raw: object, where: str) -> float:
    """A non-negative Go duration (``5m``, ``1h``) or a number of seconds; ``ConfigError`` naming
    ``where`` (a file's key, or a flag) otherwise."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"{where}: expected a duration such as 5m, got {raw!r}")
    try:
        value = parse_duration(raw) if isinstance(raw, str) else float(raw)
    except DurationError as err:
        raise ConfigError(f"{where}: {err}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: must be a finite, non-negative duration")
    return value


def _switch(doc: dict[str, Any], key: str, source: str, *, default: bool = True) -> bool:
    """A boolean field (true unless ``default`` says otherwise)."""
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
    return value


def parse(text: str, *, source: str = "config") -> Settings:
    try:
        doc: Any = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        raise ConfigError(f"{source}: not valid YAML: {type(err).__name__}") from None
    if doc is None:
        return Settings()
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") not in KINDS:
        raise ConfigError(
            f"{source}: expected apiVersion {API_VERSION} and kind {KINDS[0]}, got "
            f"{doc.get('apiVersion')!r} / {doc.get('kind')!r}"
        )
    warnings = tuple(f"{source}: unknown field {key!r} ignored" for key in sorted(set(doc) - _KNOWN))
    protect = _duration(doc, "defaultReclaimProtectTime", source, 0.0)
    binding = _switch(doc, "quotaNamespaceBinding", source)
    guarantees = _switch(doc, "quotaGuarantees", source)
    publish = _switch(doc, "publishQuotaStatus", source)
    native_gangs = _switch(doc, "nativeGangHandoff", source, default=False)
    raw_events = doc.get("scheduledEvents", ScheduledEvents.AFTER_WAIT.value)
    if not isinstance(raw_events, str) or raw_events not in {member.value for member in ScheduledEvents}:
        choices = " or ".join(member.value for member in ScheduledEvents)
        raise ConfigError(f"{source}: scheduledEvents: expected {choices}, got {raw_events!r}")
    cap = doc.get("maxUserPriority")
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not INT32_MIN <= cap <= INT32_MAX
    ):
        raise ConfigError(
            f"{source}: maxUserPriority: expected a 32-bit integer (or no value for no cap), got {cap!r}"
        )
    timeouts, timeout_warnings = _running_timeouts(doc.get("jobRunningTimeout"), source)
    try:
        selector = mandatory.parse_selector(
            doc.get("managedJobsNamespaceSelector"), f"{source}: managedJobsNamespaceSelector"
        )
    except mandatory.SelectorError as err:
        raise ConfigError(str(err)) from None
    queueing = mandatory.MandatoryQueueing(
        enabled=_switch(doc, "manageJobsWithoutQuotaName", source, default=False), selector=selector
    )
    return Settings(
        reclaim_protect_seconds=protect,
        warnings=warnings + timeout_warnings,
        quota_namespace_binding=binding,
        quota_guarantees=guarantees,
        publish_quota_status=publish,
        max_user_priority=cap,
        running_timeouts=timeouts,
        native_gang_handoff=native_gangs,
        scheduled_events=ScheduledEvents(raw_events),
        mandatory_queueing=queueing,
        usage_half_life_seconds=_duration(doc, "usageHalfLife", source, DEFAULT_HALF_LIFE_SECONDS),
    )


def _running_timeouts(raw: object, source: str) -> tuple[RunningTimeouts, tuple[str, ...]]:
    """``jobRunningTimeout``: ``{default: {...}, <extension>: {...}}``, each entry holding any of
    ``runningTimeout``, ``backoffTimeout`` and ``partialRunningTimeout``. An extension's entry
    inherits every field it does not set from ``default``; unknown extensions and fields are
    reported as warnings (like unknown top-level keys), wrong types and bad durations refused."""
    where = f"{source}: jobRunningTimeout"
    if raw is None:
        return RunningTimeouts(), ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of job extension name to timeouts, got {raw!r}")
    known = (DEFAULT_TIMEOUTS, *registry.EXTENSIONS)
    warnings: list[str] = []
    entries: dict[str, dict[str, float]] = {}
    for name in sorted(raw, key=str):
        if name not in known:
            warnings.append(f"{where}: unknown job extension {name!r} ignored; known: {', '.join(known)}")
            continue
        body = raw[name]
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(f"{where}.{name}: expected a mapping of timeouts, got {body!r}")
        for key in sorted(set(body) - _TIMEOUT_FIELDS.keys(), key=str):
            warnings.append(f"{where}.{name}: unknown field {key!r} ignored")
        entries[name] = {
            attr: duration(body[key], f"{where}.{name}.{key}")
            for key, attr in _TIMEOUT_FIELDS.items()
            if body.get(key) is not None
        }
    default = RunningTimeout(**entries.pop(DEFAULT_TIMEOUTS, {}))
    per_extension = tuple(
        (name, dataclasses.replace(default, **fields)) for name, fields in sorted(entries.items())
    )
    return RunningTimeouts(default=default, per_extension=per_extension), tuple(warnings)


def load(path: Path) -> Settings:
    """Read and parse ``path`` (the only I/O here: the caller's process reads its own config)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    return parse(text, source=str(path))

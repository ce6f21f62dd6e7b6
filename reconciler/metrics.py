"""Prometheus metrics of the reconciler, served on :10259 (docs/compatibility.md#metrics).

Upstream's names are kept so existing dashboards work, and every metric declared here is populated
(upstream declares several it never sets). Our own metrics carry the ``koord_queue_`` prefix and
base units with their suffix (``_seconds``, ``_total``); where an upstream name breaks that (the
cycle latency in milliseconds) both are exported, the upstream one for compatibility only. The
private registry also carries the process metrics, the build info, the leader gauge and the
certificate expiry (``shared/telemetry.py``), so one scrape tells an operator which release runs,
whether this replica leads, and how long its serving certificate has left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from koord_queue.certs import pki
from koord_queue.shared import telemetry

REGISTRY = CollectorRegistry(auto_describe=True)
telemetry.register_process_metrics(REGISTRY)

JOB_SCHEDULE_ATTEMPTS = Counter(
    "job_schedule_attempts",
    "Scheduling attempts by queue and result (scheduled, unschedulable).",
    ["queue", "result"],
    registry=REGISTRY,
)
QUEUEUNITS_IN_ACTIVE_QUEUE = Gauge(
    "queueunits_in_active_queue",
    "QueueUnits waiting for admission, by queue.",
    ["queue"],
    registry=REGISTRY,
)
QUEUEUNITS_IN_BACKOFF_QUEUE = Gauge(
    "queueunits_in_backoff_queue",
    "QueueUnits in TimeoutBackoff, by queue.",
    ["queue"],
    registry=REGISTRY,
)
DEQUEUED_QUOTA_USAGE = Gauge(
    "dequeued_quota_usage_by_quota",
    "Resources reserved by admitted QueueUnits, by quota.",
    ["quota", "resource"],
    registry=REGISTRY,
)
#: Upstream's name and unit (milliseconds), kept for compatibility: new dashboards and alerts use
#: :data:`SCHEDULING_CYCLE`, the same observations in seconds. Both are fed by :func:`observe_cycle`.
SCHEDULING_LATENCY = Histogram(
    "job_scheduling_algorithm_latency",
    "Decision time of one scheduling cycle, in milliseconds (upstream's name, kept for compatibility; "
    "koord_queue_scheduling_cycle_duration_seconds is the same in seconds).",
    buckets=[0.01 * 2**i for i in range(15)],
    registry=REGISTRY,
)
SCHEDULING_CYCLE = Histogram(
    "koord_queue_scheduling_cycle_duration_seconds",
    "Decision time of one scheduling cycle.",
    buckets=[0.00001 * 2**i for i in range(15)],
    registry=REGISTRY,
)


def observe_cycle(seconds: float) -> None:
    """One scheduling cycle's decision time, into both histograms (same buckets, scaled)."""
    SCHEDULING_CYCLE.observe(seconds)
    SCHEDULING_LATENCY.observe(seconds * 1000)


QUEUEUNITS_BY_JOB_TYPE = Gauge(
    "queueunits_by_job_type",
    "QueueUnits by namespace and consumer kind.",
    ["namespace", "type"],
    registry=REGISTRY,
)
ADMISSION_WAIT = Histogram(
    "koord_queue_admission_wait_seconds",
    "Time from QueueUnit creation to admission, by queue.",
    ["queue"],
    buckets=[0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600],
    registry=REGISTRY,
)
PREEMPTION_ROUNDS = Counter(
    "koord_queue_preemption_rounds_total",
    "Preemption rounds that marked victims, by queue.",
    ["queue"],
    registry=REGISTRY,
)
PREEMPTION_VICTIMS = Counter(
    "koord_queue_preemption_victims_total",
    "QueueUnits marked for reclaim, by queue.",
    ["queue"],
    registry=REGISTRY,
)
RECLAIMED_PODS = Counter(
    "koord_queue_reclaimed_pods_total",
    "Unbound pods deleted to reclaim quota.",
    registry=REGISTRY,
)
#: Released pods deleted because nothing accounted for them: ``unadmitted`` (out of the gate
#: beyond the admission, UnadmittedPodDeleted) or ``escaped`` (naming a unit, not its job's,
#: EscapedPodDeleted). Either means something got past the queue's door: worth an alert.
UNQUEUED_PODS_DELETED = Counter(
    "koord_queue_unqueued_pods_deleted_total",
    "Released pods deleted because no admission accounted for them, by reason (unadmitted, escaped).",
    ["reason"],
    registry=REGISTRY,
)
for _reason in ("unadmitted", "escaped"):
    UNQUEUED_PODS_DELETED.labels(_reason)  # exported at 0 from the start, so alerts see the series
#: Bound pods seen running past what their unit's admission holds, each counted once
#: (docs/compatibility.md#reclaim-and-usage-reports): the admission is never grown to fit them.
PODS_BEYOND_ADMISSION = Counter(
    "koord_queue_pods_beyond_admission_total",
    "Bound pods seen running beyond what their QueueUnit's admission holds (each pod counted once).",
    registry=REGISTRY,
)
#: Admitted jobs requeued because they had no pod for ``noPodsTimeout``, each requeue counted
#: once (docs/compatibility.md#jobs-without-pods): a job controller that loses jobs shows here.
JOBS_WITHOUT_PODS_REQUEUED = Counter(
    "koord_queue_jobs_without_pods_requeued_total",
    "Admitted, resumed jobs requeued because they had no pod for noPodsTimeout, by kind.",
    ["kind"],
    registry=REGISTRY,
)
JOBS_WITHOUT_PODS_REQUEUED.labels("Job")  # exported at 0 from the start, so alerts see the series
PROTECTION_SKIPS = Counter(
    "koord_queue_preemption_protected_skips_total",
    "Candidate victims skipped because they were admitted within the reclaim protect time.",
    ["queue"],
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "koord_queue_api_requests_total",
    "Requests the reconciler sent to the apiserver, by verb (GET, LIST, WATCH, POST, PATCH, PUT, DELETE).",
    ["verb"],
    registry=REGISTRY,
)
_api_request_children: dict[str, Any] = {}


def count_api_request(verb: str) -> None:
    """``Kube.on_request`` hook; the labelled child is looked up once per verb, not per request."""
    child = _api_request_children.get(verb)
    if child is None:
        child = _api_request_children[verb] = API_REQUESTS.labels(verb)
    child.inc()


API_ERRORS = Counter(
    "koord_queue_api_errors_total",
    "Apiserver requests that failed, by verb and HTTP status code (0: no response, a transport error "
    "or timeout). 404 and 409 are routine answers to lookups and optimistic writes; 401, 403, 429 "
    "and 5xx are worth an alert.",
    ["verb", "code"],
    registry=REGISTRY,
)
_api_error_children: dict[tuple[str, int], Any] = {}


def count_api_error(verb: str, status: int) -> None:
    """``Kube.on_error`` hook. Label values are bounded: verbs are ours, codes are HTTP statuses."""
    key = (verb, status)
    child = _api_error_children.get(key)
    if child is None:
        child = _api_error_children[key] = API_ERRORS.labels(verb, str(status))
    child.inc()


# --- leadership and certificates (docs/operations.md#reconciler-metrics) ------------------------------


class _Gate(Protocol):
    """What the leader gauge reads: ``kube.Leadership`` (not imported, to keep this module free of
    the API client)."""

    @property
    def leading(self) -> bool: ...


LEADER = Gauge(
    "koord_queue_leader",
    "1 while this replica holds the leader Lease and acts, 0 while it follows (read at scrape time).",
    ["component"],
    registry=REGISTRY,
)


def watch_leadership(leadership: _Gate, component: str = "reconciler") -> None:
    """Export ``koord_queue_leader{component}`` as ``leadership.leading`` at each scrape, so the
    gauge follows the gate every write passes, not a copy that a missed transition would leave
    stale."""
    LEADER.labels(component).set_function(lambda: 1.0 if leadership.leading else 0.0)


CERTIFICATES = telemetry.CertificateExpiry()
REGISTRY.register(CERTIFICATES)
#: a certificate is parsed once, not at every scrape (the PEM in force changes at rotation only)
_not_after = functools.lru_cache(maxsize=8)(pki.not_after)


def watch_certificate(purpose: str, cert_pem: Callable[[], bytes | None]) -> None:
    """Export the expiry of the certificate ``cert_pem()`` returns (the one in force, None while
    there is none) as ``koord_queue_certificate_expiry_timestamp_seconds{component="reconciler",
    purpose}``."""

    def expiry() -> datetime | None:
        pem = cert_pem()
        return None if pem is None else _not_after(pem)

    CERTIFICATES.watch("reconciler", purpose, expiry)


# --- sizes of the stores and of the per-object maps, for leak hunting (bench/bench_soak.py) ---------

#: how deep :class:`StoreSizes` follows our objects from a root (scheduler → cache → state → queues)
_MAX_DEPTH = 5
_OURS = ("koord_queue.reconciler.", "koord_queue.shared.")


def _is_component(value: object, packages: tuple[str, ...], *, element: bool = False) -> bool:
    """One of our objects, worth looking inside: not a container (those are measured, not
    entered), an enum or a class. A container's elements are entered only if they are components
    themselves (one state per queue), not records (dataclasses: one per unit)."""
    return (
        type(value).__module__.startswith(packages)
        and not isinstance(value, enum.Enum | Sized | type)
        and not (element and dataclasses.is_dataclass(value))
    )


def _attributes(obj: object) -> Iterator[tuple[str, object]]:
    """An object's instance attributes, from ``__dict__`` and ``__slots__``."""
    yield from getattr(obj, "__dict__", {}).items()
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                yield name, getattr(obj, name)


def _size(value: object, packages: tuple[str, ...] = _OURS) -> int | None:
    """The number of entries of a container (an asyncio queue's backlog), None for anything else."""
    if isinstance(value, asyncio.Queue):
        return value.qsize()
    if isinstance(value, str | bytes | bytearray):
        return None
    if isinstance(value, tuple):
        # a record (an epoch pair, a name path) is not state that grows; a tuple of lanes is
        return len(value) if value and _size(value[0], packages) is not None else None
    if isinstance(value, Sized) and (
        isinstance(value, Mapping | AbstractSet | list | collections.deque)
        or type(value).__module__.startswith(packages)
    ):
        return len(value)
    return None


class StoreSizes:
    """A collector of ``koord_queue_store_objects{store=...}``: the size of every informer store and
    of every container held by the reconciler's components, measured when Prometheus scrapes.

    Why measured this way: the maps that outlive a deleted job are exactly the ones nobody thought
    of, so instead of a list of known maps (which a new map would silently escape) every container
    attribute of the components is measured, following our own objects down (the scheduler's cache,
    its state, each queue's state: ``scheduler.cache.state.queues[*].entries`` sums over queues).
    Values (enums, and dataclasses held in containers: one record per unit) are not entered, so a
    scrape costs a few hundred ``len`` calls whatever the number of jobs. Each container is counted
    once, under the first name it is met by; reads only, no side effect. ``asyncio:tasks`` and
    ``asyncio:timers`` count the event loop's tasks and scheduled callbacks (the ``call_later``
    retries), which hold per-job work too.
    """

    def __init__(
        self,
        informers: Iterable[Any],
        components: Mapping[str, object],
        *,
        skip: Iterable[object] = (),
        packages: tuple[str, ...] = _OURS,
    ) -> None:
        self.informers = list(informers)
        #: the module prefixes whose objects are entered
        self.packages = packages
        self.components = dict(components)
        #: shared objects that are not state (the API client, the leadership gate): never entered
        self.skip = list(skip)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(STORE_OBJECTS, _STORE_HELP, labels=["store"])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(STORE_OBJECTS, _STORE_HELP, labels=["store"])
        for name, value in sorted(self.sizes().items()):
            family.add_metric([name], value)
        yield family

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        seen = {id(o) for o in (*self.skip, *self.informers, *self.components.values())}
        for inf in self.informers:
            res = inf.resource
            name = f"informer:{res.plural}.{res.group}" if res.group else f"informer:{res.plural}"
            out[name] = out.get(name, 0) + len(inf.objects)
            seen.add(id(inf.objects))
        for name, component in self.components.items():
            if component is not None:
                self._measure(name, component, 0, seen, out)
        with contextlib.suppress(RuntimeError):  # no running loop: a test, or a scrape off-loop
            loop = asyncio.get_running_loop()
            out["asyncio:tasks"] = len(asyncio.all_tasks(loop))
            out["asyncio:timers"] = len(getattr(loop, "_scheduled", ()))
        return out

    def _measure(self, name: str, value: object, depth: int, seen: set[int], out: dict[str, int]) -> None:
        size = _size(value, self.packages)
        if size is not None:
            if id(value) in seen and depth > 0:
                return  # an alias of a container already counted
            seen.add(id(value))
            out[name] = out.get(name, 0) + size
            if isinstance(value, asyncio.Queue) or not size or depth >= _MAX_DEPTH:
                return
            items: Iterable[object] = ()
            if isinstance(value, dict):  # not other mappings: a view may compute its values
                items = value.values()
            elif isinstance(value, list | tuple):
                items = value
            first = next(iter(items), None)
            if first is not None and _is_component(first, self.packages, element=True):
                for item in items:
                    if id(item) not in seen:
                        seen.add(id(item))
                        for attr, inner in _attributes(item):
                            self._measure(f"{name}[*].{attr}", inner, depth + 1, seen, out)
            elif isinstance(value, list | tuple) and _size(first, self.packages) is not None:
                # a tuple of lanes, a list of queues: the entries they hold, summed
                inner = sum(_size(i, self.packages) or 0 for i in value)
                out[f"{name}[*]"] = out.get(f"{name}[*]", 0) + inner
            return
        if depth == 0 or (_is_component(value, self.packages) and id(value) not in seen):
            seen.add(id(value))
            if depth >= _MAX_DEPTH:
                return
            for attr, inner in _attributes(value):
                self._measure(f"{name}.{attr}", inner, depth + 1, seen, out)


STORE_OBJECTS = "koord_queue_store_objects"
_STORE_HELP = (
    "Entries of each informer store and of each map, set, list or queue the reconciler keeps "
    "(by attribute path), measured at scrape time; per-job state must return to its idle size "
    "once the jobs are gone."
)
_store_sizes: StoreSizes | None = None


def watch_stores(
    informers: Iterable[Any], components: Mapping[str, object], *, skip: Iterable[object] = ()
) -> StoreSizes:
    """Register (or replace, for a second ``run`` in one process) the store-size collector, and,
    when the components hold the scheduler, the decayed-usage collector reading its cache."""
    global _store_sizes
    if _store_sizes is not None:
        REGISTRY.unregister(_store_sizes)
    _store_sizes = StoreSizes(informers, components, skip=skip)
    REGISTRY.register(_store_sizes)
    scheduler = components.get("scheduler")
    if scheduler is not None and hasattr(scheduler, "cache"):
        watch_history(lambda: scheduler.cache)
    return _store_sizes


# --- usage history (docs/compatibility.md#fair-over-time) --------------------------------------------

DECAYED_USAGE = "koord_queue_quota_decayed_usage"
_DECAYED_HELP = (
    "Each quota's decayed average usage (usage history, half-life usageHalfLife), whole units "
    "(cores, bytes), as the scheduler holds it at scrape time; below a parent, siblings that used "
    "less of their share lately get spare capacity first."
)


class DecayedUsage:
    """A collector of ``koord_queue_quota_decayed_usage{quota, resource}``: each quota's decayed
    average, read from the scheduler's usage history (``cache.snapshot.history``) when Prometheus
    scrapes, so the cycle pays nothing for it. Nothing is exported while history is off, and a
    replica that does not lead folds nothing, so the series move on the leader only."""

    def __init__(self, cache: Callable[[], Any]) -> None:
        self.cache = cache

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(DECAYED_USAGE, _DECAYED_HELP, labels=["quota", "resource"])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(DECAYED_USAGE, _DECAYED_HELP, labels=["quota", "resource"])
        cache = self.cache()
        history = cache.snapshot.history
        if history.enabled:
            for quota in sorted(cache.ledger.quotas):
                for resource, value in sorted(history.usage(quota).items()):
                    family.add_metric([quota, resource], value / 1000)
        yield family


_decayed_usage: DecayedUsage | None = None


def watch_history(cache: Callable[[], Any]) -> DecayedUsage:
    """Register (or replace) the decayed-usage collector over the scheduler's cache."""
    global _decayed_usage
    if _decayed_usage is not None:
        REGISTRY.unregister(_decayed_usage)
    _decayed_usage = DecayedUsage(cache)
    REGISTRY.register(_decayed_usage)
    return _decayed_usage

"""Prometheus metrics of the reconciler, served on :10259 (docs/compatibility.md#metrics).

Upstream's names are kept so existing dashboards work, and every metric declared here is populated
(upstream declares several it never sets). Our own metrics carry the ``koord_queue_`` prefix.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

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
SCHEDULING_LATENCY = Histogram(
    "job_scheduling_algorithm_latency",
    "Decision time of one scheduling cycle, in milliseconds.",
    buckets=[0.01 * 2**i for i in range(15)],
    registry=REGISTRY,
)
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

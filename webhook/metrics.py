"""Prometheus metrics of the admission webhook: how many reviews, how they ended, how long they took.

The webhook sits on the apiserver's write path with ``failurePolicy: Fail`` for managed jobs, so
its latency is every user's latency: the histogram buckets are fine-grained below 10 ms (the
target p99) and the outcome counter separates policy denials from malformed input and internal
errors. Label values are bounded: ``kind`` is one of the kinds we know or ``other``, because the
request body is attacker-controlled and must not be able to mint time series.

Each :class:`WebhookMetrics` owns its own ``CollectorRegistry`` so several apps (tests) can live in
one process without duplicate-registration errors.
"""

from __future__ import annotations

import enum
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from shared.jobs import registry

_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_KNOWN_KINDS: Final = frozenset(
    {adapter.kind for adapter in registry.ADAPTERS} | {"Queue", "QueueUnit", "ElasticQuota"}
)
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST


class Result(enum.StrEnum):
    """How one review ended (the ``result`` label)."""

    ALLOWED = "allowed"
    PATCHED = "patched"
    DENIED = "denied"
    MALFORMED = "malformed"
    TOO_LARGE = "too_large"
    ERROR = "error"


def kind_label(kind: str) -> str:
    """``kind`` when we know it, ``unknown`` when the body had none (malformed), else ``other``."""
    return kind if kind in _KNOWN_KINDS or kind == "unknown" else "other"


class WebhookMetrics:
    """The webhook's collectors, registered in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("operation", "kind", "result")
        self.latency = Histogram(
            "koord_queue_webhook_request_duration_seconds",
            "Time to answer one AdmissionReview, from body read to response built.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "koord_queue_webhook_requests",
            "AdmissionReviews answered, by operation (mutate/validate), object kind and result.",
            labels,
            registry=self.registry,
        )
        self.certificate_reloads = Counter(
            "koord_queue_webhook_certificate_reloads",
            "Serving-certificate reload attempts after the files changed, by result (ok/failed).",
            ("result",),
            registry=self.registry,
        )

    def observe(self, *, operation: str, kind: str, result: Result, seconds: float) -> None:
        label = kind_label(kind)
        self.latency.labels(operation, label, result.value).observe(seconds)
        self.requests.labels(operation, label, result.value).inc()

    def render(self) -> bytes:
        """The text exposition format, for ``GET /metrics``."""
        return generate_latest(self.registry)

"""Prometheus metrics of the admission webhook: how many reviews, how they ended, how long they took.

The webhook sits on the apiserver's write path with ``failurePolicy: Fail`` for managed jobs, so
its latency is every user's latency: the histogram buckets are fine-grained below 10 ms (the
target p99) and the outcome counter separates policy denials from malformed input and internal
errors. Label values are bounded: ``kind`` is one of the kinds we know or ``other``, because the
request body is attacker-controlled and must not be able to mint time series.

Each :class:`WebhookMetrics` owns its own ``CollectorRegistry`` so several apps (tests) can live in
one process without duplicate-registration errors; the process metrics, the build info and the
serving certificate's expiry are registered on it too (``shared/telemetry.py``).

The request path only appends ``(operation, kind, result, seconds)`` to a list
(:meth:`WebhookMetrics.observe_since`); the list is applied to the collectors every
``FLUSH_EVERY`` reviews and before every scrape (:meth:`WebhookMetrics.render`), so ``/metrics``
always shows every review answered so far while the per-sample locks and calls of
``prometheus_client`` run in a batch, off the path of the review being answered.
"""

from __future__ import annotations

import enum
import time
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from koord_queue.shared import telemetry
from koord_queue.shared.jobs import registry

_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_KNOWN_KINDS: Final = frozenset(
    {adapter.kind for adapter in registry.ADAPTERS} | {"Queue", "QueueUnit", "ElasticQuota", "Pod"}
)
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
FLUSH_EVERY: Final = 64


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
        telemetry.register_process_metrics(self.registry)
        #: the serving certificate's expiry; ``webhook/server.py`` adds the source when TLS is on
        self.certificates = telemetry.CertificateExpiry()
        self.registry.register(self.certificates)
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
        # Labelled children by (operation, kind label, result): ``labels()`` costs a lock, string
        # conversions and a dict lookup per call. Bounded like the label values themselves.
        self._children: dict[tuple[str, str, str], tuple[Histogram, Counter]] = {}
        self._pending: list[tuple[str, str, Result, float]] = []

    def observe(self, *, operation: str, kind: str, result: Result, seconds: float) -> None:
        key = (operation, kind_label(kind), result.value)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.latency.labels(*key), self.requests.labels(*key))
        children[0].observe(seconds)
        children[1].inc()

    def observe_since(self, operation: str, kind: str, result: Result, started: float) -> None:
        """Record a review that started at ``time.perf_counter()`` value ``started`` (applied in a
        batch by :meth:`flush`)."""
        pending = self._pending
        pending.append((operation, kind, result, time.perf_counter() - started))
        if len(pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Apply the reviews recorded by :meth:`observe_since` to the collectors."""
        pending, self._pending = self._pending, []
        for operation, kind, result, seconds in pending:
            self.observe(operation=operation, kind=kind, result=result, seconds=seconds)

    def render(self) -> bytes:
        """The text exposition format, for ``GET /metrics`` (every review recorded so far)."""
        self.flush()
        return generate_latest(self.registry)

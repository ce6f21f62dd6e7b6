"""Metrics both processes export the same way (docs/operations.md#metrics-and-the-dashboard).

Each process keeps a private ``CollectorRegistry`` (several webhook apps live in one test process;
the reconciler's registry is not the client library's global one), and a private registry starts
empty: the process, platform and garbage-collector collectors that the global registry carries
must be registered on it by hand, or memory, CPU, open files and restarts go unseen. The build
and certificate metrics are written once here so that the two processes name and label them
alike, which is what lets one dashboard and one alert cover both.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Gauge, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric

BUILD_INFO = "koord_queue_build_info"
CERTIFICATE_EXPIRY = "koord_queue_certificate_expiry_timestamp_seconds"
_CERTIFICATE_HELP = (
    "notAfter of the certificate in force, as a Unix timestamp, by component and purpose; absent "
    "until one is loaded."
)

#: Where a certificate's expiry comes from: the one in force now, or None while there is none.
ExpirySource = Callable[[], datetime | None]


def version() -> str:
    """The installed package's version (the wheel's metadata), ``unknown`` when run from a tree
    that was never installed."""
    try:
        return importlib.metadata.version("koord-queue-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register_process_metrics(registry: CollectorRegistry) -> None:
    """``process_*`` (CPU, resident memory, open files, start time), ``python_info`` and
    ``python_gc_*`` on a private registry, as the global registry would have them, plus
    ``koord_queue_build_info{version, python} 1``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    build = Gauge(
        BUILD_INFO,
        "Always 1; the labels say which release (package version) and Python this process runs.",
        ["version", "python"],
        registry=registry,
    )
    build.labels(version(), platform.python_version()).set(1)


class CertificateExpiry:
    """A collector of ``koord_queue_certificate_expiry_timestamp_seconds{component, purpose}``:
    the expiry of each certificate a process serves, read when Prometheus scrapes from whatever
    holds the certificate in force, so a reload or a rotation shows without a hook in the path
    that swaps it. Registered empty (the family is always described); sources join as the
    servers start."""

    def __init__(self) -> None:
        self.sources: dict[tuple[str, str], ExpirySource] = {}

    def watch(self, component: str, purpose: str, source: ExpirySource) -> None:
        """Report ``source``'s expiry as ``{component, purpose}`` (replacing an earlier source)."""
        self.sources[(component, purpose)] = source

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(CERTIFICATE_EXPIRY, _CERTIFICATE_HELP, labels=["component", "purpose"])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(CERTIFICATE_EXPIRY, _CERTIFICATE_HELP, labels=["component", "purpose"])
        for (component, purpose), source in sorted(self.sources.items()):
            expiry = source()
            if expiry is not None:
                family.add_metric([component, purpose], expiry.timestamp())
        yield family

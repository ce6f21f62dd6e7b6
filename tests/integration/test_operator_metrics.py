"""The operator's metrics of the running processes (docs/operations.md#metrics-and-the-dashboard): the
session's reconciler (no leader election, visibility certificates managed) and webhook (TLS from
files) are scraped on their ``/metrics`` ports.

* the reconciler says it leads, which release and Python it runs, its memory and CPU, and the
  expiry of the visibility certificate it serves, equal to the notAfter of the certificate in the
  Secret it manages;
* the webhook says the same of itself, and its expiry is the notAfter of the certificate it
  presents in a real TLS handshake;
* the cycle time (a unit admitted in a fresh namespace) is exported in seconds beside upstream's
  milliseconds, with the same count and sum.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import ssl

import pytest
from prometheus_client.parser import text_string_to_metric_families

from koord_queue.certs import pki
from koord_queue.shared.api import names
from testenv import scraping, system
from testenv.cluster import LocalCluster
from tests import kube
from tests import scenario as sc

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
EXPIRY = "koord_queue_certificate_expiry_timestamp_seconds"


def scrape(port: int) -> tuple[Samples, set[str]]:
    """Every sample by name and sorted labels, and every family name (with or without samples)."""
    text = scraping.metrics_text(port)  # as the local system's scraper (docs/operations.md#metrics)
    families = list(text_string_to_metric_families(text))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    return samples, {f.name for f in families}


def port_of(processes: system.Processes, component: str, port: str) -> int:
    return next(c.ports[port] for c in processes.components if c.name == component)


def common(samples: Samples) -> None:
    version = importlib.metadata.version("koord-queue-py")
    builds = [labels for name, labels in samples if name == "koord_queue_build_info"]
    assert len(builds) == 1 and ("version", version) in builds[0], builds
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in samples


async def test_the_reconciler_exports_leadership_build_and_its_visibility_certificates_expiry(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> None:
    port = port_of(system_integration, "reconciler", "metrics")
    labels = (("component", "reconciler"), ("purpose", "visibility-serving"))

    async def in_force() -> tuple[Samples, set[str], float] | None:
        # the Secret is written by the certificate manager; the server takes it up a moment later
        out = kube.kubectl(
            integration_cluster,
            *("get", "secret", "koord-queue-visibility-cert", "-n", names.COMPONENT_NAMESPACE, "-o", "json"),
            check=False,
        )
        if out.returncode != 0:
            return None
        cert = base64.b64decode(json.loads(out.stdout)["data"]["tls.crt"])
        expected = pki.not_after(cert).timestamp()
        samples, families = scrape(port)
        return (samples, families, expected) if samples.get((EXPIRY, labels)) == expected else None

    samples, families, expected = await kube.eventually(
        in_force, timeout=30, what="the visibility certificate's expiry equal to its Secret's"
    )
    assert expected > samples[("process_start_time_seconds", ())]
    assert samples[("koord_queue_leader", (("component", "reconciler"),))] == 1.0
    common(samples)
    assert "koord_queue_api_errors" in families  # declared from the start, a series per (verb, code)

    # a quota and a unit to admit: scheduling cycles run
    for obj in (sc.quota(f"metrics-{namespace_in}", cpu="2"), sc.unit("u", quota=f"metrics-{namespace_in}")):
        kube.kubectl(integration_cluster, "apply", "-n", namespace_in, "-f", "-", input_text=json.dumps(obj))

    async def cycles_in_both_units() -> Samples | None:
        now, _ = scrape(port)
        count = now.get(("koord_queue_scheduling_cycle_duration_seconds_count", ()), 0.0)
        upstream = now.get(("job_scheduling_algorithm_latency_count", ()), 0.0)
        return now if count > 0 and count == upstream else None

    now = await kube.eventually(cycles_in_both_units, what="cycle time in seconds and milliseconds")
    seconds = now[("koord_queue_scheduling_cycle_duration_seconds_sum", ())]
    assert now[("job_scheduling_algorithm_latency_sum", ())] == pytest.approx(seconds * 1000)


def test_the_webhook_exports_the_expiry_of_the_certificate_it_presents(
    system_integration: system.Processes,
) -> None:
    https = port_of(system_integration, "webhook", "https")
    presented = ssl.get_server_certificate(("127.0.0.1", https)).encode()
    samples, _ = scrape(port_of(system_integration, "webhook", "metrics"))
    labels = (("component", "webhook"), ("purpose", "serving"))
    assert samples[(EXPIRY, labels)] == pki.not_after(presented).timestamp()
    common(samples)

"""The metrics an operator relies on beside the queue's own (docs/operations.md#metrics-and-the-dashboard):
the cycle time in seconds next to upstream's milliseconds, the process metrics and the build info on
both private registries, the leader gauge, the serving certificates' expiry, and API errors by code.
Every check reads the text a scrape returns (``generate_latest``), not the collector objects."""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from koord_queue.certs import pki
from koord_queue.reconciler import metrics as reconciler_metrics
from koord_queue.reconciler import visibility
from koord_queue.shared import kube, kubeconfig
from koord_queue.webhook import server
from koord_queue.webhook.metrics import WebhookMetrics


def samples(text: bytes | str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels."""
    body = text.decode() if isinstance(text, bytes) else text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return samples(generate_latest(registry)).get((name, tuple(sorted(labels.items()))))


def reconciler(name: str, **labels: str) -> float | None:
    return value(reconciler_metrics.REGISTRY, name, **labels)


# --- units -------------------------------------------------------------------------------------------


def test_a_cycle_is_observed_in_seconds_and_in_upstreams_milliseconds() -> None:
    seconds, millis = "koord_queue_scheduling_cycle_duration_seconds", "job_scheduling_algorithm_latency"
    before = (reconciler(f"{seconds}_sum") or 0, reconciler(f"{millis}_sum") or 0)
    count = reconciler(f"{seconds}_count") or 0
    reconciler_metrics.observe_cycle(0.004)
    assert reconciler(f"{seconds}_sum") == pytest.approx(before[0] + 0.004)
    assert reconciler(f"{millis}_sum") == pytest.approx(before[1] + 4.0)
    assert reconciler(f"{seconds}_count") == count + 1
    # same buckets, scaled: the 0.004 s observation lands below the same bound in both
    assert reconciler(f"{seconds}_bucket", le="0.00512") == reconciler(f"{millis}_bucket", le="5.12")


# --- process metrics and build info ------------------------------------------------------------------


@pytest.mark.parametrize("registry", ["reconciler", "webhook"])
def test_both_registries_carry_the_process_metrics_and_the_build_info(registry: str) -> None:
    reg = reconciler_metrics.REGISTRY if registry == "reconciler" else WebhookMetrics().registry
    scraped = samples(generate_latest(reg))
    names = {name for name, _ in scraped}
    assert {
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_start_time_seconds",
    } <= names
    assert "python_info" in names and "python_gc_collections_total" in names
    version = importlib.metadata.version("koord-queue-py")
    build = (("python", platform.python_version()), ("version", version))
    assert scraped[("koord_queue_build_info", build)] == 1.0
    assert scraped[("process_resident_memory_bytes", ())] > 0


# --- leadership --------------------------------------------------------------------------------------


def test_the_leader_gauge_follows_the_gate() -> None:
    gate = kube.Leadership(leading=False)
    reconciler_metrics.watch_leadership(gate)
    assert reconciler("koord_queue_leader", component="reconciler") == 0.0
    gate.acquire()
    assert reconciler("koord_queue_leader", component="reconciler") == 1.0
    gate.release()
    assert reconciler("koord_queue_leader", component="reconciler") == 0.0


# --- certificates ------------------------------------------------------------------------------------


def serving_pair(days: int) -> pki.KeyPair:
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="test-ca", now=now)
    return pki.issue_serving(
        ca=ca, common_name="webhook", dns_names=["webhook"], now=now, valid_for=timedelta(days=days)
    )


def write_pair(directory: Path, pair: pki.KeyPair) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    pki.write_pem(cert, pair.cert_pem, private=False)
    pki.write_pem(key, pair.key_pem, private=True)
    return cert, key


def test_the_webhook_exports_its_serving_certificates_not_after_and_follows_a_reload(tmp_path: Path) -> None:
    first = serving_pair(30)
    cert, key = write_pair(tmp_path, first)
    app = server.make_app(server.ServerConfig(cert_file=cert, key_file=key))
    metrics = app[server.METRICS_KEY]
    name = "koord_queue_certificate_expiry_timestamp_seconds"
    scraped = samples(metrics.render())
    expiry = scraped[(name, (("component", "webhook"), ("purpose", "serving")))]
    assert expiry == pki.not_after(first.cert_pem).timestamp()

    second = serving_pair(90)
    write_pair(tmp_path, second)
    assert app[server.TLS_KEY].reload_if_changed() is True
    scraped = samples(metrics.render())
    assert scraped[(name, (("component", "webhook"), ("purpose", "serving")))] == (
        pki.not_after(second.cert_pem).timestamp()
    )


def test_a_webhook_pair_that_fails_to_load_keeps_the_expiry_of_the_one_in_force(tmp_path: Path) -> None:
    first = serving_pair(30)
    cert, key = write_pair(tmp_path, first)
    app = server.make_app(server.ServerConfig(cert_file=cert, key_file=key))
    # a new certificate whose key is not its own: refused, the old pair stays in force
    pki.write_pem(cert, serving_pair(90).cert_pem, private=False)
    assert app[server.TLS_KEY].reload_if_changed() is False
    scraped = samples(app[server.METRICS_KEY].render())
    key_ = (
        "koord_queue_certificate_expiry_timestamp_seconds",
        (("component", "webhook"), ("purpose", "serving")),
    )
    assert scraped[key_] == pki.not_after(first.cert_pem).timestamp()


def test_a_webhook_without_tls_exports_no_certificate_expiry() -> None:
    app = server.make_app(server.ServerConfig())
    names = {name for name, _ in samples(app[server.METRICS_KEY].render())}
    assert "koord_queue_certificate_expiry_timestamp_seconds" not in names


def test_the_reconciler_exports_the_visibility_certificate_in_force() -> None:
    tls = visibility.ServingTLS(client_auth=False)
    reconciler_metrics.watch_certificate("visibility-serving", tls.cert_in_force)
    labels = {"component": "reconciler", "purpose": "visibility-serving"}
    name = "koord_queue_certificate_expiry_timestamp_seconds"
    assert reconciler(name, **labels) is None  # nothing in force yet: no sample rather than a 0
    pair = serving_pair(45)
    assert tls.update(serving=pair, requestheader=None)
    assert reconciler(name, **labels) == pki.not_after(pair.cert_pem).timestamp()
    rotated = serving_pair(60)
    assert tls.update(serving=rotated, requestheader=None)
    assert reconciler(name, **labels) == pki.not_after(rotated.cert_pem).timestamp()


# --- API errors --------------------------------------------------------------------------------------


@pytest.fixture
async def apiserver() -> AsyncIterator[str]:
    """A fake apiserver: GETs of pods are refused (403), watches end with a 410 ERROR event."""

    async def pods(request: web.Request) -> web.Response:
        if request.query.get("watch") == "true":
            event = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            return web.Response(body=orjson.dumps(event) + b"\n")
        return web.json_response({"kind": "Status", "code": 403, "reason": "Forbidden"}, status=403)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", pods)
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_failed_api_requests_are_counted_by_verb_and_code(apiserver: str) -> None:
    client = kube.Kube(kubeconfig.Settings(host=apiserver), qps=0, burst=1, user_agent="test")
    client.on_error = reconciler_metrics.count_api_error
    name = "koord_queue_api_errors_total"
    before = {
        "403": reconciler(name, verb="GET", code="403") or 0,
        "410": reconciler(name, verb="WATCH", code="410") or 0,
    }
    try:
        with pytest.raises(kube.KubeError) as refused:
            await client.get(kube.PODS, "p", namespace="ns")
        assert refused.value.status == 403
        with pytest.raises(kube.Gone):
            async for _ in client.watch(kube.PODS, resource_version="1"):
                pass
    finally:
        await client.close()
    assert reconciler(name, verb="GET", code="403") == before["403"] + 1
    assert reconciler(name, verb="WATCH", code="410") == before["410"] + 1


async def test_a_request_that_gets_no_answer_is_counted_with_code_0() -> None:
    # Nothing listens on the discard port: the request fails before any status.
    client = kube.Kube(kubeconfig.Settings(host="http://127.0.0.1:9"), qps=0, burst=1, user_agent="test")
    client.on_error = reconciler_metrics.count_api_error
    before = reconciler("koord_queue_api_errors_total", verb="GET", code="0") or 0
    try:
        with pytest.raises(kube.KubeError) as failed:
            await client.get(kube.PODS, "p", namespace="ns")
        assert failed.value.status == 0
    finally:
        await client.close()
    assert reconciler("koord_queue_api_errors_total", verb="GET", code="0") == before + 1

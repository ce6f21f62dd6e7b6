"""The webhook server over real sockets: plain HTTP and TLS, status codes, metrics, certificate reload.

The real app (``webhook.server.make_app``) is started on 127.0.0.1 with an ephemeral port. TLS
material is generated here with ``cryptography`` (a CA and serving certificates for 127.0.0.1), so
these tests depend on nothing but the server itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission import podgate
from koord_queue.shared.api import names
from koord_queue.webhook import main, server
from koord_queue.webhook.server import ServerConfig
from testenv.processes import free_port
from tests.unit import test_podgate as pod_gate
from tests.unit.test_admission import review_body
from tests.unit.test_job_adapters import batch_job

# --- certificates ---------------------------------------------------------------------------------

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class ThrowawayCA:
    """A throwaway CA issuing serving certificates for 127.0.0.1."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("test-ca"))
            .issuer_name(_name("test-ca"))
            .public_key(self.key.public_key())
            .serial_number(1)
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, directory: Path, *, serial: int) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("koord-queue-webhook"))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(LOOPBACK)]),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        cert_file, key_file = directory / "tls.crt", directory / "tls.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cert_file, key_file

    def client_context(self, **versions: ssl.TLSVersion) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.pem.decode())
        for attribute, version in versions.items():
            setattr(context, attribute, version)
        return context


@pytest.fixture(scope="module")
def ca() -> ThrowawayCA:
    return ThrowawayCA()


# --- serving --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(config: ServerConfig) -> AsyncIterator[tuple[str, web.Application]]:
    app = server.make_app(config)
    runner = server.make_runner(app)
    await runner.setup()
    try:
        context = app[server.TLS_KEY].listening if server.TLS_KEY in app else None
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        port = runner.addresses[0][1]
        yield f"{'https' if context else 'http'}://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def post(
    url: str, body: bytes | dict[str, Any], *, ssl_context: ssl.SSLContext | bool = True
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=data, headers={"Content-Type": "application/json"}, ssl=ssl_context
        ) as response,
    ):
        payload = await response.read()
        return response.status, json.loads(payload) if payload.startswith(b"{") else payload


# --- plain HTTP behaviour -------------------------------------------------------------------------


async def test_mutate_returns_a_json_patch_for_a_labelled_job() -> None:
    async with serving(ServerConfig()) as (url, _):
        status, answer = await post(f"{url}/mutate", review_body(batch_job()))
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/suspend", "value": True} in ops
    stamp = next(op["value"] for op in ops if op["path"].endswith("job-enqueue-timestamp"))
    assert dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


async def test_mutate_pod_gates_a_labelled_pod_and_counts_it_as_a_pod() -> None:
    labelled = pod_gate.pod()
    async with serving(ServerConfig()) as (url, app):
        status, answer = await post(f"{url}/mutate-pod", review_body(labelled))
        _, plain = await post(f"{url}/mutate-pod", review_body(pod_gate.pod(labels={})))
        # A job sent to the pod route is not the pod route's business: allowed untouched.
        _, job = await post(f"{url}/mutate-pod", review_body(batch_job()))
        metrics = app[server.METRICS_KEY].render().decode()
    assert status == 200 and answer["kind"] == "AdmissionReview"
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert ops == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": names.ADMISSION_GATE}]}]
    assert plain["response"] == {"uid": "uid-1", "allowed": True}
    assert job["response"] == {"uid": "uid-1", "allowed": True}
    assert 'koord_queue_webhook_requests_total{kind="Pod",operation="mutate",result="patched"} 1.0' in metrics
    assert 'koord_queue_webhook_requests_total{kind="Pod",operation="mutate",result="allowed"} 1.0' in metrics


async def test_a_pod_gate_bug_is_answered_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("secret pod contents")

    monkeypatch.setattr(podgate, "decide", broken)
    async with serving(ServerConfig()) as (url, _):
        status, answer = await post(f"{url}/mutate-pod", review_body(pod_gate.pod()))
        _, bad = await post(f"{url}/mutate-pod", b"[1]")
    assert status == 200
    assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 500
    assert "secret" not in json.dumps(answer)
    assert "AdmissionReview" in bad["error"]


async def test_per_kind_paths_and_validation_denials() -> None:
    queue = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {"queuePolicy": "FIFO"},
    }
    async with serving(ServerConfig()) as (url, _):
        status, answer = await post(f"{url}/validate/queues", review_body(queue))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith("spec.queuePolicy: Unsupported value")


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "not valid UTF-8 JSON"),
        (b'{"a": "\xff\xfe"}', 400, "not valid UTF-8 JSON"),
        (b"", 400, "not valid UTF-8 JSON"),
        (b"[1, 2]", 400, "AdmissionReview"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
            400,
            "admission.k8s.io/v1",
        ),
        (b" " * 2048, 413, "exceeds the limit of 1024 bytes"),
    ],
)
async def test_bad_requests_get_4xx_with_a_short_reason(body: bytes, status: int, reason: str) -> None:
    async with serving(ServerConfig(max_body_bytes=1024)) as (url, _):
        got, answer = await post(f"{url}/validate", body)
    assert got == status
    assert reason in answer["error"]
    assert "Traceback" not in json.dumps(answer)


async def test_a_decision_bug_is_answered_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("secret object contents")

    monkeypatch.setattr(admission, "decide", broken)
    async with serving(ServerConfig()) as (url, app):
        status, answer = await post(f"{url}/mutate", review_body(batch_job()))
        metrics = app[server.METRICS_KEY].render().decode()
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    assert "secret" not in json.dumps(answer)
    assert 'result="error"' in metrics


async def test_health_readiness_and_methods() -> None:
    async with serving(ServerConfig()) as (url, app), aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(url + path) as response:
                assert response.status == 200
        app[server.STATE_KEY].ready = False
        async with session.get(url + "/readyz") as response:
            assert response.status == 503
        async with session.get(url + "/mutate") as response:
            assert response.status == 405


async def test_metrics_count_outcomes_with_bounded_labels() -> None:
    async with serving(ServerConfig()) as (url, app):
        await post(f"{url}/mutate", review_body(batch_job()))
        await post(
            f"{url}/validate", review_body({"apiVersion": "x/v1", "kind": "Weird" * 50, "metadata": {}})
        )
        await post(f"{url}/validate", b"nope")
        metrics_app = server.make_metrics_app(app)
        runner = server.make_runner(metrics_app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            port = runner.addresses[0][1]
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/metrics") as r,
            ):
                text = await r.text()
        finally:
            await runner.cleanup()
    assert 'koord_queue_webhook_requests_total{kind="Job",operation="mutate",result="patched"} 1.0' in text
    assert (
        'koord_queue_webhook_requests_total{kind="other",operation="validate",result="allowed"} 1.0' in text
    )
    assert 'kind="unknown",operation="validate",result="malformed"' in text
    assert "koord_queue_webhook_request_duration_seconds_bucket" in text
    assert "Weird" not in text


# --- TLS ------------------------------------------------------------------------------------------


async def test_tls_serves_reviews_with_tls_1_2_or_newer(ca: ThrowawayCA, tmp_path: Path) -> None:
    cert, key = ca.issue(tmp_path, serial=10)
    async with serving(ServerConfig(cert_file=cert, key_file=key)) as (url, _):
        assert url.startswith("https://")
        status, answer = await post(
            f"{url}/mutate", review_body(batch_job()), ssl_context=ca.client_context()
        )
        assert status == 200 and "patch" in answer["response"]
        tls12 = ca.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
        _, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]), ssl=tls12)
        cipher, version, _ = writer.get_extra_info("cipher")
        writer.close()
        await writer.wait_closed()
        assert version == "TLSv1.2"
        assert cipher.startswith("ECDHE-") and ("GCM" in cipher or "CHACHA20" in cipher)


@pytest.mark.parametrize(
    "client",
    [
        pytest.param({"maximum_version": ssl.TLSVersion.TLSv1_1}, id="tls-1.1"),
        pytest.param({"ciphers": "AES128-SHA256:AES256-SHA:DHE-RSA-AES128-SHA"}, id="weak-ciphers"),
    ],
)
async def test_tls_refuses_old_protocols_and_weak_ciphers(
    ca: ThrowawayCA, tmp_path: Path, client: dict[str, Any]
) -> None:
    cert, key = ca.issue(tmp_path, serial=11)
    context = ca.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
    if "ciphers" in client:
        context.set_ciphers(client["ciphers"])
    else:
        # Let the *client* speak TLS 1.1 (deprecated in Python, off at OpenSSL's default security
        # level), so the refusal we observe is the server's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.TLSv1
            context.maximum_version = client["maximum_version"]
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    async with serving(ServerConfig(cert_file=cert, key_file=key)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.close()
            await writer.wait_closed()


async def _peer_serial(port: int, context: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


async def _get_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n")
    await writer.drain()
    return await reader.readuntil(b"ok")


async def test_certificates_are_reloaded_without_dropping_connections(
    ca: ThrowawayCA, tmp_path: Path
) -> None:
    cert, key = ca.issue(tmp_path, serial=100)
    config = ServerConfig(cert_file=cert, key_file=key, cert_reload_interval=0.02)
    async with serving(config) as (url, app):
        port = int(url.rsplit(":", 1)[1])
        context = ca.client_context()
        assert await _peer_serial(port, context) == 100
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        try:
            assert (await _get_over(reader, writer)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.01)
            ca.issue(tmp_path, serial=200)
            for _ in range(200):
                if await _peer_serial(port, context) == 200:
                    break
                await asyncio.sleep(0.02)
            assert await _peer_serial(port, context) == 200
            # The connection opened before the rotation still works.
            assert (await _get_over(reader, writer)).startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
            await writer.wait_closed()
        # A broken pair on disk is ignored: the last good certificate stays in service.
        key.write_text("not a key")
        assert app[server.TLS_KEY].reload_if_changed() is False
        assert await _peer_serial(port, context) == 200
        assert 'result="ok"' in app[server.METRICS_KEY].render().decode()


# --- run() and the command line -------------------------------------------------------------------


async def test_run_serves_metrics_and_drains_on_stop(ca: ThrowawayCA, tmp_path: Path) -> None:
    cert, key = ca.issue(tmp_path, serial=7)
    port, metrics_port = free_port(), free_port()
    config = ServerConfig(
        host="127.0.0.1",
        port=port,
        cert_file=cert,
        key_file=key,
        metrics_port=metrics_port,
        metrics_insecure=True,  # mutual TLS: tests/unit/test_webhook_metrics_tls.py
        health_port=0,
        shutdown_delay=0.3,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(config, stop=stop), name="webhook-under-test")
    context = ca.client_context()
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=context) as response:
                    if response.status == 200:
                        break
            await asyncio.sleep(0.02)
        async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            assert response.status == 200
            assert "koord_queue_webhook" in await response.text()
        stop.set()
        await asyncio.sleep(0.1)
        async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=context) as response:
            assert response.status == 503
    await asyncio.wait_for(task, timeout=10)


def test_command_line_defaults_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    config, verbose = main.parse_config([])
    assert (config.port, config.metrics_port, config.max_body_bytes) == (9443, 8080, 3 * 1024 * 1024)
    assert "raycluster" not in config.admission.enabled_extensions
    assert config.admission.reconciler_username == "system:serviceaccount:koord-queue:koord-queue-reconciler"
    assert not verbose and config.cert_file is None
    config, _ = main.parse_config(["--enabled-extensions", "job, raycluster", "--metrics-port", "0"])
    assert config.admission.enabled_extensions == {"job", "raycluster"} and config.metrics_port == 0
    for bad in (
        ["--enabled-extensions", "job,clusterresourcebinding"],
        ["--cert-file", "x"],
        ["--max-body-bytes", "0"],
    ):
        with pytest.raises(SystemExit) as info:
            main.parse_config(bad)
        assert info.value.code == 2
    assert "clusterresourcebinding" in capsys.readouterr().err

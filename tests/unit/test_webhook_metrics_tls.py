"""The webhook's side ports (docs/operations.md#metrics): ``/metrics`` only over mutual TLS with a
client certificate of ``--metrics-client-ca``, health as plain HTTP for the kubelet.

The webhook runs for real (``server.run``) on loopback ports; the callers are what a hostile pod on
the network would try: no certificate, a certificate of another CA, a server certificate of the
right CA presented as a client one, plain HTTP on the TLS port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from koord_queue.certs import pki
from koord_queue.webhook import main, server
from koord_queue.webhook.server import ServerConfig
from testenv.processes import free_port


class Pki:
    """A serving CA and pair for 127.0.0.1, the scrapers' CA, and a stranger's CA."""

    def __init__(self, directory: Path) -> None:
        now = datetime.now(UTC)
        self.dir = directory
        self.serving_ca = pki.new_ca(common_name="serving-ca", now=now)
        serving = pki.issue_serving(
            ca=self.serving_ca, common_name="webhook", ip_addresses=["127.0.0.1"], now=now
        )
        self.cert, self.key = self._write("tls", serving)
        self.client_ca = pki.new_ca(common_name="scrapers", now=now)
        self.client_ca_file = directory / "client-ca.crt"
        pki.write_pem(self.client_ca_file, self.client_ca.cert_pem, private=False)
        self.scraper = self._write(
            "scraper", pki.issue_client(ca=self.client_ca, common_name="prom", now=now)
        )
        stranger_ca = pki.new_ca(common_name="stranger", now=now)
        self.stranger = self._write("stranger", pki.issue_client(ca=stranger_ca, common_name="prom", now=now))
        # Signed by the right CA, but for serving: not a client certificate.
        self.server_as_client = self._write(
            "server-as-client",
            pki.issue_serving(ca=self.client_ca, common_name="x", dns_names=["x"], now=now),
        )

    def _write(self, name: str, pair: pki.KeyPair) -> tuple[Path, Path]:
        cert, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        pki.write_pem(cert, pair.cert_pem, private=False)
        pki.write_pem(key, pair.key_pem, private=True)
        return cert, key

    def context(self, client: tuple[Path, Path] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.serving_ca.cert_pem.decode())
        if client is not None:
            ctx.load_cert_chain(*client)
        return ctx


@pytest.fixture
def keys(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@contextlib.asynccontextmanager
async def running(config: ServerConfig) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(config, stop=stop), name="webhook-under-test")
    async with aiohttp.ClientSession() as session:
        for _ in range(250):
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with session.get(f"http://127.0.0.1:{config.health_port}/readyz") as response:
                    if response.status == 200:
                        break
            assert not task.done(), task
            await asyncio.sleep(0.02)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


def config_for(keys: Pki, **overrides: object) -> ServerConfig:
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "cert_file": keys.cert,
        "key_file": keys.key,
        "metrics_port": free_port(),
        "health_port": free_port(),
        "metrics_client_ca": keys.client_ca_file,
        "shutdown_delay": 0.0,
        "cert_reload_interval": 0.05,
    }
    values.update(overrides)
    return ServerConfig(**values)  # type: ignore[arg-type]


async def scrape(port: int, context: ssl.SSLContext | None) -> int | str:
    """The status of ``GET /metrics``, or the name of the error that refused the caller."""
    scheme = "https" if context is not None else "http"
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{scheme}://127.0.0.1:{port}/metrics", ssl=context or False) as response,
        ):
            body = await response.text()
            assert response.status != 200 or "koord_queue_webhook" in body
            return response.status
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as err:
        return type(err).__name__


async def test_metrics_serve_only_clients_of_the_ca(keys: Pki) -> None:
    config = config_for(keys)
    async with running(config):
        assert await scrape(config.metrics_port, keys.context(keys.scraper)) == 200
        for stranger in (None, keys.stranger, keys.server_as_client):
            outcome = await scrape(config.metrics_port, keys.context(stranger))
            assert outcome != 200 and isinstance(outcome, str), (stranger, outcome)
        # Plain HTTP on the TLS port gets no metrics either.
        assert await scrape(config.metrics_port, None) != 200
        # Health answers anyone, in plain HTTP, on its own port; readiness too.
        async with aiohttp.ClientSession() as session:
            for path in ("/healthz", "/readyz"):
                async with session.get(f"http://127.0.0.1:{config.health_port}{path}") as response:
                    assert response.status == 200, path
            # The admission port still answers its own probes (older probes keep working).
            async with session.get(
                f"https://127.0.0.1:{config.port}/healthz", ssl=keys.context(None)
            ) as response:
                assert response.status == 200


async def test_a_missing_client_ca_refuses_everyone_until_it_appears(keys: Pki, tmp_path: Path) -> None:
    later = tmp_path / "later" / "ca.crt"
    config = config_for(keys, metrics_client_ca=later)
    async with running(config):
        assert isinstance(await scrape(config.metrics_port, keys.context(keys.scraper)), str)
        later.parent.mkdir()
        later.write_bytes(keys.client_ca.cert_pem)

        deadline = asyncio.get_running_loop().time() + 10
        while await scrape(config.metrics_port, keys.context(keys.scraper)) != 200:
            assert asyncio.get_running_loop().time() < deadline, "the CA that appeared was never trusted"
            await asyncio.sleep(0.05)


async def test_no_client_ca_means_no_metrics_unless_insecure_is_asked(keys: Pki) -> None:
    config = config_for(keys, metrics_client_ca=None)
    async with running(config):
        assert isinstance(await scrape(config.metrics_port, None), str)  # nothing listens
    insecure = config_for(keys, metrics_client_ca=None, metrics_insecure=True)
    async with running(insecure):
        assert await scrape(insecure.metrics_port, None) == 200


def test_command_line_of_the_side_ports(capsys: pytest.CaptureFixture[str]) -> None:
    config, _ = main.parse_config([])
    assert (config.metrics_port, config.health_port) == (8080, 8081)
    assert config.metrics_client_ca is None and not config.metrics_insecure
    config, _ = main.parse_config(
        ["--cert-file=c", "--key-file=k", "--metrics-client-ca=/ca.crt", "--health-port=0"]
    )
    assert config.metrics_client_ca == Path("/ca.crt") and config.health_port == 0
    for bad in (
        ["--metrics-client-ca=/ca.crt"],  # no TLS to ask a client certificate in
        ["--cert-file=c", "--key-file=k", "--metrics-client-ca=/ca.crt", "--metrics-insecure"],
    ):
        with pytest.raises(SystemExit) as info:
            main.parse_config(bad)
        assert info.value.code == 2, bad
    assert "--metrics-client-ca" in capsys.readouterr().err


async def test_the_health_port_drains_on_stop_and_serves_no_metrics(keys: Pki) -> None:
    """The manifests' readiness probe reads the health port: it must turn 503 as shutdown starts,
    so endpoints drain before the webhook closes; and it must not be a way round the metrics'
    client certificate."""
    config = config_for(keys, shutdown_delay=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(config, stop=stop), name="webhook-under-test")
    base = f"http://127.0.0.1:{config.health_port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(250):
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        break
            await asyncio.sleep(0.02)
        async with session.get(f"{base}/metrics") as response:
            assert response.status == 404
        stop.set()
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            async with session.get(f"{base}/readyz") as response:
                if response.status == 503:
                    break
            assert asyncio.get_running_loop().time() < deadline, "readiness never dropped"
            await asyncio.sleep(0.02)
        async with session.get(f"{base}/healthz") as response:
            assert response.status == 200  # alive while draining
    await asyncio.wait_for(task, timeout=10)

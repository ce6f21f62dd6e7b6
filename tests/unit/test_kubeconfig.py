"""The API client's own credential loader (``shared/kubeconfig.py``, docs/development.md#api-client).

What kubectl would read from a kubeconfig or a pod's ServiceAccount is read here without
kubernetes-asyncio, and reaches the wire: a local TLS server (our own CA, a client certificate
required when one is sent) answers with the ``Authorization`` header and the client certificate's
name it saw, so every test checks what a real API server would be shown, not a field of a settings
object. The exec plugins are real scripts run as subprocesses. Against the real kube-apiserver:
tests/integration/test_kube_credentials.py.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from koord_queue.certs import pki
from koord_queue.shared import credentials as creds
from koord_queue.shared import kube
from koord_queue.shared import kubeconfig as kc

NOW = datetime.now(UTC)
CA = pki.new_ca(common_name="test-ca", now=NOW)
SERVING = pki.issue_serving(
    ca=CA, common_name="server", dns_names=["api.example"], ip_addresses=["127.0.0.1"], now=NOW
)
ALICE = pki.issue_client(ca=CA, common_name="alice", now=NOW)
BOB = pki.issue_client(ca=CA, common_name="bob", now=NOW)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class Server:
    """A TLS server that shows what it was shown; answers 401 unless the token is accepted."""

    url: str
    accepted: set[str] = field(default_factory=set)
    seen: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    (tmp_path / "serving.crt").write_bytes(SERVING.cert_pem)
    (tmp_path / "serving.key").write_bytes(SERVING.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=CA.cert_pem.decode())
    context.load_cert_chain(tmp_path / "serving.crt", tmp_path / "serving.key")
    context.verify_mode = ssl.CERT_OPTIONAL
    state = Server(url="")

    async def whoami(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        client = dict(pair[0] for pair in peer["subject"]).get("commonName") if peer else None
        seen = {"authorization": request.headers.get("Authorization"), "client": client}
        state.seen.append(seen)
        token = (seen["authorization"] or "").removeprefix("Bearer ")
        if state.accepted and token not in state.accepted:
            return web.json_response(
                {"kind": "Status", "reason": "Unauthorized", "message": "no"}, status=401
            )
        return web.json_response(seen)

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"https://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


def write_kubeconfig(
    path: Path, *, server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": b64(CA.cert_pem),
                    **(cluster or {}),
                },
            }
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def whoami(kubeconfig: Path | str, context: str | None = None) -> dict[str, Any]:
    client = await kube.Kube.connect(kubeconfig=str(kubeconfig), context=context)
    try:
        return await client.request("GET", "/whoami")
    finally:
        await client.close()


# --- what a kubeconfig's user sends ---------------------------------------------------------------


async def test_a_token(server: Server, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", server=server.url, user={"token": "t0k"})
    assert await whoami(path) == {"authorization": "Bearer t0k", "client": None}


async def test_a_client_certificate_from_data(server: Server, tmp_path: Path) -> None:
    user = {"client-certificate-data": b64(ALICE.cert_pem), "client-key-data": b64(ALICE.key_pem)}
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    assert await whoami(path) == {"authorization": None, "client": "alice"}


async def test_files_are_relative_to_the_kubeconfig_that_names_them(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(CA.cert_pem)
    (certs / "bob.crt").write_bytes(BOB.cert_pem)
    (certs / "bob.key").write_bytes(BOB.key_pem)
    user = {"client-certificate": "certs/bob.crt", "client-key": "certs/bob.key"}
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    config = yaml.safe_load(path.read_text())
    del config["clusters"][0]["cluster"]["certificate-authority-data"]
    config["clusters"][0]["cluster"]["certificate-authority"] = "certs/ca.crt"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir("/")  # not where the kubeconfig is
    assert await whoami(path) == {"authorization": None, "client": "bob"}


async def test_username_and_password(server: Server, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", server=server.url, user={"username": "u", "password": "p:w"})
    assert (await whoami(path))["authorization"] == f"Basic {b64(b'u:p:w')}"


async def test_the_server_certificate_is_verified(server: Server, tmp_path: Path) -> None:
    other_ca = pki.new_ca(common_name="other", now=NOW)
    path = write_kubeconfig(
        tmp_path / "config",
        server=server.url,
        user={},
        cluster={"certificate-authority-data": b64(other_ca.cert_pem)},
    )
    with pytest.raises(kube.KubeError, match="certificate verify failed") as failed:
        await whoami(path)
    assert failed.value.status == 0
    # ...unless told not to, as kubectl --insecure-skip-tls-verify
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump(config))
    assert (await whoami(path))["client"] is None


async def test_tls_server_name_is_the_name_checked(server: Server, tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "config", server=server.url, user={}, cluster={"tls-server-name": "api.example"}
    )
    assert (await whoami(path))["client"] is None
    path = write_kubeconfig(
        tmp_path / "config", server=server.url, user={}, cluster={"tls-server-name": "other.example"}
    )
    with pytest.raises(kube.KubeError, match=r"other\.example"):
        await whoami(path)


async def via_leader_election_client(kubeconfig: Path) -> Any:
    """What the server saw from kubernetes-asyncio's client that ``Kube.api_client`` builds."""
    client = await kube.Kube.connect(kubeconfig=str(kubeconfig))
    try:
        return await client.api_client.call_api(
            "/whoami",
            "GET",
            auth_settings=["BearerToken"],
            response_types_map={200: "object"},
            _return_http_data_only=True,
        )
    finally:
        await client.close()


async def test_leader_elections_client_carries_the_same_credentials(server: Server, tmp_path: Path) -> None:
    certificate = {"client-certificate-data": b64(ALICE.cert_pem), "client-key-data": b64(ALICE.key_pem)}
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=certificate)
    assert await via_leader_election_client(path) == {"authorization": None, "client": "alice"}
    (tmp_path / "token").write_text("from-file")
    path = write_kubeconfig(tmp_path / "config", server=server.url, user={"tokenFile": "token"})
    assert await via_leader_election_client(path) == {"authorization": "Bearer from-file", "client": None}


# --- token files ------------------------------------------------------------------------------


async def test_a_token_file_is_read_again_once_a_minute_and_keeps_its_last_good_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    now = [0.0]
    source = creds.TokenFile(str(token), clock=lambda: now[0])
    token.write_text("two")
    now[0] = 59.0
    assert (await source.current()).authorization == "Bearer one"
    now[0] = 60.0
    assert (await source.current()).authorization == "Bearer two"
    token.unlink()  # a rotation between remove and write
    now[0] = 121.0
    assert (await source.current()).authorization == "Bearer two"
    token.write_text("three")
    assert await source.rejected(creds.Credential("Bearer two"))  # refused: read at once
    assert (await source.current()).authorization == "Bearer three"
    assert not await source.rejected(creds.Credential("Bearer three"))  # nothing newer to try


async def test_a_token_file_wins_over_a_token_and_must_be_readable(server: Server, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    path = write_kubeconfig(
        tmp_path / "config", server=server.url, user={"token": "inline", "tokenFile": "token"}
    )
    assert (await whoami(path))["authorization"] == "Bearer from-file"
    (tmp_path / "token").unlink()
    with pytest.raises(kube.ClientConfigError, match="token file"):
        await whoami(path)


async def test_a_refused_token_file_is_read_again_and_the_request_retried(
    server: Server, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    path = write_kubeconfig(tmp_path / "config", server=server.url, user={"tokenFile": str(token)})
    client = await kube.Kube.connect(kubeconfig=str(path))
    try:
        assert (await client.request("GET", "/whoami"))["authorization"] == "Bearer old"
        server.accepted = {"new"}
        token.write_text("new")  # rotated: the server no longer takes the old one
        assert (await client.request("GET", "/whoami"))["authorization"] == "Bearer new"
        server.accepted = {"newer"}  # refused, and the file holds nothing newer: one try only
        with pytest.raises(kube.KubeError) as refused:
            await client.request("GET", "/whoami")
        assert refused.value.status == 401
    finally:
        await client.close()
    assert [s["authorization"] for s in server.seen] == [
        "Bearer old",
        "Bearer old",
        "Bearer new",
        "Bearer new",
    ]


# --- exec plugins -------------------------------------------------------------------------------

PLUGIN = """\
#!{python}
import json, os, pathlib, sys
runs = pathlib.Path(sys.argv[1])
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
pathlib.Path(sys.argv[1] + ".info").write_text(os.environ["KUBERNETES_EXEC_INFO"])
status = json.loads(os.environ["STATUS"].replace("RUN", str(n)))
print(json.dumps({{"apiVersion": os.environ["VERSION"], "kind": "ExecCredential", "status": status}}))
"""


def plugin_script(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir(exist_ok=True)
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def exec_user(command: str, runs: Path, status: dict[str, Any], version: str, **extra: Any) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": version,
            "command": command,
            "args": [str(runs)],
            "env": [{"name": "STATUS", "value": json.dumps(status)}, {"name": "VERSION", "value": version}],
            "interactiveMode": "Never",
            **extra,
        }
    }


@pytest.mark.parametrize(
    "version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
async def test_an_exec_plugin_token(server: Server, tmp_path: Path, version: str) -> None:
    script, runs = plugin_script(tmp_path), tmp_path / "runs"
    user = exec_user("bin/plugin", runs, {"token": "tok-RUN"}, version, provideClusterInfo=True)
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    assert script.is_file()
    client = await kube.Kube.connect(kubeconfig=str(path))
    try:
        for _ in range(3):  # no expiry: run once, kept
            assert (await client.request("GET", "/whoami"))["authorization"] == "Bearer tok-1"
    finally:
        await client.close()
    assert runs.read_text() == "1"
    info = json.loads((tmp_path / "runs.info").read_text())
    assert info["apiVersion"] == version and info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == server.url
    assert base64.b64decode(info["spec"]["cluster"]["certificate-authority-data"]) == CA.cert_pem


async def test_an_exec_plugin_certificate(server: Server, tmp_path: Path) -> None:
    plugin_script(tmp_path)
    status = {"clientCertificateData": BOB.cert_pem.decode(), "clientKeyData": BOB.key_pem.decode()}
    user = exec_user("bin/plugin", tmp_path / "runs", status, "client.authentication.k8s.io/v1")
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    assert await whoami(path) == {"authorization": None, "client": "bob"}


async def test_an_exec_credential_is_kept_until_it_expires() -> None:
    now = [NOW]
    expiry = (NOW + timedelta(minutes=10)).isoformat().replace("+00:00", "Z")
    plugin = creds.ExecPlugin(
        api_version="client.authentication.k8s.io/v1",
        command=sys.executable,
        args=(
            "-c",
            "import json,os;print(json.dumps({'apiVersion':'client.authentication.k8s.io/v1',"
            f"'kind':'ExecCredential','status':{{'token':'t','expirationTimestamp':'{expiry}'}}}}))",
        ),
        interactive_mode="Never",
    )
    source = creds.Exec(plugin, now=lambda: now[0])
    await source.current()
    now[0] = NOW + timedelta(minutes=9)
    await source.current()
    assert source.runs == 1
    now[0] = NOW + timedelta(minutes=10)
    await source.current()
    assert source.runs == 2


async def test_a_refused_exec_credential_is_fetched_again_and_the_request_retried_once(
    server: Server, tmp_path: Path
) -> None:
    plugin_script(tmp_path)
    runs = tmp_path / "runs"
    user = exec_user(
        str(tmp_path / "bin" / "plugin"), runs, {"token": "tok-RUN"}, "client.authentication.k8s.io/v1"
    )
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    client = await kube.Kube.connect(kubeconfig=str(path))
    try:
        server.accepted = {"tok-2"}
        assert (await client.request("GET", "/whoami"))["authorization"] == "Bearer tok-2"
        server.accepted = {"never"}
        with pytest.raises(kube.KubeError) as refused:
            await client.request("GET", "/whoami")
        assert refused.value.status == 401
    finally:
        await client.close()
    assert runs.read_text() == "3"  # at connect, after the first 401, after the second: one retry each
    assert [s["authorization"] for s in server.seen] == [
        "Bearer tok-1",
        "Bearer tok-2",
        "Bearer tok-2",
        "Bearer tok-3",
    ]


async def test_a_failing_exec_plugin_says_why(tmp_path: Path) -> None:
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", "import sys; sys.exit('no session, log in first')"],
        }
    }
    path = write_kubeconfig(tmp_path / "config", server="https://127.0.0.1:9", user=user)
    with pytest.raises(kube.ClientConfigError, match="exited with 1: no session, log in first"):
        await whoami(path)


async def test_a_missing_exec_plugin_names_its_install_hint(tmp_path: Path) -> None:
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "koord-queue-no-such-plugin",
            "installHint": "install it with: brew install no-such-plugin",
            "interactiveMode": "Never",
        }
    }
    path = write_kubeconfig(tmp_path / "config", server="https://127.0.0.1:9", user=user)
    with pytest.raises(
        kube.ClientConfigError, match="koord-queue-no-such-plugin not found: install it with: brew install"
    ):
        await whoami(path)


def credential(version: str = "client.authentication.k8s.io/v1", **status: str) -> bytes:
    return json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}).encode()


@pytest.mark.parametrize(
    ("output", "error"),
    [
        (b"not json", "printed no ExecCredential"),
        (credential("client.authentication.k8s.io/v1beta1", token="t"), "answered in"),
        (credential(), "neither a token"),
        (credential(clientKeyData="k"), "go together"),
        (credential(token="t", expirationTimestamp="soon"), "is not a time"),
    ],
)
def test_what_an_exec_plugin_prints_is_checked(output: bytes, error: str) -> None:
    plugin = creds.ExecPlugin(api_version="client.authentication.k8s.io/v1", command="p")
    with pytest.raises(creds.ConfigError, match=error):
        creds.parse_exec_credential(output, plugin)


# --- choosing the context -------------------------------------------------------------------------


def two_files(tmp_path: Path, server: str) -> str:
    """Two kubeconfigs as a ``$KUBECONFIG`` list: both name context ``ctx`` and set a current context."""
    first = write_kubeconfig(tmp_path / "first", server=server, user={"token": "first"})
    second = write_kubeconfig(tmp_path / "second", server=server, user={"token": "second"})
    config = yaml.safe_load(second.read_text())
    config["users"].append({"name": "other-user", "user": {"token": "other"}})
    config["contexts"].append({"name": "other", "context": {"cluster": "c", "user": "other-user"}})
    config["current-context"] = "other"
    second.write_text(yaml.safe_dump(config))
    return f"{tmp_path / 'missing'}{os.pathsep}{first}{os.pathsep}{second}"


async def test_the_first_file_wins_and_a_context_can_be_chosen(server: Server, tmp_path: Path) -> None:
    paths = two_files(tmp_path, server.url)
    assert (await whoami(paths))["authorization"] == "Bearer first"  # first current-context, first "u"
    assert (await whoami(paths, context="other"))["authorization"] == "Bearer other"
    with pytest.raises(kube.ClientConfigError, match="context nope is not in the kubeconfig"):
        await whoami(paths, context="nope")


async def test_a_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        kube.ClientConfigError, match=f"cannot load API credentials from {tmp_path}/nope: no such kubeconfig"
    ):
        await whoami(tmp_path / "nope")


async def test_a_context_without_its_cluster_is_a_clear_error(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", server="https://127.0.0.1:9", user={})
    config = yaml.safe_load(path.read_text())
    config["contexts"][0]["context"]["cluster"] = "gone"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(kube.ClientConfigError, match="names cluster gone"):
        await whoami(path)


# --- what is left to kubernetes-asyncio -------------------------------------------------------------


def jwt(claims: dict[str, Any]) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.sig"


async def test_an_auth_provider_user_falls_back_to_kubernetes_asyncio(server: Server, tmp_path: Path) -> None:
    token = jwt({"exp": int((NOW + timedelta(hours=1)).timestamp())})
    user = {
        "auth-provider": {
            "name": "oidc",
            "config": {"id-token": token, "client-id": "x", "idp-issuer-url": "https://idp"},
        }
    }
    path = write_kubeconfig(tmp_path / "config", server=server.url, user=user)
    settings = await kc.load(str(path))
    assert settings.legacy is not None
    assert await whoami(path) == {"authorization": f"Bearer {token}", "client": None}


# --- in a pod -----------------------------------------------------------------------------------


async def test_in_cluster_from_the_environment_and_the_mounted_files(server: Server, tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    (tmp_path / "token").write_text("sa-token")
    port = server.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    settings = await kc.load(None, environ=env, service_account_dir=tmp_path)
    client = kube.Kube(settings, qps=0, burst=1, user_agent="test")
    try:
        assert await client.request("GET", "/whoami") == {"authorization": "Bearer sa-token", "client": None}
    finally:
        await client.close()
    assert isinstance(settings.credentials, creds.TokenFile)  # re-read: bound tokens rotate
    with pytest.raises(creds.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        await kc.load(None, environ={}, service_account_dir=tmp_path)
    (tmp_path / "token").unlink()
    with pytest.raises(creds.ConfigError, match="token"):
        await kc.load(None, environ=env, service_account_dir=tmp_path)


def test_in_cluster_brackets_an_ipv6_host(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    (tmp_path / "token").write_text("t")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kc.in_cluster(env, tmp_path).host == "https://[fd00::1]:443"


# --- the cost it saves ------------------------------------------------------------------------------


def test_the_client_and_the_plugin_do_not_import_kubernetes_asyncio() -> None:
    probe = textwrap.dedent(
        """
        import sys
        import koord_queue.shared.kube, koord_queue.cli.main
        loaded = sorted(m for m in sys.modules if m.startswith("kubernetes_asyncio"))
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)

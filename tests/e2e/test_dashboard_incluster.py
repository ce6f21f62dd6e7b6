"""The web dashboard installed in the cluster, acting as each caller
(docs/dashboard.md#installed-in-the-cluster).

``koord-queue-dashboard`` is started as its Deployment runs it: confined like the image
(testenv/confined.py), told only the API server's URL and the CA that signs it (as the
``kube-root-ca.crt`` volume gives it), with no kubeconfig and no token of its own. The tenants are
ServiceAccounts whose tokens come from the TokenRequest API, bound in their namespace to the
built-in roles the install's user roles aggregate into (``edit``, ``view``). Headless Chromium
(testenv/browser.py) logs in as a person would. Checked, as a hostile tenant would try it:

* no session: a page is the login page (401); a garbage token is refused at login (401);
* tenant A logs in with her token and sees her namespace's units; the session cookie is kept by
  Chromium over http://127.0.0.1 although it is ``Secure`` (as a port-forward gives it);
* A's session asking for B's page is refused (403) with the plugin's message naming the
  permission, and B's units are nowhere on her page;
* a ``view``-only user's Hold is refused with the missing permission, and nothing is held;
* the Authorization-header path (an authenticating proxy) acts as its token, over plain HTTP;
* the process holds no credential: nothing in its environment, arguments or open files, and a
  request without a caller's token never reaches the API server (a recording stand-in for it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from playwright.async_api import Browser

from chaos import tenant_web_dashboard
from koord_queue.dashboard import sessions
from koord_queue.shared import kube as shared_kube
from koord_queue.shared.api import names
from testenv import chart_web, confined, processes, scraping, system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube, tenancy
from tests.e2e.test_dashboard import chromium, job, rows, shown_within, stage  # noqa: F401  (fixtures)

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
SERVICE_ACCOUNT = "system:serviceaccount"


def bind_service_account(cluster: LocalCluster, namespace: str, name: str, role: str) -> None:
    """``name``'s ServiceAccount in ``namespace`` bound there to the built-in ``role`` (into which
    the install's koord-queue-user-* roles aggregate) and, for ``edit``, to the workload rules a
    real cluster's ``edit`` aggregates (tests/tenancy.py)."""
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{name}-{role}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject],
        }
    ]
    if role == "edit":
        docs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": f"{name}-workloads", "namespace": namespace},
                "rules": tenancy.rules(),
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"{name}-workloads", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": f"{name}-workloads",
                },
                "subjects": [subject],
            },
        ]
    kube.kubectl(cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(docs))


def quota(cluster: LocalCluster, namespace: str, name: str) -> None:
    body = {
        "apiVersion": f"{names.QUOTA_GROUP}/{names.QUOTA_VERSION}",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
    }
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(body))


class Served:
    def __init__(self, component: Component, base: str) -> None:
        self.component = component
        self.base = base


def start(tmp_path: Path, name: str, apiserver: str, ca_file: Path | None) -> Served:
    """``koord-queue-dashboard`` as the Deployment runs it (its args, POD_NAMESPACE from the
    downward API), confined like the image when the suite confines (it does: tests/e2e/conftest.py)."""
    port, health = processes.free_port(), processes.free_port()
    argv = [
        str(BIN / "koord-queue-dashboard"),
        f"--bind-address=127.0.0.1:{port}",
        f"--health-port={health}",
        f"--apiserver={apiserver}",
        f"--apiserver-ca-file={ca_file or ''}",
        "--session-idle-timeout=15m",
        "--max-sessions=50",
    ]
    env = {"POD_NAMESPACE": system.NAMESPACE}
    log = tmp_path / f"{name}.log"
    if confined.requested():
        component = confined.spawn(name, argv, log, env=env)
    else:
        component = processes.spawn(name, argv, log, env=confined.environment(env), inherit_env=False)
    try:
        processes.wait_until(
            lambda: processes.http_ok(f"http://127.0.0.1:{health}/readyz"),
            timeout=60,
            what=f"{name} ready",
            process=component,
        )
    except BaseException:
        component.stop()
        raise
    return Served(component, f"http://127.0.0.1:{port}")


@pytest.fixture
def incluster(e2e_cluster: LocalCluster, tmp_path: Path) -> Iterator[Served]:
    """The dashboard against the local control plane, with only its URL and CA (the CA copied as
    the kube-root-ca.crt volume holds it)."""
    assert e2e_cluster.workdir is not None
    volume = tmp_path / "kube-root-ca"
    volume.mkdir()
    shutil.copyfile(e2e_cluster.workdir / "pki" / "ca.crt", volume / "ca.crt")
    served = start(tmp_path, "web-dashboard", e2e_cluster.server, volume / "ca.crt")
    try:
        yield served
    finally:
        served.component.stop()


@contextlib.asynccontextmanager
async def recording_apiserver() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in for the API server that records every request's headers and refuses it (401)."""
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append({"path": request.path, **{k.lower(): v for k, v in request.headers.items()}})
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Unauthorized",
                "code": 401,
            },
            status=401,
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


@pytest.fixture
async def tenants(e2e_cluster: LocalCluster, stage: str) -> AsyncIterator[dict[str, str]]:  # noqa: F811
    """Namespaces A (``stage``: the visibility API registered, the roles aggregated) and B, each
    with a waiting unit; the tokens of A's editor, A's viewer and B's editor."""
    a = stage
    b = f"{a}-b"
    kube.kubectl(e2e_cluster, "create", "namespace", b)
    try:
        for ns in (a, b):
            quota(e2e_cluster, ns, f"{ns}-q")
        bind_service_account(e2e_cluster, a, "alice", "edit")
        bind_service_account(e2e_cluster, a, "viewer", "view")
        bind_service_account(e2e_cluster, b, "bea", "edit")
        tokens = {
            "a": a,
            "b": b,
            "alice": scraping.service_account_token(e2e_cluster, a, "alice"),
            "viewer": scraping.service_account_token(e2e_cluster, a, "viewer"),
            "bea": scraping.service_account_token(e2e_cluster, b, "bea"),
        }
        for ns, name in ((a, "a-train"), (b, "b-secret")):
            body = json.dumps(job(name, f"{ns}-q", cpu="2", priority=1))
            kube.kubectl(e2e_cluster, "create", "-n", ns, "-f", "-", input_text=body)
        yield tokens
    finally:
        kube.kubectl(e2e_cluster, "delete", "namespace", b, "--wait=false", check=False)


async def test_a_tenant_logs_in_with_her_token_and_sees_only_what_her_token_may_read(
    e2e_cluster: LocalCluster,
    incluster: Served,
    tenants: dict[str, str],
    chromium: Browser,  # noqa: F811
) -> None:
    a, b, base = tenants["a"], tenants["b"], incluster.base
    context = await chromium.new_context()
    page = await context.new_page()

    # No session: the login page, with 401; a garbage token is refused at login.
    response = await page.goto(f"{base}/ns/{a}")
    assert response is not None and response.status == 401
    await page.wait_for_selector("form#login")
    await page.fill("#token", "garbage")
    await page.click("#submit")
    await page.wait_for_selector("#message.error")
    assert "Not logged in (401)" in await page.inner_text("#message")
    assert await context.cookies() == []

    # Her token: her namespace's units, as her.
    await page.fill("#token", tenants["alice"])
    async with page.expect_navigation():
        await page.click("#submit")
    await shown_within(page, lambda r: f"{a}/a-train" in r, "her unit on the page")
    assert f"acting as {SERVICE_ACCOUNT}:{a}:alice" in await page.inner_text("#who")
    (cookie,) = await context.cookies()
    assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert tenants["alice"] not in json.dumps(cookie)
    assert set(await rows(page)) == {f"{a}/a-train"}  # nothing of B's

    # B's page, asked for directly with her session: refused, naming the permission.
    response = await page.goto(f"{base}/ns/{b}")
    assert response is not None and response.status == 403
    await page.wait_for_selector("#refused")
    text = await page.inner_text("#refused-message")
    assert f'you may not list "queueunits.scheduling.x-k8s.io" in namespace "{b}"' in text
    for path in (f"/api/ns/{b}/units", f"/api/ns/{b}/units/b-secret", f"/api/ns/{b}/quotas"):
        answer = await page.request.get(base + path)
        assert answer.status == 403, path
    write = await page.request.post(
        f"{base}/api/ns/{b}/units/b-secret/hold",
        data="{}",
        headers={"Content-Type": "application/json", "Origin": base},
    )
    assert write.status == 403
    got = kube.kubectl(e2e_cluster, "get", "job", "b-secret", "-n", b, "-o", "json")
    assert names.ACTIVE_ANNOTATION not in (json.loads(got.stdout)["metadata"].get("annotations") or {})

    # Logged out: the session is gone with its token.
    await page.goto(f"{base}/ns/{a}")
    await page.click("#logout")
    await page.wait_for_selector("form#login")
    answer = await page.request.get(f"{base}/api/session")
    assert answer.status == 401
    assert await context.cookies() == []  # the Secure cookie was taken back too
    await context.close()


async def test_a_view_only_users_hold_is_refused_with_the_missing_permission(
    e2e_cluster: LocalCluster,
    incluster: Served,
    tenants: dict[str, str],
    chromium: Browser,  # noqa: F811
) -> None:
    a, base = tenants["a"], incluster.base
    context = await chromium.new_context()
    page = await context.new_page()
    await page.goto(f"{base}/ns/{a}")
    await page.fill("#token", tenants["viewer"])
    async with page.expect_navigation():
        await page.click("#submit")
    await shown_within(page, lambda r: f"{a}/a-train" in r, "the viewer's row")
    await page.click(f"tr[data-unit='{a}/a-train'] button[data-action='hold']")
    await page.wait_for_selector("#message.error")
    text = await page.inner_text("#message")
    assert text.startswith('permission denied: you may not patch "jobs.batch"'), text
    got = kube.kubectl(e2e_cluster, "get", "job", "a-train", "-n", a, "-o", "json")
    assert names.ACTIVE_ANNOTATION not in (json.loads(got.stdout)["metadata"].get("annotations") or {})
    await context.close()


async def test_the_authorization_header_acts_as_its_token(incluster: Served, tenants: dict[str, str]) -> None:
    """Behind an authenticating proxy: each request carries its caller's token, over plain HTTP."""
    a, b, base = tenants["a"], tenants["b"], incluster.base
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def get(path: str, token: str) -> tuple[int, Any]:
            async with http.get(base + path, headers={"Authorization": f"Bearer {token}"}) as r:
                return r.status, await r.json() if r.content_type == "application/json" else await r.text()

        async def listed() -> bool:
            status, body = await get(f"/api/ns/{a}/units", tenants["alice"])
            return status == 200 and '"a-train"' in json.dumps(body) and "b-secret" not in json.dumps(body)

        await kube.eventually(listed, timeout=30, what="A's units through the header path")
        status, body = await get("/api/session", tenants["alice"])
        assert status == 200 and body["user"] == f"{SERVICE_ACCOUNT}:{a}:alice" and body["namespace"] == a
        status, body = await get(f"/api/ns/{b}/units", tenants["alice"])
        assert status == 403 and f'in namespace "{b}"' in body["error"]

        async def bea_reads_b() -> bool:  # B's own token reads B
            status, body = await get(f"/api/ns/{b}/units", tenants["bea"])
            return status == 200 and '"b-secret"' in json.dumps(body)

        await kube.eventually(bea_reads_b, timeout=30, what="B's units with B's token")
        status, body = await get(f"/api/ns/{a}/units", "garbage")
        assert status == 401 and "refused this token" in body["error"]
        status, _ = await get(f"/ns/{b}", tenants["alice"])
        assert status == 403
        async with http.post(
            f"{base}/api/ns/{a}/units/a-train/hold",
            data="{}",
            headers={
                "Authorization": f"Bearer {tenants['alice']}",
                "Content-Type": "application/json",
                "Origin": "https://evil.example",
            },
        ) as r:
            assert r.status == 403  # the proxy's caller is still protected from other pages


def _proc(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


async def test_the_process_holds_no_credential_and_asks_the_api_server_nothing_without_a_caller(
    incluster: Served, tenants: dict[str, str], tmp_path: Path
) -> None:
    pid = incluster.component.process.pid
    environ = dict(item.split("=", 1) for item in _proc(pid, "environ").decode().split("\0") if "=" in item)
    assert not {k for k in environ if "KUBE" in k or "TOKEN" in k.upper() or k == "HOME"}, environ
    args = _proc(pid, "cmdline").decode().split("\0")
    assert args[0].endswith("koord-queue-dashboard") or "koord-queue-dashboard" in " ".join(args[:3]), args
    assert not [a for a in args if "kubeconfig" in a or "token" in a or a.endswith(".key")], args
    for token in (tenants["alice"], tenants["viewer"]):
        assert token not in json.dumps(environ) and token not in " ".join(args)
    opened = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    files = [o for o in opened if o.startswith("/") and not o.startswith("/dev/")]
    assert not [f for f in files if "kubeconfig" in f or "token" in f or f.endswith((".key", ".crt"))], files

    # A dashboard whose API server records every request: a caller without a token reaches it never.
    async with recording_apiserver() as (apiserver, seen):
        served = start(tmp_path, "web-dashboard-recorded", apiserver, None)
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                for path in (
                    "/",
                    f"/ns/{tenants['a']}",
                    "/all",
                    "/api/session",
                    f"/api/ns/{tenants['a']}/units",
                ):
                    async with http.get(served.base + path) as r:
                        assert r.status == 401, path
                write = {"Content-Type": "application/json", "Origin": served.base}
                async with http.post(
                    served.base + f"/api/ns/{tenants['a']}/units/a-train/hold", data="{}", headers=write
                ) as r:
                    assert r.status == 401
                async with http.post(served.base + "/login", data="{}", headers=write) as r:
                    assert r.status == 400
                assert seen == []
                async with http.get(
                    served.base + "/api/session", headers={"Authorization": "Bearer probe"}
                ) as r:
                    assert r.status == 401
            assert [(s["path"], s["authorization"]) for s in seen] == [
                ("/apis/authentication.k8s.io/v1/selfsubjectreviews", "Bearer probe")
            ]
        finally:
            served.component.stop()


def test_the_component_is_accepted_by_the_api_server(e2e_cluster: LocalCluster) -> None:
    """manifests/components/web-dashboard through a server-side dry run, in the install namespace."""
    docs = chart_web.own_objects()
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Service", "ServiceAccount"]
    out = kube.kubectl(
        e2e_cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=web-dashboard-dry-run",
        "-f",
        "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    ).stdout
    assert out.count("(server dry run)") == 3, out


async def test_the_chaos_attacks_clients_act_with_only_her_token(
    e2e_cluster: LocalCluster, namespace_in: str
) -> None:
    """chaos/tenant_web_dashboard.py builds its clients from the harness's (admin) client: they
    reach the same API server, trusting its CA, as the token's owner and nobody else."""
    token = scraping.service_account_token(e2e_cluster, namespace_in, "mallory-web")
    admin = await shared_kube.Kube.connect(kubeconfig=str(e2e_cluster.kubeconfig))
    try:
        with tenant_web_dashboard._connect_like(admin) as connect:
            client = connect(token)
            try:
                assert await sessions.self_review(client) == f"{SERVICE_ACCOUNT}:{namespace_in}:mallory-web"
            finally:
                await client.close()
            with pytest.raises(sessions.TokenRefused):
                forged = connect("forged")
                try:
                    await sessions.self_review(forged)
                finally:
                    await forged.close()
    finally:
        await admin.close()

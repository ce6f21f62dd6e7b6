"""The in-cluster dashboard's callers and guard (docs/dashboard.md#installed-in-the-cluster), tried
against the real server on a real socket the way a caller without a token, a forged cookie, another
web page or too many callers would. Only the token check is a fake (the API server's
SelfSubjectReview); what a logged-in caller may then read or write is the API server's decision,
which tests/e2e/test_dashboard_incluster.py tries against the real control plane.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import zipfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from importlib import resources
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from koord_queue.certs import pki
from koord_queue.dashboard import cluster
from koord_queue.dashboard.guard import CSP
from koord_queue.dashboard.sessions import COOKIE, Sessions, TokenRefused, home_namespace, same_origin
from koord_queue.shared import kube
from testenv.processes import free_port
from tests.kube import eventually
from tests.unit.test_import_root import wheel  # noqa: F401  (the fixture)

GOOD = {"token-alice": "system:serviceaccount:team-a:alice", "token-oidc": "bob@example.com"}


class Tracked(kube.Kube):
    """The real client ``from_token`` builds, remembering whether it was closed."""

    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Served:
    def __init__(
        self, base: str, sessions: Sessions, clients: list[tuple[str, Tracked]], clock: Clock
    ) -> None:
        self.base = base
        self.sessions = sessions
        self.clients = clients
        self.clock = clock
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())

    async def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, dict[str, str], str]:
        async with self.http.request(
            method, self.base + path, headers=headers or {}, allow_redirects=False, **kw
        ) as response:
            return response.status, dict(response.headers), await response.text()

    def write_headers(self, cookie: str | None = None) -> dict[str, str]:
        sent = {"Content-Type": "application/json", "Origin": self.base}
        if cookie:
            sent["Cookie"] = f"{COOKIE}={cookie}"
        return sent

    async def login(self, token: str, namespace: str | None = None) -> tuple[int, str, str]:
        """``(status, cookie id or "", body)``"""
        body: dict[str, str] = {"token": token}
        if namespace:
            body["namespace"] = namespace
        status, headers, text = await self.request(
            "POST", "/login", headers=self.write_headers(), data=json.dumps(body)
        )
        cookie = ""
        if "Set-Cookie" in headers:
            cookie = SimpleCookie(headers["Set-Cookie"])[COOKIE].value
        return status, cookie, text


async def review(client: kube.Kube) -> str:
    """The API server's answer for the token: the fake of only this check."""
    token = next(token for token, c in CLIENTS if c is client)
    if token not in GOOD:
        raise TokenRefused("the API server refused this token (401 Unauthorized)")
    return GOOD[token]


CLIENTS: list[tuple[str, Tracked]] = []


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    CLIENTS.clear()
    clock = Clock()

    def connect(token: str) -> kube.Kube:
        # nothing listens there: a test that reached the API server would fail with a 502
        client = cast(Tracked, Tracked.from_token(host="https://127.0.0.1:9", token=token, ca_file=None))
        CLIENTS.append((token, client))
        return client

    sessions = Sessions(
        connect,
        component_namespace="koord-queue",
        idle_timeout=900,
        max_sessions=3,
        review=review,
        clock=clock,
    )
    app, _ = cluster.application(sessions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    it = Served(f"http://127.0.0.1:{port}", sessions, CLIENTS, clock)
    try:
        yield it
    finally:
        await it.http.close()
        await sessions.close_all()
        await runner.cleanup()


@pytest.mark.parametrize("path", ["/", "/ns/team-a", "/all", "/ns/team-a/units/x"])
async def test_without_a_token_a_page_is_the_login_page_with_401_and_nothing_reaches_the_api_server(
    served: Served, path: str
) -> None:
    status, headers, body = await served.request("GET", path)
    assert status == 401 and 'id="login"' in body and "/static/login.js" in body
    assert headers["Content-Security-Policy"] == CSP
    assert served.clients == []  # no client was even built


@pytest.mark.parametrize("path", ["/api/session", "/api/ns/team-a/units", "/api/all/units"])
async def test_without_a_token_the_api_is_401_json(served: Served, path: str) -> None:
    status, _, body = await served.request("GET", path)
    assert status == 401 and "not logged in" in json.loads(body)["error"]
    forged = {"Cookie": f"{COOKIE}=guess"}
    status, _, _ = await served.request("GET", path, headers=forged)
    assert status == 401
    assert served.clients == []


async def test_the_login_page_and_its_files_need_no_session(served: Served) -> None:
    for path in ("/login", "/static/login.js", "/static/style.css", "/static/favicon.svg"):
        status, _, _ = await served.request("GET", path)
        assert status == 200, path
    status, _, _ = await served.request("GET", "/static/app.js")
    assert status == 401  # the dashboard itself only to a caller


async def test_a_login_with_an_accepted_token_is_a_secure_httponly_strict_session(served: Served) -> None:
    status, headers, body = await served.request(
        "POST", "/login", headers=served.write_headers(), data=json.dumps({"token": "token-alice"})
    )
    assert status == 200, body
    assert json.loads(body) == {"user": "system:serviceaccount:team-a:alice", "namespace": "team-a"}
    morsel = SimpleCookie(headers["Set-Cookie"])[COOKIE]
    assert (
        morsel["httponly"] and morsel["secure"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    )
    assert morsel.value != "token-alice" and len(morsel.value) >= 40
    status, _, body = await served.request(
        "GET", "/api/session", headers={"Cookie": f"{COOKIE}={morsel.value}"}
    )
    assert status == 200
    assert json.loads(body) == {
        "namespace": "team-a",
        "allNamespaces": False,
        "user": "system:serviceaccount:team-a:alice",
        "cluster": True,
    }
    status, _, page = await served.request("GET", "/", headers={"Cookie": f"{COOKIE}={morsel.value}"})
    assert status == 200 and "/static/app.js" in page


async def test_a_refused_token_is_401_with_the_api_servers_answer_and_no_session(served: Served) -> None:
    status, cookie, body = await served.login("garbage")
    assert status == 401 and cookie == ""
    assert "refused this token" in json.loads(body)["error"]
    assert served.sessions.by_key == {}
    assert [c.closed for _, c in served.clients] == [True]  # its client was closed at once


async def test_a_login_names_its_namespace_else_a_service_accounts_own_else_default(served: Served) -> None:
    status, _, body = await served.login("token-oidc", "team-b")
    assert status == 200 and json.loads(body)["namespace"] == "team-b"
    assert home_namespace("bob@example.com", None) == "default"
    assert home_namespace("system:serviceaccount:ns1:sa", None) == "ns1"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "application/json"}, 403),  # no Origin
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, 403),
        ({"Content-Type": "application/json", "Origin": "null"}, 403),
        ({"Content-Type": "text/plain", "Origin": "{origin}"}, 415),  # what a cross-site form can send
        ({"Content-Type": "application/json", "Origin": "{origin}", "Sec-Fetch-Site": "cross-site"}, 403),
    ],
)
@pytest.mark.parametrize("path", ["/login", "/logout", "/api/ns/team-a/units/job/hold"])
async def test_the_login_the_logout_and_a_write_from_another_page_are_refused(
    served: Served, headers: dict[str, str], status: int, path: str
) -> None:
    _, cookie, _ = await served.login("token-alice")
    sent = {k: v.format(origin=served.base) for k, v in headers.items()}
    sent["Cookie"] = f"{COOKIE}={cookie}"
    got, _, body = await served.request("POST", path, headers=sent, data=json.dumps({"token": "token-oidc"}))
    assert got == status, body
    assert len(served.sessions.by_key) == 1  # no login, no logout happened


async def test_a_write_is_a_post_only(served: Served) -> None:
    _, cookie, _ = await served.login("token-alice")
    for method in ("PUT", "DELETE", "PATCH"):
        status, _, _ = await served.request(
            method, "/api/ns/team-a/units/job/hold", headers=served.write_headers(cookie)
        )
        assert status == 405


def test_the_origin_is_compared_with_the_host_the_request_was_sent_to() -> None:
    def request(origin: str, host: str) -> web.Request:
        from aiohttp.test_utils import make_mocked_request

        return make_mocked_request("POST", "/login", headers={"Origin": origin, "Host": host})

    assert same_origin(request("https://dash.example.com", "dash.example.com"))
    assert same_origin(request("https://dash.example.com", "dash.example.com:443"))
    assert same_origin(request("http://127.0.0.1:8080", "127.0.0.1:8080"))
    assert not same_origin(request("http://127.0.0.1:8081", "127.0.0.1:8080"))
    assert not same_origin(request("https://evil.example", "dash.example.com"))
    assert not same_origin(request("https://dash.example.com.evil.example", "dash.example.com"))


async def test_an_idle_session_is_closed_with_its_client(served: Served) -> None:
    _, cookie, _ = await served.login("token-alice")
    ((_, client),) = served.clients
    clock = served.clock
    clock.now += 600
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert status == 200  # used: its idle time starts again
    clock.now += 600
    assert await served.sessions.expire() == 0
    clock.now += 301
    assert await served.sessions.expire() == 1
    assert client.closed and served.sessions.by_key == {}
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert status == 401


async def test_an_idle_session_found_on_its_next_request_is_closed_there(served: Served) -> None:
    _, cookie, _ = await served.login("token-alice")
    served.clock.now += 901
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert status == 401
    assert served.clients[0][1].closed


async def test_beyond_max_sessions_a_caller_gets_503_with_a_message(served: Served) -> None:
    for _ in range(3):
        status, _, _ = await served.login("token-alice")
        assert status == 200
    status, cookie, body = await served.login("token-oidc")
    assert status == 503 and "--max-sessions" in json.loads(body)["error"] and cookie == ""
    status, _, body = await served.request(
        "GET", "/api/session", headers={"Authorization": "Bearer token-oidc"}
    )
    assert status == 503
    assert len(served.sessions.by_key) == 3
    assert all(c.closed for t, c in served.clients if t == "token-oidc")


async def test_logout_closes_the_session_and_its_client(served: Served) -> None:
    _, cookie, _ = await served.login("token-alice")
    status, headers, _ = await served.request(
        "POST", "/logout", headers=served.write_headers(cookie), data="{}"
    )
    assert status == 200 and SimpleCookie(headers["Set-Cookie"])[COOKIE].value == ""
    assert served.sessions.by_key == {} and served.clients[0][1].closed
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert status == 401


async def test_a_second_login_in_the_same_browser_closes_the_first_session(served: Served) -> None:
    _, first, _ = await served.login("token-alice")
    status, headers, _ = await served.request(
        "POST", "/login", headers=served.write_headers(first), data=json.dumps({"token": "token-oidc"})
    )
    assert status == 200
    assert list(served.sessions.by_key) == [SimpleCookie(headers["Set-Cookie"])[COOKIE].value]
    assert served.clients[0][1].closed


async def test_the_authorization_header_acts_as_its_token_one_session_per_token(served: Served) -> None:
    for _ in range(2):
        status, _, body = await served.request(
            "GET", "/api/session", headers={"Authorization": "Bearer token-oidc"}
        )
        assert status == 200 and json.loads(body)["user"] == "bob@example.com"
    assert len(served.clients) == 1 and len(served.sessions.by_key) == 1
    (key,) = served.sessions.by_key
    assert "token-oidc" not in key  # kept by the token's hash
    # the hash is no cookie: a forged cookie naming it is no session
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={key}"})
    assert status == 401


@pytest.mark.parametrize("header", ["Bearer garbage", "Basic YWxpY2U6cHc=", "Bearer ", "token-alice"])
async def test_a_refused_or_malformed_authorization_header_is_401(served: Served, header: str) -> None:
    status, _, body = await served.request("GET", "/ns/team-a", headers={"Authorization": header})
    assert status == 401 and "refused" in json.loads(body)["error"]
    assert served.sessions.by_key == {}


async def test_a_write_with_the_authorization_header_keeps_the_origin_rule(served: Served) -> None:
    """Behind a proxy that adds the header from its own cookie, a cross-site form must not write."""
    status, _, _ = await served.request(
        "POST",
        "/api/ns/team-a/units/job/hold",
        headers={
            "Authorization": "Bearer token-alice",
            "Content-Type": "application/json",
            "Origin": "https://evil.example",
        },
        data="{}",
    )
    assert status == 403
    assert served.clients == []


def test_the_flags_default_to_the_pods_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("POD_NAMESPACE", "kq")
    args = cluster.parser().parse_args([])
    assert args.apiserver == "https://10.96.0.1:443"
    assert args.apiserver_ca_file == cluster.DEFAULT_CA_FILE
    assert args.koord_queue_namespace == "kq"
    assert (args.bind_address, args.health_port, args.session_idle_timeout, args.max_sessions) == (
        ("0.0.0.0", 8080),
        8081,
        900.0,
        50,
    )
    args = cluster.parser().parse_args(["--session-idle-timeout", "90s", "--bind-address", "127.0.0.1:0"])
    assert args.session_idle_timeout == 90.0 and args.bind_address == ("127.0.0.1", 0)
    with pytest.raises(SystemExit):
        cluster.parser().parse_args(["--session-idle-timeout", "0"])


def test_the_wheel_ships_the_login_page(wheel: Path) -> None:  # noqa: F811
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("login.html", "login.js"):
        assert f"koord_queue/dashboard/static/{name}" in names


def test_the_login_page_loads_nothing_from_anywhere_else() -> None:
    for name in ("login.html", "login.js"):
        text = resources.files("koord_queue.dashboard").joinpath("static", name).read_text()
        assert "http://" not in text and "https://" not in text, name
        assert "innerHTML" not in text and "<script>" not in text and "style=" not in text, name


async def test_a_stranger_sending_ever_new_tokens_gets_429_past_the_review_budget(served: Served) -> None:
    """Each new token costs a review on the API server: 20 at once, then 10 a second (the clock
    stands still here), while a session already open is still served."""
    status, cookie, _ = await served.login("token-alice")
    assert status == 200
    statuses = []
    for i in range(25):
        answer, _, _ = await served.request(
            "GET", "/api/session", headers={"Authorization": f"Bearer forged-{i}"}
        )
        statuses.append(answer)
    assert statuses == [401] * 19 + [429] * 6  # one of the 20 went to her login
    status, _, body = await served.login("token-oidc")
    assert status == 429 and "too many new tokens" in json.loads(body)["error"]
    status, _, _ = await served.request("GET", "/api/session", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert status == 200
    served.clock.now += 1.0  # ten more a second
    status, _, _ = await served.login("token-oidc")
    assert status == 200
    assert len(served.clients) == 21  # no client was built for a refused one


async def test_the_server_answers_https_with_its_certificate_and_health_on_a_plain_port(
    tmp_path: Path,
) -> None:
    """``koord-queue-dashboard`` as its entry point runs it, with --tls-cert-file and
    --tls-private-key-file: the pages over HTTPS (no caller: the login page), /healthz and /readyz
    over plain HTTP on the health port."""
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="test-ca", now=now)
    serving = pki.issue_serving(
        ca=ca, common_name="dashboard", dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
    )
    for name, data in (("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem), ("ca.crt", ca.cert_pem)):
        (tmp_path / name).write_bytes(data)
    port, health = free_port(), free_port()
    args = cluster.parser().parse_args(
        [
            f"--bind-address=127.0.0.1:{port}",
            f"--health-port={health}",
            "--apiserver=https://127.0.0.1:9",
            f"--apiserver-ca-file={tmp_path / 'ca.crt'}",
            f"--tls-cert-file={tmp_path / 'tls.crt'}",
            f"--tls-private-key-file={tmp_path / 'tls.key'}",
        ]
    )
    stopped = asyncio.Event()
    serving_task = asyncio.create_task(cluster.serve(args, stopped))
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{health}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await eventually(ready, timeout=10, what="the dashboard ready")
        async with http.get(f"http://127.0.0.1:{health}/healthz") as r:
            assert r.status == 200
        async with http.get(f"https://127.0.0.1:{port}/ns/team-a", ssl=trust) as r:
            assert r.status == 401 and 'id="login"' in await r.text()
        with pytest.raises(aiohttp.ClientError):  # no plain HTTP on the TLS port
            async with http.get(f"http://127.0.0.1:{port}/login") as r:
                await r.read()
    stopped.set()
    assert await asyncio.wait_for(serving_task, timeout=10) == 0


def test_a_missing_ca_bundle_or_api_server_stops_the_server_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cluster.main(["--apiserver=https://127.0.0.1:9", f"--apiserver-ca-file={tmp_path / 'none.crt'}"])
    assert "no CA bundle at" in capsys.readouterr().err
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit):
        cluster.main([])
    assert "--apiserver is needed" in capsys.readouterr().err

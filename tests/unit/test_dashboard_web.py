"""The dashboard's local server refuses everything but its own page
(docs/dashboard.md#local-server-protections): each refusal is tried here the way an attacker on the
same machine or a hostile web page would, against the real server on a real socket; and the pages
load nothing from anywhere else and ship in the wheel.

What a request that gets through may read or write is the API server's decision, with the user's
own identity: tests/e2e/test_dashboard.py tries that against the real control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import re
import webbrowser
import zipfile
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from importlib import resources
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from koord_queue.cli import completion
from koord_queue.cli import main as cli_main
from koord_queue.cli.client import Denied, Gathered, Reader
from koord_queue.dashboard import server
from koord_queue.dashboard.api import Api
from koord_queue.dashboard.guard import CSP, Guard
from koord_queue.shared import kube
from tests.unit.test_import_root import wheel  # noqa: F401  (the fixture)

STATIC = ("index.html", "app.js", "style.css", "favicon.svg")


class RefusingClient:
    """The API server as it answers a user bound to namespace ``team-a`` only."""

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if "/namespaces/team-a/" in path:
            return {"items": []}
        raise kube.KubeError(
            403,
            "Forbidden",
            'queueunits.scheduling.x-k8s.io is forbidden: User "alice" cannot list resource "queueunits"',
        )

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Nothing ever changes: the watch stays open until the dashboard stops it."""
        await asyncio.Event().wait()
        yield "BOOKMARK", {}


class RefusingReader:
    """A reader for which RBAC refuses every QueueUnit list, as for another namespace."""

    client = RefusingClient()

    async def units(self, namespace: str | None, got: Gathered, **_: Any) -> None:
        raise Denied("list", "queueunits", "scheduling.x-k8s.io", namespace, "forbidden: alice cannot list")


class Served:
    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.base = f"http://127.0.0.1:{guard.port}"
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())

    async def request(
        self, method: str, path: str, *, cookie: bool = True, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, dict[str, str], str]:
        sent = dict(headers or {})
        if cookie:
            sent["Cookie"] = f"{self.guard.cookie}={self.guard.session}"
        async with self.http.request(
            method, self.base + path, headers=sent, allow_redirects=False, **kw
        ) as response:
            return response.status, dict(response.headers), await response.text()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    sock = server.listen(0)
    guard = Guard(sock.getsockname()[1])
    api = Api(cast(Reader, RefusingReader()), "team-a", False, "alice")
    runner = web.AppRunner(server.application(api, guard), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    it = Served(guard)
    try:
        yield it
    finally:
        await it.http.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    "path", ["/", "/ns/team-a", "/api/session", "/api/ns/team-a/units", "/static/app.js"]
)
async def test_without_the_session_cookie_every_request_is_401(served: Served, path: str) -> None:
    status, _, body = await served.request("GET", path, cookie=False)
    assert status == 401, body
    forged = {"Cookie": f"{served.guard.cookie}=guess"}
    status, _, _ = await served.request("GET", path, cookie=False, headers=forged)
    assert status == 401


async def test_the_token_is_exchanged_for_an_httponly_strict_cookie_and_dropped_from_the_url(
    served: Served,
) -> None:
    status, headers, _ = await served.request("GET", f"/ns/team-a?token={served.guard.token}", cookie=False)
    assert status == 303
    assert headers["Location"] == "/ns/team-a"
    morsel = SimpleCookie(headers["Set-Cookie"])[served.guard.cookie]
    assert morsel.value == served.guard.session != served.guard.token
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    status, _, _ = await served.request("GET", "/ns/team-a?token=not-the-token", cookie=False)
    assert status == 401
    status, _, page = await served.request("GET", "/ns/team-a")
    assert status == 200 and "/static/app.js" in page


def test_the_printed_url_carries_an_unguessable_token_and_each_run_its_own() -> None:
    one, two = Guard(8080), Guard(8080)
    assert one.token != two.token and one.session != two.session
    assert len(one.token) >= 40  # 32 random bytes, URL-safe
    assert one.url("/ns/x") == f"http://127.0.0.1:8080/ns/x?token={one.token}"
    assert Guard(8081).cookie != one.cookie  # two dashboards on one machine keep their own cookies


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:1", "10.0.0.1:{port}"])
async def test_a_foreign_host_header_is_refused_even_with_the_cookie(served: Served, host: str) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1."""
    status, _, body = await served.request(
        "GET", "/api/session", headers={"Host": host.format(port=served.guard.port)}
    )
    assert status == 403 and "Host" in body


async def test_localhost_and_127_0_0_1_are_both_accepted(served: Served) -> None:
    for host in ("127.0.0.1:{port}", "localhost:{port}"):
        status, _, body = await served.request(
            "GET", "/api/session", headers={"Host": host.format(port=served.guard.port)}
        )
        assert status == 200, body


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
async def test_a_write_from_anywhere_but_the_dashboards_page_is_refused(
    served: Served, headers: dict[str, str], status: int
) -> None:
    origin = served.base
    sent = {k: v.format(origin=origin) for k, v in headers.items()}
    got, _, body = await served.request("POST", "/api/ns/team-a/units/job/hold", headers=sent, data="{}")
    assert got == status, body
    assert "permission denied" not in body  # refused before the plugin's command ran


async def test_a_write_is_a_post_only(served: Served) -> None:
    for method in ("PUT", "DELETE", "PATCH"):
        status, _, _ = await served.request(
            method, "/api/ns/team-a/units/job/hold", headers={"Origin": served.base}
        )
        assert status == 405


async def test_a_same_origin_write_runs_the_plugins_command_and_an_rbac_refusal_is_403_naming_the_permission(
    served: Served,
) -> None:
    status, _, body = await served.request(
        "POST",
        "/api/ns/team-b/units/job/hold",
        headers={"Content-Type": "application/json", "Origin": served.base},
        data="{}",
    )
    assert status == 403
    assert (
        'you may not list "queueunits.scheduling.x-k8s.io" in namespace "team-b"' in json.loads(body)["error"]
    )
    status, _, body = await served.request("GET", "/api/ns/team-b/units")
    assert status == 403 and "missing RBAC permission" in json.loads(body)["error"]


async def test_every_answer_carries_the_strict_content_security_policy(served: Served) -> None:
    for path, cookie in (("/", True), ("/static/style.css", True), ("/api/session", False)):
        _, headers, _ = await served.request("GET", path, cookie=cookie)
        assert headers["Content-Security-Policy"] == CSP
        assert "default-src 'self'" in CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"


async def test_only_the_pages_own_files_are_served(served: Served) -> None:
    for name in STATIC[1:]:
        status, _, _ = await served.request("GET", f"/static/{name}")
        assert status == 200, name
    for path in ("/static/../api.py", "/static/%2e%2e/server.py", "/static/views.py", "/static/index.htm"):
        status, _, _ = await served.request("GET", path)
        assert status == 404, path


def test_the_pages_load_nothing_from_anywhere_else() -> None:
    """No CDN, font or script from outside: every URL in the pages is the server's own path, and
    nothing is written inline (the CSP would refuse it)."""
    for name in STATIC:
        text = resources.files("koord_queue.dashboard").joinpath("static", name).read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), name
        assert "@import" not in text and "url(" not in text, name
        assert "innerHTML" not in text and "eval(" not in text, name
    page = resources.files("koord_queue.dashboard").joinpath("static", "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', page) == [
        "/static/favicon.svg",
        "/static/style.css",
        "/static/app.js",
        "#main",
        "/",
        "/",
        "/",
        "/",
    ]
    assert "<script>" not in page and "style=" not in page and "<style" not in page


def test_the_wheel_ships_the_pages(wheel: Path) -> None:  # noqa: F811
    names = zipfile.ZipFile(wheel).namelist()
    for name in STATIC:
        assert f"koord_queue/dashboard/static/{name}" in names


def test_the_plugin_lists_the_dashboard_command() -> None:
    text = cli_main.parser().format_help()
    assert "dashboard" in text
    args = cli_main.parser().parse_args(["dashboard", "--no-browser", "--port", "0", "-n", "team-a"])
    assert (args.command, args.no_browser, args.port, args.namespace) == ("dashboard", True, 0, "team-a")


def test_the_shell_completion_knows_the_dashboard_and_its_flags() -> None:
    assert "dashboard" in completion.answer(["dash"]).splitlines()
    flags = completion.answer(["dashboard", "--"]).splitlines()
    assert {"--port", "--no-browser", "--all-namespaces"} <= set(flags)


def _luminance(colour: str) -> float:
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(one: str, two: str) -> float:
    """The WCAG 2 contrast ratio of two ``#rrggbb`` colours."""
    high, low = sorted((_luminance(one), _luminance(two)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_every_text_colour_is_readable_on_its_background() -> None:
    """WCAG AA for normal text: at least 4.5:1, for each pair the stylesheet puts together."""
    css = resources.files("koord_queue.dashboard").joinpath("static", "style.css").read_text()
    colour = dict(re.findall(r"--([a-z]+):\s*(#[0-9a-fA-F]{6});", css))
    assert contrast("#000000", "#ffffff") == pytest.approx(21)
    pairs = [
        (colour["fg"], colour["bg"]),
        (colour["fg"], colour["panel"]),
        (colour["muted"], colour["bg"]),
        (colour["link"], colour["bg"]),
        (colour["wait"], colour["bg"]),
        (colour["ok"], colour["bg"]),
        (colour["bad"], colour["bg"]),
        (colour["bad"], colour["panel"]),
        (colour["bad"], "#fff5f5"),  # the refusal panel
        ("#ffffff", colour["head"]),  # the header
    ]
    for text, background in pairs:
        assert contrast(text, background) >= 4.5, (text, background)
    assert contrast(colour["focus"], colour["bg"]) >= 3  # the focus ring: a non-text contrast


async def test_another_namespaces_page_is_refused_itself_and_still_says_why(served: Served) -> None:
    """The page of a namespace the API server refuses is a 403 (its script then shows the plugin's
    message from the data request); the user's own namespace is a 200."""
    for path, status in (
        ("/ns/team-a", 200),
        ("/ns/team-b", 403),
        ("/ns/team-b/units/x", 403),
        ("/all", 403),
    ):
        got, _, page = await served.request("GET", path)
        assert got == status, path
        assert "/static/app.js" in page


@pytest.mark.parametrize("no_browser", [False, True])
async def test_serve_prints_the_url_and_opens_the_browser_at_it_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, no_browser: bool
) -> None:
    opened: list[str] = []

    def browse(url: str) -> bool:
        opened.append(url)
        return True

    monkeypatch.setattr(webbrowser, "open", browse)
    out = io.StringIO()
    flags = argparse.Namespace(port=0, no_browser=no_browser, all_namespaces=False, namespace="team-a")
    task = asyncio.create_task(server.serve(cast(Reader, RefusingReader()), flags, out, "alice"))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while "token=" not in out.getvalue() or (not no_browser and not opened):
            assert asyncio.get_running_loop().time() < deadline, out.getvalue()
            await asyncio.sleep(0.01)
        (url,) = re.findall(r"http://127\.0\.0\.1:\d+/ns/team-a\?token=[\w-]+", out.getvalue())
        assert opened == ([] if no_browser else [url])
        async with (
            aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
            http.get(url, allow_redirects=False) as response,
        ):
            assert response.status == 303  # the printed URL is this server's
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

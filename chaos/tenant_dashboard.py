"""Hostile-tenant attacks through ``kubectl koord-queue dashboard`` (docs/dashboard.md).

The dashboard runs inside the plugin, on 127.0.0.1, and acts as whoever started it. Mallory
(``chaos.tenant``) tries it both ways each round, with plain HTTP (what a browser sends, without a
browser: the session cookie is the one the printed URL's token is exchanged for):

``read-another-namespace-through-the-dashboard``
    her own dashboard (the plugin's server in-process, with her client), asked for the page, the
    units and one unit of a namespace she has no rights in (the load's borrowing namespace), and
    to hold a job there from the dashboard's own page (right Origin). The dashboard has no identity
    of its own, so the API server refuses her: 403 each time, while her own namespace's page is
    served (the control);
``write-through-a-dashboard-from-another-origin``
    an administrator's dashboard (the harness's client) that the admin has opened in the browser,
    and her page on another local port in the same browser: the browser attaches the admin's
    cookie (every port of 127.0.0.1 is the same site), so her hold request carries it, with her
    page's Origin, as a JSON fetch and as a form; and a DNS name of hers rebound to 127.0.0.1 (the
    Host header); and with no cookie at all. The guard must refuse each before it runs a command
    (401 or 403). The job she names does not exist, so a write that got through answers 404 and
    holds nothing: the breach shows without harming the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping
from http.cookies import SimpleCookie
from typing import Final

import aiohttp
from aiohttp import web

from chaos import load
from chaos.tenant_common import NAMESPACE, UNITS, Attacker, _meta
from koord_queue.cli.client import Reader
from koord_queue.dashboard import server
from koord_queue.dashboard.api import Api
from koord_queue.dashboard.guard import Guard
from koord_queue.shared import kube
from testenv import system

READ_OTHER: Final = "read-another-namespace-through-the-dashboard"
CROSS_ORIGIN: Final = "write-through-a-dashboard-from-another-origin"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``).
ATTACKS: Final[dict[str, str]] = {
    READ_OTHER: "the dashboard acts as the user who started it: the API server refuses her another "
    "namespace's QueueUnits and writes, and the page itself is a 403 (docs/dashboard.md#the-identity-model)",
    CROSS_ORIGIN: "the dashboard's guard: a session cookie only the printed URL's token gets (401), "
    "the Host must be 127.0.0.1 or localhost and a write's Origin the dashboard itself, as JSON "
    "(403) (docs/dashboard.md#local-server-protections)",
}
#: A namespace of the load she has no rights in.
OTHER_NAMESPACE: Final = load.BORROW_NAMESPACE
#: A job name nobody uses: a write that passes the guard answers 404 and changes nothing.
NO_SUCH_JOB: Final = "mallory-no-such-job"
TIMEOUT: Final = aiohttp.ClientTimeout(total=60)
TRIES: Final = 3


class Dashboard:
    """The plugin's dashboard server for ``client``, on a free port of 127.0.0.1, as ``serve`` builds
    it (the same application, guard and API), without the terminal and the browser."""

    def __init__(self, client: kube.Kube, namespace: str, user: str) -> None:
        self.api = Api(Reader(client, system.NAMESPACE), namespace, False, user)
        self.sock = server.listen(0)
        self.guard = Guard(self.sock.getsockname()[1])
        self.runner = web.AppRunner(server.application(self.api, self.guard), access_log=None)
        self.base = f"http://127.0.0.1:{self.guard.port}"

    async def __aenter__(self) -> Dashboard:
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.runner.cleanup()
        await self.api.pages.close()

    async def session_cookie(self, http: aiohttp.ClientSession) -> str:
        """Open the printed URL as the browser does: the token is exchanged for the cookie."""
        async with http.get(self.guard.url(f"/ns/{NAMESPACE}"), allow_redirects=False) as resp:
            cookie: SimpleCookie = SimpleCookie()
            for header in resp.headers.getall("Set-Cookie", []):
                cookie.load(header)
            morsel = cookie.get(self.guard.cookie)
            if resp.status != 303 or morsel is None:
                raise RuntimeError(f"the token exchange answered {resp.status} without the cookie")
            return f"{self.guard.cookie}={morsel.value}"


async def _status(
    http: aiohttp.ClientSession, method: str, url: str, headers: Mapping[str, str], body: str | None = None
) -> int:
    async with http.request(method, url, headers=dict(headers), data=body, allow_redirects=False) as resp:
        await resp.read()
        return resp.status


def judge(
    answers: Mapping[str, int], *, refused: tuple[int, ...], control: int | None = None
) -> tuple[str, str]:
    """The outcome of a set of requests (what -> HTTP status): any answer outside ``refused`` is a
    breach; all inside, a refusal. A ``control`` request (the same session, one that must be
    served) that was not served, or a 5xx (the API server down under a fault), leaves the tries
    unjudged (skipped)."""
    shown = ", ".join(f"{what}: {status}" for what, status in answers.items())
    if control is not None and control != 200:
        return "skipped", f"the control request answered {control}, not 200 ({shown})"
    if any(status >= 500 for status in answers.values()):
        # The API server failing (a fault of the run): 502 from the dashboard, no decision to judge.
        return "skipped", f"the API server failed meanwhile ({shown})"
    if any(status not in refused for status in answers.values()):
        return "SUCCEEDED", f"got through ({shown})"
    return "refused", shown


async def _other_unit(t: Attacker) -> str:
    """A unit of :data:`OTHER_NAMESPACE` (as the harness sees them), else a made-up name."""
    items = await t._read(functools.partial(t.admin.list, UNITS, namespace=OTHER_NAMESPACE))
    units = items if isinstance(items, list) else []  # _read answers a list's items
    names = sorted(str(_meta(u).get("name")) for u in units)
    return names[0] if names else NO_SUCH_JOB


async def read_other_namespace(t: Attacker, http: aiohttp.ClientSession) -> tuple[str, str, str]:
    """Her own dashboard, asked for another namespace: ``(outcome, target, detail)``."""
    m = t.mallory
    assert m is not None
    unit = await _other_unit(t)
    async with Dashboard(m, NAMESPACE, "mallory") as board:
        cookie = await board.session_cookie(http)
        headers = {"Cookie": cookie}
        control = await _status(http, "GET", f"{board.base}/ns/{NAMESPACE}", headers)
        other = f"/ns/{OTHER_NAMESPACE}"
        answers = {
            "page": await _status(http, "GET", f"{board.base}{other}", headers),
            "units": await _status(http, "GET", f"{board.base}/api{other}/units", headers),
            "one unit": await _status(http, "GET", f"{board.base}/api{other}/units/{unit}", headers),
            "hold": await _status(
                http,
                "POST",
                f"{board.base}/api{other}/units/{unit}/hold",
                {**headers, "Origin": board.base, "Content-Type": "application/json"},
                "{}",
            ),
        }
        outcome, detail = judge(answers, refused=(403,), control=control)
        if outcome == "SUCCEEDED" and answers["hold"] == 200:
            # Put the job back so that the rest of the run stays meaningful.
            with contextlib.suppress(aiohttp.ClientError):
                await _status(
                    http,
                    "POST",
                    f"{board.base}/api{other}/units/{unit}/release",
                    {**headers, "Origin": board.base, "Content-Type": "application/json"},
                    "{}",
                )
    return outcome, f"{OTHER_NAMESPACE} (unit {unit})", detail


async def cross_origin_write(t: Attacker, http: aiohttp.ClientSession) -> tuple[str, str, str]:
    """Her page against an admin's dashboard: ``(outcome, target, detail)``."""
    async with Dashboard(t.admin, OTHER_NAMESPACE, "admin") as board:
        cookie = await board.session_cookie(http)
        theirs = f"http://127.0.0.1:{board.guard.port + 1}"  # her page, on another local port
        hold = f"{board.base}/api/ns/{OTHER_NAMESPACE}/units/{NO_SUCH_JOB}/hold"
        json_type = {"Content-Type": "application/json"}
        # The control: the admin's own page may write (the job does not exist: 404, nothing held).
        control = await _status(
            http, "POST", hold, {"Cookie": cookie, "Origin": board.base, **json_type}, "{}"
        )
        answers = {
            "no cookie": await _status(http, "POST", hold, {"Origin": board.base, **json_type}, "{}"),
            "her page's fetch": await _status(
                http,
                "POST",
                hold,
                {"Cookie": cookie, "Origin": theirs, "Sec-Fetch-Site": "same-site", **json_type},
                "{}",
            ),
            "her page's form": await _status(
                http,
                "POST",
                hold,
                {
                    "Cookie": cookie,
                    "Origin": theirs,
                    "Sec-Fetch-Site": "same-site",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                "priority=1",
            ),
            "no Origin": await _status(http, "POST", hold, {"Cookie": cookie, **json_type}, "{}"),
            "rebound Host": await _status(
                http,
                "POST",
                hold,
                {
                    "Cookie": cookie,
                    "Host": f"mallory.example:{board.guard.port}",
                    "Origin": board.base,
                    **json_type,
                },
                "{}",
            ),
        }
    # The control must have passed the guard and reached the API (404: no such unit).
    outcome, detail = judge(answers, refused=(401, 403), control=200 if control == 404 else control)
    return outcome, f"admin's dashboard, hold {OTHER_NAMESPACE}/{NO_SUCH_JOB}", detail


async def dashboard_attacks(t: Attacker, r: int) -> None:
    """The module's attacks for round ``r``; a try left unjudged by a fault is tried again (at most
    :data:`TRIES` times; the last one is recorded either way)."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for attack in (read_other_namespace, cross_origin_write):
            for attempt in range(TRIES):
                outcome, target, detail = await attack(t, http)
                if outcome != "skipped" or attempt == TRIES - 1:
                    break
                await asyncio.sleep(3.0)
            t.record(
                READ_OTHER if attack is read_other_namespace else CROSS_ORIGIN, r, target, outcome, detail
            )

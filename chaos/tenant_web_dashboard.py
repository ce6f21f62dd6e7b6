"""Hostile-tenant attack through the web dashboard installed in the cluster
(docs/dashboard.md#installed-in-the-cluster).

Installed in the cluster, the dashboard has no identity of its own: each request acts with its
caller's token. Mallory (``chaos.tenant``) takes a token of her own namespace (the metrics
attack's: her namespace's ServiceAccount, ``chaos/tenant_metrics.py``) to the in-cluster server
(``koord-queue-dashboard``'s application, run in the harness against the same API server, with
no credential of its own), logs in with it and asks for another namespace's page, its units, one
of its units and a hold there; the same through the Authorization header, as behind a proxy; and
the page with no token at all. Every answer must be a refusal (403 from the API server, 401 with
no token); her own namespace's page, with the same session, is the control that must be served.

``read-another-namespace-through-the-in-cluster-dashboard``
    the tries above; a 200 for anything of the other namespace is a breach.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Final

import aiohttp
from aiohttp import web

from chaos import tenant_metrics
from chaos.tenant_common import NAMESPACE, Attacker
from chaos.tenant_dashboard import OTHER_NAMESPACE, TIMEOUT, TRIES, _other_unit, _status, judge
from koord_queue.dashboard import cluster
from koord_queue.dashboard.sessions import COOKIE, Connect, Sessions
from koord_queue.shared import kube
from testenv import system

IN_CLUSTER: Final = "read-another-namespace-through-the-in-cluster-dashboard"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``).
ATTACKS: Final[dict[str, str]] = {
    IN_CLUSTER: "the in-cluster dashboard has no identity of its own: every request acts with its "
    "caller's token, so the API server refuses her token another namespace's page, units and writes "
    "(403), and no token reads nothing (401) (docs/dashboard.md#installed-in-the-cluster)",
}
#: Seconds between tries of an unjudged attempt (a fault of the run).
PAUSE = 3.0
TokenOf = Callable[[Attacker], Awaitable[tuple[str | None, str]]]


@contextlib.contextmanager
def _connect_like(admin: kube.Kube) -> Iterator[Connect]:
    """Clients that send only the given token to the API server the harness talks to, trusting
    its CA (written to a file for the attack's time when the harness holds it in memory)."""
    settings = admin.settings
    with tempfile.TemporaryDirectory(prefix="mallory-web-") as tmp:
        ca_file = settings.ca_file
        if ca_file is None and settings.ca_data:
            (Path(tmp) / "ca.crt").write_bytes(settings.ca_data)
            ca_file = str(Path(tmp) / "ca.crt")

        def connect(token: str) -> kube.Kube:
            return kube.Kube.from_token(
                host=settings.host, token=token, ca_file=ca_file, user_agent="mallory-web"
            )

        yield connect


async def _login(http: aiohttp.ClientSession, base: str, token: str) -> tuple[int, str]:
    """POST /login as the login page sends it: ``(status, cookie header or "")``."""
    headers = {"Origin": base, "Content-Type": "application/json"}
    async with http.post(f"{base}/login", json={"token": token}, headers=headers) as resp:
        await resp.read()
        morsel = SimpleCookie(resp.headers.get("Set-Cookie", "")).get(COOKIE)
        return resp.status, f"{COOKIE}={morsel.value}" if morsel is not None else ""


async def in_cluster_other_namespace(
    t: Attacker, http: aiohttp.ClientSession, token: str, connect: Connect
) -> tuple[str, str, str]:
    """Her token through the in-cluster dashboard, asked for another namespace:
    ``(outcome, target, detail)``."""
    unit = await _other_unit(t)
    sessions = Sessions(connect, component_namespace=system.NAMESPACE, idle_timeout=300, max_sessions=5)
    app, _ = cluster.application(sessions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        status, cookie = await _login(http, base, token)
        if status != 200 or not cookie:
            return "skipped", OTHER_NAMESPACE, f"her token's login answered {status}"
        session = {"Cookie": cookie}
        header = {"Authorization": f"Bearer {token}"}
        write = {"Origin": base, "Content-Type": "application/json"}
        control = await _status(http, "GET", f"{base}/api/ns/{NAMESPACE}/units", session)
        other = f"/ns/{OTHER_NAMESPACE}"
        answers = {
            "page, no token": await _status(http, "GET", f"{base}{other}", {}),
            "page": await _status(http, "GET", f"{base}{other}", session),
            "units": await _status(http, "GET", f"{base}/api{other}/units", session),
            "one unit": await _status(http, "GET", f"{base}/api{other}/units/{unit}", session),
            "hold": await _status(
                http, "POST", f"{base}/api{other}/units/{unit}/hold", {**session, **write}, "{}"
            ),
            "units, header": await _status(http, "GET", f"{base}/api{other}/units", header),
            "hold, header": await _status(
                http, "POST", f"{base}/api{other}/units/{unit}/hold", {**header, **write}, "{}"
            ),
        }
        outcome, detail = judge(answers, refused=(401, 403), control=control)
        if outcome == "SUCCEEDED" and 200 in (answers["hold"], answers["hold, header"]):
            # Put the job back so that the rest of the run stays meaningful.
            await _status(http, "POST", f"{base}/api{other}/units/{unit}/release", {**header, **write}, "{}")
        return outcome, f"{OTHER_NAMESPACE} (unit {unit})", detail
    finally:
        await sessions.close_all()
        await runner.cleanup()


async def web_dashboard_attacks(
    t: Attacker, r: int, *, connect: Connect | None = None, token_of: TokenOf = tenant_metrics.own_token
) -> None:
    """The module's attack for round ``r``; a try left unjudged by a fault is tried again (at most
    ``TRIES`` times; the last one is recorded either way)."""
    token, how = await token_of(t)
    if token is None:
        t.record(IN_CLUSTER, r, OTHER_NAMESPACE, "skipped", how)
        return
    with contextlib.ExitStack() as stack:
        if connect is None:
            connect = stack.enter_context(_connect_like(t.admin))
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            attack = functools.partial(in_cluster_other_namespace, t, http, token, connect)
            outcome, target, detail = await _tries(attack)
    t.record(IN_CLUSTER, r, target, outcome, f"{detail} ({how})")


async def _tries(attack: Callable[[], Awaitable[tuple[str, str, str]]]) -> tuple[str, str, str]:
    """The attack until it is judged, at most ``TRIES`` times (the last one counts either way)."""
    for attempt in range(TRIES):
        outcome, target, detail = await attack()
        if outcome != "skipped" or attempt == TRIES - 1:
            break
        await asyncio.sleep(PAUSE)
    return outcome, target, detail

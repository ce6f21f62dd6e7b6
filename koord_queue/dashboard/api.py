"""The dashboard's JSON endpoints: each one runs the plugin's own command code
(``koord_queue.cli``) with the user's API client, so a page shows exactly what
``kubectl koord-queue list``, ``explain``, ``describe`` and ``quotas`` print, and a button does
exactly what ``hold``, ``release`` and ``priority`` do (docs/dashboard.md#the-identity-model). The
queue page is ``dashboard.queuepage``'s: the same rows and ``explain``'s answers, from QueueUnits
listed once and then watched, built once per change (docs/dashboard.md#what-it-costs).

Nothing is read or written with any identity but the one the plugin was started with; a refusal
by the API server becomes the plugin's own message with the plugin's status mapped to HTTP:
RBAC 403, not found 404, refused by admission 422, any other failure of the command 400, the API
server failing 502.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from koord_queue.cli import admin, commands, render
from koord_queue.cli.client import (
    EVENTS,
    QUEUE_UNITS,
    CliError,
    Denied,
    Gathered,
    NotFoundError,
    Reader,
    Refused,
    denied,
    is_rbac_refusal,
)
from koord_queue.dashboard import queuepage, views
from koord_queue.dashboard.guard import refusal
from koord_queue.shared import kube
from koord_queue.shared.api.parsing import parse_unit
from koord_queue.shared.core import explain

PODS: Final = kube.Resource("", "v1", "pods", "Pod")
#: The history page's window, and the longest one a request may ask for.
DEFAULT_DAYS: Final = 7
MAX_DAYS: Final = 31
PLAIN: Final = render.Style(False)

Run = Callable[[io.StringIO], Awaitable[int]]


def status_of(err: CliError) -> int:
    if isinstance(err, Denied):
        return 403
    if isinstance(err, NotFoundError):
        return 404
    if isinstance(err, Refused):
        return 422
    return 400


async def run_command(run: Run) -> tuple[int, str]:
    """Run one plugin command into a buffer: ``(HTTP status, output or message)``."""
    out = io.StringIO()
    try:
        await run(out)
    except CliError as err:
        return status_of(err), str(err)
    except kube.KubeError as err:
        return 502, f"the API server failed: {err}"
    return 200, out.getvalue()


def args(namespace: str | None, **extra: Any) -> argparse.Namespace:
    """The parsed flags a plugin command expects, as ``kubectl koord-queue`` would pass them."""
    base: dict[str, Any] = {
        "namespace": namespace,
        "all_namespaces": namespace is None,
        "queue": None,
        "phase": None,
        "selector": None,
        "watch": False,
        "output": "json",
        "tree": True,
    }
    return argparse.Namespace(**{**base, **extra})


class Api:
    """The endpoints, bound to the plugin's :class:`Reader` (the user's own client)."""

    def __init__(
        self, reader: Reader, namespace: str, all_namespaces: bool, user: str, *, cluster: bool = False
    ) -> None:
        self.reader = reader
        #: served in the cluster, with a caller's token (the page offers to log out)
        self.cluster = cluster
        self.namespace = namespace
        self.all_namespaces = all_namespaces
        self.user = user
        self.pages = queuepage.QueuePages(reader)

    def routes(self) -> list[web.RouteDef]:
        """The endpoints answered by this one Api (the local server: one user)."""
        return routes(lambda _: self)

    async def session(self, request: web.Request) -> web.Response:
        """Who the dashboard acts as: the API server's own answer (a SelfSubjectReview), else the
        ``--as`` user, else unknown."""
        if not self.user:
            self.user = await self._whoami()
        return web.json_response(
            {
                "namespace": self.namespace,
                "allNamespaces": self.all_namespaces,
                "user": self.user,
                "cluster": self.cluster,
            }
        )

    async def _whoami(self) -> str:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            answer = await self.reader.client.request(
                "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review
            )
        except kube.KubeError:
            return ""
        return str(((answer.get("status") or {}).get("userInfo") or {}).get("username") or "")

    async def page_status(self, namespace: str | None) -> int:
        """The HTTP status of a page: 403 when the API server refuses this user the namespace's
        QueueUnits (one list of at most one item), so another namespace's page is refused
        itself; the page still loads and shows the plugin's message from its data request."""
        try:
            await self.reader.client.request(
                "GET", QUEUE_UNITS.path(namespace), query={"limit": 1}, verb="LIST"
            )
        except kube.KubeError as err:
            return 403 if is_rbac_refusal(err) else 200
        return 200

    async def _json(self, run: Run) -> tuple[int, Any]:
        status, text = await run_command(run)
        return status, json.loads(text) if status == 200 else {"error": text, "status": status}

    async def units(self, request: web.Request) -> web.Response:
        """The queues in scheduling order, the first ``limit`` units of each with ``list``'s
        fields and ``explain``'s why; 304 when the page's ETag has not changed
        (docs/dashboard.md#what-it-costs)."""
        ns = request.match_info.get("ns")
        try:
            limit = int(request.query.get("limit", queuepage.DEFAULT_LIMIT))
        except ValueError:
            return refusal(400, "limit must be a whole number")
        limit = min(queuepage.MAX_LIMIT, max(1, limit))
        try:
            built = await self.pages.answer(ns, limit)
        except CliError as err:
            return refusal(status_of(err), str(err))
        except kube.KubeError as err:
            return refusal(502, f"the API server failed: {err}")
        if request.headers.get("If-None-Match") == built.etag:
            return web.Response(status=304, headers={"ETag": built.etag})
        return web.Response(body=built.body, content_type="application/json", headers={"ETag": built.etag})

    async def unit(self, request: web.Request) -> web.Response:
        """One unit's story: ``explain`` (text and figures), ``describe`` (admissions, events) and
        the job's pods."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        try:
            got, raw = await commands.gather_for_unit(self.reader, ns, name)
        except CliError as err:
            return refusal(status_of(err), str(err))
        except kube.KubeError as err:
            return refusal(502, f"the API server failed: {err}")
        unit = parse_unit(raw)
        now = time.time()
        result = explain.explain(commands.build_view(got, raw), unit.key, now)
        described = io.StringIO()
        status, text = await run_command(
            lambda out: admin.cmd_describe(self.reader, args(ns, job=unit.name), out)
        )
        ref = (raw.get("spec") or {}).get("consumerRef") or {}
        pods, pods_error = await self._pods(ns, str(ref.get("kind") or ""), str(ref.get("name") or ""))
        described.write(text)
        return web.json_response(
            {
                "namespace": ns,
                "name": unit.name,
                "job": commands.job_ref(unit, raw),
                "phase": unit.phase or "Pending",
                "priority": unit.priority,
                "queue": unit.quota or "",
                "active": unit.active,
                "position": result.position,
                "reason": result.reason.value,
                "summary": result.summary,
                "short": commands.short_reason(unit),
                "nextSteps": list(result.next_steps),
                "explain": commands.render_explanation(result, unit, raw, PLAIN, now),
                "describe": described.getvalue() if status == 200 else f"({text})",
                "pods": pods,
                "podsError": pods_error,
            }
        )

    async def _pods(self, ns: str, kind: str, name: str) -> tuple[list[dict[str, str]], str | None]:
        if not kind or not name:
            return [], None
        try:
            items, _ = await self.reader.client.list(PODS, namespace=ns)
        except kube.KubeError as err:
            return [], str(denied(err, "list", PODS, ns))
        return views.pods_of(items, kind, name), None

    async def quotas(self, request: web.Request) -> web.Response:
        """``quotas --tree -o json`` for the namespace: min, max, used, borrowed per quota."""
        ns = request.match_info["ns"]
        status, body = await self._json(
            lambda out: commands.cmd_quotas(self.reader, args(ns, all_namespaces=False), out, PLAIN)
        )
        return web.json_response(body, status=status)

    async def history(self, request: web.Request) -> web.Response:
        """Wait-time percentiles per queue and day, and preemptions per queue and day, from the
        QueueUnits' status and the ``Preempted`` events the namespace still has."""
        ns = request.match_info["ns"]
        try:
            days = min(MAX_DAYS, max(1, int(request.query.get("days", DEFAULT_DAYS))))
        except ValueError:
            return refusal(400, "days must be a whole number")
        got = Gathered()
        try:
            await self.reader.units(ns, got, want_all=False)
        except CliError as err:
            return refusal(status_of(err), str(err))
        units = got.parsed_units()
        events, events_error = await self._preempted_events(ns)
        now = time.time()
        queue_of = {key: u.quota for key, u in units.items() if u.quota}
        return web.json_response(
            {
                "namespace": ns,
                "days": days,
                "waits": [asdict(w) for w in views.wait_history(units.values(), now, days)],
                "preemptions": [asdict(p) for p in views.preemption_history(events, queue_of, now, days)],
                "eventsError": events_error,
            }
        )

    async def _preempted_events(self, ns: str) -> tuple[list[dict[str, Any]], str | None]:
        try:
            page = await self.reader.client.request(
                "GET",
                EVENTS.path(ns),
                query={"fieldSelector": "reason=Preempted,involvedObject.kind=QueueUnit", "limit": 5000},
                verb="LIST",
            )
        except kube.KubeError as err:
            return [], str(denied(err, "list", EVENTS, ns))
        return list(page.get("items") or []), None

    async def act(self, request: web.Request) -> web.Response:
        """hold, release or priority: the plugin's command, with the user's rights and no more."""
        ns, name, action = request.match_info["ns"], request.match_info["name"], request.match_info["action"]
        try:
            body = await request.json()
        except ValueError:
            return refusal(400, "the body must be JSON")
        if not isinstance(body, dict):
            return refusal(400, "the body must be a JSON object")
        flags = args(ns, job=name, priority=str(body.get("priority", "")))
        if action == "priority":
            status, text = await run_command(
                lambda out: commands.cmd_priority(self.reader, flags, out, PLAIN)
            )
        else:
            status, text = await run_command(
                lambda out: commands.cmd_active(
                    self.reader,
                    flags,
                    out,
                    PLAIN,
                    active=action == "release",
                )
            )
        if status != 200:
            return refusal(status, text)
        return web.json_response({"message": text.strip()})


#: Every endpoint: (method, path, the :class:`Api` method that answers it).
ENDPOINTS: Final = (
    ("GET", "/api/session", "session"),
    ("GET", "/api/ns/{ns}/units", "units"),
    ("GET", "/api/all/units", "units"),
    ("GET", "/api/ns/{ns}/units/{name}", "unit"),
    ("GET", "/api/ns/{ns}/quotas", "quotas"),
    ("GET", "/api/ns/{ns}/history", "history"),
    ("POST", "/api/ns/{ns}/units/{name}/{action:hold|release|priority}", "act"),
)

#: The :class:`Api` that answers a request: the one of the local server, or in the cluster the
#: one of the caller's session (docs/dashboard.md#installed-in-the-cluster).
ApiOf = Callable[[web.Request], "Api"]


def routes(api_of: ApiOf) -> list[web.RouteDef]:
    """The endpoints, each answered by the :class:`Api` that ``api_of`` picks for the request."""

    def bound(name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            answer: Callable[[web.Request], Awaitable[web.StreamResponse]] = getattr(api_of(request), name)
            return await answer(request)

        return handler

    return [web.route(method, path, bound(name)) for method, path, name in ENDPOINTS]


def page_path(namespace: str | None) -> str:
    """The page of ``namespace`` (None: every namespace)."""
    return "/all" if namespace is None else f"/ns/{quote(namespace, safe='')}"

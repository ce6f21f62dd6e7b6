"""The in-cluster dashboard's callers (docs/dashboard.md#installed-in-the-cluster).

Installed in the cluster, the dashboard has no identity of its own: its ServiceAccount carries no
token and no binding. Each request acts with its caller's bearer token, which comes either

* in the request's ``Authorization: Bearer`` header (an authenticating proxy in front), or
* from the login page: the user pastes a token once, the server checks it with a
  SelfSubjectReview made *with that token*, and keeps it server-side in a session whose random id
  is the cookie (HttpOnly, SameSite=Strict, Secure).

Either way the caller gets a :class:`Session`: an API client that sends only that token
(``kube.Kube.from_token``) and the dashboard's :class:`~koord_queue.dashboard.api.Api` over it
(its queue store and watch are that user's). A session idle for ``idle_timeout`` is closed with
its client and watch; at most ``max_sessions`` exist at once, a caller beyond that gets 503. A
header caller's session is found again by the token's SHA-256, never by the token itself. New
tokens are checked at most 10 a second (bursts of 20; beyond: 429), so a stranger sending ever new
tokens spends no more of the API server's time than that.

:class:`ClusterGuard` is the middleware: no token and no session is a 401 (the login page for a
page, JSON for the API) before anything reaches the API server; writes, the login and the logout
keep the local server's CSRF rules (POST, JSON body, Origin equal to the request's own origin);
every answer keeps the security headers and the CSP. The Host allow-list of the local server does
not apply: the process holds no credential a rebound page could borrow.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Final, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from koord_queue.cli.client import Reader
from koord_queue.dashboard.api import Api
from koord_queue.dashboard.guard import Handler, Secured, refusal, write_refusal
from koord_queue.shared import kube
from koord_queue.shared.core import access

COOKIE: Final = "koord-queue-web-dashboard"
SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"
#: Paths answered without a caller: the login page and its files.
OPEN_PATHS: Final = frozenset({"/login", "/static/login.js", "/static/style.css", "/static/favicon.svg"})
#: Where the guard leaves the caller's Api on the request.
API_KEY: Final = web.RequestKey("koord_queue_dashboard_api", Api)
BEARER: Final = "bearer:"
T = TypeVar("T")


class TokenRefused(Exception):
    """The API server does not accept the token (its SelfSubjectReview was refused)."""


#: ``token -> client``: the client that acts with only this token.
Connect = Callable[[str], kube.Kube]
#: ``client -> username``: the API server's own answer for the token (a SelfSubjectReview); raises
#: :class:`TokenRefused` when the token is not accepted.
Review = Callable[[kube.Kube], Awaitable[str]]


async def self_review(client: kube.Kube) -> str:
    """Who the token is, as the API server says (a SelfSubjectReview made with the token)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        answer = await client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body)
    except kube.KubeError as err:
        if err.status in (401, 403):
            raise TokenRefused(f"the API server refused this token ({err.status} {err.reason})") from None
        raise
    return str(((answer.get("status") or {}).get("userInfo") or {}).get("username") or "")


def home_namespace(user: str, asked: str | None) -> str:
    """The namespace of the first page: the one asked for at login, else a ServiceAccount's own,
    else ``default``."""
    if asked:
        return asked
    if user.startswith(SERVICE_ACCOUNT_PREFIX):
        return user[len(SERVICE_ACCOUNT_PREFIX) :].split(":", 1)[0] or "default"
    return "default"


@dataclass
class Session:
    """One caller: the client with their token and the dashboard's Api over it."""

    client: kube.Kube
    api: Api
    last_seen: float
    closed: bool = field(default=False)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self.api.pages.close()
        finally:
            await self.client.close()


class Full(Exception):
    """No room for another session (``--max-sessions``)."""


class Busy(Exception):
    """Too many new tokens to check at once: the review budget is spent."""


class Sessions:
    """The live sessions: by cookie id (login) or by the token's hash (Authorization header)."""

    def __init__(
        self,
        connect: Connect,
        *,
        component_namespace: str,
        idle_timeout: float,
        max_sessions: int,
        review: Review = self_review,
        clock: Callable[[], float] = time.monotonic,
        budget: access.ReviewBudget | None = None,
    ) -> None:
        self.connect = connect
        self.review = review
        #: the reviews of tokens not seen yet: strangers sending ever new tokens get 429, not the
        #: API server's time (the reconciler's metrics server keeps the same budget)
        self.budget = budget if budget is not None else access.ReviewBudget()
        self.component_namespace = component_namespace
        self.idle_timeout = idle_timeout
        self.max_sessions = max_sessions
        self.clock = clock
        self.by_key: dict[str, Session] = {}
        self._lock = asyncio.Lock()

    async def open(self, token: str, namespace: str | None = None) -> tuple[str, Session]:
        """A new session for ``token`` after the API server accepted it: ``(cookie id, session)``.
        Raises :class:`TokenRefused` or :class:`Full`."""
        session = await self._session(token, namespace)
        key = secrets.token_urlsafe(32)
        async with self._lock:
            if len(self.by_key) >= self.max_sessions:
                await session.close()
                raise Full()
            self.by_key[key] = session
        return key, session

    async def by_header(self, token: str) -> Session:
        """The session of a token sent in the Authorization header, opened at its first use."""
        key = BEARER + hashlib.sha256(token.encode()).hexdigest()
        found = await self.find(key)
        if found is not None:
            return found
        async with self._lock:
            if len(self.by_key) >= self.max_sessions:
                raise Full()
        session = await self._session(token, None)
        async with self._lock:
            raced = self.by_key.get(key)
            if raced is not None or len(self.by_key) >= self.max_sessions:
                await session.close()
                if raced is None:
                    raise Full()
                return raced
            self.by_key[key] = session
        return session

    async def _session(self, token: str, namespace: str | None) -> Session:
        if not self.budget.take(now=self.clock()):
            raise Busy()
        client = self.connect(token)
        try:
            user = await self.review(client)
        except BaseException:
            await client.close()
            raise
        reader = Reader(client, self.component_namespace)
        api = Api(reader, home_namespace(user, namespace), False, user, cluster=True)
        return Session(client, api, self.clock())

    async def find(self, key: str) -> Session | None:
        """The live session of ``key`` (touched), or None; an idle one is closed here."""
        session = self.by_key.get(key)
        if session is None:
            return None
        if self.clock() - session.last_seen > self.idle_timeout:
            await self.close(key)
            return None
        session.last_seen = self.clock()
        return session

    async def close(self, key: str) -> None:
        session = self.by_key.pop(key, None)
        if session is not None:
            await session.close()

    async def expire(self) -> int:
        """Close every session idle longer than ``idle_timeout``; how many were closed."""
        now = self.clock()
        idle = [k for k, s in self.by_key.items() if now - s.last_seen > self.idle_timeout]
        for key in idle:
            await self.close(key)
        return len(idle)

    async def close_all(self) -> None:
        for key in list(self.by_key):
            await self.close(key)

    async def reap(self) -> None:
        """Expire idle sessions until cancelled (a quarter of the timeout apart, at most 30 s)."""
        while True:
            await asyncio.sleep(min(30.0, max(1.0, self.idle_timeout / 4)))
            with contextlib.suppress(kube.KubeError, OSError):
                await self.expire()


def _login_page(status: int) -> web.Response:
    body = resources.files("koord_queue.dashboard").joinpath("static", "login.html").read_bytes()
    return web.Response(body=body, status=status, content_type="text/html", charset="utf-8")


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def same_origin(request: web.Request) -> bool:
    """The request's Origin names the host the request was sent to (its Host header): the
    dashboard's own page, whatever name and port it is reached by (docs/dashboard.md)."""
    origin = request.headers.get("Origin")
    host = request.headers.get("Host")
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    target = urlsplit(f"//{host}")
    try:
        origin_port = parts.port or _default_port(parts.scheme)
        host_port = target.port or _default_port(parts.scheme)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        return False
    return parts.hostname == target.hostname and origin_port == host_port


class ClusterGuard(Secured):
    """The middleware of the in-cluster server, and its login and logout handlers."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/login", self.login_page),
            web.post("/login", self.login),
            web.post("/logout", self.logout),
        ]

    async def _check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            refused = write_refusal(request, same_origin(request))
            if refused is not None:
                return refused
        if request.path in OPEN_PATHS or request.path == "/logout":
            return await handler(request)
        session = await self._caller(request)
        if isinstance(session, web.Response):
            return session
        if session is None:
            if request.path.startswith("/api/"):
                return refusal(
                    401, "refused: not logged in; open the dashboard's page and log in with a token"
                )
            return _login_page(401)
        request[API_KEY] = session.api
        return await handler(request)

    async def _caller(self, request: web.Request) -> Session | web.Response | None:
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return refusal(401, "refused: the Authorization header must be 'Bearer <token>'")
            return await _opened(self.sessions.by_header(token.strip()))
        key = request.cookies.get(COOKIE, "")
        if not key or key.startswith(BEARER):  # a header caller's session is never a cookie's
            return None
        return await self.sessions.find(key)

    async def login_page(self, request: web.Request) -> web.Response:
        return _login_page(200)

    async def login(self, request: web.Request) -> web.Response:
        """POST /login ``{"token": ..., "namespace": optional}``: a session when the API server
        accepts the token (401 with its answer when not, 503 when full)."""
        try:
            body = await request.json()
        except ValueError:
            return refusal(400, "the body must be JSON")
        token = body.get("token") if isinstance(body, dict) else None
        namespace = body.get("namespace") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token.strip():
            return refusal(
                400, "a token is needed: paste the output of kubectl create token, or an OIDC id-token"
            )
        if namespace is not None and not isinstance(namespace, str):
            return refusal(400, "the namespace must be a string")
        try:
            opened = await _opened(self.sessions.open(token.strip(), (namespace or "").strip() or None))
        except kube.KubeError as err:
            return refusal(502, f"the API server failed: {err}")
        if isinstance(opened, web.Response):
            return opened
        key, session = opened
        old = request.cookies.get(COOKIE)
        if old and not old.startswith(BEARER) and old in self.sessions.by_key:
            await self.sessions.close(old)
        response = web.json_response({"user": session.api.user, "namespace": session.api.namespace})
        response.set_cookie(COOKIE, key, httponly=True, samesite="Strict", secure=True, path="/")
        return response

    async def logout(self, request: web.Request) -> web.Response:
        key = request.cookies.get(COOKIE)
        if key and not key.startswith(BEARER):
            await self.sessions.close(key)
        response = web.json_response({"message": "logged out"})
        # with the attributes it was set with: a browser keeps a Secure cookie from a plainer overwrite
        response.del_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="Strict")
        return response


async def _opened(opening: Awaitable[T]) -> T | web.Response:
    """A session being found or opened for a token, or the refusal to answer instead: 401 for a
    token the API server rejects, 503 when the sessions are full, 429 when the review budget is
    spent."""
    try:
        return await opening
    except TokenRefused as err:
        return refusal(401, f"refused: {err}")
    except Full:
        return refusal(
            503,
            "refused: the dashboard has as many sessions as it may keep (--max-sessions); try again later",
        )
    except Busy:
        return refusal(429, "refused: too many new tokens to check at once; try again in a moment")


def api_of(request: web.Request) -> Api:
    """The caller's Api, which the guard found for this request."""
    return request[API_KEY]

"""The dashboard's local-server protections (docs/dashboard.md#local-server-protections).

The server listens on 127.0.0.1 and acts with the credentials of whoever started it, so anything
else that can reach the port (another user of the machine, a web page in the same browser, a page
whose DNS name rebinds to 127.0.0.1) must not be able to use it. Every request passes, in order:

1. the Host header names 127.0.0.1 or localhost (a rebound DNS name does not): else 403;
2. it carries this run's session cookie (HttpOnly, SameSite=Strict), which only the unguessable
   token in the printed URL can obtain: else 401. The token is exchanged once for the cookie and
   the browser is sent on to the same page without it, so it stays out of history and referrers;
3. a write is a POST whose Origin is this server and whose body is JSON (a cross-site form cannot
   send that without a preflight the server never answers): else 403.

Every answer carries a strict Content-Security-Policy (``default-src 'self'``): the pages load
nothing from anywhere else.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import urlsplit

from aiohttp import web

ALLOWED_HOSTS: Final = frozenset({"127.0.0.1", "localhost"})
TOKEN_PARAM: Final = "token"
CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusal(status: int, message: str) -> web.Response:
    """A refusal as JSON, the shape every API error has (``{"error": ...}``)."""
    return web.json_response({"error": message, "status": status}, status=status)


def write_refusal(request: web.Request, own_origin: bool) -> web.Response | None:
    """The CSRF rules of every write, of the local and the in-cluster server alike (None when they
    hold): a POST, from the dashboard's own page (``own_origin``: the request's Origin is this
    server's, as each server judges it; a ``Sec-Fetch-Site``, when sent, same-origin), with a JSON
    body (a cross-site form cannot send one without a preflight the server never answers)."""
    if request.method != "POST":
        return refusal(405, "refused: only GET and POST")
    fetch_site = request.headers.get("Sec-Fetch-Site", "same-origin")
    if not own_origin or fetch_site not in ("same-origin", "none"):
        return refusal(403, "refused: a write must come from the dashboard's own page (Origin)")
    if request.content_type != "application/json":
        return refusal(415, "refused: a write must be sent as application/json")
    return None


class Secured:
    """A middleware whose every answer, refusals included, carries :data:`SECURITY_HEADERS`;
    the subclass says in ``_check`` what a request must show (the local and the in-cluster
    server check different things)."""

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._check(request, handler)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        raise NotImplementedError


class Guard(Secured):
    """This run's secrets and the middleware that checks them."""

    def __init__(self, port: int, token: str | None = None, session: str | None = None) -> None:
        self.port = port
        self.token = token or secrets.token_urlsafe(32)
        self.session = session or secrets.token_urlsafe(32)
        #: One name per port: two dashboards on one machine do not overwrite each other's cookie.
        self.cookie = f"koord-queue-dashboard-{port}"

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}?{TOKEN_PARAM}={self.token}"

    def host_ok(self, request: web.Request) -> bool:
        host = request.headers.get("Host", "")
        parts = urlsplit(f"//{host}")
        try:
            port = parts.port
        except ValueError:
            return False
        return parts.hostname in ALLOWED_HOSTS and port in (None, self.port)

    def origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return False
        parts = urlsplit(origin)
        try:
            port = parts.port
        except ValueError:
            return False
        return parts.scheme == "http" and parts.hostname in ALLOWED_HOSTS and port == self.port

    def has_session(self, request: web.Request) -> bool:
        return hmac.compare_digest(request.cookies.get(self.cookie, ""), self.session)

    async def _check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.host_ok(request):
            return refusal(403, "refused: the Host header must be 127.0.0.1 or localhost")
        offered = request.query.get(TOKEN_PARAM)
        if offered is not None:
            if not hmac.compare_digest(offered, self.token):
                return refusal(401, "refused: this token is not this dashboard's")
            query = {k: v for k, v in request.query.items() if k != TOKEN_PARAM}
            target = request.rel_url.with_query(query)
            response = web.Response(status=303, headers={"Location": str(target)})
            response.set_cookie(self.cookie, self.session, httponly=True, samesite="Strict", path="/")
            return response
        if not self.has_session(request):
            return refusal(
                401,
                "refused: no session; open the URL that kubectl koord-queue dashboard printed",
            )
        if request.method not in ("GET", "HEAD"):
            refused = write_refusal(request, self.origin_ok(request))
            if refused is not None:
                return refused
        return await handler(request)

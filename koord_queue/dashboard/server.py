"""``kubectl koord-queue dashboard``: a web dashboard served from inside the plugin process, on
127.0.0.1, acting as the person who started it (docs/dashboard.md).

The server is aiohttp (a core dependency, so ``pip install .`` is enough); the pages are the
hand-written files of ``static/``, shipped in the package and served from it: nothing is fetched
from anywhere else at run time. :mod:`~koord_queue.dashboard.guard` keeps other local programs and
other web pages out; :mod:`~koord_queue.dashboard.api` answers with the plugin's own commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import webbrowser
from importlib import resources
from typing import Any, Final, TextIO

from aiohttp import web
from aiohttp.typedefs import Middleware

from koord_queue.cli.client import CliError, Reader
from koord_queue.dashboard.api import Api, ApiOf, page_path, routes
from koord_queue.dashboard.cache import one_arena
from koord_queue.dashboard.guard import Guard
from koord_queue.dashboard.queuepage import DEFAULT_LIMIT
from koord_queue.shared import kube

HOST: Final = "127.0.0.1"
#: The files of the pages, with their types; nothing else is served.
STATIC: Final = {
    "app.js": "text/javascript",
    "login.js": "text/javascript",
    "style.css": "text/css",
    "favicon.svg": "image/svg+xml",
}


def _asset(name: str) -> bytes:
    return resources.files("koord_queue.dashboard").joinpath("static", name).read_bytes()


def pages(api_of: ApiOf) -> list[web.RouteDef]:
    """Every page is the one HTML file (the script reads the path), answered with 403 when the
    user may not read the namespace it shows."""

    async def index(request: web.Request) -> web.Response:
        path = request.path
        namespace = request.match_info.get("ns")
        status = 200
        if namespace is not None or path == "/all":
            status = await api_of(request).page_status(namespace)
        return web.Response(
            body=_asset("index.html"), status=status, content_type="text/html", charset="utf-8"
        )

    return [
        web.get("/", index),
        web.get("/all", index),
        web.get("/ns/{ns}", index),
        web.get("/ns/{ns}/{view:quotas|history}", index),
        web.get("/ns/{ns}/units/{name}", index),
    ]


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = STATIC.get(name)
    if kind is None:
        raise web.HTTPNotFound()
    return web.Response(body=_asset(name), content_type=kind)


def application(api: Api, guard: Guard) -> web.Application:
    """The local server: one user's :class:`Api` behind the local-server guard."""
    return build(lambda _: api, guard.middleware)


def build(api_of: ApiOf, middleware: Middleware) -> web.Application:
    """The pages, their files and the endpoints behind ``middleware``, each request answered by
    the :class:`Api` that ``api_of`` picks (one for the local server, the caller's in the cluster)."""
    app = web.Application(middlewares=[middleware])
    app.add_routes(routes(api_of))
    app.add_routes([web.get("/static/{name}", static), *pages(api_of)])
    return app


def listen(port: int) -> socket.socket:
    """A socket on 127.0.0.1 (``port`` 0: any free port), bound before the URL is printed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(reader: Reader, args: Any, out: TextIO, user: str) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); prints the URL, opens the browser unless
    ``--no-browser``."""
    one_arena()
    sock = listen(int(args.port))
    guard = Guard(sock.getsockname()[1])
    namespace = None if args.all_namespaces else str(args.namespace)
    api = Api(reader, str(args.namespace), bool(args.all_namespaces), user)
    runner = web.AppRunner(application(api, guard), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    url = guard.url(page_path(namespace))
    who = f" as {user}" if user else ""
    out.write(f"koord-queue dashboard{who} at {url}\n(only this machine can reach it; Ctrl-C stops it)\n")
    out.flush()
    warm = asyncio.create_task(_warm(api, namespace))
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # not on every platform
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
    if not args.no_browser:
        await loop.run_in_executor(None, webbrowser.open, url)
    try:
        await stopped.wait()
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGTERM)
        warm.cancel()
        await runner.cleanup()
        await api.pages.close()
    return 0


async def _warm(api: Api, namespace: str | None) -> None:
    """Build the first page while the browser opens, so its first request finds it ready (a
    refusal is left for the page itself to show)."""
    with contextlib.suppress(CliError, kube.KubeError):
        await api.pages.answer(namespace, DEFAULT_LIMIT)

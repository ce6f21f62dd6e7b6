"""``koord-queue-dashboard``: the dashboard installed in the cluster
(docs/dashboard.md#installed-in-the-cluster).

The same pages and endpoints as ``kubectl koord-queue dashboard``, served by a Deployment that has
no identity of its own (its ServiceAccount mounts no token and is bound to nothing): every request
acts with its caller's token, through :mod:`~koord_queue.dashboard.sessions`. Only the address of
the API server and the CA that signs it are this process's own; with no caller's token it reads
nothing.

The dashboard listens on ``--bind-address`` (plain HTTP, or HTTPS with ``--tls-cert-file`` and
``--tls-private-key-file``) and answers ``/healthz`` and ``/readyz`` on a separate plain port, as
the other components do (docs/operations.md#endpoints).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from typing import Final

from aiohttp import web

from koord_queue.dashboard import server
from koord_queue.dashboard.cache import one_arena
from koord_queue.dashboard.sessions import ClusterGuard, Sessions, api_of
from koord_queue.shared import kube

log = logging.getLogger("koord_queue.dashboard")

#: Where the Deployment mounts the ``kube-root-ca.crt`` ConfigMap (manifests/components/web-dashboard).
DEFAULT_CA_FILE: Final = "/var/run/koord-queue/kube-root-ca/ca.crt"


def _duration(text: str) -> float:
    """``90s``, ``15m``, ``1h`` or plain seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 900s, 15m, 1h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be positive")
    return value


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def default_apiserver() -> str | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="koord-queue-dashboard",
        description="The koord-queue web dashboard installed in the cluster: every request acts with its "
        "caller's token (a login page, or an Authorization header from an authenticating proxy); the process "
        "has no identity of its own (docs/dashboard.md#installed-in-the-cluster).",
    )
    p.add_argument(
        "--bind-address", type=_address, default=("0.0.0.0", 8080), help="HOST:PORT of the dashboard (8080)"
    )
    p.add_argument(
        "--health-port", type=int, default=8081, help="plain-HTTP port of /healthz and /readyz; 0 disables"
    )
    p.add_argument(
        "--tls-cert-file", default="", help="serve HTTPS with this certificate (with --tls-private-key-file)"
    )
    p.add_argument("--tls-private-key-file", default="", help="the key of --tls-cert-file")
    p.add_argument(
        "--apiserver",
        default=default_apiserver(),
        help="the API server's URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
    )
    p.add_argument(
        "--apiserver-ca-file",
        default=DEFAULT_CA_FILE,
        help=f"the CA bundle that signs the API server's certificate (default: {DEFAULT_CA_FILE}, the "
        "kube-root-ca.crt ConfigMap the Deployment mounts)",
    )
    p.add_argument(
        "--koord-queue-namespace",
        default=os.environ.get("POD_NAMESPACE") or "koord-queue",
        help="the namespace koord-queue is installed in (default: $POD_NAMESPACE, else koord-queue)",
    )
    p.add_argument(
        "--session-idle-timeout",
        type=_duration,
        default=900.0,
        help="a session unused this long is closed with its client and watch (default 15m)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=50,
        help="sessions kept at once; a caller beyond them gets 503 (50)",
    )
    return p


def application(sessions: Sessions) -> tuple[web.Application, ClusterGuard]:
    """The dashboard's pages and endpoints, each request answered as its caller."""
    guard = ClusterGuard(sessions)
    app = server.build(api_of, guard.middleware)
    app.add_routes(guard.routes())
    return app, guard


def health_application(ready: asyncio.Event) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if not ready.is_set():
            return web.Response(status=503, text="not serving yet")
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    return app


def tls_context(cert: str, key: str) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not cert or not key:
        raise SystemExit("koord-queue-dashboard: --tls-cert-file and --tls-private-key-file go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


async def serve(args: argparse.Namespace, stopped: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM or SIGINT (or ``stopped``)."""
    one_arena()
    host = str(args.apiserver)
    ca_file = str(args.apiserver_ca_file) or None

    def connect(token: str) -> kube.Kube:
        return kube.Kube.from_token(
            host=host, token=token, ca_file=ca_file, user_agent="koord-queue-dashboard"
        )

    sessions = Sessions(
        connect,
        component_namespace=str(args.koord_queue_namespace),
        idle_timeout=float(args.session_idle_timeout),
        max_sessions=int(args.max_sessions),
    )
    app, _ = application(sessions)
    ready = asyncio.Event()
    runners: list[web.AppRunner] = []
    stopped = stopped or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopped.set)
    reaper = asyncio.create_task(sessions.reap(), name="dashboard-sessions")
    try:
        if int(args.health_port):
            health = web.AppRunner(health_application(ready), access_log=None)
            await health.setup()
            runners.append(health)
            await web.TCPSite(health, str(args.bind_address[0]), int(args.health_port)).start()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        bind_host, bind_port = args.bind_address
        context = tls_context(str(args.tls_cert_file), str(args.tls_private_key_file))
        await web.TCPSite(runner, bind_host, bind_port, ssl_context=context).start()
        ready.set()
        scheme = "https" if context else "http"
        log.info(
            "koord-queue-dashboard serving on %s://%s:%d, API server %s", scheme, bind_host, bind_port, host
        )
        await stopped.wait()
    finally:
        reaper.cancel()
        await sessions.close_all()
        for each in reversed(runners):
            await each.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``koord-queue-dashboard``."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.apiserver:
        parser().error("--apiserver is needed outside a pod (no KUBERNETES_SERVICE_HOST)")
    if args.apiserver_ca_file and not os.path.isfile(args.apiserver_ca_file):
        parser().error(f"no CA bundle at {args.apiserver_ca_file} (--apiserver-ca-file)")
    sys.exit(asyncio.run(serve(args)))

"""The reconciler's plain HTTP servers: health and readiness, and the Prometheus metrics
(docs/operations.md#reconciler-flags). The visibility API has its own module.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from koord_queue.reconciler import metrics

__all__ = ["health_app", "metrics_app", "serve"]


async def serve(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner | None:
    if port <= 0:
        return None
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner


def health_app(ready: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not synced")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app() -> web.Application:
    async def serve(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", serve)
    return app

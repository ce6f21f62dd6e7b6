"""HTTP server of the visibility API (``visibility.koord-queue.x-k8s.io/v1alpha1``).

Every replica serves it from its own scheduler cache (followers keep theirs warm from the same
watches), so the APIService may point at all replicas. Answers come from ``shared.visibility``.
In a cluster the kube-apiserver's aggregator proxies ``kubectl get --raw /apis/visibility...``
here over TLS; the server then requires the aggregator's client certificate (``--visibility-
client-ca``, the apiserver's requestheader CA) so that only the apiserver can reach it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from shared import visibility
from shared.scheduling import Cache

_PREFIX = f"/apis/{visibility.GROUP}/{visibility.VERSION}"


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _status(code: int, reason: str, message: str) -> web.Response:
    return _json(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        },
        status=code,
    )


def make_app(cache: Callable[[], Cache]) -> web.Application:
    async def discovery(_: web.Request) -> web.Response:
        return _json(visibility.discovery())

    async def queue(request: web.Request) -> web.Response:
        c = cache()
        try:
            return _json(
                visibility.queue_units(c.state, c.units, request.match_info["name"], dict(request.query))
            )
        except visibility.NotFound as err:
            return _status(404, "NotFound", str(err))
        except visibility.BadRequest as err:
            return _status(400, "BadRequest", str(err))

    async def quota(request: web.Request) -> web.Response:
        c = cache()
        try:
            known = set(c.ledger.quotas)
            return _json(
                visibility.quota_units(
                    c.state, c.units, request.match_info["name"], known, dict(request.query)
                )
            )
        except visibility.NotFound as err:
            return _status(404, "NotFound", str(err))
        except visibility.BadRequest as err:
            return _status(400, "BadRequest", str(err))

    app = web.Application()
    app.router.add_get(_PREFIX, discovery)
    app.router.add_get(f"{_PREFIX}/queues/{{name}}/queueunits", queue)
    app.router.add_get(f"{_PREFIX}/elasticquotas/{{name}}/queueunits", quota)
    return app


def tls_context(*, cert_file: str, key_file: str, client_ca: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

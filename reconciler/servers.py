"""The reconciler's health and metrics servers (docs/operations.md#metrics,
docs/operations.md#reconciler-flags). The visibility API has its own module.

Health (``/healthz``, ``/readyz``) is plain HTTP on its own port: the kubelet probes it and it
tells nothing about the cluster. ``/metrics`` does tell (quota names, queue lengths, who waits), so
by default it is served over HTTPS, and only to a caller whose bearer token the API server accepts
(TokenReview) and whose user may ``get`` the non-resource URL ``/metrics`` (SubjectAccessReview):
401 without or with a bad token, 403 without the right, as controller-runtime's secure metrics
answer. The decisions (token parsing, review bodies, the verdict cache) are pure, in
``shared.core.access``; the reviews go through ``shared.kube``.

The serving certificate is a pair from ``--metrics-cert-file``/``--metrics-key-file`` (cert-manager's,
say; re-read when the files change), or else one this replica issues itself at start from a CA of
its own (``certs.bundle``), reissued before it expires. A scraper of the self-issued certificate
skips verification (Prometheus ``insecure_skip_verify``); the bearer token is still checked.
``--metrics-secure=false`` serves plain HTTP to anyone, for local use only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from koord_queue.certs import bundle, pki
from koord_queue.reconciler import metrics
from koord_queue.reconciler.visibility import ServingTLS
from koord_queue.shared import kube
from koord_queue.shared.core import access

__all__ = ["MetricsGuard", "health_app", "metrics_app", "metrics_tls", "serve"]

log = logging.getLogger(__name__)

#: Reviews in flight at once: a flood of fresh tokens waits here instead of flooding the API server.
MAX_CONCURRENT_REVIEWS: Final = 4
METRICS_CA_COMMON_NAME: Final = "koord-queue-metrics-ca"


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


class MetricsGuard:
    """The verdict on a scrape's ``Authorization`` header: cached, else two reviews."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        cache: access.VerdictCache | None = None,
        budget: access.ReviewBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.cache = cache if cache is not None else access.VerdictCache()
        self.budget = budget if budget is not None else access.ReviewBudget()
        self.clock = clock
        self._reviews = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)

    async def verdict(self, authorization: str | None) -> access.Verdict:
        """Raises ``kube.KubeError`` when the API server could not answer (nothing is cached)."""
        token = access.bearer_token(authorization)
        if token is None:
            return access.UNAUTHENTICATED
        key = access.token_digest(token)
        cached = self.cache.get(key, now=self.clock())
        if cached is not None:
            return cached
        async with self._reviews:
            cached = self.cache.get(key, now=self.clock())  # answered while this one waited
            if cached is not None:
                return cached
            if not self.budget.take(now=self.clock()):
                return access.TOO_MANY  # the reconciler's own API budget is not for strangers
            user = access.reviewed_user(
                await self.client.review(kube.TOKEN_REVIEWS, access.token_review(token))
            )
            if user is None:
                verdict = access.UNAUTHENTICATED
            else:
                answer = await self.client.review(kube.SUBJECT_ACCESS_REVIEWS, access.access_review(user))
                verdict = access.access_verdict(user, answer)
            self.cache.put(key, verdict, now=self.clock())
        return verdict


def _guarded(guard: MetricsGuard) -> Any:
    @web.middleware
    async def authorize(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            verdict = await guard.verdict(request.headers.get("Authorization"))
        except kube.KubeError as err:
            log.warning("metrics scrape not authorized: the API server did not answer a review: %s", err)
            return web.Response(status=503, text="cannot check the caller's token now\n")
        if verdict.outcome is not access.Outcome.ALLOWED:
            log.debug("metrics scrape refused (%d): %s", verdict.outcome, verdict.reason)
            headers = {
                access.Outcome.UNAUTHENTICATED: {"WWW-Authenticate": "Bearer"},
                access.Outcome.TOO_MANY: {"Retry-After": "1"},
            }.get(verdict.outcome, {})
            return web.Response(status=int(verdict.outcome), text=verdict.reason + "\n", headers=headers)
        return await handler(request)

    return authorize


def metrics_app(guard: MetricsGuard | None = None, *, tls: MetricsTLS | None = None) -> web.Application:
    """``/metrics``; with ``guard``, only for callers it allows. ``tls`` keeps its pair current for
    as long as the server runs."""

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application(middlewares=[_guarded(guard)] if guard is not None else [])
    app.router.add_get("/metrics", scrape)
    if tls is not None:
        keeper = tls

        async def keep_current(_: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(keeper.run(), name="metrics-certificate")
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(keep_current)
    return app


class MetricsTLS:
    """The metrics server's TLS: a pair from files (re-read when they change) or one it issues
    itself (reissued when two thirds of its validity are gone, ``pki.needs_rotation``)."""

    def __init__(
        self,
        *,
        cert_file: str = "",
        key_file: str = "",
        dns_names: list[str],
        interval_s: float = 60.0,
    ) -> None:
        self.tls = ServingTLS(client_auth=False, what="metrics")
        self.cert_file, self.key_file = cert_file, key_file
        self.dns_names = dns_names
        self.interval_s = interval_s
        self.refresh(now=datetime.now(UTC))
        if not self.tls.ready:
            raise ValueError("no metrics serving certificate could be loaded")

    def refresh(self, *, now: datetime) -> None:
        """Load the files (when they changed) or reissue the own pair (when due)."""
        if self.cert_file:
            pair = pki.KeyPair(
                cert_pem=Path(self.cert_file).read_bytes(), key_pem=Path(self.key_file).read_bytes()
            )
            self.tls.update(serving=pair, requestheader=None)
            return
        current = self.tls.serving
        if current is None or pki.needs_rotation(current.cert_pem, now=now):
            planned = bundle.plan_rotation(
                current=None, dns_names=self.dns_names, now=now, ca_common_name=METRICS_CA_COMMON_NAME
            )
            assert planned is not None  # nothing current: always a new CA and pair
            self.tls.update(serving=planned[1], requestheader=None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.refresh(now=datetime.now(UTC))
            except (OSError, ssl.SSLError, ValueError) as err:
                log.warning("metrics certificate not reloaded, keeping the previous one: %s", err)


def metrics_tls(
    *, cert_file: str, key_file: str, service: str, namespace: str, interval_s: float
) -> MetricsTLS:
    """The metrics server's TLS for ``--metrics-cert-file`` (or the self-issued pair, certified for
    the Service's names)."""
    return MetricsTLS(
        cert_file=cert_file,
        key_file=key_file,
        dns_names=bundle.service_dns_names(service, namespace),
        interval_s=interval_s,
    )

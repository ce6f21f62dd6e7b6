"""The admission webhook's HTTP(S) server: a thin async shell around ``shared.admission.decisions``.

Routes: ``/mutate`` and ``/validate`` (optionally ``/<route>/<kind>``) decide job kinds and our own
objects with ``shared.admission.decisions``; ``/mutate-pod`` gates pods labelled ``koord-queue/gated-pod``
with ``shared.admission.podgate`` (the pods of kinds without a pod template, such as SparkApplication);
``/mutate-unlabelled`` and ``/validate-unlabelled`` decide jobs of the namespaces where queueing is
mandatory, unlabelled ones included (docs/operations.md#mandatory-queueing). All share the flow,
limits, error handling and metrics below.

Flow of one request: refuse a ``Content-Encoding`` (400), read the body (at most
``max_body_bytes``, else 413), decode it with orjson (else 400), check the AdmissionReview envelope
(else 400 with the reason), decide (pure, in ``shared.admission.decisions``), encode the answer with orjson,
let the event loop turn once (so reviews that arrived together are decided together, then written
together) and answer. The decision code is total by design and fuzzed; should it still raise, the
review is answered ``allowed: false`` with a generic message (never a 5xx and never a traceback to
the caller) and one line is logged. The request path keeps per-review work small: the enqueue
timestamp is formatted once per second, the metric children are looked up once per label set and
updated in batches (``webhook.metrics``), and nothing is logged for an allowed review.

TLS and certificate rotation. The listening socket is created once with a *listening* SSLContext
(TLS 1.2+, ECDHE with AES-GCM or ChaCha20 only). Its ``sni_callback`` runs at the start of every
handshake (OpenSSL calls it whether or not the client sends SNI) and assigns the *current* context
to the new connection. A background task (``cleanup_ctx``) polls the certificate and key files;
when their mtime, size or inode changes it builds a fresh context from them and swaps it in as
current. New connections get the new certificate, established connections keep theirs, nothing
is closed, and a broken pair on disk (half-written, mismatched) is logged and ignored until the files
change again. Kubernetes Secret volumes change by an atomic symlink swap, which changes the inode.

Side ports (docs/operations.md#metrics). Health (``/healthz``, ``/readyz``) is plain HTTP on
``health_port`` for the kubelet. ``/metrics`` is served on ``metrics_port`` over mutual TLS: the
same serving pair, and a client certificate chaining to ``metrics_client_ca`` is required, so a
caller without one fails the handshake. The webhook holds no API credentials (it cannot send a
TokenReview as the reconciler does), so the CA is the whole check: whoever holds a client
certificate it signed may scrape. The CA file is watched with the serving pair; while it is
missing nobody is trusted. Without a CA the metrics are not served, unless ``metrics_insecure``
asks for plain HTTP (local use only).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from koord_queue.certs import pki
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission import podgate
from koord_queue.shared.admission.decisions import AdmissionConfig, AdmissionRequest, Operation
from koord_queue.webhook.metrics import CONTENT_TYPE, Result, WebhookMetrics

log = logging.getLogger("webhook")

CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
DEFAULT_MAX_BODY_BYTES: Final = 3 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerConfig:
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    host: str = "0.0.0.0"
    port: int = 9443
    cert_file: Path | None = None
    key_file: Path | None = None
    metrics_port: int = 8080
    #: the CA of the clients allowed to scrape ``/metrics`` (mutual TLS, docs/operations.md#metrics)
    metrics_client_ca: Path | None = None
    #: serve ``/metrics`` as plain HTTP to anyone (local use only); without it and without
    #: ``metrics_client_ca`` the metrics are not served at all
    metrics_insecure: bool = False
    health_port: int = 8081
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cert_reload_interval: float = 10.0
    shutdown_delay: float = 3.0


@dataclass(slots=True)
class ServerState:
    """Mutable run state: readiness drops to false when shutdown starts (endpoints drain first)."""

    ready: bool = True


def make_ssl_context(cert_file: Path, key_file: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context with our TLS policy and the given certificate chain and key.

    With ``client_ca`` every client must present a certificate that chains to it (the metrics
    listener); while that file does not exist nothing is trusted, so every client is refused.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS)  # TLS 1.2 suites; TLS 1.3 suites are all AEAD already
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.load_cert_chain(cert_file, key_file)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        # A resumed session skips the client's verification: it could outlive a CA change.
        context.options |= ssl.OP_NO_TICKET
        context.num_tickets = 0
        if client_ca.is_file():
            context.load_verify_locations(cafile=client_ca)
    return context


class ReloadingTLS:
    """The listening context plus the current serving context (see the module docstring)."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca: Path | None = None) -> None:
        self.cert_file, self.key_file, self.client_ca = cert_file, key_file, client_ca
        self._stamp = self._file_stamp()
        #: notAfter of the certificate in force (the ``koord_queue_certificate_expiry_...`` metric)
        self.not_after = self._expiry()
        self.current = make_ssl_context(cert_file, key_file, client_ca)
        # The listening context decides whether a client certificate is asked for at all; the
        # chain is verified against the store of the context swapped in by ``_select``.
        self.listening = make_ssl_context(cert_file, key_file, client_ca)
        self.listening.sni_callback = self._select

    def _select(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        connection.context = self.current

    def _expiry(self) -> datetime:
        """The leaf's notAfter (the first certificate of the chain file); read before the context
        is built, so a pair replaced in between shows its own expiry at the next reload."""
        return pki.not_after(self.cert_file.read_bytes())

    def _file_stamp(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = (self.cert_file.stat(), self.key_file.stat())
        except OSError:
            return None
        stamp = tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)
        if self.client_ca is not None:
            try:
                ca = self.client_ca.stat()
            except OSError:
                return (*stamp, (0, 0, 0))  # no CA (yet): refuse everyone until it appears
            stamp = (*stamp, (ca.st_mtime_ns, ca.st_size, ca.st_ino))
        return stamp

    def reload_if_changed(self) -> bool | None:
        """``None`` when the files did not change, else whether the new pair was loaded."""
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            not_after = self._expiry()
            self.current = make_ssl_context(self.cert_file, self.key_file, self.client_ca)
        except (OSError, ssl.SSLError, ValueError) as err:
            log.warning("serving certificate not reloaded, keeping the previous one: %s", err)
            return False
        self.not_after = not_after
        log.info("serving certificate reloaded from %s", self.cert_file)
        return True


CONFIG_KEY: Final = web.AppKey("config", ServerConfig)
METRICS_KEY: Final = web.AppKey("metrics", WebhookMetrics)
STATE_KEY: Final = web.AppKey("state", ServerState)
TLS_KEY: Final = web.AppKey("tls", ReloadingTLS)
#: the metrics listener's TLS: the same serving pair, plus the client CA (mutual TLS)
METRICS_TLS_KEY: Final = web.AppKey("metrics_tls", ReloadingTLS)


class _SecondClock:
    """The current UTC second as RFC 3339 text, formatted once per second (not once per review)."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self) -> str:
        second = time.time_ns() // 1_000_000_000  # datetime.now()'s clock, floored like its text
        if second != self._second:
            self._text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._second = second
        return self._text


_clock: Final = _SecondClock()

#: How a route decides a parsed review: ``(app, request, operation) -> response``.
Decision = Callable[[web.Application, AdmissionRequest, Operation], dict[str, Any]]


def now_text() -> str:
    """The enqueue timestamp the webhook stamps: RFC 3339, UTC, seconds."""
    return _clock()


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status, dumps=lambda v: orjson.dumps(v).decode())


def _result_of(response: dict[str, Any]) -> Result:
    if not response.get("allowed"):
        return Result.DENIED
    return Result.PATCHED if "patch" in response else Result.ALLOWED


def _decide_job(app: web.Application, parsed: AdmissionRequest, operation: Operation) -> dict[str, Any]:
    """Jobs and our own objects (``shared.admission.decisions``)."""
    # Only a mutation stamps the time (the enqueue timestamp); validation never reads it.
    stamp = now_text() if operation is Operation.MUTATE else ""
    return admission.decide(parsed, operation=operation, config=app[CONFIG_KEY].admission, now_text=stamp)


def _decide_all_jobs(app: web.Application, parsed: AdmissionRequest, operation: Operation) -> dict[str, Any]:
    """Jobs of the namespaces where queueing is mandatory: unlabelled ones are managed too
    (docs/operations.md#mandatory-queueing)."""
    stamp = now_text() if operation is Operation.MUTATE else ""
    config = app[CONFIG_KEY].admission
    return admission.decide(parsed, operation=operation, config=config, now_text=stamp, all_jobs=True)


def _decide_pod(app: web.Application, parsed: AdmissionRequest, operation: Operation) -> dict[str, Any]:
    """Pods labelled for the admission gate (``shared.admission.podgate``)."""
    return podgate.decide(parsed)


async def _review(request: web.Request, operation: Operation, decide: Decision = _decide_job) -> web.Response:
    app = request.app
    metrics = app[METRICS_KEY]
    started = time.perf_counter()
    encoding = request.headers.get("Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        # The apiserver never compresses reviews; refusing encodings also rules out zip bombs.
        metrics.observe_since(operation, "unknown", Result.MALFORMED, started)
        return _error(400, "Content-Encoding is not supported; send the AdmissionReview as plain JSON")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.observe_since(operation, "unknown", Result.TOO_LARGE, started)
        limit = app[CONFIG_KEY].max_body_bytes
        return _error(413, f"the request body exceeds the limit of {limit} bytes")
    except Exception:  # undecodable Content-Encoding, broken chunking, a client that went away
        metrics.observe_since(operation, "unknown", Result.MALFORMED, started)
        return _error(400, "the request body could not be read (check Content-Encoding and framing)")
    try:
        parsed = admission.parse_review(orjson.loads(body))
    except orjson.JSONDecodeError:
        metrics.observe_since(operation, "unknown", Result.MALFORMED, started)
        return _error(400, "the request body is not valid UTF-8 JSON")
    except admission.MalformedReview as err:
        metrics.observe_since(operation, "unknown", Result.MALFORMED, started)
        return _error(400, str(err))
    try:
        response = decide(app, parsed, operation)
        result = _result_of(response)
    except Exception as err:  # the decision is meant to be total; never let a bug become a 5xx
        log.error(
            "%s of %s uid=%s failed: %s",
            operation,
            parsed.kind,
            parsed.uid,
            type(err).__name__,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        message = "internal error in the koord-queue webhook; the request was not admitted, retry later"
        status = {"code": 500, "reason": "InternalError", "message": message}
        response = {"uid": parsed.uid, "allowed": False, "status": status}
        result = Result.ERROR
    metrics.observe_since(operation, parsed.kind, result, started)
    if result is Result.DENIED:
        log.info(
            "denied %s %s %s/%s uid=%s", operation, parsed.kind, parsed.namespace, parsed.name, parsed.uid
        )
        log.debug("denial of uid=%s: %s", parsed.uid, response.get("status", {}).get("message"))
    answer = {"apiVersion": admission.REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
    encoded = orjson.dumps(answer)
    # One turn of the event loop before answering: when several reviews arrived together (the
    # apiserver keeps many connections), all of them are decided back to back, then all answers
    # are written back to back, instead of alternating Python decisions with TLS writes and
    # send(2). Each phase then runs with warmer CPU caches (5-10% less CPU per review in the
    # closed-loop benchmark); a lone review waits for one loop turn (microseconds).
    await asyncio.sleep(0)
    return web.Response(body=encoded, content_type="application/json")


# The route handlers: ``_review`` itself with the operation bound (no extra coroutine per review).
mutate: Final = functools.partial(_review, operation=Operation.MUTATE)
validate: Final = functools.partial(_review, operation=Operation.VALIDATE)
mutate_pod: Final = functools.partial(_review, operation=Operation.MUTATE, decide=_decide_pod)
mutate_unlabelled: Final = functools.partial(_review, operation=Operation.MUTATE, decide=_decide_all_jobs)
validate_unlabelled: Final = functools.partial(_review, operation=Operation.VALIDATE, decide=_decide_all_jobs)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    if request.app[STATE_KEY].ready:
        return web.Response(text="ok")
    return web.Response(text="shutting down", status=503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _certificate_reloader(app: web.Application) -> AsyncIterator[None]:
    """Poll the certificate files while the app runs (a ``cleanup_ctx`` generator)."""
    tls, metrics = app[TLS_KEY], app[METRICS_KEY]

    scraping = app.get(METRICS_TLS_KEY)

    async def poll() -> None:
        while True:
            await asyncio.sleep(app[CONFIG_KEY].cert_reload_interval)
            outcome = tls.reload_if_changed()
            if outcome is not None:
                metrics.certificate_reloads.labels("ok" if outcome else "failed").inc()
            if scraping is not None:
                scraping.reload_if_changed()

    task = asyncio.create_task(poll(), name="webhook-certificate-reloader")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_app(config: ServerConfig, *, metrics: WebhookMetrics | None = None) -> web.Application:
    """The admission app. Loads the TLS files now (fail fast) when both are configured."""
    app = web.Application(client_max_size=config.max_body_bytes)
    app[CONFIG_KEY] = config
    app[METRICS_KEY] = metrics or WebhookMetrics()
    app[STATE_KEY] = ServerState()
    if config.cert_file is not None and config.key_file is not None:
        tls = app[TLS_KEY] = ReloadingTLS(config.cert_file, config.key_file)
        app[METRICS_KEY].certificates.watch("webhook", "serving", lambda: tls.not_after)
        if config.metrics_client_ca is not None:
            app[METRICS_TLS_KEY] = ReloadingTLS(config.cert_file, config.key_file, config.metrics_client_ca)
        app.cleanup_ctx.append(_certificate_reloader)
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/mutate/{kind}", mutate)
    app.router.add_post("/validate", validate)
    app.router.add_post("/validate/{kind}", validate)
    app.router.add_post("/mutate-pod", mutate_pod)
    app.router.add_post("/mutate-unlabelled", mutate_unlabelled)
    app.router.add_post("/validate-unlabelled", validate_unlabelled)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def make_metrics_app(admission_app: web.Application) -> web.Application:
    """The metrics side app: ``/metrics`` only, served over mutual TLS (``METRICS_TLS_KEY``) or, with
    ``metrics_insecure``, plain HTTP."""
    app = web.Application()
    app[METRICS_KEY] = admission_app[METRICS_KEY]
    app.router.add_get("/metrics", metrics_endpoint)
    return app


def make_health_app(admission_app: web.Application) -> web.Application:
    """The probes' side app, plain HTTP: ``/healthz`` and ``/readyz`` (not ready once shutdown starts)."""
    app = web.Application()
    app[STATE_KEY] = admission_app[STATE_KEY]
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_context(app: web.Application) -> ssl.SSLContext | None:
    """The metrics listener's context; None for plain HTTP. Raises ``ValueError`` when the metrics
    would be served neither with a client CA nor on purpose in the clear."""
    if METRICS_TLS_KEY in app:
        return app[METRICS_TLS_KEY].listening
    if app[CONFIG_KEY].metrics_insecure:
        return None
    raise ValueError("no client CA for the metrics")


def make_runner(app: web.Application) -> web.AppRunner:
    """An AppRunner with the server settings the webhook needs.

    ``auto_decompress=False``: aiohttp would otherwise inflate ``Content-Encoding`` bodies inside its
    HTTP parser, where a corrupt stream can stall the connection before our handler runs; the
    handler refuses encoded bodies instead. Access logs are off (one line per review is noise at
    hundreds of reviews per second; denials are logged by the handler).
    """
    return web.AppRunner(app, access_log=None, auto_decompress=False, shutdown_timeout=10.0)


async def run(config: ServerConfig, *, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (by default: until SIGTERM or SIGINT), then drain and close."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    app = make_app(config)
    runners: list[web.AppRunner] = []
    try:
        runner = make_runner(app)
        await runner.setup()
        runners.append(runner)
        ssl_context = app[TLS_KEY].listening if TLS_KEY in app else None
        if ssl_context is None:
            log.warning("no --cert-file/--key-file: serving plain HTTP (the apiserver requires HTTPS)")
        await web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context).start()
        if config.health_port:
            health_runner = make_runner(make_health_app(app))
            await health_runner.setup()
            runners.append(health_runner)
            await web.TCPSite(health_runner, config.host, config.health_port).start()
        if config.metrics_port and (METRICS_TLS_KEY in app or config.metrics_insecure):
            metrics_runner = make_runner(make_metrics_app(app))
            await metrics_runner.setup()
            runners.append(metrics_runner)
            scraping = metrics_context(app)
            await web.TCPSite(metrics_runner, config.host, config.metrics_port, ssl_context=scraping).start()
        elif config.metrics_port:
            log.warning("metrics not served: no --metrics-client-ca (docs/operations.md#metrics)")
        log.info(
            "webhook serving on %s:%d (metrics port %d, health port %d)",
            config.host,
            config.port,
            config.metrics_port,
            config.health_port,
        )
        await stop.wait()
        app[STATE_KEY].ready = False
        log.info("shutting down in %.1fs", config.shutdown_delay)
        await asyncio.sleep(config.shutdown_delay)
    finally:
        for each in reversed(runners):
            await each.cleanup()

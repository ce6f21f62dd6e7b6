"""HTTP server of the visibility API (``visibility.koord-queue.x-k8s.io/v1alpha1``).

Every replica serves it from its own scheduler cache (followers keep theirs warm from the same
watches, including each unit's ``status.message`` written by the leader), so the APIService's
Service may select all replicas. Answers come from ``shared.core.visibility``.

In a cluster the kube-apiserver's aggregator proxies ``kubectl get --raw /apis/visibility...`` to
the Service ``koord-queue-visibility-server`` over TLS, dialling it as
``<service>.<namespace>.svc`` and trusting the APIService's ``caBundle``. Three pieces make that
work without files in the pod:

* **Serving certificate.** The leader's ``certs.manager.VisibilityCertManager`` keeps the pair in a
  Secret and the CA in the APIService. Every replica re-reads the Secret (``follow_cluster``) and
  ``ServingTLS`` swaps the pair in memory: the listening socket's ``sni_callback`` hands each new
  handshake the context now in force, so a rotation drops no connection and needs no restart.
* **Authentication (requestheader).** Only the aggregator may call: the client must present a
  certificate from the apiserver's requestheader CA (the front-proxy CA; read from the ConfigMap
  ``kube-system/extension-apiserver-authentication``, or given with ``--visibility-client-ca``),
  whose common name is in ``requestheader-allowed-names`` when that list is set. The end user is
  the first ``X-Remote-User`` (``requestheader-username-headers``) header; a request without one
  is refused (401). Direct callers with any other certificate fail the TLS handshake.
* **Authorization** is the kube-apiserver's: it authorized the end user for the APIService path
  (e.g. ``get`` on ``queues/queueunits`` in ``visibility.koord-queue.x-k8s.io``) before proxying,
  and only it can reach this server. Nothing here checks RBAC again; the user is logged at debug
  level for the record. A namespace user is authorized only for paths under
  ``namespaces/<their namespace>/`` (a RoleBinding grants nothing without a namespace), and those
  answers are restricted to that namespace; the paths without a namespace need a cluster-wide
  grant.

Without TLS (no certificate flags) the API is plain HTTP for local use, as the tests' direct handler
checks and ``make run`` without aggregation do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from koord_queue.certs import pki
from koord_queue.certs.manager import read_serving_pair
from koord_queue.shared import kube
from koord_queue.shared.core import visibility
from koord_queue.shared.core.scheduling import Cache

log = logging.getLogger(__name__)

_PREFIX = f"/apis/{visibility.GROUP}/{visibility.VERSION}"
#: The APIService's name is fixed by the API: ``<version>.<group>``.
APISERVICE: Final = f"{visibility.VERSION}.{visibility.GROUP}"
CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"

CONFIGMAPS: Final = kube.Resource("", "v1", "configmaps", "ConfigMap")
#: Where the kube-apiserver publishes how aggregated servers authenticate it (the same ConfigMap
#: every aggregated apiserver built on k8s.io/apiserver reads).
AUTHENTICATION_NAMESPACE: Final = "kube-system"
AUTHENTICATION_CONFIGMAP: Final = "extension-apiserver-authentication"
DEFAULT_USERNAME_HEADERS: Final = ("X-Remote-User",)
USER_KEY: Final = web.AppKey("user", str)


# --- authentication (pure) -------------------------------------------------------------------------


class Unauthorized(Exception):
    """The caller is not the aggregator, or named no user; the message says which."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Who may front this server (the aggregator's client certificate) and where it names the user.

    ``allowed_names`` empty means any certificate from ``client_ca_pem`` is accepted, as the
    apiserver's ``--requestheader-allowed-names`` does.
    """

    client_ca_pem: bytes
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = DEFAULT_USERNAME_HEADERS

    @classmethod
    def from_configmap(cls, data: Mapping[str, str]) -> RequestHeader | None:
        """Parse ``extension-apiserver-authentication``'s data; None without a requestheader CA.

        The list values are JSON arrays (``["front-proxy-client"]``), as the apiserver writes them.
        """
        ca = (data.get("requestheader-client-ca-file") or "").strip()
        if not ca:
            return None
        headers = _string_list(data.get("requestheader-username-headers"))
        return cls(
            client_ca_pem=ca.encode() + b"\n",
            allowed_names=frozenset(_string_list(data.get("requestheader-allowed-names"))),
            username_headers=tuple(headers) or DEFAULT_USERNAME_HEADERS,
        )

    def user(self, peer_cert: Mapping[str, Any] | None, headers: Mapping[str, str]) -> str:
        """The end user of a request whose TLS peer presented ``peer_cert`` (``getpeercert()``).

        Raises ``Unauthorized`` when there is no verified client certificate, when its common name
        is not allowed, or when no username header is set.
        """
        if not peer_cert:
            raise Unauthorized("a client certificate from the requestheader CA is required")
        common_names = {
            value for rdn in peer_cert.get("subject", ()) for key, value in rdn if key == "commonName"
        }
        if self.allowed_names and not common_names & self.allowed_names:
            raise Unauthorized(
                f"client certificate {sorted(common_names)} is not one of the requestheader allowed names"
            )
        for header in self.username_headers:
            if user := headers.get(header, "").strip():
                return user
        raise Unauthorized(f"no user in {', '.join(self.username_headers)}")


def _string_list(raw: str | None) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []


# --- TLS -------------------------------------------------------------------------------------------


def _context(*, client_auth: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_TICKET
    # A resumed session skips client-certificate verification: it could outlive a CA rotation.
    ctx.num_tickets = 0
    if client_auth:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@contextlib.contextmanager
def _memory_file(name: str, data: bytes) -> Iterator[str]:
    """A path to ``data`` that lives in memory only: an anonymous file (memfd), named through
    ``/proc/self/fd``. Nothing is written to a disk, so the reconciler needs no writable
    directory: the image's root filesystem is read-only and it has no home or temporary directory
    (docs/development.md#runtime-constraints). Only this process can open the path."""
    fd = os.memfd_create(f"koord-queue-{name}", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _load_pair(ctx: ssl.SSLContext, serving: pki.KeyPair) -> None:
    # The ssl module loads certificates only from files: hand it in-memory ones.
    with _memory_file("tls.crt", serving.cert_pem) as cert, _memory_file("tls.key", serving.key_pem) as key:
        ctx.load_cert_chain(cert, key)


class ServingTLS:
    """The listening context plus the context in force (see the module docstring).

    ``client_auth`` is fixed for the server's life: it decides whether the listening socket asks
    for a client certificate at all. Until a serving pair (and, with ``client_auth``, a
    requestheader CA) is known there is no context in force and every handshake fails, which is
    the honest answer while there is nothing to present.
    """

    def __init__(self, *, client_auth: bool, what: str = "visibility") -> None:
        self.client_auth = client_auth
        #: which server's certificate, for the log (the metrics server reuses this class)
        self.what = what
        self.listening = _context(client_auth=client_auth)
        self.listening.sni_callback = self._select
        self.current: ssl.SSLContext | None = None
        self.serving: pki.KeyPair | None = None
        self.requestheader: RequestHeader | None = None

    @property
    def ready(self) -> bool:
        return self.current is not None

    def cert_in_force(self) -> bytes | None:
        """The certificate handshakes present now (None until a context is in force): the one whose
        expiry ``koord_queue_certificate_expiry_timestamp_seconds`` reports."""
        return self.serving.cert_pem if self.current is not None and self.serving is not None else None

    def _select(self, connection: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        if self.current is not None:
            # OpenSSL verifies the client against the store of the context swapped in here.
            connection.context = self.current

    def update(self, *, serving: pki.KeyPair | None, requestheader: RequestHeader | None) -> bool:
        """Take a newer pair or requestheader CA; None keeps what is in force. True when swapped.

        Raises ``ssl.SSLError`` or ``ValueError`` for material that does not load; the context in
        force is then kept.
        """
        serving = serving or self.serving
        requestheader = requestheader or self.requestheader
        if (serving, requestheader) == (self.serving, self.requestheader):
            return False
        if serving is None or (self.client_auth and requestheader is None):
            self.serving, self.requestheader = serving, requestheader
            return False
        ctx = _context(client_auth=self.client_auth)
        _load_pair(ctx, serving)
        if self.client_auth and requestheader is not None:
            # The listening context decides that a certificate is required; the chain is verified
            # against the store of the context swapped in (tests/unit/test_visibility_server.py).
            ctx.load_verify_locations(cadata=requestheader.client_ca_pem.decode())
        self.current, self.serving, self.requestheader = ctx, serving, requestheader
        log.info("%s serving certificate in force: %s", self.what, sorted(pki.dns_names_of(serving.cert_pem)))
        return True


async def read_requestheader(client: kube.Kube) -> RequestHeader | None:
    """The requestheader settings the kube-apiserver publishes; None when it publishes none."""
    try:
        obj = await client.get(CONFIGMAPS, AUTHENTICATION_CONFIGMAP, namespace=AUTHENTICATION_NAMESPACE)
    except kube.NotFound:
        return None
    return RequestHeader.from_configmap(obj.get("data") or {})


async def follow_cluster(
    tls: ServingTLS,
    client: kube.Kube,
    *,
    namespace: str,
    secret: str,
    requestheader: RequestHeader | None,
    interval_s: float,
) -> None:
    """Keep ``tls`` on the Secret's pair and the published requestheader CA; runs on every replica.

    ``requestheader`` given (``--visibility-client-ca``) is used as is; otherwise the ConfigMap is
    re-read with the Secret. Until the leader has issued the first pair the Secret is polled every
    two seconds, then every ``interval_s``.
    """
    while True:
        try:
            serving = await read_serving_pair(client, namespace=namespace, secret=secret)
            published = requestheader if requestheader is not None else await read_requestheader(client)
            tls.update(serving=serving, requestheader=published)
        except kube.KubeError as err:
            log.warning("visibility certificate not refreshed: %s", err)
        except (ssl.SSLError, ValueError) as err:
            log.warning("visibility certificate not loaded, keeping the previous one: %s", err)
        await asyncio.sleep(interval_s if tls.ready else min(interval_s, 2.0))


# --- HTTP ------------------------------------------------------------------------------------------


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


def _answer(build: Callable[[], dict[str, Any]]) -> web.Response:
    """``build``'s answer, or the Status a Kubernetes client expects for what it refused."""
    try:
        return _json(build())
    except visibility.NotFound as err:
        return _status(404, "NotFound", str(err))
    except visibility.BadRequest as err:
        return _status(400, "BadRequest", str(err))


def _authenticator(tls: ServingTLS) -> Any:
    @web.middleware
    async def authenticate(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        requestheader = tls.requestheader
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            if requestheader is None:
                raise Unauthorized("the requestheader CA is not known yet")
            user = requestheader.user(peer, request.headers)
        except Unauthorized as err:
            return _status(401, "Unauthorized", str(err))
        log.debug("visibility %s %s for %s", request.method, request.path_qs, user)
        return await handler(request)

    return authenticate


def make_app(
    cache: Callable[[], Cache],
    *,
    tls: ServingTLS | None = None,
    background: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> web.Application:
    """The API; with ``tls.client_auth``, only for the aggregator. ``background`` (the certificate
    follower) runs for as long as the server does."""

    async def discovery(_: web.Request) -> web.Response:
        return _json(visibility.discovery())

    async def queue(request: web.Request) -> web.Response:
        c = cache()
        return _answer(
            lambda: visibility.queue_units(c.state, c.units, request.match_info["name"], dict(request.query))
        )

    async def quota(request: web.Request) -> web.Response:
        c = cache()
        known = set(c.ledger.quotas)
        return _answer(
            lambda: visibility.quota_units(
                c.state, c.units, request.match_info["name"], known, dict(request.query)
            )
        )

    async def namespace_queue(request: web.Request) -> web.Response:
        c = cache()
        return _answer(
            lambda: visibility.queue_units(
                c.state,
                c.units,
                request.match_info["name"],
                dict(request.query),
                namespace=request.match_info["namespace"],
            )
        )

    async def namespace(request: web.Request) -> web.Response:
        c = cache()
        return _answer(
            lambda: visibility.namespace_units(
                c.state, c.units, request.match_info["namespace"], dict(request.query)
            )
        )

    async def all_quotas(request: web.Request) -> web.Response:
        c = cache()
        return _answer(
            lambda: visibility.quotas(
                c.ledger, c.state, dict(request.query), history=c.snapshot.history, now=time.time()
            )
        )

    async def namespace_quotas(request: web.Request) -> web.Response:
        c = cache()
        return _answer(
            lambda: visibility.quotas(
                c.ledger,
                c.state,
                dict(request.query),
                namespace=request.match_info["namespace"],
                history=c.snapshot.history,
                now=time.time(),
            )
        )

    app = web.Application(middlewares=[_authenticator(tls)] if tls is not None and tls.client_auth else [])
    app.router.add_get(_PREFIX, discovery)
    app.router.add_get(f"{_PREFIX}/queues/{{name}}/queueunits", queue)
    app.router.add_get(f"{_PREFIX}/elasticquotas/{{name}}/queueunits", quota)
    app.router.add_get(f"{_PREFIX}/quotas", all_quotas)
    # The apiserver authorized these for the namespace in the path (RBAC in that namespace), so the
    # answers never reach past it: see shared/core/visibility.py.
    app.router.add_get(f"{_PREFIX}/namespaces/{{namespace}}/queueunits", namespace)
    app.router.add_get(f"{_PREFIX}/namespaces/{{namespace}}/queues/{{name}}/queueunits", namespace_queue)
    app.router.add_get(f"{_PREFIX}/namespaces/{{namespace}}/quotas", namespace_quotas)
    if background is not None:
        work = background

        async def guarded() -> None:
            try:
                await work()
            except Exception:  # a bug must not surface only as an error at shutdown
                log.exception("visibility background task stopped; the last certificate stays")

        async def run_in_background(_: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(guarded(), name="visibility-certificates")
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(run_in_background)
    return app


def static_tls(
    *, cert_file: str, key_file: str, client_ca: str | None, allowed_names: frozenset[str]
) -> ServingTLS:
    """TLS from files given on the command line, loaded once (``--visibility-cert-file``)."""
    tls = ServingTLS(client_auth=bool(client_ca))
    tls.update(
        serving=pki.KeyPair(cert_pem=Path(cert_file).read_bytes(), key_pem=Path(key_file).read_bytes()),
        requestheader=static_requestheader(client_ca, allowed_names),
    )
    return tls


def static_requestheader(client_ca: str | None, allowed_names: frozenset[str]) -> RequestHeader | None:
    """The requestheader settings of ``--visibility-client-ca`` and ``--visibility-allowed-names``."""
    if not client_ca:
        return None
    return RequestHeader(client_ca_pem=Path(client_ca).read_bytes(), allowed_names=allowed_names)

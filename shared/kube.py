"""The one module that talks to the Kubernetes API (docs/architecture.md#import-rules).

``shared.kubeconfig`` loads the configuration (a kubeconfig or the in-cluster ServiceAccount, with
token refresh and exec credential plugins); this module opens its own aiohttp session with those
TLS settings and sends raw JSON through it, with no generated model classes. Why: the reconciler
handles every object as plain JSON parsed once at the edge (``shared.api.parsing``), orjson is
several times faster than building model objects, one uniform path serves built-in kinds, our CRDs
and foreign CRDs alike, and kubernetes-asyncio's generated client, which costs about 38 MiB and
0.4 s at every start (docs/development.md#api-client), is imported only by the one process that
needs it, for leader election (:attr:`Kube.api_client`), or for a kubeconfig user only its loader
understands.

It adds what a controller needs on top: a client-side rate limit (QPS and burst, like client-go),
counters of requests and writes (the benchmarks report writes per admitted job), typed errors
(:class:`NotFound`, :class:`Conflict`, :class:`Gone`, ...), a streaming watch that yields
``(type, object)`` pairs and surfaces ``410 Gone`` so the caller relists, and one retry of a
request the API server answered 401 when the credentials could be renewed (a rotated token file,
an exec plugin's expired credential).

Error tree::

    KubeError (status, reason, message)
     ├── NotFound        404
     ├── Conflict        409 (write conflicts; also AlreadyExists, see ``reason``)
     ├── Gone            410 (a watch or list resourceVersion that is too old)
     ├── Invalid         422
     ├── TooManyRequests 429
     └── NotLeading      never sent: a write refused while this process does not lead
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

import aiohttp
import orjson

from koord_queue.shared import credentials as creds
from koord_queue.shared import kubeconfig as kc
from koord_queue.shared import ratelimit

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"

Obj = dict[str, Any]


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 for a transport error)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class ClientConfigError(Exception):
    """No usable kubeconfig or in-cluster credentials; the message says what is missing."""


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    pass


class Invalid(KubeError):
    pass


class TooManyRequests(KubeError):
    pass


class NotLeading(KubeError):
    """A write refused by :class:`Leadership` before it was sent (status 0, nothing reached the API)."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(0, "NotLeading", f"{method} {path} refused: this replica does not lead")


class Leadership:
    """Whether this process may change the cluster: the one gate every write passes.

    A reconciler started with ``--leader-elect`` is a follower until it holds the Lease; a follower
    keeps its informers warm and serves reads, and must never write. Rather than trusting every
    write path (workers, spawned status notes, the event recorder, certificate managers, the
    Queue and ConfigMap syncs, and whatever is added later) to check, :class:`Kube` refuses every
    request that is not a read while the gate is closed: it raises :class:`NotLeading` before the
    request is rate-limited, counted or sent, so a follower cannot write even through a path that
    forgot to ask. The Lease itself is kept by kubernetes-asyncio's own client, outside the gate.

    The same object is handed to the parts that queue work from watch events (the scheduler's
    status notes, the event recorder, the job extensions): while following they queue nothing,
    so no per-object work piles up and nothing seen while following is written on take-over (a
    new leader starts from a full pass over its warm caches instead, see ``reconciler/main.py``).

    Opened by ``shared.leases.lead`` once the Lease is held, closed the moment it is lost. Open by default:
    a process without leader election (tools, tests, a single replica) always leads.
    """

    def __init__(self, *, leading: bool = True) -> None:
        self._leading = leading

    @property
    def leading(self) -> bool:
        return self._leading

    def acquire(self) -> None:
        self._leading = True

    def release(self) -> None:
        self._leading = False


#: Methods that only read (list and watch are GETs too): allowed whether or not the process leads.
_READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


_ERRORS: dict[int, type[KubeError]] = {
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """An object's ``metadata.resourceVersion`` as a number (etcd's revision), None if it has none.

    Kubernetes calls the value opaque; the reconciler compares it only between versions of one
    object it read or wrote itself, to tell a watch that lags behind its own write.
    """
    try:
        return int(str((obj.get("metadata") or {}).get("resourceVersion")))
    except (TypeError, ValueError):
        return None


class OwnWrites:
    """The resourceVersion our last write of each object made, kept until the watch delivers it.

    A writer that plans from an informer store and writes conditionally on the version it read
    would, while the store still holds the copy from before its own write, plan the same write again
    and earn a 409 (or, unconditional, undo nothing but waste a write). :meth:`behind` tells it to
    wait for the watch event instead; the entry is dropped once the store has caught up.
    """

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def wrote(self, key: str, written: object) -> None:
        """Remember the version ``written`` (a write's answer) made, if it carries one."""
        rv = resource_version(written) if isinstance(written, Mapping) else None
        if rv is not None:
            self.versions[key] = max(rv, self.versions.get(key, 0))

    def behind(self, key: str, stored: Mapping[str, Any]) -> bool:
        """Whether ``stored`` is older than our last write of ``key`` (forgotten once it is not)."""
        ours = self.versions.get(key)
        if ours is None:
            return False
        rv = resource_version(stored)
        if rv is not None and rv < ours:
            return True
        del self.versions[key]
        return False

    def forget(self, key: str) -> None:
        self.versions.pop(key, None)


def error_for(status: int, body: bytes) -> KubeError:
    """Build the typed error from an API ``Status`` body (or whatever the server sent)."""
    reason, message = "", body[:500].decode(errors="replace")
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        status_obj = orjson.loads(body)
        reason = str(status_obj.get("reason", ""))
        message = str(status_obj.get("message", message))
    return _ERRORS.get(status, KubeError)(status, reason, message)


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API: ``/api/v1`` for the core group, ``/apis/<g>/<v>`` otherwise."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS: Final = Resource("", "v1", "pods", "Pod")
EVENTS: Final = Resource("", "v1", "events", "Event")
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
PRIORITY_CLASSES: Final = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")
LIMIT_RANGES: Final = Resource("", "v1", "limitranges", "LimitRange")
RUNTIME_CLASSES: Final = Resource("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", namespaced=False)
TOKEN_REVIEWS: Final = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)
SUBJECT_ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
_REVIEWS: Final = frozenset({TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS})
#: Reviews store nothing: a follower may create them (``Kube.review``).
_REVIEW_PATHS: Final = frozenset(r.path() for r in _REVIEWS)


class Kube:
    """An API client for one process. Create with :meth:`connect`; close with :meth:`close`."""

    def __init__(
        self,
        settings: kc.Settings,
        *,
        qps: float,
        burst: int,
        user_agent: str,
        impersonate: str | None = None,
        leadership: Leadership | None = None,
        pool_size: int = 64,
    ) -> None:
        self.settings = settings
        #: the gate of every write (:class:`Leadership`); open unless the caller passes a closed one
        self.leadership = leadership if leadership is not None else Leadership()
        self._limiter = ratelimit.RateLimiter(qps=qps, burst=burst)
        self._host = settings.host.rstrip("/")
        self._headers = {"User-Agent": user_agent, "Accept": JSON}
        self._impersonate = impersonate
        if impersonate:
            # Like kubectl --as: every request, including the library's own (leader election),
            # is made as this user; RBAC then applies to it.
            self._headers["Impersonate-User"] = impersonate
        self._pool_size = pool_size
        self._credentials = settings.credentials
        #: the client certificate an exec plugin gave, which the session's TLS holds
        self._certificate: tuple[bytes, bytes] | None = None
        self._session = self._open_session(None)
        #: sessions replaced after an exec plugin renewed its certificate, closed with this client
        #: (a watch may still be reading from one)
        self._retired: list[aiohttp.ClientSession] = []
        self._api: Any = None
        #: requests sent, by verb (GET, LIST, WATCH, POST, PATCH, PUT, DELETE)
        self.requests: Counter[str] = Counter()
        #: called with the verb of every request sent (the reconciler feeds its Prometheus counter)
        self.on_request: Callable[[str], None] | None = None
        #: called with the verb and HTTP status (0: no response) of every request that failed
        self.on_error: Callable[[str, int], None] | None = None

    def _open_session(self, certificate: tuple[bytes, bytes] | None) -> aiohttp.ClientSession:
        # trust_env=False: with it, aiohttp looks up netrc and proxy variables in a worker thread
        # on every request (about 0.8 ms of CPU each); the kubeconfig's proxy-url is not used.
        connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self.settings.ssl_context(certificate))
        return aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        qps: float = 200.0,
        burst: int = 400,
        user_agent: str = "koord-queue-py",
        impersonate: str | None = None,
        pool_size: int = 64,
        leadership: Leadership | None = None,
        context: str | None = None,
    ) -> Kube:
        """Load the kubeconfig (or the in-cluster service account when none is given); ``context``
        names a kubeconfig context other than its current one (``kubectl --context``)."""
        where = kubeconfig or "the in-cluster ServiceAccount"
        try:
            settings = await kc.load(kubeconfig, context)
            return cls(
                settings,
                qps=qps,
                burst=burst,
                user_agent=user_agent,
                impersonate=impersonate,
                leadership=leadership,
                pool_size=pool_size,
            )
        except creds.ConfigError as err:
            raise ClientConfigError(f"cannot load API credentials from {where}: {err}") from None

    @classmethod
    def from_token(
        cls,
        *,
        host: str,
        token: str,
        ca_file: str | None,
        qps: float = 50.0,
        burst: int = 100,
        user_agent: str = "koord-queue-py",
        pool_size: int = 8,
    ) -> Kube:
        """A client that sends every request with ``token`` as its bearer token and nothing else:
        no kubeconfig, no ServiceAccount of this process (the in-cluster dashboard acts as the
        person whose token it was given, docs/dashboard.md)."""
        settings = kc.Settings(host=host, ca_file=ca_file, credentials=creds.Static(f"Bearer {token}"))
        return cls(settings, qps=qps, burst=burst, user_agent=user_agent, pool_size=pool_size)

    @property
    def api_client(self) -> Any:
        """kubernetes-asyncio's ``ApiClient`` with the same credentials, for its leader election
        (``shared/leases.py``): built, and kubernetes-asyncio imported, on first use."""
        if self._api is None:
            client = kc.import_kubernetes_asyncio()
            configuration = self.settings.configuration()
            configuration.connection_pool_maxsize = self._pool_size
            self._api = client.ApiClient(configuration)
            if self._impersonate:
                self._api.set_default_header("Impersonate-User", self._impersonate)
        return self._api

    async def close(self) -> None:
        for session in (*self._retired, self._session):
            await session.close()
        if self._api is not None:
            await self._api.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def writes(self) -> int:
        return sum(n for verb, n in self.requests.items() if verb in ("POST", "PATCH", "PUT", "DELETE"))

    def _count(self, verb: str) -> None:
        self.requests[verb] += 1
        if self.on_request is not None:
            self.on_request(verb)

    def _failed(self, verb: str, status: int) -> None:
        if self.on_error is not None:
            self.on_error(verb, status)

    async def _credential(self) -> creds.Credential:
        """The credential to send now; a new client certificate (an exec plugin's) moves this
        client to a new session, since TLS presents it only on new connections."""
        try:
            credential = await self._credentials.current()
        except creds.ConfigError as err:  # an exec plugin that fails when run again
            raise KubeError(0, "CredentialError", str(err)) from None
        if credential.certificate != self._certificate:
            self._retired.append(self._session)
            self._session = self._open_session(credential.certificate)
            self._certificate = credential.certificate
        return credential

    def _headers_for(self, content_type: str | None, credential: creds.Credential) -> dict[str, str]:
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        if credential.authorization:
            headers["Authorization"] = credential.authorization
        return headers

    async def _renewed(self, refused: creds.Credential) -> bool:
        """After a 401: whether the credentials were renewed, so one retry is worth it."""
        try:
            return await self._credentials.rejected(refused)
        except creds.ConfigError as err:
            raise KubeError(
                401, "Unauthorized", f"the credentials were refused and cannot be renewed: {err}"
            ) from None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = 30.0,
        verb: str | None = None,
    ) -> Obj:
        """One API call; returns the decoded JSON body or raises a :class:`KubeError`.

        A write while :attr:`leadership` is closed raises :class:`NotLeading` and sends nothing (a
        review excepted, see :meth:`review`).
        """
        if method not in _READ_METHODS and not self.leadership.leading and path not in _REVIEW_PATHS:
            raise NotLeading(method, path)
        await self._limiter.acquire()
        self._count(verb or method)
        url = self._host + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else orjson.dumps(body)
        for attempt in (1, 2):
            credential = await self._credential()
            headers = self._headers_for(content_type or (JSON if body is not None else None), credential)
            try:
                async with self._session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    server_hostname=self.settings.server_name,
                ) as resp:
                    payload = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as err:
                self._failed(verb or method, 0)
                raise KubeError(0, type(err).__name__, str(err) or type(err).__name__) from err
            if status == 401 and attempt == 1 and await self._renewed(credential):
                continue
            if status >= 300:
                self._failed(verb or method, status)
                raise error_for(status, payload)
            break
        if not payload:
            return {}
        result: Obj = orjson.loads(payload)
        return result

    # --- conveniences -------------------------------------------------------------------------

    async def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Obj], str]:
        """Every object (paginated) and the list's resourceVersion to watch from."""
        items: list[Obj] = []
        query: dict[str, Any] = {"limit": page_size}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", res.path(namespace), query=query, verb="LIST")
            kind = res.kind
            for item in page.get("items") or []:
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", kind)
                items.append(item)
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))
            query["continue"] = token

    async def create(self, res: Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        return await self.request("POST", res.path(namespace), body=obj)

    async def review(self, res: Resource, obj: Obj) -> Obj:
        """Create a review (TokenReview, SubjectAccessReview) and return the API server's answer.

        A review is a question, not a write: nothing is stored, so it passes the :class:`Leadership`
        gate on every replica (each replica guards its own ``/metrics``, docs/operations.md#metrics)
        and is counted under the verb ``REVIEW``, not among the writes.
        """
        if res not in _REVIEWS:
            raise ValueError(f"{res.kind} is not a review")
        return await self.request("POST", res.path(), body=obj, verb="REVIEW")

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str = "",
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        return await self.request(
            "PATCH", res.path(namespace, name, subresource), body=patch, content_type=content_type
        )

    async def replace(
        self, res: Resource, name: str, obj: Obj, *, namespace: str | None = None, subresource: str = ""
    ) -> Obj:
        return await self.request("PUT", res.path(namespace, name, subresource), body=obj)

    async def delete(
        self,
        res: Resource,
        name: str,
        *,
        namespace: str | None = None,
        precondition_uid: str | None = None,
        precondition_rv: str | None = None,
        propagation: str | None = None,
    ) -> Obj:
        body: Obj | None = None
        if precondition_uid or propagation:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if precondition_uid:
                body["preconditions"] = {"uid": precondition_uid}
                if precondition_rv:
                    body["preconditions"]["resourceVersion"] = precondition_rv
            if propagation:
                body["propagationPolicy"] = propagation
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Stream ``(type, object)`` from ``resource_version``; BOOKMARKs included.

        Raises :class:`Gone` when the server says the version is too old (the caller relists). The
        stream ends normally when the server closes it after ``timeout_seconds``.
        """
        await self._limiter.acquire()
        self._count("WATCH")
        query: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        if label_selector:
            query["labelSelector"] = label_selector
        url = self._host + res.path(namespace) + "?" + urlencode(query)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30)
        try:
            for attempt in (1, 2):
                credential = await self._credential()
                async with self._session.get(
                    url,
                    headers=self._headers_for(None, credential),
                    timeout=timeout,
                    server_hostname=self.settings.server_name,
                ) as resp:
                    if resp.status == 401 and attempt == 1 and await self._renewed(credential):
                        continue
                    if resp.status >= 300:
                        self._failed("WATCH", resp.status)
                        raise error_for(resp.status, await resp.read())
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = orjson.loads(line)
                        kind = event.get("type", "")
                        obj = event.get("object") or {}
                        if kind == "ERROR":
                            code = int(obj.get("code", 500))
                            self._failed("WATCH", code)
                            raise error_for(code, orjson.dumps(obj))
                        if kind != "BOOKMARK":
                            obj.setdefault("apiVersion", res.api_version)
                            obj.setdefault("kind", res.kind)
                        yield kind, obj
                    return
        except (aiohttp.ClientError, TimeoutError) as err:
            self._failed("WATCH", 0)
            raise KubeError(0, type(err).__name__, str(err) or type(err).__name__) from err

"""Who may read the reconciler's ``/metrics``: the pure half of its authentication and authorization
(docs/operations.md#metrics).

The endpoint is guarded the way controller-runtime guards a manager's secure metrics (Kueue's
``--metrics-secure``): the caller's bearer token is checked with a TokenReview, then the user it
names with a SubjectAccessReview for the non-resource URL ``/metrics``, verb ``get``; no token or a
token the API server does not accept is answered 401, an authenticated user without that right 403.
A scraper gets the right through a ClusterRoleBinding to ``koord-queue-metrics-reader``; a
RoleBinding cannot grant a non-resource URL, so no namespace user can give it to themselves.

This module decides; ``reconciler/servers.py`` sends the two reviews through ``shared.kube``. Here
are the review bodies, how an answer reads, and the cache of verdicts: every scrape would otherwise
cost two API calls, so a verdict is kept briefly (allowed for ``allowed_ttl_s``, refused or
unauthenticated for the shorter ``denied_ttl_s``, as controller-runtime's delegating authorizer
does), keyed by a digest of the token, never the token itself. The cache is bounded, and allowed
verdicts are kept apart from refusals: a caller sending ever new tokens evicts only the oldest
refusals, never a scraper's allowed verdict, and cannot grow the process.

A token the cache does not know costs two API calls, made with the reconciler's own client and its
rate limit. So that a flood of fresh tokens cannot spend the budget the reconciler admits jobs
with, reviews draw from a budget of their own (:class:`ReviewBudget`, 10 a second, bursts of 20);
past it an unknown token is answered 429 without asking the API server, while a scraper whose
verdict is cached is answered as before.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

AUTHENTICATION_API: Final = "authentication.k8s.io/v1"
AUTHORIZATION_API: Final = "authorization.k8s.io/v1"
METRICS_PATH: Final = "/metrics"
METRICS_VERB: Final = "get"
#: The ClusterRole a scraper is bound to (manifests/rbac/metrics-reader.yaml).
READER_ROLE: Final = "koord-queue-metrics-reader"
ALLOWED_TTL_S: Final = 60.0
DENIED_TTL_S: Final = 10.0
MAX_ENTRIES: Final = 1024
REVIEWS_PER_SECOND: Final = 10.0
REVIEW_BURST: Final = 20


class Outcome(enum.IntEnum):
    """The HTTP status a scrape is answered with."""

    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403
    TOO_MANY = 429


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    #: why, in words for the response body and the debug log (names the user, never the token)
    reason: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The user a TokenReview names, as a SubjectAccessReview wants it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def token_digest(token: str) -> str:
    """The cache key of a token: a digest, so the cache never holds a credential."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_review(token: str) -> dict[str, Any]:
    """The TokenReview to create for ``token`` (no audiences: the API server's own apply)."""
    return {"apiVersion": AUTHENTICATION_API, "kind": "TokenReview", "spec": {"token": token}}


def reviewed_user(answer: Mapping[str, Any]) -> UserInfo | None:
    """The user a created TokenReview authenticated; None when the token was not accepted."""
    status = answer.get("status") or {}
    if status.get("authenticated") is not True:
        return None
    user = status.get("user") or {}
    username = user.get("username")
    if not isinstance(username, str) or not username:
        return None
    extra = {
        str(key): tuple(str(v) for v in values)
        for key, values in (user.get("extra") or {}).items()
        if isinstance(values, list)
    }
    return UserInfo(
        username=username,
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        extra=extra,
    )


def access_review(user: UserInfo, *, path: str = METRICS_PATH, verb: str = METRICS_VERB) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` may ``verb`` the non-resource URL ``path``."""
    spec: dict[str, Any] = {
        "user": user.username,
        "groups": list(user.groups),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra.items()}
    return {"apiVersion": AUTHORIZATION_API, "kind": "SubjectAccessReview", "spec": spec}


def access_verdict(user: UserInfo, answer: Mapping[str, Any]) -> Verdict:
    """What a created SubjectAccessReview says about ``user``."""
    status = answer.get("status") or {}
    if status.get("allowed") is True and status.get("denied") is not True:
        return Verdict(Outcome.ALLOWED, f"{user.username} may get {METRICS_PATH}")
    return Verdict(
        Outcome.FORBIDDEN,
        f'user "{user.username}" cannot get path "{METRICS_PATH}" '
        f"(bind it to the ClusterRole {READER_ROLE} with a ClusterRoleBinding)",
    )


UNAUTHENTICATED: Final = Verdict(
    Outcome.UNAUTHENTICATED, "a bearer token the API server accepts is required (Authorization: Bearer ...)"
)
TOO_MANY: Final = Verdict(Outcome.TOO_MANY, "too many unknown tokens to review now; retry later")


class ReviewBudget:
    """A token bucket of reviews: ``rate`` a second, at most ``burst`` at once (``now`` in seconds
    from the caller's monotonic clock). :meth:`take` never waits: it says whether one may go."""

    def __init__(self, *, rate: float = REVIEWS_PER_SECOND, burst: int = REVIEW_BURST) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, *, now: float) -> bool:
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class VerdictCache:
    """Verdicts by token digest, each until its time to live is over (``now`` in seconds, from any
    monotonic clock the caller owns); at most ``max_entries`` allowed ones and as many refusals,
    the oldest of the same kind evicted first."""

    def __init__(
        self,
        *,
        allowed_ttl_s: float = ALLOWED_TTL_S,
        denied_ttl_s: float = DENIED_TTL_S,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.allowed_ttl_s = allowed_ttl_s
        self.denied_ttl_s = denied_ttl_s
        self.max_entries = max_entries
        self._allowed: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._allowed) + len(self._refused)

    def get(self, key: str, *, now: float) -> Verdict | None:
        for entries in (self._allowed, self._refused):
            entry = entries.get(key)
            if entry is None:
                continue
            expires, verdict = entry
            if now >= expires:
                del entries[key]
                return None
            return verdict
        return None

    def put(self, key: str, verdict: Verdict, *, now: float) -> None:
        allowed = verdict.outcome is Outcome.ALLOWED
        ttl = self.allowed_ttl_s if allowed else self.denied_ttl_s
        self._allowed.pop(key, None)
        self._refused.pop(key, None)
        if ttl <= 0 or verdict.outcome is Outcome.TOO_MANY:
            return
        entries = self._allowed if allowed else self._refused
        entries[key] = (now + ttl, verdict)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

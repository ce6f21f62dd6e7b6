"""Where a client's credential comes from, asked before every request: a fixed token, a token
file that rotates, a client-go exec plugin, or kubernetes-asyncio's refresh hooks for the users
only it can serve (docs/development.md#api-client).

Kept apart from ``shared.kubeconfig`` (which reads kubeconfigs and the in-cluster mount and picks
one of these) because each source has its own refresh rule: a token file is read again after a
minute or a 401, an exec plugin's answer is kept until its ``expirationTimestamp``; the client in
``shared.kube`` only asks :meth:`Credentials.current` and reports a 401 with
:meth:`Credentials.rejected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration

#: How long a token read from a file is used before the file is read again (client-go's period).
TOKEN_FILE_PERIOD: Final = 60.0


class ConfigError(Exception):
    """The credentials cannot be loaded; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Credential:
    """What one request carries: an ``Authorization`` header value and/or a client certificate
    (PEM chain and key) that an exec plugin handed over."""

    authorization: str | None = None
    certificate: tuple[bytes, bytes] | None = None


class Credentials(Protocol):
    """A source of the :class:`Credential` to send, asked before every request."""

    async def current(self) -> Credential: ...

    def peek(self) -> Credential | None:
        """The credential last handed out, without asking anew (None: not known)."""
        ...

    async def rejected(self, used: Credential) -> bool:
        """The API server answered 401 to ``used``: fetch a fresh credential if this source can;
        True when the next :meth:`current` differs, so one retry is worth it."""
        ...


class Static:
    """The same credential every time (a token, a password, or nothing)."""

    def __init__(self, authorization: str | None = None) -> None:
        self._credential = Credential(authorization)

    async def current(self) -> Credential:
        return self._credential

    def peek(self) -> Credential | None:
        return self._credential

    async def rejected(self, used: Credential) -> bool:
        return False


class TokenFile:
    """A bearer token read from a file, read again once it is a minute old or was refused.

    As client-go: a read that fails after the first keeps the last token (a rotation writes the
    file anew; a read in between must not lose the credential), and the first read must succeed.
    """

    def __init__(
        self, path: str, *, period: float = TOKEN_FILE_PERIOD, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self._period = period
        self._clock = clock
        self._token = self._read()
        self._read_at = clock()

    def _read(self) -> str:
        try:
            token = Path(self.path).read_text().strip()
        except OSError as err:
            raise ConfigError(f"cannot read the token file {self.path}: {err.strerror}") from None
        if not token:
            raise ConfigError(f"the token file {self.path} is empty")
        return token

    def _reread(self) -> None:
        self._read_at = self._clock()
        with contextlib.suppress(ConfigError):  # a failed read keeps the last good token
            self._token = self._read()

    async def current(self) -> Credential:
        if self._clock() - self._read_at >= self._period:
            self._reread()
        return Credential(f"Bearer {self._token}")

    def peek(self) -> Credential | None:
        return Credential(f"Bearer {self._token}")

    async def rejected(self, used: Credential) -> bool:
        self._reread()
        return Credential(f"Bearer {self._token}") != used


@dataclass(frozen=True, slots=True)
class ExecPlugin:
    """A kubeconfig user's ``exec`` section, checked."""

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    install_hint: str = ""
    interactive_mode: str = "IfAvailable"
    #: ``spec.cluster`` of the ExecCredential sent, when ``provideClusterInfo`` is set
    cluster: Mapping[str, Any] | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Exec:
    """Credentials from an exec plugin: run once, kept until their ``expirationTimestamp`` (for
    ever without one), run again when expired or when the API server refuses them."""

    def __init__(
        self, plugin: ExecPlugin, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.plugin = plugin
        self._now = now
        self._lock = asyncio.Lock()
        self._credential: Credential | None = None
        self._expiry: datetime | None = None
        #: how many times the plugin ran (tests, and a caller wondering about the cache)
        self.runs = 0

    def _fresh(self) -> bool:
        return self._credential is not None and (self._expiry is None or self._now() < self._expiry)

    async def current(self) -> Credential:
        if self._fresh():
            assert self._credential is not None
            return self._credential
        async with self._lock:
            if not self._fresh():
                await self._run()
            assert self._credential is not None
            return self._credential

    def peek(self) -> Credential | None:
        return self._credential

    async def rejected(self, used: Credential) -> bool:
        async with self._lock:
            if self._credential == used:  # not yet replaced by a concurrent request
                await self._run()
            return self._credential != used

    async def _run(self) -> None:
        plugin = self.plugin
        interactive = plugin.interactive_mode != "Never" and sys.stdin.isatty()
        if plugin.interactive_mode == "Always" and not interactive:
            raise ConfigError(f"exec plugin {plugin.command} needs a terminal (interactiveMode: Always)")
        spec: dict[str, Any] = {"interactive": interactive}
        if plugin.cluster is not None:
            spec["cluster"] = dict(plugin.cluster)
        info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": orjson.dumps(info).decode()}
        try:
            proc = await asyncio.create_subprocess_exec(
                plugin.command,
                *plugin.args,
                env=env,
                stdin=None if interactive else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                # a prompt must reach the terminal; otherwise what it says explains a failure
                stderr=None if interactive else asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            hint = plugin.install_hint.strip() or (
                "it is a client-go credential plugin that is not installed, see "
                "https://kubernetes.io/docs/reference/access-authn-authz/authentication/"
                "#client-go-credential-plugins"
            )
            raise ConfigError(f"exec plugin {plugin.command} not found: {hint}") from None
        except OSError as err:
            raise ConfigError(f"exec plugin {plugin.command} cannot run: {err.strerror}") from None
        stdout, stderr = await proc.communicate()
        self.runs += 1
        if proc.returncode != 0:
            said = (stderr or b"").decode(errors="replace").strip()
            raise ConfigError(
                f"exec plugin {plugin.command} exited with {proc.returncode}" + (f": {said}" if said else "")
            )
        self._credential, self._expiry = parse_exec_credential(stdout, plugin)


def parse_exec_credential(output: bytes, plugin: ExecPlugin) -> tuple[Credential, datetime | None]:
    """An exec plugin's ExecCredential: the credential and when it expires (None: never)."""
    where = f"exec plugin {plugin.command}"
    try:
        doc = orjson.loads(output)
    except orjson.JSONDecodeError as err:
        raise ConfigError(f"{where} printed no ExecCredential: {err}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ConfigError(f"{where} printed no ExecCredential")
    if doc.get("apiVersion") != plugin.api_version:
        raise ConfigError(f"{where} answered in {doc.get('apiVersion')}, asked in {plugin.api_version}")
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ConfigError(f"{where}: the ExecCredential has no status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if bool(cert) != bool(key):
        raise ConfigError(f"{where}: clientCertificateData and clientKeyData go together")
    if not token and not cert:
        raise ConfigError(f"{where}: the ExecCredential holds neither a token nor a client certificate")
    expiry = None
    if stamp := status.get("expirationTimestamp"):
        try:
            expiry = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{where}: expirationTimestamp {stamp!r} is not a time") from None
        if expiry.tzinfo is None:
            expiry = expiry.replace(tzinfo=UTC)
    credential = Credential(
        authorization=f"Bearer {token}" if token else None,
        certificate=(str(cert).encode(), str(key).encode()) if cert else None,
    )
    return credential, expiry


class Legacy:
    """Credentials from kubernetes-asyncio's Configuration, asked before every request (its
    refresh hooks run there), as ``shared.kube`` did for every user before this loader."""

    def __init__(self, configuration: Configuration) -> None:
        self.configuration = configuration

    async def current(self) -> Credential:
        value = await self.configuration.get_api_key_with_prefix("BearerToken")
        return Credential(str(value) if value else None)

    def peek(self) -> Credential | None:
        return None

    async def rejected(self, used: Credential) -> bool:
        return False

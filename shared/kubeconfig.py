"""Where the API server is and how to prove who we are: a kubeconfig or the in-cluster ServiceAccount.

Why our own loader: kubernetes-asyncio's loader pulls in its generated client (about 38 MiB and
0.4 s at every start, docs/development.md#api-client), while every request already goes through
``shared.kube``'s own session. What is read here is what kubectl reads:

- the kubeconfig: a file or a ``:``-separated list of files (``$KUBECONFIG``); the first file to
  name a cluster, user or context wins, and the first ``current-context`` wins; ``context`` picks
  another context (``kubectl --context``); relative paths are relative to the file that names them;
- the cluster: ``server``, the CA (``certificate-authority`` or ``-data``),
  ``insecure-skip-tls-verify``, ``tls-server-name``;
- the user: client certificates (file or ``-data``), ``token``, ``tokenFile`` (re-read at most
  every minute, and its last good value wins over ``token``, as client-go does), ``username`` and
  ``password``, and ``exec`` credential plugins (``client.authentication.k8s.io`` v1 and v1beta1:
  a token or a client certificate, kept until its ``expirationTimestamp`` and fetched again when
  the API server refuses it);
- in a pod: ``KUBERNETES_SERVICE_HOST``/``PORT``, the mounted ``token`` (re-read: bound tokens
  rotate) and ``ca.crt``.

A user with an ``auth-provider`` (gcp, oidc, azure) or an exec plugin of an older API version is
left to kubernetes-asyncio's own loader, imported only then (:func:`_legacy`), so nobody loses
access. ``proxy-url`` is not used, as before.

Inline certificates and keys stay in memory: the CA goes to TLS as data, a client key through an
in-memory file that is closed once TLS has read it (``shared/memfiles.py``,
docs/development.md#runtime-constraints).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from koord_queue.shared import memfiles
from koord_queue.shared.credentials import (
    ConfigError,
    Credentials,
    Exec,
    ExecPlugin,
    Legacy,
    Static,
    TokenFile,
)

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration

# kubernetes-asyncio works out its default kubeconfig (~/.kube/config) when it is imported, even
# with KUBECONFIG set, and that raises where there is no home directory: no HOME and a uid without
# a passwd entry, as when the image runs as another user (docs/development.md#runtime-constraints);
# so does the plugin's own look for ~/.kube/config. The default is never used there (a kubeconfig
# is named, or the in-cluster ServiceAccount is), so a home that does not exist, as system users
# have, lets both through. Set when this module is imported, before any of them asks: the
# reconciler imports kubernetes-asyncio's leader election later, and only then.
if os.path.expanduser("~") == "~":
    os.environ["HOME"] = "/nonexistent"

#: Where a pod's ServiceAccount credentials are mounted.
SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The ExecCredential versions understood here; others go to kubernetes-asyncio's loader.
EXEC_VERSIONS: Final = frozenset({"client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"})


# --- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything a client needs to reach the API server as someone."""

    host: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    insecure: bool = False
    #: the name the server's certificate must hold, when not the host's (``tls-server-name``)
    server_name: str | None = None
    credentials: Credentials = field(default_factory=Static)
    #: kubernetes-asyncio's Configuration when its loader was used (:func:`_legacy`)
    legacy: Configuration | None = None

    def ssl_context(self, certificate: tuple[bytes, bytes] | None = None) -> ssl.SSLContext:
        """The TLS settings; ``certificate`` (an exec plugin's) replaces the kubeconfig's."""
        cadata = self.ca_data.decode() if self.ca_data else None
        cert_data, key_data = certificate or (self.cert_data, self.key_data)
        try:
            context = ssl.create_default_context(cafile=self.ca_file, cadata=cadata)
            with contextlib.ExitStack() as stack:
                cert = (
                    self.cert_file
                    if cert_data is None
                    else stack.enter_context(memfiles.loadable("client-certificate", cert_data))
                )
                key = (
                    self.key_file
                    if key_data is None
                    else stack.enter_context(memfiles.loadable("client-key", key_data))
                )
                if cert is not None:
                    context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as err:
            raise ConfigError(f"unusable TLS certificates: {err}") from None
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def configuration(self) -> Configuration:
        """The same settings as kubernetes-asyncio's Configuration, for its own client (leader
        election, ``shared/leases.py``); imports kubernetes-asyncio."""
        if self.legacy is not None:
            return self.legacy
        client = import_kubernetes_asyncio()
        configuration = client.Configuration()
        configuration.host = self.host
        configuration.ssl_ca_cert = self.ca_file or (
            memfiles.memory_file("certificate-authority", self.ca_data) if self.ca_data else None
        )
        if self.cert_data is not None:
            configuration.cert_file = memfiles.memory_file("client-certificate", self.cert_data)
            configuration.key_file = memfiles.memory_file("client-key", self.key_data or self.cert_data)
        else:
            configuration.cert_file, configuration.key_file = self.cert_file, self.key_file
        configuration.verify_ssl = not self.insecure
        configuration.tls_server_name = self.server_name
        credentials = self.credentials
        known = credentials.peek()
        if known is not None and known.certificate is not None:  # an exec plugin's, as it is now
            configuration.cert_file = memfiles.memory_file("client-certificate", known.certificate[0])
            configuration.key_file = memfiles.memory_file("client-key", known.certificate[1])
        if known is not None and known.authorization is None:
            return configuration  # type: ignore[no-any-return]  # no header to send

        async def refresh(conf: Configuration) -> None:
            authorization = (await credentials.current()).authorization
            if authorization:
                conf.api_key["BearerToken"] = authorization

        # Asked before every request of that client: a token file read again, an exec plugin's
        # credential fetched again once it expires.
        configuration.refresh_api_key_hook = refresh
        configuration.api_key["BearerToken"] = (known.authorization if known else None) or ""
        return configuration  # type: ignore[no-any-return]


def import_kubernetes_asyncio() -> Any:
    """``kubernetes_asyncio.client``, imported on demand (it needs a home directory: see the top
    of this module)."""
    from kubernetes_asyncio import client

    return client


# --- loading -------------------------------------------------------------------------------------


async def load(
    kubeconfig: str | None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Settings:
    """The settings of ``kubeconfig`` (a path or a ``:`` list; ``context``, else its current one),
    or of the in-cluster ServiceAccount when None. Raises :class:`ConfigError`."""
    if kubeconfig is None:
        return in_cluster(environ, service_account_dir)
    merged = merge(kubeconfig)
    selected = select(merged, context)
    if selected is None:
        return await _legacy(kubeconfig, context)
    settings = from_selected(*selected)
    if isinstance(settings.credentials, Exec):
        await settings.credentials.current()  # fail now, clearly, rather than at the first request
    return settings


def in_cluster(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Settings:
    """The pod's ServiceAccount: host and port from the environment, token and CA from ``directory``."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:
        host = f"[{host}]"
    ca = directory / "ca.crt"
    try:
        ca_data = ca.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read the ServiceAccount's CA {ca}: {err.strerror}") from None
    if not ca_data.strip():
        raise ConfigError(f"the ServiceAccount's CA {ca} is empty")
    return Settings(
        host=f"https://{host}:{port}", ca_file=str(ca), credentials=TokenFile(str(directory / "token"))
    )


@dataclass(frozen=True)
class Entry:
    """A named cluster, user or context of a kubeconfig, with the directory of its file."""

    value: Mapping[str, Any]
    base: Path


@dataclass(frozen=True)
class Merged:
    current_context: str
    clusters: Mapping[str, Entry]
    users: Mapping[str, Entry]
    contexts: Mapping[str, Entry]


def merge(paths: str) -> Merged:
    """The kubeconfig files of ``paths`` (``:``-separated; missing files skipped, as kubectl does
    with ``$KUBECONFIG``), merged: the first to name an entry or a current context wins."""
    found = False
    current = ""
    sections: dict[str, dict[str, Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    singular = {"clusters": "cluster", "users": "user", "contexts": "context"}
    for part in paths.split(os.pathsep):
        if not part:
            continue
        path = Path(part).expanduser()
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot read {path}: {err.strerror}") from None
        found = True
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not YAML: {err}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{path} is not a kubeconfig")
        current = current or str(doc.get("current-context") or "")
        base = path.absolute().parent
        for section, entries in sections.items():
            for item in doc.get(section) or []:
                if not isinstance(item, dict) or not item.get("name"):
                    raise ConfigError(f"{path}: every entry of {section} needs a name")
                value = item.get(singular[section]) or {}
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: {section} {item['name']} is not a mapping")
                entries.setdefault(str(item["name"]), Entry(value, base))
    if not found:
        raise ConfigError("no such kubeconfig file")
    return Merged(current, sections["clusters"], sections["users"], sections["contexts"])


def select(merged: Merged, context: str | None) -> tuple[Entry, Entry | None] | None:
    """The cluster and the user of ``context`` (else the current one); None when the user needs
    kubernetes-asyncio's loader (an auth-provider, an exec plugin of another API version)."""
    name = context or merged.current_context
    if not name:
        raise ConfigError("no context: the kubeconfig sets no current-context and none was given")
    chosen = merged.contexts.get(name)
    if chosen is None:
        raise ConfigError(f"context {name} is not in the kubeconfig")
    cluster_name = str(chosen.value.get("cluster") or "")
    cluster = merged.clusters.get(cluster_name)
    if cluster is None:
        raise ConfigError(
            f"context {name} names cluster {cluster_name or '(none)'}, which is not in the kubeconfig"
        )
    user = merged.users.get(str(chosen.value.get("user") or ""))
    if user is not None:
        if user.value.get("auth-provider"):
            return None
        plugin = user.value.get("exec")
        if isinstance(plugin, dict) and plugin.get("apiVersion") not in EXEC_VERSIONS:
            return None
    return cluster, user


def _path(entry: Entry, key: str) -> str | None:
    value = entry.value.get(key)
    return str(entry.base / str(value)) if value else None


def _data(entry: Entry, key: str) -> bytes | None:
    value = entry.value.get(f"{key}-data")
    if not value:
        return None
    try:
        return base64.standard_b64decode(str(value))
    except (binascii.Error, ValueError):
        raise ConfigError(f"{key}-data is not base64") from None


def from_selected(cluster: Entry, user: Entry | None) -> Settings:
    """The settings of one cluster and user of a kubeconfig."""
    server = str(cluster.value.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError("the cluster has no server")
    settings = Settings(host=server)
    if server.startswith("https"):
        settings = replace(
            settings,
            ca_data=_data(cluster, "certificate-authority"),
            ca_file=None
            if cluster.value.get("certificate-authority-data")
            else _path(cluster, "certificate-authority"),
        )
        if settings.ca_file is not None and not Path(settings.ca_file).is_file():
            raise ConfigError(f"no such file: {settings.ca_file}")
    settings = replace(
        settings,
        insecure=bool(cluster.value.get("insecure-skip-tls-verify")),
        server_name=str(cluster.value.get("tls-server-name") or "") or None,
    )
    if user is None:
        return settings
    values = user.value
    if server.startswith("https"):
        settings = replace(
            settings,
            cert_data=_data(user, "client-certificate"),
            key_data=_data(user, "client-key"),
            cert_file=None if settings.cert_data else _path(user, "client-certificate"),
            key_file=None if values.get("client-key-data") else _path(user, "client-key"),
        )
    plugin = values.get("exec")
    if isinstance(plugin, dict):
        return replace(settings, credentials=Exec(_exec_plugin(plugin, user, cluster, settings)))
    token_file = _path(user, "tokenFile")
    if token_file:
        return replace(settings, credentials=TokenFile(token_file))
    if values.get("token"):
        return replace(settings, credentials=Static(f"Bearer {values['token']}"))
    if values.get("username") and values.get("password"):
        basic = base64.b64encode(f"{values['username']}:{values['password']}".encode()).decode()
        return replace(settings, credentials=Static(f"Basic {basic}"))
    return settings


def _exec_plugin(plugin: Mapping[str, Any], user: Entry, cluster: Entry, settings: Settings) -> ExecPlugin:
    command = str(plugin.get("command") or "")
    if not command:
        raise ConfigError("the exec plugin has no command")
    if os.sep in command and not os.path.isabs(command):
        # As kubectl: a command with a path is relative to the kubeconfig that names it; a bare
        # name is looked up on PATH.
        command = str(user.base / command)
    env: list[tuple[str, str]] = []
    for item in plugin.get("env") or []:
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError(f"exec plugin {command}: every env entry needs a name and a value")
        env.append((str(item["name"]), str(item.get("value", ""))))
    args = plugin.get("args") or []
    if not isinstance(args, list):
        raise ConfigError(f"exec plugin {command}: args is not a list")
    info = None
    if plugin.get("provideClusterInfo"):
        info = {"server": settings.host, "insecure-skip-tls-verify": settings.insecure}
        if settings.server_name:
            info["tls-server-name"] = settings.server_name
        ca = settings.ca_data or (Path(settings.ca_file).read_bytes() if settings.ca_file else None)
        if ca:
            info["certificate-authority-data"] = base64.b64encode(ca).decode()
        if (extension := _exec_extension(cluster)) is not None:
            info["config"] = extension
    return ExecPlugin(
        api_version=str(plugin["apiVersion"]),
        command=command,
        args=tuple(str(a) for a in args),
        env=tuple(env),
        install_hint=str(plugin.get("installHint") or ""),
        interactive_mode=str(plugin.get("interactiveMode") or "IfAvailable"),
        cluster=info,
    )


def _exec_extension(cluster: Entry) -> Any:
    for item in cluster.value.get("extensions") or []:
        if isinstance(item, dict) and item.get("name") == "client.authentication.k8s.io/exec":
            return item.get("extension")
    return None


async def _legacy(kubeconfig: str, context: str | None) -> Settings:
    """kubernetes-asyncio's own loader, for what this module does not do (an auth-provider)."""
    client = import_kubernetes_asyncio()
    from kubernetes_asyncio import config as k8s_config
    from kubernetes_asyncio.config import kube_config

    configuration = client.Configuration()
    try:
        if sys.platform == "linux":
            # As load_kube_config, but inline certificates and keys stay in memory (shared/memfiles.py).
            merged = kube_config.KubeConfigMerger(kubeconfig)
            if merged.config is not None:
                memfiles.inline_in_memory(merged.config.value)
            # No persister: it would write the rewritten paths back into the user's kubeconfig.
            loader = kube_config.KubeConfigLoader(
                config_dict=merged.config, active_context=context, config_base_path=None
            )
            await loader.load_and_set(configuration)
        else:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (k8s_config.ConfigException, OSError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return Settings(
        host=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        insecure=not configuration.verify_ssl,
        server_name=configuration.tls_server_name,
        credentials=Legacy(configuration),
        legacy=configuration,
    )

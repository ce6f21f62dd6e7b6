"""Scrape the local system's ``/metrics`` as Prometheus in a cluster would (docs/operations.md#metrics).

Both processes serve their metrics secured, in the tests as in a cluster: the reconciler over
HTTPS to a bearer token allowed ``get /metrics`` (TokenReview + SubjectAccessReview), the webhook
over mutual TLS to a client certificate of ``--metrics-client-ca``. ``testenv.system`` makes the
credentials when it starts a process and registers them here by the metrics port; every scraper
of the tests, the chaos runs and the benchmarks reads through :func:`metrics_text`, so none of
them needs to know how a port is guarded. A port nobody registered is read as plain HTTP
(``--metrics-secure=false``, ``--metrics-insecure``).

The reconciler's scraper is a ServiceAccount in its own namespace (``monitoring``, where a
Prometheus would run) bound by a ClusterRoleBinding to the ClusterRole the install ships,
``koord-queue-metrics-reader``; its token comes from the TokenRequest API.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from koord_queue.certs import pki
from testenv.cluster import LocalCluster
from testenv.processes import wait_until

#: The scraper's namespace and ServiceAccount (what a Prometheus would run as).
SCRAPER_NAMESPACE: Final = "monitoring"
SCRAPER: Final = "koord-queue-metrics-scraper"
READER_ROLE: Final = "koord-queue-metrics-reader"
TOKEN_SECONDS: Final = 24 * 3600


@dataclass(frozen=True, slots=True)
class Credentials:
    """How to read one metrics port: a bearer token (reconciler) or a client certificate (webhook),
    and the CA to verify the server by (None: the reconciler's self-issued pair, not verified)."""

    token: str = ""
    client_cert: Path | None = None
    client_key: Path | None = None
    server_ca: bytes | None = None

    def context(self) -> ssl.SSLContext:
        if self.server_ca is not None:
            ctx = ssl.create_default_context(cadata=self.server_ca.decode())
        else:
            # The reconciler's own certificate, as Prometheus' insecure_skip_verify reads it.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert is not None and self.client_key is not None:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


_BY_PORT: dict[int, Credentials] = {}


def register(port: int, credentials: Credentials) -> None:
    _BY_PORT[port] = credentials


def credentials(port: int) -> Credentials | None:
    return _BY_PORT.get(port)


def metrics_text(port: int, *, timeout: float = 5.0) -> str:
    """``GET /metrics`` of the process listening on ``port`` (loopback), with its credentials."""
    found = _BY_PORT.get(port)
    if found is None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            return str(resp.read().decode())
    headers = {"Authorization": f"Bearer {found.token}"} if found.token else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, context=found.context(), timeout=timeout) as resp:
        return str(resp.read().decode())


# --- the webhook: a client CA and one client certificate -------------------------------------------


def webhook_client(certdir: Path, server_ca: bytes) -> tuple[Path, Credentials]:
    """A fresh client CA in ``certdir`` (the webhook's ``--metrics-client-ca``) and the scraper's
    certificate it signed; returns the CA file and the scraper's credentials."""
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="koord-queue-local-metrics-clients", now=now)
    client = pki.issue_client(ca=ca, common_name="prometheus", now=now)
    ca_file = certdir / "metrics-client-ca.crt"
    pki.write_pem(ca_file, ca.cert_pem, private=False)
    pki.write_pem(certdir / "metrics-client.crt", client.cert_pem, private=False)
    pki.write_pem(certdir / "metrics-client.key", client.key_pem, private=True)
    return ca_file, Credentials(
        client_cert=certdir / "metrics-client.crt",
        client_key=certdir / "metrics-client.key",
        server_ca=server_ca,
    )


# --- the reconciler: a ServiceAccount bound to the metrics reader -----------------------------------


def reader_role(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """The install's ClusterRole for scrapers, from the rendered manifests."""
    return next(
        d for d in rendered if d.get("kind") == "ClusterRole" and d["metadata"]["name"] == READER_ROLE
    )


def service_account_token(
    cluster: LocalCluster, namespace: str, name: str, *, seconds: int = TOKEN_SECONDS
) -> str:
    """A token of ServiceAccount ``namespace/name`` from the TokenRequest API (created if missing)."""
    with contextlib.suppress(urllib.error.HTTPError):  # 409: it exists already
        cluster.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    with contextlib.suppress(urllib.error.HTTPError):
        cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
    answer = cluster.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        },
    )
    return str(json.loads(answer)["status"]["token"])


def reconciler_scraper(cluster: LocalCluster, rendered: list[dict[str, Any]]) -> Credentials:
    """The scraper's token: its ServiceAccount bound cluster-wide to ``koord-queue-metrics-reader``
    (the ClusterRole as the manifests ship it)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": SCRAPER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": SCRAPER_NAMESPACE}],
    }
    token = service_account_token(cluster, SCRAPER_NAMESPACE, SCRAPER)
    cluster.apply_docs([reader_role(rendered), binding])
    user = f"system:serviceaccount:{SCRAPER_NAMESPACE}:{SCRAPER}"
    # The reconciler caches a refusal for a few seconds: start it only once RBAC allows the scraper.
    wait_until(lambda: may_read_metrics(cluster, user), timeout=30, what=f"{READER_ROLE} bound to {user}")
    return Credentials(token=token)


def may_read_metrics(cluster: LocalCluster, user: str, groups: tuple[str, ...] = ()) -> bool:
    """What the API server answers the reconciler's SubjectAccessReview about ``user``."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [*groups, "system:authenticated"],
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        },
    }
    answer = json.loads(cluster.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review))
    return bool(answer.get("status", {}).get("allowed"))

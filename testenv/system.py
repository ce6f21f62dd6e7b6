"""Run our own processes (webhook, reconciler) against a local control plane.

Shared by ``make run``, the integration/e2e fixtures and the benchmarks, so every caller exercises
the system the same way: the webhook serves TLS on loopback with a certificate from ``certs.pki`` and
is registered with the apiserver by URL; the reconciler talks to the apiserver with a kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import yaml

from koord_queue.certs import pki
from koord_queue.shared.api import names
from testenv import binaries, confined, kinds, scraping, webhooks
from testenv.cluster import LocalCluster
from testenv.processes import ClusterError, Component, free_port, http_ok, retry_port_clash, spawn, wait_until

ROOT = binaries.PROJECT_ROOT
CRD_DIRS = (ROOT / "manifests" / "crds", ROOT / "tests" / "crds")
WEBHOOK_CONFIG_NAME = webhooks.CONFIG_NAME
#: Where the local system is installed unless a caller names another namespace
#: (docs/operations.md#install-namespace): every function below that installs or starts a part
#: takes ``namespace``, and moves the manifests' objects there with :func:`in_namespace`.
NAMESPACE: Final = names.COMPONENT_NAMESPACE
#: The identity the reconciler uses; the webhook lets only this user resume a queued job.
RECONCILER_USER = names.reconciler_username(NAMESPACE)
#: The visibility API as in a cluster: TLS with the certificate the reconciler keeps in its Secret,
#: for the apiserver's front-proxy client only (tests/integration/test_visibility.py puts it behind
#: the APIService). A short interval, so an APIService created by a test gets its caBundle at once.
VISIBILITY_ARGS = ("--manage-visibility-certs", "--cert-sync-interval=2")


def crd_names(path: Path) -> list[str]:
    return [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]


def install_crds(cluster: LocalCluster) -> None:
    """Apply our CRDs and the foreign job kinds' test CRDs; wait until all are Established.

    A registry kind without a file in tests/crds gets a minimal CRD derived from its adapter
    (``kinds.generated_crds``), so only kinds whose tests need a schema keep a file there.
    """
    names: list[str] = []
    for directory in CRD_DIRS:
        for path in sorted(directory.glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            cluster.apply_file(path)
            names.extend(crd_names(path))
    if generated := kinds.generated_crds():
        subprocess.run(
            [
                str(binaries.kubectl()),
                f"--kubeconfig={cluster.kubeconfig}",
                "apply",
                "--server-side",
                "-f",
                "-",
            ],
            input=yaml.safe_dump_all(generated),
            check=True,
            capture_output=True,
            text=True,
        )
        names.extend(crd["metadata"]["name"] for crd in generated)
    cluster.wait_for_crds(names)
    create_namespace(cluster, NAMESPACE)


def in_namespace(node: Any, namespace: str) -> Any:
    """``node`` (rendered manifests) installed in ``namespace`` instead of ``koord-queue``: every
    ``namespace:`` field naming it (objects, binding subjects, Services, policy parameters), the
    reconciler's ServiceAccount username in CEL expressions and flags, and the namespace lists of
    ``kubernetes.io/metadata.name`` selectors (the install namespace is never a managed one). The
    chart (testenv/chart.py) moves the same places to ``.Release.Namespace``."""
    if isinstance(node, str):
        return node.replace(f"system:serviceaccount:{NAMESPACE}:", f"system:serviceaccount:{namespace}:")
    if isinstance(node, list):
        return [in_namespace(item, namespace) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: namespace if k == "namespace" and v == NAMESPACE else in_namespace(v, namespace)
        for k, v in node.items()
    }
    if node.get("key") == "kubernetes.io/metadata.name" and isinstance(node.get("values"), list):
        out["values"] = [namespace if item == NAMESPACE else item for item in node["values"]]
    return out


def create_namespace(cluster: LocalCluster, namespace: str) -> None:
    """Create ``namespace`` unless it exists."""
    with contextlib.suppress(urllib.error.HTTPError):  # 409: it exists already
        cluster.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )


@dataclass
class Processes:
    """Our running processes; :meth:`check` raises when one died, :meth:`stop` stops all."""

    components: list[Component] = field(default_factory=list)
    webhook_port: int = 0

    def check(self) -> None:
        for c in self.components:
            if not c.alive():
                raise ClusterError(f"{c.name} exited with {c.process.returncode}:\n{c.tail()}")

    def stop(self) -> None:
        for c in reversed(self.components):
            c.stop()
        self.components.clear()


def _spawn(name: str, argv: list[str], logdir: Path) -> Component:
    """Start one of our processes; confined as the container image runs it when
    ``KOORD_QUEUE_CONFINED=1`` (the e2e suite; docs/development.md#runtime-constraints)."""
    if confined.requested():
        return confined.spawn(name, argv, logdir / f"{name}.log")
    return spawn(name, argv, logdir / f"{name}.log", env={"PYTHONUNBUFFERED": "1"})


def start_webhook(
    cluster: LocalCluster,
    *,
    logdir: Path,
    register: bool = True,
    extra_args: list[str] | None = None,
    mandatory_namespaces: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
) -> tuple[Component, int]:
    """Start the webhook on a free loopback port with a fresh serving cert; register it. It is told
    its install ``namespace`` (as the manifests tell it through ``POD_NAMESPACE``), which names
    the reconciler's ServiceAccount, the only user it lets resume a queued job."""
    now = datetime.now(UTC)
    serving = pki.issue_serving(
        ca=cluster.ca,
        common_name="koord-queue-webhook",
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        now=now,
    )
    certdir = logdir / "webhook-certs"
    certdir.mkdir(parents=True, exist_ok=True)
    pki.write_pem(certdir / "tls.crt", serving.cert_pem, private=False)
    pki.write_pem(certdir / "tls.key", serving.key_pem, private=True)
    # /metrics for clients of a CA of its own only (docs/operations.md#metrics); testenv.scraping
    # reads it with the certificate that CA signed.
    client_ca, scraper = scraping.webhook_client(certdir, cluster.ca_pem)

    def launch() -> tuple[Component, int]:
        port, metrics_port, health = free_port(), free_port(), free_port()
        component = _spawn(
            "webhook",
            [
                sys.executable,
                "-m",
                "koord_queue.webhook.main",
                f"--port={port}",
                f"--cert-file={certdir / 'tls.crt'}",
                f"--key-file={certdir / 'tls.key'}",
                f"--metrics-port={metrics_port}",
                f"--metrics-client-ca={client_ca}",
                f"--health-port={health}",
                f"--namespace={namespace}",
                *(extra_args or []),
            ],
            logdir,
        )
        wait_until(
            lambda: _webhook_healthy(cluster, port), timeout=30, what="webhook /healthz", process=component
        )
        component.ports = {"https": port, "metrics": metrics_port, "health": health}
        scraping.register(metrics_port, scraper)
        return component, port

    component, port = retry_port_clash(launch)
    if register:
        register_webhook(cluster, port=port, mandatory_namespaces=mandatory_namespaces, namespace=namespace)
    return component, port


def _webhook_healthy(cluster: LocalCluster, port: int) -> bool:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2) as r:
        return bool(r.status == 200)


def register_webhook(
    cluster: LocalCluster,
    *,
    port: int,
    mandatory_namespaces: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
) -> None:
    """Create or replace the webhook configurations, pointing at 127.0.0.1:<port>."""
    configs = webhooks.configurations(
        url=f"https://127.0.0.1:{port}",
        ca_pem=cluster.ca_pem,
        mandatory_namespaces=mandatory_namespaces,
        namespace=namespace,
    )
    for config in configs:
        plural = config["kind"].lower() + "s"
        base = f"/apis/admissionregistration.k8s.io/v1/{plural}"
        with contextlib.suppress(urllib.error.HTTPError):
            cluster.request("DELETE", f"{base}/{WEBHOOK_CONFIG_NAME}")
        cluster.request("POST", base, config)
    wait_until(lambda: _webhook_active(cluster), timeout=30, what="the apiserver calling the webhook")


def _webhook_active(cluster: LocalCluster) -> bool:
    """The apiserver has loaded the new configurations: a labelled Job (dry run, so nothing is
    stored) comes back held. Until then a test could create a job that is never seen."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "webhook-probe", "labels": {names.QUOTA_NAME_LABEL: "webhook-probe"}},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
            }
        },
    }
    try:
        stored = json.loads(cluster.request("POST", "/apis/batch/v1/namespaces/default/jobs?dryRun=All", job))
    except urllib.error.HTTPError as err:
        err.close()
        return False
    return bool((stored.get("spec") or {}).get("suspend"))


def unregister_webhook(cluster: LocalCluster) -> None:
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        with contextlib.suppress(urllib.error.HTTPError):
            cluster.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{WEBHOOK_CONFIG_NAME}")


def start(cluster: LocalCluster, *, logdir: Path) -> Processes:
    """Start every process of the system that exists in this checkout."""
    processes = Processes()
    try:
        if (ROOT / "webhook" / "main.py").is_file():
            webhook, port = start_webhook(cluster, logdir=logdir)
            processes.components.append(webhook)
            processes.webhook_port = port
        if (ROOT / "reconciler" / "main.py").is_file():
            install_policies(cluster)
            processes.components.append(
                start_reconciler(cluster, logdir=logdir, extra_args=list(VISIBILITY_ARGS))
            )
    except BaseException:
        processes.stop()
        raise
    return processes


def rendered_manifests() -> list[dict[str, Any]]:
    """``kubectl kustomize manifests/``: the objects a cluster install applies."""
    rendered = subprocess.run(
        [str(binaries.kubectl()), "kustomize", str(ROOT / "manifests")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


VISIBILITY_APISERVICE = "v1alpha1.visibility.koord-queue.x-k8s.io"
VISIBILITY_SERVICE = "koord-queue-visibility-server"
_SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"
_APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


def register_visibility(cluster: LocalCluster, *, port: int) -> dict[str, Any]:
    """Register the manifests' APIService for a reconciler serving visibility on localhost:``port``.

    There is no pod network and Endpoints may not point at loopback, so the Service behind it is of
    type ``ExternalName`` with ``externalName: localhost``, and the APIService names the port; the
    aggregator resolves ExternalName Services to the external name and still verifies the serving
    certificate for ``<service>.<namespace>.svc`` against the caBundle the reconciler injects.
    Returns the APIService as registered (without the caBundle).
    """
    apiservice = next(d for d in rendered_manifests() if d["kind"] == "APIService")
    apiservice["spec"]["service"]["port"] = port
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": apiservice["spec"]["service"]["name"], "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }
    unregister_visibility(cluster)
    cluster.request("POST", _SERVICES, service)
    cluster.request("POST", _APISERVICES, apiservice)
    return apiservice


def unregister_visibility(cluster: LocalCluster) -> None:
    """Remove what :func:`register_visibility` created (an unavailable APIService makes every
    later kubectl's discovery complain)."""
    for path in (f"{_APISERVICES}/{VISIBILITY_APISERVICE}", f"{_SERVICES}/{VISIBILITY_SERVICE}"):
        with contextlib.suppress(urllib.error.HTTPError):
            cluster.request("DELETE", path)


def _apply_kinds(cluster: LocalCluster, kinds: set[str], namespace: str) -> None:
    """``kubectl apply --server-side`` the objects of these kinds from the rendered manifests,
    installed in ``namespace``."""
    cluster.apply_docs([in_namespace(d, namespace) for d in rendered_manifests() if d.get("kind") in kinds])


def install_rbac(cluster: LocalCluster, namespace: str = NAMESPACE) -> None:
    """Apply the ServiceAccounts and RBAC of ``manifests/`` exactly as a cluster install does."""
    _apply_kinds(
        cluster, {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}, namespace
    )


def install_policies(cluster: LocalCluster, namespace: str = NAMESPACE) -> None:
    """Apply the ValidatingAdmissionPolicies of ``manifests/`` and their bindings, as an install does
    (they run inside the apiserver; each takes effect a moment after it is applied)."""
    _apply_kinds(cluster, {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, namespace)


def start_reconciler(
    cluster: LocalCluster,
    *,
    logdir: Path,
    extra_args: list[str] | None = None,
    name: str = "reconciler",
    least_privilege: bool = True,
    namespace: str = NAMESPACE,
) -> Component:
    """Start the reconciler, installed in ``namespace`` (``--namespace``), and wait until its caches
    are synced (``/readyz``).

    By default it acts as its ServiceAccount (impersonated, with the RBAC of ``manifests/`` moved to
    ``namespace``), so every test proves the install's permissions are enough;
    ``least_privilege=False`` makes it a cluster admin that merely carries the ServiceAccount's name.
    """
    user = names.reconciler_username(namespace)
    if least_privilege:
        install_rbac(cluster, namespace)
        kubeconfig = cluster.kubeconfig
        identity = [f"--as={user}"]
    else:
        kubeconfig = cluster.kubeconfig_for(name, user=user, groups=("system:masters",))
        identity = []
    # /metrics over HTTPS for a token allowed get /metrics (docs/operations.md#metrics): the
    # scraper's, bound to the install's koord-queue-metrics-reader.
    scraper = scraping.reconciler_scraper(cluster, rendered_manifests())

    def launch() -> Component:
        health, metrics_port, visibility_port = free_port(), free_port(), free_port()
        component = _spawn(
            name,
            [
                sys.executable,
                "-m",
                "koord_queue.reconciler.main",
                f"--kubeconfig={kubeconfig}",
                *identity,
                f"--namespace={namespace}",
                f"--health-port={health}",
                f"--metrics-port={metrics_port}",
                f"--visibility-port={visibility_port}",
                "--bind-address=127.0.0.1",
                *(extra_args or []),
            ],
            logdir,
        )
        component.ports = {"health": health, "metrics": metrics_port, "visibility": visibility_port}
        scraping.register(metrics_port, scraper)
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{health}/readyz"),
            timeout=60,
            what=f"{name} /readyz",
            process=component,
        )
        return component

    return retry_port_clash(launch)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)

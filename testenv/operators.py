"""Run real job operators (KubeRay, the Kubeflow training operator, Argo's workflow controller)
against a local control plane.

The e2e tests of the job kinds otherwise play the operator themselves (they create the pods a
controller would); this module runs the operator binaries built from their Go modules
(``binaries.operator``), so what the queue does to a job meets what the operator does with it:
hold, release, the pods it creates from the gated templates, reclaim and the end of the job
(docs/development.md#real-operators-in-e2e).

An operator gets a cluster-admin kubeconfig (with its own user name where the system under test
trusts it by name), its endpoints on free ports, no leader election (one replica, and a lease would
only slow its start), and what it expects to find in a cluster it was installed into (``prepare``).
It runs in its own session and is stopped by PID, like every control-plane process.
"""

from __future__ import annotations

import contextlib
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from koord_queue.certs import pki
from testenv import binaries
from testenv.cluster import LocalCluster
from testenv.processes import Component, free_port, http_ok, retry_port_clash, spawn, wait_until

START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Launch:
    """How one operator is started: its command line for the given binary, kubeconfig and ports
    (health probe, metrics, webhook), its environment, and what it expects in the cluster first."""

    argv: Callable[[Path, Path, dict[str, int]], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[LocalCluster, dict[str, int]], None] | None = None
    #: Run as this user (a cluster admin by group) instead of ``admin``, when the system under
    #: test trusts the operator by name.
    user: str | None = None
    #: The port whose HTTP answer means "started" (the operator's health or metrics endpoint).
    ready_port: str = "probe"
    ready_path: str = "/readyz"


def _kuberay_argv(binary: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
        f"--metrics-addr=127.0.0.1:{ports['metrics']}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        # KubeRay asks the Ray head's dashboard how the Ray job is doing. No Ray runs on a kwok
        # node, and the head Service's cluster DNS name resolves nowhere here; through the
        # apiserver's service proxy the question stays on loopback and gets a plain answer (the
        # Service has no endpoints: "not found"), which KubeRay reads as "no such Ray job".
        "--use-kubernetes-proxy",
    ]


#: The kinds koord-queue-py manages through the training operator (its MPIJob is the older
#: kubeflow.org/v1 one, and MXJob is not managed); their CRDs are the ones hack/operators installs.
TRAINING_SCHEMES = ("tfjob", "pytorchjob", "paddlejob", "xgboostjob")
#: Where the training operator keeps its webhook certificates: it starts its controllers only once
#: it has written them into this Secret and this configuration's caBundle, and found them in its
#: certificate directory, where the kubelet would mount the Secret (nothing calls its webhooks here,
#: so the configuration lists none).
TRAINING_NAMESPACE = "kubeflow"
TRAINING_SECRET = "training-operator-webhook-cert"
TRAINING_WEBHOOKS = "validator.training-operator.kubeflow.org"
#: Fixed in the binary (controller-runtime's default): shared by every such process on the machine.
TRAINING_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def _training_argv(binary: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
        f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
        f"--webhook-server-port={ports['webhook']}",
        "--leader-elect=false",
        *(f"--enable-scheme={scheme}" for scheme in TRAINING_SCHEMES),
    ]


def _training_prepare(cluster: LocalCluster, ports: dict[str, int]) -> None:
    for path, body in (
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING_NAMESPACE}},
        ),
        (
            f"/api/v1/namespaces/{TRAINING_NAMESPACE}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": TRAINING_SECRET}},
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": TRAINING_WEBHOOKS},
                "webhooks": [],
            },
        ),
    ):
        with contextlib.suppress(urllib.error.HTTPError):  # 409: there already
            cluster.request("POST", path, body)
    # Play the kubelet's Secret volume: a serving pair in the directory the operator waits on. Its
    # webhook server only needs a valid pair to start.
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="training-operator-local-ca", now=now)
    serving = pki.issue_serving(
        ca=ca,
        common_name="training-operator",
        dns_names=[f"training-operator.{TRAINING_NAMESPACE}.svc"],
        ip_addresses=["127.0.0.1"],
        now=now,
    )
    TRAINING_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name, data, private in (
        ("ca.crt", ca.cert_pem, False),
        ("tls.crt", serving.cert_pem, False),
        ("tls.key", serving.key_pem, True),
    ):
        pki.write_pem(TRAINING_CERT_DIR / name, data, private=private)  # atomic, like a projection


#: Argo's workflow controller runs in its own namespace as the ServiceAccount the webhook trusts by
#: default to write a Workflow's status (Argo's CRD has no status subresource; see
#: docs/compatibility.md#argo-workflow), and reads its configuration from this ConfigMap.
ARGO_NAMESPACE = "argo"
ARGO_USER = "system:serviceaccount:argo:argo"
ARGO_CONFIGMAP = "workflow-controller-configmap"


def _argo_argv(binary: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--namespace={ARGO_NAMESPACE}",
        f"--configmap={ARGO_CONFIGMAP}",
        "--loglevel=info",
        "--workflow-workers=2",
    ]


def _argo_prepare(cluster: LocalCluster, ports: dict[str, int]) -> None:
    # Metrics on a free port, without TLS: the readiness probe. (The controller's own /healthz is
    # fixed at :6060 in the binary, so it is not used.)
    config = yaml.safe_dump({"port": ports["metrics"], "secure": False, "enabled": True})
    with contextlib.suppress(urllib.error.HTTPError):  # 409: there already
        cluster.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ARGO_NAMESPACE}},
        )
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ARGO_CONFIGMAP},
        "data": {"metricsConfig": config, "telemetryConfig": config},
    }
    collection = f"/api/v1/namespaces/{ARGO_NAMESPACE}/configmaps"
    try:
        cluster.request("POST", collection, configmap)
    except urllib.error.HTTPError as error:  # there already (a retried start): this start's port
        if error.code != 409:
            raise
        cluster.request("PUT", f"{collection}/{ARGO_CONFIGMAP}", configmap)


LAUNCHES: dict[str, Launch] = {
    "kuberay": Launch(argv=_kuberay_argv),
    "training-operator": Launch(argv=_training_argv, prepare=_training_prepare),
    "argo-workflow-controller": Launch(
        argv=_argo_argv,
        env={"LEADER_ELECTION_DISABLE": "true"},
        prepare=_argo_prepare,
        user=ARGO_USER,
        ready_port="metrics",
        ready_path="/metrics",
    ),
}


def install_crds(cluster: LocalCluster, operator: binaries.Operator) -> list[str]:
    """Apply the operator's own CRDs (replacing test CRDs of the same names) and wait until they
    are Established; returns their names."""
    names: list[str] = []
    for path in operator.crds:
        cluster.apply_file(path)
        names.extend(
            doc["metadata"]["name"]
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "CustomResourceDefinition"
        )
    cluster.wait_for_crds(names)
    return names


def start(cluster: LocalCluster, operator: binaries.Operator, *, logdir: Path) -> Component:
    """Start the operator and wait until its health endpoint answers.

    Its caches sync after that; callers wait for what the operator does, never for time."""
    launch = LAUNCHES[operator.name]
    kubeconfig = cluster.kubeconfig
    if launch.user is not None:
        kubeconfig = cluster.kubeconfig_for(operator.name, user=launch.user, groups=("system:masters",))
    log = logdir / f"{operator.name}.log"

    def attempt() -> Component:
        ports = {"probe": free_port(), "metrics": free_port(), "webhook": free_port()}
        if launch.prepare is not None:
            launch.prepare(cluster, ports)
        argv = launch.argv(operator.binary, kubeconfig, ports)
        component = spawn(operator.name, argv, log, env=launch.env, ports=ports)
        try:
            wait_until(
                lambda: _ready(f"http://127.0.0.1:{ports[launch.ready_port]}{launch.ready_path}"),
                timeout=START_TIMEOUT_S,
                what=f"{operator.name} {launch.ready_path}",
                process=component,
            )
        except BaseException:
            component.stop()
            raise
        return component

    return retry_port_clash(attempt)


def _ready(url: str) -> bool:
    with contextlib.suppress(urllib.error.HTTPError):
        return http_ok(url)
    return False

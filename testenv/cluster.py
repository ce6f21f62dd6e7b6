"""A real Kubernetes control plane on loopback, for the tests, ``make run`` and the benchmarks.

Two profiles (docs/development.md#test-tiers):

* ``integration``: etcd + kube-apiserver. Enough for CRD schemas, printer columns, the webhook called
  by the real apiserver, and the reconciler's list/watch/patch semantics.
* ``e2e``: + kube-controller-manager (Job controller, garbage collector, ClusterRole aggregation,
  ...), kube-scheduler and kwok with fake nodes, so pods are created, scheduled, run and finish.

Every process runs in its own session and is stopped by PID (SIGTERM, then SIGKILL after a bounded
wait); readiness is polled with a deadline, never slept for. The PKI comes from ``certs.pki`` — the
same code that issues the webhook's certificates in a real cluster.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from koord_queue.certs import pki
from testenv import binaries, kwok
from testenv.processes import (
    Component,
    PortTaken,
    free_port,
    http_ok,
    https_ok,
    retry_port_clash,
    spawn,
    wait_until,
)

Profile = Literal["integration", "e2e"]

SERVICE_CIDR = "10.0.0.0/24"
FIRST_SERVICE_IP = "10.0.0.1"
START_TIMEOUT_S = 120.0


#: The audit policy of ``LocalCluster(audit_writes=True)``: one record per completed write (who,
#: with which user agent, what), nothing for reads.
AUDIT_WRITES_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted", "Panic"],
    "rules": [
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


@dataclass
class LocalCluster:
    """Start with :meth:`start`, stop with :meth:`stop` (or use it as a context manager)."""

    profile: Profile = "integration"
    workdir: Path | None = None
    nodes: int = 2
    node_cpu: str = "8"
    node_memory: str = "32Gi"
    pod_duration_s: float = 30.0
    #: extra ``--feature-gates`` entries (``GangScheduling=true``) for the apiserver, the
    #: controller-manager and the scheduler (docs/compatibility.md#native-gang-hand-off)
    feature_gates: tuple[str, ...] = ()
    #: extra ``--runtime-config`` entries for the apiserver (``scheduling.k8s.io/v1alpha1=true``)
    runtime_config: tuple[str, ...] = ()
    #: keep the apiserver's audit log of every write (:meth:`audited_writes`): what a test counts
    #: when it asserts how many writes a client made, rather than the client's own tally
    audit_writes: bool = False
    components: list[Component] = field(default_factory=list)
    apiserver_port: int = 0
    kubeconfig: Path = field(default_factory=Path)
    ca_pem: bytes = b""
    admin: pki.KeyPair | None = None
    _own_workdir: bool = False

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def start(self) -> None:
        started = time.monotonic()
        names = binaries.E2E_BINARIES if self.profile == "e2e" else binaries.INTEGRATION_BINARIES
        bins = binaries.resolve(names)
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="koord-queue-cp-"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._write_pki()
            steps = [self._start_etcd, self._start_apiserver]
            if self.profile == "e2e":
                steps += [self._start_controller_manager, self._start_scheduler, self._start_kwok]
            for step in steps:
                retry_port_clash(functools.partial(step, bins))
            if self.profile == "e2e":
                self._create_nodes()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log}) ---\n{c.tail()}" for c in self.components)

    def restart_component(self, name: str, *, kill: bool = False) -> Component:
        """Stop one control-plane process and start it again with the same command line.

        Same ports, data directory and certificates, so every client's kubeconfig stays valid and
        only its connections break (fault injection: ``chaos/``). ``kill=True`` sends SIGKILL (a
        crash) instead of the graceful SIGTERM. Waits until the new process is ready (etcd
        ``/health``, kube-apiserver ``/readyz``, the others' ``/healthz``) and returns its handle,
        which replaces the old one in :attr:`components` at the same position.
        """
        index = next((i for i, c in enumerate(self.components) if c.name == name), None)
        if index is None:
            raise ValueError(f"no component {name!r}; have {[c.name for c in self.components]}")
        old = self.components[index]
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.process.pid, signal.SIGKILL)
            old.process.wait(timeout=30)
        else:
            old.stop()
        argv = [str(arg) for arg in old.process.args]  # type: ignore[union-attr]
        env = {"HOME": str(self._path("kwok-home"))} if name == "kwok" else None
        del self.components[index]
        new = self._spawn(name, argv, env)
        self.components.remove(new)
        self.components.insert(index, new)
        new.ports = dict(old.ports)
        if name == "etcd":
            self._await(new, lambda: http_ok(f"{self.etcd_url}/health"), "etcd /health")
        elif name == "kube-apiserver":
            self._await(new, lambda: self.request("GET", "/readyz") == "ok", "kube-apiserver /readyz")
        else:
            port = next((a.split("=", 1)[1] for a in argv if a.startswith("--secure-port=")), None)
            if port is not None:
                url = f"https://127.0.0.1:{port}/healthz"
                self._await(new, lambda: https_ok(url), f"{name} /healthz")
        return new

    # --- PKI and kubeconfig ------------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        assert self.workdir is not None
        return self.workdir.joinpath(*parts)

    def _write_pki(self) -> None:
        now = datetime.now(UTC)
        ca = pki.new_ca(common_name="koord-queue-local-ca", now=now)
        serving = pki.issue_serving(
            ca=ca,
            common_name="kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", FIRST_SERVICE_IP],
            now=now,
        )
        admin = pki.issue_client(ca=ca, common_name="admin", organizations=["system:masters"], now=now)
        proxy_ca = pki.new_ca(common_name="koord-queue-front-proxy-ca", now=now)
        proxy_client = pki.issue_client(ca=proxy_ca, common_name="front-proxy-client", now=now)
        sa_key, sa_pub = pki.new_signing_key()
        pki_dir = self._path("pki")
        pki_dir.mkdir(exist_ok=True)
        for name, data, private in (
            ("ca.crt", ca.cert_pem, False),
            ("ca.key", ca.key_pem, True),
            ("apiserver.crt", serving.cert_pem, False),
            ("apiserver.key", serving.key_pem, True),
            ("admin.crt", admin.cert_pem, False),
            ("admin.key", admin.key_pem, True),
            ("front-proxy-ca.crt", proxy_ca.cert_pem, False),
            ("front-proxy-client.crt", proxy_client.cert_pem, False),
            ("front-proxy-client.key", proxy_client.key_pem, True),
            ("sa.key", sa_key, True),
            ("sa.pub", sa_pub, False),
        ):
            pki.write_pem(pki_dir / name, data, private=private)
        self.ca_pem = ca.cert_pem
        self.admin = admin
        self.ca = ca

    def kubeconfig_for(self, name: str, *, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` (client certificate) in ``groups``."""
        now = datetime.now(UTC)
        client = pki.issue_client(ca=self.ca, common_name=user, organizations=list(groups), now=now)
        path = self._path(f"kubeconfig-{name}")
        config = kubeconfig_dict(server=self.server, ca_pem=self.ca_pem, client=client, user=name)
        pki.write_pem(path, yaml.safe_dump(config).encode(), private=True)
        return path

    def _write_kubeconfig(self) -> None:
        assert self.admin is not None
        self.kubeconfig = self._path("kubeconfig")
        config = kubeconfig_dict(server=self.server, ca_pem=self.ca_pem, client=self.admin)
        pki.write_pem(self.kubeconfig, yaml.safe_dump(config).encode(), private=True)

    # --- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        component = spawn(name, argv, self._path("logs", f"{name}.log"), env=env)
        self.components.append(component)
        return component

    def _await(self, component: Component, check: Callable[[], bool], what: str) -> None:
        """:func:`wait_until` for a control-plane component; one that lost its port leaves
        :attr:`components`, since the retried start spawns a new one."""
        try:
            wait_until(check, timeout=START_TIMEOUT_S, what=what, process=component)
        except PortTaken:
            if component in self.components:
                self.components.remove(component)
            raise

    def _gate_flags(self) -> list[str]:
        return [f"--feature-gates={','.join(self.feature_gates)}"] if self.feature_gates else []

    def _start_etcd(self, bins: binaries.Binaries) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._spawn(
            "etcd",
            [
                str(bins["etcd"]),
                "--data-dir",
                str(self._path("etcd")),
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                "--quota-backend-bytes=8589934592",
            ],
        )
        self._await(etcd, lambda: http_ok(f"{self.etcd_url}/health"), "etcd /health")

    def _start_apiserver(self, bins: binaries.Binaries) -> None:
        self.apiserver_port = free_port()
        p = self._path("pki")
        argv = [
            str(bins["kube-apiserver"]),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self._path('apiserver-certs')}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            # No --enable-aggregator-routing: the endpoint resolver it selects refuses ExternalName
            # Services, and an ExternalName Service pointing at localhost is how the tests reach
            # an aggregated server here (no pod network; Endpoints may not be loopback).
            # KQ_APISERVER_PROFILING=1 serves /debug/pprof (to see where a benchmark's apiserver
            # CPU goes: `kubectl get --raw "/debug/pprof/profile?seconds=20"`).
            f"--profiling={'true' if os.environ.get('KQ_APISERVER_PROFILING') == '1' else 'false'}",
            "--v=1",
        ]
        if self.profile == "integration":
            argv.append("--disable-admission-plugins=ServiceAccount")
        if self.runtime_config:
            argv.append(f"--runtime-config={','.join(self.runtime_config)}")
        if self.audit_writes:
            policy = self._path("audit-policy.yaml")
            policy.write_text(yaml.safe_dump(AUDIT_WRITES_POLICY))
            argv += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self._path('logs', 'audit.log')}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",  # written before the response: a reader never trails
                "--audit-log-maxsize=0",  # one file, never rotated away under a reader
            ]
        argv += self._gate_flags()
        apiserver = self._spawn("kube-apiserver", argv)
        self._write_kubeconfig()
        self._await(apiserver, lambda: self.request("GET", "/readyz") == "ok", "kube-apiserver /readyz")

    def _start_controller_manager(self, bins: binaries.Binaries) -> None:
        port = free_port()
        p = self._path("pki")
        cm = self._spawn(
            "kube-controller-manager",
            [
                str(bins["kube-controller-manager"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._path('cm-certs')}",
                # clusterrole-aggregation-controller: as in a real cluster, the built-in view, edit
                # and admin ClusterRoles take in manifests/rbac/user-roles.yaml;
                # validatingadmissionpolicy-status-controller type-checks our admission policies.
                "--controllers=job-controller,garbage-collector-controller,namespace-controller,"
                "serviceaccount-controller,serviceaccount-token-controller,pod-garbage-collector-controller,"
                "ttl-after-finished-controller,node-lifecycle-controller,"
                "root-ca-certificate-publisher-controller,replicaset-controller,deployment-controller,"
                "clusterrole-aggregation-controller,validatingadmissionpolicy-status-controller",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--node-monitor-grace-period=40s",
                "--kube-api-qps=200",
                "--kube-api-burst=300",
                "--concurrent-job-syncs=20",
                "--profiling=false",
                "--v=1",
                *self._gate_flags(),
            ],
        )
        self._await(
            cm, lambda: https_ok(f"https://127.0.0.1:{port}/healthz"), "kube-controller-manager /healthz"
        )

    def _start_scheduler(self, bins: binaries.Binaries) -> None:
        port = free_port()
        sched = self._spawn(
            "kube-scheduler",
            [
                str(bins["kube-scheduler"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._path('sched-certs')}",
                "--kube-api-qps=200",
                "--kube-api-burst=300",
                "--profiling=false",
                "--v=1",
                *self._gate_flags(),
            ],
        )
        self._await(sched, lambda: https_ok(f"https://127.0.0.1:{port}/healthz"), "kube-scheduler /healthz")

    def _start_kwok(self, bins: binaries.Binaries) -> None:
        config = self._path("kwok.yaml")
        config.write_text(yaml.safe_dump_all(kwok.stages(pod_duration_s=self.pod_duration_s)))
        home = self._path("kwok-home")
        home.mkdir(exist_ok=True)
        self.kwok_port = free_port()
        kwok_process = self._spawn(
            "kwok",
            [
                str(bins["kwok"]),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={kwok.FAKE_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.244.0.1",
                f"--server-address=127.0.0.1:{self.kwok_port}",
            ],
            env={"HOME": str(home)},
        )
        # Its server answers /healthz once it has bound the port (a taken port is retried).
        url = f"http://127.0.0.1:{self.kwok_port}/healthz"
        self._await(kwok_process, lambda: http_ok(url), "kwok /healthz")

    def _create_nodes(self) -> None:
        for i in range(self.nodes):
            self.add_node(f"kwok-node-{i}", cpu=self.node_cpu, memory=self.node_memory)

    def add_node(self, name: str, *, cpu: str, memory: str, wait: bool = True) -> None:
        """Create a fake node with the given capacity and (by default) wait until it is Ready."""
        body = kwok.node(name, cpu=cpu, memory=memory)
        self.request("POST", "/api/v1/nodes", body)
        # The create drops status; set capacity through the status subresource.
        self.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": body["status"]},
            content_type="application/merge-patch+json",
        )
        if wait:
            kwok_component = next(c for c in self.components if c.name == "kwok")
            self._await(kwok_component, lambda: self.node_ready(name), f"node {name} Ready")

    def node_ready(self, name: str) -> bool:
        node = json.loads(self.request("GET", f"/api/v1/nodes/{name}"))
        conditions = node.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def audited_writes(self, user_agent: str) -> list[dict[str, Any]]:
        """The apiserver's own record of every completed write whose client sent ``user_agent``,
        oldest first. Needs ``audit_writes``; the log is written before each response, so it holds
        every write already answered."""
        log = self._path("logs", "audit.log")
        if not self.audit_writes:
            raise RuntimeError("this cluster keeps no audit log: start it with audit_writes=True")
        found: list[dict[str, Any]] = []
        for line in log.read_text().splitlines() if log.exists() else []:
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete" and event.get("userAgent") == user_agent:
                found.append(event)
        return found

    # --- a tiny synchronous client for set-up ------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        assert self.admin is not None
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
        p = self._path("pki")
        ctx.load_cert_chain(p / "admin.crt", p / "admin.key")
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> str:
        """One request as cluster admin; returns the body, raises urllib.error.HTTPError on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
            return str(resp.read().decode())

    def apply_file(self, path: Path) -> None:
        """``kubectl apply --server-side`` a file or directory with the real kubectl."""
        self._kubectl_apply(["-f", str(path)], stdin=None)

    def apply_docs(self, docs: list[dict[str, Any]], *, manager: str | None = None) -> None:
        """``kubectl apply --server-side`` of ``docs``, as field manager ``manager`` when given."""
        fields = [f"--field-manager={manager}"] if manager else []
        self._kubectl_apply([*fields, "-f", "-"], stdin=yaml.safe_dump_all(docs))

    def _kubectl_apply(self, args: list[str], *, stdin: str | None) -> None:
        subprocess.run(
            [
                str(binaries.kubectl()),
                f"--kubeconfig={self.kubeconfig}",
                "apply",
                "--server-side",
                "--force-conflicts",
                *args,
            ],
            input=stdin,
            check=True,
            capture_output=True,
            text=True,
        )

    def wait_for_crds(self, names: list[str], *, timeout: float = 60.0) -> None:
        """Wait until every CRD is Established, so its resources can be used at once."""

        def established(name: str) -> bool:
            crd = json.loads(
                self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            )
            conditions = crd.get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until(
            lambda: all(established(n) for n in names), timeout=timeout, what=f"CRDs {names} Established"
        )


def kubeconfig_dict(
    *, server: str, ca_pem: bytes, client: pki.KeyPair, user: str = "admin"
) -> dict[str, Any]:
    """A kubeconfig with embedded credentials (so it can be copied anywhere)."""
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(client.cert_pem),
                    "client-key-data": b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }


@contextlib.contextmanager
def running(profile: Profile, **kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(profile=profile, **kwargs)
    with cluster:
        yield cluster

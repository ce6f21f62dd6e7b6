"""Every metric the reconciler and the webhook declare is exported and moves during real work, and
only those allowed may read them (docs/operations.md#metrics).

The first test scrapes both ``/metrics`` endpoints (as the local system's scraper, testenv.scraping),
runs a small story that exercises every path (an admission, a job that waits for quota, a
queue-level preemption whose victim's pod cannot be bound — its nodeSelector matches no node — and
is reclaimed), scrapes again and compares.

The others attack the guards: the reconciler's (a TokenReview, then a SubjectAccessReview for get
/metrics, against the real API server) with no token, a forged one, a ServiceAccount without the
role, and a namespace user's own token, even with a RoleBinding to the reader role in their
namespace; the webhook's (mutual TLS) with no client certificate and with one of another CA. The
NetworkPolicies cannot be enforced here (the local cluster has no network plugin), so they are
proved valid by a server-side dry run on the real API server, as the kustomize component and the
chart render them (docs/operations.md#network-policies).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from koord_queue.certs import pki
from koord_queue.shared.api import names
from testenv import binaries, chart, components, scraping, system
from testenv.cluster import LocalCluster
from tests import kube, tenancy

pytestmark = pytest.mark.e2e

RECONCILER_METRICS = (
    "job_schedule_attempts",
    "queueunits_in_active_queue",
    "queueunits_in_backoff_queue",
    "dequeued_quota_usage_by_quota",
    "job_scheduling_algorithm_latency",
    "queueunits_by_job_type",
    "koord_queue_admission_wait_seconds",
    "koord_queue_preemption_rounds",
    "koord_queue_preemption_victims",
    "koord_queue_reclaimed_pods",
    "koord_queue_unqueued_pods_deleted",
    "koord_queue_api_requests",
    "koord_queue_scheduling_cycle_duration_seconds",
    "koord_queue_leader",
    "koord_queue_build_info",
    "koord_queue_certificate_expiry_timestamp_seconds",
    "process_resident_memory_bytes",
)
WEBHOOK_METRICS = (
    "koord_queue_webhook_request_duration_seconds",
    "koord_queue_webhook_requests",
    "koord_queue_build_info",
    "koord_queue_certificate_expiry_timestamp_seconds",
    "process_resident_memory_bytes",
)
#: Metrics that must have increased (counters, histogram counts) over the story.
MOVING = (
    "job_schedule_attempts",
    "job_scheduling_algorithm_latency",
    "koord_queue_scheduling_cycle_duration_seconds",
    "koord_queue_admission_wait_seconds",
    "koord_queue_preemption_rounds",
    "koord_queue_preemption_victims",
    "koord_queue_reclaimed_pods",
    "koord_queue_api_requests",
    "koord_queue_webhook_request_duration_seconds",
    "koord_queue_webhook_requests",
)


def scrape(port: int) -> dict[str, float]:
    """Family name -> sum of its samples (``_count`` only for histograms)."""
    text = scraping.metrics_text(port)
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        samples = family.samples
        if family.type == "histogram":
            samples = [s for s in samples if s.name.endswith("_count")]
        elif family.type == "counter":
            samples = [s for s in samples if s.name.endswith("_total")]
        totals[family.name] = sum(s.value for s in samples) if samples else 0.0
        totals.setdefault(f"{family.name}#series", float(len(samples)))
    return totals


def job(ns: str, name: str, quota: str, priority_class: str, *, unschedulable: bool = False) -> str:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class,
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "2"}}}],
    }
    if unschedulable:
        spec["nodeSelector"] = {"no-such-node": "true"}
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {names.QUOTA_NAME_LABEL: quota}},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "10m"}},
                    "spec": spec,
                },
            },
        }
    )


async def test_every_metric_is_exported_and_moves(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    ns, quota = namespace_in, f"metrics-{namespace_in}"
    ports = {c.name: c.ports["metrics"] for c in system_e2e.components}
    before = {name: scrape(port) for name, port in ports.items()}

    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text="""
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: metrics-low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: metrics-high}
value: 1000
""",
    )
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": names.QUOTA_API_VERSION,
                "kind": "ElasticQuota",
                "metadata": {
                    "name": quota,
                    "namespace": ns,
                    "annotations": {
                        names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
                        names.ENABLE_PREEMPTION_ANNOTATION: "true",
                    },
                },
                "spec": {"max": {"cpu": "2"}, "min": {"cpu": "2"}},
            }
        ),
    )

    async def queue_ready() -> bool:
        out = kube.kubectl(
            e2e_cluster, "get", "queue", quota, "-n", names.COMPONENT_NAMESPACE, "-o", "json", check=False
        )
        return out.returncode == 0 and names.ENABLE_PREEMPTION_ANNOTATION in json.loads(out.stdout)[
            "metadata"
        ].get("annotations", {})

    await kube.eventually(queue_ready, what="queue with preemption enabled")
    kube.kubectl(
        e2e_cluster, "apply", "-f", "-", input_text=job(ns, "low", quota, "metrics-low", unschedulable=True)
    )

    async def phase(name: str) -> str:
        out = kube.kubectl(e2e_cluster, "get", "queueunit", name, "-n", ns, "-o", "json", check=False)
        return str(json.loads(out.stdout).get("status", {}).get("phase", "")) if out.returncode == 0 else ""

    await kube.eventually(lambda: _eq(phase("low"), "Dequeued"), what="low admitted")
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=job(ns, "high", quota, "metrics-high"))
    await kube.eventually(
        lambda: _in(phase("high"), ("Dequeued", "Running", "Succeed")),
        timeout=60,
        what="high admitted after preempting low",
    )

    async def moved() -> dict[str, dict[str, float]] | None:
        after = {name: scrape(port) for name, port in ports.items()}
        combined_before = {**before["reconciler"], **before["webhook"]}
        combined_after = {**after["reconciler"], **after["webhook"]}
        moving = all(combined_after.get(m, 0.0) > combined_before.get(m, 0.0) for m in MOVING)
        if moving and after["reconciler"].get("dequeued_quota_usage_by_quota", 0.0) > 0:
            return after
        return None

    after = await kube.eventually(moved, timeout=30, what="every moving metric increased")
    for name in RECONCILER_METRICS:
        assert after["reconciler"].get(f"{name}#series", 0) >= 1, f"{name} has no series"
    for name in WEBHOOK_METRICS:
        assert after["webhook"].get(f"{name}#series", 0) >= 1, f"{name} has no series"


async def _eq(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _in(value: Any, expected: tuple[str, ...]) -> bool:
    return bool(await value in expected)


# --- who may read (docs/operations.md#metrics) --------------------------------------------------


def _port(processes: system.Processes, name: str) -> int:
    return next(c.ports["metrics"] for c in processes.components if c.name == name)


def _status(port: int, *, token: str | None = None, context: ssl.SSLContext | None = None) -> int:
    """The status of ``GET /metrics`` over HTTPS with ``token`` (none: no Authorization header)."""
    if context is None:
        context = scraping.Credentials().context()  # the self-issued certificate, unverified
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:
            body = resp.read().decode()
            assert "koord_queue_build_info" in body
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)


def _grant(cluster: LocalCluster, docs: list[dict[str, Any]]) -> None:
    kube.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )


async def test_the_reconciler_serves_metrics_only_to_a_token_allowed_to_read_them(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    port = _port(system_e2e, "reconciler")
    scraper = scraping.credentials(port)
    assert scraper is not None and scraper.token
    assert _status(port, token=scraper.token) == 200
    # No token, a malformed header, a forged token: 401.
    assert _status(port) == 401
    assert _status(port, token="") == 401
    assert _status(port, token="eyJhbGciOiJSUzI1NiJ9.e30.forged") == 401
    # Plain HTTP on the metrics port answers nothing, nor does the plain health port serve metrics.
    assert not _plain_http_answers(port)
    for component in system_e2e.components:
        assert not _plain_http_answers(component.ports["health"]), component.name

    # A real ServiceAccount without the reader role: authenticated, not allowed.
    nobody = scraping.service_account_token(e2e_cluster, namespace_in, "no-metrics", seconds=600)
    assert _status(port, token=nobody) == 403

    # A namespace user (edit in their namespace) with their own token, who also binds the reader
    # role in their namespace: a RoleBinding grants no non-resource URL, so still 403.
    tenancy.grant(e2e_cluster, namespace_in, "metrics-tenant")
    _grant(
        e2e_cluster,
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tenant-sa-edit", "namespace": namespace_in},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace_in}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tenant-sa-metrics", "namespace": namespace_in},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": scraping.READER_ROLE,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace_in}],
            },
        ],
    )
    tenant = scraping.service_account_token(e2e_cluster, namespace_in, "tenant", seconds=600)
    assert _status(port, token=tenant) == 403
    # ...and the namespace user cannot bind themselves cluster-wide (RBAC refuses the escalation).
    refused = tenancy.as_user(
        e2e_cluster,
        "metrics-tenant",
        "create",
        "clusterrolebinding",
        f"steal-{namespace_in}",
        f"--clusterrole={scraping.READER_ROLE}",
        f"--serviceaccount={namespace_in}:tenant",
    )
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr

    # Bound cluster-wide by an admin, the same token reads (after the 10 s the refusal is cached).
    _grant(
        e2e_cluster,
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"metrics-{namespace_in}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": scraping.READER_ROLE,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace_in}],
            }
        ],
    )
    try:
        await kube.eventually(
            lambda: _async(_status(port, token=tenant) == 200), timeout=40, what="the bound token allowed"
        )
    finally:
        kube.kubectl(e2e_cluster, "delete", "clusterrolebinding", f"metrics-{namespace_in}", check=False)

    # The certificate presented is the replica's own, for the Service's names.
    pem = ssl.get_server_certificate(("127.0.0.1", port)).encode()
    assert "koord-queue-reconciler.koord-queue.svc" in pki.dns_names_of(pem)


def _plain_http_answers(port: int) -> bool:
    """Whether ``/metrics`` answers a plain-HTTP request on the TLS port (it must not)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return "koord_queue" in resp.read().decode()
    except (OSError, http.client.HTTPException):
        return False


async def _async(value: bool) -> bool:
    return value


def test_the_webhook_serves_metrics_only_to_a_client_of_its_ca(
    e2e_cluster: LocalCluster, system_e2e: system.Processes
) -> None:
    port = _port(system_e2e, "webhook")
    scraper = scraping.credentials(port)
    assert scraper is not None and scraper.client_cert is not None
    assert _status(port, context=scraper.context()) == 200

    def refused(context: ssl.SSLContext) -> bool:
        try:
            _status(port, context=context)
        except (urllib.error.URLError, ssl.SSLError, ConnectionError):
            return True
        return False

    # No client certificate.
    assert refused(ssl.create_default_context(cadata=e2e_cluster.ca_pem.decode()))
    # A client certificate of another CA, the cluster's own included (an admin's kubeconfig).
    now = datetime.now(UTC)
    stranger = pki.new_ca(common_name="stranger", now=now)
    for ca in (stranger, e2e_cluster.ca):
        pair = pki.issue_client(ca=ca, common_name="prometheus", now=now)
        directory = system_e2e.components[0].log.parent / f"stranger-{ca.cert_pem[-40:-30].hex()}"
        directory.mkdir(exist_ok=True)
        pki.write_pem(directory / "tls.crt", pair.cert_pem, private=False)
        pki.write_pem(directory / "tls.key", pair.key_pem, private=True)
        context = ssl.create_default_context(cadata=e2e_cluster.ca_pem.decode())
        context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
        assert refused(context), "a client certificate of another CA was served"


def _dry_run(cluster: LocalCluster, docs: list[dict[str, Any]]) -> str:
    result = subprocess.run(
        [
            str(binaries.kubectl()),
            f"--kubeconfig={cluster.kubeconfig}",
            "apply",
            "--dry-run=server",
            "-f",
            "-",
        ],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_network_policies_are_accepted_by_the_api_server(e2e_cluster: LocalCluster) -> None:
    """The local cluster has no network plugin, so nothing enforces a NetworkPolicy here; what can
    be proved is that the API server accepts the policies as rendered (schema, named ports,
    selectors), in the install namespace and in another (docs/operations.md#network-policies)."""
    policies = components.network_policies()
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "koord-queue-reconciler",
        "koord-queue-web-dashboard",
        "koord-queue-webhook",
    ]
    out = _dry_run(e2e_cluster, policies)
    assert out.count("(server dry run)") == 3, out
    helm = subprocess.run(
        [
            str(binaries.helm()),
            "template",
            "koord-queue",
            str(chart.CHART),
            "--namespace=default",
            "--set=networkPolicy.enabled=true",
            '--set-json=networkPolicy.apiServer=[{"ipBlock":{"cidr":"10.96.0.0/12"}}]',
            "--show-only=templates/networkpolicy-koord-queue-webhook.yaml",
            "--show-only=templates/networkpolicy-koord-queue-reconciler.yaml",
            "--show-only=templates/networkpolicy-koord-queue-web-dashboard.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rendered = [d for d in yaml.safe_load_all(helm.stdout) if d]
    assert {d["metadata"]["namespace"] for d in rendered} == {"default"}
    assert _dry_run(e2e_cluster, rendered).count("(server dry run)") == 3
    # A policy naming a port the pods do not have is still valid to the API server (named ports
    # resolve per pod), so the names are checked against the Deployments here.
    deployments = {
        d["metadata"]["name"]: {p["name"] for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]}
        for d in components.rendered([components.WEB_DASHBOARD])
        if d["kind"] == "Deployment"
    }
    for policy in policies:
        ports = {str(p["port"]) for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert ports <= deployments[policy["metadata"]["name"]], (policy["metadata"]["name"], ports)


def test_a_flood_of_fresh_tokens_cannot_spend_the_reconcilers_api_budget(
    system_e2e: system.Processes,
) -> None:
    """Each unknown token costs reviews made with the reconciler's own client; a stranger sending
    ever new ones gets 429 past a budget of its own (10 a second, bursts of 20), so the API budget
    the reconciler admits jobs with stays its own, and a scraper's cached verdict still answers."""
    port = _port(system_e2e, "reconciler")
    scraper = scraping.credentials(port)
    assert scraper is not None
    assert _status(port, token=scraper.token) == 200
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda i: _status(port, token=f"forged-{i}-{started}"), range(120)))
    elapsed = time.monotonic() - started
    assert set(statuses) <= {401, 429}, statuses
    reviewed = statuses.count(401)
    assert reviewed <= 20 + 10 * elapsed + 1, (reviewed, elapsed)
    assert statuses.count(429) >= 120 - (20 + 10 * elapsed + 1)
    assert _status(port, token=scraper.token) == 200

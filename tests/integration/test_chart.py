"""The Helm chart (``charts/koord-queue``) is the install of ``manifests/``, and nothing else.

One source of truth: the chart is generated from ``kubectl kustomize manifests/`` (``make chart``,
``testenv/chart.py``). These tests prove it with the helm built from ``hack/helmbin`` (pinned like
the control plane):

* the committed chart is what the generator makes of the manifests now (else: run ``make chart``);
* ``helm template`` with the default values renders exactly kustomize's objects, object by object
  (normalised only where the chart renders a value: the configuration file is compared parsed);
* each value changes what it should and nothing else, and the configuration it renders is one the
  reconciler accepts (``shared.core.config.parse``);
* the chart installs with ``helm install --dry-run=server`` against the real kube-apiserver, and
  every object it renders, with the values changed too, is accepted by a server-side dry-run apply;
* installed in another namespace, nothing names ``koord-queue`` as a namespace any more;
* ``helm upgrade`` applies a changed CRD, and ``helm uninstall`` keeps the CRDs;
* a wrong value type is refused, naming the value (``values.schema.json``).

cert-manager's CRDs are not on the local control plane: its mode is proven on the rendered objects.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.core import config as component_config
from testenv import binaries, chart, components, system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
Key = tuple[str, str, str, str]
CONFIG = ("v1", "ConfigMap", "koord-queue", "koord-queue-config")
RECONCILER = ("apps/v1", "Deployment", "koord-queue", "koord-queue-reconciler")
WEBHOOK = ("apps/v1", "Deployment", "koord-queue", "koord-queue-webhook")
MUTATING = ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "koord-queue")
VALIDATING = ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "", "koord-queue")


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def normalised(objs: Sequence[Obj]) -> dict[Key, Obj]:
    """Objects by key; the configuration file (text in a ConfigMap) parsed, so comments and key
    order do not count."""
    out: dict[Key, Obj] = {}
    for obj in objs:
        if key(obj) == CONFIG:
            obj = {**obj, "data": {k: yaml.safe_load(v) for k, v in obj["data"].items()}}
        out[key(obj)] = obj
    return out


def helm(*args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(binaries.helm()), *args]
    if kubeconfig:
        command.append(f"--kubeconfig={kubeconfig}")
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def template(*sets: str, namespace: str = "koord-queue") -> dict[Key, Obj]:
    """``helm template`` into ``namespace`` (``helm install -n``); a set beginning with ``--`` is
    passed as it is (``--set-json=...``), any other is a ``--set``."""
    args = ["template", "koord-queue", str(chart.CHART), f"--namespace={namespace}"]
    for value in sets:
        args += [value] if value.startswith("--") else ["--set", value]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return normalised([d for d in yaml.safe_load_all(result.stdout) if d])


def pod(objs: dict[Key, Obj], deployment: Key) -> Obj:
    found: Obj = objs[deployment]["spec"]["template"]["spec"]
    return found


def checksum(objs: dict[Key, Obj], deployment: Key) -> str:
    found: str = objs[deployment]["spec"]["template"]["metadata"]["annotations"][chart.CHECKSUM]
    return found


def without_chart_annotations(objs: dict[Key, Obj]) -> dict[Key, Obj]:
    """What the chart adds that kustomize cannot: the configuration's checksum on the pod templates
    and the keep policy on the CRDs. Removed here, asserted where they are tested."""
    out: dict[Key, Obj] = {}
    for k, obj in objs.items():
        obj = json.loads(json.dumps(obj))
        if k in (RECONCILER, WEBHOOK):
            del obj["spec"]["template"]["metadata"]["annotations"][chart.CHECKSUM]
        if obj["kind"] == "CustomResourceDefinition":
            annotations = obj["metadata"]["annotations"]
            del annotations["helm.sh/resource-policy"]
            if not annotations:
                del obj["metadata"]["annotations"]
        out[k] = obj
    return out


def container(objs: dict[Key, Obj], deployment: Key) -> Obj:
    found: Obj = objs[deployment]["spec"]["template"]["spec"]["containers"][0]
    return found


def config_of(objs: dict[Key, Obj]) -> Obj:
    found: Obj = objs[CONFIG]["data"]["config.yaml"]
    return found


def test_the_committed_chart_is_generated_from_the_manifests() -> None:
    stale = chart.differences()
    assert not stale, f"charts/koord-queue is out of date, run `make chart`: {stale}"


def test_helm_template_with_default_values_renders_exactly_the_kustomize_objects() -> None:
    full = template()
    crds = [o for o in full.values() if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 4 and all(
        o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for o in crds
    )
    for deployment in (RECONCILER, WEBHOOK):
        assert len(checksum(full, deployment)) == 64
    assert pod(full, WEBHOOK)["priorityClassName"] == "system-cluster-critical"
    assert "priorityClassName" not in pod(full, RECONCILER)
    rendered = without_chart_annotations(full)
    expected = normalised(system.rendered_manifests())
    assert sorted(rendered) == sorted(expected)
    for name, obj in expected.items():
        assert rendered[name] == obj, f"{name} differs between helm template and kubectl kustomize"


def check_image(o: dict[Key, Obj]) -> None:
    for deployment in (RECONCILER, WEBHOOK):
        c = container(o, deployment)
        assert (c["image"], c["imagePullPolicy"]) == ("registry.example.com/kq:9.9.9", "Always")


def check_replicas(o: dict[Key, Obj]) -> None:
    assert (o[RECONCILER]["spec"]["replicas"], o[WEBHOOK]["spec"]["replicas"]) == (3, 4)


def check_resources(o: dict[Key, Obj]) -> None:
    assert container(o, RECONCILER)["resources"]["limits"]["memory"] == "4Gi"
    assert container(o, WEBHOOK)["resources"]["requests"]["cpu"] == "300m"


def check_config(o: dict[Key, Obj]) -> None:
    settings = component_config.parse(yaml.safe_dump(config_of(o)))
    assert settings.reclaim_protect_seconds == 300.0
    assert settings.quota_namespace_binding is False
    assert settings.running_timeouts.default.running_timeout == 600.0
    assert settings.warnings == ()


def check_priority_cap(o: dict[Key, Obj]) -> None:
    assert component_config.parse(yaml.safe_dump(config_of(o))).max_user_priority == 1000
    assert "--max-user-priority=1000" in container(o, WEBHOOK)["args"]


def check_kinds_and_args(o: dict[Key, Obj]) -> None:
    for deployment in (RECONCILER, WEBHOOK):
        assert "--enabled-extensions=job,tfjob" in container(o, deployment)["args"]
    assert container(o, RECONCILER)["args"][-1] == "--qps=100"


def check_mandatory_queueing(o: dict[Key, Obj]) -> None:
    """docs/operations.md#mandatory-queueing: the configuration and the webhooks for unlabelled jobs
    come from the same values."""
    queueing = component_config.parse(yaml.safe_dump(config_of(o))).mandatory_queueing
    assert queueing.enabled and queueing.applies("t", {"team": "ml"}) and not queueing.applies("t", {})
    for config, path in ((MUTATING, "/mutate-unlabelled"), (VALIDATING, "/validate-unlabelled")):
        (hook,) = [w for w in o[config]["webhooks"] if w["name"].startswith("unlabelled-jobs.")]
        assert hook["clientConfig"]["service"]["path"] == path
        selector = hook["namespaceSelector"]
        assert selector["matchLabels"] == {"team": "ml"}
        assert {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "koord-queue"],
        } in (selector["matchExpressions"])
        assert {e["operator"] for e in hook["objectSelector"]["matchExpressions"]} == {"DoesNotExist"}


NODE_AFFINITY: Obj = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}
            ]
        }
    }
}
SPREAD: list[Obj] = [
    {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "koord-queue-reconciler"}},
    }
]


def check_node_selector(o: dict[Key, Obj]) -> None:
    assert pod(o, RECONCILER)["nodeSelector"] == {"disk": "ssd"}
    assert pod(o, WEBHOOK)["nodeSelector"] == {"pool": "system"}


def check_tolerations(o: dict[Key, Obj]) -> None:
    assert pod(o, WEBHOOK)["tolerations"] == [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ]


def check_affinity(o: dict[Key, Obj]) -> None:
    assert pod(o, RECONCILER)["affinity"] == NODE_AFFINITY


def check_spread(o: dict[Key, Obj]) -> None:
    assert "topologySpreadConstraints" not in pod(o, WEBHOOK)
    assert pod(o, RECONCILER)["topologySpreadConstraints"] == SPREAD


def check_priority_class(o: dict[Key, Obj]) -> None:
    assert pod(o, RECONCILER)["priorityClassName"] == "system-cluster-critical"
    assert "priorityClassName" not in pod(o, WEBHOOK)


def check_pull_secrets(o: dict[Key, Obj]) -> None:
    for deployment in (RECONCILER, WEBHOOK):
        assert pod(o, deployment)["imagePullSecrets"] == [{"name": "regcred"}]


def check_security_contexts(o: dict[Key, Obj]) -> None:
    """A value merges into the hardened default: the rest of it stays."""
    webhook = pod(o, WEBHOOK)["securityContext"]
    assert webhook["runAsUser"] == 1001 and webhook["runAsNonRoot"] is True
    reconciler = container(o, RECONCILER)["securityContext"]
    assert reconciler["readOnlyRootFilesystem"] is False and reconciler["capabilities"] == {"drop": ["ALL"]}


def check_checksum_only(o: dict[Key, Obj]) -> None:
    """A configuration change rolls both Deployments: their pod templates differ from the default
    in the configuration's checksum alone, which is the rendered configuration's sha256."""
    default = template()
    text = helm(
        "template",
        "koord-queue",
        str(chart.CHART),
        "--set=config.usageHalfLife=2h",
        "--show-only=templates/configmap-koord-queue-config.yaml",
    )
    assert text.returncode == 0, text.stderr
    rendered_config = yaml.safe_load(text.stdout)["data"]["config.yaml"]
    for deployment in (RECONCILER, WEBHOOK):
        assert checksum(o, deployment) != checksum(default, deployment)
        assert checksum(o, deployment) == hashlib.sha256(rendered_config.rstrip("\n").encode()).hexdigest()
        assert without_chart_annotations(o)[deployment] == without_chart_annotations(default)[deployment]


VALUES: list[tuple[list[str], set[Key], Callable[[dict[Key, Obj]], None]]] = [
    (
        ["image.repository=registry.example.com/kq", "image.tag=9.9.9", "image.pullPolicy=Always"],
        {RECONCILER, WEBHOOK},
        check_image,
    ),
    (["reconciler.replicas=3", "webhook.replicas=4"], {RECONCILER, WEBHOOK}, check_replicas),
    (
        ["reconciler.resources.limits.memory=4Gi", "webhook.resources.requests.cpu=300m"],
        {RECONCILER, WEBHOOK},
        check_resources,
    ),
    (
        [
            "config.defaultReclaimProtectTime=5m",
            "config.jobRunningTimeout.default.runningTimeout=10m",
            "config.quotaNamespaceBinding=false",
        ],
        {CONFIG, RECONCILER, WEBHOOK},
        check_config,
    ),
    (["config.maxUserPriority=1000"], {CONFIG, RECONCILER, WEBHOOK}, check_priority_cap),
    (
        ["config.enabledExtensions={job,tfjob}", "reconciler.extraArgs={--qps=100}"],
        {RECONCILER, WEBHOOK},
        check_kinds_and_args,
    ),
    (
        ["config.manageJobsWithoutQuotaName=true", "config.managedJobsNamespaceSelector.matchLabels.team=ml"],
        {CONFIG, MUTATING, VALIDATING, RECONCILER, WEBHOOK},
        check_mandatory_queueing,
    ),
    (
        ["reconciler.nodeSelector.disk=ssd", "webhook.nodeSelector.pool=system"],
        {RECONCILER, WEBHOOK},
        check_node_selector,
    ),
    (
        ['--set-json=webhook.tolerations=[{"key":"dedicated","operator":"Exists","effect":"NoSchedule"}]'],
        {WEBHOOK},
        check_tolerations,
    ),
    (["--set-json=reconciler.affinity=" + json.dumps(NODE_AFFINITY)], {RECONCILER}, check_affinity),
    (
        [
            "--set-json=webhook.topologySpreadConstraints=[]",
            "--set-json=reconciler.topologySpreadConstraints=" + json.dumps(SPREAD),
        ],
        {RECONCILER, WEBHOOK},
        check_spread,
    ),
    (
        ["reconciler.priorityClassName=system-cluster-critical", "webhook.priorityClassName="],
        {RECONCILER, WEBHOOK},
        check_priority_class,
    ),
    (
        [
            '--set-json=reconciler.imagePullSecrets=[{"name":"regcred"}]',
            '--set-json=webhook.imagePullSecrets=[{"name":"regcred"}]',
        ],
        {RECONCILER, WEBHOOK},
        check_pull_secrets,
    ),
    (
        [
            "webhook.podSecurityContext.runAsUser=1001",
            "reconciler.securityContext.readOnlyRootFilesystem=false",
        ],
        {RECONCILER, WEBHOOK},
        check_security_contexts,
    ),
    (["config.usageHalfLife=2h"], {CONFIG, RECONCILER, WEBHOOK}, check_checksum_only),
]


@pytest.mark.parametrize(("sets", "changes", "check"), VALUES, ids=[c.__name__ for _, _, c in VALUES])
def test_each_value_changes_what_it_should_and_nothing_else(
    sets: list[str], changes: set[Key], check: Callable[[dict[Key, Obj]], None]
) -> None:
    default, rendered = template(), template(*sets)
    assert set(rendered) == set(default)
    differing = {k for k in default if rendered[k] != default[k]}
    assert differing == changes, (sets, differing)
    check(rendered)


def test_namespace_servicemonitor_and_dashboard_switches_add_or_remove_only_their_object() -> None:
    default = template()
    without = template("namespace.create=false")
    assert set(default) - set(without) == {("v1", "Namespace", "", "koord-queue")}
    assert all(without[k] == default[k] for k in without)
    added = template("metrics.serviceMonitor.enabled=true", "dashboard.enabled=true")
    new = {k: added[k] for k in set(added) - set(default)}
    monitors = {
        component: ("monitoring.coreos.com/v1", "ServiceMonitor", "koord-queue", f"koord-queue-{component}")
        for component in ("reconciler", "webhook")
    }
    assert set(new) == {monitors["reconciler"], ("v1", "ConfigMap", "koord-queue", "koord-queue-dashboard")}
    assert all(added[k] == default[k] for k in default)
    board = new[("v1", "ConfigMap", "koord-queue", "koord-queue-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"]["koord-queue.json"] == chart.DASHBOARD.read_text().rstrip("\n")
    # docs/operations.md#metrics: the reconciler is scraped over HTTPS with Prometheus' token; the
    # webhook, over mutual TLS, only once a client certificate Secret is named.
    endpoint = new[monitors["reconciler"]]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["bearerTokenFile"].endswith("/serviceaccount/token")
    with_webhook = template(
        "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.webhookClientSecret=prom"
    )
    webhook_monitor = with_webhook[monitors["webhook"]]
    tls = webhook_monitor["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["cert"]["secret"] == {"name": "prom", "key": "tls.crt"}
    assert tls["keySecret"] == {"name": "prom", "key": "tls.key"}
    assert tls["serverName"] == "koord-queue-webhook.koord-queue.svc"
    services = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in default.values()
        if o["kind"] == "Service" and any(p["name"] == "metrics" for p in o["spec"]["ports"])
    }
    selected = {
        with_webhook[m]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for m in monitors.values()
    }
    assert selected == services == {"reconciler", "webhook"}


def test_network_policies_render_exactly_the_kustomize_component() -> None:
    """docs/operations.md#network-policies: ``networkPolicy.enabled`` adds the objects an overlay
    with manifests/components/network-policies adds, and nothing else changes; the peers follow
    their values."""
    default = template()
    enabled = template("networkPolicy.enabled=true")
    expected = normalised(components.rendered([components.NETWORK_POLICIES]))
    assert sorted(without_chart_annotations(enabled)) == sorted(expected)
    for name, obj in expected.items():
        assert without_chart_annotations(enabled)[name] == obj, f"{name} differs from the kustomize component"
    added = set(enabled) - set(default)
    assert {k[1] for k in added} == {"NetworkPolicy"} and len(added) == 3
    assert all(enabled[k] == default[k] for k in default)

    peers = {"namespaceSelector": {"matchLabels": {"team": "observability"}}}
    viewers = {"namespaceSelector": {"matchLabels": {"team": "ingress"}}}
    narrowed = template(
        "networkPolicy.enabled=true",
        '--set-json=networkPolicy.apiServer=[{"ipBlock":{"cidr":"10.0.0.0/24"}}]',
        "--set-json=networkPolicy.metrics=" + json.dumps([peers]),
        "--set-json=networkPolicy.webDashboard=" + json.dumps([viewers]),
    )
    for k in added:
        rules = {r["ports"][0]["port"]: r.get("from") for r in narrowed[k]["spec"]["ingress"]}
        assert rules["health"] is None
        if "http" in rules:  # the web dashboard: its page from its peers, out only to the API server
            assert rules["http"] == [viewers]
            assert [r["to"] for r in narrowed[k]["spec"]["egress"]] == [
                [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
            ]
            continue
        assert rules["metrics"] == [peers]
        own = "webhook" if "webhook" in rules else "visibility"
        assert rules[own] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]


WEB_DASHBOARD = ("apps/v1", "Deployment", "koord-queue", "koord-queue-web-dashboard")


def test_the_web_dashboard_renders_exactly_the_kustomize_component() -> None:
    """docs/dashboard.md#installed-in-the-cluster: ``webDashboard.enabled`` adds the objects an
    overlay with manifests/components/web-dashboard adds, and nothing else changes; with the
    network policies too, the objects of an overlay with both components."""
    default = template()
    enabled = template("webDashboard.enabled=true")
    expected = normalised(components.rendered([components.WEB_DASHBOARD]))
    assert sorted(without_chart_annotations(enabled)) == sorted(expected)
    for name, obj in expected.items():
        assert without_chart_annotations(enabled)[name] == obj, f"{name} differs from the kustomize component"
    added = set(enabled) - set(default)
    assert {k[1] for k in added} == {"ServiceAccount", "Deployment", "Service"}
    assert all(enabled[k] == default[k] for k in default)
    both = template("webDashboard.enabled=true", "networkPolicy.enabled=true")
    expected = normalised(components.rendered([components.WEB_DASHBOARD, components.NETWORK_POLICIES]))
    assert without_chart_annotations(both) == expected


def test_the_web_dashboard_has_no_identity_of_its_own() -> None:
    """No token is mounted, no binding names its ServiceAccount, and it runs as the other
    components do (non-root, read-only root, no capabilities)."""
    objs = template("webDashboard.enabled=true")
    account = objs[("v1", "ServiceAccount", "koord-queue", "koord-queue-web-dashboard")]
    assert account["automountServiceAccountToken"] is False
    spec = pod(objs, WEB_DASHBOARD)
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "koord-queue-web-dashboard"
    for obj in objs.values():
        for subject in obj.get("subjects") or []:
            assert subject.get("name") != "koord-queue-web-dashboard", obj["metadata"]["name"]
    c = container(objs, WEB_DASHBOARD)
    assert c["command"] == ["koord-queue-dashboard"]
    assert c["securityContext"] == container(objs, RECONCILER)["securityContext"]
    assert spec["securityContext"] == pod(objs, RECONCILER)["securityContext"]
    assert {v["name"]: v.get("configMap", {}).get("name") for v in spec["volumes"]}["kube-root-ca"] == (
        "kube-root-ca.crt"
    )


def test_the_web_dashboards_values_change_what_they_should() -> None:
    default = template("webDashboard.enabled=true")
    rendered = template(
        "webDashboard.enabled=true",
        "webDashboard.sessionIdleTimeout=5m",
        "webDashboard.maxSessions=7",
        "webDashboard.extraArgs[0]=--tls-cert-file=/tls/tls.crt",
        "webDashboard.resources.limits.memory=3Gi",
        "webDashboard.service.type=NodePort",
        "image.tag=9.9.9",
    )
    service = ("v1", "Service", "koord-queue", "koord-queue-web-dashboard")
    assert {k for k in default if rendered[k] != default[k]} == {RECONCILER, WEBHOOK, WEB_DASHBOARD, service}
    c = container(rendered, WEB_DASHBOARD)
    assert c["args"][-3:] == ["--session-idle-timeout=5m", "--max-sessions=7", "--tls-cert-file=/tls/tls.crt"]
    assert c["resources"]["limits"]["memory"] == "3Gi" and c["image"] == "koord-queue-py:9.9.9"
    assert rendered[service]["spec"]["type"] == "NodePort"


def test_the_webhook_scrapers_ca_can_come_from_a_secret() -> None:
    """docs/operations.md#metrics: ``metrics.clientCA`` names where the webhook's scrapers' CA is."""
    default, rendered = template(), template("metrics.clientCA.secret=prom-ca", "metrics.clientCA.key=ca.pem")
    assert {k for k in default if rendered[k] != default[k]} == {WEBHOOK}
    volume = next(v for v in pod(rendered, WEBHOOK)["volumes"] if v["name"] == "metrics-client-ca")
    assert volume == {
        "name": "metrics-client-ca",
        "secret": {"secretName": "prom-ca", "optional": True, "items": [{"key": "ca.pem", "path": "ca.crt"}]},
    }


def namespaces_named(node: Any, path: str = "") -> list[str]:
    """Every place of a rendered object that names a namespace: ``namespace`` fields, ServiceAccount
    usernames (in CEL expressions and flags), ``kubernetes.io/metadata.name`` selector values,
    cert-manager's ``inject-ca-from`` and service DNS names."""
    found: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "namespace" and isinstance(v, str):
                found.append(f"{path}.namespace={v}")
            found += namespaces_named(v, f"{path}.{k}")
        if node.get("key") == "kubernetes.io/metadata.name":
            found += [f"{path}.values={v}" for v in node.get("values", [])]
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found += namespaces_named(item, f"{path}[{i}]")
    elif isinstance(node, str):
        for marker in ("system:serviceaccount:", "cert-manager.io/inject-ca-from", ".svc"):
            if marker in node:
                found.append(f"{path}={node}")
    return found


EVERYTHING_ON = (
    "certManager.enabled=true",
    "config.manageJobsWithoutQuotaName=true",
    "metrics.serviceMonitor.enabled=true",
    "dashboard.enabled=true",
    "webDashboard.enabled=true",
)


def test_installed_in_another_namespace_nothing_names_koord_queue_as_a_namespace() -> None:
    """``helm install -n other``: every namespace the objects name (their own, the ServiceAccount
    usernames of the admission policies, the webhook and visibility Services, the policy
    parameters, the excluded namespace of the selectors, the cert-manager names) is the release's;
    only kube-system stays where it is. Both processes learn it from the downward API
    (docs/operations.md#install-namespace): no flag names it."""
    other = template(*EVERYTHING_ON, namespace="other")
    default = template(*EVERYTHING_ON)
    assert ("v1", "Namespace", "", "other") in other
    named = [f"{k[1]}/{k[3]}{n}" for k, obj in other.items() for n in namespaces_named(obj)]
    left = [n for n in named if _names_koord_queue(n.split("=", 1)[1])]
    assert not left, left
    assert any("system:serviceaccount:other:koord-queue-reconciler" in n for n in named)
    for deployment in ("koord-queue-webhook", "koord-queue-reconciler"):
        found = container(other, ("apps/v1", "Deployment", "other", deployment))
        env = {e["name"]: e.get("valueFrom") for e in found.get("env", [])}
        assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, deployment
        assert not [a for a in found["args"] if "namespace" in a or "serviceaccount" in a], deployment
    # The same places name koord-queue in a release installed there: the walk finds them.
    assert [
        n
        for n in (f"{k[1]}/{k[3]}{n}" for k, obj in default.items() for n in namespaces_named(obj))
        if _names_koord_queue(n.split("=", 1)[1])
    ]
    # Nothing else differs: the same objects, with the namespace swapped.
    swapped = json.loads(
        json.dumps(list(other.values()))
        .replace('"other"', '"koord-queue"')
        .replace(":other:", ":koord-queue:")
        .replace(".other.svc", ".koord-queue.svc")
        .replace("other/koord-queue-webhook-cert", "koord-queue/koord-queue-webhook-cert")
    )
    assert without_chart_annotations(normalised(swapped)) == without_chart_annotations(default)


def _names_koord_queue(value: str) -> bool:
    return (
        value == "koord-queue"
        or ":koord-queue:" in value
        or ".koord-queue.svc" in value
        or value.startswith("koord-queue/")
    )


def test_crds_are_templates_kept_on_uninstall_and_can_be_left_out() -> None:
    default = template()
    without = template("crds.install=false")
    removed = set(default) - set(without)
    assert {k[1] for k in removed} == {"CustomResourceDefinition"} and len(removed) == 4
    assert all(without[k] == default[k] for k in without)


def test_cert_manager_mode_renders_its_certificate_and_ca_injection() -> None:
    """Rendered only: cert-manager's CRDs are not on the local control plane."""
    default = template()
    on = template("certManager.enabled=true")
    added = {k: on[k] for k in set(on) - set(default)}
    assert {(k[1], k[3]) for k in added} == {
        ("Issuer", "koord-queue-selfsigned"),
        ("Certificate", "koord-queue-webhook-ca"),
        ("Issuer", "koord-queue-webhook-ca"),
        ("Certificate", "koord-queue-webhook-cert"),
    }
    assert {k for k in default if on[k] != default[k]} == {MUTATING, VALIDATING, RECONCILER}
    for config in (MUTATING, VALIDATING):
        annotations = on[config]["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": "koord-queue/koord-queue-webhook-cert"}
    assert "--manage-webhook-certs" in container(default, RECONCILER)["args"]
    assert "--manage-webhook-certs" not in container(on, RECONCILER)["args"]
    cert = added[("cert-manager.io/v1", "Certificate", "koord-queue", "koord-queue-webhook-cert")]["spec"]
    volume = {v["name"]: v for v in pod(on, WEBHOOK)["volumes"]}["certs"]
    assert cert["secretName"] == volume["secret"]["secretName"]
    service = on[("v1", "Service", "koord-queue", "koord-queue-webhook")]["metadata"]
    assert f"{service['name']}.{service['namespace']}.svc" in cert["dnsNames"]
    assert cert["issuerRef"] == {"kind": "Issuer", "name": "koord-queue-webhook-ca"}
    own = template(
        "certManager.enabled=true",
        "certManager.issuerRef.name=corp-ca",
        "certManager.issuerRef.kind=ClusterIssuer",
    )
    assert {(k[1], k[3]) for k in set(own) - set(default)} == {("Certificate", "koord-queue-webhook-cert")}
    issuer = own[("cert-manager.io/v1", "Certificate", "koord-queue", "koord-queue-webhook-cert")]["spec"][
        "issuerRef"
    ]
    assert issuer == {"name": "corp-ca", "kind": "ClusterIssuer"}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("reconciler.replicas=abc", "at '/reconciler/replicas': got string, want integer"),
        ("webhook.replica=3", "at '/webhook': additional properties 'replica' not allowed"),
        ("config.quotaGuarantees=maybe", "at '/config/quotaGuarantees': got string, want boolean"),
        ("webDashboard.maxSessions=many", "at '/webDashboard/maxSessions': got string, want integer"),
        ("webDashboard.sesionIdleTimeout=5m", "sesionIdleTimeout"),
    ],
)
def test_a_wrong_value_is_refused_naming_it(value: str, named: str) -> None:
    result = helm("template", "koord-queue", str(chart.CHART), f"--set={value}")
    assert result.returncode != 0 and named in result.stderr, result.stderr


def test_a_value_helm_reads_as_a_number_where_a_string_is_meant_still_renders() -> None:
    """``--set`` makes ``1`` a number; an image tag or a label value like that is still meant."""
    o = template("image.tag=1", "dashboard.enabled=true", "dashboard.labelValue=1")
    assert container(o, RECONCILER)["image"] == "koord-queue-py:1"
    board = o[("v1", "ConfigMap", "koord-queue", "koord-queue-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_chart_installs_with_a_server_side_dry_run(integration_cluster: LocalCluster) -> None:
    """``helm install --dry-run=server``: helm renders against the live cluster, maps every kind
    through its discovery, validates against its OpenAPI schema and checks ownership. The test
    cluster already holds the objects of the kustomize install (CRDs, RBAC, policies, the
    namespace), which helm would refuse to adopt without ``--take-ownership``; a dry run changes
    nothing either way. Then every rendered object, with non-default values too, goes through the
    apiserver's own server-side dry-run apply (admission and schema included), which helm's dry run
    does not send."""
    kubeconfig = str(integration_cluster.kubeconfig)
    result = helm(
        "install",
        "koord-queue",
        str(chart.CHART),
        "--namespace=koord-queue",
        "--dry-run=server",
        "--take-ownership",
        "--set=config.maxUserPriority=1000",
        kubeconfig=kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    assert "STATUS: pending-install" in result.stdout and "--max-user-priority=1000" in result.stdout
    broken = helm(
        "install",
        "koord-queue",
        str(chart.CHART),
        "--dry-run=server",
        "--take-ownership",
        "--set=metrics.serviceMonitor.enabled=true",
        kubeconfig=kubeconfig,
    )
    assert broken.returncode != 0 and 'no matches for kind "ServiceMonitor"' in broken.stderr, broken.stderr
    for sets in (
        [],
        [
            "reconciler.replicas=3",
            "config.maxUserPriority=7",
            "dashboard.enabled=true",
            "webDashboard.enabled=true",
            "networkPolicy.enabled=true",
        ],
        [
            "reconciler.nodeSelector.disk=ssd",
            "webhook.tolerations[0].operator=Exists",
            "reconciler.priorityClassName=system-cluster-critical",
            "webhook.imagePullSecrets[0].name=regcred",
            "webhook.podSecurityContext.runAsUser=1001",
            "reconciler.securityContext.readOnlyRootFilesystem=false",
            "crds.install=false",
        ],
    ):
        args = [
            "template",
            "koord-queue",
            str(chart.CHART),
            "--namespace=koord-queue",
            *(f"--set={s}" for s in sets),
        ]
        rendered = helm(*args)
        assert rendered.returncode == 0, rendered.stderr
        applied = kube.kubectl(
            integration_cluster,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=chart-dry-run",
            "--dry-run=server",
            "-f",
            "-",
            input_text=rendered.stdout,
            check=False,
        )
        assert applied.returncode == 0, (sets, applied.stderr)
        assert "deployment.apps/koord-queue-reconciler serverside-applied (server dry run)" in applied.stdout


def test_the_chart_installs_in_another_namespace_with_a_server_side_dry_run(
    integration_cluster: LocalCluster,
) -> None:
    """``helm install -n <other>`` against the real apiserver (the cluster-scoped objects exist
    already, hence ``--take-ownership``; a dry run changes nothing), and every object it renders
    through the apiserver's server-side dry-run apply."""
    kubeconfig = str(integration_cluster.kubeconfig)
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    kube.kubectl(integration_cluster, "create", "namespace", namespace)
    try:
        result = helm(
            "install",
            "kq",
            str(chart.CHART),
            f"--namespace={namespace}",
            "--dry-run=server",
            "--take-ownership",
            kubeconfig=kubeconfig,
        )
        assert result.returncode == 0, result.stderr
        assert f"system:serviceaccount:{namespace}:koord-queue-reconciler" in result.stdout
        rendered = helm(
            "template", "kq", str(chart.CHART), f"--namespace={namespace}", "--set=crds.install=false"
        )
        assert rendered.returncode == 0, rendered.stderr
        applied = kube.kubectl(
            integration_cluster,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=chart-dry-run",
            "--dry-run=server",
            "-f",
            "-",
            input_text=rendered.stdout,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
        assert "deployment.apps/koord-queue-webhook serverside-applied (server dry run)" in applied.stdout
    finally:
        kube.kubectl(integration_cluster, "delete", "namespace", namespace, "--wait=false", check=False)


QUEUES_CRD = "queues.scheduling.x-k8s.io"


def _crds_only(into: Path, description: str | None = None) -> Path:
    """The chart with its CRD templates only (the rest would take over the running install of this
    shared test cluster); with ``description``, the Queue CRD's schema changed."""
    shutil.copytree(chart.CHART, into)
    for template_file in (into / "templates").glob("*"):
        if template_file.is_file() and template_file.name != "_helpers.tpl":
            template_file.unlink()
    if description is not None:
        crd = into / "templates" / "crds" / f"{QUEUES_CRD}.yaml"
        text = crd.read_text()
        schema = re.search(r"^      openAPIV3Schema:\n        description: .*$", text, re.M)
        assert schema is not None
        crd.write_text(text.replace(schema[0], f"      openAPIV3Schema:\n        description: {description}"))
    return into


def test_helm_upgrade_applies_a_changed_crd_and_uninstall_keeps_it(
    integration_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A real install and upgrade against the apiserver: the CRDs are templates, so the upgrade
    applies the changed one (Helm never upgrades ``crds/``), and the keep policy leaves them on
    uninstall. Finally the CRD is put back as kustomize has it."""
    kubeconfig = str(integration_cluster.kubeconfig)
    release = ["kq-crds", "--namespace=default"]
    original, changed = _crds_only(tmp_path / "a"), _crds_only(tmp_path / "b", "changed-by-test-chart")

    def description() -> str | None:
        got = kube.kubectl(integration_cluster, "get", "crd", QUEUES_CRD, "-o", "json")
        schema = json.loads(got.stdout)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        found: str | None = schema.get("description")
        return found

    before = description()
    try:
        installed = helm(
            "install", *release, str(original), "--take-ownership", "--wait", kubeconfig=kubeconfig
        )
        assert installed.returncode == 0, installed.stderr
        assert description() == before
        upgraded = helm("upgrade", *release, str(changed), "--wait", kubeconfig=kubeconfig)
        assert upgraded.returncode == 0, upgraded.stderr
        assert description() == "changed-by-test-chart"
        removed = helm("uninstall", *release, "--wait", kubeconfig=kubeconfig)
        assert removed.returncode == 0, removed.stderr
        assert "kept due to the resource policy" in removed.stdout + removed.stderr
        assert description() == "changed-by-test-chart"
    finally:
        helm("uninstall", *release, kubeconfig=kubeconfig)
        crd = next(o for o in system.rendered_manifests() if o["metadata"]["name"] == QUEUES_CRD)
        kube.kubectl(
            integration_cluster,
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kustomize-restore",
            "-f",
            "-",
            input_text=yaml.safe_dump(crd),
        )

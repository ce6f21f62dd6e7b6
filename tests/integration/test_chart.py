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
  every object it renders, with the values changed too, is accepted by a server-side dry-run apply.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import yaml

from koord_queue.shared.core import config as component_config
from testenv import binaries, chart, system
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


def template(*sets: str, crds: bool = True) -> dict[Key, Obj]:
    args = ["template", "koord-queue", str(chart.CHART), *(["--include-crds"] if crds else [])]
    for value in sets:
        args += ["--set", value]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return normalised([d for d in yaml.safe_load_all(result.stdout) if d])


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
    rendered = template()
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
        {CONFIG},
        check_config,
    ),
    (["config.maxUserPriority=1000"], {CONFIG, WEBHOOK}, check_priority_cap),
    (
        ["config.enabledExtensions={job,tfjob}", "reconciler.extraArgs={--qps=100}"],
        {RECONCILER, WEBHOOK},
        check_kinds_and_args,
    ),
    (
        ["config.manageJobsWithoutQuotaName=true", "config.managedJobsNamespaceSelector.matchLabels.team=ml"],
        {CONFIG, MUTATING, VALIDATING},
        check_mandatory_queueing,
    ),
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
    assert set(new) == {
        ("monitoring.coreos.com/v1", "ServiceMonitor", "koord-queue", "koord-queue"),
        ("v1", "ConfigMap", "koord-queue", "koord-queue-dashboard"),
    }
    assert all(added[k] == default[k] for k in default)
    board = new[("v1", "ConfigMap", "koord-queue", "koord-queue-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"]["koord-queue.json"] == chart.DASHBOARD.read_text().rstrip("\n")
    monitor = new[("monitoring.coreos.com/v1", "ServiceMonitor", "koord-queue", "koord-queue")]
    services = [
        o
        for o in default.values()
        if o["kind"] == "Service" and any(p["name"] == "metrics" for p in o["spec"]["ports"])
    ]
    wanted = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in services) == sorted(wanted)


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
        "--namespace=default",
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
    for sets in ([], ["reconciler.replicas=3", "config.maxUserPriority=7", "dashboard.enabled=true"]):
        args = ["template", "koord-queue", str(chart.CHART), *(f"--set={s}" for s in sets)]
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

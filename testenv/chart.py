"""``make chart``: generate the Helm chart ``charts/koord-queue`` from ``kubectl kustomize manifests/``.

One source of truth: ``manifests/`` holds the install; the chart is *generated* from its rendered
objects, with Helm values put in at a few known places, and committed. tests/integration/test_chart.py
regenerates it and fails when the committed chart differs (run ``make chart``), proves that
``helm template`` with the default values renders exactly the objects kustomize renders, that each
value changes what it should and nothing else, and that the chart installs with a server-side dry
run.

What the values reach (everything else is the manifests, verbatim):

* ``image.repository`` / ``image.tag`` / ``image.pullPolicy``: both Deployments;
* ``reconciler.replicas`` / ``webhook.replicas``, ``reconciler.resources`` / ``webhook.resources``;
* ``config.*``: the component configuration (ConfigMap ``koord-queue-config``):
  ``defaultReclaimProtectTime``, ``quotaNamespaceBinding``, ``quotaGuarantees``,
  ``publishQuotaStatus``, ``maxUserPriority`` (also given to the
  webhook as ``--max-user-priority``, so both refuse and clamp alike), ``jobRunningTimeout``,
  ``nativeGangHandoff``, ``scheduledEvents``, ``usageHalfLife``, ``plugins``,
  ``manageJobsWithoutQuotaName`` and
  ``managedJobsNamespaceSelector`` (which also add the webhooks for unlabelled jobs in the selected
  namespaces, docs/operations.md#mandatory-queueing);
  ``config.enabledExtensions`` (the job kinds, ``--enabled-extensions`` of both
  processes; empty: their default);
* ``reconciler.extraArgs`` / ``webhook.extraArgs``;
* ``namespace.create``: the Namespace object (off when something else owns ``koord-queue``);
* ``metrics.serviceMonitor.*``: a Prometheus Operator ServiceMonitor for both ``metrics`` ports;
* ``dashboard.*``: the Grafana dashboard (manifests/dashboards) as a ConfigMap for Grafana's sidecar.

The default values are read from the manifests too (the image, replicas, resources and the
configuration file), so changing ``manifests/`` and running ``make chart`` is the whole workflow.
Before the chart, ``make chart`` refills the generated job-kind blocks of ``manifests/`` from the
adapter registry (``testenv/kinds.py``), so a new job kind reaches both with no hand edit.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import yaml

from testenv import binaries, kinds, system

ROOT = binaries.PROJECT_ROOT
CHART: Final = ROOT / "charts" / "koord-queue"
DASHBOARD: Final = ROOT / "manifests" / "dashboards" / "koord-queue.json"
CONFIG_MAP: Final = "koord-queue-config"
NAMESPACE: Final = "koord-queue"
DEPLOYMENTS: Final = {"koord-queue-reconciler": "reconciler", "koord-queue-webhook": "webhook"}

Obj = dict[str, Any]


class ChartError(RuntimeError):
    """The manifests do not have the shape the generator substitutes values into."""


def _token(name: str) -> str:
    return f"__KQ_{name.upper()}__"


def _split_image(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        return image, "latest"
    return repository, tag


def _deployment_values(obj: Obj, component: str) -> dict[str, Any]:
    """Pull the defaults out of a Deployment and leave tokens where the values go."""
    spec = obj["spec"]
    container = spec["template"]["spec"]["containers"][0]
    found = {
        "replicas": spec["replicas"],
        "resources": container.get("resources", {}),
        "image": container["image"],
        "pullPolicy": container.get("imagePullPolicy", "IfNotPresent"),
    }
    spec["replicas"] = _token(f"{component}_replicas")
    container["image"] = _token("image")
    container["imagePullPolicy"] = _token("pull_policy")
    container["resources"] = _token(f"{component}_resources")
    container.setdefault("args", []).append(_token(f"{component}_extra_args"))
    return found


def _escape(text: str) -> str:
    """Literal braces of the manifests must not be read as Helm actions."""
    return text.replace("{{", "\x00").replace("}}", '{{ "}}" }}').replace("\x00", '{{ "{{" }}')


def _block(text: str, token: str, key: str, expr: str) -> str:
    """``<indent><key>: <token>`` -> the key with ``expr`` rendered as a nested block under it."""
    pattern = re.compile(rf"^(?P<indent> *){re.escape(key)}: {re.escape(token)}$", re.M)
    match = pattern.search(text)
    if match is None:
        raise ChartError(f"{key}: {token} not found in the rendered template")
    indent = match["indent"]
    return pattern.sub(f"{indent}{key}:\n{indent}  {{{{- {expr} | nindent {len(indent) + 2} }}}}", text)


def _args(text: str, token: str, lines: list[str]) -> str:
    pattern = re.compile(rf"^(?P<indent> *)- {re.escape(token)}$", re.M)
    match = pattern.search(text)
    if match is None:
        raise ChartError(f"args token {token} not found")
    indent = match["indent"]
    return pattern.sub("\n".join(indent + line for line in lines), text)


EXTRA_ARGS: Final = {
    "reconciler": [
        "{{- with .Values.config.enabledExtensions }}",
        '- --enabled-extensions={{ join "," . }}',
        "{{- end }}",
        "{{- range .Values.reconciler.extraArgs }}",
        "- {{ . | quote }}",
        "{{- end }}",
    ],
    "webhook": [
        "{{- with .Values.config.enabledExtensions }}",
        '- --enabled-extensions={{ join "," . }}',
        "{{- end }}",
        '{{- if not (kindIs "invalid" .Values.config.maxUserPriority) }}',
        "- --max-user-priority={{ int64 .Values.config.maxUserPriority }}",
        "{{- end }}",
        "{{- range .Values.webhook.extraArgs }}",
        "- {{ . | quote }}",
        "{{- end }}",
    ],
}


def _template(obj: Obj) -> str:
    text = _escape(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1 << 16))
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Deployment" and name in DEPLOYMENTS:
        component = DEPLOYMENTS[name]
        text = text.replace(_token(f"{component}_replicas"), f"{{{{ .Values.{component}.replicas }}}}")
        text = text.replace(_token("image"), '"{{ .Values.image.repository }}:{{ .Values.image.tag }}"')
        text = text.replace(_token("pull_policy"), "{{ .Values.image.pullPolicy }}")
        text = _block(
            text, _token(f"{component}_resources"), "resources", f"toYaml .Values.{component}.resources"
        )
        text = _args(text, _token(f"{component}_extra_args"), EXTRA_ARGS[component])
    if kind == "ConfigMap" and name == CONFIG_MAP:
        text = _block(text, _token("config"), "config.yaml", 'include "koord-queue.config" .')
        text = text.replace("config.yaml:\n", "config.yaml: |\n", 1)
    if kind == "Namespace":
        text = "{{- if .Values.namespace.create }}\n" + text + "{{- end }}\n"
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        text += _unlabelled_webhook(obj)
    return text


#: The namespace selector of the webhook for unlabelled jobs: never kube-system or koord-queue
#: (docs/architecture.md#decision-6-a-stateless-scoped-webhook), and the namespaces the values select.
_SELECTED: Final = """\
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
      - kube-system
      - koord-queue
    {{- with .Values.config.managedJobsNamespaceSelector.matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with .Values.config.managedJobsNamespaceSelector.matchLabels }}
    matchLabels:
      {{- toYaml . | nindent 6 }}
    {{- end }}
"""


def _unlabelled_webhook(obj: Obj) -> str:
    """With ``config.manageJobsWithoutQuotaName``: one more job webhook, for the unlabelled jobs of
    the selected namespaces (docs/operations.md#mandatory-queueing). A copy of the configuration's
    job webhook with the namespace selector of the values, the path ``/mutate-unlabelled`` or
    ``/validate-unlabelled``, and an object selector for jobs without either quota label (the
    labelled ones have their webhooks already). ``webhooks`` is the last key of the object."""
    if list(obj)[-1] != "webhooks":
        raise ChartError(f"{obj['kind']}: webhooks is not the last key")
    first = next((w for w in obj["webhooks"] if str(w["name"]).startswith("jobs.")), None)
    if first is None:
        raise ChartError(f"{obj['kind']}: no job webhook to copy")
    entry = dict(first)
    entry["name"] = "unlabelled-" + str(first["name"])
    service = dict(first["clientConfig"]["service"])
    service["path"] = str(service["path"]) + "-unlabelled"
    entry["clientConfig"] = {**first["clientConfig"], "service": service}
    entry["namespaceSelector"] = _token("selected")
    entry["objectSelector"] = {
        "matchExpressions": [
            {"key": "quota.scheduling.koordinator.sh/name", "operator": "DoesNotExist"},
            {"key": "alibabacloud.com/quota-name", "operator": "DoesNotExist"},
        ]
    }
    dumped = _escape(yaml.safe_dump([entry], sort_keys=False, default_flow_style=False, width=1 << 16))
    dumped = dumped.replace(f"  namespaceSelector: {_token('selected')}\n", _SELECTED)
    if _token("selected") in dumped:
        raise ChartError("the namespace selector token was not replaced")
    return "{{- if .Values.config.manageJobsWithoutQuotaName }}\n" + dumped + "{{- end }}\n"


HELPERS: Final = """\
{{/* Generated by `make chart` (testenv/chart.py) from manifests/: edit those, not this. */}}
{{/* The component configuration (KoordQueueConfiguration) from .Values.config. */}}
{{- define "koord-queue.config" -}}
apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
defaultReclaimProtectTime: {{ .Values.config.defaultReclaimProtectTime | quote }}
quotaNamespaceBinding: {{ .Values.config.quotaNamespaceBinding }}
quotaGuarantees: {{ .Values.config.quotaGuarantees }}
publishQuotaStatus: {{ .Values.config.publishQuotaStatus }}
{{- if not (kindIs "invalid" .Values.config.maxUserPriority) }}
maxUserPriority: {{ int64 .Values.config.maxUserPriority }}
{{- end }}
{{- with .Values.config.jobRunningTimeout }}
jobRunningTimeout:
  {{- toYaml . | nindent 2 }}
{{- end }}
nativeGangHandoff: {{ .Values.config.nativeGangHandoff }}
scheduledEvents: {{ .Values.config.scheduledEvents }}
usageHalfLife: {{ .Values.config.usageHalfLife | quote }}
manageJobsWithoutQuotaName: {{ .Values.config.manageJobsWithoutQuotaName }}
{{- with .Values.config.managedJobsNamespaceSelector }}
managedJobsNamespaceSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.config.plugins }}
plugins:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
"""

SERVICE_MONITOR: Final = """\
{{/* Generated by `make chart` (testenv/chart.py). Needs the Prometheus Operator's CRDs. */}}
{{- if .Values.metrics.serviceMonitor.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: koord-queue
  namespace: koord-queue
  labels:
    app.kubernetes.io/part-of: koord-queue
    {{- with .Values.metrics.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  namespaceSelector:
    matchNames: [koord-queue]
  selector:
    matchExpressions:
      - key: app.kubernetes.io/component
        operator: In
        values: [reconciler, webhook]
  endpoints:
    - port: metrics
      interval: {{ .Values.metrics.serviceMonitor.interval }}
{{- end }}
"""

DASHBOARD_TEMPLATE: Final = """\
{{/* Generated by `make chart` (testenv/chart.py): manifests/dashboards/koord-queue.json for Grafana's
dashboard sidecar, which loads every ConfigMap carrying the label below. */}}
{{- if .Values.dashboard.enabled }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: koord-queue-dashboard
  namespace: {{ .Values.dashboard.namespace }}
  labels:
    app.kubernetes.io/part-of: koord-queue
    {{ .Values.dashboard.label }}: {{ .Values.dashboard.labelValue | quote }}
data:
  koord-queue.json: |-
    {{- .Files.Get "dashboards/koord-queue.json" | nindent 4 }}
{{- end }}
"""

NOTES: Final = """\
koord-queue is installed in namespace koord-queue.

Jobs labelled quota.scheduling.koordinator.sh/name=<quota> are queued. See where they stand:

  kubectl koord-queue list -n <namespace>       (the plugin comes with the koord-queue-py package)
  kubectl koord-queue explain <job> -n <namespace>
  kubectl get queueunit -n <namespace>
"""


def _values(defaults: dict[str, Any], config: Obj) -> str:
    def block(value: Any, indent: int) -> str:
        dumped = yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")
        return "\n".join(" " * indent + line for line in dumped.splitlines())

    repository, tag = _split_image(defaults["reconciler"]["image"])
    cap = config.get("maxUserPriority")
    return f"""\
# Values of the koord-queue chart. Generated by `make chart` (testenv/chart.py) from manifests/:
# the defaults here are the manifests' own, and `helm template` with them renders exactly the
# objects of `kubectl kustomize manifests/` (tests/integration/test_chart.py).

image:
  repository: {repository}
  tag: {tag}
  pullPolicy: {defaults["reconciler"]["pullPolicy"]}

reconciler:
  # Two replicas with Lease leader election: only the leader acts; both serve reads.
  replicas: {defaults["reconciler"]["replicas"]}
  resources:
{block(defaults["reconciler"]["resources"], 4)}
  # More flags (reconciler/main.py --help), e.g. ["--qps=100"].
  extraArgs: []

webhook:
  # Stateless; keep at least two so a rollout or a node drain never leaves labelled jobs refused.
  replicas: {defaults["webhook"]["replicas"]}
  resources:
{block(defaults["webhook"]["resources"], 4)}
  extraArgs: []

# The component configuration (ConfigMap {CONFIG_MAP}; docs/operations.md#component-configuration-file).
config:
  # A unit admitted less than this long ago is never a preemption victim (Go duration; 0s = off).
  defaultReclaimProtectTime: {yaml.safe_dump(config.get("defaultReclaimProtectTime", "0s")).splitlines()[0]}
  # A quota serves only jobs of its own namespace and of those in its
  # quota.scheduling.koordinator.sh/namespaces annotation; false: any job may name any quota.
  quotaNamespaceBinding: {str(config.get("quotaNamespaceBinding", True)).lower()}
  # min guaranteed, lending and fair shares below parent quotas; false: max-only admission.
  quotaGuarantees: {str(config.get("quotaGuarantees", True)).lower()}
  # Write status.used and the runtime/request/borrowed annotations (false: koord-scheduler does).
  publishQuotaStatus: {str(config.get("publishQuotaStatus", True)).lower()}
  # The highest priority a job may ask for with scheduling.x-k8s.io/priority (null: no cap).
  # Also given to the webhook as --max-user-priority, so larger values are refused at once.
  maxUserPriority: {"null" if cap is None else cap}
  # Running timeout with backoff per job extension (a "default" entry and per-kind overrides).
  jobRunningTimeout:
{block(config.get("jobRunningTimeout") or {}, 4)}
  # Native gang hand-off to kube-scheduler's gang scheduling (docs/compatibility.md#native-gang-hand-off):
  # needs the alpha Workload API scheduling.k8s.io/v1alpha1 and the feature gates GenericWorkload
  # and GangScheduling; refused with an error (and no effect) on a cluster without them.
  nativeGangHandoff: {str(config.get("nativeGangHandoff", False)).lower()}
  # The QueueUnit event Scheduled "dequeue success" (docs/compatibility.md#events): AfterWait only
  # for units that waited first; Always on every admission, as upstream.
  scheduledEvents: {config.get("scheduledEvents", "AfterWait")}
  # Usage history (docs/compatibility.md#fair-over-time): the half-life of each quota's decayed
  # usage, which orders spare capacity among sibling quotas by what they used lately; 0s: off.
  usageHalfLife: {config.get("usageHalfLife", "1h")}
  # Mandatory queueing (docs/operations.md#mandatory-queueing): every job of an enabled kind in the
  # namespaces the selector picks is queued, an unlabelled one on the namespace's default quota;
  # also adds the webhooks for unlabelled jobs there. The selector is a LabelSelector
  # (matchLabels, matchExpressions); empty: every namespace but kube-system and koord-queue.
  manageJobsWithoutQuotaName: {str(config.get("manageJobsWithoutQuotaName", False)).lower()}
  managedJobsNamespaceSelector: {{}}
  # Accepted for compatibility with upstream configuration files.
  plugins:
{block(config.get("plugins") or [], 4)}
  # Job kinds to manage (--enabled-extensions of both processes), e.g. [job, tfjob, pytorchjob];
  # empty: their default (every kind but raycluster).
  enabledExtensions: []

namespace:
  # Create the Namespace koord-queue (with the restricted Pod Security labels). Everything is
  # installed there whatever namespace the release is recorded in.
  create: true

metrics:
  serviceMonitor:
    # A Prometheus Operator ServiceMonitor scraping the reconciler's and the webhook's metrics ports.
    enabled: false
    interval: 30s
    labels: {{}}

dashboard:
  # The Grafana dashboard as a ConfigMap for Grafana's dashboard sidecar.
  enabled: false
  namespace: {NAMESPACE}
  label: grafana_dashboard
  labelValue: "1"
"""


def generate(out: Path) -> None:
    """Write the chart into ``out`` (created or emptied)."""
    docs = system.rendered_manifests()
    defaults: dict[str, Any] = {}
    config: Obj = {}
    crds: list[Obj] = []
    templates: dict[str, str] = {}
    for obj in docs:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "CustomResourceDefinition":
            crds.append(obj)
            continue
        if kind == "Deployment" and name in DEPLOYMENTS:
            defaults[DEPLOYMENTS[name]] = _deployment_values(obj, DEPLOYMENTS[name])
        if kind == "ConfigMap" and name == CONFIG_MAP:
            config = yaml.safe_load(obj["data"]["config.yaml"]) or {}
            obj["data"]["config.yaml"] = _token("config")
        filename = f"{kind.lower()}-{name.replace('.', '-')}.yaml"
        if filename in templates:
            raise ChartError(f"two objects map to {filename}")
        templates[filename] = _template(obj)
    if set(defaults) != set(DEPLOYMENTS.values()) or not config:
        raise ChartError("manifests/ lacks a Deployment or the ConfigMap the chart substitutes into")
    images = {d["image"] for d in defaults.values()}
    if len(images) != 1:
        raise ChartError(f"the Deployments use different images: {sorted(images)}")
    _, tag = _split_image(images.pop())
    if out.exists():
        shutil.rmtree(out)
    (out / "templates").mkdir(parents=True)
    (out / "crds").mkdir()
    (out / "dashboards").mkdir()
    (out / "Chart.yaml").write_text(
        "# Generated by `make chart` (testenv/chart.py) from manifests/.\n"
        + yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "koord-queue",
                "description": "Kubernetes job queueing compatible with Koord-Queue: admission webhook "
                "and reconciler (koord-queue-py)",
                "type": "application",
                "version": tag,
                "appVersion": tag,
                "kubeVersion": ">=1.30.0-0",
                "home": "https://koordinator.sh",
            },
            sort_keys=False,
        )
    )
    (out / "values.yaml").write_text(_values(defaults, config))
    for crd in crds:
        name = crd["metadata"]["name"]
        (out / "crds" / f"{name}.yaml").write_text(yaml.safe_dump(crd, sort_keys=False, width=1 << 16))
    header = "# Generated by `make chart` (testenv/chart.py) from manifests/: edit those, not this.\n"
    for filename, text in sorted(templates.items()):
        (out / "templates" / filename).write_text(header + text)
    (out / "templates" / "_helpers.tpl").write_text(HELPERS)
    (out / "templates" / "servicemonitor.yaml").write_text(SERVICE_MONITOR)
    (out / "templates" / "dashboard.yaml").write_text(DASHBOARD_TEMPLATE)
    (out / "templates" / "NOTES.txt").write_text(NOTES)
    shutil.copyfile(DASHBOARD, out / "dashboards" / DASHBOARD.name)


def differences(committed: Path = CHART) -> list[str]:
    """Files that differ between a fresh generation and ``committed`` (empty: up to date)."""
    with tempfile.TemporaryDirectory(prefix="koord-queue-chart-") as tmp:
        fresh = Path(tmp) / "chart"
        generate(fresh)
        names = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
        names |= {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
        return sorted(
            str(n)
            for n in names
            if not (fresh / n).is_file()
            or not (committed / n).is_file()
            or (fresh / n).read_bytes() != (committed / n).read_bytes()
        )


def main(argv: list[str] | None = None) -> None:
    """First the job-kind lists of ``manifests/`` (``testenv/kinds.py``), then the chart made from them."""
    parser = argparse.ArgumentParser(prog="make chart", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="only report whether manifests/ and charts/ are up to date"
    )
    args = parser.parse_args(argv)
    if args.check:
        failed = False
        if stale_kinds := kinds.stale_manifests():
            print(
                "job-kind lists out of date with shared/jobs/registry.py (run `make chart`): "
                + ", ".join(stale_kinds),
                file=sys.stderr,
            )
            failed = True
        if stale := differences():
            print(
                "charts/koord-queue is out of date (run `make chart`): " + ", ".join(stale), file=sys.stderr
            )
            failed = True
        if failed:
            raise SystemExit(1)
        print("manifests/ job kinds and charts/koord-queue are up to date")
        return
    for name in kinds.write_manifests():
        print(f"wrote the job kinds of {name}")
    generate(CHART)
    print(f"wrote {CHART.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

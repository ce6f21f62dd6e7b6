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
* per component (``reconciler.*``, ``webhook.*``): ``nodeSelector``, ``tolerations``, ``affinity``,
  ``topologySpreadConstraints``, ``priorityClassName``, ``imagePullSecrets``, ``podSecurityContext``
  and the container's ``securityContext`` (defaults: what the manifests set, e.g. the hardened
  security contexts and the webhook's ``system-cluster-critical``);
* ``.Release.Namespace``: every place the manifests name their namespace ``koord-queue`` (objects,
  binding subjects, Services the apiserver dials, policy parameters, the reconciler's ServiceAccount
  username in CEL expressions and the webhook's ``--reconciler-username``, the namespace excluded by
  selectors), so ``helm install -n <namespace>`` moves all of it;
* a ``checksum/config`` annotation on both pod templates (a configuration change rolls both);
* ``crds.install``: the CRDs as templates (``helm upgrade`` applies a changed one; Helm never
  upgrades ``crds/``), with ``helm.sh/resource-policy: keep``;
* ``certManager.*``: cert-manager issues the webhook's serving certificate and injects its CA,
  instead of the reconciler's ``--manage-webhook-certs``;
* ``values.schema.json``: a value of the wrong type, or a misspelt one, is refused naming it;
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
* ``namespace.create``: the Namespace object (off when something else owns the release namespace);
* ``metrics.serviceMonitor.*``: Prometheus Operator ServiceMonitors for the ``metrics`` ports (the
  reconciler's with a bearer token over HTTPS, the webhook's with the client certificate of
  ``webhookClientSecret``), and ``metrics.clientCA.*``: where the webhook's scrapers' CA is
  (docs/operations.md#metrics);
* ``networkPolicy.*``: the kustomize component ``manifests/components/network-policies`` as
  templates, its peers from ``apiServer`` and ``metrics`` (docs/operations.md#network-policies);
* ``dashboard.*``: the Grafana dashboard (manifests/dashboards) as a ConfigMap for Grafana's sidecar;
* ``webDashboard.*``: the kustomize component ``manifests/components/web-dashboard`` (the web
  dashboard installed in the cluster) as templates (``testenv/chart_web.py``), its page's peers
  ``networkPolicy.webDashboard``.

The default values are read from the manifests too (the image, replicas, resources and the
configuration file), so changing ``manifests/`` and running ``make chart`` is the whole workflow.
Before the chart, ``make chart`` refills the generated job-kind blocks of ``manifests/`` from the
adapter registry (``testenv/kinds.py``), so a new job kind reaches both with no hand edit.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import yaml

from testenv import binaries, chart_web, components, kinds, system
from testenv.chart_files import (
    CERT_MANAGER,
    CONFIG_MAP,
    DASHBOARD_TEMPLATE,
    HELPERS,
    NOTES,
    POD_EMPTY,
    POD_VALUES,
    SERVICE_MONITOR,
    schema,
    split_image,
    values_yaml,
)

ROOT = binaries.PROJECT_ROOT
CHART: Final = ROOT / "charts" / "koord-queue"
DASHBOARD: Final = ROOT / "manifests" / "dashboards" / "koord-queue.json"
NAMESPACE: Final = "koord-queue"
DEPLOYMENTS: Final = {"koord-queue-reconciler": "reconciler", "koord-queue-webhook": "webhook"}

Obj = dict[str, Any]


class ChartError(RuntimeError):
    """The manifests do not have the shape the generator substitutes values into."""


def _token(name: str) -> str:
    return f"__KQ_{name.upper()}__"


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
    pod = spec["template"]["spec"]
    for value, key in POD_VALUES.items():
        found[value] = pod.pop(key, POD_EMPTY[value])
    pod[_token(f"{component}_pod")] = "x"
    found["securityContext"] = container.get("securityContext", {})
    spec["replicas"] = _token(f"{component}_replicas")
    spec["template"]["metadata"].setdefault("annotations", {})[CHECKSUM] = _token("checksum")
    container["image"] = _token("image")
    container["imagePullPolicy"] = _token("pull_policy")
    container["resources"] = _token(f"{component}_resources")
    container["securityContext"] = _token(f"{component}_security_context")
    container.setdefault("args", []).append(_token(f"{component}_extra_args"))
    return found


#: The pod template annotation carrying the configuration's hash: a change of ``config.*`` changes
#: both pod templates, so ``helm upgrade`` rolls the reconciler (which reads the file only at start)
#: and the webhook. kustomize has no such annotation; the test compares without it.
CHECKSUM: Final = "checksum/config"


def _pod_values(text: str, component: str) -> str:
    """The pod-spec token -> each pod value, rendered only when set."""
    pattern = re.compile(rf"^(?P<indent> *){re.escape(_token(component + '_pod'))}: x$", re.M)
    match = pattern.search(text)
    if match is None:
        raise ChartError(f"the pod token of {component} not found")
    indent = match["indent"]
    lines: list[str] = []
    for value, key in POD_VALUES.items():
        lines.append(f"{{{{- with .Values.{component}.{value} }}}}")
        if value == "priorityClassName":
            lines.append(f"{key}: {{{{ . | quote }}}}")
        else:
            lines += [f"{key}:", f"  {{{{- toYaml . | nindent {len(indent) + 2} }}}}"]
        lines.append("{{- end }}")
    return pattern.sub("\n".join(indent + line for line in lines), text)


NS_TOKEN: Final = "__KQ_NAMESPACE__"


def _follow_namespace(node: Any) -> Any:
    """Every place the manifests name their own namespace -> a token for ``.Release.Namespace``:
    ``namespace:`` fields (objects, subjects, services, paramRefs), the ServiceAccount usernames in
    CEL expressions and flags, and the namespace lists of ``kubernetes.io/metadata.name``
    selectors (the component's namespace is never a managed one); the same walk the local system
    uses to install in another namespace (``system.in_namespace``)."""
    return system.in_namespace(node, NS_TOKEN)


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
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Namespace" and name == NAMESPACE:
        obj = {**obj, "metadata": {**obj["metadata"], "name": NS_TOKEN}}
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        if "annotations" in obj["metadata"]:
            raise ChartError(f"{kind}: the cert-manager annotation would replace its annotations")
        obj = {**obj, "metadata": {**obj["metadata"], _token("inject"): "x"}}
    obj = _follow_namespace(obj)
    text = _escape(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1 << 16))
    if kind == "Deployment" and name in DEPLOYMENTS:
        component = DEPLOYMENTS[name]
        text = text.replace(_token(f"{component}_replicas"), f"{{{{ .Values.{component}.replicas }}}}")
        text = text.replace(_token("image"), '"{{ .Values.image.repository }}:{{ .Values.image.tag }}"')
        text = text.replace(_token("pull_policy"), "{{ .Values.image.pullPolicy }}")
        text = _block(
            text, _token(f"{component}_resources"), "resources", f"toYaml .Values.{component}.resources"
        )
        text = _block(
            text,
            _token(f"{component}_security_context"),
            "securityContext",
            f"toYaml .Values.{component}.securityContext",
        )
        text = _args(text, _token(f"{component}_extra_args"), EXTRA_ARGS[component])
        text = _pod_values(text, component)
        text = text.replace(_token("checksum"), '{{ include "koord-queue.config" . | sha256sum | quote }}')
        if component == "reconciler":
            text = _args(text, "--manage-webhook-certs", MANAGE_WEBHOOK_CERTS)
        if component == "webhook":
            text = _client_ca_volume(text)
    if kind == "ConfigMap" and name == CONFIG_MAP:
        text = _block(text, _token("config"), "config.yaml", 'include "koord-queue.config" .')
        text = text.replace("config.yaml:\n", "config.yaml: |\n", 1)
    if kind == "Namespace":
        text = "{{- if .Values.namespace.create }}\n" + text + "{{- end }}\n"
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        pattern = re.compile(rf"^(?P<indent> *){re.escape(_token('inject'))}: x$", re.M)
        match = pattern.search(text)
        if match is None:
            raise ChartError(f"{kind}: the cert-manager token not found")
        lines = [
            "{{- if .Values.certManager.enabled }}",
            "annotations:",
            "  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/koord-queue-webhook-cert",
            "{{- end }}",
        ]
        text = pattern.sub("\n".join(match["indent"] + line for line in lines), text)
        text += _unlabelled_webhook(obj)
    text = text.replace(NS_TOKEN, "{{ .Release.Namespace }}")
    return text


#: With cert-manager serving the webhook's certificate, the reconciler leaves it alone.
MANAGE_WEBHOOK_CERTS: Final = [
    "{{- if not .Values.certManager.enabled }}",
    "- --manage-webhook-certs",
    "{{- end }}",
]


#: The namespace selector of the webhook for unlabelled jobs: never kube-system or koord-queue
#: (docs/architecture.md#decision-6-a-stateless-scoped-webhook), and the namespaces the values select.
_SELECTED: Final = """\
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
      - kube-system
      - {{ .Release.Namespace }}
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


def _crd_template(crd: Obj) -> str:
    """A CRD as a template behind ``crds.install``: Helm upgrades templates, never ``crds/``; the
    keep policy leaves the CRD (and every object of its kind) in place on ``helm uninstall``."""
    meta = crd["metadata"]
    annotations = {**meta.get("annotations", {}), "helm.sh/resource-policy": "keep"}
    crd = {**crd, "metadata": {**meta, "annotations": annotations}}
    text = _escape(yaml.safe_dump(crd, sort_keys=False, default_flow_style=False, width=1 << 16))
    return "{{- if .Values.crds.install }}\n" + text + "{{- end }}\n"


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
            if DEPLOYMENTS[name] == "webhook":
                defaults["metricsClientCA"] = _client_ca_values(obj)
        if kind == "ConfigMap" and name == CONFIG_MAP:
            config = yaml.safe_load(obj["data"]["config.yaml"]) or {}
            obj["data"]["config.yaml"] = _token("config")
        filename = f"{kind.lower()}-{name.replace('.', '-')}.yaml"
        if filename in templates:
            raise ChartError(f"two objects map to {filename}")
        templates[filename] = _template(obj)
    policies, defaults["networkPolicy"] = _network_policies()
    templates.update(policies)
    web, defaults["webDashboard"] = chart_web.templates(_template, _block, _args)
    templates.update(web)
    if (
        set(defaults) - {"metricsClientCA", "networkPolicy", "webDashboard"} != set(DEPLOYMENTS.values())
        or not config
    ):
        raise ChartError("manifests/ lacks a Deployment or the ConfigMap the chart substitutes into")
    images = {defaults[component]["image"] for component in DEPLOYMENTS.values()}
    if len(images) != 1:
        raise ChartError(f"the Deployments use different images: {sorted(images)}")
    _, tag = split_image(images.pop())
    if out.exists():
        shutil.rmtree(out)
    (out / "templates" / "crds").mkdir(parents=True)
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
    (out / "values.yaml").write_text(values_yaml(defaults, config))
    (out / "values.schema.json").write_text(json.dumps(schema(), indent=2) + "\n")
    header = "# Generated by `make chart` (testenv/chart.py) from manifests/: edit those, not this.\n"
    for filename, text in sorted(templates.items()):
        (out / "templates" / filename).write_text(header + text)
    for crd in crds:
        name = crd["metadata"]["name"]
        (out / "templates" / "crds" / f"{name}.yaml").write_text(header + _crd_template(crd))
    (out / "templates" / "cert-manager.yaml").write_text(CERT_MANAGER)
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


# --- docs/operations.md#metrics: the CA of the webhook's scrapers ----------------------------------

CLIENT_CA_VOLUME: Final = "metrics-client-ca"


def _client_ca_values(deployment: Obj) -> dict[str, Any]:
    """The defaults of ``metrics.clientCA`` (the webhook's ConfigMap volume of the scrapers' CA),
    leaving a token where the volume's source goes."""
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    index = next((i for i, v in enumerate(volumes) if v["name"] == CLIENT_CA_VOLUME), None)
    if index is None:
        raise ChartError(f"the webhook has no volume {CLIENT_CA_VOLUME}")
    source = volumes[index]["configMap"]
    volumes[index] = {"name": CLIENT_CA_VOLUME, _token("client_ca"): "x"}
    return {"configMap": source["name"], "secret": "", "key": source["items"][0]["key"]}


#: The volume's source: the ConfigMap of the values, or a Secret when one is named.
_CLIENT_CA_SOURCE: Final = [
    "{{- if .Values.metrics.clientCA.secret }}",
    "secret:",
    "  secretName: {{ .Values.metrics.clientCA.secret }}",
    "  optional: true",
    "  items:",
    "  - key: {{ .Values.metrics.clientCA.key }}",
    "    path: ca.crt",
    "{{- else }}",
    "configMap:",
    "  name: {{ .Values.metrics.clientCA.configMap }}",
    "  optional: true",
    "  items:",
    "  - key: {{ .Values.metrics.clientCA.key }}",
    "    path: ca.crt",
    "{{- end }}",
]


def _client_ca_volume(text: str) -> str:
    pattern = re.compile(rf"^(?P<indent> *){re.escape(_token('client_ca'))}: x$", re.M)
    match = pattern.search(text)
    if match is None:
        raise ChartError("the client CA token of the webhook not found")
    return pattern.sub("\n".join(match["indent"] + line for line in _CLIENT_CA_SOURCE), text)


# --- docs/operations.md#network-policies: the opt-in component as templates ------------------------

#: The named ports the API server dials (the rules whose peers are ``networkPolicy.apiServer``), the
#: metrics port (``networkPolicy.metrics``) and the web dashboard's page (``networkPolicy.webDashboard``).
#: An egress rule (the web dashboard's, to the API server) takes ``networkPolicy.apiServer`` too.
_PEERS: Final = {
    "webhook": "apiServer",
    "visibility": "apiServer",
    "metrics": "metrics",
    "http": "webDashboard",
}


def _network_policies() -> tuple[dict[str, str], dict[str, Any]]:
    """The component's NetworkPolicies as templates behind ``networkPolicy.enabled``, their peers
    replaced by the values, and the values' defaults (the component's own peers)."""
    found: dict[str, Any] = {}
    templates: dict[str, str] = {}
    for policy in components.network_policies():
        for rule in policy["spec"]["ingress"]:
            names = {str(p["port"]) for p in rule.get("ports", [])}
            value = {_PEERS[n] for n in names if n in _PEERS}
            if len(value) > 1:
                raise ChartError(f"{policy['metadata']['name']}: a rule mixes peers of {sorted(value)}")
            if not value:
                continue
            (which,) = value
            if found.setdefault(which, rule["from"]) != rule["from"]:
                raise ChartError(f"{policy['metadata']['name']}: the {which} peers differ between policies")
            rule["from"] = _token(f"peers_{which}")
        for rule in policy["spec"].get("egress", []):
            if found.setdefault("apiServer", rule["to"]) != rule["to"]:
                raise ChartError(
                    f"{policy['metadata']['name']}: its egress peers differ from the API server's"
                )
            rule["to"] = _token("peers_apiServer")
        text = _template(policy)
        for which in set(_PEERS.values()):
            pattern = re.compile(
                rf"^(?P<indent> *)(?P<dash>- )?(?P<key>from|to): {re.escape(_token(f'peers_{which}'))}$", re.M
            )

            def peers(match: re.Match[str], which: str = which) -> str:
                indent, dash, key = match["indent"], match["dash"] or "", match["key"]
                depth = len(indent) + len(dash) + 2
                values = f"toYaml .Values.networkPolicy.{which}"
                return f"{indent}{dash}{key}:\n{' ' * depth}{{{{- {values} | nindent {depth} }}}}"

            text = pattern.sub(peers, text)
        name = policy["metadata"]["name"]
        templates[f"networkpolicy-{name}.yaml"] = (
            "{{- if .Values.networkPolicy.enabled }}\n" + text + "{{- end }}\n"
        )
    if set(found) != set(_PEERS.values()):
        raise ChartError(f"the network policies lack peers for {sorted(set(_PEERS.values()) - set(found))}")
    return templates, found


if __name__ == "__main__":
    main()

"""``make chart``: the opt-in web dashboard (manifests/components/web-dashboard) as chart templates
behind ``webDashboard.enabled`` (docs/dashboard.md#installed-in-the-cluster).

As for the network policies, the component's objects are rendered the way an overlay would render
them (``testenv/components.py``) and become templates with values put in at known places; with
``webDashboard.enabled=true`` and the other values at their defaults, ``helm template`` gives
exactly the objects the component adds (tests/integration/test_chart.py). The values reach:

* the image: ``image.*``, the one image of the chart;
* ``webDashboard.resources``, ``webDashboard.sessionIdleTimeout`` and ``webDashboard.maxSessions``
  (the flags ``--session-idle-timeout`` and ``--max-sessions``), ``webDashboard.extraArgs``;
* ``webDashboard.service.type`` (ClusterIP: reached with ``kubectl port-forward`` or a proxy).

The defaults are read from the component, as the other values are read from the manifests.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from testenv import components

Obj = dict[str, Any]
NAME: Final = "koord-queue-web-dashboard"
#: flag -> the value it comes from, and how the template writes it
FLAGS: Final = {
    "--session-idle-timeout": ("sessionIdleTimeout", "{{ .Values.webDashboard.sessionIdleTimeout }}"),
    "--max-sessions": ("maxSessions", "{{ int64 .Values.webDashboard.maxSessions }}"),
}


class WebDashboardError(RuntimeError):
    """The component does not have the shape the generator substitutes values into."""


def _token(name: str) -> str:
    return f"__KQ_WEB_{name.upper()}__"


def own_objects() -> list[Obj]:
    """The objects the component adds to the install."""
    base = {(o["kind"], o["metadata"]["name"]) for o in components.rendered([])}
    return [
        o
        for o in components.rendered([components.WEB_DASHBOARD])
        if (o["kind"], o["metadata"]["name"]) not in base
    ]


def _deployment(obj: Obj) -> dict[str, Any]:
    """The Deployment's defaults out, tokens in."""
    container = obj["spec"]["template"]["spec"]["containers"][0]
    found: dict[str, Any] = {"resources": container["resources"]}
    container["image"] = _token("image")
    container["imagePullPolicy"] = _token("pull_policy")
    container["resources"] = _token("resources")
    args: list[str] = []
    for arg in container["args"]:
        flag, _, value = str(arg).partition("=")
        if flag in FLAGS:
            name, _ = FLAGS[flag]
            found[name] = int(value) if name == "maxSessions" else value
            args.append(f"{flag}={_token(name)}")
        else:
            args.append(arg)
    if not all(name in found for name, _ in FLAGS.values()):
        raise WebDashboardError(f"{NAME} lacks one of the flags {sorted(FLAGS)}")
    container["args"] = [*args, _token("extra_args")]
    return found


#: ``(text, token, key, expression) -> text``: the chart's block of YAML for a token (``chart._block``).
Block = Callable[[str, str, str, str], str]
#: ``(text, token, lines) -> text``: the chart's list items for a token (``chart._args``).
Args = Callable[[str, str, list[str]], str]


def templates(
    template: Callable[[Obj], str], block: Block, args: Args
) -> tuple[dict[str, str], dict[str, Any]]:
    """The component's objects as templates (``template``: the chart's own rendering of one
    object; ``block`` and ``args``: its helpers for YAML blocks and list items, passed in because
    the chart's module imports this one) behind ``webDashboard.enabled``, and the values' defaults."""
    out: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    for obj in own_objects():
        kind = obj["kind"]
        if kind == "Deployment":
            defaults.update(_deployment(obj))
        if kind == "Service":
            defaults["service"] = {"type": obj["spec"]["type"]}
            obj["spec"]["type"] = _token("service_type")
        text = template(obj)
        if kind == "Deployment":
            text = text.replace(_token("image"), '"{{ .Values.image.repository }}:{{ .Values.image.tag }}"')
            text = text.replace(_token("pull_policy"), "{{ .Values.image.pullPolicy }}")
            text = block(text, _token("resources"), "resources", "toYaml .Values.webDashboard.resources")
            for name, expr in FLAGS.values():
                text = text.replace(_token(name), expr)
            text = args(
                text,
                _token("extra_args"),
                ["{{- range .Values.webDashboard.extraArgs }}", "- {{ . | quote }}", "{{- end }}"],
            )
        text = text.replace(_token("service_type"), "{{ .Values.webDashboard.service.type }}")
        if re.search(r"__KQ_WEB_", text):
            raise WebDashboardError(f"{kind} {NAME}: a token was not replaced")
        out[f"{kind.lower()}-{obj['metadata']['name']}.yaml"] = (
            "{{- if .Values.webDashboard.enabled }}\n" + text + "{{- end }}\n"
        )
    if {"resources", "service"} - set(defaults) or len(out) != 3:
        raise WebDashboardError("the web-dashboard component lacks its Deployment, Service or ServiceAccount")
    return out, defaults


def values(defaults: dict[str, Any], block: Callable[[Any, int], str]) -> str:
    """The ``webDashboard:`` section of values.yaml."""
    return f"""\
webDashboard:
  # The web dashboard installed in the cluster (docs/dashboard.md#installed-in-the-cluster; the
  # kustomize component manifests/components/web-dashboard). It has no identity of its own: every
  # request acts with its caller's token (the login page, or an Authorization header from an
  # authenticating proxy). Reach it with
  #   kubectl -n <namespace> port-forward svc/koord-queue-web-dashboard 8080
  enabled: false
  resources:
{block(defaults["resources"], 4)}
  # A session unused this long is closed with its client and its watch.
  sessionIdleTimeout: {defaults["sessionIdleTimeout"]}
  # Sessions at once (each keeps one user's queue store); a caller beyond them gets 503.
  maxSessions: {defaults["maxSessions"]}
  # More flags (koord-queue-dashboard --help), e.g. ["--tls-cert-file=..."].
  extraArgs: []
  service:
    type: {defaults["service"]["type"]}
"""


def schema() -> dict[str, Any]:
    """The ``webDashboard`` part of values.schema.json."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "resources": {"type": "object"},
            "sessionIdleTimeout": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?[smh]?$"},
            "maxSessions": {"type": "integer", "minimum": 1},
            "extraArgs": {"type": "array", "items": {"type": "string"}},
            "service": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"type": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]}},
            },
        },
    }

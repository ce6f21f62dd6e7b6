"""kwok configuration and fake nodes for the e2e profile.

kwok plays the kubelet: it marks fake nodes Ready and keeps their leases fresh, and moves pods that the
real scheduler bound to those nodes through Running to Succeeded. It refuses to start without Stage
objects, so the launcher writes them here. Pods of a Job complete after ``pod_duration_s`` seconds; a
pod may override that with the annotation ``pod-complete.stage.kwok.x-k8s.io/delay`` (for example
``"1h"`` for a pod that must keep running during a test). Pods that no Job owns run until deleted.
"""

from __future__ import annotations

from typing import Any

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
COMPLETE_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"

_NODE_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
"""

_NODE_INIT_EXTRA = """\
allocatable:
{{ with .status.allocatable }}
{{ YAML . 1 }}
{{ else }}
  cpu: "8"
  memory: 32Gi
  pods: "110"
{{ end }}
capacity:
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ else }}
  cpu: "8"
  memory: 32Gi
  pods: "110"
{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: kwok
  containerRuntimeVersion: kwok
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_SUCCEEDED = """\
{{ $now := Now }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""


def _stage(
    name: str,
    kind: str,
    selector: list[dict[str, Any]],
    nxt: dict[str, Any],
    delay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": nxt,
    }
    if delay is not None:
        spec["delay"] = delay
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages(*, pod_duration_s: float) -> list[dict[str, Any]]:
    """The Stage objects kwok runs: node init and heartbeat, pod ready, pod complete, pod delete."""
    not_ready = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    ready = {**not_ready, "operator": "In"}
    alive = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    return [
        _stage("node-initialize", "Node", [not_ready], {"statusTemplate": _NODE_STATUS + _NODE_INIT_EXTRA}),
        _stage(
            "node-heartbeat-with-lease",
            "Node",
            [{"key": ".status.phase", "operator": "In", "values": ["Running"]}, ready],
            {"statusTemplate": _NODE_STATUS},
            delay={"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000},
        ),
        _stage(
            "pod-ready",
            "Pod",
            [alive, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}, not_ready],
            {"statusTemplate": _POD_RUNNING},
        ),
        _stage(
            "pod-complete",
            "Pod",
            [
                alive,
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
            ],
            {"statusTemplate": _POD_SUCCEEDED},
            delay={
                "durationMilliseconds": int(pod_duration_s * 1000),
                "durationFrom": {"expressionFrom": f'.metadata.annotations["{COMPLETE_DELAY_ANNOTATION}"]'},
            },
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"delete": True},
        ),
    ]


def node(name: str, *, cpu: str, memory: str, pods: str = "110") -> dict[str, Any]:
    """A fake Node managed by kwok (selected by annotation), with explicit capacity."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }

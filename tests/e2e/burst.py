"""Shared by the fault tests (restart, leader hand-over): a burst of single-pod Jobs over a few
quotas, and the replay of every recorded QueueUnit version that checks the invariants.

The replay walks the versions in etcd order (``kube.Recorder``) and keeps the latest version of
every unit: at each step the usage of every quota (admitted replicas x 1 CPU) must stay within its
``max``, and a unit's admitted replicas may go from 0 to positive only once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from koord_queue.shared.api import names
from testenv.cluster import LocalCluster
from tests import kube

NAMESPACE = "burst"
QUOTAS = ("burst-a", "burst-b", "burst-c")
QUOTA_CPU = 4


def job(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"job-{i:03d}",
            "namespace": NAMESPACE,
            "labels": {names.QUOTA_NAME_LABEL: QUOTAS[i % len(QUOTAS)]},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            },
        },
    }


def create_quotas(cluster: LocalCluster) -> None:
    kube.kubectl(cluster, "create", "namespace", NAMESPACE)
    for quota in QUOTAS:
        kube.apply_quota(cluster, quota, NAMESPACE, cpu=str(QUOTA_CPU))


def admitted(obj: dict[str, Any]) -> int:
    return sum(int(a.get("replicas", 0)) for a in (obj.get("status") or {}).get("admissions") or [])


@dataclass
class Replay:
    admissions: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def twice(self) -> dict[str, int]:
        return {n: c for n, c in self.admissions.items() if c != 1}


def replay(seen: list[tuple[str, dict[str, Any]]]) -> Replay:
    result = Replay()
    current: dict[str, dict[str, Any]] = {}
    for kind, obj in seen:
        name = obj["metadata"]["name"]
        before = admitted(current[name]) if name in current else 0
        if kind == "DELETED":
            current.pop(name, None)
            continue
        current[name] = obj
        if before == 0 and admitted(obj) > 0:
            result.admissions[name] = result.admissions.get(name, 0) + 1
        usage: dict[str, int] = {}
        for unit in current.values():
            quota = unit["metadata"]["labels"][names.QUOTA_NAME_LABEL]
            usage[quota] = usage.get(quota, 0) + admitted(unit)
        result.violations += [f"{q} at {u} CPU after {name}" for q, u in usage.items() if u > QUOTA_CPU]
    return result


async def service_account_ready(api: Any) -> bool:
    from kubernetes_asyncio import client as k8s

    accounts = await k8s.CoreV1Api(api).list_namespaced_service_account(NAMESPACE)
    return any(a.metadata.name == "default" for a in accounts.items)

"""The e2e control plane is real: an ordinary, unmanaged Job runs to completion on kwok nodes
through the real Job controller and scheduler, and the fake nodes are Ready."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client as k8s

from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e


async def test_fake_nodes_are_ready(e2e_cluster: LocalCluster) -> None:
    out = kube.kubectl(e2e_cluster, "get", "nodes", "--no-headers").stdout
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) == e2e_cluster.nodes
    assert all(row[1] == "Ready" for row in rows), out


async def test_an_unmanaged_job_runs_to_completion(e2e_cluster: LocalCluster, namespace_in: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "plain"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
                    ],
                }
            },
        },
    }
    async with kube.client(e2e_cluster) as api:
        await kube.eventually(
            lambda: _default_service_account(api, namespace_in), what="default ServiceAccount"
        )
        await k8s.BatchV1Api(api).create_namespaced_job(namespace_in, job)

        async def completed() -> bool:
            got = await k8s.BatchV1Api(api).read_namespaced_job_status("plain", namespace_in)
            return bool(
                got.status.succeeded == 2
                and any(c.type == "Complete" and c.status == "True" for c in got.status.conditions or [])
            )

        await kube.eventually(completed, timeout=90, what="Job plain Complete")
        pods = await k8s.CoreV1Api(api).list_namespaced_pod(namespace_in)
    assert len(pods.items) >= 2
    assert all(p.spec.node_name and p.spec.node_name.startswith("kwok-node-") for p in pods.items)
    assert all(p.status.phase == "Succeeded" for p in pods.items)


async def _default_service_account(api: k8s.ApiClient, namespace: str) -> bool:
    accounts = await k8s.CoreV1Api(api).list_namespaced_service_account(namespace)
    return any(a.metadata.name == "default" for a in accounts.items)

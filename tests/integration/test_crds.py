"""Our CRDs installed into the real apiserver: schemas accept what the API promises, reject what it
forbids, and the real kubectl prints the compatible columns."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration


def queue_unit(name: str, *, cpu: str = "1", count: int = 1, min_count: int | None = None) -> dict:
    pod_set: dict = {
        "name": "main",
        "count": count,
        "template": {
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]
            }
        },
    }
    if min_count is not None:
        pod_set["minCount"] = min_count
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: "team-a"}},
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
            "priority": 7,
            "resource": {"cpu": cpu},
            "request": {"cpu": cpu},
            "podSet": [pod_set],
        },
    }


async def test_kubectl_get_queueunit_prints_the_compatible_columns(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    async with kube.client(integration_cluster) as api:
        objects = kube.custom(api)
        await objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace_in, names.QUEUEUNIT_PLURAL, queue_unit("train-1")
        )
        await objects.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            namespace_in,
            names.QUEUEUNIT_PLURAL,
            "train-1",
            {
                "status": {
                    "phase": "Dequeued",
                    "message": names.Message.DEQUEUED,
                    "admissions": [{"name": "main", "replicas": 1, "running": 0}],
                }
            },
            _content_type="application/merge-patch+json",
        )

    for resource in ("queueunit", "qu", "qus", "queueunits.scheduling.x-k8s.io"):
        out = kube.kubectl(integration_cluster, "get", resource, "-n", namespace_in).stdout
        header, row = out.splitlines()[:2]
        assert header.split()[:5] == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE"], out
        cells = row.split()
        assert cells[0] == "train-1"
        assert cells[1] == "Dequeued"
        assert cells[2] == "7"
        assert '"replicas":1' in cells[3]
        assert cells[4] == "Job"

    wide = kube.kubectl(integration_cluster, "get", "qu", "-n", namespace_in, "-o", "wide").stdout
    assert "QUEUE" in wide.splitlines()[0]
    assert "MESSAGE" in wide.splitlines()[0]
    assert names.Message.DEQUEUED.split()[0] in wide


async def test_the_schema_rejects_min_count_above_count(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    async with kube.client(integration_cluster) as api:
        with pytest.raises(k8s.ApiException) as err:
            await kube.custom(api).create_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                namespace_in,
                names.QUEUEUNIT_PLURAL,
                queue_unit("bad", count=1, min_count=2),
            )
    assert err.value.status == 422
    assert "minCount should be positive and less or equal to count" in str(err.value.body)


async def test_the_schema_rejects_more_than_eight_pod_sets(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    unit = queue_unit("many")
    template = unit["spec"]["podSet"][0]
    unit["spec"]["podSet"] = [{**template, "name": f"p{i}"} for i in range(9)]
    async with kube.client(integration_cluster) as api:
        with pytest.raises(k8s.ApiException) as err:
            await kube.custom(api).create_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace_in, names.QUEUEUNIT_PLURAL, unit
            )
    assert err.value.status == 422
    assert "spec.podSet" in str(err.value.body)


async def test_elastic_quota_short_names_and_queue_status_round_trip(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": "team-a", "labels": {names.QUEUE_POLICY_LABEL: "Block"}},
        "spec": {"min": {"cpu": "4", "memory": "8Gi"}, "max": {"cpu": "4", "memory": "8Gi"}},
    }
    queue = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {
            "queuePolicy": "Priority",
            "priority": 1000,
            "admissionChecks": [{"name": "check-1", "labelSelector": {"matchLabels": {"x": "y"}}}],
        },
    }
    async with kube.client(integration_cluster) as api:
        objects = kube.custom(api)
        await objects.create_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, namespace_in, names.QUOTA_PLURAL, quota
        )
        await objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace_in, names.QUEUE_PLURAL, queue
        )
        details = {"active": [{"name": "u", "namespace": "ns", "priority": 3, "position": 1}]}
        await objects.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            namespace_in,
            names.QUEUE_PLURAL,
            "team-a",
            {"status": {"queueItemDetails": details}},
            _content_type="application/merge-patch+json",
        )
        stored = await kube.get_custom(
            api, names.GROUP, names.VERSION, namespace_in, names.QUEUE_PLURAL, "team-a"
        )
    assert stored["status"]["queueItemDetails"] == details
    assert stored["spec"]["admissionChecks"][0]["labelSelector"] == {"matchLabels": {"x": "y"}}
    for short in ("eq", "eqs", "elasticquota"):
        out = kube.kubectl(integration_cluster, "get", short, "-n", namespace_in).stdout
        assert "team-a" in out

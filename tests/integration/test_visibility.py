"""The visibility API answers with the waiting units of a queue in order, and why they wait.

The handler is exercised over HTTP on the reconciler's visibility port. Aggregation through the
kube-apiserver (``kubectl get --raw /apis/visibility.koord-queue.x-k8s.io/...``) needs a Service
whose endpoints the apiserver can dial; Endpoints may not point at loopback, and this machine has
no pod network, so the APIService path itself is covered by the manifest dry-run instead.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from shared import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration


def unit(name: str, quota: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "priority": priority,
            "resource": {"cpu": "1"},
            "request": {"cpu": "1"},
            "podSet": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
                            ]
                        }
                    },
                }
            ],
        },
    }


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/apis/visibility.koord-queue.x-k8s.io/v1alpha1{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def test_visibility_lists_waiting_units_in_order_with_their_reasons(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> None:
    port = next(c.ports["visibility"] for c in system_integration.components if c.name == "reconciler")
    ns, quota = namespace_in, f"vis-{namespace_in}"
    kube.kubectl(
        integration_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": names.QUOTA_API_VERSION,
                "kind": "ElasticQuota",
                "metadata": {"name": quota, "namespace": ns},
                "spec": {"max": {"cpu": "1"}, "min": {"cpu": "1"}},
            }
        ),
    )
    async with kube.client(integration_cluster) as api:
        objects = kube.custom(api)
        await objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, "queueunits", unit("holder", quota, 5)
        )

        async def admitted() -> bool:
            got = await kube.get_custom(api, names.GROUP, names.VERSION, ns, "queueunits", "holder")
            return bool(got.get("status", {}).get("phase") == "Dequeued")

        await kube.eventually(admitted, what="holder admitted")
        for name, priority in (("low", 1), ("high", 10), ("mid", 5)):
            await objects.create_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, "queueunits", unit(name, quota, priority)
            )

    async def three_waiting() -> dict[str, Any] | None:
        status, body = get(port, f"/queues/{quota}/queueunits")
        waiting = [i for i in body.get("items", []) if i.get("message", "").startswith("limited")]
        return body if status == 200 and len(waiting) == 3 else None

    body = await kube.eventually(three_waiting, what="three units waiting with a reason")
    assert body["kind"] == "QueueUnitsSummary"
    assert [(i["metadata"]["name"], i["position"]) for i in body["items"]] == [
        ("high", 1),
        ("mid", 2),
        ("low", 3),
    ]
    first = body["items"][0]
    assert first["priority"] == 10 and first["request"] == {"cpu": "1"} and first["resources"] == {}
    assert first["message"].startswith(f"limited quotaName:{quota}, limited resKey:cpu,")

    status, page = get(port, f"/queues/{quota}/queueunits?offset=1&limit=1")
    assert status == 200 and [i["metadata"]["name"] for i in page["items"]] == ["mid"]
    assert page["metadata"]["total"] == 3

    status, dequeued = get(port, f"/elasticquotas/{quota}/queueunits?phase=Dequeued")
    assert status == 200 and [i["metadata"]["name"] for i in dequeued["items"]] == ["holder"]
    assert dequeued["items"][0]["resources"] == {"cpu": "1"}
    status, everything = get(port, f"/elasticquotas/{quota}/queueunits")
    assert [i["metadata"]["name"] for i in everything["items"]] == ["high", "mid", "low", "holder"]

    status, missing = get(port, "/queues/no-such-queue/queueunits")
    assert status == 404 and missing["reason"] == "NotFound"
    status, _ = get(port, f"/queues/{quota}/queueunits?limit=0")
    assert status == 400
    status, discovery = get(port, "")
    assert {r["name"] for r in discovery["resources"]} == {"queues/queueunits", "elasticquotas/queueunits"}

"""The visibility API answers with the waiting units of a queue in order, and why they wait — through
the kube-apiserver's aggregation layer, as ``kubectl get --raw`` sees it in a cluster.

The session's reconciler runs with ``--manage-visibility-certs`` (``testenv.system.VISIBILITY_ARGS``)
and the manifests' RBAC: it issues the serving certificate into its Secret, reads the requestheader
CA from ``kube-system/extension-apiserver-authentication`` and serves TLS to the front-proxy client
only. The handler tests call it directly as the aggregator would (the cluster's front-proxy client
certificate and ``X-Remote-User``), verifying the server against the CA in the Secret for
``koord-queue-visibility-server.koord-queue.svc``.

The aggregation test registers the manifests' APIService for real. There is no pod network here and
Endpoints may not point at loopback, so the Service behind it is of type ``ExternalName`` with
``externalName: localhost`` and the APIService names the reconciler's port: the aggregator resolves
ExternalName Services to the external name (hence no ``--enable-aggregator-routing`` in
``testenv.cluster``) and still verifies the certificate for ``<service>.<namespace>.svc`` against
the ``caBundle`` the reconciler injected.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from koord_queue.certs import bundle
from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration

GROUP = "visibility.koord-queue.x-k8s.io"
GROUP_VERSION = f"{GROUP}/v1alpha1"
RESOURCES = {"queues/queueunits", "elasticquotas/queueunits", "queueunits", "quotas"}
SERVICE = "koord-queue-visibility-server"
SECRET = "koord-queue-visibility-cert"
APISERVICE = "v1alpha1.visibility.koord-queue.x-k8s.io"
SERVER_NAME = f"{SERVICE}.{names.COMPONENT_NAMESPACE}.svc"


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


@dataclass(frozen=True)
class Visibility:
    """The reconciler's visibility port, called over TLS like the aggregator calls it."""

    port: int
    ca_pem: bytes
    pki: Path

    @property
    def front_proxy(self) -> tuple[Path, Path]:
        return self.pki / "front-proxy-client.crt", self.pki / "front-proxy-client.key"

    @property
    def admin(self) -> tuple[Path, Path]:
        return self.pki / "admin.crt", self.pki / "admin.key"

    async def get(
        self, path: str, *, user: str | None = "alice", cert: tuple[Path, Path] | None = None
    ) -> tuple[int, dict[str, Any]]:
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
        crt, key = cert or self.front_proxy
        ctx.load_cert_chain(crt, key)
        return await self.get_with(ctx, path, user=user)

    async def get_with(
        self, ctx: ssl.SSLContext, path: str, *, user: str | None = "alice"
    ) -> tuple[int, dict[str, Any]]:
        url = f"https://127.0.0.1:{self.port}/apis/{GROUP_VERSION}{path}"
        headers = {"X-Remote-User": user} if user else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                url, ssl=ctx, server_hostname=SERVER_NAME, headers=headers, timeout=aiohttp.ClientTimeout(5)
            ) as resp,
        ):
            return resp.status, json.loads(await resp.read())


async def serving_visibility(cluster: LocalCluster, processes: system.Processes) -> Visibility:
    """The reconciler's visibility server, once the leader has issued the certificate and the
    server has loaded it (either profile: tests/e2e uses it too)."""
    port = next(c.ports["visibility"] for c in processes.components if c.name == "reconciler")
    assert cluster.workdir is not None
    client = await kq.Kube.connect(kubeconfig=str(cluster.kubeconfig))
    try:

        async def issued() -> bytes | None:
            try:
                secret = await client.get(kq.SECRETS, SECRET, namespace=names.COMPONENT_NAMESPACE)
            except kq.NotFound:
                return None
            pair = bundle.from_secret_data(secret["data"])
            return None if pair is None else pair[0].cert_pem

        ca = await kube.eventually(issued, what="the visibility certificate Secret")
    finally:
        await client.close()
    vis = Visibility(port=port, ca_pem=ca, pki=cluster.workdir / "pki")

    async def serving() -> bool:
        try:
            status, _ = await vis.get("")
        except aiohttp.ClientError:
            return False
        return status == 200

    await kube.eventually(serving, what="the visibility server serving the Secret's certificate")
    return vis


@pytest.fixture
async def visibility(integration_cluster: LocalCluster, system_integration: system.Processes) -> Visibility:
    return await serving_visibility(integration_cluster, system_integration)


async def make_waiting_units(cluster: LocalCluster, ns: str, quota: str, waiting: dict[str, int]) -> None:
    """A quota of one cpu, a ``holder`` admitted into it, then ``waiting`` units (name → priority)."""
    kube.apply_quota(cluster, quota, ns, cpu="1")
    async with kube.client(cluster) as api:
        objects = kube.custom(api)
        await objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, "queueunits", unit("holder", quota, 5)
        )

        async def admitted() -> bool:
            got = await kube.get_custom(api, names.GROUP, names.VERSION, ns, "queueunits", "holder")
            return bool(got.get("status", {}).get("phase") == "Dequeued")

        await kube.eventually(admitted, what="holder admitted")
        for name, priority in waiting.items():
            await objects.create_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, "queueunits", unit(name, quota, priority)
            )


async def test_visibility_lists_waiting_units_in_order_with_their_reasons(
    integration_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    ns, quota = namespace_in, f"vis-{namespace_in}"
    await make_waiting_units(integration_cluster, ns, quota, {"low": 1, "high": 10, "mid": 5})

    async def three_waiting() -> dict[str, Any] | None:
        status, body = await visibility.get(f"/queues/{quota}/queueunits")
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

    status, page = await visibility.get(f"/queues/{quota}/queueunits?offset=1&limit=1")
    assert status == 200 and [i["metadata"]["name"] for i in page["items"]] == ["mid"]
    assert page["metadata"]["total"] == 3

    status, dequeued = await visibility.get(f"/elasticquotas/{quota}/queueunits?phase=Dequeued")
    assert status == 200 and [i["metadata"]["name"] for i in dequeued["items"]] == ["holder"]
    assert dequeued["items"][0]["resources"] == {"cpu": "1"}
    status, everything = await visibility.get(f"/elasticquotas/{quota}/queueunits")
    assert [i["metadata"]["name"] for i in everything["items"]] == ["high", "mid", "low", "holder"]

    status, missing = await visibility.get("/queues/no-such-queue/queueunits")
    assert status == 404 and missing["reason"] == "NotFound"
    status, _ = await visibility.get(f"/queues/{quota}/queueunits?limit=0")
    assert status == 400
    status, discovery = await visibility.get("")
    assert {r["name"] for r in discovery["resources"]} == RESOURCES


async def test_a_namespaced_path_answers_only_about_its_namespace_with_positions_in_the_whole_queue(
    integration_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    ns, quota = namespace_in, f"ns-{namespace_in}"
    other = f"{ns}-other"
    await make_waiting_units(integration_cluster, ns, quota, {"mine": 1})
    async with kube.client(integration_cluster) as api:
        await kube.create_namespace(api, other)
        try:
            await kube.custom(api).create_namespaced_custom_object(
                names.GROUP, names.VERSION, other, "queueunits", unit("theirs", quota, 10)
            )

            async def both_waiting() -> list[tuple[str, int]] | None:
                status, body = await visibility.get(f"/queues/{quota}/queueunits")
                items = body.get("items", [])
                found = [(i["metadata"]["name"], i["position"]) for i in items]
                # A unit is listed once queued; its reason only once a cycle has tried it.
                reasons = all(i.get("message") for i in items)
                return found if status == 200 and len(found) == 2 and reasons else None

            waiting = await kube.eventually(both_waiting, what="two units waiting with a reason")
            assert waiting == [("theirs", 1), ("mine", 2)]

            for path in (f"/namespaces/{ns}/queueunits", f"/namespaces/{ns}/queues/{quota}/queueunits"):
                status, body = await visibility.get(path)
                assert status == 200, (path, body)
                assert body["kind"] == "QueueUnitsSummary" and body["metadata"]["total"] == 1, body
                (item,) = body["items"]
                assert (item["metadata"], item["queueName"], item["position"]) == (
                    {"name": "mine", "namespace": ns},
                    quota,
                    2,
                )
                assert item["message"].startswith(f"limited quotaName:{quota}"), item
            status, body = await visibility.get(f"/namespaces/{other}/queues/{quota}/queueunits")
            assert [(i["metadata"]["name"], i["position"]) for i in body["items"]] == [("theirs", 1)]

            status, body = await visibility.get(f"/namespaces/{ns}-nothing/queueunits")
            assert (status, body["items"]) == (200, [])
            status, body = await visibility.get(f"/namespaces/{ns}/queues/no-such-queue/queueunits")
            assert (status, body["reason"]) == (404, "NotFound")
            status, body = await visibility.get("/namespaces/Not_A_Namespace/queueunits")
            assert (status, body["reason"]) == (400, "BadRequest")
        finally:
            await kube.delete_namespace(api, other)


async def test_only_the_front_proxy_client_naming_a_user_is_served(visibility: Visibility) -> None:
    # The cluster's front-proxy client certificate, with a user: served.
    status, _ = await visibility.get("", user="alice")
    assert status == 200
    # The same certificate naming no user: refused by the server (the aggregator always names one).
    status, body = await visibility.get("", user=None)
    assert status == 401 and body["reason"] == "Unauthorized", body
    # A certificate the apiserver trusts for its own clients (cluster admin) is not the aggregator's.
    with pytest.raises(aiohttp.ClientError):
        await visibility.get("", cert=visibility.admin)
    # No client certificate at all: the handshake is refused.
    with pytest.raises(aiohttp.ClientError):
        await visibility.get_with(ssl.create_default_context(cadata=visibility.ca_pem.decode()), "")


#: Content negotiation for the apiserver's aggregated discovery (what kubectl reads by default).
AGGREGATED_DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


async def aggregated_resources(cluster: LocalCluster) -> dict[str, tuple[str, list[str]]] | None:
    """Our group version in ``/apis`` aggregated discovery: resource → (scope, subresources); None
    while it is missing or stale (the apiserver could not fetch or convert our document)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            cluster.server + "/apis",
            ssl=cluster.ssl_context(),
            headers={"Accept": AGGREGATED_DISCOVERY},
            timeout=aiohttp.ClientTimeout(10),
        ) as resp,
    ):
        body = json.loads(await resp.read())
    for group in body.get("items") or []:
        if group["metadata"]["name"] != GROUP:
            continue
        for version in group.get("versions") or []:
            if version["version"] == "v1alpha1" and version.get("freshness", "Current") == "Current":
                return {
                    r["resource"]: (r["scope"], sorted(s["subresource"] for s in r.get("subresources") or []))
                    for r in version.get("resources") or []
                }
    return None


@contextlib.contextmanager
def registered(cluster: LocalCluster, *, port: int) -> Iterator[None]:
    """The manifests' APIService, pointing at an ExternalName Service for localhost:``port``."""
    apiservice = system.register_visibility(cluster, port=port)
    try:
        assert apiservice["metadata"]["name"] == APISERVICE
        assert apiservice["spec"]["service"]["name"] == SERVICE
        assert "caBundle" not in apiservice["spec"]  # the reconciler injects it
        yield
    finally:
        system.unregister_visibility(cluster)


async def available(cluster: LocalCluster) -> dict[str, Any]:
    """The registered APIService once it is Available and carries the reconciler's caBundle."""

    async def probe() -> dict[str, Any] | None:
        obj = json.loads(cluster.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"))
        conditions = obj.get("status", {}).get("conditions") or []
        ok = any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
        # The availability check does not verify the serving certificate; proxied requests do,
        # against the caBundle the reconciler injects: wait for both.
        return obj if ok and obj["spec"].get("caBundle") else None

    result: dict[str, Any] = await kube.eventually(
        probe, timeout=90, interval=0.5, what="APIService Available with a caBundle"
    )
    return result


def raw(cluster: LocalCluster, path: str, *as_user: str) -> subprocess.CompletedProcess[str]:
    return kube.kubectl(cluster, *as_user, "get", "--raw", f"/apis/{GROUP_VERSION}{path}", check=False)


async def test_kubectl_get_raw_reaches_the_visibility_api_through_the_aggregation_layer(
    integration_cluster: LocalCluster, visibility: Visibility, namespace_in: str
) -> None:
    ns, quota = namespace_in, f"agg-{namespace_in}"
    await make_waiting_units(integration_cluster, ns, quota, {"second": 1, "first": 10})

    async def waiting_in_queue() -> dict[str, Any] | None:
        status, body = await visibility.get(f"/queues/{quota}/queueunits")
        return body if status == 200 and len(body.get("items", [])) == 2 else None

    await kube.eventually(waiting_in_queue, what="two units waiting")

    with registered(integration_cluster, port=visibility.port):
        apiservice = await available(integration_cluster)
        # The CA the aggregator trusts is the one the reconciler keeps in the Secret.
        assert apiservice["spec"]["caBundle"] == base64.b64encode(visibility.ca_pem).decode()

        result = raw(integration_cluster, f"/queues/{quota}/queueunits")
        print(f"$ kubectl get --raw /apis/{GROUP_VERSION}/queues/{quota}/queueunits\n{result.stdout}")
        assert result.returncode == 0, result.stderr
        body = json.loads(result.stdout)
        assert body["kind"] == "QueueUnitsSummary" and body["apiVersion"] == GROUP_VERSION
        assert [(i["metadata"]["name"], i["position"]) for i in body["items"]] == [
            ("first", 1),
            ("second", 2),
        ]
        assert [i["metadata"]["name"] for i in body["items"]] == [
            i["metadata"]["name"] for i in (await visibility.get(f"/queues/{quota}/queueunits"))[1]["items"]
        ]

        result = raw(integration_cluster, f"/elasticquotas/{quota}/queueunits?phase=Dequeued")
        assert result.returncode == 0, result.stderr
        assert [i["metadata"]["name"] for i in json.loads(result.stdout)["items"]] == ["holder"]

        discovery = raw(integration_cluster, "")
        assert discovery.returncode == 0, discovery.stderr
        assert {r["name"] for r in json.loads(discovery.stdout)["resources"]} == RESOURCES
        # The apiserver took the document into its aggregated discovery (it refuses one whose
        # scopes disagree), which is what kubectl reads: the namespaced collection is listed.
        aggregated = await kube.eventually(
            lambda: aggregated_resources(integration_cluster),
            what="the visibility group in the apiserver's aggregated discovery",
        )
        assert aggregated == {
            "queues": ("Namespaced", ["queueunits"]),
            "elasticquotas": ("Cluster", ["queueunits"]),
            "queueunits": ("Namespaced", []),
            "quotas": ("Namespaced", []),
        }
        listed = kube.kubectl(integration_cluster, "api-resources", f"--api-group={GROUP}", "--no-headers")
        assert listed.stderr == "" and listed.stdout.split() == [
            "queueunits",
            GROUP_VERSION,
            "true",
            "QueueUnitsSummary",
            "quotas",
            GROUP_VERSION,
            "true",
            "QuotaSummary",
        ], listed
        # Our Status errors pass through the aggregator unchanged.
        missing = raw(integration_cluster, "/queues/no-such-queue/queueunits")
        assert missing.returncode != 0 and "NotFound" in missing.stderr, missing.stderr

        # Authorization is the apiserver's: a user without RBAC on the path never reaches us ...
        denied = raw(integration_cluster, f"/queues/{quota}/queueunits", "--as=visibility-viewer")
        assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
        # ... and one granted get on queues/queueunits does.
        with viewer_role(integration_cluster, "visibility-viewer"):

            async def allowed() -> bool:
                result = raw(integration_cluster, f"/queues/{quota}/queueunits", "--as=visibility-viewer")
                return result.returncode == 0 and len(json.loads(result.stdout)["items"]) == 2

            await kube.eventually(allowed, what="the viewer's RBAC to take effect")


@contextlib.contextmanager
def viewer_role(cluster: LocalCluster, user: str) -> Iterator[None]:
    name = "koord-queue-visibility-viewer-test"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["visibility.koord-queue.x-k8s.io"],
                "resources": ["queues/queueunits", "elasticquotas/queueunits"],
                "verbs": ["get"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    base = "/apis/rbac.authorization.k8s.io/v1"
    cluster.request("POST", f"{base}/clusterroles", role)
    try:
        cluster.request("POST", f"{base}/clusterrolebindings", binding)
        yield
    finally:
        for path in (f"{base}/clusterrolebindings/{name}", f"{base}/clusterroles/{name}"):
            with contextlib.suppress(urllib.error.HTTPError):
                cluster.request("DELETE", path)

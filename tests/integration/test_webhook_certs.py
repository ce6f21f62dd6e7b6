"""The serving-certificate lifecycle against the real apiserver (``certs.manager``).

Webhook: the Secret is created, the CA is injected into both webhook configurations, a second pass
changes nothing, and when rotation is due the serving certificate is reissued under the same CA.
Visibility: the same manager with the APIService as its target; the replicas' reader returns the
pair the Secret holds; a CA rotation keeps the old CA in ``caBundle`` until a pass with nothing due
has passed."""

from __future__ import annotations

import base64
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from koord_queue.certs import bundle, pki
from koord_queue.certs.manager import (
    APISERVICES,
    MUTATING,
    VALIDATING,
    VisibilityCertManager,
    WebhookCertManager,
    read_serving_pair,
)
from koord_queue.shared import kube as kq
from testenv.cluster import LocalCluster

pytestmark = pytest.mark.integration


def configuration(kind: str, name: str) -> dict[str, Any]:
    hook = {
        "name": "jobs.example.koord-queue.x-k8s.io",
        "clientConfig": {
            "service": {
                "name": "koord-queue-webhook",
                "namespace": "certs-test",
                "path": "/mutate",
                "port": 443,
            }
        },
        "rules": [
            {
                "apiGroups": ["example.invalid"],
                "apiVersions": ["v1"],
                "resources": ["nothings"],
                "operations": ["CREATE"],
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook, {**hook, "name": "second.example.koord-queue.x-k8s.io"}],
    }


async def test_the_manager_issues_injects_and_rotates(integration_cluster: LocalCluster) -> None:
    client = await kq.Kube.connect(kubeconfig=str(integration_cluster.kubeconfig))
    name = "koord-queue-certs-test"
    namespace = "certs-test"
    try:
        with contextlib.suppress(kq.Conflict):
            await client.create(
                kq.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        await client.create(MUTATING, configuration("MutatingWebhookConfiguration", name))
        await client.create(VALIDATING, configuration("ValidatingWebhookConfiguration", name))
        manager = WebhookCertManager(client, namespace=namespace, configuration=name)
        now = datetime.now(UTC)

        ca = await manager.sync(now=now)
        secret = await client.get(kq.SECRETS, "koord-queue-webhook-cert", namespace=namespace)
        pair = bundle.from_secret_data(secret["data"])
        assert pair is not None
        assert pair[0].cert_pem == ca.cert_pem
        assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=pair[1].cert_pem)
        assert "koord-queue-webhook.certs-test.svc" in pki.dns_names_of(pair[1].cert_pem)
        for resource in (MUTATING, VALIDATING):
            config = await client.get(resource, name)
            bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
            assert bundles == {base64.b64encode(ca.cert_pem).decode()}

        writes = client.writes
        await manager.sync(now=now + timedelta(minutes=5))
        assert client.writes == writes, "a pass with nothing due writes nothing"

        later = now + timedelta(days=300)  # past two thirds of the serving certificate's year
        rotated_ca = await manager.sync(now=later)
        assert rotated_ca.cert_pem == ca.cert_pem, "the CA is kept, so caBundle stays valid"
        secret = await client.get(kq.SECRETS, "koord-queue-webhook-cert", namespace=namespace)
        rotated = bundle.from_secret_data(secret["data"])
        assert rotated is not None and rotated[1].cert_pem != pair[1].cert_pem
        assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=rotated[1].cert_pem)
    finally:
        for resource in (MUTATING, VALIDATING):
            with contextlib.suppress(kq.KubeError):
                await client.delete(resource, name)
        await client.close()


async def test_the_visibility_manager_injects_the_apiservice_and_rotates_the_ca_softly(
    integration_cluster: LocalCluster,
) -> None:
    client = await kq.Kube.connect(kubeconfig=str(integration_cluster.kubeconfig))
    namespace = "certs-test"
    # Not the real visibility APIService: the session's reconciler manages that one.
    group, version = "certs-test.koord-queue.x-k8s.io", "v1"
    name = f"{version}.{group}"
    try:
        with contextlib.suppress(kq.Conflict):
            await client.create(
                kq.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        await client.create(
            APISERVICES,
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": name},
                "spec": {
                    "group": group,
                    "version": version,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {"name": "nothing", "namespace": namespace, "port": 443},
                },
            },
        )
        manager = VisibilityCertManager(
            client, namespace=namespace, secret="visibility-certs-test", service="vis", apiservice=name
        )
        assert await read_serving_pair(client, namespace=namespace, secret="visibility-certs-test") is None
        now = datetime.now(UTC)

        ca = await manager.sync(now=now)
        apiservice = await client.get(APISERVICES, name)
        assert apiservice["spec"]["caBundle"] == base64.b64encode(ca.cert_pem).decode()
        serving = await read_serving_pair(client, namespace=namespace, secret="visibility-certs-test")
        assert serving is not None
        assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=serving.cert_pem)
        assert "vis.certs-test.svc" in pki.dns_names_of(serving.cert_pem)

        writes = client.writes
        await manager.sync(now=now + timedelta(minutes=1))
        assert client.writes == writes, "a pass with nothing due writes nothing"

        # Past two thirds of the CA's ten years: a new CA, trusted next to the old one for a pass
        # so that replicas still serving the old certificate stay reachable.
        later = now + timedelta(days=2500)
        new_ca = await manager.sync(now=later)
        assert new_ca.cert_pem != ca.cert_pem
        bundle_pem = base64.b64decode((await client.get(APISERVICES, name))["spec"]["caBundle"])
        assert bundle_pem == new_ca.cert_pem + ca.cert_pem
        # The next pass, the first with nothing due, still trusts both; the one after drops the old.
        await manager.sync(now=later + timedelta(minutes=1))
        bundle_pem = base64.b64decode((await client.get(APISERVICES, name))["spec"]["caBundle"])
        assert bundle_pem == new_ca.cert_pem + ca.cert_pem
        await manager.sync(now=later + timedelta(minutes=2))
        bundle_pem = base64.b64decode((await client.get(APISERVICES, name))["spec"]["caBundle"])
        assert bundle_pem == new_ca.cert_pem
    finally:
        with contextlib.suppress(kq.KubeError):
            await client.delete(APISERVICES, name)
        await client.close()

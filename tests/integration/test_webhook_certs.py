"""The webhook certificate lifecycle against the real apiserver: the Secret is created, the CA is
injected into both webhook configurations, a second pass changes nothing, and when rotation is due
the serving certificate is reissued under the same CA."""

from __future__ import annotations

import base64
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from certs import bundle, pki
from certs.manager import MUTATING, VALIDATING, WebhookCertManager
from shared import kube as kq
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

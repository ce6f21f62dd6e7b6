"""Keep the webhook's certificate Secret and the webhook configurations' ``caBundle`` current.

Runs inside the reconciler (the leader), because the webhook itself holds no API credentials
(ARCHITECTURE decision 6). Every ``interval`` it reads the Secret, asks ``certs.bundle`` whether a
new CA or serving certificate is due (missing, wrong names, or two thirds of the validity gone), writes
the Secret when it is, and makes sure both webhook configurations trust the CA. The webhook pods
mount the Secret; the kubelet refreshes the files and the server reloads them without dropping
requests.

During a CA rotation the old CA stays in ``caBundle`` next to the new one until the next pass, so
webhook pods still serving the old certificate are trusted while their mounted files catch up.
Writes are optimistic (resourceVersion); a conflict with another writer is retried on the next pass.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from datetime import UTC, datetime
from typing import Any, Final

from certs import bundle, pki
from shared import kube

log = logging.getLogger(__name__)

MUTATING: Final = kube.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING: Final = kube.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)


class WebhookCertManager:
    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str = "koord-queue",
        secret: str = "koord-queue-webhook-cert",
        service: str = "koord-queue-webhook",
        configuration: str = "koord-queue",
        interval_s: float = 300.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.secret = secret
        self.service = service
        self.configuration = configuration
        self.interval_s = interval_s
        self._previous_ca: bytes | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.sync(now=datetime.now(UTC))
            except kube.KubeError as err:
                log.warning("webhook certificate sync failed (%s); retrying in 10s", err)
                await asyncio.sleep(10)
                continue
            await asyncio.sleep(self.interval_s)

    async def sync(self, *, now: datetime) -> pki.KeyPair:
        """One pass; returns the CA now in force."""
        try:
            secret: dict[str, Any] | None = await self.client.get(
                kube.SECRETS, self.secret, namespace=self.namespace
            )
        except kube.NotFound:
            secret = None
        current = bundle.from_secret_data((secret or {}).get("data") or {})
        names = bundle.webhook_dns_names(self.service, self.namespace)
        planned = bundle.plan_rotation(current=current, dns_names=names, now=now)
        if planned is not None:
            ca, serving = planned
            if current is not None and current[0].cert_pem != ca.cert_pem:
                self._previous_ca = current[0].cert_pem
            await self._write_secret(secret, bundle.secret_data(ca=ca, serving=serving))
            log.info(
                "webhook serving certificate issued for %s (CA %s)",
                names[-1],
                "kept" if current and current[0].cert_pem == ca.cert_pem else "new",
            )
        else:
            assert current is not None
            ca = current[0]
        trusted = ca.cert_pem + (self._previous_ca or b"")
        for resource in (MUTATING, VALIDATING):
            await self._inject(resource, trusted)
        if planned is None:
            self._previous_ca = None  # a full pass under one CA: the old one can go
        return ca

    async def _write_secret(self, existing: dict[str, Any] | None, data: dict[str, str]) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": self.secret,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/part-of": "koord-queue"},
            },
            "data": data,
        }
        if existing is None:
            await self.client.create(kube.SECRETS, body, namespace=self.namespace)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            await self.client.replace(kube.SECRETS, self.secret, body, namespace=self.namespace)

    async def _inject(self, resource: kube.Resource, ca_pem: bytes) -> None:
        try:
            config = await self.client.get(resource, self.configuration)
        except kube.NotFound:
            return  # not installed (yet): nothing to trust
        encoded = base64.b64encode(ca_pem).decode()
        webhooks = config.get("webhooks") or []
        patch = [
            {
                "op": "replace" if "caBundle" in (w.get("clientConfig") or {}) else "add",
                "path": f"/webhooks/{i}/clientConfig/caBundle",
                "value": encoded,
            }
            for i, w in enumerate(webhooks)
            if (w.get("clientConfig") or {}).get("caBundle") != encoded
        ]
        if not patch:
            return
        patch.insert(
            0,
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": config["metadata"]["resourceVersion"],
            },
        )
        await self.client.patch(resource, self.configuration, patch, content_type=kube.JSON_PATCH)

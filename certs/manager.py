"""Keep a serving certificate's Secret current and make the API server trust its CA.

Two servers of ours are dialled by the kube-apiserver over TLS: the admission webhook (trusted through
the ``caBundle`` of both webhook configurations) and the reconciler's visibility API behind the
aggregation layer (trusted through the APIService's ``spec.caBundle``). One ``ServingCertManager`` per
server runs inside the reconciler (the leader), because the webhook itself holds no API credentials
(docs/architecture.md#decision-6-a-stateless-scoped-webhook). Every ``interval`` it reads the Secret,
asks ``certs.bundle`` whether a new CA or serving certificate is due (missing, wrong names, or two
thirds of the validity gone), writes the Secret when it is, and makes sure every target object trusts
the CA. ``WebhookCertManager`` and ``VisibilityCertManager`` only name the Secret, the Service and the
targets.

How the servers pick up a new pair differs: webhook pods mount the Secret and reload the files the
kubelet refreshes; every reconciler replica reads the Secret with ``read_serving_pair`` and swaps
the pair in memory (``reconciler.visibility``), which needs no volume and so no Secret that must
exist before the pod can start.

During a CA rotation the old CA stays in ``caBundle`` next to the new one until a pass with nothing
due has completed, so servers still presenting the old certificate are trusted while they catch
up. Writes are optimistic (resourceVersion); a conflict with another writer, like any failed API
call, makes the pass run again 10 s later (``shared.retrying.steady``). A target that does not
exist (not installed yet) is skipped and picked up by a later pass.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from tenacity import RetryCallState

from koord_queue.certs import bundle, pki
from koord_queue.shared import kube, retrying

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
APISERVICES: Final = kube.Resource(
    "apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False
)

#: Seconds between two passes: each pass is one GET of the Secret and one per target, so a short
#: interval costs little and re-injects a ``caBundle`` wiped by a re-apply within a minute.
DEFAULT_INTERVAL_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class CATarget:
    """An object that must trust the CA, and how to patch the bundle into it (``certs.bundle``)."""

    resource: kube.Resource
    name: str
    patch: Callable[[Mapping[str, Any], str], list[dict[str, Any]] | None]


class ServingCertManager:
    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str,
        secret: str,
        service: str,
        targets: Sequence[CATarget],
        ca_common_name: str,
        what: str,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.secret = secret
        self.service = service
        self.targets = tuple(targets)
        self.ca_common_name = ca_common_name
        self.what = what
        self.interval_s = interval_s
        self._previous_ca: bytes | None = None

    async def run(self) -> None:
        """A pass every ``interval_s``; a pass the API failed is tried again after 10 s (sooner if
        the interval is shorter)."""
        while True:
            async for attempt in retrying.steady(min(10.0, self.interval_s), self._failed):
                with attempt:
                    await self.sync(now=datetime.now(UTC))
            await asyncio.sleep(self.interval_s)

    def _failed(self, state: RetryCallState) -> None:
        log.warning(
            "%s certificate sync failed (%s); retrying in %gs",
            self.what,
            retrying.failure(state),
            retrying.delay(state),
        )

    async def sync(self, *, now: datetime) -> pki.KeyPair:
        """One pass; returns the CA now in force."""
        try:
            secret: dict[str, Any] | None = await self.client.get(
                kube.SECRETS, self.secret, namespace=self.namespace
            )
        except kube.NotFound:
            secret = None
        current = bundle.from_secret_data((secret or {}).get("data") or {})
        names = bundle.service_dns_names(self.service, self.namespace)
        planned = bundle.plan_rotation(
            current=current, dns_names=names, now=now, ca_common_name=self.ca_common_name
        )
        if planned is not None:
            ca, serving = planned
            if current is not None and current[0].cert_pem != ca.cert_pem:
                self._previous_ca = current[0].cert_pem
            await self._write_secret(secret, bundle.secret_data(ca=ca, serving=serving))
            log.info(
                "%s serving certificate issued for %s (CA %s)",
                self.what,
                names[-1],
                "kept" if current and current[0].cert_pem == ca.cert_pem else "new",
            )
        else:
            assert current is not None
            ca = current[0]
        trusted = base64.b64encode(ca.cert_pem + (self._previous_ca or b"")).decode()
        for target in self.targets:
            await self._inject(target, trusted)
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

    async def _inject(self, target: CATarget, ca_bundle: str) -> None:
        try:
            obj = await self.client.get(target.resource, target.name)
        except kube.NotFound:
            return  # not installed (yet): nothing to trust
        patch = target.patch(obj, ca_bundle)
        if patch is not None:
            await self.client.patch(target.resource, target.name, patch, content_type=kube.JSON_PATCH)
            log.info("CA bundle injected into %s %s", target.resource.kind, target.name)


class WebhookCertManager(ServingCertManager):
    """The webhook's pair in ``secret``; the CA in both webhook configurations ``configuration``."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str = "koord-queue",
        secret: str = "koord-queue-webhook-cert",
        service: str = "koord-queue-webhook",
        configuration: str = "koord-queue",
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        super().__init__(
            client,
            namespace=namespace,
            secret=secret,
            service=service,
            targets=[
                CATarget(MUTATING, configuration, bundle.webhook_ca_patch),
                CATarget(VALIDATING, configuration, bundle.webhook_ca_patch),
            ],
            ca_common_name=bundle.DEFAULT_CA_COMMON_NAME,
            what="webhook",
            interval_s=interval_s,
        )


class VisibilityCertManager(ServingCertManager):
    """The visibility API's pair in ``secret``; the CA in the APIService ``apiservice``."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        namespace: str = "koord-queue",
        secret: str = "koord-queue-visibility-cert",
        service: str = "koord-queue-visibility-server",
        apiservice: str = "v1alpha1.visibility.koord-queue.x-k8s.io",  # <version>.<group>
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        super().__init__(
            client,
            namespace=namespace,
            secret=secret,
            service=service,
            targets=[CATarget(APISERVICES, apiservice, bundle.apiservice_ca_patch)],
            ca_common_name=bundle.VISIBILITY_CA_COMMON_NAME,
            what="visibility",
            interval_s=interval_s,
        )


async def read_serving_pair(client: kube.Kube, *, namespace: str, secret: str) -> pki.KeyPair | None:
    """The serving pair in ``secret`` as the server should present it; None while there is none.

    The pair's chain, names and validity are the manager's concern: a server presents whatever the
    Secret holds, so every replica serves the same certificate the API server was told to trust.
    """
    try:
        obj = await client.get(kube.SECRETS, secret, namespace=namespace)
    except kube.NotFound:
        return None
    current = bundle.from_secret_data(obj.get("data") or {})
    return None if current is None else current[1]

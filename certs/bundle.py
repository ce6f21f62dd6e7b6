"""Pure decisions for the serving certificates the reconciler keeps in a cluster.

Two servers are reached by the kube-apiserver over TLS with a certificate from our own CA: the
admission webhook (trusted through the ``caBundle`` of the webhook configurations) and the
reconciler's visibility API behind the aggregation layer (trusted through the APIService's
``spec.caBundle``). Each keeps its CA and serving pair in one Secret. The I/O around this module
(read the Secret, write it back, inject ``caBundle``, reload the server) lives in
``certs.manager``; here are only the names to certify, the Secret's encoding, the decision whether
to issue anew, and the JSON patches that put a CA bundle into the objects that must trust it.

Secret layout (``type: kubernetes.io/tls``, every value base64 as Secret ``data`` requires):

- ``tls.crt`` / ``tls.key``: the serving certificate and key, the standard ``kubernetes.io/tls`` keys,
  so the Secret can be mounted straight into a pod;
- ``ca.crt``: the CA certificate, the source of ``caBundle``;
- ``ca.key``: the CA key. It is stored because reissuing the serving certificate under the *same* CA
  is what keeps rotation invisible (see ``plan_rotation``); without it every rotation would be a CA
  rotation. OPA's cert-controller, which Kueue uses, stores the same four keys. RBAC on this one
  Secret is what protects it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from koord_queue.certs import pki

CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
TLS_CERT_KEY: Final = "tls.crt"
TLS_KEY_KEY: Final = "tls.key"

DEFAULT_CA_COMMON_NAME: Final = "koord-queue-webhook-ca"
VISIBILITY_CA_COMMON_NAME: Final = "koord-queue-visibility-ca"
#: Kueue's rotator uses the same lifetimes: a CA of ten years, serving certificates of one year.
CA_VALIDITY: Final = timedelta(days=3650)
SERVING_VALIDITY: Final = timedelta(days=365)


def service_dns_names(service: str, namespace: str) -> list[str]:
    """Every name the API server or a user may use to reach a Service, shortest first.

    The API server dials ``<service>.<namespace>.svc`` (for webhooks and for aggregated APIs alike:
    the aggregator sets that TLS server name whatever address it resolved); the others cover
    clients that resolve through search domains or the fully qualified cluster name.
    """
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def secret_data(*, ca: pki.KeyPair, serving: pki.KeyPair) -> dict[str, str]:
    """Encode the CA and serving key pairs as Secret ``data`` (base64 strings)."""
    return {
        CA_CERT_KEY: _encode(ca.cert_pem),
        CA_KEY_KEY: _encode(ca.key_pem),
        TLS_CERT_KEY: _encode(serving.cert_pem),
        TLS_KEY_KEY: _encode(serving.key_pem),
    }


def from_secret_data(data: Mapping[str, str]) -> tuple[pki.KeyPair, pki.KeyPair] | None:
    """Decode (ca, serving) from Secret ``data``; None when a key is missing or anything is invalid.

    Invalid covers bad base64, unparsable PEM, and a key that does not belong to its certificate.
    None is not an error to the caller: it means "issue a fresh pair", which repairs the Secret.
    Whether the serving certificate chains to the CA is left to ``plan_rotation``, which can then
    keep a sound CA.
    """
    try:
        ca = pki.KeyPair(cert_pem=_decode(data[CA_CERT_KEY]), key_pem=_decode(data[CA_KEY_KEY]))
        serving = pki.KeyPair(cert_pem=_decode(data[TLS_CERT_KEY]), key_pem=_decode(data[TLS_KEY_KEY]))
    except (KeyError, ValueError):
        return None
    if not (pki.key_matches_cert(ca) and pki.key_matches_cert(serving)):
        return None
    return ca, serving


def webhook_ca_patch(configuration: Mapping[str, Any], ca_bundle: str) -> list[dict[str, Any]] | None:
    """A JSON patch putting ``ca_bundle`` (base64 PEM) into every webhook of a webhook configuration.

    None when every webhook already carries it (nothing to write). The patch starts with a ``test``
    of ``resourceVersion``, so it applies only to the version it was computed from: webhooks are
    addressed by index, and a concurrent edit could have moved them.
    """
    webhooks = configuration.get("webhooks") or []
    ops: list[dict[str, Any]] = [
        {
            "op": "replace" if "caBundle" in (w.get("clientConfig") or {}) else "add",
            "path": f"/webhooks/{i}/clientConfig/caBundle",
            "value": ca_bundle,
        }
        for i, w in enumerate(webhooks)
        if (w.get("clientConfig") or {}).get("caBundle") != ca_bundle
    ]
    return _guarded(configuration, ops)


def apiservice_ca_patch(apiservice: Mapping[str, Any], ca_bundle: str) -> list[dict[str, Any]] | None:
    """A JSON patch setting an APIService's ``spec.caBundle`` (base64 PEM); None when it is set.

    Also guarded by ``resourceVersion``, like ``webhook_ca_patch``. ``insecureSkipTLSVerify`` is left
    alone: the API server refuses an APIService that has both, and an operator who set it on purpose
    should see that error rather than have it silently cleared.
    """
    spec = apiservice.get("spec") or {}
    if spec.get("caBundle") == ca_bundle:
        return None
    return _guarded(apiservice, [{"op": "add", "path": "/spec/caBundle", "value": ca_bundle}])


def _guarded(obj: Mapping[str, Any], ops: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    if not ops:
        return None
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


def plan_rotation(
    *,
    current: tuple[pki.KeyPair, pki.KeyPair] | None,
    dns_names: Sequence[str],
    now: datetime,
    ca_common_name: str = DEFAULT_CA_COMMON_NAME,
) -> tuple[pki.KeyPair, pki.KeyPair] | None:
    """Decide whether a server needs new certificates at ``now``; return the new (ca, serving).

    Returns None when ``current`` is fine. Otherwise:

    1. No usable CA (missing, not a CA, not self-signed, key mismatch) or the CA itself is due for
       rotation: a new CA and a new serving certificate.
    2. The CA is sound but the serving certificate does not chain to it, lacks one of ``dns_names``,
       or is due for rotation: the *same* CA and a new serving certificate.

    Why keep the CA: the API server verifies the server against ``caBundle``, which is copied into
    the webhook configurations (or the APIService) and may be cached or mid-update. A new serving
    certificate from the same CA is trusted by every configuration already in place, so rotation
    causes no failed requests. A new CA is trusted only once ``caBundle`` has been re-injected, so
    the I/O side should inject the new CA (ideally alongside the old one) before the server
    switches certificates.

    Raises ``ValueError`` if ``dns_names`` is empty (nothing to certify).
    """
    if not dns_names:
        raise ValueError("cannot plan serving certificates: no DNS names were given for the Service")
    if current is None or not _ca_is_sound(current[0], now=now):
        ca = pki.new_ca(common_name=ca_common_name, now=now, valid_for=CA_VALIDITY)
        return ca, _issue_serving(ca=ca, dns_names=dns_names, now=now)
    ca, serving = current
    if _serving_is_sound(ca=ca, serving=serving, dns_names=dns_names, now=now):
        return None
    return ca, _issue_serving(ca=ca, dns_names=dns_names, now=now)


def _ca_is_sound(ca: pki.KeyPair, *, now: datetime) -> bool:
    return (
        pki.key_matches_cert(ca)
        and pki.is_ca(ca.cert_pem)
        and pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=ca.cert_pem)
        and not pki.needs_rotation(ca.cert_pem, now=now)
    )


def _serving_is_sound(
    *, ca: pki.KeyPair, serving: pki.KeyPair, dns_names: Sequence[str], now: datetime
) -> bool:
    return (
        pki.key_matches_cert(serving)
        and pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=serving.cert_pem)
        and set(dns_names) <= pki.dns_names_of(serving.cert_pem)
        and not pki.needs_rotation(serving.cert_pem, now=now)
    )


def _issue_serving(*, ca: pki.KeyPair, dns_names: Sequence[str], now: datetime) -> pki.KeyPair:
    # The common name is informational only (clients match SANs); the first, shortest name reads best.
    return pki.issue_serving(
        ca=ca, common_name=dns_names[0], dns_names=dns_names, now=now, valid_for=SERVING_VALIDITY
    )


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _decode(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        # Re-raised without the original, whose context could echo the value (key material).
        raise ValueError("Secret value is not valid base64") from None

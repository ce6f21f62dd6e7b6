"""Issue and inspect the X.509 material the project needs: a CA, serving and client certificates,
and the service-account signing key.

This is product code on two paths. In a real cluster it issues the admission webhook's serving
certificate (see ``certs.bundle`` for the rotation decision); in tests and demos it builds the local
control plane's PKI (apiserver serving cert, ``system:masters`` admin client cert, webhook cert,
service-account keys). Sharing one module means the certificates the tests exercise are the ones a
cluster gets.

Every issuing function is pure apart from key generation and serial numbers: the clock is the
``now`` parameter, so rotation is testable at any instant and two replicas agree on what "expired"
means for a given time. Only ``write_pem`` touches the file system.

Certificates carry SubjectKeyIdentifier, AuthorityKeyIdentifier, KeyUsage and BasicConstraints
because strict verifiers (Go's crypto/x509, OpenSSL with ``X509_V_FLAG_X509_STRICT``) reject chains
without them. Key material is never logged or put in exception messages.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How far ``not_valid_before`` is moved into the past, so a peer whose clock runs a little behind
#: ours does not reject a certificate issued a moment ago as "not yet valid".
CLOCK_SKEW: Final = timedelta(minutes=5)

_SIGNATURE_HASH: Final = hashes.SHA256()
_RSA_SIGNING_KEY_BITS: Final = 2048
_RSA_PUBLIC_EXPONENT: Final = 65537

_IssuerKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its private key (PKCS8 PEM, unencrypted).

    The key is unencrypted because its consumers (kube-apiserver flags, ``ssl.SSLContext``, a
    ``kubernetes.io/tls`` Secret) take plain PEM; protecting it is the job of file modes and RBAC.
    """

    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:
        # The default dataclass repr would print the private key into any log or traceback.
        return f"KeyPair(cert_pem=<{len(self.cert_pem)} bytes>, key_pem=<redacted>)"


# --- Issuing -----------------------------------------------------------------------------------


def new_ca(*, common_name: str, now: datetime, valid_for: timedelta = timedelta(days=3650)) -> KeyPair:
    """Create a self-signed CA that may sign leaf certificates only (``path_length=0``).

    ``not_valid_before`` is backdated by ``CLOCK_SKEW``; ``not_valid_after`` is ``now + valid_for``.
    """
    now = _utc(now)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, _SIGNATURE_HASH)
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def issue_serving(
    *,
    ca: KeyPair,
    common_name: str,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    now: datetime,
    valid_for: timedelta = timedelta(days=365),
) -> KeyPair:
    """Issue a TLS server certificate for the given DNS names and IP addresses.

    At least one name or address is required: modern verifiers ignore the common name, so a serving
    certificate without a SubjectAlternativeName matches no host at all. The validity never extends
    past the CA's, because a leaf that outlives its issuer cannot be verified anyway.

    Raises ``ValueError`` for an empty name list, an unparsable IP address, or a CA whose key does
    not belong to its certificate.
    """
    if not dns_names and not ip_addresses:
        raise ValueError(
            f"cannot issue serving certificate {common_name!r}: no DNS names or IP addresses were given; "
            "pass at least one, since clients match the host against these and ignore the common name"
        )
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    san.extend(x509.IPAddress(ipaddress.ip_address(address)) for address in ip_addresses)
    return _issue_leaf(
        ca=ca,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=san,
        now=now,
        valid_for=valid_for,
    )


def issue_client(
    *,
    ca: KeyPair,
    common_name: str,
    organizations: Sequence[str] = (),
    now: datetime,
    valid_for: timedelta = timedelta(days=365),
) -> KeyPair:
    """Issue a TLS client certificate; kube-apiserver reads CN as the user and each O as a group.

    For example ``organizations=("system:masters",)`` gives the local control plane's admin user.
    """
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return _issue_leaf(
        ca=ca,
        subject=x509.Name(attributes),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        san=[],
        now=now,
        valid_for=valid_for,
    )


def new_signing_key() -> tuple[bytes, bytes]:
    """Create the service-account token signing key: (private PKCS8 PEM, public SPKI PEM).

    RSA rather than ECDSA because every consumer of service-account tokens (kube-apiserver,
    controller-manager, external OIDC verifiers) accepts RS256, while ES256 support varies.
    """
    key = rsa.generate_private_key(public_exponent=_RSA_PUBLIC_EXPONENT, key_size=_RSA_SIGNING_KEY_BITS)
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public_pem


# --- Inspecting --------------------------------------------------------------------------------


def not_after(cert_pem: bytes) -> datetime:
    """The certificate's expiry as an aware UTC datetime. Raises ``ValueError`` if unparsable."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def needs_rotation(cert_pem: bytes, *, now: datetime, fraction: float = 2 / 3) -> bool:
    """Whether a certificate should be replaced at ``now``.

    True once ``fraction`` of its validity period has elapsed, so a replacement is in place long
    before expiry (a failed rotation then has a third of the lifetime to be retried), when it is not
    yet valid (a peer would reject it), or when it cannot be parsed (nothing usable to keep).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    now = _utc(now)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return True
    return now - start >= (end - start) * fraction


def verify_chain(*, ca_pem: bytes, cert_pem: bytes) -> bool:
    """Whether ``cert_pem`` was signed by the CA in ``ca_pem`` (issuer name and signature).

    Validity dates are not checked here; ``needs_rotation`` owns questions of time.
    """
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches_cert(pair: KeyPair) -> bool:
    """Whether the private key belongs to the certificate (False if either is unparsable).

    A Secret edited by hand, or half-written by a crashed rotation, can pair a certificate with the
    wrong key; TLS would then fail at the first handshake instead of at rotation time.
    """
    try:
        cert = x509.load_pem_x509_certificate(pair.cert_pem)
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
    except (ValueError, TypeError):
        return False
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(serialization.Encoding.DER, spki) == key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    )


def is_ca(cert_pem: bytes) -> bool:
    """Whether the certificate is a CA (BasicConstraints ca=True). False if unparsable."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    return constraints.ca


def dns_names_of(cert_pem: bytes) -> frozenset[str]:
    """The DNS names in the certificate's SubjectAlternativeName (empty if none or unparsable)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return frozenset()
    return frozenset(san.get_values_for_type(x509.DNSName))


# --- Writing -----------------------------------------------------------------------------------


def write_pem(path: Path, data: bytes, *, private: bool) -> None:
    """Atomically replace ``path`` with ``data``: mode 0600 if ``private``, else 0644.

    The temporary file is created in the same directory (``os.replace`` is atomic only within one
    file system) and, for private files, with mode 0600 from the start, so the key is never readable
    by others even for an instant. Readers therefore see either the old file or the new one, never a
    truncated key, which matters when a server reloads certificates while they are rotated.
    """
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed a public file's mode
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_directory(path.parent)


# --- Internals ---------------------------------------------------------------------------------


def _issue_leaf(
    *,
    ca: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    san: list[x509.GeneralName],
    now: datetime,
    valid_for: timedelta,
) -> KeyPair:
    now = _utc(now)
    ca_cert, ca_key = _load_issuer(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + valid_for, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_encipherment=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_identifier(ca_cert), critical=False)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(ca_key, _SIGNATURE_HASH)
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def _load_issuer(ca: KeyPair) -> tuple[x509.Certificate, _IssuerKey]:
    if not key_matches_cert(ca):
        raise ValueError(
            "cannot issue a certificate: the CA key pair is unparsable or its key does not belong to "
            "its certificate; regenerate the CA (or fix the stored ca.crt/ca.key) and try again"
        )
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(
            f"cannot issue a certificate: CA key type {type(key).__name__} is not supported; use ECDSA or RSA"
        )
    return cert, key


def _authority_key_identifier(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    # Copy the CA's own SKI when it has one: verifiers match AKI to SKI byte for byte, and a CA made
    # elsewhere may have computed its SKI with a different method than ours.
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        public_key = ca_cert.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
            message = "cannot issue a certificate: the CA public key is neither ECDSA nor RSA"
            raise ValueError(message) from None
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key)
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _key_usage(
    *,
    digital_signature: bool = False,
    key_encipherment: bool = False,
    key_cert_sign: bool = False,
    crl_sign: bool = False,
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: _IssuerKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _utc(now: datetime) -> datetime:
    # A naive datetime is ambiguous (local time or UTC?) and would shift validity by the UTC offset.
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware, for example datetime.now(UTC)")
    return now.astimezone(UTC)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; best effort, since some file systems refuse a directory fsync.
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)

"""Certificates from ``certs.pki`` and the webhook rotation decisions in ``certs.bundle``.

Covers: the extensions strict verifiers require, chain verification, the rotation boundary, atomic
PEM writes and their modes, real TLS handshakes (server and mutual) over a loopback socket pair
with OpenSSL's strict X.509 checks, and every branch of ``plan_rotation``.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from koord_queue.certs import bundle, pki

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
HANDSHAKE_TIMEOUT_SECONDS = 10.0


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


_E = TypeVar("_E", bound=x509.ExtensionType)


def _ext(cert: x509.Certificate, kind: type[_E]) -> x509.Extension[_E]:
    return cert.extensions.get_extension_for_class(kind)


def _serving(ca: pki.KeyPair, *, now: datetime = NOW) -> pki.KeyPair:
    return pki.issue_serving(
        ca=ca,
        common_name="localhost",
        dns_names=["localhost", "kubernetes.default.svc"],
        ip_addresses=["127.0.0.1", "::1"],
        now=now,
    )


def _rsa_ca(*, now: datetime) -> pki.KeyPair:
    """A CA with an RSA key, as an operator-supplied CA might be."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pki.KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_pem)


# --- Issued certificates carry what strict verifiers require ------------------------------------


def test_a_ca_is_a_critical_path_length_zero_ca_with_signing_key_usage_and_a_key_identifier() -> None:
    ca = _cert(pki.new_ca(common_name="test-ca", now=NOW).cert_pem)

    constraints = _ext(ca, x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = _ext(ca, x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert usage.value.digital_signature
    assert _ext(ca, x509.SubjectKeyIdentifier).value.digest
    assert ca.subject == ca.issuer
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test-ca"


def test_a_ca_is_backdated_for_clock_skew_and_expires_after_its_validity() -> None:
    ca = _cert(pki.new_ca(common_name="test-ca", now=NOW, valid_for=timedelta(days=10)).cert_pem)

    assert ca.not_valid_before_utc == NOW - timedelta(minutes=5)
    assert ca.not_valid_after_utc == NOW + timedelta(days=10)


def test_keys_are_ecdsa_p256_in_unencrypted_pkcs8_pem() -> None:
    pair = pki.new_ca(common_name="test-ca", now=NOW)

    assert pair.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)


def test_a_serving_cert_has_its_names_server_auth_and_critical_key_usage() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    cert = _cert(_serving(ca).cert_pem)

    san = _ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "kubernetes.default.svc"]
    assert san.get_values_for_type(x509.IPAddress) == [ip_address("127.0.0.1"), ip_address("::1")]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    usage = _ext(cert, x509.KeyUsage)
    assert usage.critical
    assert usage.value.digital_signature
    assert usage.value.key_encipherment
    assert not usage.value.key_cert_sign
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical
    assert not constraints.value.ca


def test_a_leaf_names_its_ca_key_in_the_authority_key_identifier() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    cert = _cert(_serving(ca).cert_pem)

    ca_ski = _ext(_cert(ca.cert_pem), x509.SubjectKeyIdentifier).value.digest
    assert _ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski
    assert _ext(cert, x509.SubjectKeyIdentifier).value.digest != ca_ski
    assert cert.issuer == _cert(ca.cert_pem).subject


def test_a_leaf_never_outlives_its_ca() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW, valid_for=timedelta(days=30))
    serving = pki.issue_serving(
        ca=ca, common_name="x", dns_names=["x"], now=NOW, valid_for=timedelta(days=365)
    )

    assert pki.not_after(serving.cert_pem) == pki.not_after(ca.cert_pem)


def test_a_serving_cert_without_any_name_is_refused() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    with pytest.raises(ValueError, match="no DNS names or IP addresses"):
        pki.issue_serving(ca=ca, common_name="nameless", now=NOW)


def test_an_invalid_ip_address_is_refused() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    with pytest.raises(ValueError):
        pki.issue_serving(ca=ca, common_name="x", ip_addresses=["localhost"], now=NOW)


def test_a_ca_whose_key_is_not_its_own_cannot_issue() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    other = pki.new_ca(common_name="other-ca", now=NOW)
    mixed = pki.KeyPair(cert_pem=ca.cert_pem, key_pem=other.key_pem)

    with pytest.raises(ValueError, match="does not belong"):
        pki.issue_client(ca=mixed, common_name="admin", now=NOW)


def test_a_client_cert_has_client_auth_and_its_groups_as_organizations() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    cert = _cert(
        pki.issue_client(ca=ca, common_name="admin", organizations=["system:masters"], now=NOW).cert_pem
    )

    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["admin"]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]
    assert not _ext(cert, x509.BasicConstraints).value.ca
    assert _ext(cert, x509.KeyUsage).critical


def test_the_service_account_signing_key_is_rsa_2048_with_its_public_half() -> None:
    private_pem, public_pem = pki.new_signing_key()

    private = serialization.load_pem_private_key(private_pem, password=None)
    public = serialization.load_pem_public_key(public_pem)
    assert isinstance(private, rsa.RSAPrivateKey)
    assert isinstance(public, rsa.RSAPublicKey)
    assert private.key_size == 2048
    assert private.public_key().public_numbers() == public.public_numbers()
    assert private_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")


def test_a_key_pair_repr_never_shows_the_key() -> None:
    pair = pki.new_ca(common_name="test-ca", now=NOW)

    assert b"PRIVATE" not in repr(pair).encode()
    assert "redacted" in repr(pair)


def test_a_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        pki.new_ca(common_name="test-ca", now=datetime(2030, 1, 1))


# --- Chain verification -------------------------------------------------------------------------


def test_a_cert_verifies_against_the_ca_that_issued_it() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=_serving(ca).cert_pem)


def test_a_cert_from_another_ca_does_not_verify() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    other = pki.new_ca(common_name="other-ca", now=NOW)

    assert not pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=_serving(other).cert_pem)


def test_a_cert_from_a_ca_with_the_same_name_but_another_key_does_not_verify() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    impostor = pki.new_ca(common_name="test-ca", now=NOW)

    assert not pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=_serving(impostor).cert_pem)


def test_an_rsa_ca_issues_certs_that_verify() -> None:
    ca = _rsa_ca(now=NOW)
    serving = _serving(ca)

    assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=serving.cert_pem)
    ca_ski = _ext(_cert(ca.cert_pem), x509.SubjectKeyIdentifier).value.digest
    assert _ext(_cert(serving.cert_pem), x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski


def test_garbage_never_verifies() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    assert not pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=b"not a certificate")
    assert not pki.verify_chain(ca_pem=b"", cert_pem=ca.cert_pem)


# --- Rotation boundary --------------------------------------------------------------------------


def test_a_fresh_cert_does_not_need_rotation() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    assert not pki.needs_rotation(_serving(ca).cert_pem, now=NOW)


def test_rotation_is_due_exactly_when_the_fraction_of_validity_has_elapsed() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    cert = _cert(_serving(ca).cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    boundary = start + (end - start) * (2 / 3)
    pem = cert.public_bytes(serialization.Encoding.PEM)

    assert not pki.needs_rotation(pem, now=boundary - timedelta(seconds=1))
    assert pki.needs_rotation(pem, now=boundary)
    assert pki.needs_rotation(pem, now=end + timedelta(days=1))


def test_the_rotation_fraction_is_adjustable() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW, valid_for=timedelta(days=100))
    halfway = NOW + timedelta(days=50)

    assert pki.needs_rotation(ca.cert_pem, now=halfway, fraction=0.5)
    assert not pki.needs_rotation(ca.cert_pem, now=halfway, fraction=0.9)
    with pytest.raises(ValueError, match="fraction"):
        pki.needs_rotation(ca.cert_pem, now=halfway, fraction=0)


def test_a_cert_that_is_not_yet_valid_or_cannot_be_parsed_needs_rotation() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)

    assert pki.needs_rotation(ca.cert_pem, now=NOW - timedelta(hours=1))
    assert pki.needs_rotation(b"garbage", now=NOW)


def test_not_after_is_an_aware_utc_datetime() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW, valid_for=timedelta(days=7))

    assert pki.not_after(ca.cert_pem) == NOW + timedelta(days=7)
    assert pki.not_after(ca.cert_pem).tzinfo is not None


# --- Writing PEM files --------------------------------------------------------------------------


@pytest.fixture
def restrictive_umask() -> Iterator[None]:
    """A umask that would make files 0600; write_pem must still produce 0644 public files."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def test_private_files_are_0600_and_public_files_0644(tmp_path: Path, restrictive_umask: None) -> None:
    pair = pki.new_ca(common_name="test-ca", now=NOW)

    pki.write_pem(tmp_path / "ca.key", pair.key_pem, private=True)
    pki.write_pem(tmp_path / "ca.crt", pair.cert_pem, private=False)

    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.crt").stat().st_mode) == 0o644
    assert (tmp_path / "ca.key").read_bytes() == pair.key_pem
    assert (tmp_path / "ca.crt").read_bytes() == pair.cert_pem


def test_rewriting_a_file_replaces_it_whole_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "tls.key"
    target.write_bytes(b"old and longer than the new content")
    target.chmod(0o644)

    pki.write_pem(target, b"new", private=True)

    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.key"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "child").write_bytes(b"")

    with pytest.raises(OSError):
        pki.write_pem(tmp_path / "occupied", b"data", private=False)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["occupied"]


# --- Real TLS handshakes over loopback ----------------------------------------------------------


@dataclass
class _Handshake:
    received: bytes = b""
    client_error: BaseException | None = None
    server_error: BaseException | None = None
    client_cert: x509.Certificate | None = None


def _strict(context: ssl.SSLContext) -> ssl.SSLContext:
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _files(tmp_path: Path, name: str, pair: pki.KeyPair) -> tuple[Path, Path]:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    pki.write_pem(cert, pair.cert_pem, private=False)
    pki.write_pem(key, pair.key_pem, private=True)
    return cert, key


def _server_context(*, tmp_path: Path, serving: pki.KeyPair, client_ca: pki.KeyPair) -> ssl.SSLContext:
    context = _strict(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    cert, key = _files(tmp_path, "server", serving)
    context.load_cert_chain(certfile=cert, keyfile=key)
    context.load_verify_locations(cadata=client_ca.cert_pem.decode("ascii"))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _client_context(*, tmp_path: Path, server_ca: pki.KeyPair, client: pki.KeyPair) -> ssl.SSLContext:
    context = _strict(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=server_ca.cert_pem.decode("ascii"))
    cert, key = _files(tmp_path, "client", client)
    context.load_cert_chain(certfile=cert, keyfile=key)
    return context


def _handshake(*, server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> _Handshake:
    """Run a TLS server in a thread on one end of a socket pair and a client on the other."""
    outcome = _Handshake()
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        server_end.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        client_end.settimeout(HANDSHAKE_TIMEOUT_SECONDS)

        def serve() -> None:
            try:
                with server.wrap_socket(server_end, server_side=True) as tls:
                    der = tls.getpeercert(binary_form=True)
                    outcome.client_cert = x509.load_der_x509_certificate(der) if der else None
                    tls.sendall(b"hello")
            except (OSError, ssl.SSLError) as error:
                outcome.server_error = error

        thread = threading.Thread(target=serve, name="tls-test-server", daemon=True)
        thread.start()
        try:
            with client.wrap_socket(client_end, server_hostname=server_hostname) as tls:
                outcome.received = tls.recv(5)
        except (OSError, ssl.SSLError) as error:
            outcome.client_error = error
        finally:
            thread.join(timeout=HANDSHAKE_TIMEOUT_SECONDS)
        assert not thread.is_alive(), "the TLS server thread did not finish in time"
    return outcome


@pytest.fixture
def tls_pki() -> tuple[pki.KeyPair, pki.KeyPair, pki.KeyPair]:
    """(CA, serving cert for localhost and 127.0.0.1, admin client cert), valid at the real now."""
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="test-ca", now=now)
    serving = pki.issue_serving(
        ca=ca, common_name="localhost", dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
    )
    client = pki.issue_client(ca=ca, common_name="admin", organizations=["system:masters"], now=now)
    return ca, serving, client


@pytest.mark.parametrize("server_hostname", ["localhost", "127.0.0.1"])
def test_a_mutual_tls_handshake_succeeds_for_the_dns_name_and_the_ip_address(
    tmp_path: Path, tls_pki: tuple[pki.KeyPair, pki.KeyPair, pki.KeyPair], server_hostname: str
) -> None:
    ca, serving, client = tls_pki

    outcome = _handshake(
        server=_server_context(tmp_path=tmp_path, serving=serving, client_ca=ca),
        client=_client_context(tmp_path=tmp_path, server_ca=ca, client=client),
        server_hostname=server_hostname,
    )

    assert outcome.client_error is None
    assert outcome.server_error is None
    assert outcome.received == b"hello"
    assert outcome.client_cert is not None
    assert outcome.client_cert.subject.rfc4514_string() == "CN=admin,O=system:masters"


def test_a_client_expecting_another_host_refuses_the_server(
    tmp_path: Path, tls_pki: tuple[pki.KeyPair, pki.KeyPair, pki.KeyPair]
) -> None:
    ca, serving, client = tls_pki

    outcome = _handshake(
        server=_server_context(tmp_path=tmp_path, serving=serving, client_ca=ca),
        client=_client_context(tmp_path=tmp_path, server_ca=ca, client=client),
        server_hostname="example.com",
    )

    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert outcome.received == b""


def test_a_server_refuses_a_client_cert_from_another_ca(
    tmp_path: Path, tls_pki: tuple[pki.KeyPair, pki.KeyPair, pki.KeyPair]
) -> None:
    ca, serving, _ = tls_pki
    stranger = pki.issue_client(
        ca=pki.new_ca(common_name="other-ca", now=datetime.now(UTC)),
        common_name="intruder",
        now=datetime.now(UTC),
    )

    outcome = _handshake(
        server=_server_context(tmp_path=tmp_path, serving=serving, client_ca=ca),
        client=_client_context(tmp_path=tmp_path, server_ca=ca, client=stranger),
        server_hostname="localhost",
    )

    assert isinstance(outcome.server_error, ssl.SSLError)
    assert outcome.received == b""


# --- Webhook bundle: names and Secret encoding --------------------------------------------------


def test_service_dns_names_cover_every_way_to_reach_the_service() -> None:
    assert bundle.service_dns_names("koord-queue-webhook", "koord-queue") == [
        "koord-queue-webhook",
        "koord-queue-webhook.koord-queue",
        "koord-queue-webhook.koord-queue.svc",
        "koord-queue-webhook.koord-queue.svc.cluster.local",
    ]


def test_secret_data_uses_the_kubernetes_tls_keys_and_round_trips() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    serving = _serving(ca)

    data = bundle.secret_data(ca=ca, serving=serving)

    assert {"tls.crt", "tls.key", "ca.crt"} <= data.keys()
    assert base64.b64decode(data["tls.crt"]) == serving.cert_pem
    assert base64.b64decode(data["ca.crt"]) == ca.cert_pem
    assert bundle.from_secret_data(data) == (ca, serving)


@pytest.mark.parametrize("missing", ["ca.crt", "ca.key", "tls.crt", "tls.key"])
def test_secret_data_missing_any_key_decodes_to_none(missing: str) -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    data = bundle.secret_data(ca=ca, serving=_serving(ca))
    del data[missing]

    assert bundle.from_secret_data(data) is None


def test_secret_data_with_bad_base64_garbage_pem_or_a_foreign_key_decodes_to_none() -> None:
    ca = pki.new_ca(common_name="test-ca", now=NOW)
    good = bundle.secret_data(ca=ca, serving=_serving(ca))
    foreign_key = base64.b64encode(pki.new_ca(common_name="x", now=NOW).key_pem).decode()

    assert bundle.from_secret_data({**good, "tls.crt": "%%% not base64 %%%"}) is None
    assert bundle.from_secret_data({**good, "tls.crt": base64.b64encode(b"garbage").decode()}) is None
    assert bundle.from_secret_data({**good, "tls.key": foreign_key}) is None


# --- Webhook bundle: rotation decisions ---------------------------------------------------------

NAMES = bundle.service_dns_names("koord-queue-webhook", "koord-queue")


def _current(*, now: datetime = NOW) -> tuple[pki.KeyPair, pki.KeyPair]:
    ca = pki.new_ca(common_name="webhook-ca", now=now, valid_for=bundle.CA_VALIDITY)
    serving = pki.issue_serving(
        ca=ca, common_name=NAMES[0], dns_names=NAMES, now=now, valid_for=bundle.SERVING_VALIDITY
    )
    return ca, serving


def _assert_usable(pair: tuple[pki.KeyPair, pki.KeyPair], *, now: datetime) -> None:
    ca, serving = pair
    assert pki.verify_chain(ca_pem=ca.cert_pem, cert_pem=serving.cert_pem)
    assert set(NAMES) <= pki.dns_names_of(serving.cert_pem)
    assert not pki.needs_rotation(ca.cert_pem, now=now)
    assert not pki.needs_rotation(serving.cert_pem, now=now)


def test_without_certificates_a_new_ca_and_serving_cert_are_issued() -> None:
    planned = bundle.plan_rotation(current=None, dns_names=NAMES, now=NOW)

    assert planned is not None
    _assert_usable(planned, now=NOW)


def test_sound_certificates_are_kept() -> None:
    assert bundle.plan_rotation(current=_current(), dns_names=NAMES, now=NOW + timedelta(days=30)) is None


def test_a_serving_cert_due_for_rotation_is_reissued_under_the_same_ca() -> None:
    current = _current()
    later = NOW + timedelta(days=300)

    planned = bundle.plan_rotation(current=current, dns_names=NAMES, now=later)

    assert planned is not None
    assert planned[0] == current[0]
    assert planned[1] != current[1]
    _assert_usable(planned, now=later)


def test_a_ca_due_for_rotation_is_replaced_together_with_the_serving_cert() -> None:
    current = _current()
    later = NOW + timedelta(days=3000)

    planned = bundle.plan_rotation(current=current, dns_names=NAMES, now=later)

    assert planned is not None
    assert planned[0].cert_pem != current[0].cert_pem
    assert not pki.verify_chain(ca_pem=current[0].cert_pem, cert_pem=planned[1].cert_pem)
    _assert_usable(planned, now=later)


def test_a_serving_cert_missing_a_required_name_is_reissued_under_the_same_ca() -> None:
    ca, _ = _current()
    narrow = pki.issue_serving(ca=ca, common_name="svc", dns_names=NAMES[:2], now=NOW)

    planned = bundle.plan_rotation(current=(ca, narrow), dns_names=NAMES, now=NOW)

    assert planned is not None
    assert planned[0] == ca
    _assert_usable(planned, now=NOW)


def test_a_serving_cert_from_another_ca_is_reissued_under_the_stored_ca() -> None:
    ca, _ = _current()
    _, foreign = _current()

    planned = bundle.plan_rotation(current=(ca, foreign), dns_names=NAMES, now=NOW)

    assert planned is not None
    assert planned[0] == ca
    _assert_usable(planned, now=NOW)


def test_a_stored_ca_that_is_not_a_ca_is_replaced() -> None:
    ca, serving = _current()

    planned = bundle.plan_rotation(current=(serving, serving), dns_names=NAMES, now=NOW)

    assert planned is not None
    assert planned[0] != ca
    assert planned[0] != serving
    _assert_usable(planned, now=NOW)


def test_planning_without_dns_names_is_refused() -> None:
    with pytest.raises(ValueError, match="no DNS names"):
        bundle.plan_rotation(current=None, dns_names=[], now=NOW)


# --- caBundle injection patches -------------------------------------------------------------------


def _configuration(*bundles: str | None) -> dict[str, object]:
    hooks = [
        {"name": f"h{i}", "clientConfig": {"service": {"name": "s"}, **({"caBundle": b} if b else {})}}
        for i, b in enumerate(bundles)
    ]
    return {"metadata": {"name": "koord-queue", "resourceVersion": "7"}, "webhooks": hooks}


def test_webhook_patch_adds_or_replaces_only_the_bundles_that_differ_guarded_by_resource_version() -> None:
    patch = bundle.webhook_ca_patch(_configuration(None, "old", "new"), "new")

    assert patch == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "new"},
        {"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": "new"},
    ]
    assert bundle.webhook_ca_patch(_configuration("new", "new"), "new") is None
    assert bundle.webhook_ca_patch({"metadata": {"resourceVersion": "1"}}, "new") is None  # no webhooks


def test_apiservice_patch_sets_the_spec_ca_bundle_once() -> None:
    apiservice: dict[str, Any] = {
        "metadata": {"name": "v1alpha1.visibility.koord-queue.x-k8s.io", "resourceVersion": "3"},
        "spec": {"service": {"name": "koord-queue-visibility-server"}},
    }

    assert bundle.apiservice_ca_patch(apiservice, "Y2E=") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "3"},
        {"op": "add", "path": "/spec/caBundle", "value": "Y2E="},
    ]
    apiservice["spec"]["caBundle"] = "Y2E="
    assert bundle.apiservice_ca_patch(apiservice, "Y2E=") is None
    # A different bundle (a rotated CA) is replaced by the same "add" (JSON patch add replaces).
    assert bundle.apiservice_ca_patch(apiservice, "bmV3")[1]["value"] == "bmV3"

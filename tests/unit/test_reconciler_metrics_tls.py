"""The reconciler's metrics certificate (docs/operations.md#metrics): the pair a replica issues
itself, renewed when due; or a pair from files, re-read when they change, the last good one kept
when they are broken. Who may scrape is proved against a real API server in tests/e2e/test_metrics.py.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from koord_queue.certs import pki
from koord_queue.reconciler import main, servers


def test_a_replica_issues_its_own_pair_for_the_services_names_and_renews_it() -> None:
    tls = servers.metrics_tls(
        cert_file="", key_file="", service="koord-queue-reconciler", namespace="ops", interval_s=60
    )
    first = tls.tls.cert_in_force()
    assert first is not None
    assert "koord-queue-reconciler.ops.svc" in pki.dns_names_of(first)
    tls.refresh(now=datetime.now(UTC))
    assert tls.tls.cert_in_force() == first  # not due: kept
    tls.refresh(now=datetime.now(UTC) + timedelta(days=300))
    renewed = tls.tls.cert_in_force()
    assert renewed is not None and renewed != first


def _pair(directory: Path, name: str) -> tuple[str, str, bytes]:
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="metrics-ca", now=now)
    pair = pki.issue_serving(ca=ca, common_name=name, dns_names=[name], now=now)
    cert, key = directory / "tls.crt", directory / "tls.key"
    pki.write_pem(cert, pair.cert_pem, private=False)
    pki.write_pem(key, pair.key_pem, private=True)
    return str(cert), str(key), pair.cert_pem


def test_a_pair_from_files_is_re_read_and_a_broken_one_ignored(tmp_path: Path) -> None:
    cert, key, first = _pair(tmp_path, "one")
    tls = servers.metrics_tls(cert_file=cert, key_file=key, service="s", namespace="n", interval_s=60)
    assert tls.tls.cert_in_force() == first
    _, _, second = _pair(tmp_path, "two")
    tls.refresh(now=datetime.now(UTC))
    assert tls.tls.cert_in_force() == second
    Path(key).write_text("not a key")
    with pytest.raises((ssl.SSLError, ValueError)):  # what run() logs, keeping the pair in force
        tls.refresh(now=datetime.now(UTC))
    assert tls.tls.cert_in_force() == second


def test_metrics_flags() -> None:
    args = main.parse_args([])
    assert args.metrics_secure is True and args.metrics_port == 10259 and not args.metrics_cert_file
    assert main.parse_args(["--metrics-secure=false"]).metrics_secure is False
    for bad in (
        ["--metrics-cert-file=c"],
        ["--metrics-cert-file=c", "--metrics-key-file=k", "--metrics-secure=false"],
        ["--metrics-secure=maybe"],
    ):
        with pytest.raises(SystemExit):
            main.parse_args(bad)

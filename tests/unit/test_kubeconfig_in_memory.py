"""A kubeconfig's inline certificates and key never touch a disk (docs/development.md#runtime-constraints).

``shared.kubeconfig`` keeps them as data: the CA goes to TLS as data, the client certificate and
key through an in-memory file closed once read. kubernetes-asyncio, which writes them to temporary
files, gets in-memory files for its own client (leader election). So the reconciler and the
kubectl plugin need no writable temporary directory. The temporary directory here is one that
does not exist: any temporary file would fail the connect.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from koord_queue.certs import pki
from koord_queue.shared import kube
from testenv.cluster import kubeconfig_dict


@pytest.fixture
def no_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        tempfile.mkstemp()  # the fixture is what it claims


def _kubeconfig(path: Path) -> tuple[pki.KeyPair, pki.KeyPair]:
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="test-ca", now=now)
    client = pki.issue_client(ca=ca, common_name="admin", now=now)
    config = kubeconfig_dict(server="https://127.0.0.1:6443", ca_pem=ca.cert_pem, client=client)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return ca, client


def _in_memory(file: str | None) -> bytes:
    assert file is not None and file.startswith("/proc/self/fd/"), file
    assert os.readlink(file).startswith("/memfd:koord-queue-")
    return Path(file).read_bytes()


async def test_inline_credentials_are_loaded_from_memory(
    tmp_path: Path, no_temporary_directory: None
) -> None:
    path = tmp_path / "kubeconfig"
    ca, client = _kubeconfig(path)
    before = path.read_bytes()
    keys_before = _key_files()
    api = await kube.Kube.connect(kubeconfig=str(path))  # TLS has loaded the key: no file needed
    try:
        settings = api.settings
        assert (settings.ca_data, settings.cert_data, settings.key_data) == (
            ca.cert_pem,
            client.cert_pem,
            client.key_pem,
        )
        assert (settings.ca_file, settings.cert_file, settings.key_file) == (None, None, None)
        assert _key_files() == keys_before  # the in-memory file TLS read the key from is closed
        configuration = api.api_client.configuration  # kubernetes-asyncio's, for leader election
        assert "BearerToken" not in configuration.api_key  # a certificate user sends no header
        files = (configuration.ssl_ca_cert, configuration.cert_file, configuration.key_file)
        assert configuration.host == "https://127.0.0.1:6443"
    finally:
        await api.close()
    assert [_in_memory(f) for f in files] == [ca.cert_pem, client.cert_pem, client.key_pem]
    assert path.read_bytes() == before  # the user's kubeconfig is never rewritten


def _key_files() -> set[str]:
    """This process's open in-memory files holding a client key."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:koord-queue-client-key"):
                found.add(fd)
    return found


async def test_a_missing_kubeconfig_is_still_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(kube.ClientConfigError, match="cannot load API credentials"):
        await kube.Kube.connect(kubeconfig=str(tmp_path / "nope"))

"""Security checks of the running system: TLS policy, secrets in logs, key file modes.

* **TLS**: every port that serves TLS (the webhook; the reconciler's visibility API when it has a
  certificate) completes a TLS 1.3 and a TLS 1.2 ECDHE/AES-GCM handshake, and refuses TLS 1.0/1.1
  and the weak TLS 1.2 suites a lax server would take (CBC with SHA-1 or SHA-2, no AEAD).
  Each refusal is first shown to be *possible*: the client offers that version or suite (OpenSSL
  security level 0) and fails only because the server says no.
* **Logs**: at default verbosity no log of ours contains object contents (the secret marker every
  chaos object carries in an annotation) or key material (``PRIVATE KEY``).
* **Files**: every private key and kubeconfig written by ``certs.pki.write_pem`` / ``testenv`` has mode
  0600.
* **Image**: the Dockerfile's final user is not root; the Deployments require ``runAsNonRoot`` and
  forbid privilege escalation. (The reconciler's least privilege is exercised by the run itself:
  every reconciler acts as its ServiceAccount with the RBAC of ``manifests/``.)
"""

from __future__ import annotations

import socket
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path

WEAK_TLS12_SUITES = (
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES128-SHA",
    "AES128-SHA",
    "AES256-GCM-SHA384",
    "DES-CBC3-SHA",
)
GOOD_TLS12_SUITES = ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305")


@dataclass
class Findings:
    checks: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def expect(self, ok: bool, problem: str) -> None:
        self.checks += 1
        if not ok:
            self.problems.append(problem)


def _handshake(port: int, context: ssl.SSLContext) -> tuple[bool, str]:
    """True with the negotiated (version, cipher) on success; False with the error otherwise."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            cipher = tls.cipher()
            return True, f"{tls.version()} {cipher[0] if cipher else ''}"
    except (ssl.SSLError, OSError) as err:
        return False, str(err)


def _client(
    *, minimum: ssl.TLSVersion, maximum: ssl.TLSVersion, ciphers: str | None = None
) -> ssl.SSLContext | None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.minimum_version = minimum
        context.maximum_version = maximum
        context.set_ciphers(ciphers or "ALL:@SECLEVEL=0")
    except (ssl.SSLError, ValueError):
        return None  # this OpenSSL cannot even offer it
    return context


def probe_tls(port: int, what: str, findings: Findings) -> None:
    """The handshake matrix described in the module docstring, against 127.0.0.1:``port``."""
    v = ssl.TLSVersion
    modern = _client(minimum=v.TLSv1_3, maximum=v.TLSv1_3, ciphers="DEFAULT")
    assert modern is not None
    ok, info = _handshake(port, modern)
    findings.expect(ok, f"{what}: TLS 1.3 handshake failed: {info}")
    for suite in GOOD_TLS12_SUITES:
        context = _client(minimum=v.TLSv1_2, maximum=v.TLSv1_2, ciphers=suite)
        if context is None:
            continue
        ok, info = _handshake(port, context)
        findings.expect(ok, f"{what}: TLS 1.2 {suite} refused: {info}")
    for version in (v.TLSv1, v.TLSv1_1):
        context = _client(minimum=version, maximum=version)
        if context is None:
            findings.notes.append(f"{what}: this OpenSSL cannot offer {version.name}; not probed")
            continue
        ok, info = _handshake(port, context)
        findings.expect(not ok, f"{what}: accepted {version.name} ({info})")
        if not ok and "no protocols available" in info:
            findings.notes.append(f"{what}: {version.name} refused by the local OpenSSL, not the server")
    for suite in WEAK_TLS12_SUITES:
        context = _client(minimum=v.TLSv1_2, maximum=v.TLSv1_2, ciphers=f"{suite}:@SECLEVEL=0")
        if context is None:
            continue
        ok, info = _handshake(port, context)
        findings.expect(not ok, f"{what}: accepted weak TLS 1.2 suite {suite} ({info})")


def scan_logs(logs: list[Path], needles: dict[str, str], findings: Findings) -> None:
    """No log contains any needle (``label -> text``)."""
    for log in logs:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for label, needle in needles.items():
            findings.expect(needle not in text, f"{log.name}: contains {label}")


def private_files(roots: list[Path]) -> list[Path]:
    """Files written by ``certs.pki.write_pem`` / ``testenv`` that hold secrets: keys, kubeconfigs."""
    found: list[Path] = []
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.iterdir()):
            if path.is_file() and (path.suffix == ".key" or path.name.startswith("kubeconfig")):
                found.append(path)
    return found


def check_modes(paths: list[Path], findings: Findings) -> None:
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        findings.expect(mode == 0o600, f"{path}: mode {mode:o}, expected 600")
        if b"PRIVATE KEY" in path.read_bytes() and mode != 0o600:
            findings.problems.append(f"{path}: holds a private key with mode {mode:o}")


def check_image_and_manifests(root: Path, findings: Findings) -> None:
    """The image runs as a non-root user; the Deployments insist on it and drop privileges."""
    import yaml

    dockerfile = root / "Dockerfile"
    users = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")]
    user = users[-1].split(":")[0] if users else "root"
    findings.expect(user not in ("root", "0"), f"Dockerfile: the final image runs as {user!r}")
    for name in ("reconciler.yaml", "webhook.yaml"):
        for doc in yaml.safe_load_all((root / "manifests" / name).read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            pod = doc["spec"]["template"]["spec"]
            findings.expect(
                (pod.get("securityContext") or {}).get("runAsNonRoot") is True,
                f"manifests/{name}: pod securityContext.runAsNonRoot is not true",
            )
            for container in pod.get("containers") or []:
                context = container.get("securityContext") or {}
                findings.expect(
                    context.get("allowPrivilegeEscalation") is False,
                    f"manifests/{name}: container {container.get('name')} may escalate privileges",
                )

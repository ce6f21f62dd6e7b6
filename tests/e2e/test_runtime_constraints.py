"""The webhook and the reconciler of the e2e suite run under the container image's runtime
constraints, and work (docs/development.md#runtime-constraints).

The image runs as uid/gid 65532 with a read-only root filesystem, no capabilities, no privilege
escalation, no home directory, and reads only the files a pod mounts. CI has no Docker, so the e2e
suite starts both processes through ``testenv.confined`` (tests/e2e/conftest.py). These tests read
the constraints off the running processes from the outside (``/proc/<pid>/...``), show that a job
still goes through hold and admission with them in force, and show that the checks can fail: the
same checks flag this unconfined test process, and a probe under the same launcher is refused every
write a process could try.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from koord_queue.shared.api import names
from testenv import confined, processes, system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

UID, GID = confined.image_user()
CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def _mount_points(mountinfo: str) -> set[str]:
    return {line.split()[4] for line in mountinfo.splitlines()}


def violations(pid: int) -> list[str]:
    """Every way the process ``pid`` breaks the image's constraints (empty: none)."""
    found: list[str] = []
    status = _status(pid)
    if status["Uid"].split() != [str(UID)] * 4:
        found.append(f"uid {status['Uid']}")
    if status["Gid"].split() != [str(GID)] * 4:
        found.append(f"gid {status['Gid']}")
    if status["Groups"]:
        found.append(f"supplementary groups {status['Groups']}")
    found += [f"{cap} {status[cap]}" for cap in CAPABILITY_SETS if int(status[cap], 16)]
    if status["NoNewPrivs"] != "1":
        found.append("privilege escalation possible (NoNewPrivs 0)")
    env = _environ(pid)
    found += [f"environment has {name}={env[name]}" for name in confined.FORBIDDEN_ENV if name in env]
    mountinfo = Path(f"/proc/{pid}/mountinfo").read_text()
    if "/" not in _mount_points(mountinfo):
        found.append("no root mount")
    found += [f"writable mount {point}" for point in confined.writable_mounts(mountinfo)]
    if missing := _mount_points(Path("/proc/self/mountinfo").read_text()) - _mount_points(mountinfo):
        found.append(f"mounts not seen, so not known read-only: {sorted(missing)}")
    if (cwd := os.readlink(f"/proc/{pid}/cwd")) != "/":
        found.append(f"working directory {cwd}")
    if (stdin := os.readlink(f"/proc/{pid}/fd/0")) != "/dev/null":
        found.append(f"stdin {stdin}")
    return found


def _component(system_e2e: system.Processes, name: str) -> processes.Component:
    return next(c for c in system_e2e.components if c.name == name)


@pytest.mark.parametrize("name", ["webhook", "reconciler"])
def test_the_running_process_holds_every_constraint_of_the_image(
    system_e2e: system.Processes, name: str
) -> None:
    component = _component(system_e2e, name)
    assert component.alive()
    assert violations(component.process.pid) == []
    env = _environ(component.process.pid)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # The pid the harness stops is the server itself: unshare, the stage and setpriv all exec'd.
    cmdline = Path(f"/proc/{component.process.pid}/cmdline").read_bytes().split(b"\0")
    assert f"koord_queue.{name}.main".encode() in cmdline


def test_the_checks_see_an_unconfined_process() -> None:
    """This test process runs as root with writable mounts: the same checks must say so."""
    found = violations(os.getpid())
    assert any(v.startswith("uid ") for v in found), found
    assert any(v == "writable mount /" for v in found), found
    assert any(v.startswith("CapEff") for v in found), found


PROBE = """
import errno, json, os, sys, tempfile
report = {"home": os.path.expanduser("~")}
for target in sys.argv[1:]:
    try:
        with open(os.path.join(target, "probe-write"), "w") as handle:
            handle.write("x")
        report[target] = "written"
    except OSError as err:
        report[target] = errno.errorcode[err.errno]
try:
    fd, name = tempfile.mkstemp()
    os.close(fd)
    os.remove(name)
    report["tempfile"] = "created"
except OSError as err:
    report["tempfile"] = errno.errorcode[err.errno] if err.errno else type(err).__name__
# Undo the read-only flag of the root mount (MS_REMOUNT | MS_BIND): needs CAP_SYS_ADMIN. Tried
# only where the probe is not root: the unconfined control run must not touch the host's mounts.
if os.getuid() != 0:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    failed = libc.mount(None, b"/", None, 32 | 4096, None) != 0
    report["remount"] = errno.errorcode[ctypes.get_errno()] if failed else "remounted"
print(json.dumps(report), flush=True)
"""


def _probe(tmp_path: Path, *, confine: bool, targets: list[str]) -> dict[str, Any]:
    log = tmp_path / f"probe-{'confined' if confine else 'free'}.log"
    argv = [sys.executable, "-c", PROBE, *targets]
    start = confined.spawn if confine else processes.spawn
    component = start("probe", argv, log)
    assert component.process.wait(timeout=60) == 0, component.tail()
    report: dict[str, Any] = json.loads(log.read_text().splitlines()[-1])
    return report


def test_a_process_under_the_launcher_can_write_nowhere(tmp_path: Path) -> None:
    given = tmp_path / "volume"  # a directory it is given, as a pod's volume (read-only)
    given.mkdir()
    candidates = ["/", "/tmp", "/dev/shm", "/run", "/var/tmp", str(confined.PROJECT_ROOT), str(given)]
    targets = [t for t in candidates if os.path.isdir(t)]
    report = _probe(tmp_path, confine=True, targets=targets)
    assert {t: report[t] for t in targets} == dict.fromkeys(targets, "EROFS")
    assert report["home"] == "~"  # no HOME and no passwd entry: nothing to expand to
    assert report["tempfile"] in ("ENOENT", "FileNotFoundError")  # no usable temporary directory
    assert report["remount"] == "EPERM"  # and no capability to make anything writable again
    assert not (given / "probe-write").exists()


def test_the_write_probe_sees_a_write_where_one_is_possible(tmp_path: Path) -> None:
    report = _probe(tmp_path, confine=False, targets=[str(tmp_path)])
    assert report[str(tmp_path)] == "written"
    assert report["tempfile"] == "created"
    assert (tmp_path / "probe-write").read_text() == "x"


def test_a_confined_process_is_stopped_by_its_pid(tmp_path: Path) -> None:
    """Component.stop signals the process group of the pid Popen returned: that is the command."""
    wait = "import signal; signal.pause()"
    component = confined.spawn("pause", [sys.executable, "-c", wait], tmp_path / "pause.log")

    def confined_yet() -> bool:
        return _status(component.process.pid)["Uid"].split()[0] == str(UID)

    processes.wait_until(
        confined_yet, timeout=30, what="the command running as the image user", process=component
    )
    assert violations(component.process.pid) == []
    component.stop(timeout=10)
    assert component.process.returncode == -signal.SIGTERM


def test_given_files_get_the_image_group_like_a_volume_with_fsgroup(tmp_path: Path) -> None:
    """A 0600 key becomes readable by the group, and only by it; what the image
    user can read already is left alone; an unreadable file elsewhere is refused, not changed."""
    certs = tmp_path / "certs"
    certs.mkdir(mode=0o700)
    key = certs / "tls.key"
    key.write_bytes(b"key")
    key.chmod(0o600)
    public = tmp_path / "config.yaml"
    public.write_text("{}")
    public.chmod(0o644)
    root_before = Path("/").stat()
    confined.grant_group([key, certs, public, Path("/")], UID, GID, within=[tmp_path])
    assert (key.stat().st_gid, key.stat().st_mode & 0o777) == (GID, 0o640)
    assert (certs.stat().st_gid, certs.stat().st_mode & 0o777) == (GID, 0o750)
    assert (public.stat().st_gid, public.stat().st_mode & 0o777) == (os.getegid(), 0o644)
    assert (Path("/").stat().st_gid, Path("/").stat().st_mode) == (root_before.st_gid, root_before.st_mode)
    outside = tmp_path / "outside"
    outside.write_bytes(b"private")
    outside.chmod(0o600)
    with pytest.raises(processes.ClusterError, match="not readable by the image user"):
        confined.grant_group([outside], UID, GID, within=[certs])
    assert (outside.stat().st_gid, outside.stat().st_mode & 0o777) == (os.getegid(), 0o600)


def _visibility_dns_names(port: int) -> list[str]:
    """The DNS names of the certificate the visibility port presents; none while it presents none
    (every handshake fails until a serving pair is in force)."""
    try:
        pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=2)
    except OSError:
        return []
    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )


async def test_a_job_is_held_and_admitted_by_the_confined_processes(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    ns = namespace_in
    quota = f"runtime-{ns}"
    kube.apply_quota(e2e_cluster, quota, ns, cpu="2")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "confined", "namespace": ns, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            }
        },
    }
    created = json.loads(
        kube.kubectl(e2e_cluster, "create", "-o", "json", "-f", "-", input_text=json.dumps(job)).stdout
    )
    assert created["spec"]["suspend"] is True  # held by the webhook at creation

    async def admitted() -> bool:
        out = kube.kubectl(e2e_cluster, "get", "job", "confined", "-n", ns, "-o", "json").stdout
        return json.loads(out)["spec"].get("suspend") is False

    await kube.eventually(admitted, timeout=60, what="the job admitted by the reconciler")
    system_e2e.check()

    # The visibility API's certificate, loaded into TLS without a writable disk (reconciler/visibility.py).
    port = _component(system_e2e, "reconciler").ports["visibility"]

    async def serving() -> list[str]:
        return _visibility_dns_names(port)

    dns = await kube.eventually(serving, timeout=30, what="the visibility API presenting its certificate")
    assert f"koord-queue-visibility-server.{names.COMPONENT_NAMESPACE}.svc" in dns

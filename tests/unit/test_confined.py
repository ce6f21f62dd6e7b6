"""The pure parts of ``testenv.confined`` (docs/development.md#runtime-constraints): which user,
which mounts, which environment, when. The launcher itself is tried for real in
tests/e2e/test_runtime_constraints.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testenv import confined
from testenv.processes import ClusterError

ROOT = confined.PROJECT_ROOT


def test_the_image_user_is_the_one_the_manifests_run_as_and_give_their_volumes() -> None:
    uid, gid = confined.image_user()
    assert uid != 0 and gid != 0
    for name in ("webhook.yaml", "reconciler.yaml"):
        docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / name).read_text()) if d]
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        context = deployment["spec"]["template"]["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid), name


def test_the_last_user_instruction_wins_and_a_missing_one_is_an_error() -> None:
    text = 'FROM a AS builder\nUSER 1000:1000\nFROM b\nUSER 65532:65533\nENTRYPOINT ["x"]\n'
    assert confined.parse_image_user(text) == (65532, 65533)
    with pytest.raises(ClusterError, match="USER"):
        confined.parse_image_user("FROM b\nUSER nonroot\n")


@pytest.mark.parametrize(
    ("value", "expected"), [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)]
)
def test_confinement_is_asked_for_with_1_only(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {confined.ENV: value}
    assert confined.requested(environ) is expected


def test_an_unclear_request_is_an_error_not_a_guess() -> None:
    with pytest.raises(ClusterError, match=confined.ENV):
        confined.requested({confined.ENV: "yes"})


def _plan(
    paths: list[str], *, blocked: frozenset[str] = frozenset(), dirs: frozenset[str] = frozenset()
) -> confined.Plan:
    return confined.plan_mounts(
        [Path(p) for p in paths], traversable=lambda p: str(p) not in blocked, is_dir=lambda p: str(p) in dirs
    )


def test_reachable_paths_need_no_mounts() -> None:
    assert _plan(["/work/main", "/tmp/x/cert"]) == confined.Plan()


def test_a_blocked_tree_is_covered_once_at_its_outermost_blocked_directory() -> None:
    blocked = frozenset({"/root", "/tmp/pytest-of-root", "/tmp/pytest-of-root/pytest-3"})
    dirs = frozenset({"/root/.pyenv/versions/3.11.7", "/tmp/pytest-of-root/pytest-3/system0/certs"})
    plan = _plan(
        [
            "/root/.pyenv/versions/3.11.7",
            "/tmp/pytest-of-root/pytest-3/system0/certs",
            "/tmp/pytest-of-root/pytest-3/system0/certs/tls.key",  # inside a bound directory
            "/tmp/pytest-of-root/pytest-3/cp0/kubeconfig",
            "/work/main/.venv",
        ],
        blocked=blocked,
        dirs=dirs,
    )
    assert plan.covers == ("/root", "/tmp/pytest-of-root")
    assert plan.binds == (
        ("/root/.pyenv/versions/3.11.7", True),
        ("/tmp/pytest-of-root/pytest-3/cp0/kubeconfig", False),
        ("/tmp/pytest-of-root/pytest-3/system0/certs", True),
    )
    assert confined.Plan.from_json(plan.to_json()) == plan


def test_absolute_paths_among_the_arguments_or_their_directories_are_mounted(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("{}")
    args = [
        "-m",
        "koord_queue.reconciler.main",
        f"--kubeconfig={config}",
        "--config",
        str(tmp_path),
        f"--later={tmp_path / 'published'}",  # appears later: its directory is the volume
        f"--missing={tmp_path / 'no' / 'such'}",
        "--port=9443",
        "relative/path",
    ]
    assert confined.argument_paths(args) == [config, tmp_path, tmp_path]


def test_the_environment_is_built_with_no_home_and_no_temporary_directory() -> None:
    env = confined.environment({"POD_NAMESPACE": "koord-queue"}, prefix="/opt/venv")
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["POD_NAMESPACE"] == "koord-queue"
    assert not set(confined.FORBIDDEN_ENV) & env.keys()
    with pytest.raises(ClusterError, match="HOME"):
        confined.environment({"HOME": "/tmp"})


def test_writable_mounts_are_named_from_mountinfo() -> None:
    mountinfo = (
        "46 45 254:0 / / ro,relatime - ext4 /dev/vda rw\n"
        "48 46 0:21 / /proc rw,relatime - proc proc rw\n"
        "62 61 0:23 / /dev/shm ro,nosuid - tmpfs tmpfs rw\n"
        "70 46 0:40 / /mnt/with\\040space rw,nosuid - tmpfs tmpfs rw\n"
    )
    assert confined.writable_mounts(mountinfo) == ["/proc", "/mnt/with space"]


def test_a_machine_that_cannot_confine_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """No silent fallback: each missing prerequisite is a ClusterError that names it."""
    check = confined.tools.__wrapped__
    monkeypatch.setattr("shutil.which", lambda name: None if name == "setpriv" else f"/usr/bin/{name}")
    with pytest.raises(ClusterError, match=r"needs setpriv \(util-linux\)"):
        check()
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match=f"needs root.*uid 1000.*{confined.ENV}=0"):
        check()

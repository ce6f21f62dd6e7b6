"""``make dist``'s release artifacts (README.md#release-artifacts, hack/dist.py).

Covers: one build of HEAD gives every artifact, each named with and carrying pyproject.toml's
version, listed in SHA256SUMS with its real checksum; a tree whose chart or image tags name another
version is refused; the krew manifest carries the archive's real sha256 and names files the archive
holds, and the archive is reproducible; the real krew (built from its Go module) refuses the archive
under another checksum, and installs it under the manifest; the plugin then runs through kubectl
(help, completion, version) from a private virtual environment holding none of the servers'
dependencies — and a launcher under a foreign name refuses to run; the
install manifest holds every object ``kubectl kustomize manifests/`` renders and a server-side dry
run against the real kube-apiserver accepts all of it, while a namespace user is refused it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hack import dist
from testenv import binaries
from testenv.cluster import LocalCluster
from tests import kube, tenancy

pytestmark = pytest.mark.integration

ROOT: Final = binaries.PROJECT_ROOT
VERSION: Final = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SERVER_ONLY: Final = ("cryptography", "prometheus-client", "tenacity")
BASE_URL: Final = "https://downloads.example.test/koord-queue"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Everything ``make dist`` builds, built the same way (hack/dist.py's ``dist``)."""
    folder = tmp_path_factory.mktemp("dist")
    dist.dist(ROOT, folder, BASE_URL, binaries.helm(), binaries.kubectl())
    return folder


def krew_manifest(out: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((out / "koord-queue.yaml").read_text())
    return manifest


def archive_of(out: Path) -> Path:
    return out / f"kubectl-koord_queue-v{VERSION}.tar.gz"


# --- every artifact, versioned ---------------------------------------------------------------------


def test_one_build_gives_every_artifact_named_with_the_version_and_checksummed(out: Path) -> None:
    expected = {
        f"koord_queue_py-{VERSION}.tar.gz",
        f"koord_queue_py-{VERSION}-py3-none-any.whl",
        f"koord-queue-{VERSION}.tgz",
        f"koord-queue-{VERSION}.yaml",
        f"kubectl-koord_queue-v{VERSION}.tar.gz",
        "koord-queue.yaml",
        "SHA256SUMS",
    }
    assert {path.name for path in out.iterdir()} == expected
    sums = {
        name: digest
        for digest, name in (line.split("  ") for line in (out / "SHA256SUMS").read_text().splitlines())
    }
    assert set(sums) == expected - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


def test_every_artifact_carries_the_version_inside(out: Path) -> None:
    with zipfile.ZipFile(out / f"koord_queue_py-{VERSION}-py3-none-any.whl") as wheel:
        (meta,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
        assert f"\nVersion: {VERSION}\n" in wheel.read(meta).decode()
    with tarfile.open(out / f"koord_queue_py-{VERSION}.tar.gz") as sdist:
        info = sdist.extractfile(f"koord_queue_py-{VERSION}/PKG-INFO")
        assert info is not None and f"\nVersion: {VERSION}\n" in info.read().decode()
    with tarfile.open(out / f"koord-queue-{VERSION}.tgz") as chart:
        chart_file = chart.extractfile("koord-queue/Chart.yaml")
        assert chart_file is not None
        chart_yaml = yaml.safe_load(chart_file.read())
        assert (chart_yaml["version"], chart_yaml["appVersion"]) == (VERSION, VERSION)
    install = out / f"koord-queue-{VERSION}.yaml"
    assert install.read_text().startswith(f"# koord-queue-py {VERSION} (commit ")
    images = {
        container["image"]
        for doc in yaml.safe_load_all(install.read_text())
        if doc and doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"koord-queue-py:{VERSION}"}
    assert krew_manifest(out)["spec"]["version"] == f"v{VERSION}"


def test_a_tree_naming_another_version_is_refused(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "charts/koord-queue/Chart.yaml", "charts/koord-queue/values.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "manifests").mkdir()
    kustomization = yaml.safe_load((ROOT / "manifests/kustomization.yaml").read_text())
    kustomization["images"] = [{"name": "koord-queue-py", "newName": "koord-queue-py", "newTag": VERSION}]
    (tmp_path / "manifests/kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    values = yaml.safe_load((tmp_path / "charts/koord-queue/values.yaml").read_text())
    values["image"]["tag"] = VERSION
    (tmp_path / "charts/koord-queue/values.yaml").write_text(yaml.safe_dump(values))
    assert dist.version_mismatches(tmp_path, VERSION) == []
    values["image"]["tag"] = "9.9.9"
    (tmp_path / "charts/koord-queue/values.yaml").write_text(yaml.safe_dump(values))
    assert dist.version_mismatches(tmp_path, VERSION) == [
        "charts/koord-queue/values.yaml image.tag is '9.9.9'"
    ]


# --- the krew plugin -------------------------------------------------------------------------------


def test_the_krew_manifest_carries_the_archives_real_checksum_and_names_its_files(out: Path) -> None:
    archive = archive_of(out)
    (platform,) = krew_manifest(out)["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["sha256"] != "0" * 64
    assert platform["uri"] == f"{BASE_URL}/v{VERSION}/{archive.name}"
    with tarfile.open(archive) as tar:
        members = {member.name: member for member in tar.getmembers()}
    for entry in platform["files"]:
        assert fnmatch.filter(members, entry["from"]), entry
    assert members[platform["bin"]].mode & 0o111, "the plugin's command is not executable"
    assert set(members) == {
        "kubectl-koord_queue",
        "kubectl_complete-koord_queue",
        f"koord_queue_py-{VERSION}-py3-none-any.whl",
    }


def test_the_krew_archive_is_reproducible(out: Path, tmp_path: Path) -> None:
    again = dist.krew_archive(
        out / f"koord_queue_py-{VERSION}-py3-none-any.whl", ROOT / dist.LAUNCHER, tmp_path, VERSION
    )
    assert again.read_bytes() == archive_of(out).read_bytes()


#: the krew the tests install with, built from its Go module like the other binaries (cached)
KREW_MODULE: Final = "sigs.k8s.io/krew/cmd/krew@v0.4.3"


@pytest.fixture(scope="module")
def krew() -> Path:
    """krew itself, so the archive and its manifest go through the real validation and install."""
    go = shutil.which("go")
    assert go is not None, "go is needed to build krew (as for the control-plane binaries)"
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "koord-queue-py" / "bin"
    folder = cache / f"krew-{KREW_MODULE.rsplit('@', 1)[1]}_{go_version.strip()}"
    if not (folder / "krew").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".krew-", dir=cache))
        env = {**os.environ, "GOBIN": str(staging), "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        subprocess.run([go, "install", KREW_MODULE], env=env, check=True, capture_output=True, timeout=900)
        try:
            staging.rename(folder)
        except OSError:
            shutil.rmtree(staging)  # built at the same time by another run: use that one
    return folder / "krew"


def tools(home: Path) -> Path:
    """A bin folder with the python3 the launcher runs under: the base interpreter, never this
    test's virtual environment."""
    folder = home / "tools"
    folder.mkdir(parents=True)
    python3 = Path(sys.base_prefix) / "bin" / "python3"
    assert python3.exists(), python3
    (folder / "python3").symlink_to(python3)
    return folder


def plugin_env(home: Path) -> dict[str, str]:
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    env = {key: value for key, value in os.environ.items() if key not in drop}
    env["KREW_ROOT"] = str(home / "krew")
    env["PATH"] = os.pathsep.join((str(home / "krew" / "bin"), str(home / "tools"), "/usr/bin", "/bin"))
    env["KUBECONFIG"] = str(home / "no-such-kubeconfig")
    return env


def test_krew_refuses_the_archive_under_a_manifest_with_another_checksum(
    out: Path, krew: Path, tmp_path: Path
) -> None:
    manifest = krew_manifest(out)
    (platform,) = manifest["spec"]["platforms"]
    platform["sha256"] = hashlib.sha256(b"another archive").hexdigest()
    (tmp_path / "koord-queue.yaml").write_text(yaml.safe_dump(manifest))
    done = subprocess.run(
        [str(krew), "install", f"--manifest={tmp_path / 'koord-queue.yaml'}", f"--archive={archive_of(out)}"],
        env=plugin_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "checksum does not match" in done.stderr, done.stderr
    assert not (tmp_path / "krew" / "bin" / "kubectl-koord_queue").exists()


def test_the_plugin_installs_with_krew_and_runs_without_the_servers_dependencies(
    out: Path, krew: Path, tmp_path: Path
) -> None:
    tools(tmp_path)
    env = plugin_env(tmp_path)
    krew_done = subprocess.run(
        [str(krew), "install", f"--manifest={out / 'koord-queue.yaml'}", f"--archive={archive_of(out)}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert krew_done.returncode == 0, krew_done.stderr
    store = tmp_path / "krew" / "store" / "koord-queue" / f"v{VERSION}"

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    # kubectl finds the plugin through krew's link on PATH.
    first = run(str(binaries.kubectl()), "koord-queue", "--help")
    assert first.returncode == 0, first.stderr
    assert "usage: kubectl koord-queue" in first.stdout
    assert "first use: installing" in first.stderr
    # Later runs reuse the private environment; the completion hook answers through it.
    again = run(str(store / "kubectl_complete-koord_queue"), "qu")
    assert again.returncode == 0, again.stderr
    assert (again.stdout, again.stderr) == ("quotas\n:4\n", "")
    assert run("kubectl-koord_queue", "completion", "bash").returncode == 0
    # The plugin's own version needs no cluster (here: no kubeconfig at all).
    version = run("kubectl-koord_queue", "version")
    assert version.returncode == 0, version.stderr
    assert f"Plugin version: {VERSION}" in version.stdout

    environment = store / "venv"
    listing = subprocess.run(
        [
            str(environment / "bin" / "python"),
            "-I",
            "-c",
            "import importlib.metadata as m, json;"
            "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    # names as PEP 503 normalises them: kubernetes_asyncio is kubernetes-asyncio
    installed = {
        re.sub(r"[-_.]+", "-", name): version for name, version in json.loads(listing.stdout).items()
    }
    assert installed.get("koord-queue-py") == VERSION
    assert {"aiohttp", "kubernetes-asyncio", "orjson", "pyyaml"} <= set(installed)
    assert not set(SERVER_ONLY) & set(installed), installed


def test_the_launcher_refuses_to_run_under_a_name_it_does_not_serve(tmp_path: Path) -> None:
    stray = tmp_path / "kubectl-other"
    shutil.copy(ROOT / dist.LAUNCHER, stray)
    done = subprocess.run([sys.executable, str(stray), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "unknown name 'kubectl-other'" in done.stderr
    assert not (tmp_path / "venv").exists()


# --- the install manifest --------------------------------------------------------------------------


def objects(text: str) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(text) if doc}


def test_the_install_manifest_holds_every_object_kustomize_renders(out: Path) -> None:
    installed = objects((out / f"koord-queue-{VERSION}.yaml").read_text())
    rendered = subprocess.run(
        [str(binaries.kubectl()), "kustomize", str(ROOT / "manifests")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    # The artifact is HEAD's; the working tree may have an object more or less being edited, but
    # never another set of kinds.
    assert {kind for kind, _ in installed} == {kind for kind, _ in objects(rendered)}
    for kind in ("CustomResourceDefinition", "Namespace", "ClusterRole", "Deployment", "ConfigMap"):
        assert any(k == kind for k, _ in installed), kind
    assert ("MutatingWebhookConfiguration", "koord-queue") in installed
    assert ("ValidatingAdmissionPolicy", "koord-queue-admission-gate") in installed


def test_a_server_side_dry_run_accepts_the_whole_install_manifest(
    out: Path, integration_cluster: LocalCluster
) -> None:
    install = out / f"koord-queue-{VERSION}.yaml"
    # A dry run creates nothing, not even the namespace the other objects go into.
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "koord-queue"}}
    kube.kubectl(integration_cluster, "apply", "-f", "-", input_text=yaml.safe_dump(namespace))
    done = kube.kubectl(
        integration_cluster, "apply", "--server-side", "--dry-run=server", "-f", str(install), check=False
    )
    assert done.returncode == 0, done.stderr
    applied = {line.split(" ", 1)[0] for line in done.stdout.splitlines()}
    for kind, name in objects(install.read_text()):
        assert any(
            entry.split("/", 1)[0].split(".", 1)[0] == kind.lower() and entry.split("/", 1)[1] == name
            for entry in applied
            if "/" in entry
        ), f"{kind}/{name} not in the apply output:\n{done.stdout}"


async def test_a_namespace_user_cannot_apply_the_install_manifest(
    out: Path, integration_cluster: LocalCluster, namespace_in: str
) -> None:
    tenancy.grant(integration_cluster, namespace_in)

    async def rights_loaded() -> bool:
        can = tenancy.as_user(
            integration_cluster, tenancy.ALICE, "auth", "can-i", "create", "configmaps", "-n", namespace_in
        )
        return can.stdout.strip() == "yes"

    await kube.eventually(rights_loaded, timeout=30, what="alice's namespace rights")
    done = tenancy.as_user(
        integration_cluster,
        tenancy.ALICE,
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        str(out / f"koord-queue-{VERSION}.yaml"),
    )
    assert done.returncode != 0
    assert "forbidden" in done.stderr.lower()
    assert "customresourcedefinitions" in done.stderr

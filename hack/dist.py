"""``make dist``: the release artifacts of one version, in one folder (README.md#release-artifacts).

Everything is built from the committed tree (``git archive HEAD``), not the working tree: a release
is a commit, uncommitted edits never leak into it, and setuptools' ``build/`` folder stays out of
the repository. Every artifact carries the version of pyproject.toml; the chart, its default image
tag and the kustomization's image tag must say the same version, or nothing is built.

* ``koord_queue_py-V.tar.gz`` and ``koord_queue_py-V-py3-none-any.whl``: ``python -m build
  --no-isolation`` (offline, the virtual environment's setuptools; the wheel is built from the sdist,
  which proves the sdist complete),
* ``koord-queue-V.tgz``: ``helm package charts/koord-queue`` with the pinned helm (testenv.binaries),
* ``koord-queue-V.yaml``: the whole install for ``kubectl apply -f``, rendered by ``kubectl kustomize
  manifests/``: the manifests are the source the chart is generated from (testenv/chart.py), and the
  rendering has the CRDs in line and no Helm release labels,
* ``kubectl-koord_queue-vV.tar.gz`` and ``koord-queue.yaml``: the kubectl plugin's krew archive (the
  wheel and plugins/krew/launcher.py as both plugin commands) and its krew manifest, made from
  plugins/krew/koord-queue.yaml with the archive's real sha256,
* ``SHA256SUMS`` of all of them.

The wheel (file times from ``SOURCE_DATE_EPOCH``, the commit's time) and the krew archive (fixed
order, owners, times and modes) are byte-for-byte reproducible: the same commit gives the same krew
checksum. The sdist and the chart archive are not (their archivers stamp the build time).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Final

import yaml

from testenv import binaries

ROOT: Final = Path(__file__).resolve().parents[1]
KREW_TEMPLATE: Final = Path("plugins/krew/koord-queue.yaml")
LAUNCHER: Final = Path("plugins/krew/launcher.py")
#: the archive's members that are the launcher, as the krew manifest's ``files`` name them
PLUGIN_COMMANDS: Final = ("kubectl-koord_queue", "kubectl_complete-koord_queue")
DEFAULT_BASE_URL: Final = "https://example.invalid/koord-queue-py/releases"
#: what a rebuild into the same folder replaces (and nothing else there)
ARTIFACT_GLOBS: Final = (
    "koord_queue_py-*",
    "koord-queue-*.tgz",
    "koord-queue-*.yaml",
    "kubectl-koord_queue-*.tar.gz",
    "koord-queue.yaml",
    "SHA256SUMS",
)


class DistError(Exception):
    """The artifacts cannot be built as asked; the message says why."""


def project_version(source: Path) -> str:
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    assert isinstance(version, str)
    return version


def version_mismatches(source: Path, version: str) -> list[str]:
    """Where the tree names another version than pyproject.toml: the chart and both image tags."""
    chart = yaml.safe_load((source / "charts/koord-queue/Chart.yaml").read_text())
    values = yaml.safe_load((source / "charts/koord-queue/values.yaml").read_text())
    kustomization = yaml.safe_load((source / "manifests/kustomization.yaml").read_text())
    found = {
        "charts/koord-queue/Chart.yaml version": chart.get("version"),
        "charts/koord-queue/Chart.yaml appVersion": chart.get("appVersion"),
        "charts/koord-queue/values.yaml image.tag": (values.get("image") or {}).get("tag"),
        **{
            f"manifests/kustomization.yaml images[{image.get('name')}].newTag": image.get("newTag")
            for image in kustomization.get("images") or []
        },
    }
    return [f"{where} is {value!r}" for where, value in found.items() if str(value) != version]


def export_head(root: Path, dest: Path) -> tuple[str, int]:
    """``git archive HEAD`` unpacked into ``dest`` (links kept as links); returns the commit and its
    time (seconds since the epoch)."""
    commit, epoch = subprocess.run(
        ["git", "log", "-1", "--format=%H %ct", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=root, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return commit, int(epoch)


def build_python(source: Path, out: Path, version: str, epoch: int) -> tuple[Path, Path]:
    """The sdist and the wheel (from the sdist), offline with the running interpreter's setuptools;
    file times are the commit's (``SOURCE_DATE_EPOCH``), so the same commit gives the same wheel."""
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    )
    sdist = out / f"koord_queue_py-{version}.tar.gz"
    wheel = out / f"koord_queue_py-{version}-py3-none-any.whl"
    for path in (sdist, wheel):
        if not path.is_file():
            raise DistError(f"python -m build did not produce {path.name}")
    return sdist, wheel


def helm_package(helm: Path, source: Path, out: Path, version: str) -> Path:
    subprocess.run(
        [str(helm), "package", str(source / "charts/koord-queue"), "--destination", str(out)],
        check=True,
        capture_output=True,
    )
    chart = out / f"koord-queue-{version}.tgz"
    if not chart.is_file():
        raise DistError(f"helm package did not produce {chart.name}")
    return chart


def install_manifest(kubectl: Path, source: Path, out: Path, version: str, commit: str) -> Path:
    """Every object ``kubectl apply -k manifests/`` creates, as one file for ``kubectl apply -f``."""
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(source / "manifests")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = out / f"koord-queue-{version}.yaml"
    header = (
        f"# koord-queue-py {version} (commit {commit}): the whole install, rendered from manifests/ by\n"
        "# `kubectl kustomize`. Apply with: kubectl apply --server-side -f <this file>\n"
        "# (docs/operations.md#apply-the-manifests)\n"
    )
    path.write_text(header + rendered)
    return path


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def krew_archive(wheel: Path, launcher: Path, out: Path, version: str) -> Path:
    """The plugin's krew archive: the launcher under both command names and the wheel; reproducible."""
    path = out / f"kubectl-koord_queue-v{version}.tar.gz"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for command in PLUGIN_COMMANDS:
            _add(tar, command, launcher.read_bytes(), 0o755)
        _add(tar, wheel.name, wheel.read_bytes(), 0o644)
    with path.open("wb") as file, gzip.GzipFile(filename="", mode="wb", fileobj=file, mtime=0) as gz:
        gz.write(raw.getvalue())
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, the way the template has them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _string)


def krew_manifest(template: Path, archive: Path, out: Path, version: str, base_url: str) -> Path:
    """plugins/krew/koord-queue.yaml with this version, the archive's address and its real sha256."""
    manifest: dict[str, Any] = yaml.safe_load(template.read_text())
    manifest["spec"]["version"] = f"v{version}"
    (platform,) = manifest["spec"]["platforms"]
    platform["uri"] = f"{base_url.rstrip('/')}/v{version}/{archive.name}"
    platform["sha256"] = sha256(archive)
    path = out / "koord-queue.yaml"
    header = (
        f"# krew manifest of kubectl koord-queue {version}, written by `make dist` (hack/dist.py).\n"
        "# Install from the local archive:\n"
        f"#   kubectl krew install --manifest={path.name} --archive={archive.name}\n"
    )
    path.write_text(header + yaml.dump(manifest, Dumper=_BlockDumper, sort_keys=False, width=100))
    return path


def build_krew(source: Path, wheel: Path, out: Path, version: str, base_url: str) -> tuple[Path, Path]:
    """The krew archive and its manifest, from ``source``'s launcher and template."""
    archive = krew_archive(wheel, source / LAUNCHER, out, version)
    return archive, krew_manifest(source / KREW_TEMPLATE, archive, out, version, base_url)


def clear(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pattern in ARTIFACT_GLOBS:
        for path in out.glob(pattern):
            path.unlink()


def dist(root: Path, out: Path, base_url: str, helm: Path, kubectl: Path) -> list[Path]:
    """All artifacts of HEAD into ``out``; returns them."""
    with tempfile.TemporaryDirectory(prefix="koord-queue-dist-") as tmp:
        source = Path(tmp) / "source"
        commit, epoch = export_head(root, source)
        version = project_version(source)
        if mismatches := version_mismatches(source, version):
            raise DistError(f"pyproject.toml says {version}, but " + "; ".join(mismatches))
        clear(out)
        sdist, wheel = build_python(source, out, version, epoch)
        artifacts = [
            sdist,
            wheel,
            helm_package(helm, source, out, version),
            install_manifest(kubectl, source, out, version, commit),
            *build_krew(source, wheel, out, version, base_url),
        ]
    sums = out / "SHA256SUMS"
    sums.write_text("".join(f"{sha256(path)}  {path.name}\n" for path in artifacts))
    return [*artifacts, sums]


def uncommitted(root: Path) -> bool:
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
    )
    return bool(status.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the artifacts go (dist/)")
    parser.add_argument(
        "--base-url", default=DEFAULT_BASE_URL, help="where the krew archive will be published (its uri)"
    )
    args = parser.parse_args(argv)
    if uncommitted(ROOT):
        print("dist: building HEAD; uncommitted changes are not included", file=sys.stderr)
    try:
        # the pinned helm, built on demand; kubectl as the tests find it
        artifacts = dist(ROOT, args.out, args.base_url, binaries.helm(), binaries.kubectl())
    except (DistError, subprocess.CalledProcessError) as err:
        stderr = getattr(err, "stderr", None)
        detail = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
        print(f"dist: {err}\n{detail}", file=sys.stderr)
        return 1
    for path in artifacts:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

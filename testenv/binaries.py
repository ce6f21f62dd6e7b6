"""Find the control-plane binaries, building them when they are missing.

The binaries are built from Go modules by ``hack/build-binaries.sh`` into a versioned cache outside
the work tree (CI runs in a fresh clone on the same machine and must reuse them). A user who already
has envtest binaries points ``KUBEBUILDER_ASSETS`` at them; any binary found there wins, and only what
is missing (for example kwok, which envtest does not ship) comes from the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = PROJECT_ROOT / "hack" / "build-binaries.sh"

INTEGRATION_BINARIES = ("etcd", "kube-apiserver")
E2E_BINARIES = (*INTEGRATION_BINARIES, "kube-controller-manager", "kube-scheduler", "kwok")


class BinariesError(RuntimeError):
    """The binaries could not be found or built; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of every binary a profile needs."""

    paths: dict[str, Path]

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]


def _from_assets(names: tuple[str, ...]) -> dict[str, Path]:
    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    found: dict[str, Path] = {}
    if not assets:
        return found
    for name in names:
        candidate = Path(assets) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found[name] = candidate
    return found


def build(*, quiet: bool = False, target: str = "", args: tuple[str, ...] = ()) -> Path:
    """Run the build script (a no-op when the cache is warm) and return the cache directory.

    ``target="helm"`` builds helm (hack/helmbin) into its own keyed directory instead, and
    ``target="operator", args=(name,)`` the job operator of hack/operators/<name>."""
    if not BUILD_SCRIPT.is_file():
        raise BinariesError(f"build script not found: {BUILD_SCRIPT}")
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *([target] if target else []), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        what = " ".join((target, *args)) or "the control-plane binaries"
        raise BinariesError(
            f"building {what} failed (exit {result.returncode}); "
            f"run {BUILD_SCRIPT} {' '.join((target, *args))} to see the Go error".rstrip()
        )
    out = result.stdout.strip().splitlines()
    if not out:
        raise BinariesError("the build script printed no output directory")
    return Path(out[-1])


def resolve(names: tuple[str, ...] = E2E_BINARIES) -> Binaries:
    """Return every binary in ``names``: from KUBEBUILDER_ASSETS first, the build cache for the rest."""
    found = _from_assets(names)
    missing = [n for n in names if n not in found]
    if missing:
        directory = build()
        for name in missing:
            candidate = directory / name
            if not candidate.is_file():
                raise BinariesError(f"{name} is missing from {directory}")
            found[name] = candidate
    return Binaries(paths=found)


def kubectl() -> Path:
    """The kubectl to drive the cluster with: KUBEBUILDER_ASSETS, then PATH."""
    found = _from_assets(("kubectl",))
    if "kubectl" in found:
        return found["kubectl"]
    on_path = shutil.which("kubectl")
    if on_path is None:
        raise BinariesError("kubectl not found on PATH or in KUBEBUILDER_ASSETS")
    return Path(on_path)


def helm() -> Path:
    """The helm the chart tests use: KUBEBUILDER_ASSETS, else built from hack/helmbin (pinned, like
    the control plane; a helm on PATH may be any version)."""
    found = _from_assets(("helm",))
    if "helm" in found:
        return found["helm"]
    candidate = build(target="helm") / "helm"
    if not candidate.is_file():
        raise BinariesError(f"helm is missing from {candidate.parent}")
    return candidate


#: The job operators the e2e tests run for real (tests/e2e/test_operators.py): a directory of
#: hack/operators each, built on demand like helm and reported by ``make testenv``.
OPERATORS = ("kuberay", "training-operator", "argo-workflow-controller")


@dataclass(frozen=True, slots=True)
class Operator:
    """A job operator built from its Go module, with the CRDs of the same module version."""

    name: str
    binary: Path
    crds: tuple[Path, ...]


def operator(name: str) -> Operator:
    """Build (or find in the cache) the operator of hack/operators/<name> and its CRDs.

    The operator's own CRDs, not the cut-down ones of tests/crds: the operator writes fields those
    do not declare, and the apiserver would prune them."""
    if name not in OPERATORS:
        raise BinariesError(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}")
    directory = build(target="operator", args=(name,))
    binary = directory / name
    crds = tuple(sorted((directory / "crds").glob("*.yaml")))
    if not binary.is_file() or not crds:
        raise BinariesError(f"{name} or its CRDs are missing from {directory}")
    return Operator(name=name, binary=binary, crds=crds)


def main() -> None:
    """``make testenv``: build (or find) every binary and print where they are."""
    binaries = resolve()
    paths = {**binaries.paths, "helm": helm()}
    paths.update({name: operator(name).binary for name in OPERATORS})
    for name, path in sorted(paths.items()):
        print(f"{name}: {path}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

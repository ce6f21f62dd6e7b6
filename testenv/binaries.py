"""Find the control-plane binaries, building them when they are missing.

The binaries are built from Go modules by ``hack/build-binaries.sh`` into a versioned cache outside
the work tree (CI runs in a fresh clone on the same machine and must reuse them). A user who already
has envtest binaries points ``KUBEBUILDER_ASSETS`` at them; any binary found there wins, and only what
is missing (for example kwok, which envtest does not ship) comes from the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = PROJECT_ROOT / "hack" / "build-binaries.sh"

#: The Go release every pinned module builds with: the highest `go` line of the wrapper modules in
#: hack/ (helm v3.22 and kwok v0.8 ask for 1.26). README.md's prerequisites state it, and
#: tests/unit/test_prerequisites.py keeps the two equal; ``check_go`` fails a build loudly when a
#: bumped module asks for more, so the README is raised with it (docs/development.md#set-up).
GO_VERSION = "1.26"

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


def _go_release(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a Go version as go.mod (``1.26.0``, ``1.24``) or ``go env GOVERSION``
    (``go1.26.8``, ``go1.27rc1``) writes it."""
    match = re.match(r"(?:go)?(\d+)\.(\d+)", text.strip())
    if match is None:
        raise BinariesError(f"not a Go version: {text!r}")
    return int(match[1]), int(match[2])


def pinned_go_requirements(hack: Path = PROJECT_ROOT / "hack") -> dict[Path, str]:
    """The `go` line of every wrapper module under ``hack`` (control plane, kwok, helm, operators).

    A wrapper's line is at least every dependency's own (the go command refuses a main module that
    declares less than a module it requires), so these lines are what the pinned modules need."""
    found: dict[Path, str] = {}
    for go_mod in sorted(hack.rglob("go.mod")):
        for line in go_mod.read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "go":
                found[go_mod] = words[1]
                break
    return found


def check_go(hack: Path = PROJECT_ROOT / "hack", local: str | None = None) -> None:
    """Fail loudly before a build when a pinned module asks for a newer Go than ``GO_VERSION`` (the
    README would then be wrong), or when the local toolchain is older than ``GO_VERSION`` (the build
    runs with GOTOOLCHAIN=local and would fail deep in the module graph). ``local`` is the
    toolchain's ``go env GOVERSION``; asked of ``go`` when not given."""
    stated = _go_release(GO_VERSION)
    for go_mod, version in pinned_go_requirements(hack).items():
        if _go_release(version) > stated:
            raise BinariesError(
                f"{go_mod} asks for go {version}, more than testenv.binaries.GO_VERSION ({GO_VERSION}): "
                "raise GO_VERSION and the Go version in README.md's prerequisites together"
            )
    if local is None:
        go = shutil.which("go")
        if go is None:
            raise BinariesError(f"go not found on PATH: building the binaries needs Go {GO_VERSION}+")
        local = subprocess.run(
            [go, "env", "GOVERSION"], capture_output=True, text=True, check=True
        ).stdout.strip()
    if _go_release(local) < stated:
        raise BinariesError(f"building the binaries needs Go {GO_VERSION}+, found {local} (README.md)")


def build(*, quiet: bool = False, target: str = "", args: tuple[str, ...] = ()) -> Path:
    """Run the build script (a no-op when the cache is warm) and return the cache directory.

    ``target="helm"`` builds helm (hack/helmbin) into its own keyed directory instead, and
    ``target="operator", args=(name,)`` the job operator of hack/operators/<name>."""
    if not BUILD_SCRIPT.is_file():
        raise BinariesError(f"build script not found: {BUILD_SCRIPT}")
    check_go()
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

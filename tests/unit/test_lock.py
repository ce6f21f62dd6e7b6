"""The locked dependencies agree with pyproject.toml (docs/development.md#locked-dependencies).

``make venv``, the container image and ``make bench`` install from requirements/*.txt with
``--require-hashes``; pyproject.toml says what the package accepts. These tests fail when the two
drift apart: a declared dependency missing from a lock or pinned outside its specifier, a pin
without a hash, two locks pinning one package differently, or a floor that lets back in a release
with a published advisory.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT: Final = Path(__file__).resolve().parents[2]
PYPROJECT: Final = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT: Final = canonicalize_name(PYPROJECT["project"]["name"])

#: each lock and what it covers: extras, and whether the build backend's requirements are in it
LOCKS: Final = {
    "server.txt": (("server",), True),
    "dev.txt": (("server", "dev"), False),
    "bench.txt": (("server", "dev", "bench"), False),
}

#: the first release past the newest advisory we know of, per runtime dependency; a floor below it
#: would let `pip install koord-queue-py` pick a release with a published advisory
ADVISORY_FLOORS: Final = {
    "aiohttp": "3.14.3",
    "cryptography": "46.0.5",
    "orjson": "3.11.6",
    "pyyaml": "5.4",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def read_lock(name: str) -> dict[str, tuple[Version, int]]:
    """``{package: (pinned version, number of hashes)}`` of requirements/<name>."""
    pins: dict[str, tuple[Version, int]] = {}
    current = ""
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match[1])
            assert current not in pins, f"{name} pins {current} twice"
            pins[current] = (Version(match[2]), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#")):
            pytest.fail(f"{name}: a line the lock should not have (pins and hashes only): {line!r}")
    return pins


def declared(extras: Iterable[str], *, build: bool) -> list[Requirement]:
    """The requirements pyproject.toml declares for the package with ``extras``: its own
    self-references (``koord-queue-py[server]`` in dev) expand to the extras they name."""
    optional: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
    pending = list(extras)
    seen: set[str] = set()
    found = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    if build:
        found += [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == PROJECT:
                pending.extend(requirement.extras)
            else:
                found.append(requirement)
    return found


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_declared_dependency_is_locked_within_its_specifier(lock: str) -> None:
    extras, build = LOCKS[lock]
    pins = read_lock(lock)
    problems = []
    for requirement in declared(extras, build=build):
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement} is not in requirements/{lock}")
        elif not requirement.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"requirements/{lock} pins {name}=={pins[name][0]}, outside {requirement}")
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_has_a_hash(lock: str) -> None:
    pins = read_lock(lock)
    assert pins, f"requirements/{lock} pins nothing"
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"requirements/{lock} pins without a hash: {unhashed}"


def test_the_locks_pin_each_package_at_one_version() -> None:
    seen: dict[str, tuple[Version, str]] = {}
    problems = []
    for lock in sorted(LOCKS):
        for name, (version, _) in read_lock(lock).items():
            first = seen.setdefault(name, (version, lock))
            if first[0] != version:
                problems.append(f"{name}: {first[0]} in {first[1]}, {version} in {lock}")
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_the_lint_tools_are_pinned() -> None:
    """`make lint` gives the same verdict on every machine only with the same ruff, mypy and
    import-linter."""
    pins = read_lock("dev.txt")
    assert {"ruff", "mypy", "import-linter", "pytest", "pytest-asyncio"} <= pins.keys()


@pytest.mark.parametrize("package", sorted(ADVISORY_FLOORS))
def test_the_floor_excludes_releases_with_advisories(package: str) -> None:
    everything = declared(PYPROJECT["project"]["optional-dependencies"], build=False)
    matching = [r for r in everything if canonicalize_name(r.name) == package]
    assert matching, f"{package} is no longer declared: drop it from ADVISORY_FLOORS"
    fixed = Version(ADVISORY_FLOORS[package])
    for requirement in matching:
        floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", ">", "==", "~=")]
        assert floors and max(floors) >= fixed, f"{requirement}: the floor must be at least {fixed}"


def test_pytest_asyncio_floor_knows_the_loop_scope_setting() -> None:
    """`asyncio_default_test_loop_scope` (tool.pytest in pyproject.toml) appeared in pytest-asyncio
    0.26; an older one warns about an unknown option, which filterwarnings=error turns into a failure."""
    options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert "asyncio_default_test_loop_scope" in options
    (requirement,) = [r for r in declared(["dev"], build=False) if r.name == "pytest-asyncio"]
    assert not requirement.specifier.contains(Version("0.25.3")), requirement

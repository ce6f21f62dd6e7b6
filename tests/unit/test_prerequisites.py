"""README.md states exactly what a fresh machine needs (README.md#prerequisites).

The Go version follows from the pinned modules in hack/: ``testenv.binaries.GO_VERSION`` records it,
the build refuses to start when a module asks for more (``check_go``), and these tests keep the
README and docs/development.md#set-up equal to that constant, and the Python version equal to
``requires-python``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Final

import pytest

from testenv import binaries

ROOT: Final = Path(__file__).resolve().parents[2]
STATED_GO: Final = re.compile(r"\bGo (\d+\.\d+)\+")
STATED_PYTHON: Final = re.compile(r"\bPython (\d+\.\d+)\+")
DOCUMENTS: Final = ("README.md", "docs/development.md")


def release(version: str) -> str:
    """``1.26`` of ``1.26.0``."""
    return ".".join(version.split(".")[:2])


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_documents_state_the_go_version_the_pinned_modules_need(document: str) -> None:
    stated = STATED_GO.findall((ROOT / document).read_text())
    assert stated, f"{document} states no Go version (`Go X.Y+`)"
    needed = binaries.GO_VERSION
    assert set(stated) == {needed}, f"{document} says Go {stated}, the modules need {needed}"


def test_go_version_is_what_the_most_demanding_pinned_module_asks_for() -> None:
    """Not less (the build would fail) and not more (the README would ask for a Go nobody needs)."""
    needed = binaries.pinned_go_requirements()
    assert {path.parent.name for path in needed} >= {"k8sbins", "kwokbin", "helmbin", *binaries.OPERATORS}
    highest = max(needed.values(), key=lambda v: tuple(int(p) for p in release(v).split(".")))
    assert release(highest) == binaries.GO_VERSION


def test_a_module_asking_for_a_newer_go_stops_the_build(tmp_path: Path) -> None:
    (tmp_path / "kwokbin").mkdir()
    (tmp_path / "kwokbin" / "go.mod").write_text("module kwokbin\n\ngo 1.26.0\n")
    binaries.check_go(tmp_path, local="go1.26.8")
    (tmp_path / "operators" / "next").mkdir(parents=True)
    (tmp_path / "operators" / "next" / "go.mod").write_text("module next\n\ngo 1.27.1\n\ntool x/y\n")
    with pytest.raises(binaries.BinariesError, match=r"operators/next/go.mod asks for go 1\.27\.1.*README"):
        binaries.check_go(tmp_path, local="go1.27.1")


def test_an_older_local_go_is_refused_before_the_build(tmp_path: Path) -> None:
    (tmp_path / "helmbin").mkdir()
    (tmp_path / "helmbin" / "go.mod").write_text("module helmbin\n\ngo 1.26.0\n")
    with pytest.raises(binaries.BinariesError, match=r"needs Go 1\.26\+, found go1\.25\.3"):
        binaries.check_go(tmp_path, local="go1.25.3")
    binaries.check_go(tmp_path, local="go1.27rc1")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_documents_state_the_python_version_of_requires_python(document: str) -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires.startswith(">="), requires
    stated = STATED_PYTHON.findall((ROOT / document).read_text())
    assert stated, f"{document} states no Python version (`Python X.Y+`)"
    assert set(stated) == {release(requires.removeprefix(">="))}, stated

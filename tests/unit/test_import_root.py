"""One import root for the product (docs/development.md#one-import-root).

The wheel installs one name, ``koord_queue``; the kubectl plugin runs from it without the servers'
dependencies or the test harness; and nothing in the repository imports a product folder by its
bare name, which would load a second copy of the module beside the one ``koord_queue`` loads.
"""

from __future__ import annotations

import ast
import email.parser
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
#: the design's top-level folders, reached only as ``koord_queue.<name>``
LINKED: Final = ("certs", "reconciler", "shared", "webhook")
#: what only the servers need: the ``server`` extra
SERVER_ONLY: Final = ("cryptography", "prometheus_client", "tenacity")


def tracked_files(*patterns: str) -> Iterator[Path]:
    """The repository's files (those matching ``patterns``, if given) that exist now: tracked, or new
    and not ignored (about to be added)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.is_symlink() or path.is_file():
            yield path


def tracked_python_files() -> Iterator[Path]:
    yield from (path for path in tracked_files("*.py") if not path.is_symlink())


def bare_imports(source: str) -> list[str]:
    """The imports in ``source`` that name a linked folder by its bare name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if name.split(".")[0] in LINKED]
    return found


def test_the_checker_finds_a_bare_import_and_passes_the_namespaced_one() -> None:
    source = "import shared.api\nfrom reconciler import jobs\nfrom koord_queue.shared.api import names\n"
    assert bare_imports(source) == ["line 1: shared.api", "line 2: reconciler"]


def test_nothing_in_the_repository_imports_a_product_folder_by_its_bare_name() -> None:
    offenders = {
        path.relative_to(ROOT).as_posix(): found
        for path in tracked_python_files()
        if (found := bare_imports(path.read_text()))
    }
    assert offenders == {}


def test_the_package_links_the_design_folders() -> None:
    package = ROOT / "koord_queue"
    for name in LINKED:
        link = package / name
        assert link.is_symlink() and link.resolve() == ROOT / name, name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built offline with the virtual environment's setuptools from a copy of the
    repository's tracked files (links kept as links): setuptools builds in the source tree, and its
    ``build/`` would otherwise outlive the test and carry deleted modules into the next wheel."""
    source = tmp_path_factory.mktemp("source")
    for path in tracked_files():
        target = source / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target, follow_symlinks=False)
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
    ]
    subprocess.run([*command, str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("koord_queue_py-*.whl")
    return built


def test_the_wheel_installs_one_import_name_and_no_harness(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"koord_queue"}
    for module in (
        "shared/kube.py",
        "shared/api/names.py",
        "webhook/main.py",
        "reconciler/main.py",
        "cli/main.py",
    ):
        assert f"koord_queue/{module}" in names, module
    assert not [name for name in names if "/testenv/" in name or "/tests/" in name or "/chaos/" in name]


def test_the_wheel_requires_the_servers_dependencies_only_with_the_server_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(meta).decode())
    requires = metadata.get_all("Requires-Dist") or []
    plain = {req.split(">")[0].split("[")[0].strip().lower() for req in requires if "extra ==" not in req}
    server = {req.split(">")[0].strip().lower() for req in requires if 'extra == "server"' in req}
    assert plain == {"aiohttp", "kubernetes-asyncio", "orjson", "pyyaml"}
    assert server == {"cryptography", "prometheus-client", "tenacity"}


def test_the_plugin_runs_from_the_wheel_without_the_servers_dependencies_or_the_harness(
    wheel: Path, tmp_path: Path
) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    refused = (*SERVER_ONLY, "testenv", "chaos", "tests", "koord_queue.webhook", "koord_queue.reconciler")
    script = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        REFUSED = {refused!r}

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if any(name == r or name.startswith(r + ".") for r in REFUSED):
                    raise ImportError("refused in this test: " + name)
                return None

        sys.meta_path.insert(0, Refuse())
        sys.path.insert(0, {str(tmp_path)!r})
        import koord_queue.cli
        assert koord_queue.cli.__file__.startswith({str(tmp_path)!r}), koord_queue.cli.__file__
        for module in pkgutil.walk_packages(koord_queue.cli.__path__, "koord_queue.cli."):
            importlib.import_module(module.name)
        from koord_queue.cli import main
        sys.argv = ["kubectl-koord_queue", "--help"]
        main.entry()
        """
    )
    # -I: no user site, no PYTHONPATH, and not the repository's folders from the working directory
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage: kubectl koord-queue" in done.stdout

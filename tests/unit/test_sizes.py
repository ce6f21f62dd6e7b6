"""Product code stays small enough to read in one sitting (docs/development.md#sizes).

Two limits, kept by this test rather than by anyone's memory:

* a product module has at most :data:`MODULE_LIMIT` lines (physical lines, as ``wc -l`` counts
  them);
* a product function or method has at most :data:`FUNCTION_LIMIT` lines, counted from its first
  decorator (or its ``def``) to its last line: docstring, comments and blank lines included, since a
  reader reads them too. A nested function counts on its own and inside the function around it.

*Product* is what the wheel ships: the top-level packages named by ``[tool.setuptools.packages.find]``
in ``pyproject.toml`` (read from there, so a new package is covered the day it is added). That
includes ``testenv``, which ships with the ``koord-queue-localcluster`` command and is what
``make run`` and ``make demo`` start, the first code a newcomer runs. ``tests/``, ``bench/`` and
``chaos/`` are not shipped: they are harnesses whose scenario tables and attack lists grow with
each case they cover, and their size says nothing about how hard the system is to read.

Existing offenders are listed in :data:`ALLOWED` with their size when listed as a ceiling and a
reason. The test fails when an entry grows past its ceiling, and when it no longer exceeds the limit
(or no longer exists), so the list only shrinks: whoever splits an offender deletes its entry.

The checker is tested first on synthetic sources, so a failure further down is about the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: docs/development.md#sizes: "a few hundred lines" per module, made a number.
MODULE_LIMIT: Final = 600
#: docs/development.md#sizes: about two screens, docstring included.
FUNCTION_LIMIT: Final = 100


@dataclass(frozen=True)
class Allowed:
    """An existing offender: the size it may not grow beyond, and why it is still this large."""

    ceiling: int
    why: str


#: ``path`` for a module, ``path::Qualified.name`` for a function.
ALLOWED: Final[Mapping[str, Allowed]] = {
    # --- modules (limit: MODULE_LIMIT) ---
    "reconciler/jobs.py": Allowed(
        739, "the job controller's wiring, handlers and the view; decision and actions live apart"
    ),
    # --- functions (limit: FUNCTION_LIMIT) ---
    "testenv/webhooks.py::configurations": Allowed(152, "webhook objects as literals, as manifests/"),
}


# --- the checker ------------------------------------------------------------------------------------


#: The folders holding product code: the design's top-level packages (which ``koord_queue`` links),
#: the plugin and the package root, and the test harness that ``make run`` starts.
PRODUCT_FOLDERS: Final = ("certs", "koord_queue", "reconciler", "shared", "testenv", "webhook")


def function_sizes(source: str) -> dict[str, int]:
    """Every function and method of ``source`` by qualified name (``Class.method``,
    ``outer.inner``), with its line count as the module docstring defines it. Two definitions of
    one name (a property and its setter) keep the larger."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    length = (child.end_lineno or child.lineno) - first + 1
                    sizes[name] = max(length, sizes.get(name, 0))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return sizes


def sizes_of(files: Mapping[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """``(module sizes, function sizes)`` of ``{path: source}``, keyed as :data:`ALLOWED` is."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path, source in files.items():
        modules[path] = len(source.splitlines())
        for name, length in function_sizes(source).items():
            functions[f"{path}::{name}"] = length
    return modules, functions


def problems(sizes: Mapping[str, int], limit: int, allowed: Mapping[str, Allowed]) -> list[str]:
    """What breaks the rule, one sentence each: a size over ``limit`` that is not allowed, an
    allowed one over its ceiling, and an allowed entry that is gone or back within the limit."""
    out: list[str] = []
    for key, size in sorted(sizes.items()):
        entry = allowed.get(key)
        if entry is None and size > limit:
            out.append(
                f"{key}: {size} lines, over the limit of {limit}; split it (docs/development.md#sizes)"
            )
        elif entry is not None and size > entry.ceiling:
            out.append(
                f"{key}: {size} lines, over its allow-listed ceiling of {entry.ceiling}; split it, or "
                "raise the ceiling in tests/unit/test_sizes.py if it must grow"
            )
    for key in sorted(allowed):
        now = sizes.get(key)
        if now is None:
            out.append(f"{key}: allow-listed but gone; delete its entry from tests/unit/test_sizes.py")
        elif now <= limit:
            out.append(
                f"{key}: {now} lines, within the limit of {limit} now; delete its entry from "
                "tests/unit/test_sizes.py so it stays there"
            )
    return out


def product_files(root: Path) -> Iterator[tuple[str, str]]:
    for folder in PRODUCT_FOLDERS:
        # rglob does not enter the links under koord_queue/: each file is counted once, by its folder
        for path in sorted((root / folder).rglob("*.py")):
            yield path.relative_to(root).as_posix(), path.read_text()


# --- the checker on synthetic sources ---------------------------------------------------------------

LONG_BODY = "\n".join(f"    x{i} = {i}" for i in range(8))
LONG_METHOD_BODY = "\n".join(f"        x{i} = {i}" for i in range(8))
SYNTHETIC = f'''
import functools


@functools.cache
def decorated():
    """Counted from the decorator: 1 + 1 + 1 + 8 + 1 = 12 lines."""
{LONG_BODY}
    return x0


class Holder:
    def method(self):
{LONG_METHOD_BODY}

        def inner():
            return 1

        return inner

    async def short(self):
        return None
'''


def test_functions_are_counted_from_their_first_decorator_with_docstring_and_blank_lines() -> None:
    sizes = function_sizes(SYNTHETIC)
    assert sizes == {"decorated": 12, "Holder.method": 14, "Holder.method.inner": 2, "Holder.short": 2}


def test_an_oversized_module_and_function_that_are_not_listed_fail() -> None:
    modules, functions = sizes_of({"pkg/big.py": SYNTHETIC})
    assert modules["pkg/big.py"] > 20
    assert problems(modules, 20, {}) == [
        f"pkg/big.py: {modules['pkg/big.py']} lines, over the limit of 20; split it "
        "(docs/development.md#sizes)"
    ]
    assert [p.split(": ")[0] for p in problems(functions, 10, {})] == [
        "pkg/big.py::Holder.method",
        "pkg/big.py::decorated",
    ]


def test_an_allow_listed_entry_passes_at_its_ceiling_and_fails_above_it() -> None:
    _, functions = sizes_of({"pkg/big.py": SYNTHETIC})
    at_ceiling = {"pkg/big.py::decorated": Allowed(12, "x"), "pkg/big.py::Holder.method": Allowed(14, "x")}
    assert problems(functions, 10, at_ceiling) == []
    below = {**at_ceiling, "pkg/big.py::decorated": Allowed(11, "x")}
    assert problems(functions, 10, below) == [
        "pkg/big.py::decorated: 12 lines, over its allow-listed ceiling of 11; split it, or "
        "raise the ceiling in tests/unit/test_sizes.py if it must grow"
    ]


def test_an_allow_listed_entry_that_shrank_within_the_limit_or_is_gone_fails() -> None:
    _, functions = sizes_of({"pkg/big.py": SYNTHETIC})
    allowed = {
        "pkg/big.py::decorated": Allowed(12, "x"),
        "pkg/big.py::Holder.method": Allowed(14, "x"),
        "pkg/big.py::Holder.short": Allowed(2, "x"),
        "pkg/gone.py::f": Allowed(200, "x"),
    }
    assert problems(functions, 10, allowed) == [
        "pkg/big.py::Holder.short: 2 lines, within the limit of 10 now; delete its entry from "
        "tests/unit/test_sizes.py so it stays there",
        "pkg/gone.py::f: allow-listed but gone; delete its entry from tests/unit/test_sizes.py",
    ]


def test_the_product_folders_are_what_the_package_links_and_holds() -> None:
    linked = {path.name for path in (ROOT / "koord_queue").iterdir() if path.is_symlink()}
    assert linked | {"koord_queue", "testenv"} == set(PRODUCT_FOLDERS)
    assert all((ROOT / folder / "__init__.py").is_file() for folder in PRODUCT_FOLDERS)


# --- the product ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def product_sizes() -> tuple[dict[str, int], dict[str, int]]:
    return sizes_of(dict(product_files(ROOT)))


def test_every_allow_listed_entry_says_why() -> None:
    assert all(entry.why.strip() and entry.ceiling > 0 for entry in ALLOWED.values())


def test_product_modules_stay_within_the_module_limit(
    product_sizes: tuple[dict[str, int], dict[str, int]],
) -> None:
    modules, _ = product_sizes
    allowed = {key: entry for key, entry in ALLOWED.items() if "::" not in key}
    assert problems(modules, MODULE_LIMIT, allowed) == []


def test_product_functions_stay_within_the_function_limit(
    product_sizes: tuple[dict[str, int], dict[str, int]],
) -> None:
    _, functions = product_sizes
    allowed = {key: entry for key, entry in ALLOWED.items() if "::" in key}
    assert problems(functions, FUNCTION_LIMIT, allowed) == []

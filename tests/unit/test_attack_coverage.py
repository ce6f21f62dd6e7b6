"""Every attack the chaos hostile tenant tries, and every rule of the trust boundaries, is also
tried by a test of ``make test``.

RELIABILITY.md ("Every attack and the tests that try it") maps each attack kind of
``chaos.tenant.ATTACKS`` to the integration or e2e tests that try the same attack as an impersonated
namespace user. This keeps the map complete (no attack kind without a test, no row for a kind the
phase no longer tries) and true (every test it names exists), so a defence claimed in the report is
pinned on every commit, not only in the occasional chaos run. The same holds for the rules of
docs/architecture.md#trust-boundaries (each row names the tests that try it) and for every
``tests/<file>.py::<test>`` reference anywhere in README.md, RELIABILITY.md and docs/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from chaos.tenant import ATTACKS

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Every attack and the tests that try it"
TRUST_HEADER = "| rule | at the door | again in the reconciler | tried by (as a namespace user) |"
DOCUMENTS = ("README.md", "RELIABILITY.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
ROW = re.compile(r"^\| `([\w-]+)` \| (.+) \|$")
TEST = re.compile(r"`(tests/[\w/]+\.py)::([\w:]+)`")


def coverage_table(text: str) -> dict[str, list[tuple[str, str]]]:
    """The section's rows: attack kind -> [(test file, test name)] (``Class::method`` kept whole)."""
    start = text.index(SECTION)
    end = text.find("\n#", start + len(SECTION))
    rows: dict[str, list[tuple[str, str]]] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = TEST.findall(match.group(2))
    return rows


def defined_tests(path: Path) -> set[str]:
    """``name`` and ``Class::name`` of every test function the file defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test_"):
                    found.add(f"{node.name}::{item.name}")
    return found


def missing_tests(rows: dict[str, list[tuple[str, str]]], root: Path) -> list[str]:
    """The references of ``rows`` that name no existing test."""
    missing: list[str] = []
    for kind, tests in rows.items():
        for file, name in tests:
            path = root / file
            if not path.is_file() or name not in defined_tests(path):
                missing.append(f"{kind}: {file}::{name}")
    return missing


def test_every_attack_kind_has_a_test_and_every_row_a_kind() -> None:
    rows = coverage_table((ROOT / "RELIABILITY.md").read_text(encoding="utf-8"))
    assert sorted(set(ATTACKS) - set(rows)) == [], "attack kinds without a row"
    assert sorted(set(rows) - set(ATTACKS)) == [], "rows for attack kinds the phase does not try"
    assert [kind for kind, tests in rows.items() if not tests] == [], "rows naming no test"


def test_every_test_the_table_names_exists() -> None:
    rows = coverage_table((ROOT / "RELIABILITY.md").read_text(encoding="utf-8"))
    assert missing_tests(rows, ROOT) == []


def test_the_check_sees_a_missing_test_and_a_class_method(tmp_path: Path) -> None:
    """The checker itself can fail: a name not defined is reported, a class's method is found."""
    tests = tmp_path / "tests" / "t.py"
    tests.parent.mkdir()
    tests.write_text("class TestX:\n    async def test_a(self):\n        pass\n\ndef test_b():\n    pass\n")
    text = (
        f"{SECTION}\n\n| kind | tests |\n|---|---|\n"
        "| `one` | `tests/t.py::TestX::test_a`<br>`tests/t.py::test_b` |\n"
        "| `two` | `tests/t.py::test_gone` |\n\n## Next\n| `three` | `tests/t.py::test_b` |\n"
    )
    rows = coverage_table(text)
    assert set(rows) == {"one", "two"}
    assert missing_tests(rows, tmp_path) == ["two: tests/t.py::test_gone"]


def trust_rows(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The trust-boundaries table's rows: (the rule's first words, the tests its last column names)."""
    lines = text.splitlines()
    start = lines.index(TRUST_HEADER) + 2
    rows: list[tuple[str, list[tuple[str, str]]]] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append((line[2:60], TEST.findall(line.rsplit(" | ", 1)[-1])))
    return rows


def test_every_trust_boundary_rule_names_the_tests_that_try_it() -> None:
    rows = trust_rows((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert len(rows) > 10, "the trust-boundaries table was not found whole"
    assert [rule for rule, tests in rows if not tests] == [], "rules naming no test"


def test_every_test_the_documents_name_exists() -> None:
    missing: list[str] = []
    for document in DOCUMENTS:
        for file, name in TEST.findall((ROOT / document).read_text(encoding="utf-8")):
            path = ROOT / file
            if not path.is_file() or name not in defined_tests(path):
                missing.append(f"{document}: {file}::{name}")
    assert missing == []

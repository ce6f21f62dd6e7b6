"""The documentation in ``docs/`` stays true to the repository it describes.

Checked without network or cluster:

1. every ``docs/<file>.md#<anchor>`` reference in the repository's text files (``*.py``, ``*.md``,
   ``*.yaml``, ``*.toml``, ``Makefile``) names a heading of that document, with anchors computed the
   way GitHub computes them (duplicates get ``-1``, ``-2``, ...);
2. every relative Markdown link in ``docs/*.md`` and ``README.md`` reaches an existing file, and
   its ``#anchor``, if any, an existing heading;
3. every command-line flag of ``webhook/main.py`` and ``reconciler/main.py`` is mentioned in
   ``docs/operations.md``;
4. every field of the component configuration (the dataclasses of ``shared/core/config.py``, and the
   keys its file accepts) is mentioned in ``docs/operations.md``;
5. no tracked text file refers to a design document outside the repository or to an issue number:
   the repository explains itself.

The helpers are tested first on small inputs, so a failure further down is about the documents.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"
PROCESS_MODULES = (ROOT / "webhook" / "main.py", ROOT / "reconciler" / "main.py")
CONFIG_MODULE = "koord_queue.shared.core.config"
#: Names of a module-level function returning the process's ``argparse.ArgumentParser``.
PARSER_BUILDERS = ("build_parser", "make_parser", "create_parser")

SCANNED_SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".toml"})
SCANNED_NAMES = frozenset({"Makefile"})
SKIPPED_DIRS = frozenset(
    {
        ".venv",
        ".git",
        ".local",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "build",
        "dist",
        "node_modules",
    }
)

DOC_REFERENCE = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_TAG = re.compile(r"<[^>]+>")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

#: References to documents outside the repository, and issue numbers. Written so that this file
#: does not match itself (``\s``, ``\.``, ``[S]``).
OUTSIDE_REFERENCES = (
    re.compile(r"REFERENCE\s§"),
    re.compile(r"REFERENCE\sS\d"),
    re.compile(r"ARCHITECTURE\sdecision"),
    re.compile(r"KUEUE-LESSON[S]"),
    re.compile(r"\bseed\s\d{3}", re.IGNORECASE),
    re.compile(r"\.\./seeds", re.IGNORECASE),
    re.compile(r"\.\./design", re.IGNORECASE),
    re.compile(r"\.\./shared", re.IGNORECASE),
    re.compile(r"TESTING\.md"),
    re.compile(r"STYLE\.md"),
    re.compile(r"\bissues?\s#?\d+", re.IGNORECASE),
)


# --- Markdown helpers ------------------------------------------------------------------------------


def outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of every line that is not inside a fenced code block."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match[1]
                continue
            yield number, line
        elif match and _closes(match[1], fence) and not line[match.end() :].strip():
            fence = None


def _closes(marker: str, fence: str) -> bool:
    """A fence is closed by the same character, repeated at least as often."""
    return marker[0] == fence[0] and len(marker) >= len(fence)


def heading_text(raw: str) -> str:
    """The text GitHub renders for a heading's Markdown source (code, links and emphasis unwrapped)."""
    text = INLINE_CODE.sub(lambda m: m[2].strip(), raw)
    text = LINK.sub(lambda m: m[1], text)
    text = HTML_TAG.sub("", text)
    return text.replace("**", "").replace("*", "")


def github_anchor(text: str) -> str:
    """GitHub's anchor for a heading text: lowercase, punctuation other than ``-`` and ``_``
    dropped, each space turned into ``-`` (spaces are not collapsed)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The ATX headings of a Markdown text, in order, as rendered text."""
    found = []
    for _, line in outside_fences(text):
        match = ATX_HEADING.match(line)
        if match is None:
            continue
        content = CLOSING_HASHES.sub("", match[2] or "")
        found.append(heading_text(content))
    return found


def anchors(text: str) -> list[str]:
    """Every heading anchor of a Markdown text; a repeated anchor gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = []
    for heading in headings(text):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.append(base if count == 0 else f"{base}-{count}")
    return result


def links(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, target)`` of every inline link, image and link definition outside code."""
    for number, line in outside_fences(text):
        definition = LINK_DEFINITION.match(line)
        if definition:
            yield number, definition[1]
            continue
        without_code = INLINE_CODE.sub("", line)
        for match in LINK.finditer(without_code):
            yield number, match[2]


# --- the checks, as functions over a tree so that they can be tested on a small one --------------


def repository_files(root: Path) -> Iterator[Path]:
    """The text files of the repository that may cite the documentation."""
    for path in sorted(root.iterdir()):
        if path.is_dir():
            # koord_queue/'s links to the top-level folders would scan each file twice
            if path.is_symlink() or path.name in SKIPPED_DIRS or path.name.endswith(".egg-info"):
                continue
            yield from repository_files(path)
        elif path.suffix in SCANNED_SUFFIXES or path.name in SCANNED_NAMES:
            yield path


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def broken_doc_references(root: Path) -> tuple[int, list[str]]:
    """How many ``docs/<file>.md#<anchor>`` references there are, and the broken ones."""
    known: dict[str, set[str] | None] = {}
    found = 0
    broken = []
    for path in repository_files(root):
        for number, line in enumerate(_read(path).splitlines(), start=1):
            for match in DOC_REFERENCE.finditer(line):
                found += 1
                document, anchor = match[1], match[2]
                if document not in known:
                    target = root / "docs" / document
                    known[document] = set(anchors(_read(target))) if target.is_file() else None
                targets = known[document]
                where = f"{path.relative_to(root)}:{number}: {match[0]}"
                if targets is None:
                    broken.append(f"{where}: there is no docs/{document}")
                elif anchor not in targets:
                    broken.append(f"{where}: docs/{document} has no heading with this anchor")
    return found, broken


def broken_links(root: Path, documents: list[Path]) -> list[str]:
    """Relative links of ``documents`` whose file, or heading, does not exist."""
    broken = []
    for document in documents:
        text = _read(document)
        own = set(anchors(text))
        for number, target in links(text):
            if URL_SCHEME.match(target) or target.startswith("//"):
                continue  # http:, https:, mailto: ...: not checked (no network)
            where = f"{document.relative_to(root)}:{number}: ({target})"
            path_part, _, anchor = target.partition("#")
            path_part = path_part.split("?", 1)[0]
            if not path_part:
                if anchor and anchor not in own:
                    broken.append(f"{where}: no heading with this anchor in this document")
                continue
            base = root if path_part.startswith("/") else document.parent
            resolved = (base / path_part.lstrip("/")).resolve()
            if not resolved.exists():
                broken.append(f"{where}: {resolved.relative_to(root.resolve())} does not exist")
            elif (
                anchor
                and resolved.suffix == ".md"
                and resolved.is_file()
                and anchor not in set(anchors(_read(resolved)))
            ):
                broken.append(f"{where}: no heading with this anchor in {resolved.name}")
    return broken


def tracked_files(root: Path) -> list[Path]:
    """The files git tracks under ``root``, and new ones it does not ignore (about to be added);
    every scanned file when ``root`` is not a git work tree."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return list(repository_files(root))
    return [root / name for name in sorted(listed.decode().split("\0")) if name]


def outside_references(root: Path, files: list[Path]) -> list[str]:
    """``file:line: text`` of every reference to an outside design document or an issue number.

    Binary files are skipped."""
    found = []
    for path in files:
        relative = path.relative_to(root).as_posix()
        try:
            data = path.read_bytes()
        except OSError:
            continue  # deleted in the work tree but still tracked
        if b"\0" in data:
            continue
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if any(pattern.search(line) for pattern in OUTSIDE_REFERENCES):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def flags_in_source(tree: ast.Module) -> set[str]:
    """Long options of every ``add_argument("--...")`` call in a module's source."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            for arg in node.args:
                value = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(value, str) and value.startswith("--"):
                    found.add(value)
    return found


def process_flags(path: Path) -> set[str]:
    """The long flags of a process: from its parser builder when it has one (imported and called),
    together with every ``add_argument`` call in its source (a flag added outside the builder
    counts too)."""
    tree = ast.parse(_read(path))
    flags = flags_in_source(tree)
    functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    builder = next((name for name in functions if name in PARSER_BUILDERS), None)
    if builder is not None:
        module_name = "koord_queue." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        parser = getattr(importlib.import_module(module_name), builder)()
        for action in parser._actions:
            flags.update(option for option in action.option_strings if option.startswith("--"))
    return flags - {"--help"}


def mentioned(word: str, text: str) -> bool:
    """``word`` occurs in ``text`` as a whole token (``--port`` is not found in ``--metrics-port``)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# --- the helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Decision 3: decide on a snapshot, then act", "decision-3-decide-on-a-snapshot-then-act"),
        ("Trust boundaries", "trust-boundaries"),
        ("batch/v1 Job", "batchv1-job"),
        ("S14-S17: Intelligent positions", "s14-s17-intelligent-positions"),
        ("Using Koordinator's ElasticQuota CRD", "using-koordinators-elasticquota-crd"),
        ("`spec.queue` and `reclaim_state`", "specqueue-and-reclaim_state"),
        ("[Linked](other.md) heading", "linked-heading"),
        ("Two  spaces", "two--spaces"),
    ],
)
def test_anchors_are_computed_as_github_does(heading: str, anchor: str) -> None:
    assert anchors(f"## {heading}\n") == [anchor]


def test_repeated_headings_get_numbered_anchors_and_fenced_lines_are_not_headings() -> None:
    text = (
        "# Title\n## Notes\n```console\n# not a heading\n```\n## Notes\n~~~\n## nor this\n~~~\n## Notes ##\n"
    )
    assert anchors(text) == ["title", "notes", "notes-1", "notes-2"]


def test_links_are_found_outside_code_only() -> None:
    text = "See [a](a.md#x) and `[b](b.md)`.\n```\n[c](c.md)\n```\n[d]: d.md\n![e](img/e.png)\n"
    assert [target for _, target in links(text)] == ["a.md#x", "d.md", "img/e.png"]


def test_a_missing_anchor_and_a_missing_document_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n## Real heading\n")
    reference = "docs/" + "guide.md#"
    (tmp_path / "code.py").write_text(
        f'"""See {reference}real-heading, {reference}gone and {"docs/" + "nowhere.md#x"}."""\n'
    )
    found, broken = broken_doc_references(tmp_path)
    assert found == 3
    assert broken == [
        f"code.py:1: {reference}gone: docs/guide.md has no heading with this anchor",
        "code.py:1: docs/" + "nowhere.md#x: there is no docs/nowhere.md",
    ]


def test_a_broken_relative_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n[ok](b.md#b) [bad](b.md#nope) [gone](c.md) [self](#a) [x](#y)\n"
    )
    (tmp_path / "docs" / "b.md").write_text("# B\n[up](../README.md) [web](https://example.com)\n")
    (tmp_path / "README.md").write_text("# Readme\n")
    broken = broken_links(tmp_path, [tmp_path / "docs" / "a.md", tmp_path / "docs" / "b.md"])
    assert len(broken) == 3, broken
    assert "(b.md#nope)" in broken[0] and "(c.md)" in broken[1] and "(#y)" in broken[2]


def test_outside_references_and_issue_numbers_are_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "map.md").write_text("REFERENCE" + " §2.5 is documented here\n")
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "run.py").write_text("# see " + "issue" + " 8\n")
    (tmp_path / "code.py").write_text(
        "ok = 1  # docs/compatibility.md#job-kinds\n"
        "# (ARCHITECTURE" + " decision 5)\n"
        "# REFERENCE" + " S29, KUEUE" + "-LESSONS\n"
        '"""Seed' + " 000, see ../" + "design/x.md and TESTING" + '.md."""\n'
        "# fixed in Issue" + " #12; STYLE" + ".md; ../" + "seeds/a; ../" + "shared/b\n"
        "# issue the certificate 2 times; the seed value is 7\n"
    )
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0issue" + b" 3")
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    found = outside_references(tmp_path, files)
    assert [entry.split(": ", 1)[0] for entry in found] == [
        "chaos/run.py:1",
        "code.py:2",
        "code.py:3",
        "code.py:4",
        "code.py:5",
        "docs/map.md:1",
    ]


def test_flags_are_collected_from_the_source() -> None:
    tree = ast.parse('p.add_argument("--one", "-o")\np.add_argument("-v", "--two")\np.add_argument("pos")\n')
    assert flags_in_source(tree) == {"--one", "--two"}


def test_a_flag_must_be_mentioned_as_a_whole_token() -> None:
    assert mentioned("--port", "| `--port` | 9443 |")
    assert not mentioned("--port", "| `--metrics-port` | 8080 |")
    assert not mentioned("--cert-file", "`--visibility-cert-file`")


# --- the documents -----------------------------------------------------------------------------------


def test_every_docs_reference_in_the_repository_names_an_existing_heading() -> None:
    found, broken = broken_doc_references(ROOT)
    assert found > 0, "no docs/<file>.md#<anchor> reference found at all: is the scan broken?"
    assert not broken, "references to missing documentation headings:\n" + "\n".join(broken)


def test_every_relative_link_in_the_docs_and_the_readme_resolves() -> None:
    documents = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
    assert len(documents) > 1, "docs/ holds no Markdown documents"
    broken = broken_links(ROOT, documents)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_file_refers_to_an_outside_design_document_or_an_issue_number() -> None:
    files = tracked_files(ROOT)
    assert len(files) > 10, "no tracked files found: is the listing broken?"
    found = outside_references(ROOT, files)
    assert not found, (
        "references to documents outside the repository or to issue numbers (cite docs/<file>.md#<anchor>"
        " instead):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("path", PROCESS_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_of_the_processes_is_documented(path: Path) -> None:
    flags = process_flags(path)
    assert flags, f"no flags found in {path.relative_to(ROOT)}: is the collection broken?"
    text = _read(OPERATIONS)
    missing = sorted(flag for flag in flags if not mentioned(flag, text))
    where = path.relative_to(ROOT)
    assert not missing, f"flags of {where} missing from docs/operations.md: {', '.join(missing)}"


def test_every_field_of_the_component_configuration_is_documented() -> None:
    module = importlib.import_module(CONFIG_MODULE)
    classes = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
    ]
    assert classes, f"no dataclass in {CONFIG_MODULE}: is the collection broken?"
    text = _read(OPERATIONS)
    missing = sorted(
        f"{cls.__name__}.{field.name}"
        for cls in classes
        for field in dataclasses.fields(cls)
        if not mentioned(field.name, text)
    )
    assert not missing, f"configuration fields missing from docs/operations.md: {', '.join(missing)}"


def test_every_key_of_the_configuration_file_is_documented() -> None:
    module = importlib.import_module(CONFIG_MODULE)
    keys = getattr(module, "_KNOWN", None)
    if not keys:
        pytest.skip(f"{CONFIG_MODULE} lists no accepted keys (_KNOWN)")
    text = _read(OPERATIONS)
    missing = sorted(str(key) for key in keys if not mentioned(str(key), text))
    assert not missing, f"configuration file keys missing from docs/operations.md: {', '.join(missing)}"

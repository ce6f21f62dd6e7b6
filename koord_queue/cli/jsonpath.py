"""``-o jsonpath=TEMPLATE``: the part of kubectl's JSONPath templates that people type.

kubectl's templates are text with ``{...}`` actions. Supported here: field paths (``.a.b``, with
``\\.`` for a dot inside a key, and ``['key']``), ``[*]`` and ``[N]`` (negative counts from the
end), ``..`` is not, ``range EXPR`` ... ``end``, and string literals (``{"\\n"}``, ``{"\\t"}``).
Several results of one action are joined by a space, as kubectl prints them; a map or a list is
printed as JSON. Written here rather than taken from a library so that the plugin keeps its few
dependencies; anything outside the subset is a clear error, not a wrong answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_STEP = re.compile(r"\.((?:\\.|[^.\[\\])+)|\[\*\]|\[(-?\d+)\]|\[(['\"])(.*?)\3\]")


class JsonPathError(ValueError):
    """The template is outside the supported subset, or malformed."""


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Field:
    steps: tuple[str | int | None, ...]  # a key, an index, or None for ``[*]``


@dataclass(frozen=True)
class _Range:
    over: _Field
    body: tuple[_Text | _Field | _Range, ...]


_Node = _Text | _Field | _Range


def _parse_path(expr: str) -> _Field:
    expr = expr.strip()
    if expr.startswith("$"):
        expr = expr[1:]
    if expr in ("", "."):
        return _Field(())
    steps: list[str | int | None] = []
    pos = 0
    while pos < len(expr):
        if expr.startswith("..", pos):
            raise JsonPathError(f"recursive descent (..) is not supported: {{{expr}}}")
        m = _STEP.match(expr, pos)
        if m is None:
            raise JsonPathError(f"cannot read {{{expr}}} at {expr[pos:]!r}")
        if m.group(1) is not None:
            steps.append(m.group(1).replace("\\.", "."))
        elif m.group(2) is not None:
            steps.append(int(m.group(2)))
        elif m.group(4) is not None:
            steps.append(m.group(4))
        else:
            steps.append(None)
        pos = m.end()
    return _Field(tuple(steps))


def _literal(expr: str) -> str | None:
    expr = expr.strip()
    if len(expr) >= 2 and expr[0] == expr[-1] and expr[0] in "\"'":
        inner = expr[1:-1]
        return inner.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r")
    return None


def parse(template: str) -> tuple[_Node, ...]:
    """The template as nodes; raises :class:`JsonPathError`."""
    tokens: list[tuple[bool, str]] = []  # (is an action, text)
    pos = 0
    while pos < len(template):
        start = template.find("{", pos)
        if start < 0:
            tokens.append((False, template[pos:]))
            break
        if start > pos:
            tokens.append((False, template[pos:start]))
        end, quote = start + 1, ""
        while end < len(template) and (quote or template[end] != "}"):
            ch = template[end]
            if quote and ch == "\\":
                end += 1
            elif ch in "\"'":
                quote = "" if quote == ch else quote or ch
            end += 1
        if end >= len(template):
            raise JsonPathError(f"unclosed {{ in {template!r}")
        tokens.append((True, template[start + 1 : end]))
        pos = end + 1

    def block(i: int, inside: bool) -> tuple[tuple[_Node, ...], int]:
        nodes: list[_Node] = []
        while i < len(tokens):
            action, text = tokens[i]
            i += 1
            if not action:
                nodes.append(_Text(text))
                continue
            words = text.strip()
            if words == "end":
                if not inside:
                    raise JsonPathError("{end} without {range}")
                return tuple(nodes), i
            if words.startswith("range "):
                body, i = block(i, True)
                nodes.append(_Range(_parse_path(words[len("range ") :]), body))
                continue
            lit = _literal(words)
            nodes.append(_Text(lit) if lit is not None else _parse_path(words))
        if inside:
            raise JsonPathError("{range} without {end}")
        return tuple(nodes), i

    nodes, _ = block(0, False)
    return nodes


def _select(data: Any, steps: Sequence[str | int | None]) -> list[Any]:
    found = [data]
    for step in steps:
        nxt: list[Any] = []
        for value in found:
            if step is None:
                if isinstance(value, list):
                    nxt.extend(value)
                elif isinstance(value, dict):
                    nxt.extend(value.values())
            elif isinstance(step, int):
                if isinstance(value, list) and -len(value) <= step < len(value):
                    nxt.append(value[step])
            elif isinstance(value, dict) and step in value:
                nxt.append(value[step])
        found = nxt
    return found


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def render(template: str, data: Any) -> str:
    """``template`` applied to ``data``, as kubectl's ``-o jsonpath`` prints it (no newline added)."""
    return _run(parse(template), data)


def _run(nodes: Sequence[_Node], data: Any) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Field):
            out.append(" ".join(_show(v) for v in _select(data, node.steps)))
        else:
            for item in _select(data, node.over.steps):
                out.append(_run(node.body, item))
    return "".join(out)

"""No import cycles (docs/development.md#lint-and-import-rules).

A cycle makes two modules one unit to read, test and change; the import rules would not catch one
inside a layer. So every module of the product, the test harness and chaos is checked: no group of
modules reaches itself through imports, counting those made inside a function or under
``TYPE_CHECKING`` (each is a dependency a reader must follow). A module that needs what its caller
offers takes it through an interface of its own (a ``Protocol``), as the scheduler's writer and the
job path's executor do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp
import pytest

PACKAGES = ("koord_queue", "testenv", "chaos")


def cycles(imports: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (strongly connected
    components of more than one module, or a module importing itself), each sorted; iterative
    Tarjan, so a deep graph cannot exhaust the stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in imports.get(node, ()):
                    found.append(sorted(group))
    return sorted(found)


def test_the_checker_finds_a_cycle_of_three_and_a_self_import_and_nothing_in_a_tree() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["a"]}) == [["a"]]
    assert cycles({"a": ["b", "c"], "b": ["c"], "c": []}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_modules_import_each_other(package: str) -> None:
    graph = grimp.build_graph(package, cache_dir=None)
    ours = [m for m in graph.modules if m == package or m.startswith(package + ".")]
    imports = {
        m: [i for i in graph.find_modules_directly_imported_by(m) if i.startswith(package + ".")]
        for m in ours
    }
    assert cycles(imports) == []

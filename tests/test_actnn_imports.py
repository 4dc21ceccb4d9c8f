"""actbench.actnn's modules import each other without cycles (convert <-> memory was one).

Function-level imports count too: a lazy import only hides a cycle until someone calls the
function. The package ``__init__`` re-exports and is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import actbench.actnn

PACKAGE = "actbench.actnn"


def _imports(path: Path) -> set[str]:
    """The actbench.actnn modules that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module if node.level == 0 else f"{PACKAGE}.{node.module}"
            if module == PACKAGE:
                found |= {f"{PACKAGE}.{a.name}" for a in node.names}
            elif module.startswith(PACKAGE + "."):
                found.add(module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found


def _graph() -> dict[str, set[str]]:
    folder = Path(actbench.actnn.__file__).parent
    modules = {f"{PACKAGE}.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & set(modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_actnn_modules_have_no_import_cycle():
    graph = _graph()
    assert f"{PACKAGE}.memory" in graph and f"{PACKAGE}.convert" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None

"""The house in rooms: no import circle among the trainer's modules, and no module too long to read as one job.

The import graph is read from the source (ast), not by importing: an import inside a function or under
``TYPE_CHECKING`` is an edge too (a circle it hides is still a circle in the design). ``from x import y`` is an
import of ``x.y`` when ``y`` is a module, else of ``x``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.Module, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (its parsed source ``tree``) imports, anywhere in it."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, one level up per extra dot
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def import_graph(top: str) -> dict[str, set[str]]:
    """module -> the modules it imports, for every module below the folder ``top`` (a package of ROOT)."""
    paths = {module_name(path): path for path in sorted((ROOT / top).rglob("*.py"))}
    modules = set(paths)
    return {name: imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", modules)
            for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a path back to its start) through each strongly connected group of modules (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [circle_in(graph, group) for group in groups]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not a circle")


def test_the_trainer_has_no_import_circle() -> None:
    found = circles(import_graph("trainer"))
    assert not found, "import circle(s): " + "; ".join(" -> ".join(circle) for circle in found)


def test_the_circle_finder_names_a_circle_and_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_submodules_and_relative_imports_are_edges() -> None:
    source = ["from . import b", "from .c import f", "from p import q", "import p.r", "def g():",
              "    from p.s import h"]
    modules = {"p", "p.a", "p.b", "p.c", "p.q", "p.r", "p.s", "p.t"}
    assert imported(ast.parse("\n".join(source)), "p.a", False, modules) == {"p.b", "p.c", "p.q", "p.r", "p.s"}
    assert imported(ast.parse("from p.t import NAME"), "p.a", False, modules) == {"p.t"}
    assert imported(ast.parse("from .. import NAME"), "p.t.u", False, {"p", "p.t.u"}) == {"p"}


def test_no_module_is_over_the_line_limit() -> None:
    sources = sorted(path for top in ("trainer", "roles", "scripts", "bench") for path in (ROOT / top).rglob("*.py"))
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in sources
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"over {MAX_LINES} lines (split them into modules of one job each): {too_long}"

"""Print which project modules each module of eqsat/, jax_backend/ and experiments/ imports, then any
import cycles.

    python scripts/import_graph.py [REPO]

Reads the source (nothing is imported); lazy imports inside functions count too, and so do modules
named by string: `importlib.import_module("eqsat.x")`, a table such as `eqsat.cli.COMMANDS`, an
entry-point style "module:attribute". A string counts when it is exactly a project module's dotted
name (docstrings aside), so a module reached through `importlib` is an arrow like any other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("eqsat", "jax_backend", "experiments")


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The modules an import statement names (`from pkg import mod` names pkg.mod, else pkg)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if path.name == "__init__.py" else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (or other bare string statements)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _named_modules(tree: ast.Module, known: dict[str, Path]) -> list[str]:
    """Project modules named by a string (importlib tables and calls): the exact dotted name, or
    "module:attribute"; a name without a dot (a prog name such as "eqsat") is not counted."""
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            name = node.value.partition(":")[0]
            if "." in name and name in known:
                found.append(name)
    return found


def edges(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, path, node, known):
                    while target and target not in known:
                        target = target.rpartition(".")[0]
                    if target and target != module:
                        deps.add(target)
        deps.update(name for name in _named_modules(tree, known) if name != module)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> None:
    graph = edges(Path(argv[0]) if argv else Path(__file__).resolve().parents[1])
    for module in sorted(graph):
        print(f"{module}: {', '.join(sorted(graph[module]))}")
    print("import cycles:", "; ".join(" <-> ".join(c) for c in cycles(graph)) or "none")


if __name__ == "__main__":
    main(sys.argv[1:])

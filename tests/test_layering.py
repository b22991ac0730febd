"""Layering: the core (`eqsat/`) never imports `jax_backend/`, and no project modules import each
other in a circle (read from the source by scripts/import_graph.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# `import eqsat` re-exports the decorator lazily (eqsat.optimize / eqsat.explain): that is the API.
CORE_MAY_IMPORT_BACKEND = {"eqsat"}


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_verifier_and_the_core_import_in_one_direction() -> None:
    tool = _import_graph()
    graph = tool.edges(ROOT)
    within_core = {m: {d for d in deps if d.startswith("eqsat")} for m, deps in graph.items() if m.startswith("eqsat")}
    assert tool.cycles(within_core) == []
    assert not any(m.startswith("eqsat.rewrites") for cycle in tool.cycles(graph) for m in cycle)


def test_the_core_never_imports_the_jax_backend() -> None:
    graph = _import_graph().edges(ROOT)
    offenders = sorted(m for m, deps in graph.items() if m.startswith("eqsat") and m not in CORE_MAY_IMPORT_BACKEND
                       and any(d.startswith("jax_backend") for d in deps))
    assert offenders == []


def test_the_parallel_package_imports_only_downward() -> None:
    """`eqsat.parallel` sits above the core: nothing it imports, directly or not, imports it back
    (its distribution ops are core vocabulary, `eqsat.distribution`)."""
    graph = _import_graph().edges(ROOT)

    def inside(m: str) -> bool:
        return m == "eqsat.parallel" or m.startswith("eqsat.parallel.")

    below: set[str] = set()
    todo = [d for m, deps in graph.items() if inside(m) for d in deps if not inside(d)]
    while todo:
        m = todo.pop()
        if m not in below:
            below.add(m)
            todo.extend(d for d in graph.get(m, ()) if not inside(d))
    assert sorted(m for m in below if any(inside(d) for d in graph.get(m, ()))) == []

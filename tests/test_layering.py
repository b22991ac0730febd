"""Layering, read from the source by scripts/import_graph.py (which counts modules named by string in
`importlib` tables and calls as imports): no project modules import each other in a circle; eqsat/
never reaches experiments/; the core never imports jax_backend/ except the documented lazy
re-export; the commands sit on top."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# `import eqsat` re-exports the decorator lazily (eqsat.optimize / eqsat.explain): that is the API.
CORE_MAY_IMPORT_BACKEND = {"eqsat"}
# `eqsat.parallel.plan(step, ...)` is the parallel API for a user's JAX step (eqsat.parallel.api, on top
# of the planner and the backend; the package re-exports it lazily), with the step's forward and argument
# leaves (eqsat.parallel.step_args), the planning of its captured graphs (eqsat.parallel.step_planner),
# and its lowering of activation checkpointing (eqsat.parallel.remat) and of its sharding constraints
# (eqsat.parallel.constraints) into the traced step.
PARALLEL_API = {"eqsat.parallel", "eqsat.parallel.api", "eqsat.parallel.constraints", "eqsat.parallel.remat",
                "eqsat.parallel.step_args", "eqsat.parallel.step_planner"}
# The commands (and the table that names them) sit above both the core and the backend: `eqsat
# optimize` and `eqsat parallel` check their results through JAX (jax_backend.checks).
TOP = ("eqsat.cli", "eqsat.commands")


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _root_edges() -> dict[str, set[str]]:
    """The project's import graph, read once per process (parsing every module takes seconds; the
    tests only read it)."""
    return _import_graph().edges(ROOT)


def _on_top(module: str) -> bool:
    return any(module == top or module.startswith(f"{top}.") for top in TOP)


def test_no_project_modules_import_each_other_in_a_circle() -> None:
    assert _import_graph().cycles(_root_edges()) == []


def test_the_package_never_reaches_the_experiments() -> None:
    graph = _root_edges()
    offenders = sorted((m, d) for m, deps in graph.items() if m.startswith("eqsat") for d in deps
                       if d.startswith("experiments"))
    assert offenders == []


def test_the_core_never_imports_the_jax_backend() -> None:
    graph = _root_edges()
    offenders = sorted(m for m, deps in graph.items() if m.startswith("eqsat") and m not in CORE_MAY_IMPORT_BACKEND | PARALLEL_API
                       and not _on_top(m) and any(d.startswith("jax_backend") for d in deps))
    assert offenders == []


def test_nothing_in_the_package_imports_the_commands() -> None:
    graph = _root_edges()
    offenders = sorted(m for m, deps in graph.items() if m.startswith(("eqsat", "jax_backend")) and not _on_top(m)
                       and any(_on_top(d) for d in deps))
    assert offenders == []


def test_string_tables_count_as_imports(tmp_path: Path) -> None:
    """A module reached only through `importlib` (the way eqsat.cli once reached experiments/) is an arrow."""
    for package, files in {"eqsat": {"__init__.py": "", "cli.py": 'import importlib\nTABLE = {"x": ("experiments.cmd", "help")}\n'
                                     'def f() -> None:\n    importlib.import_module("eqsat.lazy")\n', "lazy.py": ""},
                           "jax_backend": {"__init__.py": ""}, "experiments": {"__init__.py": "", "cmd.py": ""}}.items():
        (tmp_path / package).mkdir()
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    graph = _import_graph().edges(tmp_path)
    assert graph["eqsat.cli"] == {"experiments.cmd", "eqsat.lazy"}


def test_the_parallel_package_imports_only_downward() -> None:
    """`eqsat.parallel` sits above the core: nothing it imports, directly or not, imports it back
    (its distribution ops are core vocabulary, `eqsat.distribution`)."""
    graph = _root_edges()

    def inside(m: str) -> bool:
        return m.startswith("eqsat.parallel.") and m not in PARALLEL_API

    below: set[str] = set()
    todo = [d for m, deps in graph.items() if inside(m) for d in deps if not inside(d)]
    while todo:
        m = todo.pop()
        if m not in below:
            below.add(m)
            todo.extend(d for d in graph.get(m, ()) if not inside(d))
    assert sorted(m for m in below if any(inside(d) for d in graph.get(m, ()))) == []

"""`eqsat bench NAME [FLAGS]`: run one registered benchmark and yield its table rows.

The benchmarks are not part of eqsat: they declare themselves under the entry-point group
`eqsat.benchmarks` (pyproject.toml's `[project.entry-points."eqsat.benchmarks"]`), each naming a
light object with `description`, `add_arguments(parser)` and `run(args)`. Entry points rather than
a table of module names here, or a `python -m` subprocess: the arrow then goes from the benchmarks
to eqsat and never back (eqsat names no benchmark module, not even as a string:
tests/test_layering.py), an installed eqsat finds the benchmarks installed beside it, each
benchmark keeps its own flags, and its rows still come back through `--json` like every command's.

Installed metadata older than pyproject.toml (an editable install not reinstalled since a
benchmark was declared) lists fewer benchmarks or none: `eqsat bench` then says so in one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from eqsat.errors import EqsatError

__all__ = ["GROUP", "BenchmarkEntry", "add_arguments", "registered", "run"]

GROUP = "eqsat.benchmarks"
REINSTALL = f"the installed metadata may predate them: reinstall (pip install -e .) to refresh entry-point group '{GROUP}'"


class BenchmarkEntry(Protocol):
    """What an `eqsat.benchmarks` entry point names."""

    @property
    def description(self) -> str: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> Iterable[dict[str, Any]]: ...


@dataclass(frozen=True)
class _Broken:
    """An entry point whose target does not load (stale metadata, a module renamed since)."""

    name: str
    error: str

    @property
    def description(self) -> str:
        return f"cannot be loaded: {self.error}"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
        raise EqsatError(f"benchmark '{self.name}' cannot be loaded ({self.error}); {REINSTALL}")


def registered() -> Mapping[str, BenchmarkEntry]:
    """The benchmarks the installed metadata declares, by name."""
    found: dict[str, BenchmarkEntry] = {}
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            found[point.name] = point.load()
        except (ImportError, AttributeError) as exc:
            found[point.name] = _Broken(point.name, f"{type(exc).__name__}: {exc}")
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = registered()
    if not benches:
        parser.description = f"No benchmarks are registered; {REINSTALL}."
        parser.add_argument("name", nargs="?", help="a benchmark name")
        return
    sub = parser.add_subparsers(dest="name", metavar="NAME", required=True, title="benchmarks")
    for name, bench in benches.items():
        p = sub.add_parser(name, help=bench.description, description=bench.description)
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object per result on stdout")
        bench.add_arguments(p)
        p.set_defaults(_bench=bench)


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    bench: BenchmarkEntry | None = getattr(args, "_bench", None)
    if bench is None:
        raise EqsatError(f"no benchmarks are registered; {REINSTALL}")
    return bench.run(args)

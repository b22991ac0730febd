"""`eqsat bench NAME`: run one experiment by name and yield its table rows.

A table maps each experiment name to the module that runs it, imported only when asked for, so an
experiment whose module is not written yet fails with a clear message instead of breaking the CLI.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eqsat.errors import EqsatError

__all__ = ["BENCHMARKS", "Benchmark", "UnknownBenchmarkError", "add_arguments", "run"]


class UnknownBenchmarkError(EqsatError):
    """A benchmark name that the table does not define, or whose module is missing."""


def _extraction(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    files = [Path(f) for f in args.files] if args.files else None
    return module.run_bench(out_dir=args.out, time_limit=args.time_limit, files=files, extractors=args.extractors)


@dataclass(frozen=True)
class Benchmark:
    """Where an experiment lives and how to call it with the parsed flags."""

    module: str
    call: Callable[[Any, argparse.Namespace], Iterable[dict[str, Any]]]
    description: str


def _jax(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out, time_limit=min(args.time_limit, 10.0)))


def _ceiling(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out))


def _parallel(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out, time_limit=min(args.time_limit, 20.0)))


BENCHMARKS: Mapping[str, Benchmark] = MappingProxyType({
    "jax": Benchmark("experiments.bench_jax", _jax,
                     "@eqsat.optimize on JAX programs: speedup over jax.jit, first call, numerics"),
    "ceiling": Benchmark("experiments.bench_ceiling", _ceiling,
                         "hand-written rewrites of the JAX targets against jax.jit: what any rewrite could gain here"),
    "extraction": Benchmark("experiments.bench_extraction", _extraction,
                            "every extractor on the E-graph JSON benchmark set: cost, bound, seconds"),
    "parallel": Benchmark("experiments.bench_parallel", _parallel,
                          "eqsat parallel over the cases and meshes: predicted step, compiled bytes, memory"),
})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"experiment: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=Path("results"), help="directory for tables and PNG plots")
    parser.add_argument("--time-limit", type=float, default=60.0, help="time limit per solver run, seconds")
    parser.add_argument("--files", nargs="*", default=None, help="input files (default: the experiment's own set)")
    parser.add_argument("--extractors", nargs="*", default=None, help="extractors to compare (default: all)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    bench = BENCHMARKS.get(args.name)
    if bench is None:
        raise UnknownBenchmarkError(f"unknown benchmark '{args.name}'; known benchmarks: {', '.join(BENCHMARKS)}")
    try:
        module = importlib.import_module(bench.module)
    except ModuleNotFoundError as exc:
        if exc.name and bench.module.startswith(exc.name):
            raise UnknownBenchmarkError(f"benchmark '{args.name}' is not available: module {bench.module} "
                                        "is not installed yet") from None
        raise
    return bench.call(module, args)

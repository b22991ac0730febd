"""`eqsat bench NAME`: run one experiment by name and yield its table rows.

A table maps each experiment name to the module that runs it, imported only when asked for (the
experiments import JAX and plotting, which the rest of the CLI does not need).
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
    """A benchmark name that the table does not define."""


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


def _scaling(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = tuple(module.SIZES if args.max_classes is None else (n for n in module.SIZES if n <= args.max_classes))
    return module.run_bench(out_dir=args.out, time_limit=args.time_limit, extractors=args.extractors,
                            memory_gib=args.memory_gib, sizes=sizes)


def _ceiling(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out))


def _tensat(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    return module.run_bench(out_dir=args.out, options=module.options_from_args(args))


def _parallel(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out, time_limit=min(args.time_limit, 20.0), models=args.models))


BENCHMARKS: Mapping[str, Benchmark] = MappingProxyType({
    "jax": Benchmark("experiments.bench_jax", _jax,
                     "@eqsat.optimize on JAX programs: speedup over jax.jit, first call, numerics"),
    "ceiling": Benchmark("experiments.bench_ceiling", _ceiling,
                         "hand-written rewrites of the JAX targets against jax.jit: what any rewrite could gain here"),
    "extraction": Benchmark("experiments.bench_extraction", _extraction,
                            "every extractor on the E-graph JSON benchmark set: cost, bound, seconds"),
    "scaling": Benchmark("experiments.bench_scaling", _scaling,
                         "every extractor on chain e-graphs of growing size: peak memory, seconds, largest handled"),
    "tensat": Benchmark("experiments.bench_tensat", _tensat,
                        "Tensat's seven models: equality saturation against a TASO-style search, paper's numbers beside"),
    "parallel": Benchmark("experiments.bench_parallel", _parallel,
                          "eqsat parallel over the cases and meshes: predicted step, compiled bytes, memory"),
})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="; ".join(f"{name}: {b.description}" for name, b in BENCHMARKS.items()))
    parser.add_argument("--out", type=Path, default=Path("results"), help="directory for tables and PNG plots")
    parser.add_argument("--time-limit", type=float, default=60.0, help="time limit per solver run, seconds")
    parser.add_argument("--files", nargs="*", default=None, help="input files (default: the experiment's own set)")
    parser.add_argument("--extractors", nargs="*", default=None, help="extractors to compare (default: all)")
    parser.add_argument("--memory-gib", type=float, default=8.0, help="memory limit per run (scaling), GiB")
    parser.add_argument("--max-classes", type=int, default=None, help="largest chain to try (scaling)")
    tensat = parser.add_argument_group("tensat")
    tensat.add_argument("--models", nargs="*", default=None,
                        help="tensat: models (default: Tensat's seven); parallel: cases (default: all)")
    tensat.add_argument("--k-multi", nargs="*", type=int, default=None, help="tensat: rounds of two-output rules (default: 1)")
    tensat.add_argument("--taso-seconds", type=float, default=20.0,
                        help="tensat: cap on the TASO-style search at TASO's default budget (1000 graphs)")
    tensat.add_argument("--cost-models", nargs="*", default=None, metavar="MODEL/DEVICE",
                        help="tensat: cost models, e.g. roofline/h100 measured/cpu (default: both of those)")
    tensat.add_argument("--taso-long-seconds", type=float, default=60.0,
                        help="tensat: cap on the longer TASO-style search (10000 graphs, roofline column; 0 skips it)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if not args.time_limit > 0 or not args.memory_gib > 0:
        raise EqsatError("bench: --time-limit and --memory-gib must be positive numbers")
    bench = BENCHMARKS.get(args.name)
    if bench is None:
        raise UnknownBenchmarkError(f"unknown benchmark '{args.name}'; known benchmarks: {', '.join(BENCHMARKS)}")
    return bench.call(importlib.import_module(bench.module), args)

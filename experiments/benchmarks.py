"""The benchmarks `eqsat bench NAME` runs: each a `Benchmark` (its flags and how to call it), declared
to eqsat under the entry-point group `eqsat.benchmarks` in pyproject.toml.

This module stays light (no JAX, no plotting): `eqsat bench --help` loads it to list the benchmarks
and their flags; a benchmark's own module is imported only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eqsat.arg_types import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT, Number
from eqsat.errors import EqsatError
from eqsat.output_targets import writable_dir, writable_file

__all__ = ["BENCHMARKS", "Benchmark"]


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives, its flags, and how to call it with them (`eqsat.commands.bench`'s protocol)."""

    module: str
    call: Callable[[Any, argparse.Namespace], Iterable[dict[str, Any]]]
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.arguments(parser)

    def run(self, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
        for name in ("time_limit", "memory_gib"):
            if not getattr(args, name, 1.0) > 0:  # also NaN
                raise EqsatError(f"bench: --{name.replace('_', '-')} must be a positive number")
        out = getattr(args, "out", None)
        if out is not None:  # before any work: a bad target is one line, not a traceback at the end
            (writable_file if getattr(args, "out_is_file", False) else writable_dir)(out, "--out")
        return self.call(importlib.import_module(self.module), args)


def _out(parser: argparse.ArgumentParser, default: str = "results") -> None:
    parser.add_argument("--out", type=Path, default=Path(default), help="directory for tables and PNG plots")


def _time_limit(parser: argparse.ArgumentParser, default: float = 60.0, what: str = "per solver run") -> None:
    parser.add_argument("--time-limit", type=POSITIVE, default=default, help=f"time limit {what}, seconds")


# --- extraction ---------------------------------------------------------------------------------

def _extraction_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    _time_limit(parser)
    parser.add_argument("--files", nargs="+", default=None, help="input files (default: the benchmark's own set)")
    parser.add_argument("--extractors", nargs="+", default=None, help="extractors to compare (default: all)")


def _extraction(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    files = [Path(f) for f in args.files] if args.files else None
    return module.run_bench(out_dir=args.out, time_limit=args.time_limit, files=files, extractors=args.extractors)


def _scaling_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    _time_limit(parser)
    parser.add_argument("--extractors", nargs="+", default=None, help="extractors to compare (default: all)")
    parser.add_argument("--memory-gib", type=POSITIVE, default=8.0, help="memory limit per run, GiB")
    parser.add_argument("--max-classes", type=POSITIVE_INT, default=None, help="largest chain to try")


def _scaling(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = tuple(module.SIZES if args.max_classes is None else (n for n in module.SIZES if n <= args.max_classes))
    return module.run_bench(out_dir=args.out, time_limit=args.time_limit, extractors=args.extractors,
                            memory_gib=args.memory_gib, sizes=sizes)


def _lns_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", nargs="+", default=["tensat/nasrnn.json"], help="relative to the e-graph data folder")
    parser.add_argument("--seeds", nargs="+", type=NON_NEGATIVE_INT, default=[0, 1, 2])
    _time_limit(parser)


def _lns(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    return module.run_bench(files=args.files, seeds=args.seeds, time_limit=args.time_limit)


# --- JAX --------------------------------------------------------------------------------------------

def _jax_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    _time_limit(parser, 10.0, "of the optimization per signature")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=40, help="paired timing rounds per program (at most)")
    parser.add_argument("--budget", type=POSITIVE, default=8.0, help="timing seconds per program (at most)")
    parser.add_argument("--programs", nargs="+", default=None, help="programs to run (default: all)")
    parser.add_argument("--no-ranking", action="store_true", help="skip the cost models' ranking check")
    parser.add_argument("--no-first-call", action="store_true", help="skip the 12-layer first call in fresh processes")
    groups = ("targets", "models", "overhead", "heldout")
    parser.add_argument("--groups", nargs="+", choices=groups, default=list(groups),
                        help="targets: the JAX target programs; models: Flax / Equinox models; "
                             "overhead: the wrapper's cost over jax.jit; heldout: held-out real programs "
                             "(geomean, kept count, first call cold and at a new shape)")


def _jax(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out, rounds=args.rounds, time_limit=args.time_limit,
                                 programs=args.programs, with_ranking=not args.no_ranking, budget_s=args.budget,
                                 first_call=not args.no_first_call, groups=args.groups))


def _ceiling_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    parser.add_argument("--rounds", type=POSITIVE_INT, default=40, help="paired timing rounds per variant (at most)")
    parser.add_argument("--budget", type=POSITIVE, default=8.0, help="timing seconds per program (at most)")
    parser.add_argument("--programs", nargs="+", default=None, help="programs to run (default: all)")


def _ceiling(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return list(module.run_bench(out_dir=args.out, rounds=args.rounds, budget_s=args.budget, programs=args.programs))


# --- Tensat and rules -------------------------------------------------------------------------------

def _tensat_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    _time_limit(parser, what="per extraction")
    parser.add_argument("--models", nargs="+", default=None, help="models (default: Tensat's seven)")
    parser.add_argument("--k-multi", nargs="+", type=NON_NEGATIVE_INT, default=None, help="rounds of two-output rules (default: 1)")
    parser.add_argument("--taso-budget", type=POSITIVE_INT, default=1000,
                        help="graphs the TASO-style search pops (TASO's default: 1000)")
    parser.add_argument("--taso-seconds", type=POSITIVE, default=600.0,
                        help="safety cap on the TASO-style search (its stop reason says when it was hit)")
    parser.add_argument("--cost-models", nargs="+", default=None, metavar="MODEL/DEVICE",
                        help="cost models, e.g. roofline/h100 measured/cpu (default: both of those)")
    parser.add_argument("--taso-long-seconds", type=NON_NEGATIVE, default=60.0,
                        help="cap on the longer TASO-style search (10000 graphs, roofline column; 0 skips it)")
    parser.add_argument("--passes", type=POSITIVE_INT, default=3,
                        help="whole runs of eqsat optimize's path per row: optimizer times and speedups are mean ± "
                             "s.e. over them (default: %(default)s)")
    parser.add_argument("--repeats", type=Number(low=5, strict=False, integer=True), default=30,
                        help="timing rounds of the original against each plan per pass, at most (at least 5)")
    parser.add_argument("--timing-budget", type=POSITIVE, default=30.0,
                        help="seconds of timing rounds per pass (past the 5 that always run)")
    parser.add_argument("--candidates", nargs="*", default=None, metavar="NAME",
                        help="plans timed beside the ILP's answer, as for eqsat optimize (default: greedy "
                             "roofline-launch0 layout)")
    from eqsat.cost import CONVENTIONS
    from eqsat.rulesets import RULE_SETS

    parser.add_argument("--conventions", nargs="+", default=None, metavar="NAME",
                        help=f"extraction conventions, one row set each ({', '.join(CONVENTIONS)}; default: ours), "
                             "as for eqsat optimize")
    parser.add_argument("--rules", nargs="+", default=None, metavar="NAME",
                        help=f"rule sets, one row set each ({', '.join(RULE_SETS)}; default: default), as for "
                             "eqsat optimize: both ways attribute each gain")
    parser.add_argument("--ablations", action="store_true",
                        help="instead: the rest of Tensat's paper (experiments/tensat_ablations.py): cycle filtering "
                             "efficient vs vanilla, tensat-ilp real vs integer order variables, e-graph sizes, the "
                             "k_multi sweep (default models squeezenet nasrnn bert, k_multi 1 2)")
    parser.add_argument("--cycle-filters", nargs="+", default=None, metavar="NAME",
                        help="with --ablations: efficient vanilla off (default: all)")
    parser.add_argument("--order-vars", nargs="+", default=None, metavar="KIND",
                        help="with --ablations: tensat-ilp order variables, real int (default: both)")


def _tensat(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if getattr(args, "ablations", False):
        return _tensat_ablations(args)
    return module.run_bench(out_dir=args.out, options=module.options_from_args(args))


def _tensat_ablations(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    """`bench tensat --ablations`: options checked (one error line) before any work."""
    ablations = importlib.import_module("experiments.tensat_ablations")
    d = ablations.AblationOptions()
    chosen = args.cost_models or []
    if len(chosen) > 1:
        raise EqsatError("bench tensat --ablations: give one --cost-models MODEL/DEVICE (default: xla/cpu, calibrated)")
    cost = importlib.import_module("experiments.bench_tensat")._cost_model_arg(chosen[0]) if chosen else None
    options = ablations.AblationOptions(
        models=tuple(args.models or d.models), k_multi=tuple(d.k_multi if args.k_multi is None else args.k_multi),
        cycle_filters=tuple(args.cycle_filters or d.cycle_filters), order_vars=tuple(args.order_vars or d.order_vars),
        cost_model=cost, time_limit=args.time_limit)
    return ablations.run_bench(args.out, options)


def _schedules_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model name (eqsat.models) or a .model / Graph .json path")
    parser.add_argument("--k-multi", type=NON_NEGATIVE_INT, nargs="+", default=[1, 2], help="rounds of two-output rules")
    parser.add_argument("--schedules", nargs="+", default=None, help="schedules to compare (default: all)")
    parser.add_argument("--node-limit", type=POSITIVE_INT, default=50_000, help="saturation e-node limit")
    _time_limit(parser, what="per extraction")


def _schedules(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    return module.run_bench(args.model, k_multi=args.k_multi, schedules=args.schedules, node_limit=args.node_limit,
                            time_limit=args.time_limit)


def _rules_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skip-synth", action="store_true", help="verify Tensat's rules only")
    parser.add_argument("--out", type=Path, default=Path("results/synth.rules"), help="file for the synthesized rules")
    parser.set_defaults(out_is_file=True)


def _rules(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    return module.run_bench(out=args.out, skip_synth=args.skip_synth)


# --- parallel ---------------------------------------------------------------------------------------

def _parallel_flags(parser: argparse.ArgumentParser) -> None:
    _out(parser)
    _time_limit(parser, 20.0, "per plan's ILP")
    parser.add_argument("--models", nargs="+", default=None, help="cases (default: all)")
    parser.add_argument("--spearman", action="store_true",
                        help="instead: Spearman(predicted, measured step time) over each case's random plans on the "
                             "devices at hand (calibrates the mesh first if not cached)")
    parser.add_argument("--random-plans", type=POSITIVE_INT, default=None,
                        help="random plans per case (default: 20; with --spearman 10)")
    parser.add_argument("--user-programs", nargs="+", default=None, metavar="PROGRAM",
                        help="instead: these user programs (mlp, gpt, moe, llama, cnn, vit, gru) through eqsat.parallel.plan, "
                             "3 optax steps checked against one device")
    parser.add_argument("--meshes", nargs="+", default=None, help="mesh shapes (default: 8 2x4 4x2)")
    parser.add_argument("--mesh", default="2x4", help="--spearman: the mesh shape")
    parser.add_argument("--timing-budget", type=POSITIVE, default=6.0,
                        help="--spearman: seconds of interleaved timing rounds per case")
    parser.add_argument("--timing-precision", type=POSITIVE, default=0.05,
                        help="--spearman: past the budget, time on (to 4x it) until every plan's 95%% interval is at most "
                             "this fraction of its median")


def _parallel(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.spearman:
        return module.run_spearman(args.out, args.models, args.mesh, args.random_plans or module.SPEARMAN_PLANS,
                                   args.timing_budget, args.timing_precision)
    if args.user_programs:
        return module.run_user_programs(args.out, args.user_programs, args.meshes, args.time_limit)
    return list(module.run_bench(out_dir=args.out, time_limit=args.time_limit, models=args.models,
                                 meshes=args.meshes, random_plans=args.random_plans or module.RANDOM_PLANS))


def _multiprocess_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a parallel case (eqsat parallel --help; its plan, forward) or a user "
                        "program, mlp or gpt (its training step: loss, grad, Adam)")
    parser.add_argument("--mesh", default="8", help="mesh shape over the 2 x 4 CPU devices")


def _multiprocess(module: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    return [module.run(args.model, args.mesh)]


EXTRACTION = Benchmark("experiments.bench_extraction", _extraction,
                       "every extractor on the E-graph JSON benchmark set: cost, bound, seconds", _extraction_flags)
SCALING = Benchmark("experiments.bench_scaling", _scaling,
                    "every extractor on chain e-graphs of growing size: peak memory, seconds, largest handled", _scaling_flags)
LNS = Benchmark("experiments.bench_lns", _lns,
                "the ILP's large-neighbourhood phase: cost over time per seed", _lns_flags)
JAX = Benchmark("experiments.bench_jax", _jax,
                "@eqsat.optimize on JAX programs: speedup over jax.jit, first call, numerics", _jax_flags)
CEILING = Benchmark("experiments.bench_ceiling", _ceiling,
                    "hand-written rewrites of the JAX targets against jax.jit: what any rewrite could gain here",
                    _ceiling_flags)
TENSAT = Benchmark("experiments.bench_tensat", _tensat,
                   "Tensat's seven models: equality saturation against a TASO-style search, paper's numbers beside",
                   _tensat_flags)
SCHEDULES = Benchmark("experiments.saturation_schedules", _schedules,
                      "when two-output rules run: e-graph size, saturation time, extracted cost per schedule",
                      _schedules_flags)
RULES = Benchmark("experiments.bench_rules", _rules,
                  "verify Tensat's rules, then synthesize rules of up to 3 operators", _rules_flags)
PARALLEL = Benchmark("experiments.bench_parallel", _parallel,
                     "eqsat parallel over the cases and meshes: predicted step, compiled bytes, memory", _parallel_flags)
MULTIPROCESS = Benchmark("experiments.parallel_multiprocess", _multiprocess,
                         "a parallel plan as 2 processes x 4 CPU devices (jax.distributed), checked against one process",
                         _multiprocess_flags)

BENCHMARKS: Mapping[str, Benchmark] = MappingProxyType({
    "jax": JAX, "ceiling": CEILING, "extraction": EXTRACTION, "scaling": SCALING, "lns": LNS, "tensat": TENSAT,
    "schedules": SCHEDULES, "rules": RULES, "parallel": PARALLEL, "multiprocess": MULTIPROCESS,
})
"""Name → benchmark; pyproject.toml's `[project.entry-points."eqsat.benchmarks"]` names the same
(tests/test_benchmarks.py keeps the two equal)."""

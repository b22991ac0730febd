"""`eqsat optimize MODEL`: the whole path on one model.

Build the model, saturate it with Tensat's rules, extract the cheapest graph under the cost model,
lower the original and the optimized graph through JAX, check that they agree on random inputs,
and time both here (jitted, warmed up, median of interleaved runs).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import jax_backend  # noqa: F401 - registers the "measured" cost model for --cost-model
from eqsat.cost import COST_MODEL_FACTORIES, cost_model
from eqsat.errors import EqsatError, NumericsError
from eqsat.ir import Graph
from eqsat.output_targets import writable_dir
from eqsat.rewrites.rule import Rule
from experiments.models import MODELS, build_model

__all__ = ["OptimizeOptions", "add_arguments", "candidate_rules", "compare_outputs", "optimize_model", "run", "time_interleaved"]


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything `optimize_model` needs besides the model name (the CLI flags, typed)."""

    extractor: str = "ilp"
    time_limit: float = 60.0
    node_limit: int = 50_000
    iterations: int = 30
    saturate_seconds: float = 120.0
    k_multi: int = 1
    cost_model: str = "roofline"
    device: str = "cpu"
    seed: int = 0
    repeats: int = 30
    save_graphs: Path | None = None
    rtol: float = 1e-4
    atol: float = 1e-5

    def __post_init__(self) -> None:
        """Reject limits no run can honour (NaN, negative, zero repeats) before any work."""
        checks = [("--time-limit", self.time_limit, 0.0), ("--saturate-seconds", self.saturate_seconds, 0.0),
                  ("--node-limit", self.node_limit, 1), ("--iterations", self.iterations, 0),
                  ("--k-multi", self.k_multi, 0), ("--repeats", self.repeats, 1)]
        for flag, value, least in checks:
            if not value >= least:  # also NaN
                raise EqsatError(f"{flag} must be at least {least:g}, not {value}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = OptimizeOptions()
    parser.add_argument("model", help=f"model name ({', '.join(MODELS)}) or a .model / Graph .json path")
    parser.add_argument("--extractor", default=d.extractor, help="extraction strategy (default: %(default)s)")
    parser.add_argument("--time-limit", type=float, default=d.time_limit, help="extraction time limit, seconds")
    parser.add_argument("--node-limit", type=int, default=d.node_limit, help="saturation e-node limit")
    parser.add_argument("--iterations", type=int, default=d.iterations, help="saturation iteration limit")
    parser.add_argument("--saturate-seconds", type=float, default=d.saturate_seconds, help="saturation time limit")
    parser.add_argument("--k-multi", type=int, default=d.k_multi, help="rounds of multi-pattern rules")
    parser.add_argument("--cost-model", default=d.cost_model, choices=sorted(COST_MODEL_FACTORIES))
    parser.add_argument("--device", default=d.device, help="device the cost model prices for (cpu, h100, h200, ...)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the random inputs")
    parser.add_argument("--repeats", type=int, default=d.repeats, help="timed runs of each graph")
    parser.add_argument("--save-graphs", type=Path, default=None, metavar="DIR",
                        help="write MODEL.before.json and MODEL.after.json (Graph JSON) here")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    options = OptimizeOptions(
        extractor=args.extractor, time_limit=args.time_limit, node_limit=args.node_limit,
        iterations=args.iterations, saturate_seconds=args.saturate_seconds, k_multi=args.k_multi,
        cost_model=args.cost_model, device=args.device, seed=args.seed, repeats=args.repeats,
        save_graphs=args.save_graphs,
    )
    yield optimize_model(args.model, options)


# --- measuring ----------------------------------------------------------------------------------

def time_interleaved(fns: Sequence[Callable[[], Any]], repeats: int, warmup: int = 3) -> list[float]:
    """Median seconds per call of each thunk over `repeats` interleaved rounds: the one timing
    policy, `jax_backend.timing.interleaved_rounds` (each thunk's results are blocked on)."""
    from jax_backend.timing import interleaved_rounds

    times, _ = interleaved_rounds(fns, max(repeats, 1), min_rounds=max(repeats, 1), warmup=warmup)
    return [statistics.median(t) for t in times]


def compare_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float, atol: float) -> bool:
    """Same number of outputs, same shapes, within tolerance relative to each output's magnitude
    (NaN only where the reference has NaN): `eqsat.compare.outputs_agree`."""
    from eqsat.compare import outputs_agree

    return outputs_agree(expected, got, rtol, atol).ok


@dataclass(frozen=True)
class Measurement:
    """JAX numerics and timings of an original and an optimized graph."""

    numerics_ok: bool
    max_abs_diff: float
    before_s: float
    after_s: float
    reason: str = ""  # why the numerics are not ok
    original_abs_err: float = 0.0  # the original's own error in JAX against the float64 reference


def measure_pair(original: Graph, optimized: Graph, inputs: Mapping[str, np.ndarray], repeats: int,
                 rtol: float, atol: float) -> Measurement:
    """Lower both graphs, check them against the float64 numpy reference, and time both.

    The check is `outputs_agree`: the optimized graph's error against the float64 reference,
    relative to each output's magnitude, must be within rtol, or within 4x the original's own
    error where that is larger (an ill-conditioned graph in float32).
    Values computed from weights alone (the concatenated weights of merged matmuls) are computed
    once before timing, as a model does when it loads its weights; the cost model prices them
    the same way (`eqsat.cost.weight_only_nodes`).
    """
    import jax

    from eqsat.compare import outputs_agree
    from jax_backend.lower import fold_weights, to_jax

    runs = []
    for graph in (original, optimized):
        folded, values = fold_weights(graph, inputs)
        runs.append((jax.jit(to_jax(folded)), {k: jax.device_put(v) for k, v in values.items()}))
    (before, args_before), (after, args_after) = runs
    with np.errstate(all="ignore"):
        reference = original.evaluate({k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()})
    out_before = [np.asarray(x) for x in jax.block_until_ready(before(args_before))]
    out_after = [np.asarray(x) for x in jax.block_until_ready(after(args_after))]
    own = outputs_agree(reference, out_before, rtol, atol)
    own_err = [e if math.isfinite(e) else 0.0 for e in own.abs_diffs]
    verdict = outputs_agree(reference, out_after, rtol, atol, allowed_abs=[4 * e for e in own_err])
    if own.max_rel_err > 1e-2:  # the original's own error is no excuse once it is this large
        verdict = replace(verdict, ok=False, reason=f"the original itself is off its float64 reference ({own.reason})")
    before_s, after_s = time_interleaved(
        [lambda: jax.block_until_ready(before(args_before)), lambda: jax.block_until_ready(after(args_after))],
        repeats)
    return Measurement(verdict.ok, verdict.max_abs_diff, before_s, after_s, verdict.reason, own.max_abs_diff)


# --- the path -----------------------------------------------------------------------------------

def candidate_rules() -> list[Rule]:
    """Tensat's rules (unverified, as written) plus the library's `conv_merges` group: Tensat's conv
    merges are refuted for grouped convs, and without their guarded versions (and the `enlarge`
    merges) Inception's parallel convs could never merge."""
    from eqsat.rewrites import library_rules
    from eqsat.rulesets import tensat_rules

    return tensat_rules() + library_rules(["conv_merges", "nary_merges"])


def optimize_model(model: str, options: OptimizeOptions = OptimizeOptions()) -> dict[str, Any]:
    """Run the whole path on `model` and return the report row (the CLI's JSON fields and a few more)."""
    from rich.console import Console

    from eqsat.egraph import encoded_signatures
    from eqsat.pipeline import optimize_graph
    from eqsat.rulesets import select_rules
    from eqsat.saturate import Limits

    console = Console(stderr=True)
    if options.save_graphs is not None:
        writable_dir(options.save_graphs, "--save-graphs")
    graph = build_model(model)
    costs = cost_model(options.cost_model, device=options.device)
    limits = Limits(iterations=options.iterations, nodes=options.node_limit, seconds=options.saturate_seconds,
                    multi_rounds=options.k_multi)
    console.print(f"[bold]{model}[/]: {len(graph.nodes)} nodes; saturating (limits: {limits.iterations} iterations, "
                  f"{limits.nodes} e-nodes, {limits.seconds:g} s) and extracting with {options.extractor}")
    with console.status("verifying the rules (Tensat's and conv_merges) that can match the graph (cached after the first run)"):
        rule_set = select_rules(candidate_rules(), encoded_signatures(graph))
    result = optimize_graph(graph, rule_set.trusted, limits, costs, extractor=options.extractor,
                            time_limit=options.time_limit, seed=options.seed, progress=True)
    optimized = result.optimized
    if options.save_graphs is not None:
        stem = model if model in MODELS else Path(model).stem
        graph.save(options.save_graphs / f"{stem}.before.json")
        optimized.save(options.save_graphs / f"{stem}.after.json")
    with console.status(f"[bold]{model}[/]: lowering, checking and timing both graphs through JAX"):
        measured = measure_pair(graph, optimized, graph.random_inputs(options.seed), options.repeats,
                                options.rtol, options.atol)
    if not (result.numerics_ok and measured.numerics_ok):
        raise NumericsError(f"{model}: the optimized graph disagrees with the original through JAX: "
                            f"{measured.reason or 'float64 check failed'}; no result is reported")
    return {
        "model": model,
        "enodes": result.enodes,
        "eclasses": result.eclasses,
        "saturate_s": result.saturate_s,
        "extract_s": result.extract_s,
        "cost_before": result.cost_before,
        "cost_after": result.cost_after,
        "measured_before_s": measured.before_s,
        "measured_after_s": measured.after_s,
        "numerics_ok": bool(result.numerics_ok and measured.numerics_ok),
        "stop_reason": result.stop_reason,
        "iterations": len(result.saturation.iterations),
        **rule_set.counts(),
        "extractor": options.extractor,
        "selection_status": result.selection_status,
        "cost_model": f"{options.cost_model}/{costs.device}",
        "nodes_before": len(graph.live().nodes),
        "nodes_after": len(optimized.live().nodes),
        "op_counts_after": optimized.live().op_counts(),
        "max_abs_diff_jax": measured.max_abs_diff,
        "original_abs_err_jax": measured.original_abs_err,
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: eqsat optimize MODEL")

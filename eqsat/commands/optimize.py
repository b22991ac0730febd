"""`eqsat optimize MODEL`: the whole path on one model.

Build the model, saturate it with Tensat's rules, extract the cheapest graph under the cost model,
lower the original and the optimized graph through JAX, check that they agree on random inputs,
and time both here (jitted, warmed up, median of interleaved runs: `jax_backend.checks.measure_pair`).
The rules are `eqsat.rulesets.candidate_rules`, the models `eqsat.models`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax_backend  # noqa: F401 - registers the "measured" cost model for --cost-model
from eqsat.cost import CONVENTIONS, COST_MODEL_FACTORIES, conventions, cost_model
from eqsat.errors import EqsatError, NumericsError
from eqsat.models import MODELS, build_model
from eqsat.output_targets import writable_dir
from eqsat.rulesets import RULE_SETS, named_rules
from jax_backend.checks import measure_pair

__all__ = ["OptimizeOptions", "add_arguments", "optimize_model", "run"]


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
    conventions: str = "ours"  # eqsat.cost.CONVENTIONS: "tensat" charges weight-only ops, prices transposes 0
    rules: str = "default"  # eqsat.rulesets.RULE_SETS: "tensat-only" for Tensat's rule files alone

    def __post_init__(self) -> None:
        """Reject limits no run can honour (NaN, negative, zero repeats) and unknown names before any work."""
        conventions(self.conventions)
        if self.rules not in RULE_SETS:
            named_rules(self.rules)  # the one error line
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
    parser.add_argument("--conventions", default=d.conventions,
                        help=f"extraction conventions ({', '.join(CONVENTIONS)}; default: %(default)s)")
    parser.add_argument("--rules", default=d.rules, help=f"rule set ({', '.join(RULE_SETS)}; default: %(default)s)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    options = OptimizeOptions(
        extractor=args.extractor, time_limit=args.time_limit, node_limit=args.node_limit,
        iterations=args.iterations, saturate_seconds=args.saturate_seconds, k_multi=args.k_multi,
        cost_model=args.cost_model, device=args.device, seed=args.seed, repeats=args.repeats,
        save_graphs=args.save_graphs, conventions=args.conventions, rules=args.rules,
    )
    yield optimize_model(args.model, options)


# --- the path -----------------------------------------------------------------------------------

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
    convention = conventions(options.conventions)
    costs = convention.apply(cost_model(options.cost_model, device=options.device))
    limits = Limits(iterations=options.iterations, nodes=options.node_limit, seconds=options.saturate_seconds,
                    multi_rounds=options.k_multi)
    console.print(f"[bold]{model}[/]: {len(graph.nodes)} nodes; saturating (limits: {limits.iterations} iterations, "
                  f"{limits.nodes} e-nodes, {limits.seconds:g} s) and extracting with {options.extractor}")
    with console.status("verifying the rules (Tensat's and conv_merges) that can match the graph (cached after the first run)"):
        rule_set = select_rules(named_rules(options.rules), encoded_signatures(graph))
    result = optimize_graph(graph, rule_set.trusted, limits, costs, extractor=options.extractor,
                            time_limit=options.time_limit, seed=options.seed, progress=True,
                            fold_weights=convention.fold_weights)
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
        "conventions": options.conventions,
        "rules": options.rules,
        "nodes_before": len(graph.live().nodes),
        "nodes_after": len(optimized.live().nodes),
        "op_counts_after": optimized.live().op_counts(),
        "max_abs_diff_jax": measured.max_abs_diff,
        "original_abs_err_jax": measured.original_abs_err,
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: eqsat optimize MODEL")

"""The TASO-style search alone, at its budget, against our ILP plan's predicted cost (issue 24 item 5).

`python -m experiments.taso_budget --models resnext50 --cost-models roofline/h100 --budget 1000`
prints one JSON line per (model, cost model): graphs popped, why it stopped, wall seconds, graphs/s,
its best cost ÷ the original's (costed as `bench tensat` costs it: concats written n-ary), and our
ILP plan's (`eqsat.pipeline.optimize_graph`, the same saturation and extraction as `eqsat optimize`,
without running the plans) with `ours_le_taso`. `--passes N` repeats ours (mean ± s.e. of its
optimizer time); the TASO-style search runs once per row (it is deterministic but for its clock).
A quick way to check the baseline without `bench tensat`'s end-to-end timing of every plan.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any


def budget_row(model: str, cost_name: str, device: str, budget: int, seconds: float, passes: int) -> dict[str, Any]:
    """One row: the TASO-style search at `budget` and our ILP plan, under one cost model."""
    from eqsat.cost import cost_model, graph_cost
    from eqsat.egraph import flatten_concats
    from eqsat.models import build_model
    from eqsat.pipeline import optimize_graph
    from eqsat.saturate import Limits
    from experiments.bench_tensat import _mean_se, bench_rules
    from experiments.taso_search import TasoOptions, seconds_to_cost, taso_search

    graph = build_model(model)
    rules = bench_rules(graph)
    costs = cost_model(cost_name, device=device)
    graph_cost(graph, costs)  # a measured model times the original's ops here, outside both clocks
    taso = taso_search(graph, rules, costs, TasoOptions(budget=budget, seconds=seconds))
    flat = [taso.cost_best, graph_cost(flatten_concats(taso.best), costs)]
    if taso.searched is not None:
        flat.append(graph_cost(flatten_concats(taso.searched), costs))
    cost_taso = min(flat)
    ours = [optimize_graph(graph, rules, Limits(nodes=50_000, seconds=60.0), costs, time_limit=60.0)
            for _ in range(passes)]
    cost_eqsat = ours[0].cost_after
    ours_s, ours_se = _mean_se([r.saturate_s + r.extract_s for r in ours])
    reached = seconds_to_cost(taso, cost_eqsat)
    return {"model": model, "cost_model": f"{cost_name}/{device}", "budget": budget, "taso_popped": taso.popped,
            "taso_stop": taso.stop_reason, "taso_generated": taso.generated, "taso_s": taso.seconds,
            "taso_graphs_per_s": taso.graphs_per_s, "taso_best_over_original": cost_taso / taso.cost_original,
            "taso_seconds_to_our_cost": reached, "cost_original": taso.cost_original, "cost_taso": cost_taso,
            "cost_eqsat": cost_eqsat, "eqsat_over_original": cost_eqsat / taso.cost_original,
            "ours_le_taso": cost_eqsat <= cost_taso * (1 + 1e-9), "ours_s": ours_s, "ours_s_se": ours_se,
            "passes": passes, "time_ratio": taso.seconds / ours_s if ours_s > 0 else None,
            "load_average": os.getloadavg()}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the flags, print one JSON line per row as it finishes."""
    from experiments.bench_tensat import TENSAT_MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TENSAT_MODELS))
    parser.add_argument("--cost-models", nargs="+", default=["roofline/h100", "measured/cpu"])
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3600.0, help="safety cap on one search")
    parser.add_argument("--passes", type=int, default=3, help="runs of ours per row")
    args = parser.parse_args(argv)
    for spec in args.cost_models:
        name, _, device = spec.partition("/")
        for model in args.models:
            print(json.dumps(budget_row(model, name, device or "cpu", args.budget, args.seconds, args.passes)),
                  flush=True)


if __name__ == "__main__":
    main()

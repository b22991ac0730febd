"""Compare when two-output (multi-pattern) rules run: e-graph size, saturation time, extracted cost.

    .venv/bin/python -m experiments.saturation_schedules nasrnn --k-multi 1 2

One JSON line per (schedule, k_multi): enodes, eclasses, saturate_s, extract_s, cost_before,
cost_after, stop_reason, selection_status, two-output pairs matched and skipped by the cycle guard.
"""

from __future__ import annotations

import argparse
import json
import sys

from eqsat.cost import cost_model
from eqsat.pipeline import optimize_graph
from eqsat.rulesets import select_rules
from eqsat.saturate import MULTI_SCHEDULES, Limits
from experiments.models import build_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--k-multi", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--schedules", nargs="+", default=list(MULTI_SCHEDULES), choices=MULTI_SCHEDULES)
    parser.add_argument("--node-limit", type=int, default=50_000)
    parser.add_argument("--time-limit", type=float, default=60.0, help="extraction time limit, seconds")
    args = parser.parse_args(argv)
    graph, rules, costs = build_model(args.model), select_rules("tensat").trusted, cost_model("roofline", device="cpu")
    for k in args.k_multi:
        for schedule in args.schedules:
            limits = Limits(nodes=args.node_limit, multi_rounds=k, multi_schedule=schedule)
            r = optimize_graph(graph, rules, limits, costs, extractor="ilp", time_limit=args.time_limit)
            rows = r.saturation.iterations
            print(json.dumps({"model": args.model, "schedule": schedule, "k_multi": k, "enodes": r.enodes,
                              "eclasses": r.eclasses, "saturate_s": round(r.saturate_s, 2),
                              "extract_s": round(r.extract_s, 2), "cost_before": r.cost_before,
                              "cost_after": r.cost_after, "stop_reason": r.stop_reason,
                              "selection_status": r.selection_status,
                              "pairs": sum(x.pairs for x in rows), "cyclic_pairs": sum(x.cyclic_pairs for x in rows),
                              "guard_s": round(sum(x.guard_seconds for x in rows), 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

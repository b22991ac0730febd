"""Compare when two-output (multi-pattern) rules run: e-graph size, saturation time, extracted cost.

    eqsat bench schedules nasrnn --k-multi 1 2

One JSON line per (schedule, k_multi): enodes, eclasses, saturate_s, extract_s, cost_before,
cost_after, stop_reason, selection_status, two-output pairs matched and skipped by the cycle guard.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from eqsat.cost import cost_model
from eqsat.errors import EqsatError
from eqsat.pipeline import optimize_graph
from eqsat.rulesets import select_rules
from eqsat.saturate import MULTI_SCHEDULES, Limits
from eqsat.models import build_model


def run_bench(model: str, k_multi: Sequence[int] = (1, 2), schedules: Sequence[str] | None = None,
              node_limit: int = 50_000, time_limit: float = 60.0) -> Iterator[dict[str, Any]]:
    """One row per (k_multi, schedule); `schedules` None means all of `MULTI_SCHEDULES`."""
    unknown = sorted(set(schedules or ()) - set(MULTI_SCHEDULES))
    if unknown:
        raise EqsatError(f"unknown schedule(s) {', '.join(unknown)}; known: {', '.join(MULTI_SCHEDULES)}")
    graph, rules, costs = build_model(model), select_rules("tensat").trusted, cost_model("roofline", device="cpu")
    for k in k_multi:
        for schedule in schedules or MULTI_SCHEDULES:
            limits = Limits(nodes=node_limit, multi_rounds=k, multi_schedule=schedule)
            r = optimize_graph(graph, rules, limits, costs, extractor="ilp", time_limit=time_limit)
            rows = r.saturation.iterations
            yield {"model": model, "schedule": schedule, "k_multi": k, "enodes": r.enodes,
                   "eclasses": r.eclasses, "saturate_s": round(r.saturate_s, 2),
                   "extract_s": round(r.extract_s, 2), "cost_before": r.cost_before,
                   "cost_after": r.cost_after, "stop_reason": r.stop_reason,
                   "selection_status": r.selection_status,
                   "pairs": sum(x.pairs for x in rows), "cyclic_pairs": sum(x.cyclic_pairs for x in rows),
                   "guard_s": round(sum(x.guard_seconds for x in rows), 3)}

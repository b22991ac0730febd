"""Does the "xla" cost model predict what runs? (`eqsat calibrate --check MODEL...`)

For each model: one saturation, the cheapest graph under several cost models (the candidates),
each candidate run end to end against the original through JAX (`jax_backend.checks.measure_pair`,
the one timing policy), and the xla model's predicted speedup (cost of the original / cost of the
candidate) set beside the measured one (time of the original / time of the candidate). The row
gives the xla model's own plan, every candidate, and Spearman's rank correlation between predicted
and measured speedups over the candidates and the original itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqsat.cost import CostModel, cost_model, graph_cost
from eqsat.ir import Graph

__all__ = ["CANDIDATE_MODELS", "CheckOptions", "check_models", "spearman"]

CANDIDATE_MODELS: tuple[tuple[str, str], ...] = (
    ("xla", "cpu"), ("roofline", "cpu"), ("roofline", "h100"), ("merge", "cpu"))
"""The cost models whose plans are the candidates (name, device); the first is the model checked."""


@dataclass(frozen=True)
class CheckOptions:
    node_limit: int = 20_000
    saturate_seconds: float = 30.0
    time_limit: float = 15.0  # extraction, per model
    repeats: int = 15
    seed: int = 0


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN with fewer than 3 points or a
    constant side."""
    if len(xs) < 3 or len(xs) != len(ys):
        return float("nan")

    def ranks(values: Sequence[float]) -> np.ndarray:
        a = np.asarray(values, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        i = 0
        while i < len(a):
            j = i
            while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
                j += 1
            r[order[i:j + 1]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _candidates(graph: Graph, options: CheckOptions, models: Mapping[str, CostModel]) -> dict[Graph, list[str]]:
    from eqsat.egraph import encoded_signatures
    from eqsat.pipeline import search
    from eqsat.rulesets import candidate_rules, select_rules
    from eqsat.saturate import Limits

    rules = select_rules(candidate_rules(), encoded_signatures(graph)).trusted
    limits = Limits(nodes=options.node_limit, seconds=options.saturate_seconds)
    found = search(graph, rules, limits, models, "ilp", options.time_limit, seed=options.seed)
    plans: dict[Graph, list[str]] = {graph.live(): ["original"]}
    for label, extraction in found.by_model.items():
        if extraction.numerics_ok:
            plans.setdefault(extraction.graph.live(), []).append(label)
    return plans


def check_model(name: str, options: CheckOptions = CheckOptions()) -> dict[str, Any]:
    """One model's row: the xla model's plan (predicted and measured speedup), every candidate,
    and the rank correlation."""
    from eqsat.models import build_model
    from jax_backend.checks import measure_pair

    graph = build_model(name)
    models = {f"{m}/{d}": cost_model(m, device=d) for m, d in CANDIDATE_MODELS}
    xla = models["xla/cpu"]
    plans = _candidates(graph, options, models)
    inputs = graph.random_inputs(options.seed)
    scale = max(1.0, max(float(np.max(np.abs(o))) for o in graph.evaluate(inputs)))
    before = graph_cost(graph, xla)
    rows: list[dict[str, Any]] = []
    for plan, labels in plans.items():
        predicted = before / graph_cost(plan, xla)
        if labels == ["original"]:
            rows.append({"models": labels, "predicted_speedup": predicted, "measured_speedup": 1.0})
            continue
        measured = measure_pair(graph, plan, inputs, options.repeats, rtol=1e-4, atol=1e-5 * scale)
        rows.append({"models": labels, "predicted_speedup": predicted,
                     "measured_speedup": measured.before_s / measured.after_s, "numerics_ok": measured.numerics_ok,
                     "measured_original_ms": measured.before_s * 1e3, "measured_plan_ms": measured.after_s * 1e3,
                     "kernels": sum(1 for n in plan.nodes if n.op not in ("input", "weight"))})
    own = next((r for r in rows if "xla/cpu" in r["models"]), rows[0])
    return {
        "model": name,
        "predicted_speedup": own["predicted_speedup"],
        "measured_speedup": own["measured_speedup"],
        "error_points": 100 * (own["predicted_speedup"] - own["measured_speedup"]),
        "spearman": spearman([r["predicted_speedup"] for r in rows], [r["measured_speedup"] for r in rows]),
        "candidates": rows,
    }


def check_models(names: Iterable[str], options: CheckOptions = CheckOptions()) -> Iterable[dict[str, Any]]:
    for name in names:
        yield check_model(name, options)

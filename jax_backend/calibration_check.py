"""Does the "xla" cost model predict what runs? (`eqsat calibrate --check MODEL...`)

For each model: the cheapest graph under several cost models (the candidates; under our rules and
conventions, and under Tensat's), each checked against the original through JAX
(`jax_backend.checks.measure_pair`) and all timed end to end in the same interleaved rounds (the one
timing policy, `screen_timings`), and the xla model's predicted speedup (cost of the original / cost
of the candidate) set beside the measured one. The row gives the xla model's own plan, every
candidate, and Spearman's rank correlation between predicted and measured speedups over the
candidates and the original itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqsat import ops
from eqsat.cost import CostModel, cost_model, predicted_speedup
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
    repeats: int = 30  # interleaved rounds of the original and every plan
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
    """The distinct plans: each model's under our rules and conventions, and the xla and CPU
    roofline models' under Tensat's rules and conventions (weight-only ops charged, transposes free)."""
    from eqsat.cost import conventions
    from eqsat.egraph import encoded_signatures
    from eqsat.pipeline import search
    from eqsat.rulesets import named_rules, select_rules
    from eqsat.saturate import Limits

    limits = Limits(nodes=options.node_limit, seconds=options.saturate_seconds)
    tensat = conventions("tensat")
    runs = [("", "default", True, dict(models)),
            (" tensat", "tensat-only", tensat.fold_weights,
             {k: tensat.apply(m) for k, m in models.items() if k in ("xla/cpu", "roofline/cpu")})]
    plans: dict[Graph, list[str]] = {graph.live(): ["original"]}
    for suffix, rule_set, fold, chosen in runs:
        rules = select_rules(named_rules(rule_set), encoded_signatures(graph)).trusted
        found = search(graph, rules, limits, chosen, "ilp", options.time_limit, seed=options.seed, fold_weights=fold)
        for label, extraction in found.by_model.items():
            if extraction.numerics_ok:
                plans.setdefault(extraction.graph.live(), []).append(label + suffix)
    return plans


def _speedups(original: Graph, plans: Sequence[Graph], inputs: Mapping[str, np.ndarray],
              rounds: int) -> list[tuple[float, float, float]]:
    """Each plan's measured speedup over `original` with its 95% interval, all in the same
    interleaved rounds (`jax_backend.timing.screen_timings`: one machine state per round, so the
    plans are ranked against each other too), lowered as `measure_pair` lowers them."""
    import jax

    from jax_backend.lower import fold_weights, to_jax
    from jax_backend.timing import screen_timings

    def thunk(graph: Graph) -> Any:
        folded, values = fold_weights(graph, inputs)
        fn, args = jax.jit(to_jax(folded)), {k: jax.device_put(v) for k, v in values.items()}
        return lambda: fn(args)

    timings = screen_timings(thunk(original), [thunk(p) for p in plans], (), rounds=rounds, budget_s=60.0,
                             min_rounds=min(rounds, 8))
    return [(t.speedup, *t.speedup_ci) for t in timings]


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
    checked = [p for p in plans if p != graph.live()
               and measure_pair(graph, p, inputs, 1, rtol=1e-4, atol=1e-5 * scale).numerics_ok]
    measured = dict(zip(checked, _speedups(graph, checked, inputs, options.repeats)))
    rows: list[dict[str, Any]] = [{"models": ["original"], "predicted_speedup": 1.0, "measured_speedup": 1.0,
                                   "measured_speedup_ci": [1.0, 1.0]}]
    for plan in checked:
        speedup, low, high = measured[plan]
        rows.append({"models": plans[plan], "predicted_speedup": predicted_speedup(graph, plan, xla),
                     "measured_speedup": speedup, "measured_speedup_ci": [low, high],
                     "kernels": sum(1 for n in plan.nodes if not ops.OPS[n.op].is_leaf and not ops.OPS[n.op].is_view),
                     "flops": plan.live().total_flops()})
    own = next((r for r in rows if "xla/cpu" in r["models"]), rows[0])
    return {
        "model": name,
        "predicted_speedup": own["predicted_speedup"],
        "measured_speedup": own["measured_speedup"],
        "measured_speedup_ci": own["measured_speedup_ci"],
        "error_points": 100 * (own["predicted_speedup"] - own["measured_speedup"]),
        "spearman": spearman([r["predicted_speedup"] for r in rows], [r["measured_speedup"] for r in rows]),
        "plans": len(rows),
        "candidates": rows,
    }


def check_models(names: Iterable[str], options: CheckOptions = CheckOptions()) -> Iterable[dict[str, Any]]:
    for name in names:
        yield check_model(name, options)

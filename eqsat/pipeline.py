"""The pure equality-saturation path: Graph → e-graph → saturate → serialize → extract → decode → check.

No JAX here: the result is checked against the original with the numpy interpreter, and a graph
that disagrees is never returned (NumericsError). If extraction finds nothing cheaper than the
input (e.g. a solver that timed out), the input graph is returned and `selection_status` says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eqsat import ops
from eqsat.egraph import CostModel, TensorEGraph, decode
from eqsat.errors import EqsatError, NumericsError
from eqsat.ir import Graph
from eqsat.rewrites.parser import load_rules, tensat_rule_files
from eqsat.rewrites.rule import Rule
from eqsat.saturate import Limits, SaturationReport, saturate

__all__ = ["OptimizationResult", "optimize_graph", "default_rules", "tensat_rules", "data_dir", "graph_cost", "numerics_match"]


@dataclass(frozen=True)
class OptimizationResult:
    """Everything one optimization did; `optimized` has been checked against `original`."""

    original: Graph
    optimized: Graph
    saturation: SaturationReport
    enodes: int
    eclasses: int
    saturate_s: float
    extract_s: float
    cost_before: float
    cost_after: float
    selection_status: str
    extractor: str
    numerics_ok: bool
    max_abs_diff: float
    extracted_cost: float  # the extractor's DAG cost, recomputed from its chosen nodes
    egraph_json: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)  # the saturated e-graph

    @property
    def stop_reason(self) -> str:
        return self.saturation.stop_reason

    def to_json(self) -> dict[str, Any]:
        return {"enodes": self.enodes, "eclasses": self.eclasses, "saturate_s": self.saturate_s,
                "extract_s": self.extract_s, "cost_before": self.cost_before, "cost_after": self.cost_after,
                "selection_status": self.selection_status, "extractor": self.extractor,
                "numerics_ok": self.numerics_ok, "max_abs_diff": self.max_abs_diff,
                "stop_reason": self.stop_reason, "saturation": self.saturation.to_json()}


def data_dir() -> Path:
    """The shared data directory: $EQSAT_DATA, else `shared/data` beside the repository."""
    env = os.environ.get("EQSAT_DATA") or os.environ.get("EQSAT_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def tensat_rules() -> list[Rule]:
    """Tensat's single- and two-output rule files, as written (unverified)."""
    rules: list[Rule] = []
    for path in tensat_rule_files(data_dir()):
        if not path.exists():
            raise EqsatError(f"rule file {path} not found; set EQSAT_DATA to the shared data directory")
        rules.extend(load_rules(path))
    return rules


def default_rules(allow_unproved: bool = False, candidates: Sequence[Rule] | None = None) -> list[Rule]:
    """Tensat's rules that the verifier accepts (results cached on disk, so this is cheap after once).

    Rules refuted only on shapes but proved whenever their right side is well-typed are admitted
    (`allow_guarded`): the egglog translation builds a right side only when its shape facts hold.
    Rules refuted on values are never used; unknown ones only with `allow_unproved`. `candidates`
    narrows the rules considered (default: all of Tensat's), e.g. to those that can match one
    graph (`rules_that_can_match`), so the others are never verified.
    """
    from eqsat.rewrites.verify import verified_rules

    rules = tensat_rules() if candidates is None else list(candidates)
    return verified_rules(rules, allow_unproved=allow_unproved, allow_guarded=True)


def graph_cost(graph: Graph, cost_model: CostModel, fold_weights: bool = False) -> float:
    """Sum of op costs over the nodes the outputs depend on (leaves cost nothing; with
    `fold_weights`, neither do ops computed from weights alone, as in `TensorEGraph.serialize`)."""
    live = graph.live()
    constant: set[int] = set()
    total = 0.0
    for i, n in enumerate(live.nodes):
        if n.op == "weight" or (n.op != "input" and all(v.node in constant for v in n.inputs)):
            constant.add(i)
            if fold_weights or ops.OPS[n.op].is_leaf:
                continue
        if not ops.OPS[n.op].is_leaf:
            total += cost_model.op_cost(n.op, n.attr, [live.shape(v) for v in n.inputs])
    return float(total)


def _finite(outputs: Sequence[np.ndarray]) -> bool:
    return all(bool(np.all(np.isfinite(x))) for x in outputs)


def checkable_inputs(graph: Graph, seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Random float64 inputs on which `graph` itself gives finite outputs, and those outputs.

    Graphs captured from user code often take square roots or logs of inputs (a batchnorm written
    as `rsqrt(var + eps)`), so N(0, 1) inputs can make the original itself NaN and no rewrite could
    ever be checked. Then the inputs are made positive (|x| + 0.5), the usual domain of such code.
    """
    inputs = graph.random_inputs(seed, dtype=np.float64)
    with np.errstate(all="ignore"):
        outputs = graph.evaluate(inputs)
        if not _finite(outputs):
            inputs = {k: np.abs(v) + 0.5 for k, v in inputs.items()}
            outputs = graph.evaluate(inputs)
    return inputs, outputs


def numerics_match(a: Graph, b: Graph, seed: int = 0, rtol: float = 1e-7, trials: int = 2) -> tuple[bool, float]:
    """Run both graphs in float64 on the same random inputs (`trials` draws); returns (close, max
    |difference|). Where the original is not finite even on positive inputs, `b` must be non-finite
    at the same places."""
    if a.leaf_shapes() != b.leaf_shapes():
        return False, float("inf")
    worst, ok = 0.0, True
    for trial in range(trials):
        inputs, outs_a = checkable_inputs(a, seed + trial)
        with np.errstate(all="ignore"):
            outs_b = b.evaluate(inputs)
        if len(outs_a) != len(outs_b) or any(x.shape != y.shape for x, y in zip(outs_a, outs_b)):
            return False, float("inf")
        for x, y in zip(outs_a, outs_b):
            same_domain = bool(np.array_equal(np.isfinite(x), np.isfinite(y)))
            finite = np.isfinite(x)
            diff = float(np.max(np.abs(x[finite] - y[finite]))) if finite.any() else 0.0
            scale = max(1.0, float(np.max(np.abs(x[finite]))) if finite.any() else 0.0)
            worst = max(worst, diff)
            ok = ok and same_domain and diff <= rtol * scale
    return ok, worst


def _extractor(name: str) -> Callable[..., Any]:
    """`eqsat.extract.extract` when present, else the named extractor module (local adapter)."""
    try:
        from eqsat.extract import extract  # type: ignore[attr-defined]

        return lambda data, time_limit: extract(data, extractor=name, time_limit=time_limit)
    except ImportError:
        pass
    table: Mapping[str, tuple[str, str]] = {
        "ilp": ("eqsat.extract.ilp", "ilp"),
        "greedy-dag": ("eqsat.extract.greedy_dag", "greedy_dag"),
        "bottom-up": ("eqsat.extract.bottom_up", "bottom_up"),
    }
    if name not in table:
        raise EqsatError(f"unknown extractor '{name}'; known: {', '.join(table)}")
    import importlib

    module, fn = table[name]
    return getattr(importlib.import_module(module), fn)


def optimize_graph(graph: Graph, rules: Sequence[Rule], limits: Limits, cost_model: CostModel,
                   extractor: str = "ilp", time_limit: float = 60.0, seed: int = 0,
                   progress: bool = False, fold_weights: bool = True) -> OptimizationResult:
    """Saturate `graph` with `rules`, extract the cheapest equivalent under `cost_model`, check it.

    `fold_weights` (TASO/Tensat's convention, on by default): ops computed from weights alone are
    precomputed once, so they cost nothing in the e-graph nor in `cost_before` / `cost_after`.
    """
    from eqsat.extract.egraph_data import load_egraph

    t0 = time.perf_counter()
    egraph = TensorEGraph.from_graph(graph)
    report = saturate(egraph, rules, limits, progress=progress)
    egraph_json = egraph.serialize(cost_model, fold_weights=fold_weights)
    saturate_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    data = load_egraph(egraph_json)
    selection = _extractor(extractor)(data, time_limit=time_limit)
    extract_s = time.perf_counter() - t1
    optimized = decode(egraph_json, selection.as_ids(data)).live()
    cost_before = graph_cost(graph, cost_model, fold_weights)
    cost_after = graph_cost(optimized, cost_model, fold_weights)
    status = str(selection.status)
    if cost_after > cost_before:
        optimized, cost_after, status = graph, cost_before, f"{status}; kept the input (extraction was not cheaper)"
    ok, diff = numerics_match(graph, optimized, seed)
    if not ok:
        raise NumericsError(f"the optimized graph differs from the original on random inputs (max |diff| {diff:.3g}); "
                            "a rule or the decoder is wrong")
    return OptimizationResult(graph, optimized, report, len(egraph_json["nodes"]), len(egraph_json["class_data"]),
                              saturate_s, extract_s, cost_before, cost_after, status, extractor, ok, diff,
                              float(selection.dag_cost), egraph_json)

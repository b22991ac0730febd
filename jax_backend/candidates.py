"""A few distinct candidate rewrites of one region, for measured selection (autotuning-style).

No single cost model ranks whole graphs well on every machine: the roofline model sees no gain
from merging matmuls on a CPU, and op-by-op timings are noisy. So one saturated e-graph is
extracted under several models, each one biased differently, and the decorator times the
distinct results instead of trusting any one model. Saturation runs once; each model only pays a
serialization and an extraction.

The "merge" model is the roofline plus a fixed cost per non-fusible op (a matmul or conv call):
on CPU each such call is its own loop nest, thread-pool dispatch and pass over its input, so
fewer, larger calls win even when the roofline says the work is the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from eqsat import ops
from eqsat.ir import Graph

__all__ = ["CANDIDATE_ONLY_MODELS", "PerCallModel", "RegionCandidates", "region_candidates", "candidate_models",
           "no_extra_work", "structure_key"]

ORIGINAL = "original"


@dataclass(frozen=True)
class PerCallModel:
    """`base` plus `per_call_s` for every op that XLA cannot fuse into its neighbours."""

    base: Any
    per_call_s: float
    name: str = "merge"

    @property
    def device(self) -> str:
        return getattr(self.base, "device", "cpu")

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        from jax_backend.measured_cost import FUSIBLE_OPS

        cost = self.base.op_cost(op, attrs, input_shapes)
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view or op in FUSIBLE_OPS or op in ("concat", "split"):
            return cost
        return cost + self.per_call_s


CANDIDATE_ONLY_MODELS: tuple[str, ...] = ("merge",)
"""Cost models only the decorator's candidates use, next to `eqsat.cost`'s named ones: "merge" is
the roofline plus a fixed cost per matmul/conv call, which favours merged calls."""


def candidate_models(names: Sequence[str], device: str) -> dict[str, Any]:
    """The cost models to extract under, by label: "roofline", "measured", "merge"."""
    from eqsat.cost import cost_model

    models: dict[str, Any] = {}
    for name in names:
        if name == "merge":
            models[name] = PerCallModel(cost_model("roofline", device), per_call_s=1e-3)
        else:
            models[name] = cost_model(name, device)
    return models


def no_extra_work(before: Graph, after: Graph, slack: float = 1.01) -> bool:
    """False when the rewritten graph does more arithmetic than the original: merges that overlap
    (the same weight in two concatenations) compute some products twice."""
    return after.live().total_flops() <= slack * before.live().total_flops()


def structure_key(graph: Graph) -> tuple[Any, ...]:
    """Equal for graphs that compute the same ops on the same shapes (node order aside): what
    makes two extractions the same candidate."""
    from collections import Counter

    live = graph.live()
    nodes = Counter((n.op, n.attrs, n.shapes, tuple(sorted((live.nodes[v.node].op, live.shape(v)) for v in n.inputs)))
                    for n in live.nodes)
    return tuple(sorted(nodes.items(), key=repr))


@dataclass(frozen=True)
class RegionCandidates:
    """Distinct checked rewrites of one (canonical) region by the label of the model that chose
    them; a label whose extraction equals the original, failed, or adds work is absent."""

    original: Graph
    by_label: Mapping[str, Graph] = field(default_factory=dict)
    enodes: int = 0
    eclasses: int = 0
    matches: Mapping[str, int] = field(default_factory=dict)
    stop_reason: str = ""
    errors: tuple[str, ...] = ()
    seconds: float = 0.0

    def get(self, label: str) -> Graph:
        return self.by_label.get(label, self.original)


def region_candidates(region: Graph, rules: Sequence[Any], limits: Any, models: Mapping[str, Any],
                      extractor: str = "ilp", time_limit: float = 2.0, fold_weights: bool = True) -> RegionCandidates:
    """Saturate `region` once and extract it under each of `models`; each result is checked
    against the region with the numpy interpreter (a disagreeing or flop-adding result is dropped).

    Two-output merges that overlap (one weight in two concatenations) compute some products twice,
    so a model whose extraction adds work is extracted again from an e-graph grown by the
    single-output rules alone: the rewrites that pay without merging (a separable pool, a folded
    batchnorm) are then not lost with the merges."""
    from eqsat.egraph import TensorEGraph, decode
    from eqsat.extract.egraph_data import load_egraph
    from eqsat.pipeline import _extractor, numerics_match
    from eqsat.saturate import saturate

    start = time.perf_counter()
    deadline = start + time_limit
    egraph = TensorEGraph.from_graph(region)
    report = saturate(egraph, rules, limits)
    extract = _extractor(extractor)
    found: dict[str, Graph] = {}
    errors: list[str] = []
    enodes = eclasses = 0
    single_rules = [r for r in rules if not r.is_multi]
    single: TensorEGraph | None = None  # grown by the single-output rules, on first need

    def extract_from(eg: TensorEGraph, model: Any, seconds: float) -> tuple[Graph, int, int]:
        """The cheapest graph in `eg` under `model`, and the serialized e-graph's size."""
        data_json = eg.serialize(model, fold_weights=fold_weights)
        data = load_egraph(data_json)
        graph = decode(data_json, extract(data, time_limit=seconds).as_ids(data)).live()
        return graph, len(data_json["nodes"]), len(data_json["class_data"])

    per_model = max(time_limit - (time.perf_counter() - start), 0.05) / max(len(models), 1)
    for label, model in models.items():
        try:
            graph, enodes, eclasses = extract_from(egraph, model, per_model)
            if not no_extra_work(region, graph) and len(single_rules) < len(rules):
                if single is None:
                    single = TensorEGraph.from_graph(region)
                    saturate(single, single_rules, replace(limits, seconds=max(deadline - time.perf_counter(), 0.05)))
                graph, _, _ = extract_from(single, model, per_model)
        except Exception as exc:  # noqa: BLE001 - one model failing leaves the others
            errors.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        key = structure_key(graph)
        if key == structure_key(region):
            continue
        same = next((g for g in found.values() if structure_key(g) == key), None)
        if same is not None:
            found[label] = same
            continue
        ok, _ = numerics_match(region, graph)
        if not ok:
            errors.append(f"{label}: extracted graph differs from the region")
            continue
        if not no_extra_work(region, graph):
            continue
        found[label] = graph
    return RegionCandidates(region, found, enodes, eclasses, dict(report.total_matches), report.stop_reason,
                            tuple(errors), time.perf_counter() - start)

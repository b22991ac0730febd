"""A few distinct candidate rewrites of one region, for measured selection (autotuning-style).

No single cost model ranks whole graphs well on every machine: the roofline model sees no gain
from merging matmuls on a CPU, and op-by-op timings are noisy. So one saturated e-graph is
extracted under several models, each one biased differently, and the decorator times the
distinct results instead of trusting any one model. Saturation runs once; each model only pays a
serialization and an extraction: the search is `eqsat.pipeline.search`, the one the CLI runs;
this module only keeps the distinct results worth timing.

Cost models come from `eqsat.cost`'s registry (the JAX backend registers "measured" and "merge").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eqsat.ir import Graph

__all__ = ["RegionCandidates", "candidate_models", "region_candidates", "structure_key"]



def candidate_models(names: Sequence[str], device: str) -> dict[str, Any]:
    """The cost models to extract under, by name ("roofline", "measured", "merge", ...)."""
    from eqsat.cost import cost_model

    return {name: cost_model(name, device) for name in names}


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
                      extractor: str = "ilp", time_limit: float = 2.0) -> RegionCandidates:
    """`eqsat.pipeline.search` on `region` (one saturation, one extraction per model, each
    checked; merges that add work retried without them), keeping what is worth timing: the
    distinct extractions that differ from the region, agree with it and add no work."""
    from eqsat.pipeline import does_extra_work, search

    found = search(region, rules, limits, models, extractor, time_limit, avoid_extra_work=True)
    by_label: dict[str, Graph] = {}
    errors = list(found.errors)
    original = structure_key(region)
    for label, extraction in found.by_model.items():
        key = structure_key(extraction.graph)
        if key == original:
            continue
        same = next((g for g in by_label.values() if structure_key(g) == key), None)
        if same is not None:
            by_label[label] = same
        elif not extraction.numerics_ok:
            errors.append(f"{label}: extracted graph differs from the region")
        elif not does_extra_work(region, extraction.graph):
            by_label[label] = extraction.graph
    return RegionCandidates(region, by_label, found.enodes, found.eclasses, dict(found.saturation.total_matches),
                            found.saturation.stop_reason, tuple(errors), found.saturate_s + found.extract_s)

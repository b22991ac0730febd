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

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eqsat.errors import EqsatError
from eqsat.ir import Graph

if TYPE_CHECKING:  # the egglog stage loads on first use
    from eqsat.cost import CostModel
    from eqsat.rewrites.rule import Rule
    from eqsat.saturate import Limits

type RuleSource = str | tuple[Rule, ...] | None
"""What `optimize(rules=...)` keeps: None (the default groups), "tensat", or the given rules."""

__all__ = ["RegionCandidates", "candidate_models", "program_key", "region_candidates", "structure_key"]



def candidate_models(names: Sequence[str], device: str) -> dict[str, CostModel]:
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


def program_key(graph: Graph) -> tuple[Any, ...]:
    """`structure_key` of `graph` with each fused activation (`act` of a matmul or conv) written as
    the unary op after it: equal for plans that lower to the same program. `jax_backend.lower`
    applies an `act` as that op, so a plan that only folds activations into their producers is the
    original program, and timing it against the original measures noise, not a plan."""
    from eqsat import ops
    from eqsat.ir import Node, Value

    nodes: list[Node] = []
    where: dict[int, int] = {}  # old node -> new node holding its (single) output
    for i, n in enumerate(graph.nodes):
        inputs = tuple(Value(where[v.node], v.index) for v in n.inputs)
        act = ops.Activation(int(n.attr.get("act", 0))) if len(n.shapes) == 1 else ops.Activation.NONE
        attrs = tuple((k, 0 if k == "act" else v) for k, v in n.attrs) if act is not ops.Activation.NONE else n.attrs
        nodes.append(Node(n.op, attrs, inputs, n.shapes))
        if act is not ops.Activation.NONE:
            nodes.append(Node(act.op_name, (), (Value(len(nodes) - 1),), n.shapes))
        where[i] = len(nodes) - 1
    return structure_key(Graph(tuple(nodes), tuple(Value(where[v.node], v.index) for v in graph.outputs)))


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


def region_candidates(region: Graph, rules: Sequence[Rule], limits: Limits, models: Mapping[str, CostModel],
                      extractor: str = "ilp", time_limit: float = 2.0) -> RegionCandidates:
    """`eqsat.pipeline.search` on `region` (one saturation, one extraction per model, each
    checked; merges that add work retried without them), keeping what is worth timing: the
    distinct extractions that differ from the region, agree with it and add no work."""
    from eqsat.pipeline import does_extra_work, search

    found = search(region, rules, limits, models, extractor, time_limit, avoid_extra_work=True,
                   price_choices_only=True)
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


# --- the search over a program's graphs, region by region ------------------------------------------

@dataclass(frozen=True)
class SegmentReport:
    """What happened to one IR graph of the program."""

    before: Graph = field(repr=False)
    after: Graph = field(repr=False)
    cost_before: float | None = None
    cost_after: float | None = None
    enodes: int | None = None
    eclasses: int | None = None
    rules_fired: tuple[str, ...] = ()
    stop_reason: str = ""
    seconds: float = 0.0
    kernels: tuple[str, ...] = ()
    error: str = ""
    cost_model: str = ""  # the candidate model whose choice `after` is and whose costs are given
    regions: str = ""  # how `before` was cut into e-graph regions (`eqsat.regions.Regions.report`)


def rule_source(rules: object) -> RuleSource:
    """None, "tensat", or the Rule values `rules` names (`eqsat.rulesets.given_rules`): rule files are
    parsed here, at decoration, so a missing or malformed file is an error then rather than a
    warning on the first call."""
    from eqsat.rulesets import TENSAT, given_rules

    if rules is None or (isinstance(rules, str) and rules == TENSAT):
        return rules
    return tuple(given_rules(rules))


def load_search_rules(rules: RuleSource, ops: frozenset[str]) -> list[Rule]:
    """The rules of `rule_source(...)` that can match a graph of `ops` and that the one trust policy
    admits (`eqsat.rulesets.select_rules`). Filtering first means rules that could never fire are
    never verified (a cold cache's main first-call cost)."""
    from eqsat.rulesets import select_rules

    return list(select_rules(rules, ops).trusted)


def check_names(extractor: str, models: Sequence[str]) -> None:
    """Unknown extractor or cost model names fail at decoration, with the known ones listed."""
    from eqsat.cost import COST_MODEL_FACTORIES, UnknownCostModelError
    from eqsat.extract.registry import EXTRACTORS

    if extractor not in EXTRACTORS:
        raise EqsatError(f"optimize: unknown extractor {extractor!r}; choose from {', '.join(EXTRACTORS)}")
    known = sorted(COST_MODEL_FACTORIES)
    for name in models:
        if name not in known:
            raise UnknownCostModelError(f"optimize: unknown cost model {name!r}; known cost models: {', '.join(known)}")


@dataclass
class RegionSearch:
    """What one signature's optimization shares across its graphs: rules, the candidate cost
    models, and the candidates of regions already optimized, keyed by structure (leaf names aside)."""

    rules: Sequence[Rule]
    models: Mapping[str, CostModel]
    extractor: str = "ilp"
    iterations: int = 8
    max_enodes: int = 20_000
    candidates: dict[Graph, RegionCandidates] = field(default_factory=dict)  # canonical region → its candidates
    failed: dict[Graph, str] = field(default_factory=dict)  # canonical region → error
    reused: int = 0


def make_search(rules: RuleSource, model_names: Sequence[str], graphs: Sequence[Graph], device: str,
                extractor: str = "ilp", iterations: int = 8, max_enodes: int = 20_000) -> RegionSearch:
    """The search state for `graphs`: the rules (of `rule_source(...)`) that can match them, and
    the cost models named `model_names` for `device`."""
    ops = frozenset(n.op for g in graphs for n in g.nodes)
    return RegionSearch(load_search_rules(rules, ops), candidate_models(model_names, device), extractor, iterations,
                        max_enodes)


def computed_nodes(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if n.op not in ("input", "weight"))


def collect_candidates(graph: Graph, time_limit: float, search: RegionSearch) -> float:
    """Saturate each region of `graph` not seen yet (by structure) and extract its candidates
    under `time_limit`; returns the seconds spent. A failing region keeps only the original."""
    from eqsat.regions import split
    from eqsat.saturate import Limits
    from eqsat.structure import canonicalize

    start = time.perf_counter()
    deadline = start + time_limit
    if computed_nodes(graph) < 2:
        return 0.0
    for region in split(graph).regions:
        if computed_nodes(region.graph) < 2:
            continue
        canon = canonicalize(region.graph).graph
        if canon in search.candidates or canon in search.failed:
            search.reused += 1
            continue
        left = deadline - time.perf_counter()
        if left <= 0.05:
            continue
        limits = Limits(iterations=search.iterations, nodes=search.max_enodes, seconds=left / 2, multi_rounds=2)
        try:
            search.candidates[canon] = region_candidates(canon, search.rules, limits, search.models, search.extractor,
                                                         time_limit=max(left * 0.9, 0.1))
        except Exception as exc:  # noqa: BLE001 - keep this region as it was, and say why
            search.failed[canon] = f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - start


def apply_label(graph: Graph, label: str, search: RegionSearch) -> tuple[Graph, tuple[Any, ...]]:
    """`graph` with every region replaced by the candidate `label` chose for its structure; also a
    key naming the choice made in each region (equal keys: the same program)."""
    from eqsat.regions import split
    from eqsat.structure import canonicalize

    if computed_nodes(graph) < 2:
        return graph, ()
    cut = split(graph)
    chosen: list[Any] = []
    graphs: list[Graph] = []
    for region in cut.regions:
        canon = canonicalize(region.graph)
        found = search.candidates.get(canon.graph)
        if found is None or label not in found.by_label:
            graphs.append(region.graph)
        else:
            chosen.append(structure_key(found.by_label[label]))
            graphs.append(canon.restore(found.by_label[label]))
    return (cut.replace(graphs), tuple(chosen)) if chosen else (graph, ())


def predicted_costs(before: Graph, after: Graph, search: RegionSearch,
                     label: str | None = None) -> tuple[float | None, float | None]:
    """Seconds per call of both graphs under the cost model `label` chose with (default: the first
    candidate model)."""
    from eqsat.cost import graph_cost

    model = search.models.get(label) if label is not None else next(iter(search.models.values()), None)
    if model is None:
        return None, None
    try:
        return graph_cost(before, model), graph_cost(after, model)
    except Exception:  # noqa: BLE001 - a cost the model cannot give is reported as unknown
        return None, None


def segment_report(before: Graph, after: Graph, search: RegionSearch, seconds: float,
                    label: str | None = None) -> SegmentReport:
    """What the e-graph found for the regions of `before` (summed over its distinct regions), with
    costs predicted by the model of candidate `label` (default: the first model)."""
    from eqsat.regions import split
    from eqsat.structure import canonicalize

    seen: list[RegionCandidates] = []
    errors: list[str] = []
    cut = split(before)
    for region in cut.regions:
        canon = canonicalize(region.graph).graph
        if canon in search.candidates:
            seen.append(search.candidates[canon])
        elif canon in search.failed:
            errors.append(search.failed[canon])
    totals: dict[str, int] = {}
    for c in seen:
        for k, v in c.matches.items():
            totals[k] = totals.get(k, 0) + v
        errors.extend(c.errors)
    fired = tuple(f"{k}×{v}" for k, v in sorted(totals.items()) if v)
    cost_before, cost_after = predicted_costs(before, after, search, label)
    return SegmentReport(before, after, cost_before, cost_after, sum(c.enodes for c in seen) if seen else None,
                         sum(c.eclasses for c in seen) if seen else None, fired,
                         "; ".join(sorted({c.stop_reason for c in seen})) or "no region optimized", seconds,
                         error="; ".join(sorted(set(errors))[:3]), regions=cut.report(),
                         cost_model=label if label is not None else next(iter(search.models), ""))

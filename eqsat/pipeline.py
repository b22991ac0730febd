"""The pure equality-saturation path: Graph → e-graph → saturate → serialize → extract → decode → check.

No JAX here: the result is checked against the original with the numpy interpreter, and a graph
that disagrees is never returned (NumericsError). If extraction finds nothing cheaper than the
input (e.g. a solver that timed out), the input graph is returned and `selection_status` says so.

The one door to extraction: an `Objective` (a cost model, possibly pricing nodes in context, with
knapsack rows and starts) prices a saturated e-graph (`Priced.of`), and `Priced.extract` runs a
strategy of the registry on it. `search` (`eqsat optimize`, the decorator) and the parallel planner
(`eqsat.parallel.planner`, which adds its own staging, strategies and budgets) both go through it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from eqsat import ops
from eqsat.compare import Agreement, outputs_agree
from eqsat.context import ContextAnalysis
from eqsat.cost import CostModel, OpKey, ZeroPriced, graph_cost, op_key
from eqsat.egraph import TensorEGraph, carry_selection, decode
from eqsat.errors import EqsatError, NumericsError
from eqsat.gc_pause import gc_paused
from eqsat.ir import Graph
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.to_egglog import rule_ops
from eqsat.saturate import Limits, SaturationReport, saturate

if TYPE_CHECKING:
    from eqsat.extract.egraph_data import EGraphData
    from eqsat.extract.lazy import NodeBudget
    from eqsat.extract.selection import Selection

__all__ = ["OptimizationResult", "optimize_graph", "search", "SearchResult", "Extraction", "does_extra_work",
           "numerics_match", "Agreement", "outputs_agree", "Objective", "Priced", "fixed_op_keys", "op_key"]


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
    # greedy-dag's choice on `egraph_json` (loader numbering) where the extractor computed it (the ILP's start)
    greedy_choice: np.ndarray | None = field(default=None, repr=False, compare=False)
    # extractions of the same e-graph under `optimize_graph`'s `alternatives` (by name; included in extract_s)
    alternatives: Mapping[str, Extraction] = field(default_factory=dict, repr=False, compare=False)

    @property
    def stop_reason(self) -> str:
        return self.saturation.stop_reason

    def to_json(self) -> dict[str, Any]:
        return {"enodes": self.enodes, "eclasses": self.eclasses, "saturate_s": self.saturate_s,
                "extract_s": self.extract_s, "cost_before": self.cost_before, "cost_after": self.cost_after,
                "selection_status": self.selection_status, "extractor": self.extractor,
                "numerics_ok": self.numerics_ok, "max_abs_diff": self.max_abs_diff,
                "stop_reason": self.stop_reason, "saturation": self.saturation.to_json()}


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
        outputs = graph.evaluate(inputs, widen=True)
        if not _finite(outputs):
            inputs = {k: np.abs(v) + 0.5 for k, v in inputs.items()}
            outputs = graph.evaluate(inputs, widen=True)
    return inputs, outputs


def numerics_match(a: Graph, b: Graph, seed: int = 0, rtol: float = 1e-7, trials: int = 2) -> tuple[bool, float]:
    """Run both graphs in float64 on the same random inputs (`trials` draws; conversions between
    float dtypes widened away, `Graph.evaluate`); returns (close, max
    |difference|) by `outputs_agree` (error relative to each output's magnitude, at least 1).
    Where the original is not finite even on positive inputs, `b` must be non-finite at the same
    places."""
    if a.leaf_shapes() != b.leaf_shapes():
        return False, float("inf")
    worst = 0.0
    for trial in range(trials):
        inputs, outs_a = checkable_inputs(a, seed + trial)
        with np.errstate(all="ignore"):
            outs_b = b.evaluate(inputs, widen=True)
        verdict = outputs_agree(outs_a, outs_b, rtol, atol=rtol)
        worst = max(worst, verdict.max_abs_diff)
        if not verdict:
            return False, worst
    return True, worst


@dataclass(frozen=True)
class Extraction:
    """One cost model's cheapest graph in a saturated e-graph, checked against the input."""

    graph: Graph
    status: str  # the extractor's
    dag_cost: float  # recomputed from its chosen nodes
    numerics_ok: bool
    max_abs_diff: float
    single_output: bool = False  # extracted from the e-graph grown by single-output rules only
    greedy_choice: np.ndarray | None = field(default=None, repr=False, compare=False)  # see OptimizationResult
    seconds: float = 0.0  # this model's serialization and extraction


@dataclass(frozen=True)
class SearchResult:
    """One saturation of `original`, extracted under each cost model (by name); a model whose
    extraction failed is absent from `by_model` and its error is in `errors`."""

    original: Graph
    saturation: SaturationReport
    by_model: Mapping[str, Extraction]
    enodes: int
    eclasses: int
    saturate_s: float  # saturation and serialization
    extract_s: float  # loading and extraction, summed over the models
    errors: tuple[str, ...] = ()
    egraph_json: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)  # the saturated e-graph


def does_extra_work(before: Graph, after: Graph, slack: float = 1.01) -> bool:
    """True when `after` does more arithmetic than `before`: two-output merges that overlap (one
    weight in two concatenations) compute some products twice. Conversions between dtypes are not
    counted: a plan that multiplies in float32 (the precision rules) adds roundings, not products."""
    def work(g: Graph) -> float:
        live = g.live()
        return sum(ops.flops(n.op, [live.shape(v) for v in n.inputs], n.attr) for n in live.nodes
                   if not ops.OPS[n.op].is_leaf and n.op != "convert_element_type")

    return work(after) > slack * work(before)


@dataclass(frozen=True)
class Objective:
    """What an extraction minimises and within which limits. `model` prices every e-node (in
    context where `context` is given: see eqsat.context; then `model` is an InContextCostModel);
    `rows`: knapsack rows by name, each the limit of the sum of the chosen nodes' terms that the
    model reports (e.g. "mem": bytes per device); `starts`: known graphs the extraction starts from
    where the e-graph holds them (the answer is never worse than one that fits the rows); `scale`:
    the extractor's cost units per second (e.g. 1e6 to solve in microseconds)."""

    model: CostModel
    rows: Mapping[str, float] = field(default_factory=dict)
    starts: tuple[Graph, ...] = ()
    context: ContextAnalysis | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class Priced:
    """A saturated e-graph serialized under one objective's pricing: `json` (decode's input,
    without the nodes the context left out), `data` (the extractors' arrays) and every node's row
    terms (loader numbering); `enodes` / `eclasses` count the e-graph before the context left any out."""

    json: Mapping[str, Any] = field(repr=False)
    data: EGraphData = field(repr=False)
    rows: Mapping[str, np.ndarray] = field(repr=False)
    enodes: int
    eclasses: int
    # class id -> node id a carried plan takes where it chooses none: classes added after
    # saturation that no plan from another e-graph names (`planner.with_open_outputs`)
    defaults: Mapping[str, str] = field(default_factory=dict, repr=False)

    @staticmethod
    def of(egraph: TensorEGraph, objective: Objective, fold_weights: bool = True) -> Priced:
        from eqsat.extract.egraph_data import load_egraph

        data_json = egraph.serialize(objective.model, fold_weights, objective.context, objective.scale)
        data = load_egraph(data_json)
        nodes = data_json["nodes"]
        names = sorted({r for n in nodes.values() for r in n.get("rows", ())})
        rows = {r: np.array([float(nodes[nid]["rows"].get(r, 0.0)) for nid in data.node_ids]) for r in names}
        left = data_json.get("left_out", {})
        return Priced(data_json, data, rows, len(nodes) + left.get("nodes", 0),
                            len(data_json["class_data"]) + left.get("classes", 0))

    def with_costs(self, cost: np.ndarray) -> Priced:
        """The same e-graph under other node costs (loader numbering), e.g. a Lagrangian price."""
        return replace(self, data=replace(self.data, cost=cost))

    def decode(self, selection: Selection) -> Graph:
        return decode(self.json, selection.as_ids(self.data)).live()

    def budget(self, row: str, limit: float) -> NodeBudget:
        from eqsat.extract.lazy import NodeBudget

        if row not in self.rows:
            raise EqsatError(f"no node reports a term of row {row!r}; rows here: {', '.join(self.rows) or 'none'}")
        return NodeBudget(tuple(self.rows[row].tolist()), limit)

    def choice_of(self, graph: Graph, model: CostModel) -> np.ndarray | None:
        """`graph` (e.g. one found on another e-graph, or written by hand) as a choice over this
        e-graph when every one of its terms is here; None otherwise (`model` serializes it)."""
        from eqsat.extract.selection import is_valid_choice

        own = TensorEGraph.from_graph(graph).serialize(model, fold_weights=False)
        ids = carry_selection(own, {str(n["eclass"]): nid for nid, n in own["nodes"].items()}, self.json)
        if ids is None:
            return None
        choice = self.choice({**self.defaults, **ids})
        return choice if is_valid_choice(self.data, choice) else None

    def choice(self, ids: Mapping[str, str]) -> np.ndarray:
        """A selection by ids (class id -> node id) as a choice in loader numbering."""
        choice = np.full(self.data.n_classes, -1, dtype=np.int64)
        for cid, nid in ids.items():
            choice[self.data.class_index[cid]] = self.data.node_index[nid]
        return choice

    def extract(self, extractor: str, time_limit: float, rows: Mapping[str, float] | None = None,
                starts: Sequence[np.ndarray] = (), seed: int = 0) -> tuple[Selection, Graph]:
        """The door to the extractors: the cheapest choice within `rows` (name -> limit), starting
        from `starts`, and its decoded graph."""
        from eqsat.extract.registry import ExtractRequest, extract

        budgets = tuple(self.budget(r, limit) for r, limit in (rows or {}).items())
        selection = extract(self.data, extractor, time_limit, request=ExtractRequest(budgets, tuple(starts), seed))
        return selection, self.decode(selection)


def fixed_op_keys(egraph_json: Mapping[str, Any]) -> frozenset[OpKey]:
    """The ops whose price cannot change which graph an extraction of this e-graph picks: every
    node of theirs is the only node of a class every extraction must contain (a root, or an input
    of every node of such a class), or has only weight-computed inputs (folded: free in every
    choice). Each such op is in all extractions alike (the original graph too), so its cost adds
    the same to every choice and cancels out of the comparison."""
    from eqsat.egraph import constant_classes

    nodes: Mapping[str, Any] = egraph_json["nodes"]
    members: dict[str, list[str]] = {}
    for nid, n in nodes.items():
        members.setdefault(n["eclass"], []).append(nid)
    must = set(egraph_json["root_eclasses"])
    stack = list(must)
    while stack:
        common: set[str] | None = None
        for nid in members.get(stack.pop(), ()):
            kids = {nodes[c]["eclass"] for c in nodes[nid]["children"]}
            common = kids if common is None else common & kids
        for cls in (common or set()) - must:
            must.add(cls)
            stack.append(cls)
    constant = constant_classes(nodes)
    shapes = {c: d["shape"] for c, d in egraph_json["class_data"].items()}
    fixed: set[OpKey] = set()
    varying: set[OpKey] = set()
    for n in nodes.values():
        key = op_key(n["op"], n["attrs"], [shapes[nodes[c]["eclass"]] for c in n["children"]])
        folded = bool(n["children"]) and all(nodes[c]["eclass"] in constant for c in n["children"])
        (fixed if folded or (n["eclass"] in must and len(members[n["eclass"]]) == 1) else varying).add(key)
    return frozenset(fixed - varying)


@dataclass(frozen=True)
class _Free:
    """Every op at 0: an e-graph's structure serialized without pricing (`fixed_op_keys`' input)."""

    name: str = "free"
    device: str = "none"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        return 0.0


def search(graph: Graph, rules: Sequence[Rule], limits: Limits, models: Mapping[str, CostModel | Objective],
           extractor: str = "ilp", time_limit: float = 60.0, *, fold_weights: bool = True, seed: int = 0,
           progress: bool = False, avoid_extra_work: bool = False, price_choices_only: bool = False,
           check: bool = True) -> SearchResult:
    """The one search of eqsat, JAX-free: saturate `graph` once, extract the cheapest equivalent
    under each of `models` (a cost model, or an `Objective`: a cost model with knapsack rows,
    starts and a context; the time limit shared between them), decode and check each result
    against `graph` with the numpy interpreter (the result says whether it agreed; callers decide
    what a disagreement means). `fold_weights` (TASO/Tensat's convention, on by default): ops
    computed from weights alone are precomputed once, so they cost nothing.

    `avoid_extra_work`: a model whose extraction computes more than `graph` (overlapping merges)
    is extracted again from an e-graph grown by the single-output rules alone, so the rewrites that
    pay without merging (a separable pool, a folded batchnorm) are not lost with the merges.

    `price_choices_only`: a cost model that times ops (`times_ops`: the measured model, XLA
    compiling and timing each op shape) prices only the ops the choice depends on (`eqsat.cost.ZeroPriced`):
    the same graphs are extracted, and a cold first call times far fewer ops.

    `check=False`: no numpy check (each result reads as agreeing): for a caller that runs every
    result against the float64 reference itself (`eqsat optimize`'s late layout phase, whose plans
    `judge_plans` checks through JAX), where the check would double the work (VGG: 70 s)."""
    with gc_paused():  # the e-graph JSON is hundreds of thousands of acyclic objects: see eqsat.gc_pause
        return _search(graph, rules, limits, models, extractor, time_limit, fold_weights, seed, progress, avoid_extra_work,
                       price_choices_only, check)


def _search(graph: Graph, rules: Sequence[Rule], limits: Limits, models: Mapping[str, CostModel | Objective],
            extractor: str, time_limit: float, fold_weights: bool, seed: int, progress: bool,
            avoid_extra_work: bool, price_choices_only: bool = False, check: bool = True) -> SearchResult:
    start = time.perf_counter()
    egraph = TensorEGraph.from_graph(graph, rule_ops(rules))
    report = saturate(egraph, rules, limits, progress=progress)
    saturate_s = time.perf_counter() - start
    single_rules = [r for r in rules if not r.is_multi]
    single: TensorEGraph | None = None  # grown by the single-output rules, on first need
    found: dict[str, Extraction] = {}
    checked: dict[Graph, tuple[bool, float]] = {graph.live(): (True, 0.0)}
    errors: list[str] = []
    sizes = (0, 0)
    serialized: list[Mapping[str, Any]] = []  # the full e-graph under the first model, for callers that save it
    spent = {"serialize": 0.0, "extract": 0.0}  # seconds, reported as saturation and extraction time
    model_s = 0.0  # the current model's serialization and extraction seconds
    structure: dict[int, Mapping[str, Any]] = {}  # per e-graph (by id): a serialization with every node

    def fixed_of(eg: TensorEGraph) -> frozenset[OpKey]:
        if id(eg) not in structure:
            structure[id(eg)] = eg.serialize(_Free(), fold_weights)
        return fixed_op_keys(structure[id(eg)])

    def extract_from(eg: TensorEGraph, objective: Objective, seconds: float) -> tuple[Graph, Selection, tuple[int, int]]:
        nonlocal model_s
        t0 = time.perf_counter()
        if price_choices_only and getattr(objective.model, "times_ops", False) and objective.context is None:
            objective = replace(objective, model=ZeroPriced(objective.model, free_keys=fixed_of(eg)))
        priced = Priced.of(eg, objective, fold_weights)
        if objective.context is None:
            structure.setdefault(id(eg), priced.json)
        t1 = time.perf_counter()
        starts = [c for c in (priced.choice_of(g, objective.model) for g in objective.starts) if c is not None]
        selection, graph_out = priced.extract(extractor, seconds, objective.rows, starts)
        spent["serialize"] += t1 - t0
        spent["extract"] += time.perf_counter() - t1
        model_s += time.perf_counter() - t0
        if eg is egraph and not serialized:
            serialized.append(priced.json)
        return graph_out, selection, (priced.enodes, priced.eclasses)

    per_model = max(time_limit - saturate_s, 0.05) / max(len(models), 1) if avoid_extra_work else time_limit
    for name, wanted in models.items():
        # a model that prices in context brings its own analysis (eqsat.xla_cost)
        objective = wanted if isinstance(wanted, Objective) else Objective(
            wanted, context=getattr(wanted, "context_analysis", None))
        model_s = 0.0
        try:
            extracted, selection, size = extract_from(egraph, objective, per_model)
            sizes = sizes if sizes[0] else size
            from_single = False
            if avoid_extra_work and does_extra_work(graph, extracted) and len(single_rules) < len(rules):
                if single is None:
                    single = TensorEGraph.from_graph(graph, rule_ops(single_rules))
                    left = max(limits.seconds - (time.perf_counter() - start), 0.05)
                    saturate(single, single_rules, replace(limits, seconds=left))
                extracted, selection, _ = extract_from(single, objective, per_model)
                from_single = True
        except EqsatError as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if extracted not in checked:  # one check per distinct graph (models often agree)
            checked[extracted] = numerics_match(graph, extracted, seed) if check else (True, 0.0)
        ok, diff = checked[extracted]
        found[name] = Extraction(extracted, str(selection.status), float(selection.dag_cost), ok, diff, from_single,
                                 selection.info.get("greedy_choice"), model_s)
    return SearchResult(graph, report, found, sizes[0], sizes[1], saturate_s + spent["serialize"], spent["extract"],
                        tuple(errors), serialized[0] if serialized else None)


def optimize_graph(graph: Graph, rules: Sequence[Rule], limits: Limits, cost_model: CostModel,
                   extractor: str = "ilp", time_limit: float = 60.0, seed: int = 0,
                   progress: bool = False, fold_weights: bool = True,
                   alternatives: Mapping[str, CostModel] | None = None, check: bool = True) -> OptimizationResult:
    """Saturate `graph` with `rules`, extract the cheapest equivalent under `cost_model`, check it
    (`search` with one model). A graph that disagrees with the input is never returned
    (NumericsError); if extraction finds nothing cheaper, the input is kept and the status says so.
    `alternatives`: other cost models to extract the same e-graph under (candidate plans to time;
    their results, checked or not, are in `OptimizationResult.alternatives`). `check=False`: as for
    `search`, the caller checks the result itself.
    """
    extra = {f"alt:{k}": v for k, v in (alternatives or {}).items()}
    found = search(graph, rules, limits, {"model": cost_model, **extra}, extractor, time_limit,
                   fold_weights=fold_weights, seed=seed, progress=progress, check=check)
    if "model" not in found.by_model:
        raise EqsatError(f"extraction failed: {'; '.join(found.errors)}")
    best = found.by_model["model"]
    optimized, status, ok, diff = best.graph, best.status, best.numerics_ok, best.max_abs_diff
    cost_before = graph_cost(graph, cost_model, fold_weights)
    cost_after = graph_cost(optimized, cost_model, fold_weights)
    if cost_after > cost_before:
        optimized, cost_after, status = graph, cost_before, f"{status}; kept the input (extraction was not cheaper)"
        ok, diff = True, 0.0
    if not ok:
        raise NumericsError(f"the optimized graph differs from the original on random inputs (max |diff| "
                            f"{diff:.3g}); a rule or the decoder is wrong")
    return OptimizationResult(graph, optimized, found.saturation, found.enodes, found.eclasses, found.saturate_s,
                              found.extract_s, cost_before, cost_after, status, extractor, ok, diff, best.dag_cost,
                              found.egraph_json, None if best.single_output else best.greedy_choice,
                              {k[4:]: v for k, v in found.by_model.items() if k.startswith("alt:")})

"""Deep models: plan one block and reuse the plan for every identical block.

A deep model is a chain of identical blocks (a transformer layer, a residual MLP layer) between a
prefix (embedding) and a suffix (head). Planning the whole chain in one e-graph grows the e-graph,
and the ILP, with the depth; planning one block and repeating its plan makes a 48-layer model plan
like a one-layer one. Everything still goes through the planner's one door
(`eqsat.parallel.planner.plan_graph`): once for a representative block, once for what is left
(prefix and suffix, when there is any); the copies are the block's plan on each copy's own weights.

Finding the blocks (`find_blocks`), on the graph alone (no names): a *cut* is a point in the
graph's (topological) node order where exactly one computed value crosses, i.e. everything after
it reads the computation before it only through that value (leaves and values computed from leaves
alone without a product, such as a broadcast mask, may be read anywhere). The cuts split the graph into segments;
each segment has a canonical hash (ops, attributes, shapes and wiring, with its own weights by
position and shared leaves by identity) and the longest run of a repeating sequence of hashes is
the chain of blocks. Before the chain, the program may hold one more copy that reads an input leaf
as its entry (a model whose first block reads `x` directly): it joins the chain when its form is
the block's.

The block is planned with its entry as an input leaf and its exit as an output, both replicated
(the planner's outputs are), so the copies chain: each copy reads the previous copy's replicated
output. The boundaries between blocks are therefore replicated values; a plan that keeps the
activations sharded from block to block is not found this way (Megatron-style blocks, whose
boundaries are replicated anyway, are). The composed plan is re-priced as a whole
(`plan_report`) and, where it is small enough to run in numpy, checked against the program as a
whole; above that only the block's and the rest's plans are checked (the copies are the same plan
on other weights, joined at replicated values of the same shapes).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eqsat import ops
from eqsat.ir import Graph, Node, Value
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import Mesh
from eqsat.parallel.planner import (DEFAULT_LIMITS, PlanError, PlanResult, RuleBook, bound_bytes, checkpoint_to_fit,
                                    graph_axes, plan_graph, plan_report)
from eqsat.pipeline import numerics_match
from eqsat.saturate import Limits

ENTRY = "block_in"  # the representative block's entry leaf, where the entry is a computed value
EXIT = "block_out"  # the rest graph's leaf standing for the last block's exit
MIN_COPIES = 2  # fewer identical blocks than this: plan the graph as it is
CHECK_FLOPS = 2e10  # whole-plan numpy check up to this many flops of the program (it runs twice, on two draws)
BUDGET_ATTEMPTS = 3  # block plans under a memory budget, each with a tighter block budget if the whole is over


@dataclass(frozen=True)
class Blocks:
    """Identical consecutive blocks of a graph: per copy its (non-leaf) nodes, entry and exit value,
    and its own leaves in canonical order (copy k's i-th leaf plays copy 0's i-th leaf's part)."""

    nodes: tuple[tuple[int, ...], ...]
    entries: tuple[Value, ...]
    exits: tuple[Value, ...]
    own_leaves: tuple[tuple[int, ...], ...]
    segments_per_block: int

    @property
    def copies(self) -> int:
        return len(self.nodes)


# --- finding the blocks ---------------------------------------------------------------------------

def _constant_nodes(graph: Graph) -> list[bool]:
    """Per node: a leaf, or computed from leaves alone without a product (a broadcast mask, a
    transposed weight): such values may be read anywhere without breaking a cut; a product of
    leaves (the first layer's matmul of the data) starts the computation the cuts follow."""
    out: list[bool] = []
    for n in graph.nodes:
        spec = ops.OPS[n.op]
        out.append(spec.is_leaf or (not spec.contraction and all(out[v.node] for v in n.inputs)))
    return out


def _cuts(graph: Graph, constant: Sequence[bool]) -> list[tuple[int, Value]]:
    """(node position, the one computed value crossing after it) for every cut of the graph."""
    n = len(graph.nodes)
    last: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if not constant[v.node]:
                last[v] = i
    for v in graph.outputs:
        last[v] = n
    ending: dict[int, list[Value]] = {}
    for v, i in last.items():
        ending.setdefault(i, []).append(v)
    active: set[Value] = set()
    cuts: list[tuple[int, Value]] = []
    for i, node in enumerate(graph.nodes):
        for v in ending.get(i, ()):
            active.discard(v)
        if constant[i]:
            continue
        active.update(Value(i, k) for k in range(len(node.shapes)) if last.get(Value(i, k), -1) > i)
        if len(active) == 1:
            cuts.append((i, next(iter(active))))
    return cuts


@dataclass(frozen=True)
class _Segment:
    nodes: tuple[int, ...]
    entry: Value | None
    exit: Value


def _segments(graph: Graph, constant: Sequence[bool]) -> list[_Segment]:
    out: list[_Segment] = []
    start = -1
    entry: Value | None = None
    for pos, value in _cuts(graph, constant):
        nodes = tuple(i for i in range(start + 1, pos + 1) if not constant[i])
        if nodes:
            out.append(_Segment(nodes, entry, value))
        start, entry = pos, value
    return out


def _reads(graph: Graph, nodes: Sequence[int], constant: Sequence[bool]) -> list[int]:
    """The leaves and constant nodes `nodes` read, transitively through constant nodes, in order of
    first read (depth first, inputs in order)."""
    seen: dict[int, None] = {}

    def visit(i: int) -> None:
        if i in seen:
            return
        seen[i] = None
        for v in graph.nodes[i].inputs:
            visit(v.node)

    for i in nodes:
        for v in graph.nodes[i].inputs:
            if constant[v.node]:
                visit(v.node)
    return list(seen)


def _signature(graph: Graph, nodes: Sequence[int], entry: Value | None, exit_: Value, constant: Sequence[bool],
               shared: set[int]) -> tuple[tuple[Any, ...], list[int]]:
    """A segment's (or block's) canonical form, and its own leaves in canonical order: the same
    form means the same computation on other weights."""
    own: list[int] = []
    local: dict[int, int] = {}
    memo: dict[int, Any] = {}

    def const_ref(i: int) -> Any:
        if i in memo:
            return memo[i]
        n = graph.nodes[i]
        if ops.OPS[n.op].is_leaf:
            if i in shared:
                r: Any = ("shared", i)
            else:
                own.append(i)
                r = ("own", len(own) - 1, n.op, n.shapes, graph.dtype(Value(i)))
        else:
            r = ("const", n.op, n.attrs, n.shapes, tuple((const_ref(v.node), v.index) for v in n.inputs))
        memo[i] = r
        return r

    def ref(v: Value) -> Any:
        if v == entry:
            return ("in",)
        if v.node in local:
            return ("n", local[v.node], v.index)
        return (const_ref(v.node), v.index)

    items: list[Any] = [("entry", graph.shape(entry) if entry is not None else None)]
    for i in nodes:
        n = graph.nodes[i]
        items.append((n.op, n.attrs, n.shapes, tuple(ref(v) for v in n.inputs)))
        local[i] = len(local)
    items.append(("exit", local.get(exit_.node), exit_.index))
    return tuple(items), own


def find_blocks(graph: Graph, min_copies: int = MIN_COPIES) -> Blocks | None:
    """The longest chain of identical consecutive blocks (see the module doc), or None."""
    constant = _constant_nodes(graph)
    segs = _segments(graph, constant)
    if not segs:
        return None
    readers: dict[int, set[int]] = {}
    for k, seg in enumerate(segs):
        for i in _reads(graph, seg.nodes, constant):
            readers.setdefault(i, set()).add(k)
    shared = {i for i, ks in readers.items() if len(ks) > 1}
    hashes = [_signature(graph, s.nodes, s.entry, s.exit, constant, shared)[0] for s in segs]
    best: tuple[int, int, int] | None = None  # (covered segments, -period, start)
    m = len(segs)
    for period in range(1, m // 2 + 1):
        for start in range(m - period * 2 + 1):
            if segs[start].entry is None:
                continue
            unit = hashes[start:start + period]
            r = 1
            while hashes[start + r * period:start + (r + 1) * period] == unit:
                r += 1
            if r >= 2 and (best is None or (r * period, -period) >= best[:2]):
                best = (r * period, -period, start)
    # the chain, then the copy before it that reads the input (`_first_copy`); with no repeat in
    # the segments, the last `period` segments as the chain's one copy, if the copy before matches
    tries = [best] if best is not None else [(p, -p, m - p) for p in range(1, m) if segs[m - p].entry is not None]
    for covered, neg_period, start in tries:
        period = -neg_period
        copies = covered // period
        blocks = [segs[start + k * period:start + (k + 1) * period] for k in range(copies)]
        node_sets = [tuple(i for s in b for i in s.nodes) for b in blocks]
        entries = [b[0].entry for b in blocks]
        exits = [b[-1].exit for b in blocks]
        first = _first_copy(graph, node_sets[0], entries[0], exits[0], constant)  # type: ignore[arg-type]
        if first is not None or copies >= min_copies:
            break
    else:
        return None
    if first is not None:
        node_sets.insert(0, first[0])
        entries.insert(0, first[1])
        exits.insert(0, entries[1])  # type: ignore[arg-type]
    if len(node_sets) < min_copies:
        return None
    groups = [set(_reads(graph, ns, constant)) for ns in node_sets]
    shared = {i for k, g in enumerate(groups) for i in g if any(i in h for j, h in enumerate(groups) if j != k)}
    own = tuple(tuple(_signature(graph, ns, e, x, constant, shared)[1]) for ns, e, x in zip(node_sets, entries, exits))
    inside = {i for ns in node_sets for i in ns}
    if any(v.node in inside and v != exits[-1] for v in graph.outputs):
        return None  # an output inside the chain: no copy may differ from the others
    return Blocks(tuple(node_sets), tuple(entries), tuple(exits), own, period)  # type: ignore[arg-type]


def _first_copy(graph: Graph, block: Sequence[int], entry: Value, exit_: Value,
                constant: Sequence[bool]) -> tuple[tuple[int, ...], Value] | None:
    """The copy before the chain when it reads the model's input directly: everything before the
    chain's first copy (with the values computed from one input leaf alone) is that copy on the
    input leaf as its entry. Returns its nodes and entry, or None."""
    first = min(block)
    before = [i for i in range(first) if not constant[i]]
    if not before:
        return None
    shape, dtype = graph.shape(entry), graph.dtype(entry)
    inputs = [i for i, n in graph.leaves("input") if n.shapes[0] == shape and graph.dtype(Value(i)) == dtype]
    for leaf in inputs:
        from_leaf = [False] * len(graph.nodes)
        for i, n in enumerate(graph.nodes):
            from_leaf[i] = i == leaf or any(from_leaf[v.node] for v in n.inputs)
        nodes = tuple(i for i in range(first) if from_leaf[i] and i != leaf)
        mine = {*nodes, leaf}
        if set(before) - mine or any(v.node in mine and v != entry for i in block for v in graph.nodes[i].inputs):
            continue
        groups = [set(_reads(graph, nodes, constant)), set(_reads(graph, block, constant))]
        shared = groups[0] & groups[1]
        if (_signature(graph, nodes, Value(leaf), entry, constant, shared)[0]
                == _signature(graph, block, entry, exit_, constant, shared)[0]):
            return nodes, Value(leaf)
    return None


# --- the block's and the rest's graphs -----------------------------------------------------------

def _leaf_name(graph: Graph, i: int) -> str:
    return str(graph.nodes[i].attr["name"])


def _fresh(graph: Graph, base: str) -> str:
    names = set(graph.leaf_shapes())
    name, k = base, 0
    while name in names:
        k += 1
        name = f"{base}{k}"
    return name


def _subgraph(graph: Graph, keep: Sequence[int], replaced: Mapping[Value, Node], outputs: Sequence[Value]) -> Graph:
    """The nodes `keep` (in order) and the constant / leaf nodes they read, with the values in
    `replaced` read from the given leaves instead; returning `outputs`."""
    index: dict[Node, int] = {}
    nodes: list[Node] = []
    where: dict[int, int] = {}
    subst: dict[Value, Value] = {}

    def add(node: Node) -> int:
        if node not in index:
            index[node] = len(nodes)
            nodes.append(node)
        return index[node]

    for v, leaf in replaced.items():
        subst[v] = Value(add(leaf))

    def value(v: Value) -> Value:
        if v in subst:
            return subst[v]
        return Value(copy(v.node), v.index)

    def copy(i: int) -> int:
        if i not in where:
            n = graph.nodes[i]
            where[i] = add(Node(n.op, n.attrs, tuple(value(v) for v in n.inputs), n.shapes))
        return where[i]

    for i in keep:
        copy(i)
    outs = tuple(value(v) for v in outputs)  # first: an output outside `keep` (a constant) adds its nodes
    return Graph(tuple(nodes), outs).live()


def _leaf_node(graph: Graph, v: Value, name: str) -> Node:
    return Node("input", (("dtype", graph.dtype(v)), ("name", name), ("shape", graph.shape(v))), (), (graph.shape(v),))


def block_graph(graph: Graph, blocks: Blocks) -> tuple[Graph, str]:
    """The first copy as a graph of its own (its entry an input leaf), and that leaf's name."""
    entry = blocks.entries[0]
    if ops.OPS[graph.nodes[entry.node].op].is_leaf:
        name = _leaf_name(graph, entry.node)
        return _subgraph(graph, blocks.nodes[0], {}, [blocks.exits[0]]), name
    name = _fresh(graph, ENTRY)
    return _subgraph(graph, blocks.nodes[0], {entry: _leaf_node(graph, entry, name)}, [blocks.exits[0]]), name


def rest_graph(graph: Graph, blocks: Blocks) -> tuple[Graph | None, str, tuple[int | None, ...]]:
    """What is not in a block (prefix and suffix) as one graph: it returns the first block's entry
    (when computed) and the graph's outputs, reading the last block's exit from a leaf. Also that
    leaf's name and, per graph output, its index among the rest's outputs (None: the last exit)."""
    inside = {i for ns in blocks.nodes for i in ns}
    constant = _constant_nodes(graph)
    keep = [i for i in range(len(graph.nodes)) if i not in inside and not constant[i]]
    name = _fresh(graph, EXIT)
    outs: list[Value] = []
    where: list[int | None] = []
    for v in graph.outputs:
        if v == blocks.exits[-1]:
            where.append(None)
        else:
            where.append(len(outs))
            outs.append(v)
    entry = blocks.entries[0]
    if not constant[entry.node]:
        outs.append(entry)
    if not outs:  # (an output made from leaves alone is returned even when nothing else is kept)
        return None, name, tuple(where)
    return _subgraph(graph, keep, {blocks.exits[-1]: _leaf_node(graph, blocks.exits[-1], name)}, outs), name, tuple(where)


def compose(graph: Graph, blocks: Blocks, block_plan: Graph, entry_name: str, rest_plan: Graph | None,
            exit_name: str, where: Sequence[int | None]) -> Graph:
    """The whole program's plan: the rest's plan around a copy of the block's plan per block, each
    copy on its own leaves (by canonical position), reading the previous copy's output."""
    nodes: list[Node] = []
    index: dict[Node, int] = {}

    def add(node: Node) -> int:
        if node not in index:
            index[node] = len(nodes)
            nodes.append(node)
        return index[node]

    leaf_at = {_leaf_name(graph, i): Value(add(n)) for i, n in graph.leaves()}

    def emit(plan: Graph, leaves: Mapping[str, Value], only: set[int] | None = None,
             done: dict[int, Value] | None = None) -> dict[int, Value]:
        """Copy `plan`'s nodes (those in `only`) with its leaves read from `leaves` (by name)."""
        at: dict[int, Value] = dict(done or {})
        for i, n in enumerate(plan.nodes):
            if i in at or (only is not None and i not in only):
                continue
            if ops.OPS[n.op].is_leaf:
                at[i] = leaves[str(n.attr["name"])]
                continue
            ins = tuple(Value(at[v.node].node, at[v.node].index + v.index) for v in n.inputs)
            at[i] = Value(add(Node(n.op, n.attrs, ins, n.shapes)))
        return at

    rest_at: dict[int, Value] = {}
    after: set[int] = set()
    if rest_plan is not None:
        late = {i for i, n in enumerate(rest_plan.nodes) if n.op in ("input", "weight") and n.attr["name"] == exit_name}
        for i, n in enumerate(rest_plan.nodes):
            if i in late or any(v.node in late for v in n.inputs):
                late.add(i)
        after = late
        rest_at = emit(rest_plan, leaf_at, set(range(len(rest_plan.nodes))) - late)
    entry = blocks.entries[0]
    if ops.OPS[graph.nodes[entry.node].op].is_leaf:
        current = leaf_at[_leaf_name(graph, entry.node)]
    else:
        assert rest_plan is not None
        current = _at(rest_at, rest_plan.outputs[-1])
    names0 = [_leaf_name(graph, i) for i in blocks.own_leaves[0]]
    for own in blocks.own_leaves:
        leaves = {**leaf_at, **{a: leaf_at[_leaf_name(graph, i)] for a, i in zip(names0, own)}, entry_name: current}
        at = emit(block_plan, leaves)
        current = _at(at, block_plan.outputs[0])
    if rest_plan is not None:
        rest_at = emit(rest_plan, {**leaf_at, exit_name: current}, after, rest_at)
    outputs = tuple(current if k is None else _at(rest_at, rest_plan.outputs[k])  # type: ignore[union-attr]
                    for k in where)
    return Graph(tuple(nodes), outputs).live()


def _at(at: Mapping[int, Value], v: Value) -> Value:
    base = at[v.node]
    return Value(base.node, base.index + v.index)


# --- planning ------------------------------------------------------------------------------------

def plan_repeated(graph: Graph, mesh: Mesh, strategy: str = "joint", limits: Limits = DEFAULT_LIMITS,
                  time_limit: float = 20.0, mem_budget: float | None = None, model: ParallelCostModel | None = None,
                  comm_budget: float | None = None, check: bool = True,
                  min_copies: int = MIN_COPIES, book: RuleBook | None = None, within: str | None = None,
                  open_outputs: bool = False) -> PlanResult:
    """`plan_graph(graph, ...)`, planning a chain of identical blocks once (`find_blocks`) and
    repeating the block's plan. Optimizer state is the cost model's (`ParallelCostModel.state_copies`),
    in the planner's memory row as everywhere else. `check=False`: no numpy check at all (a paper
    pricing of a model too big to run). `book`: the mesh's verified rules, made once (`RuleBook`).
    Without `min_copies` identical blocks this is `plan_graph` itself. `within`: each part is
    planned within that baseline's plan of it (`plan_graph`), and the whole within the baseline's
    parts composed (`PlanResult.baseline`), whose plan is the answer where the whole is over it.
    `open_outputs` (`plan_graph`'s) applies to the whole graph where it has no blocks, else to the
    rest: its outputs (the block's entry among them) may end split, so a split can start at the
    graph's inputs (a ViT's images through its patch cut) instead of at the first block."""
    from eqsat.cost import cost_model

    model = model or ParallelCostModel(mesh, cost_model("roofline", mesh.device))
    blocks = find_blocks(graph, min_copies)
    if blocks is None:
        return plan_graph(graph, mesh, strategy, limits, time_limit, mem_budget, model, comm_budget=comm_budget,
                          check=check, book=book, within=within, open_outputs=open_outputs)
    t0 = time.perf_counter()
    block, entry_name = block_graph(graph, blocks)
    rest, exit_name, where = rest_graph(graph, blocks)
    parts = blocks.copies + (1 if rest is not None else 0)
    block_comm = None if comm_budget is None else comm_budget / parts
    block_mem = None if mem_budget is None else mem_budget / parts
    plan: Graph | None = None
    for _ in range(BUDGET_ATTEMPTS):
        b = plan_graph(block, mesh, strategy, limits, time_limit, block_mem, model, comm_budget=block_comm, check=check,
                       book=book, within=within)
        r = (plan_graph(rest, mesh, strategy, limits, time_limit, block_mem, model, comm_budget=block_comm, check=check,
                        book=book, within=within, open_outputs=open_outputs)
             if rest is not None else None)
        plan = compose(graph, blocks, b.plan, entry_name, r.plan if r is not None else None, exit_name, where)
        graph_axes(plan)  # raises if the copies do not join into one SPMD program
        report = plan_report(plan, model)
        if mem_budget is not None and report.mem_bytes > mem_budget:  # the copies' checkpoints, against the whole
            report = checkpoint_to_fit(plan, model, report, mem_budget)
        peak = report.mem_bytes
        if mem_budget is None or block_mem is None or peak <= mem_budget * (1 + 1e-9):
            break
        block_mem *= 0.95 * mem_budget / peak  # the blocks' share of the budget, tightened by how far the whole is over
    else:
        raise PlanError(f"no plan within {mem_budget:.4g} bytes per device was found by planning one block "
                        f"(best: {peak:.4g} predicted)")
    if comm_budget is not None and report.comm_bytes(None) > comm_budget * (1 + 1e-9):
        raise PlanError(f"no plan moving at most {comm_budget:.4g} bytes per device in a step was found "
                        f"(best: {report.comm_bytes(None):.4g})")
    parts_res = [b] + ([r] if r is not None else [])
    baseline = _composed_baseline(graph, mesh, blocks, parts_res, entry_name, exit_name, where, model)
    answer = "search"
    if baseline is not None:
        slack, base = 1 + 1e-9, baseline.report
        if not (report.step_s <= base.step_s * slack and report.wire_bytes() <= bound_bytes(baseline) * slack
                and report.mem_bytes <= base.mem_bytes * slack):
            plan, report, answer = baseline.plan, base, "baseline"
    t1 = time.perf_counter()
    if check and graph.total_flops() <= CHECK_FLOPS:
        ok, diff = numerics_match(graph, plan)
        numerics = "whole plan checked"
    else:
        ok, diff = all(p.numerics_ok for p in parts_res), max(p.max_abs_diff for p in parts_res)
        numerics = ("the block's and the rest's plans checked; the copies are the block's plan on other weights"
                    if check else "not checked")
    info = {"check_s": time.perf_counter() - t1, "total_s": time.perf_counter() - t0, "numerics": numerics,
            "blocks": {"copies": blocks.copies, "segments_per_block": blocks.segments_per_block,
                       "block_nodes": len(blocks.nodes[0]), "planned_once": True,
                       "block_plan_nodes": len(b.plan.nodes), "rest_planned": r is not None,
                       "block_plan_hash": plan_hash(b.plan),
                       "block_search_s": b.search_s}}
    if baseline is not None:
        info["within"] = {"strategy": baseline.strategy, "answer": answer, "predicted_s": baseline.report.step_s,
                          "comm_bytes": baseline.report.comm_bytes(None), "bound_bytes": bound_bytes(baseline),
                          "mem_bytes": baseline.report.mem_bytes}
    return PlanResult(strategy, mesh, plan, report, ok, diff,
                      sum(p.search_s for p in parts_res), sum(p.saturate_s for p in parts_res),
                      sum(p.extract_s for p in parts_res), sum(p.enodes for p in parts_res),
                      sum(p.eclasses for p in parts_res), b.ilp_status if r is None else f"{b.ilp_status}/{r.ilp_status}",
                      b.ilp_gap, b.rules, b.stop_reason, info, baseline)


def _composed_baseline(graph: Graph, mesh: Mesh, blocks: Blocks, parts: Sequence[PlanResult], entry_name: str,
                       exit_name: str, where: Sequence[int | None], model: ParallelCostModel) -> PlanResult | None:
    """The parts' `within` baselines composed as the plan is (unchecked), or None without them."""
    bases = [p.baseline for p in parts]
    if not bases or any(b is None for b in bases):
        return None
    block, rest = bases[0], (bases[1] if len(bases) > 1 else None)
    assert block is not None
    plan = compose(graph, blocks, block.plan, entry_name, rest.plan if rest is not None else None, exit_name, where)
    search = sum(b.search_s for b in bases if b is not None)
    return PlanResult(block.strategy, mesh, plan, plan_report(plan, model), False, math.nan, search, search, 0.0,
                      sum(b.enodes for b in bases if b is not None), sum(b.eclasses for b in bases if b is not None),
                      block.ilp_status, block.ilp_gap, block.rules, block.stop_reason, {"numerics": "not checked"})


def plan_hash(plan: Graph) -> str:
    """A plan graph's identity (nodes, attributes, names): equal hashes, the same plan."""
    return hashlib.sha256(json.dumps(plan.to_json(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def depth_reuse_summary(result: PlanResult) -> str:
    """One line for a report: whether blocks were planned once and reused."""
    b = result.info.get("blocks")
    if not b:
        return "no repeated blocks: planned as a whole"
    return (f"{b['copies']} identical blocks ({b['block_nodes']} nodes each) planned once and reused"
            + ("; prefix/suffix planned beside" if b["rest_planned"] else ""))


__all__ = ["Blocks", "block_graph", "compose", "depth_reuse_summary", "find_blocks", "plan_hash", "plan_repeated",
           "rest_graph"]

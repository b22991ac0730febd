"""A TASO-style backtracking search over concrete graphs: the baseline `eqsat bench tensat` compares with.

TASO (Jia et al., SOSP'19) keeps a priority queue of graphs ordered by cost. It pops the cheapest,
applies every rule at every match, and enqueues each new graph whose cost is within `alpha` of the
best seen (alpha = 1.05 by default), until `budget` graphs have been popped. Here the rules are the
same parsed, verified `Rule`s the e-graph uses (no second rule language), matched directly on a
`Graph`; the cost is the same `CostModel`, summed as `eqsat.cost.graph_cost` does (ops computed from
weights alone are free, as in the e-graph). A right side that is ill-typed for the match, fails the
rule's side conditions, or would make a cycle (a two-output rule whose one root feeds the other's
variables) is not applied, exactly as the egglog applier refuses it.

Concats are n-ary in the IR and binary in rules (and in the e-graph), so the search starts from the
graph with its concats nested left to right, as the e-graph encodes them. As in TASO, the `alpha`
bound is relative to the best graph *popped* so far, starting from the graph searched (the nested
one), and is fixed for the children of one pop; the result is the cheapest graph seen, popped or
generated, or the original if none is cheaper (so it is never worse than the input). The bound must
start from the nested graph, not the original: nesting a k-way concat adds k - 2 kernels, and where
that costs more than alpha (NasNet-A under the roofline: 1.14x) a bound from the original rejected
every child of the first graph and the search stopped after one pop.

The budget counts popped graphs, as TASO's does; `seconds` is a safety cap only (`stop_reason`
"time" says it was hit). The search is incremental so that the budget is reached: a candidate is
costed from its parent's cost and the edit (the new nodes minus the nodes that died, summed exactly),
and is built as a graph, hashed and matched only when popped. A popped graph whose structural key
was popped before is dropped uncounted (TASO drops a candidate whose hash it has seen when it is
generated; the popped sequence of distinct graphs is the same, since a graph's copies share its cost
and the first copy is enqueued first). `TasoOptions(check=True)` rebuilds every popped graph with
`apply_match` and `graph_cost` and fails if the incremental one differs (for tests).
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eqsat import ops
from eqsat.cost import CostModel, graph_cost, weight_only_nodes
from eqsat.errors import EqsatError, ShapeError
from eqsat.ir import Graph, GraphBuilder, Node, Tensor, Value, _freeze
from eqsat.rewrites.rule import AttrVar, Pattern, Rule, Term, Var
from eqsat.rewrites.semantics import bind_attrs
from eqsat.rewrites.shapes import condition_holds

__all__ = ["Match", "TasoOptions", "TasoResult", "apply_match", "binary_concats", "find_matches", "graph_key",
           "seconds_to_cost", "taso_search"]

Shape = tuple[int, ...]

TASO_DEFAULT_BUDGET = 1000  # TASO's `optimize(graph, alpha=1.05, budget=1000)` default


@dataclass(frozen=True)
class TasoOptions:
    """TASO's knobs, plus a wall-clock safety cap (checked after every candidate graph) and a debug
    check of every popped graph against a full rebuild."""

    alpha: float = 1.05
    budget: int = TASO_DEFAULT_BUDGET
    seconds: float = 600.0
    check: bool = False


@dataclass(frozen=True)
class TasoResult:
    """The best graph found, how the search went, and its best cost over time."""

    best: Graph
    cost_original: float
    cost_best: float
    seconds: float
    seconds_to_best: float
    popped: int
    generated: int  # applicable rewrites costed (a graph reached twice counts twice)
    stop_reason: str  # "budget" | "time" | "exhausted"
    trace: tuple[tuple[float, float], ...]  # (seconds since start, best cost so far)
    rules_fired: Mapping[str, int] = field(default_factory=dict)  # along the path to the best graph
    graphs_per_s: float = 0.0  # popped graphs per second of the whole run
    # the cheapest graph of the space searched (concats nested), even where dearer than the input: its
    # concats written n-ary may beat the input (TASO's own concats are n-ary); None: nothing popped
    searched: Graph | None = None
    cost_searched: float = math.inf


@dataclass(frozen=True)
class Match:
    """A rule's left side(s) found in a graph: the root values and what each variable is bound to."""

    rule: Rule
    roots: tuple[Value, ...]
    env: tuple[tuple[str, Any], ...]  # tensor variable -> Value, attribute variable -> value


# --- matching ----------------------------------------------------------------------------------

def _match(p: Pattern, value: Value, graph: Graph, env: dict[str, Any]) -> bool:
    """Bind `p` against the subgraph at `value`, extending `env`; False (env then undefined) if not."""
    if isinstance(p, Var):
        bound = env.get(p.name)
        if bound is None:
            env[p.name] = value
            return True
        return bool(bound == value)
    node = graph.nodes[value.node]
    if node.op != p.op or value.index != 0 or len(node.inputs) != len(p.args):
        return False
    attrs = node.attr
    for name, want in p.attrs:
        if isinstance(want, AttrVar):
            if env.setdefault(want.name, attrs[name]) != attrs[name]:
                return False
        elif name not in attrs or attrs[name] != want:
            return False  # literal mismatch, or a computed reference (never on a left side)
    for guard, n in p.guards:
        if guard == "ndim" and len(node.shapes[0]) != n:
            return False
    return all(_match(a, v, graph, env) for a, v in zip(p.args, node.inputs))


def _shape_env(graph: Graph, env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: graph.shape(v) if isinstance(v, Value) else v for k, v in env.items()}


def _single_matches(p: Pattern, graph: Graph, by_op: Mapping[str, Sequence[int]]) -> Iterator[dict[str, Any]]:
    if isinstance(p, Var):
        return
    for i in by_op.get(p.op, ()):
        env: dict[str, Any] = {}
        if _match(p, Value(i, 0), graph, env):
            env["$root"] = Value(i, 0)
            yield env


def find_matches(rule: Rule, graph: Graph, by_op: Mapping[str, Sequence[int]] | None = None) -> Iterator[Match]:
    """Every match of `rule` in `graph` whose side conditions hold (two-output rules: every pair of
    distinct roots whose shared variables agree)."""
    if by_op is None:
        by_op = _by_op(graph)
    if any(isinstance(p, Term) and p.op == "split_part" for p in rule.lhs):
        return
    per_side = [list(_single_matches(p, graph, by_op)) for p in rule.lhs]
    for combo in itertools.product(*per_side):
        env: dict[str, Any] = {}
        ok = True
        for side in combo:
            for k, v in side.items():
                if k != "$root" and env.setdefault(k, v) != v:
                    ok = False
                    break
            if not ok:
                break
        roots = tuple(side["$root"] for side in combo)
        if not ok or len(set(roots)) != len(roots):
            continue
        shapes = _shape_env(graph, env)
        if all(condition_holds(c, shapes) for c in rule.conditions):
            yield Match(rule, roots, tuple(sorted(env.items())))


def _by_op(graph: Graph) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        index.setdefault(n.op, []).append(i)
    return index


# --- rewriting ---------------------------------------------------------------------------------

class _NotApplicable(Exception):
    """The right side is ill-typed here, or applying it would make a cycle."""


def apply_match(graph: Graph, match: Match) -> Graph | None:
    """`graph` with the match's roots replaced by the rule's right sides, or None where the right side
    cannot be built (ill-typed, or a cycle). Unused nodes are dropped; identical nodes shared."""
    env = dict(match.env)
    shapes = _shape_env(graph, env)
    sides = [graph.shape(r) for r in match.roots]

    def split_sizes(axis: int) -> tuple[int, int]:
        return sides[0][axis], sides[1][axis]

    b = GraphBuilder()
    built: dict[int, tuple[Tensor, ...]] = {}
    for i, n in graph.leaves():
        built[i] = b.apply(n.op, [], n.attr)
    replaced = {root: k for k, root in enumerate(match.roots)}
    rhs_built: dict[int, Tensor] = {}
    in_progress: set[Any] = set()

    def value(v: Value) -> Tensor:
        k = replaced.get(v)
        if k is not None:
            if k not in rhs_built:
                if ("rhs", k) in in_progress:
                    raise _NotApplicable("cycle")
                in_progress.add(("rhs", k))
                rhs_built[k] = instantiate(match.rule.rhs[k])
                in_progress.discard(("rhs", k))
            return rhs_built[k]
        if v.node not in built:
            if v.node in in_progress:
                raise _NotApplicable("cycle")
            in_progress.add(v.node)
            n = graph.nodes[v.node]
            built[v.node] = b.apply(n.op, [value(u) for u in n.inputs], n.attr)
            in_progress.discard(v.node)
        return built[v.node][v.index]

    def instantiate(p: Pattern) -> Tensor:
        if isinstance(p, Var):
            return value(env[p.name])
        args = [instantiate(a) for a in p.args]
        if p.op == "split_part":
            axis, index = p.attr["axis"], p.attr["index"]
            sizes = split_sizes(axis)
            start = 0 if index == 0 else sizes[0]
            if args[0].shape[axis] != sizes[0] + sizes[1]:
                raise _NotApplicable("split sizes")
            return b.slice(args[0], axis, start, start + sizes[index])
        bound = bind_attrs(p, shapes, split_sizes)
        out = b.apply(p.op, args, {k: v for k, v in bound.attrs})[0]
        if any(g == "ndim" and len(out.shape) != n for g, n in p.guards):
            raise _NotApplicable("rank guard")
        return out

    try:
        outputs = [value(v) for v in graph.outputs]
    except (_NotApplicable, ShapeError, EqsatError):
        return None
    for k, root in enumerate(match.roots):  # a rule never changes a value's shape
        if rhs_built.get(k) is not None and rhs_built[k].shape != graph.shape(root):
            return None
    return b.build(outputs).live()


def binary_concats(graph: Graph) -> Graph:
    """The same graph with every n-ary concat nested left to right (as the e-graph encodes it)."""
    b = GraphBuilder()
    built: list[tuple[Tensor, ...]] = []
    for n in graph.nodes:
        args = [built[v.node][v.index] for v in n.inputs]
        if n.op == "concat" and len(args) > 2:
            acc = args[0]
            for a in args[1:]:
                acc = b.concat(n.attr["axis"], acc, a)
            built.append((acc,))
        else:
            built.append(b.apply(n.op, args, n.attr))
    return b.build([built[v.node][v.index] for v in graph.outputs])


def graph_key(graph: Graph) -> tuple[int, ...]:
    """A structural hash of the live graph (equal for graphs that differ only in node order)."""
    h: list[int] = []
    for n in graph.nodes:
        if ops.OPS[n.op].is_leaf:
            h.append(hash((n.op, n.attr["name"])))
        else:
            h.append(hash((n.op, n.attrs, tuple((h[v.node], v.index) for v in n.inputs))))
    return tuple(hash((h[v.node], v.index)) for v in graph.outputs)


# --- incremental candidates ----------------------------------------------------------------------
# A candidate graph is its parent plus an edit: the right side's new nodes (typed once per op,
# attributes and input shapes), the replaced values, the readers whose inputs changed (merged into an
# identical node where one exists, as GraphBuilder's hash-consing does) and the nodes that died. Its
# cost is the parent's minus the dead nodes' plus the new ones', summed exactly; it becomes a graph
# (and gets its structural key) only when popped.

_SCALE = 1100  # costs are summed as integers in units of 2**-1100: every finite double is one, exactly


_INFINITE = 1 << (_SCALE + 1100)  # an op a cost model cannot price (inf or nan): never kept, as before


def _exact(c: float) -> int:
    """`c` as an exact multiple of 2**-_SCALE, so a graph's cost does not depend on how it was reached."""
    if not math.isfinite(c):
        return _INFINITE
    num, den = float(c).as_integer_ratio()
    return num << (_SCALE + 1 - den.bit_length())


def _inexact(total: int) -> float:
    try:
        return total / (1 << _SCALE)
    except OverflowError:
        return math.inf


_Typed = tuple[tuple[tuple[str, Any], ...], tuple[Shape, ...]]


class _Memo:
    """What one search learns once: node typings and op costs (pure functions of op, attributes and
    input shapes)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.typed: dict[tuple[Any, ...], _Typed | None] = {}
        self.costs: dict[tuple[Any, ...], int] = {}
        self.fits: dict[tuple[Any, ...], bool] = {}
        self.rhs_vars: dict[int, tuple[frozenset[str], ...]] = {}
        self.folding: dict[tuple[str, tuple[bool, ...]], bool] = {}

    def folds(self, op: str, inputs: tuple[bool, ...]) -> bool:
        """Whether a node of `op` whose inputs are (or are not) weight-only is (`ops.weight_derived`)."""
        got = self.folding.get((op, inputs))
        if got is None:
            kids = [(k, "weight" if d else "input", ()) for k, d in enumerate(inputs)]
            got = self.folding[(op, inputs)] = len(kids) in ops.weight_derived([*kids, (len(kids), op, range(len(kids)))])
        return got

    def fit(self, rule: Rule, shapes: Mapping[str, Any], sides: Sequence[Shape]) -> bool:
        """Whether `rule`'s side conditions hold and its right sides are well typed with the same shapes
        as its roots, for these variable shapes: what decides applicability short of cycles."""
        key = (id(rule), tuple(sorted(shapes.items())), tuple(sides))
        ok = self.fits.get(key)
        if ok is None:
            ok = self.fits[key] = (all(condition_holds(c, shapes) for c in rule.conditions)
                                   and _rhs_typed(self, rule, shapes, sides))
        return ok

    def vars_of(self, rule: Rule) -> tuple[frozenset[str], ...]:
        """The tensor variables each right side reads."""
        found = self.rhs_vars.get(id(rule))
        if found is None:
            found = self.rhs_vars[id(rule)] = tuple(frozenset(_pattern_vars(p)) for p in rule.rhs)
        return found

    def node(self, op: str, attrs: tuple[tuple[str, Any], ...], inputs: tuple[Value, ...],
             shapes: tuple[Shape, ...]) -> Node | None:
        """The node GraphBuilder.apply makes (normalized attributes, inferred shapes); None where it raises."""
        key = (op, attrs, shapes)
        if key not in self.typed:
            try:
                normal = ops.op_spec(op).normalize_attrs(dict(attrs))
                self.typed[key] = (_freeze(normal), ops.infer_shapes(op, list(shapes), normal))
            except (ShapeError, EqsatError):
                self.typed[key] = None
        typed = self.typed[key]
        return None if typed is None else Node(op, typed[0], inputs, typed[1])

    def charge(self, node: Node, input_shapes: tuple[Shape, ...], derived: bool) -> int:
        """What `graph_cost` charges for `node`: its op cost; 0 for a leaf or a weight-only node."""
        if derived or ops.OPS[node.op].is_leaf:
            return 0
        key = (node.op, node.attrs, input_shapes)
        c = self.costs.get(key)
        if c is None:
            c = self.costs[key] = _exact(self.cost_model.op_cost(node.op, node.attr, list(input_shapes)))
        return c


def _pattern_vars(p: Pattern) -> Iterator[str]:
    if isinstance(p, Var):
        yield p.name
    else:
        for a in p.args:
            yield from _pattern_vars(a)


def _rhs_typed(memo: _Memo, rule: Rule, shapes: Mapping[str, Any], sides: Sequence[Shape]) -> bool:
    """`apply_match`'s typing of the right sides, on shapes alone."""
    def split_sizes(axis: int) -> tuple[int, int]:
        return sides[0][axis], sides[1][axis]

    def shape_of(p: Pattern) -> Shape:
        if isinstance(p, Var):
            return tuple(shapes[p.name])
        args = tuple(shape_of(a) for a in p.args)
        if p.op == "split_part":
            axis, index = p.attr["axis"], p.attr["index"]
            sizes = split_sizes(axis)
            if args[0][axis] != sizes[0] + sizes[1]:
                raise _NotApplicable("split sizes")
            start = 0 if index == 0 else sizes[0]
            attrs: tuple[tuple[str, Any], ...] = (("axis", axis), ("start", start), ("stop", start + sizes[index]))
        else:
            attrs = bind_attrs(p, shapes, split_sizes).attrs
        typed = memo.node(p.op if p.op != "split_part" else "slice", attrs, (), args)
        if typed is None:
            raise _NotApplicable("ill-typed")
        if any(guard == "ndim" and len(typed.shapes[0]) != k for guard, k in p.guards):
            raise _NotApplicable("rank guard")
        return typed.shapes[0]

    try:
        return all(shape_of(p) == side for p, side in zip(rule.rhs, sides))
    except (_NotApplicable, ShapeError, EqsatError):
        return False


def _matches(memo: _Memo, rule: Rule, graph: Graph, by_op: Mapping[str, Sequence[int]]) -> Iterator[Match]:
    """`find_matches` (same matches, same order) less those whose right side is ill-typed there: typing
    and conditions depend on shapes alone, so each combination of shapes is decided once."""
    if any(isinstance(p, Term) and p.op == "split_part" for p in rule.lhs):
        return
    per_side = []
    for p in rule.lhs:
        side = []
        groups: dict[tuple[Any, ...], int] = {}
        for found in _single_matches(p, graph, by_op):
            root = found.pop("$root")
            typed = tuple(sorted((k, graph.shape(v) if isinstance(v, Value) else v) for k, v in found.items()))
            side.append((root, found, groups.setdefault((typed, graph.shape(root)), len(groups))))
        per_side.append((side, {g: key for key, g in groups.items()}))
    fits: dict[tuple[int, ...], bool] = {}  # per combination of shape groups

    def fit(gids: tuple[int, ...]) -> bool:
        ok = fits.get(gids)
        if ok is None:
            shapes: dict[str, Any] = {}
            ok = True
            for (_, keys), g in zip(per_side, gids):
                for k, v in keys[g][0]:
                    if shapes.setdefault(k, v) != v:
                        ok = False
            ok = fits[gids] = ok and memo.fit(rule, shapes, [keys[g][1] for (_, keys), g in zip(per_side, gids)])
        return ok

    if len(per_side) == 2:  # the common case, without a tuple per pair
        (first, _), (second, groups1) = per_side
        for root0, env0, g0 in first:
            row = [fit((g0, g1)) for g1 in range(len(groups1))]
            for root1, env1, g1 in second:
                if row[g1] and root0 != root1 and all(env1.get(k, v) == v for k, v in env0.items()):
                    yield Match(rule, (root0, root1), tuple(sorted({**env0, **env1}.items())))
        return
    for combo in itertools.product(*(side for side, _ in per_side)):
        ok = fit(tuple(g for _, _, g in combo))
        if not ok:
            continue
        env: dict[str, Any] = {}
        for _, side_env, _ in combo:
            for k, v in side_env.items():
                if env.setdefault(k, v) != v:
                    ok = False
        roots = tuple(root for root, _, _ in combo)
        if ok and len(set(roots)) == len(roots):
            yield Match(rule, roots, tuple(sorted(env.items())))


@dataclass(frozen=True, eq=False)
class _State:
    """A popped graph with what evaluating its candidates reads (built once per pop, linear)."""

    graph: Graph
    total: int  # exact cost, as graph_cost sums it
    key: tuple[int, ...]  # graph_key(graph)
    parent: _State | None
    rule: str
    table: Mapping[Node, int]
    refs: tuple[int, ...]  # readers of each node, outputs counted
    derived: tuple[bool, ...]  # weight-only (free)
    charge: tuple[int, ...]
    cone: tuple[int, ...]  # bit j set: node j is this node or feeds it
    hashes: tuple[int, ...]  # structural hash of each node, as graph_key computes it


def _state(memo: _Memo, graph: Graph, parent: _State | None = None, rule: str = "") -> _State:
    nodes = graph.nodes
    refs = [0] * len(nodes)
    folded = weight_only_nodes(graph)
    derived: list[bool] = []
    charge: list[int] = []
    cone: list[int] = []
    h: list[int] = []
    for i, n in enumerate(nodes):
        spec = ops.OPS[n.op]
        bits = 1 << i
        for v in n.inputs:
            refs[v.node] += 1
            bits |= cone[v.node]
        d = i in folded
        derived.append(d)
        charge.append(memo.charge(n, tuple(nodes[v.node].shapes[v.index] for v in n.inputs), d))
        cone.append(bits)
        if spec.is_leaf:
            h.append(hash((n.op, n.attr["name"])))
        else:
            h.append(hash((n.op, n.attrs, tuple((h[v.node], v.index) for v in n.inputs))))
    for v in graph.outputs:
        refs[v.node] += 1
    key = tuple(hash((h[v.node], v.index)) for v in graph.outputs)  # as graph_key
    return _State(graph, sum(charge), key, parent, rule, {n: i for i, n in enumerate(nodes)}, tuple(refs),
                  tuple(derived), tuple(charge), tuple(cone), tuple(h))


def _child_key(state: _State, edit: _Edit) -> tuple[int, ...]:
    """graph_key of the child, rehashing only the nodes the edit changed and what reads them."""
    if edit.whole is not None:
        return graph_key(edit.whole)
    nodes, users, h = state.graph.nodes, state.graph.users, state.hashes
    n = len(nodes)
    new, modified, replaced = edit.new, edit.modified, edit.replaced
    affected = set(modified)
    frontier = list(modified)
    while frontier:
        for w in users.get(frontier.pop(), ()):
            if w not in affected:
                affected.add(w)
                frontier.append(w)
    rehashed: dict[int, int] = {}

    def node_hash(i: int) -> int:
        if i < n and i not in affected:
            return h[i]
        got = rehashed.get(i)
        if got is None:
            node = new[i - n] if i >= n else modified.get(i) or nodes[i]
            ins = [replaced.get(v, v) for v in node.inputs]
            got = rehashed[i] = hash((node.op, node.attrs, tuple((node_hash(v.node), v.index) for v in ins)))
        return got

    return tuple(hash((node_hash(v.node), v.index)) for v in edit.outputs)


@dataclass(frozen=True)
class _Edit:
    """A child as a change to its parent: new nodes (ids from len(parent.nodes) on), replaced values,
    readers with new inputs and the outputs; or, for a rewrite that is not local, the child itself."""

    new: tuple[Node, ...] = ()
    replaced: Mapping[Value, Value] = field(default_factory=dict)
    modified: Mapping[int, Node] = field(default_factory=dict)
    outputs: tuple[Value, ...] = ()
    whole: Graph | None = None


class _NotLocal(Exception):
    """The rewrite reaches past its match (a right side reads another root's cone, a root's output
    other than the first, ...): build the child in full."""


def _materialize(parent: Graph, edit: _Edit) -> Graph:
    """The child, in the node order `apply_match` gives it (leaves, then the outputs depth first)."""
    if edit.whole is not None:
        return edit.whole
    base = parent.nodes
    n = len(base)
    new, modified, replaced = edit.new, edit.modified, edit.replaced
    index: dict[int, int] = {}
    out: list[Node] = []
    for i, node in enumerate(base):
        if ops.OPS[node.op].is_leaf:
            index[i] = len(out)
            out.append(node)
    for root in edit.outputs:
        stack = [root.node]
        while stack:
            i = stack[-1]
            if i in index:
                stack.pop()
                continue
            node = new[i - n] if i >= n else modified.get(i) or base[i]
            ins = [replaced.get(v, v) for v in node.inputs]
            pending = [v.node for v in ins if v.node not in index]
            if pending:
                stack.extend(reversed(pending))
                continue
            stack.pop()
            index[i] = len(out)
            out.append(Node(node.op, node.attrs, tuple(Value(index[v.node], v.index) for v in ins), node.shapes))
    return Graph(tuple(out), tuple(Value(index[v.node], v.index) for v in edit.outputs))


def _total(memo: _Memo, graph: Graph) -> int:
    folded = weight_only_nodes(graph)
    return sum(memo.charge(n, tuple(graph.shape(v) for v in n.inputs), i in folded) for i, n in enumerate(graph.nodes))


def _evaluate(memo: _Memo, state: _State, match: Match) -> tuple[int, _Edit] | None:
    """The child's exact cost and how to build it; None where `apply_match` gives no graph or the
    parent itself."""
    try:
        return _local(memo, state, match)
    except _NotApplicable:
        return None
    except _NotLocal:
        child = apply_match(state.graph, match)
        return None if child is None else (_total(memo, child), _Edit(whole=child))


def _local(memo: _Memo, state: _State, match: Match) -> tuple[int, _Edit] | None:
    g = state.graph
    nodes = g.nodes
    n = len(nodes)
    env = dict(match.env)
    roots = match.roots
    root_ids = {r.node for r in roots}
    if any(len(nodes[r].shapes) != 1 for r in root_ids):
        raise _NotLocal
    order = list(range(len(roots)))
    if len(roots) > 1:
        # which roots each right side reads (through its variables' cones): a cycle among them is
        # `apply_match`'s refusal; without one, the right sides are built readers-last
        reads = [{j for j, r in enumerate(roots) for name in names
                  if isinstance(env[name], Value) and state.cone[env[name].node] >> r.node & 1}
                 for names in memo.vars_of(match.rule)]
        if any(reads):
            shared = frozenset.intersection(*memo.vars_of(match.rule))
            mask = sum(1 << r for r in root_ids)
            if any(isinstance(env[name], Value) and state.cone[env[name].node] & mask for name in shared):
                return None  # every right side reads a root's cone through one variable: a cycle
            if len(roots) != 2 or any(k in reads[k] for k in order) or (1 in reads[0] and 0 in reads[1]):
                raise _NotLocal
            order = [1, 0] if reads[0] else [0, 1]
    shapes_env = {k: nodes[v.node].shapes[v.index] if isinstance(v, Value) else v for k, v in env.items()}
    sides = [nodes[r.node].shapes[0] for r in roots]
    new: list[Node] = []
    new_derived: list[bool] = []
    local: dict[Node, int] = {}

    def shape(v: Value) -> Shape:
        return nodes[v.node].shapes[v.index] if v.node < n else new[v.node - n].shapes[v.index]

    def split_sizes(axis: int) -> tuple[int, int]:
        return sides[0][axis], sides[1][axis]

    def make(op: str, attrs: tuple[tuple[str, Any], ...], args: list[Value]) -> Value:
        node = memo.node(op, attrs, tuple(args), tuple(shape(a) for a in args))
        if node is None:
            raise _NotApplicable("ill-typed")
        hit = local.get(node)
        if hit is None:
            hit = state.table.get(node)
            if hit in root_ids:
                raise _NotLocal
        if hit is None:
            hit = n + len(new)
            new.append(node)
            local[node] = hit
            new_derived.append(memo.folds(op, tuple(state.derived[a.node] if a.node < n else new_derived[a.node - n]
                                                    for a in args)))
        return Value(hit, 0)

    tops: list[Value | None] = [None] * len(roots)

    def instantiate(p: Pattern) -> Value:
        if isinstance(p, Var):
            v = env[p.name]
            if v in roots:  # the other root, built first
                top = tops[roots.index(v)]
                if top is None:
                    raise _NotLocal
                return top
            return v  # keeps its id; its inputs may be rewritten below
        args = [instantiate(a) for a in p.args]
        if p.op == "split_part":
            axis, index = p.attr["axis"], p.attr["index"]
            sizes = split_sizes(axis)
            start = 0 if index == 0 else sizes[0]
            if shape(args[0])[axis] != sizes[0] + sizes[1]:
                raise _NotApplicable("split sizes")
            return make("slice", (("axis", axis), ("start", start), ("stop", start + sizes[index])), args)
        try:
            bound = bind_attrs(p, shapes_env, split_sizes)
        except (ShapeError, EqsatError) as e:
            raise _NotApplicable(str(e)) from None
        out = make(p.op, bound.attrs, args)
        if any(guard == "ndim" and len(shape(out)) != k for guard, k in p.guards):
            raise _NotApplicable("rank guard")
        return out

    for k in order:
        tops[k] = instantiate(match.rule.rhs[k])
    built = [t for t in tops if t is not None]
    if any(shape(t) != side for t, side in zip(built, sides)):
        return None  # a rule never changes a value's shape
    unchanged = sum(t == r for t, r in zip(built, roots))
    if unchanged == len(roots):
        return None  # the parent itself
    if unchanged:
        raise _NotLocal

    def derived(v: Value) -> bool:
        return state.derived[v.node] if v.node < n else new_derived[v.node - n]

    if any(derived(t) != state.derived[r.node] for t, r in zip(built, roots)):
        raise _NotLocal  # weight folding changes downstream

    # readers of replaced values get the new inputs, or merge into an identical node (in node order)
    users = g.users
    replaced: dict[Value, Value] = dict(zip(roots, built))
    modified: dict[int, Node] = {}
    queue = sorted({u for r in root_ids for u in users.get(r, ())})
    queued = set(queue)
    while queue:
        u = heapq.heappop(queue)
        node = nodes[u]
        changed = Node(node.op, node.attrs, tuple(replaced.get(v, v) for v in node.inputs), node.shapes)
        hit = local.get(changed)
        if hit is None:
            hit = state.table.get(changed)
            if hit in root_ids:
                raise _NotLocal
        if hit is None:
            modified[u] = changed
            local[changed] = u
            continue
        for k in range(len(node.shapes)):
            replaced[Value(u, k)] = Value(hit, k)
        for w in users.get(u, ()):
            if w not in queued:
                queued.add(w)
                heapq.heappush(queue, w)
    if any(t in replaced and t not in roots for t in built) or any(v in replaced for node in new for v in node.inputs):
        raise _NotLocal  # a right side reads a node that merged into another
    outputs = tuple(replaced.get(v, v) for v in g.outputs)

    # reference counts, then the nodes nothing reads any more
    delta: dict[int, int] = {}

    def add(i: int, d: int) -> None:
        delta[i] = delta.get(i, 0) + d

    for node in new:
        for v in node.inputs:
            add(v.node, 1)
    for u, node in modified.items():
        for v in nodes[u].inputs:
            add(v.node, -1)
        for v in node.inputs:
            add(v.node, 1)
    gone = {v.node for v in replaced}
    for x in gone:
        for v in nodes[x].inputs:
            add(v.node, -1)
    for old, out in zip(g.outputs, outputs):
        add(old.node, -1)
        add(out.node, 1)

    def refs(i: int) -> int:
        return (state.refs[i] if i < n else 0) + delta.get(i, 0)

    dead = set(gone)
    stack = [i for i in delta if i not in dead and refs(i) == 0]
    while stack:
        i = stack.pop()
        if i in dead or refs(i) != 0 or (i < n and ops.OPS[nodes[i].op].is_leaf):
            continue
        dead.add(i)
        node = new[i - n] if i >= n else modified.get(i) or nodes[i]
        for v in node.inputs:
            add(v.node, -1)
            if refs(v.node) == 0:
                stack.append(v.node)
    total = state.total - sum(state.charge[i] for i in dead if i < n)
    for j, node in enumerate(new):
        if n + j not in dead:
            total += memo.charge(node, tuple(shape(v) for v in node.inputs), new_derived[j])
    return total, _Edit(tuple(new), replaced, modified, outputs)


# --- the search --------------------------------------------------------------------------------

def seconds_to_cost(result: TasoResult, cost: float) -> float | None:
    """When the search's best first reached `cost` or below (from its trace); None if it never did."""
    return next((t for t, c in result.trace if c <= cost * (1 + 1e-9)), None)


def taso_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel, options: TasoOptions = TasoOptions(),
                on_pop: Callable[[int, float], None] | None = None) -> TasoResult:
    """TASO's backtracking search from `graph` (see the module doc); `on_pop(popped, best_cost)` is
    called after each popped graph (for progress bars)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    start = time.perf_counter()
    memo = _Memo(cost_model)
    cost_original = graph_cost(graph, cost_model)
    seed = _state(memo, binary_concats(graph))
    best_cost = cost_original  # the answer's: cheapest graph seen, popped or generated
    bound = _inexact(seed.total)  # TASO's bestCost: cheapest graph popped, from the graph searched
    best: tuple[_State, _Edit | None, Match | None] | None = None  # None: the input graph
    searched: tuple[_State, _Edit | None, Match | None] | None = None
    searched_cost = math.inf
    counter = itertools.count()
    Entry = tuple[float, int, _State, _Edit | None, Match | None, int]
    queue: list[Entry] = [(_inexact(seed.total), next(counter), seed, None, None, seed.total)]
    seen: set[tuple[int, ...]] = set()
    trace = [(0.0, best_cost)]
    popped = generated = 0
    seconds_to_best = 0.0
    stop = "exhausted"
    while queue:
        if popped >= options.budget:
            stop = "budget"
            break
        if time.perf_counter() - start > options.seconds:
            stop = "time"
            break
        cost, _, parent, edit, how, expected = heapq.heappop(queue)
        if edit is None or how is None:
            state = parent
        else:
            key = _child_key(parent, edit)
            if key in seen:
                continue  # reached before by another path (TASO drops a graph whose hash it has seen)
            state = _state(memo, _materialize(parent.graph, edit), parent, how.rule.name)
            if options.check:
                _check(state, parent, how, expected, key, cost_model)
        seen.add(state.key)
        popped += 1
        bound = min(bound, cost)
        if cost < searched_cost:  # only the nested input graph (children update it when generated)
            searched, searched_cost = (state, None, None), cost
        if cost < best_cost:  # only the nested input graph, when nesting is cheaper
            best, best_cost = (state, None, None), cost
            seconds_to_best = time.perf_counter() - start
            trace.append((seconds_to_best, best_cost))
        threshold = options.alpha * bound  # fixed for this pop's children, as TASO's `bestCost * alpha`
        by_op = _by_op(state.graph)
        timed_out = False
        for rule in rules:
            for match in _matches(memo, rule, state.graph, by_op):
                if time.perf_counter() - start > options.seconds:
                    timed_out = True
                    break
                found = _evaluate(memo, state, match)
                if found is None:
                    continue
                total, change = found
                generated += 1
                new_cost = _inexact(total)
                if new_cost < searched_cost:
                    searched, searched_cost = (state, change, match), new_cost
                if new_cost < best_cost:
                    best, best_cost = (state, change, match), new_cost
                    seconds_to_best = time.perf_counter() - start
                    trace.append((seconds_to_best, best_cost))
                if new_cost < threshold:
                    heapq.heappush(queue, (new_cost, next(counter), state, change, match, total))
            if timed_out:
                break
        if on_pop is not None:
            on_pop(popped, best_cost)
        if timed_out:
            stop = "time"
            break
    elapsed = time.perf_counter() - start
    trace.append((elapsed, best_cost))
    fired: dict[str, int] = {}
    if best is None:
        best_graph = graph
    else:
        at, last, how = best
        best_graph = at.graph if last is None else _materialize(at.graph, last)
        if how is not None:
            fired[how.rule.name] = 1
        node: _State | None = at
        while node is not None:
            if node.rule:
                fired[node.rule] = fired.get(node.rule, 0) + 1
            node = node.parent
    searched_graph = None if searched is None else (searched[0].graph if searched[1] is None
                                                    else _materialize(searched[0].graph, searched[1]))
    return TasoResult(best_graph, cost_original, best_cost, elapsed, seconds_to_best, popped, generated, stop,
                      tuple(trace), fired, popped / elapsed if elapsed > 0 else float("inf"), searched_graph,
                      searched_cost)


def _check(state: _State, parent: _State, match: Match, expected: int, key: tuple[int, ...],
           cost_model: CostModel) -> None:
    """Debug mode: the incremental child is the one `apply_match` builds, with the cost `graph_cost` gives."""
    reference = apply_match(parent.graph, match)
    if reference != state.graph:
        raise AssertionError(f"incremental rewrite by {match.rule.name} differs from apply_match")
    if state.key != key:
        raise AssertionError(f"incremental key differs from graph_key after {match.rule.name}")
    if state.total != expected:
        raise AssertionError(f"incremental cost {expected} != recomputed {state.total} after {match.rule.name}")
    full = graph_cost(reference, cost_model)
    if abs(full - _inexact(expected)) > 1e-9 * max(abs(full), 1e-30):
        raise AssertionError(f"incremental cost {_inexact(expected)} != graph_cost {full} after {match.rule.name}")

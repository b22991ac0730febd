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
graph with its concats nested left to right, as the e-graph encodes them; the original graph is
the first "best" so that the result is never worse than the input.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eqsat import ops
from eqsat.cost import CostModel, graph_cost
from eqsat.errors import EqsatError, ShapeError
from eqsat.ir import Graph, GraphBuilder, Tensor, Value
from eqsat.rewrites.rule import AttrVar, Pattern, Rule, Term, Var
from eqsat.rewrites.semantics import bind_attrs
from eqsat.rewrites.shapes import condition_holds

__all__ = ["Match", "TasoOptions", "TasoResult", "apply_match", "binary_concats", "find_matches", "taso_search"]

TASO_DEFAULT_BUDGET = 1000  # TASO's `optimize(graph, alpha=1.05, budget=1000)` default


@dataclass(frozen=True)
class TasoOptions:
    """TASO's knobs, plus a wall-clock limit (checked after every candidate graph)."""

    alpha: float = 1.05
    budget: int = TASO_DEFAULT_BUDGET
    seconds: float = 60.0


@dataclass(frozen=True)
class TasoResult:
    """The best graph found, how the search went, and its best cost over time."""

    best: Graph
    cost_original: float
    cost_best: float
    seconds: float
    seconds_to_best: float
    popped: int
    generated: int
    stop_reason: str  # "budget" | "time" | "exhausted"
    trace: tuple[tuple[float, float], ...]  # (seconds since start, best cost so far)
    rules_fired: Mapping[str, int] = field(default_factory=dict)  # along the path to the best graph


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


# --- the search --------------------------------------------------------------------------------

def taso_search(graph: Graph, rules: Sequence[Rule], cost_model: CostModel, options: TasoOptions = TasoOptions(),
                on_pop: Callable[[int, float], None] | None = None) -> TasoResult:
    """TASO's backtracking search from `graph` (see the module doc); `on_pop(popped, best_cost)` is
    called after each popped graph (for progress bars)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    start = time.perf_counter()
    cost_original = graph_cost(graph, cost_model)
    best, best_cost, best_key = graph, cost_original, graph_key(graph)
    seed = binary_concats(graph)
    seed_key = graph_key(seed)
    parent: dict[tuple[int, ...], tuple[tuple[int, ...] | None, str]] = {seed_key: (None, "")}
    counter = itertools.count()
    queue: list[tuple[float, int, Graph, tuple[int, ...]]] = [(graph_cost(seed, cost_model), next(counter), seed, seed_key)]
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
        cost, _, g, key = heapq.heappop(queue)
        popped += 1
        if cost < best_cost:
            best, best_cost, best_key = g, cost, key
        by_op = _by_op(g)
        timed_out = False
        for rule in rules:
            for match in find_matches(rule, g, by_op):
                if time.perf_counter() - start > options.seconds:
                    timed_out = True
                    break
                new = apply_match(g, match)
                if new is None:
                    continue
                new_key = graph_key(new)
                if new_key in parent:
                    continue
                parent[new_key] = (key, rule.name)
                generated += 1
                new_cost = graph_cost(new, cost_model)
                if new_cost < best_cost:
                    best, best_cost, best_key = new, new_cost, new_key
                    seconds_to_best = time.perf_counter() - start
                    trace.append((seconds_to_best, best_cost))
                if new_cost < options.alpha * best_cost:
                    heapq.heappush(queue, (new_cost, next(counter), new, new_key))
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
    k: tuple[int, ...] | None = best_key
    while k is not None and k in parent:
        k, name = parent[k]
        if name:
            fired[name] = fired.get(name, 0) + 1
    return TasoResult(best, cost_original, best_cost, elapsed, seconds_to_best, popped, generated, stop,
                      tuple(trace), fired)

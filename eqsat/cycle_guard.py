"""The cycle guard's scan: which class pairs recorded by two-output rules are related (one class
descends from the other, so merging them would make a cycle).

It needs the tensor class graph, the class of each `uid` and the recorded pairs. Those are read
from egglog's tables (`EGraph.freeze`: a few ms on BERT's 12k-node e-graph) rather than from the
serialized e-graph (serialize, JSON, congruence closure: ~0.3 s there, run before every two-output
and merge round). The tables are raw rows, not canonicalized; serialize canonicalizes every id.
They agree when every id in the tables is canonical, which `class_graph_of_tables` checks in the
way egglog 14's stale ids show (see `eqsat.egraph.congruence_closed`): a child or `uid` key that no
constructor row outputs, or a constructor output without a `shape` row (or the reverse). Where the
check fails, the caller falls back to the serialized e-graph.

Two ways to find the related pairs (`CYCLE_FILTERS`, `Limits.cycle_filter`), after Tensat's
"efficient" and "vanilla" cycle filtering (Yang et al., MLSys 2021, its efficient-vs-vanilla
experiment; Tensat's `--filter_before` flag selects vanilla): "efficient" (`related_pairs`) reads
every pair's answer off one pass over the class graph, as Tensat's pre-filter reads one descendants
map per iteration; "vanilla" (`related_pairs_each`) searches the class graph afresh for each pair,
as Tensat's vanilla filter walks the e-graph before each two-output application. Both find the same
pairs; only the cost differs. "off" marks none (Tensat without `--no_cycle`: the merges may make
cycles, which the extractors then avoid).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from eqsat.egglog_schema import PAIR_FUNCTION, TERM_SORT
from eqsat.extract.graphs import strongly_connected

__all__ = ["CYCLE_FILTERS", "ClassGraph", "RelatedPairs", "class_graph_of_serialized", "class_graph_of_tables",
           "related_pairs", "related_pairs_each"]

CYCLE_FILTERS: tuple[str, ...] = ("efficient", "vanilla", "off")


@dataclass(frozen=True)
class ClassGraph:
    """Tensor classes 0..n-1 with their child classes, the class of each uid, and the recorded
    pairs as (uid, uid, value): 1 where marked related in an earlier round, else 0."""

    children: Sequence[Sequence[int]]
    uid_class: Mapping[int, int]
    pairs: Sequence[tuple[int, int, int]]


class RelatedPairs(NamedTuple):
    """What the cycle guard found: pairs recorded, those marked related before, those found related now."""

    recorded: int
    marked: set[tuple[int, int]]
    found: set[tuple[int, int]]


def class_graph_of_tables(egraph: Any) -> ClassGraph | None:
    """The class graph from egglog's tables (`bindings.EGraph.freeze`), or None where some id in
    them may not be canonical (see the module docstring)."""
    functions = egraph.freeze().functions
    index: dict[Any, int] = {}
    rows: list[tuple[int, list[Any]]] = []
    for fn in functions.values():
        if fn.output_sort != TERM_SORT or fn.is_let_binding:
            continue
        at = [i for i, sort in enumerate(fn.input_sorts) if sort == TERM_SORT]
        for row in fn.rows:
            inputs = row.inputs
            rows.append((index.setdefault(row.output, len(index)), [inputs[i] for i in at]))
    shaped = [row.inputs[0] for row in functions["shape"].rows]
    if len(shaped) != len(index) or any(v not in index for v in shaped):
        return None
    children: list[set[int]] = [set() for _ in index]
    for here, kids in rows:
        found = children[here]
        for kid in kids:
            k = index.get(kid)
            if k is None:
                return None
            found.add(k)
    to_int = egraph.value_to_i64
    uid_class: dict[int, int] = {}
    for row in functions["uid"].rows:
        c = index.get(row.inputs[0])
        if c is None:
            return None
        uid_class[to_int(row.output)] = c
    pairs = [(to_int(row.inputs[0]), to_int(row.inputs[1]), to_int(row.output)) for row in functions[PAIR_FUNCTION].rows]
    return ClassGraph([sorted(kids) for kids in children], uid_class, pairs)


def class_graph_of_serialized(raw: Mapping[str, Any]) -> ClassGraph:
    """The class graph from egglog's serialize output (congruence-closed: see
    `eqsat.egraph.congruence_closed`)."""
    nodes: Mapping[str, Any] = raw["nodes"]
    class_data: Mapping[str, Any] = raw.get("class_data", {})
    index = {cid: i for i, cid in enumerate(c for c, data in class_data.items() if data.get("type") == TERM_SORT)}
    ints = {c for c, data in class_data.items() if data.get("type") == "i64"}
    children: list[set[int]] = [set() for _ in index]
    values: dict[str, int] = {}  # i64 class → its value
    uid_rows: list[tuple[str, str]] = []  # (i64 class of the uid, term class)
    pair_rows: list[tuple[str, str, str]] = []  # (value class, uid node a, uid node b)
    for node in nodes.values():
        cls, kids = node["eclass"], node["children"]
        here = index.get(cls)
        if here is not None:
            found = children[here]
            for c in kids:
                k = index.get(nodes[c]["eclass"])
                if k is not None:
                    found.add(k)
        elif node["op"] == "uid":
            uid_rows.append((cls, nodes[kids[0]]["eclass"]))
        elif node["op"] == PAIR_FUNCTION:
            pair_rows.append((cls, *kids))
        elif not kids and cls in ints and node["op"].lstrip("-").isdigit():
            values[cls] = int(node["op"])
    uid_class = {values[v]: index[c] for v, c in uid_rows if c in index}
    pairs = [(int(nodes[a]["op"]), int(nodes[b]["op"]), values.get(v, 0)) for v, a, b in pair_rows]
    return ClassGraph([sorted(kids) for kids in children], uid_class, pairs)


def related_pairs(graph: ClassGraph) -> RelatedPairs:
    """Recorded (uid, uid) pairs where one class is reachable from the other through children:
    those marked in an earlier round (not looked at again) and those found now.

    One pass over the class graph's strongly connected components (children first): each
    component's set of reachable recorded classes (a bitset) is the union of its children's and its
    own, so the cost is linear in the e-graph, not one search per recorded class (which took
    seconds per merge round on BERT's 12k-node e-graph)."""
    # pairs marked in an earlier round stay marked (the function merges by max): only the others
    # are looked at, which keeps the bitsets narrow (BERT's merge rounds: ~500 pairs of ~2000)
    known: set[tuple[int, int]] = set()
    wanted: list[tuple[int, int]] = []
    for a, b, value in graph.pairs:
        if value == 1:
            known.add((a, b))
        else:
            wanted.append((a, b))
    uid_class = graph.uid_class
    recorded = sorted({uid_class[u] for pair in wanted for u in pair if u in uid_class})
    bit = {c: k for k, c in enumerate(recorded)}
    reach = _reachable_bits(graph.children, bit)
    out: set[tuple[int, int]] = set()
    for a, b in wanted:
        ia, ib = uid_class.get(a), uid_class.get(b)
        if ia is None or ib is None or (reach[ia] >> bit[ib]) & 1 or (reach[ib] >> bit[ia]) & 1:
            out.add((a, b))
    return RelatedPairs(len(graph.pairs), known, out)


def related_pairs_each(graph: ClassGraph) -> RelatedPairs:
    """As `related_pairs`, by Tensat's vanilla filter: one fresh search of the class graph per
    pair (from each class, does the other lie below it?), nothing shared between pairs. Quadratic
    where `related_pairs` is linear: kept to measure what the one-pass scan saves."""
    known = {(a, b) for a, b, value in graph.pairs if value == 1}
    uid_class, children = graph.uid_class, graph.children
    out: set[tuple[int, int]] = set()
    for a, b, value in graph.pairs:
        if value == 1:
            continue
        ia, ib = uid_class.get(a), uid_class.get(b)
        if ia is None or ib is None or _below(children, ia, ib) or _below(children, ib, ia):
            out.add((a, b))
    return RelatedPairs(len(graph.pairs), known, out)


def _below(children: Sequence[Sequence[int]], top: int, target: int) -> bool:
    """Whether `target` is reachable from `top` in one or more steps (a depth-first search)."""
    seen: set[int] = set()
    stack = list(children[top])
    while stack:
        v = stack.pop()
        if v == target:
            return True
        if v not in seen:
            seen.add(v)
            stack.extend(children[v])
    return False


def _reachable_bits(adj: Sequence[Sequence[int]], bit: Mapping[int, int]) -> list[int]:
    """Per vertex, the bitset of marked vertices (vertex v has bit `bit[v]`) reachable from it in
    one or more steps (as `networkx.descendants`; on a cycle, the cycle's own marked vertices too)."""
    comp = strongly_connected(adj)  # component ids in reverse topological order: children first
    members: list[list[int]] = [[] for _ in range(max(comp, default=-1) + 1)]
    for v, c in enumerate(comp):
        members[c].append(v)
    strict, inclusive = [0] * len(members), [0] * len(members)
    for c, vs in enumerate(members):
        acc, own, cyclic = 0, 0, len(vs) > 1
        for v in vs:
            if v in bit:
                own |= 1 << bit[v]
            for w in adj[v]:
                if comp[w] == c:
                    cyclic = True
                else:
                    acc |= inclusive[comp[w]]
        strict[c] = acc | own if cyclic else acc
        inclusive[c] = acc | own
    return [strict[c] for c in comp]

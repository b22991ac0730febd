"""Greedy DAG extraction: like bottom-up, but a node's cost is the cost of the *set* of distinct
classes below it, so a sub-graph shared by two children is paid once (in the spirit of
extraction-gym's faster-greedy-dag). Fast and usually close; the ILPs start from it.

Memory is linear: a class's set is never copied. It is an immutable `Term` (class, cost, the
child terms it was built from) that shares its children with every other term built on them, so
a chain of n classes holds n small terms instead of n sets of up to n entries (which took 1.9 GB
at 10 000 classes and was killed past 24 GB at 50 000). A set's cost is read by walking the
shared terms only where it is needed: a node with one child costs its own cost plus the child's
total, and a cycle (the node's class inside a child's set) is possible only through a child in
the node's own strongly connected component, so only those are walked. The walk of a node with
several children is exact up to `max_walk` terms and past the deadline, and beyond either is
replaced by the sum of the children's totals (an upper bound: shared classes counted twice).
"""

from __future__ import annotations

import heapq
import time
from typing import NamedTuple

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up_tree_costs, parents_of_classes
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.graphs import strongly_connected
from eqsat.extract.repair import repair_choice
from eqsat.extract.selection import Selection, Status, is_valid_choice, make_selection


class Term:
    """The set of classes one choice of `cls` needs: `cls` itself (at `cost`) and the sets of
    the child classes as they were when the choice was made (shared, never copied)."""

    __slots__ = ("cls", "cost", "kids")

    def __init__(self, cls: int, cost: float, kids: tuple[Term, ...]) -> None:
        self.cls = cls
        self.cost = cost
        self.kids = kids


class _Walk(NamedTuple):
    cost: float  # cost of the distinct classes seen (exact if `complete`)
    contains: bool  # the class looked for was found
    complete: bool  # every term was visited (within the walk limit)


def _walk(roots: tuple[Term, ...], target: int, limit: int, same_component: list[int] | None = None) -> _Walk:
    """Distinct-class cost of the union of `roots`, and whether `target` is in it. A class met a
    second time (possibly as an older term) is not walked again. With `same_component` (the
    component id per class), only terms of target's component are visited: enough to decide
    membership, no cost."""
    seen: set[int] = set()
    total = 0.0
    stack = list(roots)
    want = same_component[target] if same_component is not None else -1
    while stack:
        t = stack.pop()
        cls = t.cls
        if cls in seen:
            continue
        if cls == target:
            return _Walk(total, True, True)
        if same_component is not None and same_component[cls] != want:
            continue
        seen.add(cls)
        if len(seen) > limit:
            return _Walk(total, False, False)
        total += t.cost
        stack.extend(t.kids)
    return _Walk(total, False, True)


def class_components(egraph: EGraphData) -> list[int]:
    """Strongly connected component per class in the graph class → child class of any node."""
    adj: list[list[int]] = [[] for _ in range(egraph.n_classes)]
    node_class = egraph.node_class.tolist()
    for n, kids in enumerate(egraph.unique_children):
        adj[node_class[n]].extend(kids)
    return strongly_connected(adj)


def greedy_dag_choice(
    egraph: EGraphData,
    cost: np.ndarray | None = None,
    deadline: float | None = None,
    max_walk: int = 200_000,
) -> np.ndarray:
    """The greedy choice per class (-1 where none), made acyclic; `cost` overrides node costs.
    Past `deadline` (a `time.perf_counter()` value) shared classes are no longer deduplicated
    nor cycles looked for (the final repair removes them), so the pass finishes in O(N log N)."""
    uc = egraph.unique_children
    node_cost = (egraph.cost if cost is None else cost).tolist()
    node_class = egraph.node_class.tolist()
    parents = parents_of_classes(egraph)
    comp = class_components(egraph)
    n_classes = egraph.n_classes
    terms: list[Term | None] = [None] * n_classes
    total = [float("inf")] * n_classes
    best = [-1] * n_classes
    # Cheapest first (Dijkstra-like), so most classes are settled before their parents look.
    queue: list[tuple[float, int]] = [(node_cost[n], n) for n in range(egraph.n_nodes) if not uc[n]]
    heapq.heapify(queue)
    queued = [False] * egraph.n_nodes
    for _, n in queue:
        queued[n] = True
    pops = 0
    hurry = False
    while queue:
        _, n = heapq.heappop(queue)
        queued[n] = False
        pops += 1
        if deadline is not None and not hurry and pops % 64 == 0 and time.perf_counter() > deadline:
            hurry = True
        c = node_class[n]
        kids = uc[n]
        if c in kids:
            continue
        kid_terms: list[Term] = []
        bound = node_cost[n]
        for k in kids:
            t = terms[k]
            if t is None:
                break
            kid_terms.append(t)
            bound = max(bound, node_cost[n] + total[k])
        if len(kid_terms) < len(kids) or bound >= total[c]:
            continue
        roots = tuple(kid_terms)
        cyclic_kids = tuple(t for k, t in zip(kids, roots) if comp[k] == comp[c])
        if hurry:  # no walks: a cycle this makes is repaired at the end
            value = node_cost[n] + sum(total[k] for k in kids)
        elif len(roots) <= 1:
            if cyclic_kids and _walk(cyclic_kids, c, max_walk, comp).contains:
                continue
            value = node_cost[n] + sum(total[k] for k in kids)
        else:
            walk = _walk(roots, c, max_walk)
            if walk.contains:
                continue
            if walk.complete:
                value = node_cost[n] + walk.cost
            else:
                if cyclic_kids and _walk(cyclic_kids, c, max_walk, comp).contains:
                    continue
                value = node_cost[n] + sum(total[k] for k in kids)
        if value < total[c]:
            total[c] = value
            terms[c] = Term(c, node_cost[n], roots)
            best[c] = n
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = True
                    heapq.heappush(queue, (node_cost[p] + value, p))
    choice = np.asarray(best, dtype=np.int64)
    if is_valid_choice(egraph, choice):
        return choice
    # Stale sets can, rarely, make the final choice cyclic: repair it.
    tree, _ = bottom_up_tree_costs(egraph)
    return repair_choice(egraph, choice, tree[egraph.node_class], parents)


def greedy_dag(egraph: EGraphData, time_limit: float = 60.0) -> Selection:
    """Greedy DAG extraction (no optimality claim). Within the time limit shared classes are
    counted once; past it the pass finishes quickly without that (and says so in `info`)."""
    start = time.perf_counter()
    choice = greedy_dag_choice(egraph, deadline=start + 0.8 * max(time_limit, 0.0))
    if any(choice[r] < 0 for r in egraph.roots.tolist()):
        raise ExtractionError(f"{egraph.name}: a root e-class has no acyclic term")
    seconds = time.perf_counter() - start
    status = Status.TIMED_OUT if seconds > time_limit else Status.FEASIBLE
    return make_selection(egraph, choice, status=status, extractor="greedy-dag", seconds=seconds)

"""Greedy DAG extraction: like bottom-up, but a node's cost is the cost of the *set* of distinct
nodes below it, so a sub-graph shared by two children is paid once (in the spirit of
extraction-gym's faster-greedy-dag). Fast and usually close; the ILPs start from it.
"""

from __future__ import annotations

import time
import heapq

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up_tree_costs, parents_of_classes
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.repair import repair_choice
from eqsat.extract.selection import Selection, Status, is_valid_choice, make_selection


def greedy_dag_choice(egraph: EGraphData, cost: np.ndarray | None = None) -> np.ndarray:
    """The greedy choice per class (-1 where none), made acyclic; `cost` overrides node costs."""
    uc = egraph.unique_children
    node_cost = (egraph.cost if cost is None else cost).tolist()
    node_class = egraph.node_class.tolist()
    parents = parents_of_classes(egraph)
    n_classes = egraph.n_classes
    sets: list[dict[int, float] | None] = [None] * n_classes  # class → {class in its DAG: cost}
    total = [float("inf")] * n_classes
    best = [-1] * n_classes
    # Cheapest first (Dijkstra-like), so most classes are settled before their parents look.
    queue: list[tuple[float, int]] = [(node_cost[n], n) for n in range(egraph.n_nodes) if not uc[n]]
    heapq.heapify(queue)
    queued = [False] * egraph.n_nodes
    for _, n in queue:
        queued[n] = True
    while queue:
        _, n = heapq.heappop(queue)
        queued[n] = False
        c = node_class[n]
        kids = uc[n]
        if c in kids:
            continue
        bound = node_cost[n]
        ok = True
        for k in kids:
            if sets[k] is None:
                ok = False
                break
            bound = max(bound, node_cost[n] + total[k])
        if not ok or bound >= total[c]:
            continue
        if len(kids) == 1:
            s = sets[kids[0]]
            if c in s:  # type: ignore[operator]
                continue
            merged = dict(s)  # type: ignore[arg-type]
        else:
            merged = {}
            for k in kids:
                s = sets[k]
                if c in s:  # type: ignore[operator]
                    break
                merged.update(s)  # type: ignore[arg-type]
            else:
                s = None
            if s is not None and c in s:
                continue
        merged[c] = node_cost[n]
        value = sum(merged.values())
        if value < total[c]:
            total[c] = value
            sets[c] = merged
            best[c] = n
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = True
                    heapq.heappush(queue, (node_cost[p] + value, p))
    choice = np.asarray(best, dtype=np.int64)
    if is_valid_choice(egraph, choice):
        return choice
    # Stale cost sets can, rarely, make the final choice cyclic: repair it.
    tree, _ = bottom_up_tree_costs(egraph)
    return repair_choice(egraph, choice, tree[egraph.node_class], parents)


def greedy_dag(egraph: EGraphData, time_limit: float = 60.0) -> Selection:
    """Greedy DAG extraction (no optimality claim)."""
    start = time.perf_counter()
    choice = greedy_dag_choice(egraph)
    if any(choice[r] < 0 for r in egraph.roots.tolist()):
        raise ExtractionError(f"{egraph.name}: a root e-class has no acyclic term")
    return make_selection(
        egraph, choice, status=Status.FEASIBLE, extractor="greedy-dag", seconds=time.perf_counter() - start
    )

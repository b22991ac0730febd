"""Bottom-up extraction: the optimal choice for *tree* cost (shared sub-terms counted each time).

Knuth's generalisation of Dijkstra to AND/OR graphs: a node becomes ready when all its child
classes are final; a class is final when its cheapest ready node is popped. The finalisation order
is topological, so the choice is acyclic by construction, and the same pass tells which classes
can be extracted at all (used by the ILP's pruning).
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.selection import Selection, Status, make_selection


def parents_of_classes(egraph: EGraphData) -> list[list[int]]:
    """For each class, the nodes that have it as a child (each node listed once per class)."""
    parents: list[list[int]] = [[] for _ in range(egraph.n_classes)]
    for n, kids in enumerate(egraph.unique_children):
        for k in kids:
            parents[k].append(n)
    return parents


def bottom_up_tree_costs(
    egraph: EGraphData, node_mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(tree cost per class, best node per class); inf / -1 where a class cannot be extracted
    acyclically using only the nodes in `node_mask`."""
    uc = egraph.unique_children
    cost = egraph.cost.tolist()
    ptr = egraph.child_ptr.tolist()
    cc = egraph.child_class.tolist()
    node_class = egraph.node_class.tolist()
    allowed = [True] * egraph.n_nodes if node_mask is None else node_mask.tolist()
    parents = parents_of_classes(egraph)
    waiting = [len(k) for k in uc]
    best = [float("inf")] * egraph.n_classes
    best_node = [-1] * egraph.n_classes
    final = [False] * egraph.n_classes
    heap: list[tuple[float, int, int]] = []
    for n in range(egraph.n_nodes):
        if allowed[n] and waiting[n] == 0:
            heap.append((cost[n], n, node_class[n]))
    heapq.heapify(heap)
    while heap:
        value, n, c = heapq.heappop(heap)
        if final[c]:
            continue
        final[c] = True
        best[c] = value
        best_node[c] = n
        for p in parents[c]:
            waiting[p] -= 1
            if waiting[p] == 0 and allowed[p] and not final[node_class[p]]:
                v = cost[p] + sum(best[k] for k in cc[ptr[p] : ptr[p + 1]])
                heapq.heappush(heap, (v, p, node_class[p]))
    return np.asarray(best, dtype=np.float64), np.asarray(best_node, dtype=np.int64)


def bottom_up(egraph: EGraphData, time_limit: float = 60.0) -> Selection:
    """Optimal tree-cost extraction; its DAG cost is an upper bound for the DAG extractors."""
    start = time.perf_counter()
    tree, choice = bottom_up_tree_costs(egraph)
    for r in egraph.roots.tolist():
        if choice[r] < 0:
            raise ExtractionError(f"{egraph.name}: root e-class {egraph.class_ids[r]!r} has no acyclic term")
    return make_selection(
        egraph, choice, status=Status.FEASIBLE, extractor="bottom-up", seconds=time.perf_counter() - start
    )

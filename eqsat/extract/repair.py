"""Turn any choice (possibly cyclic or incomplete) into a valid one that keeps as much of it as
possible. Used on greedy answers and on cyclic ILP solutions, to get good acyclic incumbents."""

from __future__ import annotations

import heapq

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import parents_of_classes
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.graphs import cyclic_vertices


def repair_choice(
    egraph: EGraphData,
    preferred: np.ndarray,
    fallback_key: np.ndarray,
    parents: list[list[int]] | None = None,
    node_mask: np.ndarray | None = None,
) -> np.ndarray:
    """An acyclic choice for every extractable class: the preferred node wherever it can be built
    from classes already final; when stuck (a cycle, or no preference), the ready node with the
    smallest `fallback_key` (e.g. its bottom-up tree cost) breaks the deadlock."""
    uc = egraph.unique_children
    node_class = egraph.node_class.tolist()
    pref = preferred.tolist()
    key = fallback_key.tolist()
    if parents is None:
        parents = parents_of_classes(egraph)
    waiting = [len(k) for k in uc]
    if node_mask is not None:  # forbidden nodes never become ready
        waiting = [w if ok else -1 for w, ok in zip(waiting, node_mask.tolist(), strict=True)]
    final = [False] * egraph.n_classes
    out = np.full(egraph.n_classes, -1, dtype=np.int64)
    ready_pref: list[int] = []
    heap: list[tuple[int, float, int]] = []

    # When stuck, break the deadlock first with classes nobody prefers anything for (free), then
    # with classes on a cycle of the preferred choice, and only then elsewhere.
    tier = [0 if p < 0 else 2 for p in pref]
    for c in cyclic_classes(egraph, preferred):
        tier[c] = 1

    def ready(n: int) -> None:
        c = node_class[n]
        if pref[c] == n:
            ready_pref.append(n)
        else:
            heapq.heappush(heap, (tier[c], key[n], n))

    for n in range(egraph.n_nodes):
        if waiting[n] == 0:
            ready(n)
    while ready_pref or heap:
        n = ready_pref.pop() if ready_pref else heapq.heappop(heap)[2]
        c = node_class[n]
        if final[c]:
            continue
        final[c] = True
        out[c] = n
        for p in parents[c]:
            waiting[p] -= 1
            if waiting[p] == 0 and not final[node_class[p]]:
                ready(p)
    for r in egraph.roots.tolist():
        if out[r] < 0:
            raise ExtractionError(f"{egraph.name}: root e-class {egraph.class_ids[r]!r} has no acyclic term")
    return out


def cyclic_classes(egraph: EGraphData, choice: np.ndarray) -> set[int]:
    """Classes on a cycle of the graph 'class → child classes of its chosen node'."""
    uc = egraph.unique_children
    adj = [uc[n] if n >= 0 else () for n in choice.tolist()]
    return cyclic_vertices(adj)

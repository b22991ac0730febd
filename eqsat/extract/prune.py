"""Shrink an extraction problem without changing its optimum, before any MIP sees it.

Removed: nodes that are their own descendant through a child in their own class (a self-loop can
never be chosen acyclically), nodes with a child class that has no acyclic term at all (bottom-up
fixpoint), classes and nodes the roots cannot reach, and dominated nodes: in one class, a node
whose distinct child classes are a superset of another's and whose cost is not lower. Replacing a
dominated node by its dominator in any valid choice keeps it valid (its children are already
chosen, and it adds no edge, so no cycle) and does not raise the cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up_tree_costs
from eqsat.extract.egraph_data import EGraphData


@dataclass(frozen=True, eq=False)
class Pruned:
    """What is left: masks over the original numbering (nothing is renumbered)."""

    node_mask: np.ndarray  # bool [N]
    class_mask: np.ndarray  # bool [C]
    stats: dict[str, int]


def reachable_classes(egraph: EGraphData, node_mask: np.ndarray) -> np.ndarray:
    uc = egraph.unique_children
    ok = node_mask.tolist()
    seen = np.zeros(egraph.n_classes, dtype=bool)
    stack = [int(r) for r in egraph.roots]
    for r in stack:
        seen[r] = True
    while stack:
        c = stack.pop()
        for n in egraph.nodes_of(c).tolist():
            if ok[n]:
                for k in uc[n]:
                    if not seen[k]:
                        seen[k] = True
                        stack.append(k)
    return seen


def prune(egraph: EGraphData, dominance: bool = True) -> Pruned:
    """Masks of the nodes and classes an optimal DAG extraction may need."""
    uc = egraph.unique_children
    node_class = egraph.node_class
    stats = {"nodes": egraph.n_nodes, "classes": egraph.n_classes}
    mask = np.array([node_class[n] not in uc[n] for n in range(egraph.n_nodes)], dtype=bool)
    stats["self_loop"] = int((~mask).sum())
    extractable = bottom_up_tree_costs(egraph, mask)[1] >= 0
    for r in egraph.roots.tolist():
        if not extractable[r]:
            raise ExtractionError(f"{egraph.name}: root e-class {egraph.class_ids[r]!r} has no acyclic term")
    before = int(mask.sum())
    mask &= np.array([all(extractable[k] for k in uc[n]) for n in range(egraph.n_nodes)], dtype=bool)
    stats["not_extractable"] = before - int(mask.sum())
    reach = reachable_classes(egraph, mask)
    before = int(mask.sum())
    mask &= reach[node_class]
    stats["unreachable"] = before - int(mask.sum())
    if dominance:
        before = int(mask.sum())
        cost = egraph.cost.tolist()
        for c in np.flatnonzero(reach).tolist():
            nodes = [n for n in egraph.nodes_of(c).tolist() if mask[n]]
            if len(nodes) < 2:
                continue
            # Cheapest first, fewer children first: a node can only be dominated by an earlier one.
            nodes.sort(key=lambda n: (cost[n], len(uc[n]), n))
            kept: list[tuple[int, frozenset[int]]] = []
            for n in nodes:
                kids = frozenset(uc[n])
                if any(k <= kids for _, k in kept):
                    mask[n] = False
                else:
                    kept.append((n, kids))
        stats["dominated"] = before - int(mask.sum())
        reach = reachable_classes(egraph, mask)
        mask &= reach[node_class]
    stats["kept_nodes"] = int(mask.sum())
    stats["kept_classes"] = int(reach.sum())
    return Pruned(node_mask=mask, class_mask=reach, stats=stats)


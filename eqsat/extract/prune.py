"""Shrink an extraction problem without changing its optimum, before any MIP sees it.

Removed: nodes that are their own descendant through a child in their own class (a self-loop can
never be chosen acyclically), more generally nodes every term of whose children contains the node's
own class (`necessarily_cyclic`), nodes with a child class that has no acyclic term at all (bottom-up
fixpoint), classes and nodes the roots cannot reach, and dominated nodes: in one class, a node
whose distinct child classes are a superset of another's and whose cost is not lower. Replacing a
dominated node by its dominator in any valid choice keeps it valid (its children are already
chosen, and it adds no edge, so no cycle) and does not raise the cost, as long as no cost is
negative: with a negative cost somewhere (extraction-gym's maxsat suite) dominance and free
classes are off, since a child class the dominator leaves out may be worth having.

Free classes (with dominance): a class with a zero-cost node whose child
classes are all free (least fixpoint; weights and everything folded from them, under TASO's
convention) keeps only that node, the first found. Those witnesses point only at classes found
before theirs, so any valid choice with every free class switched to its witness is still acyclic
(no cycle can leave a free class and come back), reaches no non-free class it did not reach before,
and costs no more. On BERT this leaves 1 of each weight class's nodes and removes every
slice/concat 2-cycle among the weights, which the ILP otherwise had to cut.
"""

from __future__ import annotations

import time
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


def prune(
    egraph: EGraphData,
    dominance: bool = True,
    cycles: bool = True,
    initial_mask: np.ndarray | None = None,
    deadline: float | None = None,
) -> Pruned:
    """Masks of the nodes and classes an optimal DAG extraction may need (within
    `initial_mask` if given: the restricted ILP uses that). Past `deadline` (a
    `time.perf_counter()` value) the optional reductions stop early and remove less."""
    uc = egraph.unique_children
    node_class = egraph.node_class
    stats = {"nodes": egraph.n_nodes, "classes": egraph.n_classes}
    mask = np.array([node_class[n] not in uc[n] for n in range(egraph.n_nodes)], dtype=bool)
    stats["self_loop"] = int((~mask).sum())
    if initial_mask is not None:
        mask &= initial_mask
    stats["not_extractable"] = 0
    stats["necessarily_cyclic"] = 0
    while True:
        extractable = bottom_up_tree_costs(egraph, mask)[1] >= 0
        for r in egraph.roots.tolist():
            if not extractable[r]:
                raise ExtractionError(f"{egraph.name}: root e-class {egraph.class_ids[r]!r} has no acyclic term")
        before = int(mask.sum())
        mask &= np.array([all(extractable[k] for k in uc[n]) for n in range(egraph.n_nodes)], dtype=bool)
        stats["not_extractable"] += before - int(mask.sum())
        cyclic = necessarily_cyclic(egraph, mask, deadline) if cycles else np.zeros(0, dtype=bool)
        if not cyclic.any():
            break
        stats["necessarily_cyclic"] += int(cyclic.sum())
        mask &= ~cyclic
    stats["free"] = 0
    # Both reductions below drop nodes whose cost another node matches or beats, assuming that fewer
    # reachable classes never cost more: false with negative costs (a dropped child class may be
    # worth having), so they are off then.
    dominance = dominance and not egraph.has_negative_costs
    if dominance:
        before = int(mask.sum())
        for c, witness in free_class_witnesses(egraph, mask).items():
            mask[egraph.nodes_of(c)] = False
            mask[witness] = True
        stats["free"] = before - int(mask.sum())
    reach = reachable_classes(egraph, mask)
    before = int(mask.sum())
    mask &= reach[node_class]
    stats["unreachable"] = before - int(mask.sum())
    if dominance and (deadline is None or time.perf_counter() < deadline):
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


def free_class_witnesses(egraph: EGraphData, node_mask: np.ndarray) -> dict[int, int]:
    """Class → its first zero-cost kept node whose child classes are all free (classes found in
    that order, so each witness's children were found before it)."""
    uc = egraph.unique_children
    ok = node_mask.tolist()
    cost = egraph.cost.tolist()
    node_class = egraph.node_class.tolist()
    waiting: list[int] = [0] * egraph.n_nodes  # child classes not yet free, per zero-cost node
    users: dict[int, list[int]] = {}
    ready: list[int] = []
    for n in range(egraph.n_nodes):
        if ok[n] and cost[n] == 0:
            waiting[n] = len(uc[n])
            if waiting[n] == 0:
                ready.append(n)
            for k in uc[n]:
                users.setdefault(k, []).append(n)
    witness: dict[int, int] = {}
    while ready:
        n = ready.pop()
        c = node_class[n]
        if c in witness:
            continue
        witness[c] = n
        for m in users.get(c, ()):
            waiting[m] -= 1
            if waiting[m] == 0:
                ready.append(m)
    return witness


def necessarily_cyclic(egraph: EGraphData, node_mask: np.ndarray, deadline: float | None = None) -> np.ndarray:
    """Nodes that close a cycle in *every* extraction that uses them, as a mask to remove.

    M(c), the classes every acyclic term of c contains, is the least fixpoint of
    M(c) = {c} ∪ ⋂_{n ∈ c} ⋃_{k child of n} M(k); a node n of c with c ∈ M(k) for a child k can
    never be chosen. Only classes in one strongly connected component can be in each other's M,
    so the sets are bitsets over a component, computed with a worklist. The iteration climbs
    from below, so stopping it at `deadline` leaves subsets of M: fewer nodes removed, all rightly.
    """
    from eqsat.extract.graphs import strongly_connected

    uc = egraph.unique_children
    ok = node_mask.tolist()
    node_class = egraph.node_class.tolist()
    adj: list[list[int]] = [[] for _ in range(egraph.n_classes)]
    for n in range(egraph.n_nodes):
        if ok[n]:
            adj[node_class[n]].extend(uc[n])
    comp = strongly_connected(adj)
    members: dict[int, list[int]] = {}
    for c, k in enumerate(comp):
        members.setdefault(k, []).append(c)
    bit: dict[int, int] = {}
    for vs in members.values():
        if len(vs) > 1:
            for i, c in enumerate(vs):
                bit[c] = 1 << i
    if not bit:
        return np.zeros(egraph.n_nodes, dtype=bool)
    kept_nodes = {c: [n for n in egraph.nodes_of(c).tolist() if ok[n]] for c in bit}
    parents: dict[int, set[int]] = {c: set() for c in bit}
    for c in bit:
        for n in kept_nodes[c]:
            for k in uc[n]:
                if k in bit and comp[k] == comp[c]:
                    parents[k].add(c)
    must = dict(bit)
    work = list(bit)
    queued = set(work)
    steps = 0
    while work:
        steps += 1
        if deadline is not None and steps % 256 == 0 and time.perf_counter() > deadline:
            break
        c = work.pop()
        queued.discard(c)
        inter = -1
        for n in kept_nodes[c]:
            u = 0
            for k in uc[n]:
                if k in bit and comp[k] == comp[c]:
                    u |= must[k]
            inter &= u
            if not inter:
                break
        new = bit[c] | (inter if inter != -1 else 0)
        if new != must[c]:
            must[c] = new
            for p in parents[c]:
                if p not in queued:
                    queued.add(p)
                    work.append(p)
    out = np.zeros(egraph.n_nodes, dtype=bool)
    for c, b in bit.items():
        for n in kept_nodes[c]:
            if any(k in bit and comp[k] == comp[c] and must[k] & b for k in uc[n]):
                out[n] = True
    return out

"""Small e-graphs written by hand or drawn at random, and a brute-force optimum to check against."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from eqsat.extract import EGraphData, check_selection, load_egraph


def egraph(spec: dict[str, list[tuple[float, list[str]]]], roots: list[str]) -> EGraphData:
    """spec: class id → list of (cost, child class ids); node i of class c gets id 'c.i'."""
    nodes: dict[str, Any] = {}
    for c, alternatives in spec.items():
        for i, (cost, kids) in enumerate(alternatives):
            nodes[f"{c}.{i}"] = {"op": f"op{c}{i}", "cost": cost, "eclass": c, "children": [f"{k}.0" for k in kids]}
    return load_egraph({"nodes": nodes, "root_eclasses": roots})


def brute_force(eg: EGraphData) -> float | None:
    """Cheapest valid DAG cost over every choice (None if nothing is valid)."""
    options = [eg.nodes_of(c).tolist() for c in range(eg.n_classes)]
    best: float | None = None
    for combo in itertools.product(*options):
        choice = np.asarray(combo)
        if check_selection(eg, choice):
            continue
        seen: set[int] = set()
        stack = eg.roots.tolist()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            stack.extend(eg.unique_children[choice[c]])
        cost = float(sum(eg.cost[choice[c]] for c in seen))
        if best is None or cost < best:
            best = cost
    return best

"""Large-neighbourhood search over the exact MIP: improve a valid answer by re-solving small parts.

Why: on big cyclic e-graphs (Tensat's nasrnn) the full MIP spends its whole budget in presolve and
root cut rounds and never beats the greedy start. Most of the answer is fine; what is missing are
local rewrites that change a few classes together (and bring in classes the answer does not use
yet). So: free a neighbourhood (the e-classes below a few random chosen classes, breadth-first
over every kept node, a few hundred to a few thousand classes), fix every other class to its
current node (or to nothing if it is unused), and solve that small MIP with the same lazy cycle
cuts. The current answer is feasible in it, so an answer never gets worse; every accepted answer
has passed the checker. The neighbourhood grows after a run of proven no-improvements and shrinks
after a timeout. It proves nothing: the caller keeps the full model's dual bound as the lower bound.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eqsat.extract.lazy import IlpOptions, solve_lazy
from eqsat.extract.mip import Clock, Incumbent, Problem
from eqsat.extract.prune import Pruned
from eqsat.extract.selection import Status


@dataclass(frozen=True)
class LnsOptions:
    # Measured on nasrnn: improvements change 10-35 classes; 3000-class neighbourhoods solve in
    # ~0.2 s and found all of them within 6 s, while growing to 12,000 classes after every
    # unproductive neighbourhood made each MIP take seconds and found them 5x slower.
    size: int = 3000  # classes freed at first
    min_size: int = 100
    max_size: int = 12_000
    patience: int = 30  # unproductive neighbourhoods (each proven so) in a row before growing
    grow: float = 1.5
    shrink: float = 0.7  # after a neighbourhood's MIP timed out
    seeds: int = 2  # chosen classes the breadth-first search starts from
    sub_time: float = 4.0  # seconds per neighbourhood MIP at most
    seed: int = 0  # random seed: the same inputs give the same answer (up to timeouts)
    rounds: int = 1 << 30  # neighbourhoods at most (tests use it to stop without a clock)


@dataclass(frozen=True)
class LnsResult:
    best: Incumbent
    info: dict[str, Any] = field(default_factory=dict)


def kept_class_children(full: Problem) -> list[list[int]]:
    """Per class, the distinct child classes of its kept nodes: the graph the search walks."""
    eg = full.egraph
    uc = eg.unique_children
    kids: list[set[int]] = [set() for _ in range(eg.n_classes)]
    node_class = eg.node_class.tolist()
    for n in full.nodes.tolist():
        kids[node_class[n]].update(uc[n])
    return [sorted(k) for k in kids]


def neighbourhood(
    children: list[list[int]], seeds: list[int], size: int, rng: random.Random
) -> set[int]:
    """Up to `size` classes, breadth-first down from the seeds (siblings in random order)."""
    free: set[int] = set()
    queue = deque(seeds)
    while queue and len(free) < size:
        c = queue.popleft()
        if c in free:
            continue
        free.add(c)
        kids = [k for k in children[c] if k not in free]
        rng.shuffle(kids)
        queue.extend(kids)
    return free


def sub_problem(full: Problem, incumbent: np.ndarray, free: set[int]) -> Problem:
    """The full problem restricted to: every kept node of a free class, and the incumbent's node
    of every other class it uses. Costs and cuts are those of the full problem, so any answer of
    the restriction is an answer of the full problem."""
    eg = full.egraph
    keep = full.pruned.node_mask
    mask = np.zeros(eg.n_nodes, dtype=bool)
    for c in free:
        nodes = eg.nodes_of(c)
        mask[nodes[keep[nodes]]] = True
    mask[incumbent[incumbent >= 0]] = True
    nodes = np.flatnonzero(mask)
    class_mask = np.zeros(eg.n_classes, dtype=bool)
    class_mask[eg.node_class[nodes]] = True
    uc = eg.unique_children
    for n in nodes.tolist():
        class_mask[list(uc[n])] = True
    stats = {"kept_nodes": len(nodes), "kept_classes": int(class_mask.sum())}
    return Problem.over(eg, Pruned(node_mask=mask, class_mask=class_mask, stats=stats), full.parents, full.repair_key)


def improve(
    full: Problem,
    start: Incumbent,
    clock: Clock,
    options: LnsOptions = LnsOptions(),
    ilp_options: IlpOptions = IlpOptions(),
    children: list[list[int]] | None = None,
) -> LnsResult:
    """Re-solve neighbourhoods of the best answer until the clock runs out; never worse than
    `start`, always a valid (checked) answer."""
    rng = random.Random(options.seed)
    children = children if children is not None else kept_class_children(full)
    best = start
    size = options.size
    failures = 0
    history: list[dict[str, Any]] = []
    sub_opts = IlpOptions(gap=ilp_options.gap, threads=ilp_options.threads, short_cycles=ilp_options.short_cycles)
    while clock.left() > 0.5 and len(history) < options.rounds:
        used = np.flatnonzero(best.choice >= 0).tolist()
        seeds = rng.sample(used, min(options.seeds, len(used)))
        free = neighbourhood(children, seeds, size, rng)
        problem = sub_problem(full, best.choice, free)
        limit = min(options.sub_time, clock.left())
        sel, _ = solve_lazy(problem, Clock(limit), sub_opts, "ilp-lns", exact=False, start=best)
        improved = sel.dag_cost < best.cost - 1e-12
        history.append(
            {"t": round(clock.elapsed(), 2), "size": len(free), "status": str(sel.status), "cost": sel.dag_cost,
             "improved": improved}
        )
        if improved:
            best = Incumbent(sel.choice, sel.dag_cost, "lns")
            failures = 0
        elif sel.status == Status.OPTIMAL or sel.status == Status.FEASIBLE:
            failures += 1
            if failures >= options.patience:
                size = min(options.max_size, int(size * options.grow))
                failures = 0
        else:
            size = max(options.min_size, int(size * options.shrink))
        if len(free) == len(full.classes) and sel.status == Status.FEASIBLE:
            break  # that neighbourhood was the whole problem, solved to optimality
    improvements = [h for h in history if h["improved"]]
    return LnsResult(
        best=best,
        info={
            "start_cost": start.cost,
            "cost": best.cost,
            "neighbourhoods": len(history),
            "improvements": len(improvements),
            "trace": [(h["t"], h["size"], h["cost"]) for h in improvements],
            "final_size": size,
        },
    )

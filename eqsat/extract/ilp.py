"""The default extractor: an exact MIP for DAG cost, solved by HiGHS, with lazy cycle cuts.

Model (after `prune`): x_n, y_c binary; sum of x over class c = y_c; x_n <= y_k for each distinct
child class k of n; roots have y = 1; minimise sum cost_n x_n. Acyclicity is not modelled up
front: most optimal answers have no cycle, so we solve, and as soon as HiGHS finds an improving
answer with a cycle among the classes the roots reach, we stop it, add a cut per short cycle
(class-based: of the nodes closing the cycle, at most len-1), and re-solve from the best valid
answer so far, until the answer is acyclic or time is up. Every solve is a relaxation of the
acyclic problem, so its dual bound is a valid lower bound.

Before the first solve, every class cycle of length <= 3 inside a strongly connected component
is cut (Tensat's split/concat rewrites create hundreds; without them bert's first MIP answer is
cyclic and far below any valid cost). Optionally (IlpOptions.reduce_above) a first phase solves
the model restricted to a candidate set (see reduced_ilp) for a warm start; off by default.
"""

from __future__ import annotations

from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.lazy import IlpOptions, solve_lazy
from eqsat.extract.mip import Clock, Incumbent, make_problem
from eqsat.extract.reduced_ilp import reduced_phase
from eqsat.extract.selection import Selection

__all__ = ["IlpOptions", "ilp"]


def ilp(egraph: EGraphData, time_limit: float = 60.0, options: IlpOptions = IlpOptions()) -> Selection:
    """Best DAG-cost extraction HiGHS can prove (or find) within the time limit."""
    clock = Clock(time_limit)
    full = make_problem(egraph)
    start = None
    cycles: list[list[int]] = []
    phase1: dict[str, object] = {}
    if len(full.nodes) >= options.reduce_above:
        sel, cycles, lp_bound = reduced_phase(full, Clock(options.reduce_share * clock.left()), options)
        start = Incumbent(sel.choice, sel.dag_cost, "reduced")
        phase1 = {"cost": sel.dag_cost, "seconds": sel.seconds, "cycles": len(cycles), "lp_bound": lp_bound}
    sel, _ = solve_lazy(full, clock, options, "ilp", start=start, known_cycles=cycles)
    if phase1:
        sel.info["reduced_phase"] = phase1  # type: ignore[index]
    return sel

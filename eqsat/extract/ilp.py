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
cyclic and far below any valid cost). On problems with a large cyclic region
(IlpOptions.lns_above), a large-neighbourhood search (lns.py) first improves the greedy start
with small MIPs, since there the full MIP never gets past its root within a minute; the full MIP
then starts from that answer and supplies the lower bound. Optionally (IlpOptions.reduce_above)
a first phase solves the model restricted to a candidate set (see reduced_ilp) for a warm start;
off by default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.lazy import IlpOptions, NodeBudget, solve_lazy, within_budgets
from eqsat.extract.lns import LnsOptions, improve
from eqsat.extract.mip import (
    Clock,
    Incumbent,
    Problem,
    class_sccs,
    make_problem,
    start_incumbent,
)
from eqsat.extract.prune import prune
from eqsat.extract.reduced_ilp import reduced_phase
from eqsat.extract.selection import Selection, dag_cost, is_valid_choice, reachable_choice

__all__ = ["IlpOptions", "hinted_start", "ilp"]


def largest_cyclic_region(problem: Problem) -> int:
    """Classes in the largest strongly connected component of the kept class graph."""
    sizes = Counter(c for c in class_sccs(problem) if c >= 0)
    return max(sizes.values(), default=0)


def hinted_start(problem: Problem, hints: Sequence[np.ndarray], budgets: tuple[NodeBudget, ...] = (),
                 deadline: float | None = None) -> Incumbent | None:
    """The cheapest of the greedy answer and the valid `hints` (full choices known from elsewhere,
    e.g. the answer on an e-graph this one grew from), preferring those within the budgets; None
    without hints."""
    if not hints:
        return None
    eg = problem.egraph
    found, _ = start_incumbent(problem, None, deadline)
    options = [found]
    for choice in hints:
        if is_valid_choice(eg, choice):
            kept = reachable_choice(eg, choice)
            options.append(Incumbent(kept, dag_cost(eg, kept), "hint"))
    return min(options, key=lambda i: (not within_budgets(budgets, i.choice), i.cost))


def ilp(egraph: EGraphData, time_limit: float = 60.0, options: IlpOptions = IlpOptions(),
        hints: Sequence[np.ndarray] = ()) -> Selection:
    """Best DAG-cost extraction HiGHS can prove (or find) within the time limit, starting from the
    cheapest of the greedy answer and `hints` (so never worse than any valid hint)."""
    clock = Clock(time_limit)
    budgeted = bool(options.budgets)  # dominance and the warm-start phases ignore the budget rows
    full = make_problem(egraph, prune(egraph, dominance=not budgeted, deadline=clock.deadline(0.3)))
    start = hinted_start(full, hints, options.budgets, deadline=clock.deadline(0.5))
    cycles: list[list[int]] = []
    phases: dict[str, Any] = {}
    plain = not budgeted and not egraph.has_negative_costs  # the warm-start phases assume costs only add
    if len(full.nodes) >= options.reduce_above and plain:
        sel, cycles, lp_bound = reduced_phase(full, Clock(options.reduce_share * clock.left()), options)
        if start is None or sel.dag_cost < start.cost:
            start = Incumbent(sel.choice, sel.dag_cost, "reduced")
        phases["reduced_phase"] = {"cost": sel.dag_cost, "seconds": sel.seconds, "cycles": len(cycles), "lp_bound": lp_bound}
    region = largest_cyclic_region(full)
    if region >= options.lns_above and plain and clock.left() > 0.2 * time_limit:
        _, warm = start_incumbent(full, start, deadline=clock.deadline(0.6))
        t = clock.elapsed()
        result = improve(full, warm, Clock(options.lns_share * clock.left()), LnsOptions(seed=options.lns_seed), options)
        start = result.best
        phases["lns"] = {**result.info, "region": region, "started_s": t, "seconds": clock.elapsed() - t}
    sel, _ = solve_lazy(full, clock, options, "ilp", start=start, known_cycles=cycles)
    sel.info.update(phases)  # type: ignore[attr-defined]
    return sel

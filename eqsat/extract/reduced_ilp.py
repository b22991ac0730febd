"""Restricted ILP, in the spirit of e-boost: solve the exact model only over a small candidate set.

Why it is in the comparison: on the hard Tensat e-graphs the full MIP spends its time at the root
(large LP, many cut rounds); most nodes can be ruled out cheaply. Candidates are the support of
the LP relaxation of the full model (a node the LP does not touch is rarely in a good answer),
plus the nodes of the greedy and bottom-up answers (so the greedy answer stays feasible). The
restricted MIP is much smaller, so it gets further within the same time; the price is that its
optimum is not provably the true one. The full LP's value is still a valid lower bound.
"""

from __future__ import annotations

import highspy
import numpy as np

from eqsat.extract.bottom_up import bottom_up_tree_costs
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.greedy_dag import greedy_dag_choice
from eqsat.extract.lazy import IlpOptions, solve_lazy
from eqsat.extract.mip import Clock, Problem, base_model, make_problem, new_highs
from eqsat.extract.prune import prune
from eqsat.extract.selection import Selection


def reduced_ilp(egraph: EGraphData, time_limit: float = 60.0, options: IlpOptions = IlpOptions()) -> Selection:
    """The restricted MIP alone, with the whole time limit."""
    clock = Clock(time_limit)
    sel, _, _ = reduced_phase(make_problem(egraph, deadline=clock.deadline(0.3)), clock, options)
    return sel


def reduced_phase(
    full: Problem, clock: Clock, options: IlpOptions
) -> tuple[Selection, list[list[int]], float | None]:
    """(answer of the restricted MIP, cycles it cut, LP bound of the full model)."""
    egraph = full.egraph
    h = new_highs(0.5 * clock.left(), options.threads, options.gap)
    base_model(full, h)
    h.setOptionValue("solve_relaxation", True)
    if full.n_cols > options.lp_presolve_max_cols:
        h.setOptionValue("presolve", "off")
    h.run()
    values = np.asarray(h.getSolution().col_value)
    lp_ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal and len(values) == full.n_cols
    lp_bound = float(h.getInfo().objective_function_value) / full.cost_scale if lp_ok else None
    candidates = np.zeros(egraph.n_nodes, dtype=bool)
    if lp_ok:
        candidates[full.nodes[values[: len(full.nodes)] > 1e-6]] = True
    for choice in (greedy_dag_choice(egraph, deadline=clock.deadline(0.6)), bottom_up_tree_costs(egraph, full.pruned.node_mask)[1]):
        candidates[choice[choice >= 0]] = True
    problem = make_problem(egraph, prune(egraph, initial_mask=candidates & full.pruned.node_mask,
                                         deadline=clock.deadline(0.7)))
    sel, cycles = solve_lazy(problem, clock, options, "ilp-reduced", exact=False, lower_bound=lp_bound)
    sel.info["candidates"] = int(candidates.sum())  # type: ignore[index]
    return sel, cycles, lp_bound

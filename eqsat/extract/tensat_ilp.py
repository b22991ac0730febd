"""Tensat's ILP formulation, as an option to compare against the default ILP.

Tensat (Yang et al., MLSys 2021) forbids cycles up front with a continuous topological-order
variable per class: for each node n of class c and child class k, t_c - t_k >= eps - A(1 - x_n)
(here with eps = 1 and t in [0, |classes| - 1], the same constraint scaled), on every edge. The
model is complete in one solve, but the big-M rows make its LP relaxation weak. Same pruning as
the default ILP so that the comparison is about the acyclicity encoding.

`order_vars` (`ORDER_VARS`): "real" (the default, as the paper's main runs) or "int" (Tensat's
`--order_var_int`, the paper's real-vs-integer comparison; registered as extractor
`tensat-ilp-int`). Both are exact: an integer order exists whenever a real one does.
"""

from __future__ import annotations

import highspy
import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.lazy import IlpOptions
from eqsat.extract.mip import (
    Clock,
    Problem,
    base_model,
    class_edges,
    choice_from_solution,
    make_problem,
    new_highs,
    order_model,
    solution_vector,
    start_incumbent,
)
from eqsat.extract.selection import (
    Selection,
    Status,
    postorder,
    dag_cost,
    is_valid_choice,
    make_selection,
    reachable_choice,
)


ORDER_VARS: tuple[str, ...] = ("real", "int")


def tensat_ilp(egraph: EGraphData, time_limit: float = 60.0, options: IlpOptions = IlpOptions(),
               order_vars: str = "real") -> Selection:
    if order_vars not in ORDER_VARS:
        raise ExtractionError(f"tensat-ilp: unknown order variables {order_vars!r}; choose from {', '.join(ORDER_VARS)}")
    clock = Clock(time_limit)
    problem = make_problem(egraph, deadline=clock.deadline(0.3))
    greedy, warm = start_incumbent(problem, deadline=clock.deadline(0.6))
    best_choice, best_cost = (greedy.choice, greedy.cost) if greedy.cost <= warm.cost else (warm.choice, warm.cost)
    h = new_highs(clock.left(), options.threads, options.gap)
    base_model(problem, h)
    n_order = order_model(problem, h, only_cyclic=False, integer=order_vars == "int")
    # The warm start's order values: a class's t is its height in the chosen DAG.
    v = _warm_vector(problem, warm.choice, h.getNumCol())
    h.setSolution(len(v), np.arange(len(v), dtype=np.int32), v)
    h.setOptionValue("time_limit", max(0.05, clock.left()))
    h.run()
    status = Status.TIMED_OUT
    info = h.getInfo()
    lower = float(info.mip_dual_bound) / problem.cost_scale if np.isfinite(info.mip_dual_bound) else None
    if info.primal_solution_status == 2:
        choice = choice_from_solution(problem, np.asarray(h.getSolution().col_value))
        if is_valid_choice(egraph, choice):
            reach = reachable_choice(egraph, choice)
            cost = dag_cost(egraph, reach)
            if cost < best_cost:
                best_choice, best_cost = reach, cost
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            status = Status.OPTIMAL
    else:
        status = Status.TIMED_OUT if h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit else Status.FALLBACK
    return make_selection(
        egraph,
        best_choice,
        status=status,
        extractor="tensat-ilp" if order_vars == "real" else "tensat-ilp-int",
        seconds=clock.elapsed(),
        lower_bound=lower,
        info={"order_rows": n_order, "order_vars": order_vars, "prune": dict(problem.pruned.stats), "greedy_cost": greedy.cost},
    )


def _warm_vector(problem: Problem, choice: np.ndarray, n_cols: int) -> np.ndarray:
    """x, y from the choice; t_c = height of c in the chosen DAG (leaves 0); other t free (0).

    Relies on order_model placing t columns right after x and y, in sorted class order."""
    v = solution_vector(problem, choice, n_cols)
    eg = problem.egraph
    uc = eg.unique_children
    ordered = sorted({c for e in class_edges(problem) if e[0] != e[1] for c in e})
    first = problem.n_cols
    height: dict[int, int] = {}
    for c in postorder(eg, choice):
        height[c] = 1 + max((height[k] for k in uc[int(choice[c])]), default=-1)
    for i, c in enumerate(ordered):
        v[first + i] = float(height.get(c, 0))
    return v


"""The default extractor: an exact MIP for DAG cost, solved by HiGHS, with lazy cycle cuts.

Model (after `prune`): x_n, y_c binary; sum of x over class c = y_c; x_n <= y_k for each distinct
child class k of n; roots have y = 1; minimise sum cost_n x_n. Acyclicity is not modelled up
front: most optimal answers have no cycle, so we solve, look for cycles among the classes the
roots reach, add a cut per short cycle found (class-based: of the nodes closing the cycle, at most
len-1), and re-solve from the best valid answer so far, until the answer is acyclic or time is up.
Every solve is a relaxation of the acyclic problem, so its dual bound is a valid lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.mip import (
    Clock,
    Incumbent,
    Problem,
    Rows,
    base_model,
    choice_from_solution,
    cycle_cut,
    make_problem,
    needed_cycles,
    new_highs,
    repair_incumbent,
    solution_vector,
    start_incumbent,
)
from eqsat.extract.selection import Selection, Status, dag_cost, make_selection, reachable_choice


@dataclass(frozen=True)
class IlpOptions:
    gap: float = 1e-6  # relative MIP gap at which HiGHS may stop
    threads: int = 1
    max_rounds: int = 10_000


def ilp(egraph: EGraphData, time_limit: float = 60.0, options: IlpOptions = IlpOptions()) -> Selection:
    """Best DAG-cost extraction HiGHS can prove (or find) within the time limit."""
    clock = Clock(time_limit)
    problem = make_problem(egraph)
    greedy, warm = start_incumbent(problem)
    best = min((greedy, warm), key=lambda i: i.cost)
    info: dict[str, Any] = {"prune": dict(problem.pruned.stats), "greedy_cost": greedy.cost}
    h = new_highs(clock.left(), options.threads, options.gap)
    base_model(problem, h)
    info["setup_s"] = clock.elapsed()
    lower = -np.inf
    rounds: list[dict[str, Any]] = []
    status = Status.FALLBACK
    warm_start = warm
    n_cuts = 0
    while clock.left() > 0.05 and len(rounds) < options.max_rounds:
        h.setOptionValue("time_limit", max(0.05, clock.left()))
        v = solution_vector(problem, warm_start.choice, h.getNumCol())
        h.setSolution(len(v), np.arange(len(v), dtype=np.int32), v)
        t = clock.elapsed()
        h.run()
        model_status = h.getModelStatus()
        hinfo = h.getInfo()
        bound = float(hinfo.mip_dual_bound)
        if np.isfinite(bound):
            lower = max(lower, bound)
        round_info: dict[str, Any] = {
            "status": h.modelStatusToString(model_status),
            "seconds": clock.elapsed() - t,
            "objective": float(hinfo.objective_function_value),
            "bound": bound,
            "nodes": int(hinfo.mip_node_count),
        }
        rounds.append(round_info)
        if hinfo.primal_solution_status != 2:  # no feasible solution: keep the incumbent
            status = Status.TIMED_OUT if model_status == highspy.HighsModelStatus.kTimeLimit else Status.FALLBACK
            break
        choice = choice_from_solution(problem, np.asarray(h.getSolution().col_value))
        cycles = needed_cycles(problem, choice)
        round_info["cycles"] = len(cycles)
        if not cycles:
            reach = reachable_choice(egraph, choice)
            cand = Incumbent(reach, dag_cost(egraph, reach), "ilp")
            if cand.cost < best.cost:
                best = cand
            status = Status.OPTIMAL if model_status == highspy.HighsModelStatus.kOptimal else Status.TIMED_OUT
            break
        rows = Rows()
        for cyc in cycles:
            cycle_cut(problem, cyc, rows)
        rows.pass_to(h)
        n_cuts += len(rows)
        fixed = repair_incumbent(problem, choice)
        if fixed.cost < best.cost:
            best = fixed
        warm_start = best if best.source != "greedy" or best is warm else warm
        status = Status.TIMED_OUT
    info.update(rounds=rounds, cuts=n_cuts, best_source=best.source)
    return make_selection(
        egraph,
        best.choice,
        status=status,
        extractor="ilp",
        seconds=clock.elapsed(),
        lower_bound=float(lower) if np.isfinite(lower) else None,
        info=info,
    )

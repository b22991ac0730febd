"""The MIP solve loop shared by `ilp` and `ilp-reduced` (the model is described in ilp.py).

A callback watches every improving answer HiGHS finds: an acyclic one is kept as a valid
incumbent; a cyclic one interrupts the solve at once, its cycles become cuts and the solve starts
again from the best valid answer, rather than letting HiGHS prune its tree against a cost that no
valid answer reaches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from eqsat.extract.mip import (
    Clock,
    Incumbent,
    Problem,
    Rows,
    base_model,
    choice_from_solution,
    cycle_cut,
    needed_cycles,
    new_highs,
    repair_incumbent,
    short_cycles,
    solution_vector,
    start_incumbent,
)
from eqsat.extract.selection import Selection, Status, dag_cost, make_selection, reachable_choice


MIP_FEASIBILITY_TOLERANCE = 1e-6  # HiGHS's default `mip_feasibility_tolerance`


@dataclass(frozen=True)
class NodeBudget:
    """One knapsack row: the chosen nodes' weights add up to at most `limit` (e.g. per-device
    memory of a parallel plan). `weight` is per e-graph node, in the loader's numbering."""

    weight: tuple[float, ...]
    limit: float

    def allows(self, choice: np.ndarray) -> bool:
        picked = choice[choice >= 0]
        # HiGHS's MIP accepts a row within its MIP feasibility tolerance (1e-6, absolute; 1e-7 is the
        # LP's): so does this, or a solution the solver calls optimal would count as over its budget
        slack = max(1e-9 * abs(self.limit), MIP_FEASIBILITY_TOLERANCE)
        return float(np.sum(np.asarray(self.weight)[picked])) <= self.limit + slack


@dataclass(frozen=True)
class IlpOptions:
    gap: float = 1e-6  # relative MIP gap at which HiGHS may stop
    threads: int = 1
    max_rounds: int = 10_000
    # Kept nodes from which `ilp` runs a restricted first phase (ilp-reduced) for a warm start.
    # Off by default: measured on Tensat, the full model with short-cycle cuts does better alone.
    reduce_above: int = 1 << 62
    reduce_share: float = 0.3  # of the time limit, for that phase
    short_cycles: int = 3  # cut every class cycle up to this length before the first solve
    # Largest strongly connected class region from which `ilp` first improves its start by
    # large-neighbourhood search (lns.py), with this share of the time; the full MIP then gets the
    # rest (for the bound, and to finish). Measured: nasrnn (17k-class region) needs it; bert,
    # resnet50, vgg (regions < 2k) and nasneta are solved or at best known by the full MIP alone.
    lns_above: int = 5000
    lns_share: float = 0.5
    lns_seed: int = 0
    overrun_share: float = 0.15  # of the time left, held back from each HiGHS run (see solve_lazy)
    overrun_cap: float = 5.0
    # HiGHS's LP presolve does not check the time limit: on a 200 000-class chain the reduced
    # phase's LP took 103 s of a 28 s limit. Above this many columns it is solved without.
    lp_presolve_max_cols: int = 100_000
    budgets: tuple[NodeBudget, ...] = ()  # knapsack rows (e.g. memory, bytes moved); answers over one are never returned


class _Watch:
    """Looks at every improving solution during a solve: an acyclic one is a valid incumbent; a
    cyclic one stops the solve at once (its cycles become cuts) instead of letting HiGHS prune
    its tree against a value no valid answer can reach."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.found: Incumbent | None = None
        self.reset()

    def reset(self) -> None:
        self.cycles: list[list[int]] = []
        self.cyclic_choice: np.ndarray | None = None

    def on_solution(self, event: Any) -> None:
        x = np.asarray(event.data_out.mip_solution)
        if len(x) < self.problem.n_cols or self.cycles:
            return
        choice = choice_from_solution(self.problem, x)
        cycles = needed_cycles(self.problem, choice)
        if cycles:
            self.cycles = cycles
            self.cyclic_choice = choice
            return
        eg = self.problem.egraph
        reach = reachable_choice(eg, choice)
        cost = dag_cost(eg, reach)
        if self.found is None or cost < self.found.cost:
            self.found = Incumbent(reach, cost, "ilp")

    def on_interrupt(self, event: Any) -> None:
        event.interrupt(bool(self.cycles))  # HiGHS keeps the flag between runs: always set it


def within_budgets(budgets: tuple[NodeBudget, ...], choice: np.ndarray) -> bool:
    return all(b.allows(choice) for b in budgets)


def _fits(options: IlpOptions, incumbent: Incumbent) -> bool:
    return within_budgets(options.budgets, incumbent.choice)


def _budget_rows(problem: Problem, h: highspy.Highs, budgets: tuple[NodeBudget, ...], best: Incumbent) -> Incumbent:
    """Add the knapsack rows; a start over a budget stays only as a warm start, priced infinite."""
    rows = Rows()
    cols = list(range(len(problem.nodes)))
    for budget in budgets:
        rows.add(cols, [float(budget.weight[n]) for n in problem.nodes.tolist()], -np.inf, float(budget.limit))
    rows.pass_to(h)
    fits = within_budgets(budgets, best.choice)
    return best if fits else Incumbent(best.choice, float("inf"), best.source + "-over-budget")


def solve_lazy(
    problem: Problem,
    clock: Clock,
    options: IlpOptions,
    name: str,
    exact: bool = True,
    lower_bound: float | None = None,
    start: Incumbent | None = None,
    known_cycles: list[list[int]] | None = None,
) -> tuple[Selection, list[list[int]]]:
    """Solve the model of `problem` with lazy cycle cuts. With exact=False the problem is a
    restriction (some nodes left out), so its optimum proves nothing and its dual bound is no
    bound: `lower_bound` (from elsewhere) is reported instead. Also returns the cycles cut, which
    are valid cuts for any model of the same e-graph."""
    egraph = problem.egraph
    greedy, warm = start_incumbent(problem, start, deadline=clock.deadline(0.6))
    best = min((greedy, warm), key=lambda i: (not _fits(options, i), i.cost))
    info: dict[str, Any] = {"prune": dict(problem.pruned.stats), "start_cost": greedy.cost}
    if start is None and time.perf_counter() < clock.deadline(0.6):
        info["greedy_choice"] = greedy.choice  # not hurried: greedy-dag's own answer, for callers that want both
    h = new_highs(clock.left(), options.threads, options.gap)
    base_model(problem, h)
    if options.budgets:
        best = _budget_rows(problem, h, options.budgets, best)
    all_cycles: list[list[int]] = []
    known = list(known_cycles or [])
    if options.short_cycles >= 2:
        known += short_cycles(problem, options.short_cycles, deadline=clock.deadline(0.4))
    if known:
        rows = Rows()
        seen: set[tuple[int, ...]] = set()
        for cyc in known:
            i = cyc.index(min(cyc))
            key = tuple(cyc[i:] + cyc[:i])  # the same cycle from any start
            if key not in seen and all(problem.pruned.class_mask[c] for c in cyc):
                seen.add(key)
                cycle_cut(problem, cyc, rows)
                all_cycles.append(cyc)
        rows.pass_to(h)
    info["initial_cuts"] = len(all_cycles)
    info["setup_s"] = clock.elapsed()
    lower = -np.inf
    rounds: list[dict[str, Any]] = []
    status = Status.TIMED_OUT  # unless a solve below says otherwise
    warm_start = warm
    n_cuts = 0
    watch = _Watch(problem)
    h.cbMipImprovingSolution.subscribe(watch.on_solution)
    h.cbMipInterrupt.subscribe(watch.on_interrupt)
    while clock.left() > 0.05 and len(rounds) < options.max_rounds:
        watch.reset()
        # HiGHS checks its limit only between root separation rounds, which on nasrnn's full
        # model overran a 12 s limit by 2.3 s: ask for less than is left.
        left = clock.left()
        h.setOptionValue("time_limit", max(0.05, left - min(options.overrun_cap, options.overrun_share * left)))
        v = solution_vector(problem, warm_start.choice, h.getNumCol())
        h.setSolution(len(v), np.arange(len(v), dtype=np.int32), v)
        t = clock.elapsed()
        h.run()
        model_status = h.getModelStatus()
        hinfo = h.getInfo()
        bound = float(hinfo.mip_dual_bound) / problem.cost_scale
        if np.isfinite(bound):
            lower = max(lower, bound)
        round_info: dict[str, Any] = {
            "status": h.modelStatusToString(model_status),
            "seconds": clock.elapsed() - t,
            "objective": float(hinfo.objective_function_value) / problem.cost_scale,
            "bound": bound,
            "nodes": int(hinfo.mip_node_count),
        }
        rounds.append(round_info)
        if watch.found is not None and watch.found.cost < best.cost and _fits(options, watch.found):
            best = watch.found
        if watch.cycles:  # stopped early at a cyclic incumbent: cut it off and go again
            round_info["cycles"] = len(watch.cycles)
            round_info["interrupted"] = True
            rows = Rows()
            for cyc in watch.cycles:
                cycle_cut(problem, cyc, rows)
            all_cycles.extend(watch.cycles)
            rows.pass_to(h)
            n_cuts += len(rows)
            assert watch.cyclic_choice is not None
            fixed = repair_incumbent(problem, watch.cyclic_choice)
            if fixed.cost < best.cost and _fits(options, fixed):
                best = fixed
            warm_start = best if best.source != "greedy" or best is warm else warm
            status = Status.TIMED_OUT
            continue
        if hinfo.primal_solution_status != 2:  # no feasible solution: keep the incumbent
            status = Status.TIMED_OUT if model_status == highspy.HighsModelStatus.kTimeLimit else Status.FALLBACK
            break
        choice = choice_from_solution(problem, np.asarray(h.getSolution().col_value))
        cycles = needed_cycles(problem, choice)
        round_info["cycles"] = len(cycles)
        if not cycles:
            reach = reachable_choice(egraph, choice)
            cand = Incumbent(reach, dag_cost(egraph, reach), "ilp")
            if cand.cost < best.cost and _fits(options, cand):
                best = cand
            status = Status.OPTIMAL if model_status == highspy.HighsModelStatus.kOptimal else Status.TIMED_OUT
            break
        rows = Rows()
        for cyc in cycles:
            cycle_cut(problem, cyc, rows)
        all_cycles.extend(cycles)
        rows.pass_to(h)
        n_cuts += len(rows)
        fixed = repair_incumbent(problem, choice)
        if fixed.cost < best.cost and _fits(options, fixed):
            best = fixed
        warm_start = best if best.source != "greedy" or best is warm else warm
        status = Status.TIMED_OUT
    info.update(rounds=rounds, cuts=n_cuts, best_source=best.source, solver_bound=lower)
    if not exact:
        lower = lower_bound if lower_bound is not None else -np.inf
        if status == Status.OPTIMAL and not best.cost <= lower * (1 + options.gap) + 1e-12:
            status = Status.FEASIBLE
    sel = make_selection(
        egraph,
        best.choice,
        status=status,
        extractor=name,
        seconds=clock.elapsed(),
        lower_bound=float(lower) if np.isfinite(lower) else None,
        info=info,
    )
    return sel, all_cycles

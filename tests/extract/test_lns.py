"""Large-neighbourhood search: never worse than its start, always valid, exact when the
neighbourhood is the whole problem."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from eqsat.extract import check_selection
from eqsat.extract.bottom_up import bottom_up_tree_costs
from eqsat.extract.lns import LnsOptions, improve, neighbourhood, sub_problem
from eqsat.extract.mip import Clock, Incumbent, make_problem
from eqsat.extract.selection import dag_cost, reachable_choice

from .helpers import brute_force, egraph
from .test_extractors import random_egraph


def _bottom_up_start(eg):  # type: ignore[no-untyped-def]
    """A valid but DAG-suboptimal start (tree-cost optimal)."""
    choice = reachable_choice(eg, bottom_up_tree_costs(eg)[1])
    return Incumbent(choice, dag_cost(eg, choice), "bottom-up")


def test_improves_a_shared_subgraph() -> None:
    # Bottom-up takes each root's cheap private leaf (tree cost 2+2); sharing S costs 1+1+1.5.
    eg = egraph(
        {"R1": [(1, ["S"]), (0, ["T1"])], "R2": [(1, ["S"]), (0, ["T2"])], "S": [(1.5, [])], "T1": [(2, [])], "T2": [(2, [])]},
        ["R1", "R2"],
    )
    problem = make_problem(eg)
    start = _bottom_up_start(eg)
    assert start.cost == 4
    result = improve(problem, start, Clock(10), LnsOptions(size=100, seeds=10, rounds=5))
    assert result.best.cost == 3.5
    assert check_selection(eg, result.best.choice) == []


def test_sub_problem_keeps_the_incumbent_and_fixes_the_rest() -> None:
    eg = egraph({"A": [(1, ["B"]), (5, [])], "B": [(1, []), (0, ["C"])], "C": [(1, []), (2, [])]}, ["A"])
    problem = make_problem(eg)
    start = _bottom_up_start(eg)
    sub = sub_problem(problem, start.choice, {eg.class_index["C"]})
    kept = set(sub.nodes.tolist())
    assert set(start.choice[start.choice >= 0].tolist()) <= kept
    # B is not free: only its current node is allowed.
    assert [n for n in eg.nodes_of(eg.class_index["B"]).tolist() if n in kept] == [start.choice[eg.class_index["B"]]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph())
def test_never_worse_always_valid(case: dict) -> None:
    eg = egraph(case["spec"], case["roots"])
    best = brute_force(eg)
    if best is None:
        return
    problem = make_problem(eg)
    start = _bottom_up_start(eg)
    small = improve(problem, start, Clock(10), LnsOptions(size=2, min_size=1, seeds=1, rounds=3))
    assert check_selection(eg, small.best.choice) == []
    assert best - 1e-9 <= small.best.cost <= start.cost + 1e-12
    assert small.best.cost == pytest.approx(dag_cost(eg, small.best.choice))
    # Every used class a seed and no size limit: the neighbourhood is the whole problem.
    whole = improve(problem, start, Clock(10), LnsOptions(size=1000, seeds=1000, rounds=2))
    assert whole.best.cost == pytest.approx(best)


def test_neighbourhood_is_bounded_and_deterministic() -> None:
    import random

    children = [[1, 2], [3], [3, 4], [], []]
    a = neighbourhood(children, [0], 3, random.Random(0))
    b = neighbourhood(children, [0], 3, random.Random(0))
    assert a == b and len(a) == 3 and 0 in a
    assert neighbourhood(children, [0], 100, random.Random(1)) == {0, 1, 2, 3, 4}
    assert np.all(np.asarray(sorted(a)) < 5)

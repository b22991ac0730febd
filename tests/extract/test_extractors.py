"""Every strategy on hand-made and random e-graphs, against a brute-force optimum."""

from __future__ import annotations

import itertools
from pathlib import Path
from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eqsat.errors import ExtractionError
from eqsat.extract import EXTRACTORS, EGraphData, ExtractRequest, Status, check_selection, extract, load_egraph
from eqsat.extract.ilp import hinted_start, ilp
from eqsat.extract.lazy import IlpOptions, NodeBudget
from eqsat.extract.mip import make_problem
from eqsat.extract.selection import dag_cost, reachable_choice

from .helpers import brute_force, egraph

EXACT = ("ilp", "tensat-ilp", "tensat-ilp-int")
ALL = tuple(EXTRACTORS)
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "egraphs"


@pytest.mark.parametrize("name", ALL)
def test_cycle_must_be_avoided(name: str) -> None:
    # A = f(B) | expensive leaf; B = g(A) | h(C); C = leaf. Choosing f and g is a cycle.
    eg = egraph({"A": [(1, ["B"]), (10, [])], "B": [(1, ["A"]), (1, ["C"])], "C": [(1, [])]}, ["A"])
    sel = extract(eg, name, 10)
    assert check_selection(eg, sel) == []
    if name in EXACT:
        assert sel.dag_cost == 3 and sel.status == Status.OPTIMAL
        assert sel.as_ids(eg) == {"A": "A.0", "B": "B.1", "C": "C.0"}


@pytest.mark.parametrize("name", ALL)
def test_several_roots_share(name: str) -> None:
    # Two roots that can share an expensive S, or each take its own cheaper-looking path.
    eg = egraph(
        {
            "R1": [(1, ["S"]), (1, ["T1"])],
            "R2": [(1, ["S"]), (1, ["T2"])],
            "S": [(5, [])],
            "T1": [(3, [])],
            "T2": [(3, [])],
        },
        ["R1", "R2"],
    )
    sel = extract(eg, name, 10)
    assert check_selection(eg, sel) == []
    assert sel.dag_cost >= 7
    if name in EXACT:
        assert sel.dag_cost == 7  # S shared: 1 + 1 + 5
        assert sel.tree_cost == 12


@pytest.mark.parametrize("name", ALL)
def test_class_with_only_cyclic_nodes_is_avoided(name: str) -> None:
    # D's only node needs D itself (through E); A can avoid D.
    eg = egraph(
        {"A": [(0, ["D"]), (2, ["C"])], "D": [(0, ["E"])], "E": [(0, ["D"])], "C": [(0, [])]}, ["A"]
    )
    sel = extract(eg, name, 10)
    assert check_selection(eg, sel) == []
    assert sel.dag_cost == 2


@pytest.mark.parametrize("name", ALL)
def test_root_without_acyclic_term(name: str) -> None:
    eg = egraph({"A": [(1, ["B"])], "B": [(1, ["A"])]}, ["A"])
    with pytest.raises(ExtractionError, match="no acyclic term"):
        extract(eg, name, 10)


@pytest.mark.parametrize("name", ALL)
def test_zero_costs(name: str) -> None:
    eg = egraph({"A": [(0, ["B", "B"]), (0, ["A"])], "B": [(0, [])]}, ["A"])
    sel = extract(eg, name, 10)
    assert check_selection(eg, sel) == [] and sel.dag_cost == 0


def test_unknown_extractor() -> None:
    eg = egraph({"A": [(1, [])]}, ["A"])
    with pytest.raises(ExtractionError, match="unknown extractor"):
        extract(eg, "nope")


@st.composite
def random_egraph(draw: st.DrawFn, costs: tuple[float, ...] = (0.0, 1.0, 1.0, 2.0, 3.5)) -> dict:
    n = draw(st.integers(1, 5))
    names = [f"c{i}" for i in range(n)]
    spec = {}
    for c in names:
        k = draw(st.integers(1, 3))
        spec[c] = [
            (draw(st.sampled_from(costs)), draw(st.lists(st.sampled_from(names), max_size=3)))
            for _ in range(k)
        ]
    roots = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2))
    return {"spec": spec, "roots": roots}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph())
def test_against_brute_force(case: dict) -> None:
    eg = egraph(case["spec"], case["roots"])
    best = brute_force(eg)
    for name in ALL:
        if best is None:
            with pytest.raises(ExtractionError):
                extract(eg, name, 10)
            continue
        sel = extract(eg, name, 10)
        assert check_selection(eg, sel) == [], name
        assert sel.dag_cost >= best - 1e-9, name
        if name in EXACT:
            assert sel.dag_cost == pytest.approx(best), name
            assert sel.status == Status.OPTIMAL
            assert sel.lower_bound is not None and sel.lower_bound <= best + 1e-9


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph(costs=(0.0, 0.0, 0.0, 1.0, 2.0)))
def test_free_classes_keep_the_optimum(case: dict) -> None:
    """Mostly zero-cost nodes (weights and what is folded from them): `prune` keeps one zero-cost
    witness per free class, and the ILP's optimum is still brute force's."""
    eg = egraph(case["spec"], case["roots"])
    best = brute_force(eg)
    assume(best is not None)
    sel = ilp(eg, 10)
    assert check_selection(eg, sel) == []
    assert sel.status == Status.OPTIMAL and sel.dag_cost == pytest.approx(best)


@pytest.mark.skipif(not (DATA / "tensat" / "vgg.json").exists(), reason="shared data not present")
def test_greedy_on_vgg_is_valid() -> None:
    eg = load_egraph(DATA / "tensat" / "vgg.json")
    sel = extract(eg, "greedy-dag")
    assert check_selection(eg, sel) == []
    assert sel.dag_cost <= 4.8525


def test_ilp_proves_optimality_whatever_thread_counts_came_before() -> None:
    """HiGHS sizes one scheduler per process at its first solve; a later solve with another
    thread count used to return no answer, and `ilp` fell back to its start."""
    eg = egraph({"A": [(1, ["B"]), (10, [])], "B": [(1, ["A"]), (1, ["C"])], "C": [(1, [])]}, ["A"])
    runs = [ilp(eg, 10, IlpOptions(threads=t, short_cycles=0)) for t in (1, 2, 1)]
    assert [(s.status, s.dag_cost) for s in runs] == [(Status.OPTIMAL, 3.0)] * 3


@pytest.mark.skipif(not (DATA / "egg").exists(), reason="shared data not present")
@pytest.mark.parametrize("name", ["bottom-up", "greedy-dag", "ilp"])
def test_small_benchmark_files(name: str) -> None:
    for path in sorted((DATA / "egg").glob("math_*.json")):
        eg = load_egraph(path)
        sel = extract(eg, name, 5)
        assert check_selection(eg, sel) == [], path


def _valid_choices(eg: EGraphData) -> list[np.ndarray]:
    options = [eg.nodes_of(c).tolist() for c in range(eg.n_classes)]
    return [np.asarray(c) for c in itertools.product(*options) if not check_selection(eg, np.asarray(c))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph(), st.randoms(use_true_random=False))
def test_a_valid_hint_is_never_beaten_by_the_start(case: dict, rnd: Random) -> None:
    """The MIP starts from the cheapest of greedy and the hints; invalid hints are left out."""
    eg = egraph(case["spec"], case["roots"])
    valid = _valid_choices(eg)
    assume(valid)
    hint = rnd.choice(valid)
    hint_cost = dag_cost(eg, reachable_choice(eg, hint))
    start = hinted_start(make_problem(eg), [hint, np.full(eg.n_classes, -1)])
    assert start is not None and check_selection(eg, start.choice) == []
    assert start.cost <= hint_cost + 1e-9
    assert ilp(eg, 10, hints=[hint]).dag_cost <= hint_cost + 1e-9
    best = min(valid, key=lambda c: dag_cost(eg, reachable_choice(eg, c)))
    assert hinted_start(make_problem(eg), [best]).cost == pytest.approx(brute_force(eg))  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph(), st.randoms(use_true_random=False))
def test_budget_rows_give_the_best_choice_within_every_budget(case: dict, rnd: Random) -> None:
    """Two knapsack rows (say memory and bytes moved): the MIP's answer is the cheapest valid choice
    within both, by brute force; a hint within both is a start it never does worse than."""
    eg = egraph(case["spec"], case["roots"])
    valid = [reachable_choice(eg, c) for c in _valid_choices(eg)]
    assume(valid)
    rows = [tuple(rnd.uniform(0, 3) for _ in range(eg.n_nodes)) for _ in range(2)]
    picks = [rnd.choice(valid) for _ in rows]  # each row's limit: some valid choice's weight
    limits = [float(np.sum(np.asarray(w)[c[c >= 0]])) for w, c in zip(rows, picks)]
    budgets = tuple(NodeBudget(w, lim) for w, lim in zip(rows, limits))
    fitting = [c for c in valid if all(b.allows(c) for b in budgets)]
    assume(fitting)
    best = min(dag_cost(eg, c) for c in fitting)
    sel = ilp(eg, 10, IlpOptions(budgets=budgets), hints=[rnd.choice(fitting)])
    assert check_selection(eg, sel) == []
    assert all(b.allows(sel.choice) for b in budgets)
    assert sel.dag_cost == pytest.approx(best)


@pytest.mark.parametrize("name", [n for n, e in EXTRACTORS.items() if not e.rows])
def test_strategies_that_cannot_honour_rows_refuse_them(name: str) -> None:
    eg = egraph({"A": [(1, ["B"]), (3, [])], "B": [(1, [])]}, ["A"])
    with pytest.raises(ExtractionError, match="cannot honour knapsack rows") as err:
        extract(eg, name, 10, request=ExtractRequest(rows=(NodeBudget((1.0,) * eg.n_nodes, 1.0),)))
    assert "\n" not in str(err.value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph(), st.randoms(use_true_random=False))
def test_every_strategy_is_never_worse_than_a_valid_start(case: dict, rnd: Random) -> None:
    """Starts travel through the registry's request; each strategy keeps a cheaper valid one."""
    eg = egraph(case["spec"], case["roots"])
    valid = _valid_choices(eg)
    assume(valid)
    start = rnd.choice(valid)
    start_cost = dag_cost(eg, reachable_choice(eg, start))
    for name in ALL:
        sel = extract(eg, name, 10, request=ExtractRequest(starts=(start, np.full(eg.n_classes, -1))))
        assert check_selection(eg, sel) == [] and sel.dag_cost <= start_cost + 1e-9, name


def test_a_row_met_within_the_mips_tolerance_is_met() -> None:
    """A node of weight 1e-6 under a budget of 0: HiGHS's MIP takes it (its feasibility tolerance is
    1e-6), so the row must allow what the solver calls optimal (hypothesis found this: the row's
    slack was the LP's 1e-7, and the answer counted as over its budget)."""
    eg = egraph({"c0": [(0.0, ["c0"]), (0.0, []), (1.0, [])], "c1": [(0.0, []), (0.0, [])]}, ["c0"])
    row = NodeBudget((0.0, 1e-6, 0.0, 0.0, 0.0), 0.0)
    sel = extract(eg, "ilp", 10, request=ExtractRequest(rows=(row,)))
    assert row.allows(sel.choice) and sel.dag_cost == 0.0
    assert not NodeBudget((0.0, 1e-5, 0.0, 0.0, 0.0), 0.0).allows(sel.choice)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_egraph(), st.randoms(use_true_random=False))
def test_rows_travel_through_the_registry(case: dict, rnd: Random) -> None:
    """`extract(..., request=ExtractRequest(rows=...))` is the ILP with those knapsack rows."""
    eg = egraph(case["spec"], case["roots"])
    valid = [reachable_choice(eg, c) for c in _valid_choices(eg)]
    assume(valid)
    weight = tuple(rnd.uniform(0, 3) for _ in range(eg.n_nodes))
    pick = rnd.choice(valid)
    row = NodeBudget(weight, float(np.sum(np.asarray(weight)[pick[pick >= 0]])))
    best = min(dag_cost(eg, c) for c in valid if row.allows(c))
    sel = extract(eg, "ilp", 10, request=ExtractRequest(rows=(row,)))
    assert row.allows(sel.choice) and sel.dag_cost == pytest.approx(best)

"""The TASO-style baseline: matching parsed rules on concrete graphs, rewriting, and the search."""

from __future__ import annotations

import numpy as np
import pytest

from eqsat.cost import cost_model, graph_cost
from eqsat.ir import Activation, GraphBuilder
from eqsat.pipeline import numerics_match
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from experiments.taso_search import (
    TasoOptions,
    apply_match,
    binary_concats,
    find_matches,
    graph_key,
    seconds_to_cost,
    taso_search,
)


def _rule(text: str):  # type: ignore[no-untyped-def]
    (rule,) = parse_rule_text(text)
    return rule


def test_two_output_rule_matches_every_ordered_pair_and_rewrites_correctly() -> None:
    g = binary_concats(_block_graph())
    rule = next(r for r in library_rules(["conv_merges"]) if r.name == "conv-relu-merge-enlarge")
    matches = list(find_matches(rule, g))
    # enlarge needs the second kernel at least as large: (1x1, 3x3), (1x1, 1x1) both ways, (1x1 -> 3x3) twice
    assert len(matches) == 4
    for m in matches:
        new = apply_match(g, m)
        assert new is not None
        ok, _ = numerics_match(g, new)
        assert ok
        assert new.op_counts()["conv2d"] == 2


def _block_graph():  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    x = b.input("x", (1, 8, 6, 6))
    a = b.conv2d(x, b.weight("w1", (4, 8, 1, 1)), act=Activation.RELU)
    c = b.conv2d(x, b.weight("w3", (6, 8, 3, 3)), act=Activation.RELU)
    d = b.conv2d(x, b.weight("w5", (2, 8, 1, 1)), act=Activation.RELU)
    return b.build([b.concat(1, a, c, d)])


def test_ill_typed_right_side_and_failed_conditions_are_not_applied() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 5))
    # a grouped conv (2 groups): the guarded merge must not match it
    p = b.conv2d(x, b.weight("g1", (4, 2, 1, 1)))
    q = b.conv2d(x, b.weight("g2", (4, 2, 1, 1)))
    g = b.build([b.concat(1, p, q)])
    guarded = next(r for r in library_rules(["conv_merges"]) if r.name == "concat-conv-enlarge")
    assert list(find_matches(guarded, g)) == []
    # a rule whose right side is ill-typed here (matmul of 4-D tensors) yields no graph
    bad = _rule("(concat 1 4 ?a ?b) => (matmul 0 ?a ?b)")
    (m,) = list(find_matches(bad, g))
    assert apply_match(g, m) is None


def test_a_two_output_rule_that_would_make_a_cycle_is_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    r1 = b.relu(x)
    r2 = b.relu(r1)  # r2 reads r1: merging them into one relu of a concat makes a cycle
    g = b.build([r2])
    rule = _rule("(relu ?a) ; (relu ?b) => (split_0 (split 0 (relu (concat 0 2 ?a ?b)))) ; "
                 "(split_1 (split 0 (relu (concat 0 2 ?a ?b))))")
    results = [apply_match(g, m) for m in find_matches(rule, g)]
    assert results and all(r is None for r in results)


def test_graph_key_ignores_node_order() -> None:
    def build(order: bool):  # type: ignore[no-untyped-def]
        b = GraphBuilder()
        x = b.input("x", (2, 2))
        w, v = b.weight("w", (2, 2)), b.weight("v", (2, 2))
        first, second = (b.matmul(x, w), b.matmul(x, v)) if order else (b.matmul(x, v), b.matmul(x, w))
        return b.build([first + second] if order else [second + first])
    assert graph_key(build(True)) == graph_key(build(False))


def test_search_finds_the_brute_force_optimum_of_a_small_block() -> None:
    """On the block, every sequence of up to three rewrites is enumerated; the search must match the best."""
    g = _block_graph()
    rules = library_rules(["conv_merges"])
    costs = cost_model("roofline", device="h100")
    best = graph_cost(g, costs)
    frontier = [binary_concats(g)]
    seen = {graph_key(frontier[0])}
    for _ in range(3):
        nxt = []
        for h in frontier:
            for m in (m for r in rules for m in find_matches(r, h)):
                new = apply_match(h, m)
                if new is not None and graph_key(new) not in seen:
                    seen.add(graph_key(new))
                    nxt.append(new)
                    best = min(best, graph_cost(new, costs))
        frontier = nxt
    result = taso_search(g, rules, costs, TasoOptions(budget=200, seconds=60))
    assert result.cost_best == pytest.approx(best)
    assert result.cost_best < result.cost_original
    assert numerics_match(g, result.best)[0]
    assert sum(result.rules_fired.values()) >= 1
    assert [c for _, c in result.trace] == sorted((c for _, c in result.trace), reverse=True)


def test_search_respects_its_budget() -> None:
    g = _block_graph()
    result = taso_search(g, library_rules(["conv_merges"]), cost_model("roofline", device="h100"),
                         TasoOptions(budget=1, seconds=60))
    assert result.popped == 1 and result.stop_reason in ("budget", "exhausted")
    assert np.isfinite(result.cost_best)
    assert result.trace[0][1] == result.cost_original


# --- the incremental search against the whole-graph one ---------------------------------------------

def _reference_search(graph, rules, costs, budget, alpha=1.05):  # type: ignore[no-untyped-def]
    """The search before it was incremental: every candidate rebuilt with `apply_match`, hashed with
    `graph_key` and costed with `graph_cost` (deduplicated when enqueued, as TASO does)."""
    import heapq
    import itertools

    best_cost = graph_cost(graph, costs)
    best = graph
    seed = binary_concats(graph)
    seen = {graph_key(seed)}
    counter = itertools.count()
    bound = graph_cost(seed, costs)  # TASO's bestCost: from the graph searched, updated on pop
    queue = [(bound, next(counter), seed)]
    popped = 0
    trace = [best_cost]
    while queue and popped < budget:
        cost, _, g = heapq.heappop(queue)
        popped += 1
        bound = min(bound, cost)
        if cost < best_cost:
            best, best_cost = g, cost
            trace.append(best_cost)
        threshold = alpha * bound
        for rule in rules:
            for match in find_matches(rule, g):
                new = apply_match(g, match)
                if new is None or graph_key(new) in seen:
                    continue
                new_cost = graph_cost(new, costs)
                if new_cost < best_cost:
                    best, best_cost = new, new_cost
                    trace.append(best_cost)
                if new_cost < threshold:  # TASO hashes a graph when it enqueues it
                    seen.add(graph_key(new))
                    heapq.heappush(queue, (new_cost, next(counter), new))
    return best, best_cost, popped, trace


def _relu_ladder():  # type: ignore[no-untyped-def]
    """Parallel and chained relus, matmuls and concats of equal shapes: two-output merges that are
    cycles, merges whose right side reads the other root's readers, and commuting rewrites."""
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    w1, w2, w3 = b.weight("w1", (8, 8)), b.weight("w2", (8, 8)), b.weight("w3", (8, 8))
    a = b.relu(b.matmul(x, w1))
    c = b.relu(b.matmul(x, w2))
    d = b.relu(b.matmul(a, w3))
    e = b.relu(a + c)
    return b.build([b.concat(1, d, e, c)])


def _commuted_adds():  # type: ignore[no-untyped-def]
    """x+y and y+x under relus: commuting one makes it the other, and its readers merge (hash-consing)."""
    b = GraphBuilder()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 8))
    p, q = b.ewadd(x, y), b.ewadd(y, x)
    return b.build([b.concat(0, b.relu(b.relu(p)), b.relu(b.relu(q)), b.tanh(p))])


def _rules_for(make):  # type: ignore[no-untyped-def]
    from experiments.bench_tensat import bench_rules

    if make is _block_graph:
        return library_rules(["conv_merges"])
    if make is _commuted_adds:
        return [_rule("(ewadd ?a ?b) => (ewadd ?b ?a)"), _rule("(relu (relu ?a)) => (relu ?a)"),
                _rule("(relu ?a) ; (relu ?b) => (split_0 (split 0 (relu (concat 0 2 ?a ?b)))) ; "
                      "(split_1 (split 0 (relu (concat 0 2 ?a ?b))))")]
    return bench_rules(make())


@pytest.mark.parametrize("make, budget", [(_block_graph, 60), (_relu_ladder, 25), (_commuted_adds, 40)])
def test_incremental_search_pops_what_the_whole_graph_search_pops(make, budget) -> None:  # type: ignore[no-untyped-def]
    g = make()
    rules = _rules_for(make)
    costs = cost_model("roofline", device="h100")
    best, best_cost, popped, trace = _reference_search(g, rules, costs, budget)
    result = taso_search(g, rules, costs, TasoOptions(budget=budget, check=True))
    assert result.popped == popped
    assert result.cost_best == pytest.approx(best_cost, rel=1e-12)
    assert [c for _, c in result.trace][:-1] == pytest.approx(trace, rel=1e-12)
    assert graph_key(result.best) == graph_key(best)
    assert result.graphs_per_s > 0


def test_check_mode_on_a_model_with_merges_and_dependent_rewrites() -> None:
    """Every popped graph rebuilt in full must equal the incremental one (key, nodes, cost)."""
    from eqsat.models import build_model
    from experiments.bench_tensat import bench_rules

    g = build_model("nasrnn-small")
    result = taso_search(g, bench_rules(g), cost_model("roofline", device="h100"), TasoOptions(budget=15, check=True))
    assert result.popped == 15 and result.stop_reason == "budget"
    assert result.cost_best <= result.cost_original
    assert numerics_match(g, result.best)[0]


def test_the_time_cap_is_reported_and_seconds_to_cost_reads_the_trace() -> None:
    g = _block_graph()
    costs = cost_model("roofline", device="h100")
    capped = taso_search(g, library_rules(["conv_merges"]), costs, TasoOptions(budget=10_000, seconds=0.0))
    assert capped.stop_reason == "time" and capped.popped == 0
    full = taso_search(g, library_rules(["conv_merges"]), costs, TasoOptions(budget=50))
    assert seconds_to_cost(full, full.cost_original) == 0.0
    assert seconds_to_cost(full, full.cost_best) == full.seconds_to_best
    assert seconds_to_cost(full, full.cost_best * 0.5) is None


def test_exact_costs_do_not_depend_on_the_order_of_the_sum() -> None:
    from experiments.taso_search import _exact, _inexact

    parts = [0.1, 1e-17, 3e-6, 2.5e-12, 7.0]
    assert sum(map(_exact, parts)) == sum(map(_exact, reversed(parts)))
    assert _inexact(sum(map(_exact, parts))) == pytest.approx(sum(parts), rel=1e-15)
    assert _inexact(_exact(float("inf")) + _exact(1.0)) == float("inf")
    assert _inexact(_exact(float("nan"))) == float("inf")


def test_alpha_bounds_the_nested_graph_searched_not_the_flat_input() -> None:
    """A 6-way concat nested as TASO's binary concats adds four kernels (1.5x the input's cost under
    the roofline). TASO's alpha is relative to the graph it searches: with the bound taken from the
    flat input, every child of the first graph was over alpha and the search stopped after one pop."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (4, 8)) for i in range(6)]
    g = b.build([b.concat(1, *(b.relu(x) for x in xs))])
    costs = cost_model("roofline", device="h100")
    assert graph_cost(binary_concats(g), costs) > 1.05 * graph_cost(g, costs)
    rules = [_rule("(concat 1 2 (relu ?a) (relu ?b)) => (relu (concat 1 2 ?a ?b))")]
    result = taso_search(g, rules, costs, TasoOptions(budget=50, check=True))
    assert result.popped > 1
    assert result.cost_best < result.cost_original  # one relu of nested concats: 6 kernels, not 7
    assert result.best.op_counts()["relu"] == 1
    from eqsat.egraph import flatten_concats

    assert result.searched is not None and result.cost_searched == result.cost_best
    assert graph_cost(flatten_concats(result.searched), costs) < result.cost_best  # one n-ary concat
    assert numerics_match(g, result.best)[0]
    _, best_cost, popped, _ = _reference_search(g, rules, costs, 50)
    assert (result.popped, result.cost_best) == (popped, pytest.approx(best_cost, rel=1e-12))


@pytest.mark.slow  # saturation and the ILP on a small NasRNN
def test_the_budget_driver_reports_the_search_and_our_plan() -> None:
    from experiments.taso_budget import budget_row

    row = budget_row("nasrnn-small", "roofline", "h100", budget=3, seconds=60.0, passes=1)
    assert row["taso_popped"] == 3 and row["taso_stop"] == "budget"
    assert 0 < row["taso_best_over_original"] <= 1 and 0 < row["eqsat_over_original"] <= 1
    assert row["ours_le_taso"] == (row["cost_eqsat"] <= row["cost_taso"] * (1 + 1e-9))

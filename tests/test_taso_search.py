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

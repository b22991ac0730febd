"""N-ary merges at k_multi 1: the `nary_merges` rules verify (a wrong one does not), `(order ?a ?b)`
parses and reaches egglog, and the merge rounds after the two-output round merge q, k, v and the
linear map of a small BERT into one matmul, and three parallel 1x1 convs into one conv, with the
optimized graphs equal to the originals."""

from __future__ import annotations

import numpy as np
import pytest

from eqsat.cost import cost_model
from eqsat.egraph import next_siblings
from eqsat.errors import RuleParseError
from eqsat.ir import Activation, Graph, GraphBuilder, Value
from eqsat.pipeline import OptimizationResult, optimize_graph
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.printer import condition_text
from eqsat.rewrites.to_egglog import to_egglog
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted
from eqsat.saturate import Limits, is_merge_extension
from eqsat.models import build_model
from eqsat.models.tensat import bert
from merge_rules import bench_rules


def test_nary_merge_rules_verify_and_a_wrong_one_is_refuted() -> None:
    rules = library_rules(["nary_merges"])
    assert rules and all(is_merge_extension(r) for r in rules)
    assert all(is_trusted(res, trust_tested=True) for res in verify_rules(rules, all_shapes=False))
    wrong = parse_rule_text(  # the pieces swapped: piece 0 is the new product, not the merged one
        "bad: (matmul 0 ?a (concat 1 2 ?b ?c)) ; (matmul 0 ?a ?d) => (split_0 (split 1 (matmul 0 ?a (concat 1 2 ?d "
        "(concat 1 2 ?b ?c))))) ; (split_1 (split 1 (matmul 0 ?a (concat 1 2 ?d (concat 1 2 ?b ?c))))) "
        "if (= (rank ?a) 2) (order ?c ?d)", "test")
    assert not any(is_trusted(res, trust_tested=True) for res in verify_rules(wrong, all_shapes=False))


def test_order_condition_parses_prints_and_reaches_egglog() -> None:
    (rule,) = parse_rule_text("r: (matmul 0 ?a ?b) ; (matmul 0 ?a ?c) => (matmul 0 ?a ?b) ; (matmul 0 ?a ?c) "
                              "if (order ?b ?c)", "test")
    assert condition_text(rule.conditions[0]) == "(order ?b ?c)"
    assert "(< (input_order v_b) (input_order v_c))" in to_egglog(rule, "rs")[0].text
    for bad in ("(order ?b)", "(order ?b 1)", "(= (order ?b ?c) 1)"):
        with pytest.raises(RuleParseError):
            parse_rule_text(f"r: (relu ?b) => (relu ?b) if {bad}", "test")


def _optimize(graph: Graph, k: int = 1) -> OptimizationResult:
    return optimize_graph(graph, bench_rules(graph), Limits(nodes=50_000, seconds=60, multi_rounds=k),
                          cost_model("roofline", device="h100"), extractor="ilp", time_limit=30)


def _output_widths(graph: Graph, op: str, axis: int) -> list[int]:
    live = graph.live()
    return sorted(live.shape(Value(i, 0))[axis] for i, n in enumerate(live.nodes) if n.op == op)


def test_small_bert_merges_q_k_v_and_the_linear_map_at_k_multi_1() -> None:
    graph = bert(seq=8, hidden=32, layers=2, heads=4)
    result = _optimize(graph)
    assert result.saturation.total_matches.get("matmul-merge-right-4", 0) >= 2
    assert max(_output_widths(result.optimized, "matmul", 1)) == 4 * 32  # x (Wq Wk Wv Wl) in one product
    assert result.numerics_ok and result.cost_after < result.cost_before
    without = optimize_graph(graph, bench_rules(graph), Limits(multi_rounds=1, merge_rounds=0),
                             cost_model("roofline", device="h100"), extractor="ilp", time_limit=30)
    assert result.cost_after < without.cost_after  # pairs alone (the old k_multi 1) cost more


def inception_small() -> Graph:
    """An Inception-style block: three 1x1 ReLU convs read the block input, a 3x3 follows one."""
    b = GraphBuilder()
    x = b.input("x", (1, 16, 8, 8))
    a = b.conv2d(x, b.weight("w1", (8, 16, 1, 1)), act=Activation.RELU)
    c = b.conv2d(x, b.weight("w2", (8, 16, 1, 1)), act=Activation.RELU)
    d = b.conv2d(x, b.weight("w3", (8, 16, 1, 1)), act=Activation.RELU)
    c3 = b.conv2d(c, b.weight("w4", (8, 8, 3, 3)), act=Activation.RELU)
    d3 = b.conv2d(d, b.weight("w5", (8, 8, 3, 3)), act=Activation.RELU)
    return b.build([b.concat(1, a, c3, d3)])


def test_small_inception_merges_three_1x1_convs_at_k_multi_1() -> None:
    graph = inception_small()
    result = _optimize(graph)
    assert result.saturation.total_matches.get("conv-relu-merge-extend", 0) >= 1
    assert 3 * 8 in _output_widths(result.optimized, "conv2d", 1)  # one conv gives all three 1x1 outputs
    assert result.numerics_ok
    inputs = graph.random_inputs(1, dtype=np.float64)
    for got, want in zip(result.optimized.evaluate(inputs), graph.evaluate(inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_cycle_guard_reachability_matches_networkx() -> None:
    import random

    import networkx as nx

    from eqsat.cycle_guard import _reachable_bits

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 25)
        adj = [sorted({rng.randrange(n) for _ in range(rng.randint(0, 3))}) for _ in range(n)]
        marked = rng.sample(range(n), rng.randint(0, n))
        bit = {v: k for k, v in enumerate(marked)}
        got = _reachable_bits(adj, bit)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from((v, w) for v in range(n) for w in adj[v])
        for v in range(n):
            want = {w for w in nx.descendants(g, v) if w in bit and w != v}
            assert {w for w in bit if w != v and (got[v] >> bit[w]) & 1} == want


def test_siblings_are_ops_alike_but_for_one_operand_in_input_order() -> None:
    b = GraphBuilder()
    x, y = b.input("x", (2, 4)), b.input("y", (2, 4))
    wq, wk, wv = (b.weight(n, (4, 4)) for n in ("wq", "wk", "wv"))
    outs = [b.matmul(x, wq), b.matmul(x, wk), b.matmul(y, wq), b.matmul(x, wv), b.relu(x), b.relu(y)]
    graph = b.build(outs)
    names = {v: graph.nodes[v.node].attr.get("name") for pair in next_siblings(graph) for v in pair}
    pairs = {(names[a], names[c]) for a, c in next_siblings(graph)}
    assert pairs == {("wq", "wk"), ("wk", "wv"), ("x", "y")}  # x·Wq, y·Wq share Wq; relus have one operand


def test_merge_rounds_extend_runs_of_siblings_and_leave_nasrnn_cost_unchanged() -> None:
    """NasRNN's eight gates on each input: merge rounds used to build every 3- and 4-subset (126 merges
    per input, none cheaper than the sum-merged gates); runs of siblings give 6 + 5."""
    graph = build_model("nasrnn-small")  # 2 steps: inputs x0, x1, h0 and the step-0 state each feed 8 gates
    with_rounds = _optimize(graph)
    without = optimize_graph(graph, bench_rules(graph), Limits(multi_rounds=1, merge_rounds=0),
                             cost_model("roofline", device="h100"), extractor="ilp", time_limit=30)
    assert with_rounds.saturation.total_matches.get("matmul-merge-right-4", 0) == 4 * (8 - 3)
    assert with_rounds.enodes - without.enodes < 0.25 * without.enodes
    assert with_rounds.cost_after == pytest.approx(without.cost_after)

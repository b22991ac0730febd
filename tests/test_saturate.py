"""Saturation: each limit stops a run and says so; guards keep right sides well-typed; a rule that
gives an e-class two shapes is named in the error."""

from __future__ import annotations

import pytest

from eqsat import ops
from eqsat.egraph import TensorEGraph
from eqsat.errors import LimitError, RuleError
from eqsat.ir import Graph, GraphBuilder
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule
from eqsat.saturate import STOP_REASONS, Limits, saturate


def rules(*lines: str) -> list[Rule]:
    return [r for i, line in enumerate(lines) for r in parse_rule_text(line, f"test:{i + 1}")]


def relu_conv() -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (1, 4, 5, 5)), b.weight("w", (4, 4, 3, 3))
    return b.build([b.relu(b.conv2d(x, w))])


def ewadd_chain(n: int) -> Graph:
    """x0 + (x1 + (x2 + ...)): associativity and commutativity make it grow fast."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (2, 2)) for i in range(n)]
    acc = xs[-1]
    for x in reversed(xs[:-1]):
        acc = b.ewadd(x, acc)
    return b.build([acc])


ASSOC_COMM = ("assoc: (ewadd ?a (ewadd ?b ?c)) => (ewadd (ewadd ?a ?b) ?c)",
              "assoc2: (ewadd (ewadd ?a ?b) ?c) => (ewadd ?a (ewadd ?b ?c))",
              "comm: (ewadd ?a ?b) => (ewadd ?b ?a)")


def test_fusion_saturates() -> None:
    eg = TensorEGraph.from_graph(relu_conv())
    report = saturate(eg, rules("fuse: (relu (conv2d 1 1 0 0 ?x ?w)) => (conv2d 1 1 0 2 ?x ?w)"), Limits())
    assert report.stop_reason == "saturated"
    assert report.iterations[0].matches == {"fuse": 1}
    assert report.enodes == report.enodes_before + 1  # the fused conv joins the relu's class
    assert report.eclasses == eg.num_eclasses() == 4


def test_iteration_limit_stops() -> None:
    report = saturate(TensorEGraph.from_graph(ewadd_chain(5)), rules(*ASSOC_COMM), Limits(iterations=2))
    assert report.stop_reason == "iterations" and len(report.iterations) == 2


def test_node_limit_stops_within_the_limit() -> None:
    limit = 400
    eg = TensorEGraph.from_graph(ewadd_chain(7))
    report = saturate(eg, rules(*ASSOC_COMM), Limits(iterations=100, nodes=limit, match_limit=50))
    assert report.stop_reason == "nodes"
    assert report.enodes == eg.num_enodes() <= limit  # a step that would pass it is cut rule by rule
    assert "undone" in report.detail or report.enodes == limit
    assert all(row.enodes > 0 and row.eclasses > 0 for row in report.iterations)


def test_time_limit_stops() -> None:
    report = saturate(TensorEGraph.from_graph(ewadd_chain(7)), rules(*ASSOC_COMM),
                      Limits(iterations=100, nodes=10**7, seconds=0.05))
    assert report.stop_reason == "time"
    assert report.seconds < 5


def test_zero_time_runs_nothing() -> None:
    report = saturate(TensorEGraph.from_graph(relu_conv()), rules(ASSOC_COMM[0]), Limits(seconds=0))
    assert report.stop_reason == "time" and report.iterations == ()
    assert report.stop_reason in STOP_REASONS


def test_ill_typed_right_side_is_not_built() -> None:
    b = GraphBuilder()
    x, y = b.input("x", (4, 8)), b.input("y", (4, 8))
    eg = TensorEGraph.from_graph(b.build([b.ewadd(x, y)]))
    before = eg.num_enodes()
    report = saturate(eg, rules("bad: (ewadd ?a ?b) => (matmul 0 ?a ?b)"), Limits())  # (4,8)@(4,8)
    assert report.stop_reason == "saturated" and eg.num_enodes() == before


def test_shape_conflict_names_the_rule() -> None:
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    eg = TensorEGraph.from_graph(b.build([b.relu(x)]))
    good = "ok: (relu (relu ?x)) => (relu ?x)"
    wrong = "widen: (relu ?x) => (concat 1 2 ?x ?x)"  # well-typed, but (4, 16) is not (4, 8)
    with pytest.raises(RuleError, match="widen"):
        saturate(eg, rules(good, wrong), Limits())


def test_multi_rule_runs_only_in_multi_rounds() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 4))
    w1, w2, w3 = (b.weight(f"w{i}", (4, 3)) for i in range(3))
    graph = b.build([b.matmul(x, w1), b.matmul(x, w2), b.matmul(x, w3)])
    merge = ("(matmul 0 ?input_1 ?input_4)=>(split_0 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))",
             "(matmul 0 ?input_1 ?input_5)=>(split_1 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))")
    from eqsat.rewrites.parser import parse_rules

    multi = parse_rules(merge, "m", multi=True)
    report = saturate(TensorEGraph.from_graph(graph), multi, Limits(multi_rounds=1))
    assert report.iterations[0].multi and report.iterations[0].matches == {"m:1-2": 3}  # 3 unordered pairs
    assert report.stop_reason == "saturated"
    none = saturate(TensorEGraph.from_graph(graph), multi, Limits(multi_rounds=0))
    assert none.enodes == none.enodes_before


def test_invalid_limits_are_rejected() -> None:
    with pytest.raises(LimitError):
        Limits(nodes=0)
    assert ops.OPS  # registry loaded


def test_rules_over_list_and_float_attribute_ops() -> None:
    """Transpose/reshape/reduce/batchnorm terms match on left sides and are built, guarded, on right sides."""
    from eqsat.extract import extract, load_egraph
    from eqsat.egraph import decode
    from eqsat.pipeline import numerics_match
    from tests.test_egraph import FlopsCost

    b = GraphBuilder()
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    tt = b.transpose(b.transpose(x, (1, 0)), (1, 0))
    s = b.apply("reduce_sum", [b.ewadd(tt, y)], {"axes": (0,)})[0]
    graph = b.build([s])
    eg = TensorEGraph.from_graph(graph)
    report = saturate(eg, rules(
        "tt: (transpose [1 0] (transpose [1 0] ?x)) => ?x",
        "flat: (ewadd ?a ?b) => (reshape [2 3] (ewadd (reshape [6] ?a) (reshape [6] ?b))) if (= (rank ?a) 2)",
        "split-sum: (reduce_sum [0] (ewadd ?a ?b)) => (ewadd (reduce_sum [0] ?a) (reduce_sum [0] ?b))",
        "bad-reshape: (ewadd ?a ?b) => (reshape [5] ?a)",  # 6 elements: never built
    ), Limits(iterations=4))
    total = report.total_matches
    assert total.get("tt") and total.get("flat") and total.get("split-sum") and not total.get("bad-reshape")
    data = eg.serialize(FlopsCost())
    assert not any(n["op"] == "reshape" and n["attrs"]["shape"] == [5] for n in data["nodes"].values())
    egraph = load_egraph(data)
    out = decode(data, extract(egraph, "ilp", time_limit=10).as_ids(egraph))
    assert out.op_counts().get("transpose", 0) == 0 and numerics_match(graph, out)[0]


def test_two_output_rules_skip_pairs_where_one_class_descends_from_the_other() -> None:
    """matmul(x, W) and matmul(x, tanh(matmul(x, W))) share x, but merging them would make a cycle."""
    from eqsat.rewrites.parser import parse_rules

    b = GraphBuilder()
    x, w, v = b.input("x", (4, 4)), b.weight("w", (4, 4)), b.weight("v", (4, 4))
    first = b.matmul(x, w)
    second = b.matmul(x, b.tanh(first))
    third = b.matmul(x, v)  # independent of the other two
    graph = b.build([second, third])
    merge = ("(matmul 0 ?input_1 ?input_4)=>(split_0 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))",
             "(matmul 0 ?input_1 ?input_5)=>(split_1 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))")
    report = saturate(TensorEGraph.from_graph(graph), parse_rules(merge, "m", multi=True), Limits(multi_rounds=1))
    row = report.iterations[0]
    assert row.multi and row.pairs == 3 and row.cyclic_pairs == 1
    assert row.matches == {"m:1-2": 2}  # (first, third) and (second, third), not (first, second)

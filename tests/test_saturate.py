"""Saturation: each limit stops a run and says so; guards keep right sides well-typed; a rule that
gives an e-class two shapes is named in the error."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from eqsat import ops
from eqsat.egraph import TensorEGraph
from eqsat.errors import LimitError, RuleError
from eqsat.ir import Graph, GraphBuilder
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule
from eqsat.pipeline import optimize_graph
from eqsat.rewrites import library_rules
from eqsat.rewrites.to_egglog import to_egglog
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


def test_first_step_past_the_limit_is_undone_and_run_rule_by_rule() -> None:
    """The first step has no growth to predict from: it runs all rules at once, and when that
    passes the limit it is replayed away and run rule by rule, keeping the rules that fit."""
    eg = TensorEGraph.from_graph(ewadd_chain(6))
    limit = eg.num_enodes() + 7  # all three rules at once add 13; comm alone fits
    report = saturate(eg, rules(*ASSOC_COMM), Limits(iterations=5, nodes=limit))
    assert report.stop_reason == "nodes" and "undone" in report.detail
    assert len(report.iterations) == 1
    assert report.enodes_before < report.enodes == eg.num_enodes() <= limit


def test_time_limit_stops() -> None:
    """A 9-term chain needs ~1 s to saturate under associativity and commutativity: 0.05 s stops it."""
    report = saturate(TensorEGraph.from_graph(ewadd_chain(9)), rules(*ASSOC_COMM),
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


# --- folding rules (attribute variables, computed shapes) -----------------------------------------

@dataclass(frozen=True)
class FlopsLaunchModel:
    """Flops plus a launch per op (views free): batchnorm (two flops an element) costs more than
    the bias add a fold leaves, and one merged kernel less than two. The roofline does not price
    conv + batchnorm above conv + bias add (the add reads a full-size bias), so it is not used here."""

    name: str = "flops-launch"
    device: str = "test"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        return ops.flops(op, [tuple(s) for s in input_shapes], attrs) * 1e-9 + 1e-6


def _runtime_ops(graph: Graph) -> dict[str, int]:
    """Op counts over nodes that depend on an input (weight-only nodes are folded at load time)."""
    live, counts = graph.live(), {}
    runtime: set[int] = set()
    for i, n in enumerate(live.nodes):
        if n.op == "input" or any(v.node in runtime for v in n.inputs):
            runtime.add(i)
            counts[n.op] = counts.get(n.op, 0) + 1
    return counts


def _bcast(b: GraphBuilder, k: Any, shape: tuple[int, ...]) -> Any:
    (out,) = b.apply("broadcast", [k], {"shape": shape, "dims": (1,)})
    return out


def _conv_graph(kind: str) -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (2, 3, 6, 6)), b.weight("w", (4, 3, 3, 3))
    s, bias, m, v = (b.weight(n, (4,)) for n in ("s", "b", "m", "v"))
    if kind == "bn":
        return b.build([b.batchnorm(b.conv2d(x, w), s, bias, m, v, eps=1e-3)])
    if kind == "bn-s2":
        return b.build([b.batchnorm(b.conv2d(x, w, stride=(2, 2)), s, bias, m, v, eps=1e-3)])
    if kind == "bn-valid":
        return b.build([b.batchnorm(b.conv2d(x, w, pad=ops.Padding.VALID), s, bias, m, v, eps=1e-3)])
    y = b.conv2d(x, w)
    shape = (2, 4, 6, 6)
    if kind == "scale":
        return b.build([b.ewmul(y, _bcast(b, s, shape))])
    if kind == "shift-scale":
        return b.build([b.ewmul(b.ewadd(y, _bcast(b, bias, shape)), _bcast(b, s, shape))])
    assert kind == "center-scale"
    (centered,) = b.apply("ewsub", [y, _bcast(b, m, shape)])
    return b.build([b.ewmul(centered, _bcast(b, s, shape))])


def _matmul_graph(kind: str) -> Graph:
    b = GraphBuilder()
    x, w, v = b.input("x", (4, 8)), b.weight("w", (8, 6)), b.weight("v", (8, 5))
    s, bias, m, var = (b.weight(n, (6,)) for n in ("s", "b", "m", "var"))
    y = b.matmul(x, w)
    if kind == "bn":
        return b.build([b.batchnorm(y, s, bias, m, var, eps=1e-3)])
    if kind == "scale":
        return b.build([b.ewmul(y, _bcast(b, s, (4, 6)))])
    c = b.weight("c", (5,))
    first, second = b.ewadd(y, _bcast(b, bias, (4, 6))), b.ewadd(b.matmul(x, v), _bcast(b, c, (4, 5)))
    if kind == "bias-merge":
        return b.build([first, second])
    if kind == "bias-relu-merge":
        return b.build([b.relu(first), b.relu(second)])
    assert kind == "linear-linear"
    u, c2 = b.weight("u", (6, 3)), b.weight("c2", (3,))
    return b.build([b.ewadd(b.matmul(first, u), _bcast(b, c2, (4, 3)))])


# rule → (graph, extra rules it needs to pay off, op whose count must drop)
FOLDING_CASES: dict[str, tuple[Callable[[], Graph], tuple[str, ...], str]] = {
    "conv-bn-fold": (lambda: _conv_graph("bn"), (), "batchnorm"),
    "conv-bn-fold-s2": (lambda: _conv_graph("bn-s2"), (), "batchnorm"),
    "conv-bn-fold-valid": (lambda: _conv_graph("bn-valid"), (), "batchnorm"),
    "matmul-bn-fold": (lambda: _matmul_graph("bn"), (), "batchnorm"),
    "conv-scale-fold": (lambda: _conv_graph("scale"), (), "ewmul"),
    "matmul-scale-fold": (lambda: _matmul_graph("scale"), (), "ewmul"),
    "shift-through-scale": (lambda: _conv_graph("shift-scale"), ("conv-scale-fold",), "ewmul"),
    "center-through-scale": (lambda: _conv_graph("center-scale"), ("conv-scale-fold",), "ewmul"),
    "matmul-bias-merge": (lambda: _matmul_graph("bias-merge"), (), "matmul"),
    "matmul-bias-relu-merge": (lambda: _matmul_graph("bias-relu-merge"), (), "matmul"),
    "linear-linear-fold": (lambda: _matmul_graph("linear-linear"), (), "matmul"),
}


def test_every_library_rule_translates() -> None:
    rules_by_group = library_rules()
    assert [r.name for r in rules_by_group if r.name in FOLDING_CASES] == list(FOLDING_CASES)
    for rule in rules_by_group:
        assert to_egglog(rule, "check")  # raises RuleError on anything it cannot translate


@pytest.mark.parametrize("name", list(FOLDING_CASES))
def test_folding_rule_fires_and_pays_off(name: str) -> None:
    make, extra, gone = FOLDING_CASES[name]
    graph = make()
    by_name = {r.name: r for r in library_rules(["folding"])}
    result = optimize_graph(graph, [by_name[n] for n in (name, *extra)], Limits(iterations=10),
                            FlopsLaunchModel(), extractor="ilp", time_limit=20.0)
    assert result.saturation.to_json()["total_matches"][name] >= 1
    assert result.numerics_ok  # optimize_graph raises NumericsError otherwise
    assert _runtime_ops(result.optimized).get(gone, 0) < _runtime_ops(graph)[gone]
    assert result.cost_after < result.cost_before



def test_attribute_variable_carries_its_value() -> None:
    """`?eps` matched on the left is the right side's epsilon (not a default)."""
    fold = [r for r in library_rules(["folding"]) if r.name == "conv-bn-fold"]
    result = optimize_graph(_conv_graph("bn"), fold, Limits(iterations=4), FlopsLaunchModel(), time_limit=20.0)
    eps = {n.attr["eps"] for n in result.optimized.nodes if n.op == "batchnorm"}
    assert eps == {1e-3}


def test_repeated_attribute_variable_is_an_equality() -> None:
    """`?e` twice on a left side matches only equal attributes (an equality in the query)."""
    rule = rules("same-eps: (batchnorm ?e (batchnorm ?e ?x ?s ?b ?m ?v) ?s ?b ?m ?v) "
                 "=> (batchnorm ?e (batchnorm ?e ?x ?s ?b ?m ?v) ?s ?b ?m ?v)")
    for inner_eps, expected in ((1e-3, 1), (1e-5, 0)):
        b = GraphBuilder()
        x = b.input("x", (2, 4))
        s, bias, m, v = (b.weight(n, (4,)) for n in ("s", "b", "m", "v"))
        y = b.batchnorm(b.batchnorm(x, s, bias, m, v, eps=inner_eps), s, bias, m, v, eps=1e-3)
        report = saturate(TensorEGraph.from_graph(b.build([y])), rule, Limits(iterations=3))
        assert report.to_json()["total_matches"].get("same-eps", 0) == expected


def test_whole_library_installs_and_runs() -> None:
    """egglog accepts every library rule's translation, all groups together."""
    report = saturate(TensorEGraph.from_graph(_conv_graph("bn")), library_rules(), Limits(iterations=4))
    assert report.to_json()["total_matches"]["conv-bn-fold"] == 1


def test_rewind_rebuilds_the_egraph_as_it_was() -> None:
    """What `within_budget` relies on to undo a step that passed the node limit without a saved copy."""
    eg = TensorEGraph.from_graph(ewadd_chain(6))
    before, mark = eg.num_enodes(), len(eg.program)
    saturate(eg, rules(*ASSOC_COMM), Limits(iterations=3, nodes=100_000))
    assert eg.num_enodes() > before
    eg.rewind(mark)
    assert eg.num_enodes() == before and len(eg.program) == mark
    again = saturate(eg, rules(*ASSOC_COMM), Limits(iterations=3, nodes=100_000))
    assert again.enodes > before

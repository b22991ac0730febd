"""The whole pure-eqsat path: encode → saturate → extract → decode → numpy check."""

from __future__ import annotations

import pytest

from eqsat import ops
from eqsat.errors import NumericsError
from eqsat.ir import Graph, GraphBuilder
from eqsat.cost import graph_cost
from eqsat.context import EGraphContext, ENodes, NodeInContext, NodePrice, ValueContext
from eqsat.pipeline import Objective, numerics_match, optimize_graph, search
from eqsat.rulesets import select_rules, tensat_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.saturate import STOP_REASONS, Limits
from tests.test_egraph import FlopsCost


def tiny_nasrnn(steps: int = 2, hidden: int = 8) -> Graph:
    """NasRNN-like: per step eight x·W + h·U pairs through sigmoid / tanh / relu gates."""
    b = GraphBuilder()
    h = b.input("h0", (1, hidden))
    for t in range(steps):
        x = b.input(f"x{t}", (1, hidden))
        g = [b.matmul(x, b.weight(f"w{t}_{k}", (hidden, hidden))) + b.matmul(h, b.weight(f"u{t}_{k}", (hidden, hidden)))
             for k in range(8)]
        m0 = b.relu(g[0]) + b.sigmoid(g[3])
        m1 = b.sigmoid(g[1]) + b.tanh(g[2])
        m2 = b.sigmoid(g[4]) * b.tanh(g[5])
        m3 = b.sigmoid(g[6]) * b.relu(g[7])
        h = b.tanh((b.sigmoid(m1) + b.tanh(m2)) * (b.tanh(m0) * b.tanh(m3)))
    return b.build([h])


def test_default_rules_are_the_verified_tensat_rules() -> None:
    given = tensat_rules()
    assert len(given) == 120 + 13 and sum(r.is_multi for r in given) == 13
    used = select_rules("tensat").trusted
    assert set(used) < set(given)
    names = {r.name for r in used}
    # grouped-conv merges are wrong on values (concatenating weights changes the group count)
    assert "converted.txt:91" not in names and "converted_multi.txt:23-24" not in names
    assert "converted.txt:1" in names


@pytest.mark.parametrize("extractor", ["greedy-dag", "ilp"])
def test_tiny_nasrnn_round_trip(extractor: str) -> None:
    graph = tiny_nasrnn()
    result = optimize_graph(graph, select_rules("tensat").trusted, Limits(iterations=10, nodes=5_000, seconds=30), FlopsCost(),
                            extractor=extractor, time_limit=20)
    assert result.numerics_ok and result.max_abs_diff < 1e-9
    assert result.stop_reason in STOP_REASONS
    assert result.enodes > len(graph.nodes)
    assert result.cost_after <= result.cost_before
    assert result.cost_after == pytest.approx(graph_cost(result.optimized, FlopsCost(), fold_weights=True))


def test_relu_conv_fusion_is_extracted() -> None:
    b = GraphBuilder()
    x, w = b.input("x", (1, 4, 6, 6)), b.weight("w", (4, 4, 3, 3))
    graph = b.build([b.relu(b.conv2d(x, w))])
    rule = parse_rule_text("(relu (conv2d 1 1 0 0 ?x ?w))=>(conv2d 1 1 0 2 ?x ?w)", "fuse")
    result = optimize_graph(graph, rule, Limits(), FlopsCost(), extractor="ilp", time_limit=10)
    assert result.optimized.op_counts().get("relu", 0) == 0
    (conv,) = [n for n in result.optimized.nodes if n.op == "conv2d"]
    assert conv.attr["act"] == ops.Activation.RELU
    assert result.cost_after < result.cost_before and result.stop_reason == "saturated"


def test_an_unsound_rule_is_caught_by_the_numerics_check() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 3))
    graph = b.build([b.tanh(x)])
    unsound = parse_rule_text("(tanh ?x)=>(relu ?x)", "unsound")  # relu is cheaper: it gets picked
    with pytest.raises(NumericsError, match="differs"):
        optimize_graph(graph, unsound, Limits(), FlopsCost(), extractor="greedy-dag")


def _normalize(extra_scale: bool) -> Graph:
    """x * rsqrt(v + 1), as captured batchnorm code writes it (NaN for N(0, 1) draws of v)."""
    b = GraphBuilder()
    x, v = b.input("x", (4, 3)), b.input("v", (4, 3))
    y = b.apply("ewmul", [x, b.apply("rsqrt", [b.ewadd(v, b.weight("one", (4, 3)))])[0]])[0]
    return b.build([b.ewadd(y, y) if extra_scale else y])


def test_numerics_check_draws_inputs_where_the_original_is_defined() -> None:
    ok, diff = numerics_match(_normalize(False), _normalize(False))
    assert ok and diff == 0.0
    ok, _ = numerics_match(_normalize(False), _normalize(True))
    assert not ok


class _CountedFlops(FlopsCost):
    """An in-context stand-in: FlopsCost's price, and a row "nodes" (one per non-leaf node); the
    context marks every class's value as replicated, so the price is the plain one."""

    def price(self, node: NodeInContext) -> NodePrice:
        leaf = ops.OPS[node.op].is_leaf
        return NodePrice(0.0 if leaf else self.op_cost(node.op, node.attrs, node.input_shapes),
                         {"nodes": 0.0 if leaf else 1.0})


def _everything(enodes: ENodes) -> EGraphContext:
    return EGraphContext(frozenset(enodes.nodes), {n.eclass: ValueContext() for n in enodes.nodes.values()})


def test_one_door_takes_an_objective_with_rows_starts_and_context() -> None:
    """A plain model and the same prices in context, with a loose row and the input as a start,
    find equally cheap graphs; rows the model does not report, or a strategy that cannot honour
    rows, are refused (one error each), never ignored."""
    graph = tiny_nasrnn(1)
    rules = select_rules("tensat").trusted
    in_context = Objective(_CountedFlops(), rows={"nodes": 1e9}, starts=(graph,), context=_everything)
    found = search(graph, rules, Limits(iterations=6, nodes=3_000, seconds=20),
                   {"plain": FlopsCost(), "in-context": in_context,
                    "unknown-row": Objective(FlopsCost(), rows={"bytes": 1.0})}, "ilp", time_limit=20)
    plain, ctx = found.by_model["plain"], found.by_model["in-context"]
    assert plain.numerics_ok and ctx.numerics_ok
    assert ctx.dag_cost == pytest.approx(plain.dag_cost) and ctx.dag_cost <= graph_cost(graph, FlopsCost()) + 1e-9
    assert "unknown-row" not in found.by_model and "row 'bytes'" in " ".join(found.errors)
    greedy = search(graph, rules, Limits(iterations=2, nodes=1_000, seconds=10), {"m": in_context}, "greedy-dag")
    assert not greedy.by_model and "cannot honour knapsack rows" in greedy.errors[0]

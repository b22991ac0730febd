"""`rules_that_can_match`: dropping rules whose left-side ops can never appear changes nothing."""

from __future__ import annotations

import pytest

from eqsat.egraph import TensorEGraph, encoded_signatures
from eqsat.ir import Activation, Graph, GraphBuilder
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import rules_that_can_match
from eqsat.saturate import Limits, saturate

GROUPS = ("fusion", "merges", "folding")


def _mlp_pair() -> Graph:
    """Two matmuls of one input with biases and relus: merges, fusion and bias folding apply."""
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    outs = []
    for i in range(2):
        w, c = b.weight(f"w{i}", (8, 6)), b.weight(f"c{i}", (6,))
        (bias,) = b.apply("broadcast", [c], {"shape": (4, 6), "dims": (1,)})
        outs.append(b.relu(b.ewadd(b.matmul(x, w), bias)))
    return b.build(outs)


def _conv_relu() -> Graph:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 5, 5))
    return b.build([b.relu(b.conv2d(x, b.weight("w", (4, 4, 3, 3)))), b.conv2d(x, b.weight("v", (2, 4, 1, 1)))])


def _ops(graph: Graph) -> set[str]:
    return {n.op for n in graph.nodes}


def test_conv_rules_are_dropped_for_a_matmul_graph() -> None:
    names = {r.name for r in rules_that_can_match(library_rules(GROUPS), _ops(_mlp_pair()))}
    assert not any(n.startswith("conv") for n in names)
    assert {"matmul-relu", "matmul-merge-right", "matmul-bias-merge"} <= names


def test_rules_enabled_by_other_right_sides_are_kept() -> None:
    """`matmul-sigmoid` needs a sigmoid, which only `matmul-sigmoid-rev` creates; `split_part` on a
    right side is built as a slice, so a rule over slices is enabled by a merge rule."""
    rules = library_rules(GROUPS) + parse_rule_text("slice-of-relu: (slice 0 0 2 (relu ?x)) => (relu (slice 0 0 2 ?x))",
                                                    "test:1")
    names = {r.name for r in rules_that_can_match(rules, {"input", "weight", "matmul"})}
    assert {"matmul-sigmoid-rev", "matmul-sigmoid", "matmul-relu-rev", "relu-merge-0"} <= names
    assert "slice-of-relu" in names
    assert "slice-of-relu" not in {r.name for r in rules_that_can_match(rules, {"input", "tanh"})}


def test_order_is_kept_and_nothing_needed_is_empty() -> None:
    rules = library_rules(GROUPS)
    kept = rules_that_can_match(rules, _ops(_conv_relu()))
    assert kept == [r for r in rules if r in kept]
    assert rules_that_can_match(rules, {"input", "weight"}) == []


@pytest.mark.parametrize("make", [_mlp_pair, _conv_relu])
def test_saturation_is_the_same_with_only_the_rules_that_can_match(make) -> None:
    graph = make()
    rules = library_rules(GROUPS)
    kept = rules_that_can_match(rules, _ops(graph))
    assert len(kept) < len(rules)
    limits = Limits(iterations=6, nodes=20_000, seconds=60, multi_rounds=1)
    full = saturate(TensorEGraph.from_graph(graph), rules, limits)
    filtered = saturate(TensorEGraph.from_graph(graph), kept, limits)
    assert (full.enodes, full.eclasses) == (filtered.enodes, filtered.eclasses)
    dropped = {r.name for r in rules} - {r.name for r in kept}
    assert not any(full.total_matches.get(name, 0) for name in dropped)
    assert {k: v for k, v in full.total_matches.items() if v} == {k: v for k, v in filtered.total_matches.items() if v}


def _relu_mlp() -> Graph:
    """Two ReLU matmuls in a row (VGG's classifier): no matmul without activation."""
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    h = b.matmul(x, b.weight("w1", (8, 8)), act=Activation.RELU)
    return b.build([b.matmul(h, b.weight("w2", (8, 8)), act=Activation.RELU)])


def test_attributes_of_the_graph_and_of_right_sides_decide_which_rules_can_match() -> None:
    assoc, unfuse = (parse_rule_text(text, f"test:{i}")[0] for i, text in enumerate((
        "assoc: (matmul 0 ?a (matmul 0 ?b ?c)) => (matmul 0 (matmul 0 ?a ?b) ?c)",
        "unfuse: (matmul 2 ?a ?b) => (relu (matmul 0 ?a ?b))")))
    graph = _relu_mlp()
    assert rules_that_can_match([assoc], _ops(graph)) == [assoc]  # op names alone keep it
    assert rules_that_can_match([assoc], encoded_signatures(graph)) == []  # no act=0 matmul is ever there
    assert rules_that_can_match([assoc, unfuse], encoded_signatures(graph)) == [assoc, unfuse]  # unfuse builds one


@pytest.mark.parametrize("make", [_mlp_pair, _conv_relu, _relu_mlp])
def test_saturation_is_the_same_with_only_the_rules_whose_signatures_can_match(make) -> None:
    graph = make()
    rules = library_rules(GROUPS)
    by_ops = rules_that_can_match(rules, _ops(graph))
    kept = rules_that_can_match(rules, encoded_signatures(graph))
    assert set(kept) <= set(by_ops)
    limits = Limits(iterations=6, nodes=20_000, seconds=60, multi_rounds=1)
    full = saturate(TensorEGraph.from_graph(graph), by_ops, limits)
    filtered = saturate(TensorEGraph.from_graph(graph), kept, limits)
    assert (full.enodes, full.eclasses) == (filtered.enodes, filtered.eclasses)
    assert {k: v for k, v in full.total_matches.items() if v} == {k: v for k, v in filtered.total_matches.items() if v}

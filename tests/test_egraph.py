"""Encode → serialize → decode round trips, with shapes computed inside egglog."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqsat import ops
from eqsat.egraph import TensorEGraph, decode
from eqsat.errors import EGraphFormatError, UnknownOpError
from eqsat.ir import Graph, GraphBuilder


class FlopsCost:
    """A stand-in cost model: flops plus bytes."""

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        return ops.flops(op, input_shapes, attrs) + ops.bytes_moved(op, input_shapes, attrs)


def first_choice(egraph_json: Mapping[str, Any]) -> dict[str, str]:
    """class → its first node (an encoded, unsaturated e-graph has one node per class)."""
    out: dict[str, str] = {}
    for nid, node in egraph_json["nodes"].items():
        out.setdefault(node["eclass"], nid)
    return out


def assert_same_numerics(a: Graph, b: Graph) -> None:
    inputs = a.random_inputs(1, dtype=np.float64)
    for x, y in zip(a.evaluate(inputs), b.evaluate(inputs), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def mixed_graph() -> Graph:
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    w1, w2 = b.weight("w1", (8, 3)), b.weight("w2", (8, 5))
    y = b.relu(b.matmul(x, w1))
    z = b.matmul(x, w2)
    c = b.concat(1, y, z, y)  # variadic: nested binary concats in the e-graph
    p, q = b.split(c, 1, (4, 7))  # split: two slices
    img = b.input("img", (1, 4, 6, 6))
    k = b.weight("k", (8, 4, 3, 3))
    conv = b.conv2d(img, k, stride=(2, 2), pad=ops.Padding.VALID, act=ops.Activation.RELU)
    pooled = b.poolmax(conv, (2, 2), (1, 1))
    return b.build([p, q, z, pooled])


def test_round_trip_keeps_meaning_and_shapes() -> None:
    graph = mixed_graph()
    eg = TensorEGraph.from_graph(graph)
    data = eg.serialize(FlopsCost())
    assert eg.num_enodes() == len(data["nodes"]) == eg.num_eclasses()
    assert len(data["outputs"]) == 4 and set(data["root_eclasses"]) == set(data["outputs"])
    for node in data["nodes"].values():
        assert node["cost"] >= 0
        if ops.OPS[node["op"]].is_leaf:
            assert node["cost"] == 0
    decoded = decode(data, first_choice(data))
    assert [decoded.shape(v) for v in decoded.outputs] == [graph.shape(v) for v in graph.outputs]
    assert decoded.leaf_shapes() == graph.leaf_shapes()
    assert_same_numerics(graph, decoded)


def test_costs_come_from_the_cost_model() -> None:
    graph = mixed_graph()
    data = TensorEGraph.from_graph(graph).serialize(FlopsCost())
    matmuls = [n for n in data["nodes"].values() if n["op"] == "matmul"]
    expected = {FlopsCost().op_cost("matmul", {"act": 0}, [(4, 8), (8, k)]) for k in (3, 5)}
    assert {n["cost"] for n in matmuls} == expected


def test_decode_rejects_a_node_from_another_class() -> None:
    data = TensorEGraph.from_graph(mixed_graph()).serialize(FlopsCost())
    choice = first_choice(data)
    classes = list(choice)
    choice[classes[-1]] = choice[classes[0]]
    with pytest.raises(EGraphFormatError, match="not in it"):
        decode(data, choice)


def test_decode_rejects_a_missing_choice() -> None:
    data = TensorEGraph.from_graph(mixed_graph()).serialize(FlopsCost())
    choice = first_choice(data)
    del choice[data["outputs"][0]]
    with pytest.raises(EGraphFormatError, match="chooses no node"):
        decode(data, choice)


def test_unsupported_op_is_rejected_by_name() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    graph = b.build([b.transpose(x, (1, 0))])
    with pytest.raises(UnknownOpError, match="transpose"):
        TensorEGraph.from_graph(graph)


UNARY = ("relu", "tanh", "sigmoid")


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["relu", "tanh", "sigmoid", "ewadd", "ewmul", "matmul", "concat"]),
                          st.integers(0, 10), st.integers(0, 10)), min_size=1, max_size=8))
def test_random_graphs_round_trip(steps: list[tuple[str, int, int]]) -> None:
    b = GraphBuilder()
    pool = [b.input("a", (3, 3)), b.weight("w", (3, 3))]
    for op, i, j in steps:
        x, y = pool[i % len(pool)], pool[j % len(pool)]
        if op in UNARY:
            pool.append(b.apply(op, [x])[0])
        elif op == "concat":
            joined = b.concat(0, x, y)  # (6, 3), then cut back to (3, 3)
            pool.append(b.slice(joined, 0, 1, 4))
        else:
            pool.append(b.apply(op, [x, y])[0])
    graph = b.build([pool[-1], pool[0]])
    data = TensorEGraph.from_graph(graph).serialize(FlopsCost())
    assert_same_numerics(graph, decode(data, first_choice(data)))

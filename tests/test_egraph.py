"""Encode → serialize → decode round trips, with shapes computed inside egglog."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqsat import ops
from eqsat.egglog_schema import MAX_RANK, encodable_ops
from eqsat.egraph import TensorEGraph, congruence_closed, decode
from eqsat.errors import EGraphFormatError, ShapeError
from eqsat.extract import extract, load_egraph
from eqsat.ir import Graph, GraphBuilder, Tensor


class FlopsCost:
    """A stand-in cost model: flops plus bytes."""

    name = "flops"
    device = "any"

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


def _op_examples() -> dict[str, Callable[[GraphBuilder], list[Tensor]]]:
    """One small graph per registry op (its outputs), valid and with finite numerics."""
    def x(b: GraphBuilder, shape: tuple[int, ...] = (2, 3), name: str = "x") -> Tensor:
        return b.input(name, shape)

    def positive(b: GraphBuilder) -> Tensor:
        return b.apply("exp", [x(b)])[0]

    def unary(op: str) -> Callable[[GraphBuilder], list[Tensor]]:
        return lambda b: [b.apply(op, [x(b)])[0]]

    def positive_unary(op: str) -> Callable[[GraphBuilder], list[Tensor]]:
        return lambda b: [b.apply(op, [positive(b)])[0]]

    def binary(op: str) -> Callable[[GraphBuilder], list[Tensor]]:
        return lambda b: [b.apply(op, [x(b), b.weight("y", (2, 3))])[0]]

    def batchnorm(b: GraphBuilder) -> list[Tensor]:
        img = x(b, (2, 3, 4, 4))
        scale, bias, mean = (b.weight(n, (3,)) for n in ("scale", "bias", "mean"))
        var = b.apply("exp", [b.weight("v", (3,))])[0]
        return [b.batchnorm(img, scale, bias, mean, var, eps=1.5e-3)]

    def distributed(b: GraphBuilder, op: str, attrs: dict[str, int]) -> Tensor:
        """`op` on x (4, 6) split in 2 along its last dim (a partition or replicate itself)."""
        if op == "replicate":
            return b.apply("replicate", [x(b, (4, 6))], {"axis": 0, "parts": 2})[0]
        split = b.apply("partition", [x(b, (4, 6))], {"dim": -1, "axis": 0, "parts": 2})[0]
        return split if op == "partition" else b.apply(op, [split], attrs)[0]

    examples: dict[str, Callable[[GraphBuilder], list[Tensor]]] = {
        **{op: binary(op) for op in ("ewadd", "ewmul", "ewsub", "ewmax", "ewmin")},
        "pow": lambda b: [b.apply("pow", [positive(b), b.weight("y", (2, 3))])[0]],
        **{op: unary(op) for op in ("relu", "tanh", "sigmoid", "exp", "neg", "abs", "sin", "cos", "erf", "erfc")},
        **{op: positive_unary(op) for op in ("log", "sqrt", "rsqrt")},
        "input": lambda b: [x(b)],
        # mask and index math: integer and boolean values from iotas, comparisons and conversions
        "iota": lambda b: [b.apply("iota", [], {"shape": (2, 3), "dimension": 1})[0]],
        **{op: (lambda op: lambda b: [b.apply(op, [x(b), b.weight("y", (2, 3))])[0]])(op)  # noqa: B023
           for op in ("lt", "le", "gt", "ge", "eq", "ne")},
        "select_n": lambda b: [b.apply("select_n", [b.apply("gt", [xs := x(b), b.weight("y", (2, 3))])[0], xs,
                                                    b.weight("z", (2, 3))])[0]],
        "convert_element_type": lambda b: [b.apply("convert_element_type", [x(b)], {"dtype": "bfloat16"})[0]],
        **{op: (lambda op: lambda b: [b.apply(op, [b.apply("iota", [], {"shape": (2, 3), "dimension": 0})[0],  # noqa: B023
                                                   b.input("i", (2, 3), "int32")])[0]])(op)
           for op in ("iadd", "isub", "imul", "imax", "imin", "and", "or")},
        "not": lambda b: [b.apply("not", [b.input("m", (2, 3), "bool")])[0]],
        "stop_gradient": lambda b: [b.apply("stop_gradient", [x(b)])[0]],
        "weight": lambda b: [b.apply("neg", [b.weight("w", (3, 2))])[0]],
        "ewdiv": lambda b: [b.apply("ewdiv", [b.weight("y", (2, 3)), positive(b)])[0]],
        "smul": lambda b: [b.apply("smul", [x(b), b.weight("s", (1,))])[0],
                           b.apply("smul", [x(b, name="z"), b.weight("t", ())])[0]],
        "matmul": lambda b: [b.matmul(x(b), b.weight("w", (3, 5)), act=ops.Activation.TANH),
                             b.matmul(x(b, (2, 3, 4), "p"), b.input("q", (2, 4, 2)))],
        "conv2d": lambda b: [b.conv2d(x(b, (1, 4, 7, 7)), b.weight("k", (6, 2, 3, 3)), stride=(2, 1)),
                             b.conv2d(x(b, (1, 4, 7, 7), "z"), b.weight("k2", (4, 4, 3, 3)), pad=ops.Padding.VALID)],
        "conv2d_nhwc": lambda b: [b.apply("conv2d_nhwc", [x(b, (1, 7, 7, 4)), b.weight("k", (3, 3, 2, 6))],
                                          {"stride_h": 2, "stride_w": 1, "pad": 1, "act": 2})[0]],
        "poolmax": lambda b: [b.poolmax(x(b, (1, 2, 5, 5)), (2, 2), (2, 2))],
        "poolavg": lambda b: [b.apply("poolavg", [x(b, (1, 2, 5, 5))], {"kernel_h": 3, "kernel_w": 2, "stride_h": 1,
                                                                       "stride_w": 2, "pad": 1, "act": 2})[0]],
        "concat": lambda b: [b.concat(1, x(b), b.weight("y", (2, 1)), x(b, name="z"))],
        "split": lambda b: list(b.split(x(b, (2, 7)), 1, (2, 5))),
        "slice": lambda b: [b.slice(x(b, (5, 3)), 0, 1, 4)],
        "transpose": lambda b: [b.transpose(x(b, (2, 3, 4)), (2, 0, 1)), b.transpose(x(b, (5,), "v"), (0,))],
        "reshape": lambda b: [b.reshape(x(b, (2, 3, 4)), (6, 4)), b.reshape(x(b, (1, 1), "s"), ())],
        "batchnorm": batchnorm,
        "enlarge": lambda b: [b.apply("enlarge", [b.weight("w", (4, 2, 1, 1)), b.weight("r", (4, 2, 3, 3))])[0]],
        "merge_gconv": lambda b: [b.merge_gconv(b.weight("w", (8, 1, 3, 3)), (1, 4, 5, 5), 2)],
        "reduce_sum": lambda b: [b.apply("reduce_sum", [x(b, (2, 3, 4))], {"axes": (2, 0)})[0],
                                 b.apply("reduce_sum", [x(b, name="z")], {"axes": (0, 1)})[0]],  # to a scalar
        "reduce_max": lambda b: [b.apply("reduce_max", [x(b, (2, 3, 4))], {"axes": (1,)})[0]],
        "broadcast": lambda b: [b.apply("broadcast", [x(b, (3, 1))], {"shape": (2, 3, 4), "dims": (1, 2)})[0]],
        **{op: (lambda op, attrs: lambda b: [distributed(b, op, attrs)])(op, attrs) for op, attrs in (  # noqa: B023 - bound by the outer lambda
            ("partition", {}), ("combine", {"dim": -2, "axis": 0}), ("replicate", {}), ("reduce", {"axis": 0}),
            ("all_reduce", {"axis": 0}), ("all_gather", {"dim": -1, "axis": 0}),
            ("reduce_scatter", {"dim": -2, "axis": 0}), ("all_to_all", {"split_dim": -2, "concat_dim": -1, "axis": 0}))},
    }
    return examples


OP_EXAMPLES = _op_examples()


def test_every_registry_op_has_an_encoding_and_an_example() -> None:
    missing = sorted(set(ops.OPS) - set(encodable_ops()))
    assert not missing, f"ops without an egglog encoding: {missing}"
    untested = sorted(set(ops.OPS) - set(OP_EXAMPLES))
    assert not untested, f"ops without a round-trip example here: {untested}"


@pytest.mark.parametrize("op", sorted(ops.OPS))
def test_every_op_round_trips(op: str) -> None:
    """encode → serialize → extract → decode → numerics; egglog's shapes are checked on every node
    (from_graph) and every class (decode), against the registry's shape inference."""
    b = GraphBuilder()
    graph = b.build(OP_EXAMPLES[op](b))
    assert op in graph.op_counts()
    data = TensorEGraph.from_graph(graph).serialize(FlopsCost())
    egraph = load_egraph(data)
    decoded = decode(data, extract(egraph, "greedy-dag").as_ids(egraph))
    assert [decoded.shape(v) for v in decoded.outputs] == [graph.shape(v) for v in graph.outputs]
    assert_same_numerics(graph, decoded)
    kept = ("concat", "split", "slice")  # concats come back nested, splits as slices

    def ops_and_attrs(g: Graph) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
        return sorted((n.op, tuple((k, tuple(sorted(v)) if k == "axes" else v) for k, v in n.attrs))
                      for n in g.nodes if n.op not in kept)

    assert ops_and_attrs(decoded) == ops_and_attrs(graph)  # attributes exactly, floats included


def test_reduction_axes_are_kept_sorted() -> None:
    b = GraphBuilder()
    graph = b.build(OP_EXAMPLES["reduce_sum"](b))
    data = TensorEGraph.from_graph(graph).serialize(FlopsCost())
    axes = sorted(tuple(n["attrs"]["axes"]) for n in data["nodes"].values() if n["op"] == "reduce_sum")
    assert axes == [(0, 1), (0, 2)]


def test_rank_beyond_the_shape_tables_is_named() -> None:
    b = GraphBuilder()
    x = b.input("x", (1,) * (MAX_RANK + 1))
    graph = b.build([b.transpose(x, tuple(reversed(range(MAX_RANK + 1))))])
    with pytest.raises(ShapeError, match="graph node 1 \\(transpose"):
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


def _raw(nodes: dict[str, tuple[str, str, list[str]]], roots: list[str]) -> dict[str, Any]:
    """egglog-serialize-shaped JSON from {node id: (op, class, children)}."""
    return {"nodes": {nid: {"op": op, "eclass": c, "children": kids} for nid, (op, c, kids) in nodes.items()},
            "root_eclasses": roots, "class_data": {}}


def test_congruent_nodes_share_a_class_and_parents_follow() -> None:
    """egglog 14 can serialize one node in two classes (a stale child id its rebuild skipped); the
    serializer merges them, and then their parents, which have become congruent too."""
    raw = _raw({"x": ("Input", "c0", []), "p1": ("Partition", "c1", ["x"]), "p2": ("Partition", "c2", ["x"]),
                "m1": ("Relu", "c3", ["p1"]), "m2": ("Relu", "c4", ["p2"]), "e": ("Exp", "c5", ["m2"])},
               ["c5", "c3"])
    closed = congruence_closed(raw)
    cls = {nid: n["eclass"] for nid, n in closed["nodes"].items()}
    assert cls["p1"] == cls["p2"] and cls["m1"] == cls["m2"]
    assert len(set(cls.values())) == 4
    assert closed["root_eclasses"] == [cls["e"], cls["m1"]]


def test_a_congruence_free_egraph_is_returned_as_is() -> None:
    raw = _raw({"x": ("Input", "c0", []), "p": ("Partition", "c1", ["x"])}, ["c1"])
    assert congruence_closed(raw) is raw


def test_a_selection_is_carried_into_the_egraph_grown_from_it() -> None:
    """The same terms, found in the rewritten e-graph; a term it lacks gives None."""
    from eqsat.egraph import carry_selection
    from eqsat.rewrites.parser import parse_rule_text
    from eqsat.saturate import Limits, saturate

    b = GraphBuilder()
    x, w = b.input("x", (4, 8)), b.weight("w", (8, 3))
    graph = b.build([b.tanh(b.relu(b.matmul(x, w)))])
    eg = TensorEGraph.from_graph(graph)
    old = eg.serialize(FlopsCost())
    fuse = parse_rule_text("fuse: (relu (matmul 0 ?x ?w)) => (matmul 2 ?x ?w)", "test:1")
    assert saturate(eg, fuse, Limits()).stop_reason == "saturated"
    new = eg.serialize(FlopsCost())
    carried = carry_selection(old, first_choice(old), new)
    assert carried is not None
    assert decode(new, carried).op_counts() == decode(old, first_choice(old)).op_counts() == graph.op_counts()
    fused = dict(first_choice(new))
    fused.update({n["eclass"]: nid for nid, n in new["nodes"].items() if n["op"] == "matmul" and n["attrs"]["act"] != 0})
    assert decode(new, fused).op_counts()["matmul"] == 1 and "relu" not in decode(new, fused).op_counts()
    assert carry_selection(new, fused, old) is None

"""`regions.split`: a graph cut where the e-graph cannot hold an op, regions put back by `replace`."""

from __future__ import annotations

import numpy as np
import pytest

from eqsat import regions
from eqsat.errors import EqsatError
from eqsat.ir import Graph, GraphBuilder, Tensor


def _graph() -> Graph:
    """relu(x @ w) → tanh (not holdable here) → (· @ v) + the transposed weight w·w (weights alone)."""
    b = GraphBuilder()
    x, w, v = b.input("x", (8, 8)), b.weight("w", (8, 8)), b.weight("v", (8, 8))
    h = b.tanh(b.relu(b.matmul(x, w)))
    return b.build([b.matmul(h, v) + b.matmul(w, v), h])


HOLD = regions.egraph_ops() - {"tanh"}


def test_split_cuts_at_what_the_egraph_cannot_hold() -> None:
    graph = _graph()
    cut = regions.split(graph, HOLD)
    assert [r.level for r in cut.regions] == [0, 1]
    first, second = cut.regions
    assert sorted(n.op for n in first.graph.nodes) == ["input", "matmul", "matmul", "relu", "weight", "weight"]
    # the second region reads tanh's value as an input and w @ v (weights alone) as a weight
    leaves = {n.attr["name"]: n.op for _, n in second.graph.leaves()}
    assert sorted(leaves.values()) == ["input", "weight", "weight"]
    assert cut.report() == "2 regions (3 + 2 nodes); outside: tanh×1"
    assert graph.users[1] == (3, 7)  # w: read by x @ w and by w @ v


def test_replace_puts_regions_back() -> None:
    graph = _graph()
    cut = regions.split(graph, HOLD)
    inputs = graph.random_inputs()
    same = cut.replace([r.graph for r in cut.regions])
    for a, b in zip(same.evaluate(inputs), graph.evaluate(inputs)):
        np.testing.assert_array_equal(a, b)
    # a chosen graph for the first region: the same, with its relu written relu(relu(·)) (same values)
    first = cut.regions[0]
    b = GraphBuilder()
    made: list[tuple[Tensor, ...]] = []
    for n in first.graph.nodes:
        outs = b.apply(n.op, [made[v.node][v.index] for v in n.inputs], n.attr)
        made.append((b.relu(outs[0]),) if n.op == "relu" else outs)
    chosen = b.build([made[v.node][v.index] for v in first.graph.outputs])
    replaced = cut.replace([chosen, cut.regions[1].graph])
    assert replaced.op_counts()["relu"] == 2 and graph.op_counts()["relu"] == 1
    for a, b in zip(replaced.evaluate(inputs), graph.evaluate(inputs)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(EqsatError, match="1 graphs for 2 regions"):
        cut.replace([chosen])


def test_every_op_holdable_is_one_region() -> None:
    cut = regions.split(_graph())
    assert len(cut.regions) == 1 and cut.report() == "1 region (6 nodes)"

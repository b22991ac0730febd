"""The distribution ops: registry shapes agree with their numpy semantics and with egglog's shape
rules, the stacked representation round-trips, and collectives equal their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqsat import ops
from eqsat.egraph import TensorEGraph
from eqsat.errors import ShapeError
from eqsat.ir import GraphBuilder


@st.composite
def _shape_and_dim(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int]:
    n = draw(st.sampled_from([2, 4]))
    rank = draw(st.integers(1, 3))
    dim = draw(st.integers(-rank, -1))
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    shape[rank + dim] *= n
    return tuple(shape), dim, n


@settings(max_examples=40, deadline=None)
@given(_shape_and_dim(), st.integers(0, 2**31 - 1))
def test_partition_combine_round_trip_and_collectives(case: tuple[tuple[int, ...], int, int], seed: int) -> None:
    shape, dim, n = case
    x = np.random.default_rng(seed).standard_normal(shape)
    part = ops.evaluate("partition", [x], {"dim": dim, "axis": 0, "parts": n})[0]
    assert part.shape == ops.infer_shapes("partition", [shape], {"dim": dim, "axis": 0, "parts": n})[0]
    assert np.array_equal(ops.evaluate("combine", [part], {"dim": dim, "axis": 0})[0], x)
    rep = ops.evaluate("replicate", [x], {"axis": 0, "parts": n})[0]
    assert np.allclose(ops.evaluate("reduce", [rep], {"axis": 0})[0], n * x)
    summed = part.sum(axis=0)
    assert np.allclose(ops.evaluate("all_reduce", [part], {"axis": 0})[0], np.stack([summed] * n))
    gathered = ops.evaluate("all_gather", [part], {"dim": dim, "axis": 0})[0]
    assert np.array_equal(gathered, np.stack([x] * n))
    if part.shape[part.ndim + dim] % n == 0:
        scattered = ops.evaluate("reduce_scatter", [part], {"dim": dim, "axis": 0})[0]
        assert np.allclose(np.concatenate(list(scattered), axis=part.ndim - 1 + dim), summed)
    for op, attrs in [("partition", {"dim": dim, "axis": 0, "parts": n}), ("all_gather", {"dim": dim, "axis": 0})]:
        arg = x if op == "partition" else part
        assert ops.evaluate(op, [arg], attrs)[0].shape == ops.infer_shapes(op, [arg.shape], attrs)[0]


def test_all_to_all_repartitions() -> None:
    x = np.arange(4 * 6, dtype=float).reshape(4, 6)
    rows = ops.evaluate("partition", [x], {"dim": -2, "axis": 0, "parts": 2})[0]
    cols = ops.evaluate("all_to_all", [rows], {"split_dim": -1, "concat_dim": -2, "axis": 0})[0]
    assert np.array_equal(cols, ops.evaluate("partition", [x], {"dim": -1, "axis": 0, "parts": 2})[0])


def test_bad_dims_are_one_clear_error() -> None:
    with pytest.raises(ShapeError, match="negative"):
        ops.infer_shapes("partition", [(4, 4)], {"dim": 0, "axis": 0, "parts": 2})
    with pytest.raises(ShapeError, match="divisible"):
        ops.infer_shapes("partition", [(3, 4)], {"dim": -2, "axis": 0, "parts": 2})
    with pytest.raises(ShapeError, match="device axis"):
        ops.infer_shapes("combine", [(4,)], {"dim": -1, "axis": 0})


def test_egglog_shapes_match_the_registry() -> None:
    """Every distribution op encoded in the e-graph gets the registry's shape."""
    b = GraphBuilder()
    x = b.input("x", (4, 6))
    p = b.apply("partition", [x], {"dim": -1, "axis": 0, "parts": 2})[0]
    outs = [
        b.apply("combine", [p], {"dim": -1, "axis": 0})[0],
        b.apply("reduce", [b.apply("replicate", [x], {"axis": 1, "parts": 4})[0]], {"axis": 1})[0],
        b.apply("all_reduce", [p], {"axis": 0})[0],
        b.apply("all_gather", [p], {"dim": -2, "axis": 0})[0],
        b.apply("reduce_scatter", [p], {"dim": -2, "axis": 0})[0],
        b.apply("all_to_all", [p], {"split_dim": -2, "concat_dim": -1, "axis": 0})[0],
        b.matmul(p, b.apply("replicate", [b.weight("w", (3, 5))], {"axis": 0, "parts": 2})[0]),
    ]
    graph = b.build(outs)
    eg = TensorEGraph.from_graph(graph)
    for out, name in zip(graph.outputs, eg.output_globals):
        assert eg.shape_of(name) == graph.shape(out)

"""Distribution ops over one mesh axis, in the *stacked* representation: the shapes and numpy
semantics of the registry's `partition`, `combine`, `replicate`, `reduce` and collectives.

Representation: a value distributed over a mesh axis of size n is an ordinary tensor with one more
leading axis of size n, whose slice i is what device i of that axis holds. Partitioned, replicated
and partial-sum values are all such stacks; they differ only in how the stack relates to the
single-device value (`combine` concatenates the slices, `reduce` sums them; a replicated stack's
slices are equal). Over a 2-D mesh a value carries two leading device axes, the outermost the last
one distributed over.

Why this choice: every op keeps an exact numpy meaning on ordinary arrays, so the existing verifier
(prime-field / polynomial evaluation and random numpy checks) decides parallel rules as it decides
any other rule, and a whole plan can be run by `Graph.evaluate` and compared with the
single-device program bit for bit in float64. Per-device compute is the same op batched over the
leading device axes (a 2-D matmul on a stack is a batched 3-D matmul), so no per-op "sharded"
variants are needed; the planner knows from the ops along a path how many leading axes are device
axes (`eqsat.parallel.planner.node_axes`).

Tensor dimensions in attributes are counted from the end (-1 is the last), so one rule applies at
any device depth. `axis` names the mesh axis (its index in the mesh); `parts` is its size. This
module is part of the core op vocabulary: `eqsat.ops` registers these ops (with their facts: role,
collectives, aliasing) and imports it, so it imports only numpy and `eqsat.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from eqsat.errors import ShapeError

Shape = tuple[int, ...]
Attrs = Mapping[str, Any]


def _fail(op: str, shapes: Sequence[Shape], why: str) -> ShapeError:
    listed = ", ".join(str(tuple(s)) for s in shapes)
    return ShapeError(f"{op}: {why} (input shapes: {listed})")


def _dim(op: str, shapes: Sequence[Shape], dim: int, rank: int) -> int:
    """A dimension counted from the end, checked against `rank`; returns its index from the front."""
    if not -rank <= dim < 0:
        raise _fail(op, shapes, f"dim {dim} must be negative (counted from the end) and within rank {rank}")
    return rank + dim


def _stacked(op: str, shapes: Sequence[Shape]) -> Shape:
    x = tuple(shapes[0])
    if len(x) < 2:
        raise _fail(op, shapes, "needs a distributed value (a leading device axis and at least one more)")
    return x


def partition_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x = tuple(shapes[0])
    i = _dim("partition", shapes, a["dim"], len(x))
    n = a["parts"]
    if n < 1 or x[i] % n:
        raise _fail("partition", shapes, f"dim {a['dim']} ({x[i]}) is not divisible into {n} parts")
    return ((n, *x[:i], x[i] // n, *x[i + 1:]),)


def combine_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    y = _stacked("combine", shapes)
    piece = y[1:]
    i = _dim("combine", shapes, a["dim"], len(piece))
    return ((*piece[:i], piece[i] * y[0], *piece[i + 1:]),)


def replicate_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    if a["parts"] < 1:
        raise _fail("replicate", shapes, f"parts must be positive, got {a['parts']}")
    return ((a["parts"], *shapes[0]),)


def reduce_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    return (_stacked("reduce", shapes)[1:],)


def all_reduce_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    return (_stacked("all_reduce", shapes),)


def all_gather_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    y = _stacked("all_gather", shapes)
    i = 1 + _dim("all_gather", shapes, a["dim"], len(y) - 1)
    return ((*y[:i], y[i] * y[0], *y[i + 1:]),)


def reduce_scatter_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    y = _stacked("reduce_scatter", shapes)
    i = 1 + _dim("reduce_scatter", shapes, a["dim"], len(y) - 1)
    if y[i] % y[0]:
        raise _fail("reduce_scatter", shapes, f"dim {a['dim']} ({y[i]}) is not divisible into {y[0]} parts")
    return ((*y[:i], y[i] // y[0], *y[i + 1:]),)


def all_to_all_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    (gathered,) = combine_infer(shapes, {"dim": a["concat_dim"]})
    n = _stacked("all_to_all", shapes)[0]
    return partition_infer([gathered], {"dim": a["split_dim"], "parts": n})


# --- numpy semantics over the stacked pieces (object arrays work too: the verifier uses them) ------

Add = Callable[[Any, Any], Any]


def _sum(y: np.ndarray, add: Add) -> np.ndarray:
    acc = y[0]
    for piece in y[1:]:
        acc = add(acc, piece)
    return np.asarray(acc)


def _partition(x: np.ndarray, dim: int, parts: int) -> np.ndarray:
    return np.stack(np.split(x, parts, axis=x.ndim + dim))


def _combine(y: np.ndarray, dim: int) -> np.ndarray:
    return np.concatenate(list(y), axis=y.ndim - 1 + dim)


def _replicate(x: np.ndarray, parts: int) -> np.ndarray:
    return np.stack([x] * parts)


def semantics(add: Add) -> Mapping[str, Callable[[Sequence[np.ndarray], Attrs], np.ndarray]]:
    """Op name → fn(inputs, attrs) → output, with sums taken by `add` (numpy's, or an algebra's)."""
    def all_reduce(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        return _replicate(_sum(xs[0], add), len(xs[0]))

    def all_gather(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        return _replicate(_combine(xs[0], a["dim"]), len(xs[0]))

    def reduce_scatter(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        return _partition(_sum(xs[0], add), a["dim"], len(xs[0]))

    def all_to_all(xs: Sequence[np.ndarray], a: Attrs) -> np.ndarray:
        return _partition(_combine(xs[0], a["concat_dim"]), a["split_dim"], len(xs[0]))

    return {
        "partition": lambda xs, a: _partition(xs[0], a["dim"], a["parts"]),
        "combine": lambda xs, a: _combine(xs[0], a["dim"]),
        "replicate": lambda xs, a: _replicate(xs[0], a["parts"]),
        "reduce": lambda xs, a: _sum(xs[0], add),
        "all_reduce": all_reduce,
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "all_to_all": all_to_all,
    }


NUMPY = semantics(np.add)


def sum_flops(ins: Sequence[Shape], outs: Sequence[Shape], a: Attrs) -> float:
    """A collective that sums: one add per element of its stacked input."""
    return float(np.prod(ins[0]))


# --- the op one device runs on its piece ---------------------------------------------------------

def _shift(values: Sequence[int], k: int) -> tuple[int, ...]:
    return tuple(int(v) - k for v in values[k:])


LOCAL_ATTRS: Mapping[str, Callable[[Attrs, int], dict[str, Any]]] = {
    "transpose": lambda a, k: {**a, "perm": _shift(a["perm"], k)},
    "broadcast": lambda a, k: {**a, "shape": tuple(a["shape"][k:]), "dims": _shift(a["dims"], k)},
    "reduce_sum": lambda a, k: {**a, "axes": tuple(int(x) - k for x in a["axes"])},
    "reduce_max": lambda a, k: {**a, "axes": tuple(int(x) - k for x in a["axes"])},
    "reshape": lambda a, k: {**a, "shape": tuple(a["shape"][k:])},
    "slice": lambda a, k: {**a, "axis": int(a["axis"]) - k},
    "concat": lambda a, k: {**a, "axis": int(a["axis"]) - k},
}
"""Ops whose attributes count stacked dims from the front: their attributes for the piece of a value
with k leading device axes (the planner only admits such nodes when the device axes stay in front)."""


def local_attrs(op: str, attrs: Attrs, device_axes: int) -> dict[str, Any]:
    """Attributes of the op each device runs on its piece (most ops: unchanged)."""
    if device_axes and op in LOCAL_ATTRS:
        return LOCAL_ATTRS[op](attrs, device_axes)
    return dict(attrs)

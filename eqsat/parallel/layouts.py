"""Which layout a parallel plan gives each value of the graph it was planned from.

A plan (`eqsat.parallel.planner`) is a graph over the same leaves as the original, in the stacked
representation (`eqsat.distribution`): a value distributed over mesh axes carries one leading axis
per mesh axis, the outermost the last one distributed over. The plan does not say which of its
nodes computes which original value, and after block reuse (`eqsat.parallel.blocks`) no e-graph
is left to ask. So it is read back by running both: on the same random float64 inputs, an original
value X is held by plan node p in layout L when undoing L on p's stack gives X (`_unstack`:
concatenating the slices of each device axis along a data dim (a split over that axis) or taking
one of them when all are equal (replicated over it); a stack of partial sums undoes to nothing).

The node that holds X is the plan's own computation of it where there is one (a plan node of X's
op), else the first collective or `reduce` that does (a row-split product's partial sums, summed),
else the first node that does (an einsum's transposes the plan computes otherwise).
Random inputs make a false match as likely as two different polynomials agreeing at random points.
Lowering (`eqsat.parallel.api`) holds these layouts inside the traced step with
`with_sharding_constraint`, so GSPMD compiles the plan's inner layouts instead of choosing its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from eqsat import ops
from eqsat.ir import Graph
from eqsat.parallel.planner import graph_axes
from eqsat.pipeline import checkable_inputs

__all__ = ["Layout", "value_layouts"]

Split = tuple[tuple[int, tuple[int, ...]], ...]  # (data dim from the front, mesh axes over it, major first)
_AFTER = ops.with_role("keep") | ops.with_role("leave")  # collectives and reduce: a value summed or moved
_RTOL = 1e-7  # float64 on both sides: only summation order differs


@dataclass(frozen=True)
class Layout:
    """How the plan holds one original value: `split` (data dims partitioned over planner mesh
    axes; a mesh axis not named holds copies), and the plan node (`node`, its `op`) that holds it."""

    split: Split
    node: int
    op: str


def _readings(shape: Sequence[int], axes: Sequence[int], rank: int) -> Iterator[tuple[tuple[int | None, ...], tuple[int, ...]]]:
    """Every reading of a stack of `shape` with device axes `axes` (outermost first) as a whole
    value of `rank` dims, by shapes alone: (per device axis the data dim it splits, from the end,
    or None: copies; the whole value's shape). Splits come before copies, so a value equal in both
    readings (a constant along the dim) is read as split, which costs no communication to hold."""
    if not axes:
        yield (), tuple(shape)
        return
    n, piece = shape[0], list(shape[1:])
    for d in (*range(-rank, 0), None):
        whole = list(piece)
        if d is not None:
            whole[d] *= n
        for rest, full in _readings(whole, axes[1:], rank):
            yield (d, *rest), full


def _undo(value: np.ndarray, dims: Sequence[int | None]) -> np.ndarray | None:
    """The whole value of a stack read as `dims` (`_readings`); None where a device axis read as
    copies holds different slices (partial sums, or another split)."""
    for d in dims:
        if d is None:
            if not all(np.array_equal(value[i], value[0], equal_nan=True) for i in range(1, value.shape[0])):
                return None
            value = value[0]
        else:
            value = np.concatenate(list(value), axis=d)
    return value


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    finite = b[np.isfinite(b)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    return bool(np.allclose(a, b, rtol=_RTOL, atol=_RTOL * max(scale, 1.0), equal_nan=True))


def value_layouts(original: Graph, plan: Graph, wanted: Collection[int] | None = None,
                  seed: int = 0) -> dict[tuple[int, int], Layout]:
    """Per (node, output) of `original` for the nodes in `wanted` (None: every node but leaves),
    the layout `plan` holds it in (see the module docstring): where the plan computes it with its
    own op, else where a collective or `reduce` first makes it, else where any node first holds
    it. Values the plan holds in no layout that undoes to them (only as partial sums, or not at
    all) are absent."""
    inputs, _ = checkable_inputs(original, seed)
    with np.errstate(all="ignore"):
        mine = original.node_values(inputs, widen=True)
        g = plan.live()
        theirs = g.node_values(inputs, widen=True)
    targets: dict[tuple[int, ...], list[tuple[tuple[int, int], str, np.ndarray]]] = {}
    for i, n in enumerate(original.nodes):
        if ops.OPS[n.op].is_leaf or (wanted is not None and i not in wanted):
            continue
        for k, value in enumerate(mine[i]):
            targets.setdefault(tuple(np.shape(value)), []).append(((i, k), n.op, np.asarray(value)))
    tiers: list[dict[tuple[int, int], Layout]] = [{}, {}, {}]  # own op, after a sum or move, any node
    depth = graph_axes(g)
    for p, n in enumerate(g.nodes):
        if ops.OPS[n.op].is_leaf:
            continue
        for value in theirs[p]:
            stack = np.asarray(value)
            rank = stack.ndim - len(depth[p])
            if rank < 1:
                continue
            readings = sorted(_readings(stack.shape, depth[p], rank), key=lambda r: sum(d is None for d in r[0]))
            for dims, shape in readings:
                if shape not in targets:
                    continue
                full = _undo(stack, dims)
                if full is None:
                    continue
                for key, op, target in targets[shape]:
                    tier = 0 if op == n.op else 1 if n.op in _AFTER else 2
                    if any(key in t for t in tiers[:tier + 1]) or not _same(full, target):
                        continue
                    split: dict[int, tuple[int, ...]] = {}
                    for a, d in zip(reversed(depth[p]), reversed(dims)):  # inner axes first: major
                        if d is not None:
                            split[rank + d] = (*split.get(rank + d, ()), a)
                    tiers[tier][key] = Layout(tuple(sorted(split.items())), p, n.op)
    return {**tiers[2], **tiers[1], **tiers[0]}

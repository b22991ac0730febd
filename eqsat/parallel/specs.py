"""A plan's splits of its leaves and values, as `PartitionSpec` entries: which dim of a leaf the
plan splits over which mesh axes (read back along its use paths), and the spec that split gives a
value of a given shape. `eqsat.parallel.api` turns them into the arguments' shardings;
`eqsat.parallel.constraints` into the `with_sharding_constraint`s inside the step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from eqsat import ops
from eqsat.ir import Graph
from eqsat.parallel.planner import graph_axes

__all__ = ["Spec", "axes_of", "batch_held", "choose_split", "finest_split", "leaf_splits", "partition_spec"]

Spec = tuple[Any, ...]  # a PartitionSpec's entries: None, an axis name, or a tuple of names



def leaf_splits(plan: Graph) -> dict[str, list[dict[int, list[int]]]]:
    """Per leaf name, one split per use path: leaf dim (from the front) -> planner mesh axes in the
    order they split it. A use path follows `partition`, `replicate`, `broadcast`, `transpose` and
    `reshape` (its leading dim: a batch split entered after `(B, T, D) -> (B*T, D)`) from the leaf
    to the first op that computes (a path through other ops ends there)."""
    g = plan.live()
    users = g.users
    depth = graph_axes(g)
    out: dict[str, list[dict[int, list[int]]]] = {}

    def walk(i: int, dims: list[int | None], split: dict[int, list[int]], found: list[dict[int, list[int]]]) -> None:
        nexts = users.get(i, ())
        if not nexts:
            found.append(split)
        for u in nexts:
            n = g.nodes[u]
            a = n.attr
            if n.op == "partition":
                d = dims[len(dims) + int(a["dim"])]
                s = {k: list(v) for k, v in split.items()}
                if d is not None:
                    s.setdefault(d, []).append(int(a["axis"]))
                walk(u, dims, s, found)
            elif n.op == "replicate":
                walk(u, dims, split, found)
            elif n.op == "broadcast":  # attributes are on the stacked shape: drop the k device axes
                k = len(depth[u])
                bd = [int(x) - k for x in a["dims"]][k:]
                new: list[int | None] = [None] * (len(a["shape"]) - k)
                for m, j in enumerate(bd):
                    new[j] = dims[m] if m < len(dims) else None
                walk(u, new, split, found)
            elif n.op == "transpose":
                k = len(depth[u])
                walk(u, [dims[int(p) - k] for p in a["perm"][k:]], split, found)
            elif n.op == "reshape" and dims:  # a split of the result's leading dim is one of the input's
                k = len(depth[u])                # (row-major: both cut the buffer into equal runs; `reshape-partition`)
                walk(u, [dims[0]] + [None] * (len(a["shape"]) - k - 1), split, found)
            else:
                found.append(split)

    for i, n in enumerate(g.nodes):
        if ops.OPS[n.op].is_leaf:
            found: list[dict[int, list[int]]] = []
            walk(i, list(range(len(n.shapes[0]))), {}, found)
            out[str(n.attr["name"])] = found
    return out


def choose_split(splits: Sequence[dict[int, list[int]]]) -> dict[int, list[int]]:
    """One split for a leaf from its use paths: the most common (ties: the first); any choice is
    right, GSPMD reshards the other uses."""
    if not splits:
        return {}
    keyed = [tuple(sorted((d, tuple(a)) for d, a in s.items())) for s in splits]
    best = max(keyed, key=lambda k: (keyed.count(k), -keyed.index(k)))
    return {d: list(a) for d, a in best}


def axes_of(entry: Any) -> tuple[str, ...]:
    return () if entry is None else tuple(entry) if isinstance(entry, tuple) else (entry,)


def batch_held(spec: Spec, size: int, batch: Sequence[tuple[int, Any]]) -> Spec:
    """A batch-split value made by opaque equations held at the finest batch split planned for its
    leading size (the tokens' in `step_args.mirror`; one use path may split it over `model` only and a later
    one over `data` too, and a coarser constraint makes GSPMD gather it back)."""
    if not spec or spec[0] is None:
        return spec
    fits = [split for n, split in batch if n == size]
    best = max(fits, key=lambda e: len(axes_of(e)), default=spec[0])
    others = {a for e in spec[1:] for a in axes_of(e)}
    if len(axes_of(best)) <= len(axes_of(spec[0])) or others & set(axes_of(best)):
        return spec
    return (best, *spec[1:])


def finest_split(splits: Sequence[dict[int, list[int]]]) -> dict[int, list[int]]:
    """The use path's split over the most mesh axes (ties: `choose_split`'s order)."""
    if not splits:
        return {}
    most = max(sum(len(a) for a in s.values()) for s in splits)
    return choose_split([s for s in splits if sum(len(a) for a in s.values()) == most])


def partition_spec(split: Mapping[int, Sequence[int]], shape: Sequence[int], names: Sequence[str],
          sizes: Mapping[str, int]) -> Spec:
    entries: list[Any] = [None] * len(shape)
    for d, axes in split.items():
        axis_names = [names[a] for a in axes]
        if d < len(shape) and axis_names and shape[d] % math.prod(sizes[n] for n in axis_names) == 0:
            entries[d] = axis_names[0] if len(axis_names) == 1 else tuple(axis_names)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)

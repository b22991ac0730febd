"""A layered (Sugiyama-style) drawing of a DAG whose edges never run under a box, without graphviz.

Steps: layers by longest path (a source sits just above its first consumer, so a weight is drawn
beside the op that reads it); an edge spanning several layers goes through a reserved empty slot
("dummy") in each layer it crosses; the order inside each layer is improved by barycenter sweeps
(fewer crossings); x positions pull each node towards its neighbours while keeping a gap.

Edges are routed so that the claim is true by construction, not by luck: every box of a layer has
the same height, so a layer is a horizontal band; an edge leaves its source through the bottom of
the band, crosses the empty space between two bands diagonally, and passes a band it does not end
in vertically through its own slot. No other box is ever in the way.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Box", "Layout", "layered_layout", "segment_hits_box"]

Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """A node's box: centre (x, y) and size; y grows upwards (layer 0 is the top)."""

    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Layout[N: Hashable]:
    """Boxes per node, layer per node, and per edge the polyline it is drawn along (source's
    bottom edge to target's top edge)."""

    boxes: Mapping[N, Box]
    layers: Mapping[N, int]
    routes: Mapping[tuple[N, N], tuple[Point, ...]]
    width: float
    height: float


def _layers(nodes: Sequence[int], preds: Mapping[int, list[int]],
            succs: Mapping[int, list[int]]) -> dict[int, int]:
    """Longest-path layers from the sources; then each source is moved down to just above its
    nearest consumer (nodes are in topological order)."""
    layer: dict[int, int] = {}
    for v in nodes:
        layer[v] = 1 + max((layer[u] for u in preds[v]), default=-1)
    for v in nodes:
        if not preds[v] and succs[v]:
            layer[v] = min(layer[s] for s in succs[v]) - 1
    return layer


def _crossings(upper: Sequence[int], lower: Sequence[int], down: Mapping[int, list[int]]) -> int:
    pos = {v: i for i, v in enumerate(lower)}
    ends = [(i, pos[w]) for i, v in enumerate(upper) for w in down[v] if w in pos]
    return sum(1 for a, (i1, j1) in enumerate(ends) for i2, j2 in ends[a + 1:] if (i1 - i2) * (j1 - j2) < 0)


def layered_layout[N: Hashable](nodes: Sequence[N], edges: Sequence[tuple[N, N]], widths: Mapping[N, float],
                   box_height: float = 0.45, gap: float = 0.25, layer_gap: float = 0.5, sweeps: int = 6) -> Layout[N]:
    """Lay out the DAG (`nodes` in topological order, `edges` from producer to consumer, one box
    width per node); `gap`: the least horizontal space between two slots of one layer."""
    index = {v: k for k, v in enumerate(nodes)}
    found = _layout(list(range(len(nodes))), list(dict.fromkeys((index[u], index[v]) for u, v in edges)),
                    {index[v]: w for v, w in widths.items()}, box_height, gap, layer_gap, sweeps)
    return Layout({nodes[k]: b for k, b in found.boxes.items()}, {nodes[k]: n for k, n in found.layers.items()},
                  {(nodes[u], nodes[v]): r for (u, v), r in found.routes.items()}, found.width, found.height)


def _layout(nodes: list[int], edges: list[tuple[int, int]], widths: Mapping[int, float], box_height: float, gap: float,
            layer_gap: float, sweeps: int) -> Layout[int]:
    """`layered_layout` on nodes 0..n-1; dummy slots are numbered from n on."""
    preds: dict[int, list[int]] = {v: [] for v in nodes}
    succs: dict[int, list[int]] = {v: [] for v in nodes}
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    layer = _layers(nodes, preds, succs)
    # chains through dummy slots: one per layer strictly between an edge's ends
    chain: dict[tuple[int, int], list[int]] = {}
    down: dict[int, list[int]] = {v: [] for v in nodes}
    up: dict[int, list[int]] = {v: [] for v in nodes}
    slot_layer = dict(layer)
    width = {v: widths[v] for v in nodes}
    for u, v in edges:
        path: list[int] = [u]
        for k in range(layer[u] + 1, layer[v]):
            d = len(slot_layer)
            slot_layer[d], width[d] = k, 0.0
            down[d], up[d] = [], []
            path.append(d)
        path.append(v)
        for a, b in zip(path, path[1:]):
            down[a].append(b)
            up[b].append(a)
        chain[(u, v)] = path[1:-1]
    n_layers = max(slot_layer.values(), default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(n_layers)]
    for s in slot_layer:  # nodes first in topological order, then dummies as made: a stable start
        rows[slot_layer[s]].append(s)

    def total() -> int:
        return sum(_crossings(rows[k], rows[k + 1], down) for k in range(n_layers - 1))

    best, best_rows = total(), [list(r) for r in rows]
    for sweep in range(sweeps):
        order = range(1, n_layers) if sweep % 2 == 0 else range(n_layers - 2, -1, -1)
        for k in order:
            ref = rows[k - 1] if sweep % 2 == 0 else rows[k + 1]
            nbrs = up if sweep % 2 == 0 else down
            pos = {v: i for i, v in enumerate(ref)}

            def key(item: tuple[int, int], pos: dict[int, int] = pos,
                    nbrs: dict[int, list[int]] = nbrs) -> float:
                i, v = item
                linked = [pos[w] for w in nbrs[v] if w in pos]
                return sum(linked) / len(linked) if linked else float(i)

            rows[k] = [v for _, v in sorted(enumerate(rows[k]), key=key)]
        now = total()
        if now < best:
            best, best_rows = now, [list(r) for r in rows]
    rows = best_rows
    x = _place(rows, width, up, down, gap)
    _straighten(x, rows, width, [c for c in chain.values() if len(c) > 1], gap)
    left = min((x[s] - width[s] / 2 for s in x), default=0.0)
    x = {s: v - left for s, v in x.items()}
    pitch = box_height + layer_gap
    y = {s: -slot_layer[s] * pitch for s in slot_layer}
    boxes = {v: Box(x[v], y[v], widths[v], box_height) for v in nodes}
    routes: dict[tuple[int, int], tuple[Point, ...]] = {}
    half = box_height / 2
    out_port = _ports(nodes, down, x, width)
    in_port = _ports(nodes, up, x, width)
    for u, v in edges:
        dummies = chain[(u, v)]
        first = dummies[0] if dummies else v
        last = dummies[-1] if dummies else u
        points: list[Point] = [(out_port[(u, first)], y[u] - half)]
        for d in dummies:
            points += [(x[d], y[d] + half), (x[d], y[d] - half)]
        points.append((in_port[(v, last)], y[v] + half))
        routes[(u, v)] = tuple(points)
    right = max((x[s] + width[s] / 2 for s in x), default=0.0)
    return Layout(boxes, {v: layer[v] for v in nodes}, routes, right, n_layers * pitch - layer_gap)


def _place(rows: Sequence[Sequence[int]], width: Mapping[int, float], up: Mapping[int, list[int]],
           down: Mapping[int, list[int]], gap: float, rounds: int = 8) -> dict[int, float]:
    """x per slot: packed left to right, then (a few rounds) each layer pulled towards the mean x
    of its slots' neighbours, the order and the gaps kept."""
    x: dict[int, float] = {}
    for row in rows:
        at = 0.0
        for i, s in enumerate(row):
            if i:
                at += (width[row[i - 1]] + width[s]) / 2 + gap
            x[s] = at
    for r in range(rounds):
        for k in (range(len(rows)) if r % 2 == 0 else range(len(rows) - 1, -1, -1)):
            row = rows[k]
            want = []
            for s in row:
                linked = [x[w] for w in (*up[s], *down[s])]
                want.append(sum(linked) / len(linked) if linked else x[s])
            placed: list[float] = []
            for i, s in enumerate(row):  # left to right: as wanted, or just right of the previous slot
                least = placed[-1] + (width[row[i - 1]] + width[s]) / 2 + gap if i else float("-inf")
                placed.append(max(want[i], least))
            shift = sum(w - p for w, p in zip(want, placed)) / len(row) if row else 0.0
            for s, p in zip(row, placed):  # the whole row moved by its mean miss (gaps unchanged)
                x[s] = p + shift
    return x


def _straighten(x: dict[int, float], rows: Sequence[Sequence[int]], width: Mapping[int, float],
                chains: Sequence[Sequence[int]], gap: float) -> None:
    """A long edge's dummy slots moved onto one vertical line (their median x, or either end's)
    where every one fits between its row neighbours with the gap kept: a long edge then reads as
    one straight run instead of a zigzag."""
    where = {s: (k, i) for k, row in enumerate(rows) for i, s in enumerate(row)}

    def fits(d: int, at: float) -> bool:
        k, i = where[d]
        row = rows[k]
        left = i == 0 or at - x[row[i - 1]] >= (width[row[i - 1]] + width[d]) / 2 + gap - 1e-9
        right = i == len(row) - 1 or x[row[i + 1]] - at >= (width[row[i + 1]] + width[d]) / 2 + gap - 1e-9
        return left and right

    for dummies in chains:
        xs = sorted(x[d] for d in dummies)
        for at in (xs[len(xs) // 2], x[dummies[0]], x[dummies[-1]]):
            if all(fits(d, at) for d in dummies):
                for d in dummies:
                    x[d] = at
                break


def _ports(nodes: Sequence[int], links: Mapping[int, list[int]], x: Mapping[int, float],
           width: Mapping[int, float]) -> dict[tuple[int, int], float]:
    """Where on a box's bottom (outgoing) or top edge each of its edges attaches: spread over the
    middle of the edge in the order of the other ends' x, so the stubs do not cross."""
    ports: dict[tuple[int, int], float] = {}
    for v in nodes:
        others = sorted(dict.fromkeys(links[v]), key=lambda w: x[w])
        span = 0.6 * width[v]
        for i, w in enumerate(others):
            offset = 0.0 if len(others) == 1 else span * (i / (len(others) - 1) - 0.5)
            ports[(v, w)] = x[v] + offset
    return ports


def segment_hits_box(a: Point, b: Point, box: Box, margin: float = 1e-9) -> bool:
    """Whether the segment a-b enters the open interior of `box` (Liang-Barsky clipping)."""
    x0, x1 = box.x - box.w / 2 + margin, box.x + box.w / 2 - margin
    y0, y1 = box.y - box.h / 2 + margin, box.y + box.h / 2 - margin
    t0, t1 = 0.0, 1.0
    dx, dy = b[0] - a[0], b[1] - a[1]
    for p, q in ((-dx, a[0] - x0), (dx, x1 - a[0]), (-dy, a[1] - y0), (dy, y1 - a[1])):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return t0 < t1

"""`eqsat.explain(f, *args)`: what `@eqsat.optimize` did for these arguments, in words and pictures.

Leaves are named as the user wrote them (`x`, `params['Dense_0']['kernel']`: the report's
`leaf_names`, `jax_backend/leaf_names.py`). Predicted costs are in µs only under a cost model
calibrated to this device (`CALIBRATED_MODELS`); otherwise they are relative units, with the
measured time beside them. Pictures: one PNG per IR graph, before and after, in layers from the
inputs down, drawn by graphviz's `dot` where pygraphviz is installed (the `graphviz` extra) and
otherwise by `jax_backend/layered.py` (matplotlib; edges never run under a box).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqsat import ops
from eqsat.candidates import SegmentReport
from eqsat.ir import Graph
from jax_backend.decorator import OptimizedFunction, SignatureReport, optimize

__all__ = ["explain", "Explanation", "draw_graph", "CALIBRATED_MODELS", "predicted_text"]

CALIBRATED_MODELS = frozenset({"measured", "xla"})
"""Cost models whose numbers are seconds on this device: "measured" times every op here, "xla" is
fitted to this device's timings (`eqsat calibrate`). The roofline (and "merge", a roofline plus a
fixed price per call) prices ops at datasheet or peak rates: right for ranking graphs, not a wall
time, so its numbers are shown as relative units."""

_MAX_LEAF_ROWS = 24  # leaves listed per graph before "... and N more"


@dataclass(frozen=True)
class Explanation:
    """The report of one signature, a readable summary, and the pictures written (if any)."""

    report: SignatureReport
    pictures: tuple[Path, ...]

    def text(self) -> str:
        r = self.report
        lines = [f"signature: {r.signature}", f"used: {r.used} ({r.reason})", f"lowering: {r.lowering}",
                 f"optimization took {r.optimize_s:.2f} s" + (f" (costs predicted for {r.cost_device})"
                                                               if r.cost_device else "")]
        if r.numerics_ok is not None:
            lines.append(f"numerics ok: {r.numerics_ok} (max rel. error {r.max_rel_err})")
        if r.time_original_s is not None and r.time_optimized_s is not None:
            lines.append(f"measured: original {r.time_original_s * 1e3:.3f} ms, optimized {r.time_optimized_s * 1e3:.3f} ms")
        if r.decision is not None:
            d = r.decision
            lines.append(f"decision: {d.verdict} (speedup {d.speedup:.3f}, {d.confidence:.0%} interval "
                         f"[{d.speedup_low:.3f}, {d.speedup_high:.3f}] vs threshold {d.threshold:.3f}; {d.rounds} rounds"
                         + (", from the cache)" if d.from_cache else f" in {d.elapsed_s:.1f} s)"))
        if r.opaque:
            lines.append(f"replayed verbatim: {', '.join(r.opaque)}")
            lines += [f"  {why}" for why in r.opaque_why]
        names = dict(r.leaf_names)
        for k, s in enumerate(r.segments):
            lines.append(f"graph {k}: {_size(s.before)} → {_size(s.after)} ops; {predicted_text(s, r)}; "
                         f"e-graph {s.enodes} nodes / {s.eclasses} classes; stop: {s.stop_reason or '-'}")
            lines += _leaf_table(s.before, names)
            if s.regions:
                lines.append(f"  e-graph regions: {s.regions}")
            if s.rules_fired:
                lines.append(f"  rules fired: {', '.join(s.rules_fired)}")
            if s.kernels:
                lines.append(f"  kernels: {', '.join(s.kernels)}")
            if s.error:
                lines.append(f"  note: {s.error}")
        lines += [f"picture: {p}" for p in self.pictures]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def predicted_text(s: SegmentReport, r: SignatureReport) -> str:
    """The segment's predicted cost before → after, in µs under a model calibrated to this device
    and in relative units under any other, with the measured time (of the whole program) beside it."""
    model = s.cost_model or "unknown"
    if s.cost_before is None or s.cost_after is None:
        text = f"predicted cost unknown ({model} model)"
    elif model in CALIBRATED_MODELS:
        text = (f"predicted {s.cost_before * 1e6:.1f} → {s.cost_after * 1e6:.1f} µs per call "
                f"({model} model, calibrated on this device)")
    else:
        text = (f"predicted {s.cost_before * 1e6:.1f} → {s.cost_after * 1e6:.1f} relative units "
                f"({model} model, not calibrated to this device: for ranking only)")
    if r.time_original_s is not None:
        after = f" → {r.time_optimized_s * 1e6:.1f}" if r.time_optimized_s is not None else ""
        text += f"; measured {r.time_original_s * 1e6:.1f}{after} µs (whole program)"
    return text


def _leaf_table(graph: Graph, names: Mapping[str, str]) -> list[str]:
    """One row per leaf the graph reads: the user's name, shape and dtype, input or constant."""
    rows = []
    for _, n in graph.leaves():
        attr = n.attr
        shape = "x".join(map(str, n.shapes[0])) or "scalar"
        rows.append(f"    {names.get(attr['name'], attr['name']):<40} {shape:<16} {attr.get('dtype', 'float32'):<9} "
                    f"{'constant' if n.op == 'weight' else 'argument'}")
    if len(rows) > _MAX_LEAF_ROWS:
        rows = rows[:_MAX_LEAF_ROWS] + [f"    ... and {len(rows) - _MAX_LEAF_ROWS} more"]
    return ["  reads:", *rows] if rows else []


def _size(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if not ops.op_spec(n.op).is_leaf)


def _label(graph: Graph, i: int, names: Mapping[str, str]) -> str:
    n = graph.nodes[i]
    shape = "x".join(map(str, n.shapes[0])) if n.shapes else ""
    if ops.op_spec(n.op).is_leaf:
        name = n.attr.get("name", n.op)
        return f"{names.get(name, name)}\n{shape} {n.attr.get('dtype', '')}".rstrip()
    return f"{n.op}\n{shape}"


def draw_graph(graph: Graph, path: Path, title: str = "", names: Mapping[str, str] | None = None,
               engine: str = "auto") -> Path:
    """Draw `graph` to a PNG, one box per node (a leaf by its user's name in `names`, an op by its
    op) with the output shape, in layers from the inputs down. `engine`: "graphviz" (pygraphviz's
    `dot`), "layered" (`jax_backend.layered`, matplotlib), or "auto": graphviz where installed."""
    labels = {i: _label(graph, i, names or {}) for i in range(len(graph.nodes))}
    edges = [(v.node, i) for i, n in enumerate(graph.nodes) for v in n.inputs]
    path.parent.mkdir(parents=True, exist_ok=True)
    if engine in ("auto", "graphviz"):
        try:
            return _draw_dot(graph, labels, edges, path, title)
        except Exception:  # no pygraphviz (or no dot plugin): the layered drawing
            if engine == "graphviz":
                raise
    return _draw_layered(graph, labels, edges, path, title)


def _leaf(graph: Graph, i: int) -> bool:
    return ops.op_spec(graph.nodes[i].op).is_leaf


def _draw_dot(graph: Graph, labels: Mapping[int, str], edges: list[tuple[int, int]], path: Path, title: str) -> Path:
    """graphviz `dot` through pygraphviz (its splines route around boxes)."""
    import pygraphviz

    g = pygraphviz.AGraph(directed=True, strict=False, rankdir="TB", label=title, labelloc="t", fontsize="11")
    for i, text in labels.items():
        g.add_node(i, label=text, shape="box", style="rounded,filled", fontsize="9",
                   fillcolor="#cfe8ff" if _leaf(graph, i) else "#ffe2b3")
    for u, v in dict.fromkeys(edges):
        g.add_edge(u, v, arrowsize="0.6")
    g.draw(str(path), format="png", prog="dot")
    return path


def _draw_layered(graph: Graph, labels: Mapping[int, str], edges: list[tuple[int, int]], path: Path,
                  title: str) -> Path:
    """The layered layout drawn with matplotlib; one data unit is one inch, so boxes fit labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MplPath

    from jax_backend.layered import layered_layout

    char_in, font = 0.062, 7
    widths = {i: max(0.8, char_in * max(map(len, text.splitlines())) + 0.2) for i, text in labels.items()}
    layout = layered_layout(list(labels), edges, widths)
    boxes = layout.boxes.values()
    x0, x1 = min(b.x - b.w / 2 for b in boxes) - 0.2, max(b.x + b.w / 2 for b in boxes) + 0.2
    y0, y1 = min(b.y - b.h / 2 for b in boxes) - 0.2, max(b.y + b.h / 2 for b in boxes) + (0.45 if title else 0.2)
    size = (x1 - x0, y1 - y0)
    fig = plt.figure(figsize=size)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.axis("off")
    for route in layout.routes.values():
        ax.add_patch(FancyArrowPatch(path=MplPath(route), arrowstyle="-|>", mutation_scale=7, lw=0.7,
                                     color="#555555", zorder=1))
    for i, b in layout.boxes.items():
        ax.add_patch(FancyBboxPatch((b.x - b.w / 2, b.y - b.h / 2), b.w, b.h, boxstyle="round,pad=0,rounding_size=0.06",
                                    fc="#cfe8ff" if _leaf(graph, i) else "#ffe2b3", ec="#333333", lw=0.6, zorder=2))
        ax.text(b.x, b.y, labels[i], ha="center", va="center", fontsize=font, zorder=3)
    if title:
        ax.text((x0 + x1) / 2, y1 - 0.15, title, ha="center", va="top", fontsize=9)
    fig.savefig(path, dpi=min(110.0, 20000 / max(size)))
    plt.close(fig)
    return path


def explain(f: Callable[..., Any], *args: Any, out: str | Path | None = None, **kwargs: Any) -> Explanation:
    """Optimize `f` for these arguments (if it is not an optimized function, wrap it with defaults)
    and report what happened; with `out`, write before/after PNGs of every graph there."""
    wrapped = f if isinstance(f, OptimizedFunction) else optimize(f)
    report = wrapped.report(*args, **kwargs)
    pictures: list[Path] = []
    if out is not None:
        folder = Path(out)
        names = dict(report.leaf_names)
        for k, seg in enumerate(report.segments):
            pictures.append(draw_graph(seg.before, folder / f"graph{k}_before.png", f"graph {k} before", names))
            pictures.append(draw_graph(seg.after, folder / f"graph{k}_after.png", f"graph {k} after", names))
    return Explanation(report, tuple(pictures))

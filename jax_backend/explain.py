"""`eqsat.explain(f, *args)`: what `@eqsat.optimize` did for these arguments, in words and pictures.

Pictures are drawn with networkx + matplotlib (no graphviz binary needed): one PNG per IR graph,
before and after, nodes laid out by depth so the data flow reads top to bottom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqsat import ops
from eqsat.ir import Graph
from jax_backend.decorator import OptimizedFunction, SignatureReport, optimize

__all__ = ["explain", "Explanation", "draw_graph"]


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
        for k, s in enumerate(r.segments):
            model = f" ({s.cost_model} model)" if s.cost_model else ""
            lines.append(f"graph {k}: {_size(s.before)} → {_size(s.after)} ops; predicted {_us(s.cost_before)} → "
                         f"{_us(s.cost_after)} per call{model}; "
                         f"e-graph {s.enodes} nodes / {s.eclasses} classes; stop: {s.stop_reason or '-'}")
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


def _us(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds * 1e6:.1f} µs"


def _size(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if not ops.op_spec(n.op).is_leaf)


def draw_graph(graph: Graph, path: Path, title: str = "") -> Path:
    """Draw `graph` to a PNG: one box per node, labelled with the op and output shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = nx.DiGraph()
    depth: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        depth[i] = 1 + max((depth[v.node] for v in n.inputs), default=-1)
        shape = "x".join(map(str, n.shapes[0])) if n.shapes else ""
        label = n.attr.get("name", n.op) if ops.op_spec(n.op).is_leaf else n.op
        g.add_node(i, label=f"{label}\n{shape}", layer=depth[i])
        for v in n.inputs:
            g.add_edge(v.node, i)
    pos = nx.multipartite_layout(g, subset_key="layer", align="horizontal", scale=1.0)
    pos = {k: (x, -y) for k, (x, y) in pos.items()}  # inputs at the top
    width = max(6.0, 1.1 * max((list(depth.values()).count(d) for d in set(depth.values())), default=1))
    fig, ax = plt.subplots(figsize=(min(width, 40.0), max(4.0, 0.9 * (max(depth.values(), default=0) + 1))))
    colors = ["#cfe8ff" if ops.op_spec(graph.nodes[i].op).is_leaf else "#ffe2b3" for i in g.nodes]
    nx.draw_networkx(g, pos, ax=ax, labels=nx.get_node_attributes(g, "label"), node_color=colors, node_shape="s",
                     node_size=1400, font_size=6, arrowsize=8)
    ax.set_title(title)
    ax.axis("off")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
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
        for k, seg in enumerate(report.segments):
            pictures.append(draw_graph(seg.before, folder / f"graph{k}_before.png", f"graph {k} before"))
            pictures.append(draw_graph(seg.after, folder / f"graph{k}_after.png", f"graph {k} after"))
    return Explanation(report, tuple(pictures))

"""A Graph cut into the parts the e-graph can hold (`split`), and those parts put back (`replace`).

The egglog encoder holds only some ops (those with symbolic shape rules); captured graphs also
contain broadcasts, reductions, transposes... Nodes are grouped by level (`levels`, the grouping
capture also uses for opaque equations): a node the e-graph cannot hold raises the level of what
depends on it, and all holdable nodes of one level form one region, optimized alone and stitched
back in place. A region leaf computed from weights alone stays a weight, so what the optimizer
builds from it (a concat of weights) is known to be foldable. Once every op is holdable, a graph
is one region.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eqsat import ops
from eqsat.cost import weight_only_nodes
from eqsat.errors import EqsatError
from eqsat.ir import Graph, GraphBuilder, Tensor, Value

__all__ = ["Region", "Regions", "egraph_ops", "levels", "split"]


def egraph_ops() -> frozenset[str]:
    """Ops the egglog encoder accepts (leaves, ops with a symbolic shape rule, and split)."""
    from eqsat.egglog_schema import SHAPE_RULES

    return frozenset(SHAPE_RULES) | {"split", "input", "weight"}


def levels(reads: Iterable[Iterable[int]], barrier: Iterable[bool]) -> tuple[int, ...]:
    """Per item of a topologically ordered list (`reads`: the earlier items each one reads), the
    number of barrier items on its longest input path, itself included. The non-barrier items of
    one level never depend on each other through a barrier, so they form one group, and running
    levels in order (a level's barriers, then its group) respects every dependency."""
    out: list[int] = []
    for deps, stop in zip(reads, barrier):
        base = max((out[d] for d in deps), default=0)
        out.append(base + 1 if stop else base)
    return tuple(out)


@dataclass(frozen=True)
class Region:
    """One level's holdable nodes as a graph of their own.

    `graph`'s leaves are the source graph's leaves it reads (same names) and, for other values
    read from outside, weights (computed from weights alone) or inputs named as in `sources`;
    its outputs are the source values `exported`, those read outside the region or returned."""

    graph: Graph
    level: int
    members: tuple[int, ...]
    sources: tuple[tuple[str, Value], ...]  # (leaf name, the source value it stands for)
    exported: tuple[Value, ...]


@dataclass(frozen=True)
class Regions:
    """`graph` cut into regions: the nodes outside every region run as they are."""

    graph: Graph
    holdable: frozenset[str]
    level_of: tuple[int, ...]  # per node of `graph`
    regions: tuple[Region, ...]

    def replace(self, choice: Sequence[Graph]) -> Graph:
        """`graph` with region k computed by `choice[k]` (a graph over region k's leaf names with
        its outputs), rebuilt level by level; `choice` = the regions' own graphs gives `graph` back
        (up to node order)."""
        if len(choice) != len(self.regions):
            raise EqsatError(f"replace: {len(choice)} graphs for {len(self.regions)} regions")
        graph = self.graph
        builder = GraphBuilder()
        tensors: dict[Value, Tensor] = {}
        for i, n in enumerate(graph.nodes):
            if ops.op_spec(n.op).is_leaf:
                tensors[Value(i, 0)] = builder.apply(n.op, [], n.attr)[0]
        by_level: dict[int, list[tuple[Region, Graph]]] = {}
        for region, chosen in zip(self.regions, choice):
            by_level.setdefault(region.level, []).append((region, chosen))
        for lv in range(max(self.level_of, default=0) + 1):
            for i, n in enumerate(graph.nodes):
                if self.level_of[i] == lv and n.op not in self.holdable:
                    outs = builder.apply(n.op, [tensors[v] for v in n.inputs], n.attr)
                    tensors.update((Value(i, k), t) for k, t in enumerate(outs))
            for region, chosen in by_level.get(lv, ()):
                if len(chosen.outputs) != len(region.exported):
                    raise EqsatError(f"replace: a graph with {len(chosen.outputs)} outputs for a region with "
                                     f"{len(region.exported)}")
                sources = dict(region.sources)
                placed: list[tuple[Tensor, ...]] = []
                for node in chosen.nodes:
                    if ops.op_spec(node.op).is_leaf:
                        placed.append((tensors[sources[node.attr["name"]]],))
                    else:
                        placed.append(builder.apply(node.op, [placed[v.node][v.index] for v in node.inputs],
                                                    node.attr))
                for v, out in zip(region.exported, chosen.outputs):
                    tensors[v] = placed[out.node][out.index]
        return builder.build([tensors[v] for v in graph.outputs])

    def report(self) -> str:
        """The cut in words: region sizes and the ops outside every region (what limits it)."""
        sizes = [sum(1 for n in r.graph.nodes if not ops.op_spec(n.op).is_leaf) for r in self.regions]
        outside = Counter(n.op for n in self.graph.nodes if n.op not in self.holdable)
        text = f"{len(sizes)} region{'' if len(sizes) == 1 else 's'}"
        if sizes:
            text += f" ({' + '.join(map(str, sizes))} nodes)"
        if outside:
            text += "; outside: " + ", ".join(f"{op}×{k}" for op, k in sorted(outside.items()))
        return text


def _leaf_prefix(graph: Graph) -> str:
    """A prefix no leaf name of `graph` starts with, for the leaves that stand for inner values."""
    names = [n.attr["name"] for _, n in graph.leaves()]
    prefix = "r"
    while any(name.startswith(prefix) for name in names):
        prefix = "_" + prefix
    return prefix


def split(graph: Graph, holdable: frozenset[str] | None = None) -> Regions:
    """`graph` cut into regions of `holdable` ops (default: what the e-graph holds, `egraph_ops`);
    a level whose holdable nodes nobody reads (dead code) is no region."""
    holdable = egraph_ops() if holdable is None else holdable
    level_of = levels(({v.node for v in n.inputs} for n in graph.nodes), (n.op not in holdable for n in graph.nodes))
    users = graph.users
    graph_outputs = {v.node for v in graph.outputs}
    weight_only = weight_only_nodes(graph)
    prefix = _leaf_prefix(graph)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        if n.op in holdable and not ops.op_spec(n.op).is_leaf:
            groups.setdefault(level_of[i], []).append(i)
    regions: list[Region] = []
    for lv, members in sorted(groups.items()):
        member_set = set(members)
        exported = tuple(Value(i, k) for i in members for k in range(len(graph.nodes[i].shapes))
                         if i in graph_outputs or any(u not in member_set for u in users.get(i, ())))
        if not exported:
            continue
        sub = GraphBuilder()
        sub_t: dict[Value, Tensor] = {}
        sources: dict[str, Value] = {}
        for i in members:
            for v in graph.nodes[i].inputs:
                if v.node in member_set or v in sub_t:
                    continue
                src = graph.nodes[v.node]
                if ops.op_spec(src.op).is_leaf:
                    name = src.attr["name"]
                    sub_t[v] = sub.apply(src.op, [], src.attr)[0]
                else:
                    name = f"{prefix}{v.node}_{v.index}"
                    leaf = sub.weight if v.node in weight_only else sub.input  # weights alone: still a weight
                    sub_t[v] = leaf(name, graph.shape(v), graph.dtype(v))
                sources[name] = v
        for i in members:
            n = graph.nodes[i]
            outs = sub.apply(n.op, [sub_t[v] for v in n.inputs], n.attr)
            sub_t.update((Value(i, k), t) for k, t in enumerate(outs))
        regions.append(Region(sub.build([sub_t[v] for v in exported]), lv, tuple(members), tuple(sources.items()),
                              exported))
    return Regions(graph, holdable, level_of, tuple(regions))

"""Optimize the parts of a Graph that the e-graph can hold, keep the rest of the graph as it is.

The egglog encoder holds only some ops (those with symbolic shape rules); captured graphs also
contain broadcasts, reductions, transposes... Nodes are split by the same level trick capture uses
for opaque equations: a node the e-graph cannot hold raises the level of what depends on it, and
all holdable nodes of one level form one region, optimized alone and stitched back in place.
A region leaf computed from weights alone stays a weight, so what the optimizer builds from it
(a concat of weights) is known to be foldable. Once every op is holdable, a graph is one region.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eqsat import ops
from eqsat.cost import weight_only_nodes
from eqsat.ir import Graph, GraphBuilder, Tensor, Value

__all__ = ["egraph_ops", "optimize_regions"]


def egraph_ops() -> frozenset[str]:
    """Ops the egglog encoder accepts (leaves, ops with a symbolic shape rule, and split)."""
    from eqsat.egglog_schema import SHAPE_RULES

    return frozenset(SHAPE_RULES) | {"split", "input", "weight"}


def _region_name(v: Value) -> str:
    return f"r{v.node}_{v.index}"


def optimize_regions(graph: Graph, holdable: frozenset[str],
                     optimize: Callable[[Graph], Graph]) -> tuple[Graph, list[Any]]:
    """`graph` with each holdable region replaced by `optimize(region)`; also the regions given."""
    level: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        base = max((level[v.node] for v in n.inputs), default=0)
        level[i] = base if n.op in holdable else base + 1
    users: dict[int, set[int]] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            users.setdefault(v.node, set()).add(i)
    graph_outputs = {v.node for v in graph.outputs}
    weight_only = weight_only_nodes(graph)
    builder = GraphBuilder()
    tensors: dict[Value, Tensor] = {}

    def replay(node: Any, args: list[Tensor]) -> tuple[Tensor, ...]:
        return builder.apply(node.op, args, node.attr)

    for i, n in enumerate(graph.nodes):
        if ops.op_spec(n.op).is_leaf:
            tensors[Value(i, 0)] = replay(n, [])[0]
    regions: list[Graph] = []
    for lv in range(max(level.values(), default=0) + 1):
        for i, n in enumerate(graph.nodes):
            if level[i] == lv and n.op not in holdable:
                tensors.update((Value(i, k), t) for k, t in enumerate(replay(n, [tensors[v] for v in n.inputs])))
        members = [i for i, n in enumerate(graph.nodes)
                   if level[i] == lv and n.op in holdable and not ops.op_spec(n.op).is_leaf]
        if not members:
            continue
        member_set = set(members)
        sub = GraphBuilder()
        sub_t: dict[Value, Tensor] = {}
        leaf_values: list[Value] = []
        for i in members:
            for v in graph.nodes[i].inputs:
                if v.node not in member_set and v not in sub_t:
                    src = graph.nodes[v.node]
                    if ops.op_spec(src.op).is_leaf:
                        sub_t[v] = sub.apply(src.op, [], src.attr)[0]
                    elif v.node in weight_only:  # computed from weights alone: still a weight here
                        sub_t[v] = sub.weight(_region_name(v), graph.shape(v))
                    else:
                        sub_t[v] = sub.input(_region_name(v), graph.shape(v))
                    leaf_values.append(v)
        for i in members:
            n = graph.nodes[i]
            sub_t.update((Value(i, k), t) for k, t in
                         enumerate(sub.apply(n.op, [sub_t[v] for v in n.inputs], n.attr)))
        exported = [Value(i, k) for i in members for k in range(len(graph.nodes[i].shapes))
                    if i in graph_outputs or any(u not in member_set for u in users.get(i, ()))]
        region = sub.build([sub_t[v] for v in exported])
        regions.append(region)
        better = optimize(region)
        by_name = {}
        for v in leaf_values:
            src = graph.nodes[v.node]
            name = src.attr["name"] if ops.op_spec(src.op).is_leaf else _region_name(v)
            by_name[name] = tensors[v]
        placed: list[tuple[Tensor, ...]] = []
        for node in better.nodes:
            if ops.op_spec(node.op).is_leaf:
                placed.append((by_name[node.attr["name"]],))
            else:
                placed.append(builder.apply(node.op, [placed[v.node][v.index] for v in node.inputs], node.attr))
        for v, out in zip(exported, better.outputs):
            tensors[v] = placed[out.node][out.index]
    return builder.build([tensors[v] for v in graph.outputs]), regions

"""Graphs up to the names of their leaves: a key under which structurally identical regions (the
12 layers of a transformer) share one optimization, and the renaming that maps the result back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eqsat import ops
from eqsat.ir import Graph, Node

__all__ = ["Canonical", "canonicalize", "rename_leaves"]


@dataclass(frozen=True)
class Canonical:
    """`graph` with its leaves renamed L0, L1, ... in node order; `names[k]` is Lk's original name."""

    graph: Graph
    names: tuple[str, ...]

    def restore(self, canonical_result: Graph) -> Graph:
        """A graph over the canonical leaf names, renamed back to this graph's names."""
        return rename_leaves(canonical_result, {f"L{k}": n for k, n in enumerate(self.names)})


def rename_leaves(graph: Graph, names: Mapping[str, str]) -> Graph:
    """The same graph with leaf names replaced through `names` (names not listed are kept)."""
    nodes = []
    for n in graph.nodes:
        if ops.OPS[n.op].is_leaf and n.attr["name"] in names:
            attrs = tuple((k, names[v] if k == "name" else v) for k, v in n.attrs)
            n = Node(n.op, attrs, n.inputs, n.shapes)
        nodes.append(n)
    return Graph(tuple(nodes), graph.outputs)


def canonicalize(graph: Graph) -> Canonical:
    """Leaves renamed by position; two graphs with equal `.graph` are the same computation."""
    originals = tuple(n.attr["name"] for _, n in graph.leaves())
    return Canonical(rename_leaves(graph, {name: f"L{k}" for k, name in enumerate(originals)}), originals)

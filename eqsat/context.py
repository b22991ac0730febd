"""Pricing e-nodes in context: what an op costs can depend on facts about its inputs that only the
whole program gives (on a device mesh: which device axes a value is split over, whether a gradient
flows back through it). A context analysis computes those facts for every e-class of a saturated
e-graph, and leaves out the e-nodes that are no valid program in context; an in-context cost model
prices each remaining e-node from its `NodeInContext`, with per-node terms of knapsack rows.
A plain `CostModel` is the special case where no fact matters (`ValueContext()` everywhere).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from eqsat.cost import CostModel, Shape

__all__ = ["ENode", "ENodes", "EGraphContext", "ContextAnalysis", "ValueContext", "NodeInContext", "NodePrice",
           "InContextCostModel"]


@dataclass(frozen=True)
class ValueContext:
    """Facts about one value (an e-class) beyond its shape; the defaults are a plain value: on no
    device axis (replicated), not a leaf, no weight moved as is, a gradient may flow through it."""

    axes: tuple[int, ...] = ()  # leading device axes: the mesh axes the value is split over, outermost first
    leaf: str | None = None  # the leaf op ("input" / "weight") when the value is one
    weight_derived: bool = False  # a weight moved by distribution ops only (its gradient is a weight's)
    needs_grad: bool = True  # a weight reaches it: a gradient flows back through it
    # a weight moved by `replicate` only: equal on every device of its axes, so the gradient syncs
    # of the replicates on top of it join its own into one all-reduce over all their axes (as XLA runs it)
    weight_replicated: bool = False
    fused_loop: bool = False  # the output of an XLA loop fusion: an elementwise consumer joins that loop
    strided_view: bool = False  # a slice not contiguous in memory: a dot or conv reading it copies it first
    # NHWC inside XLA:CPU although the graph says NCHW: an NCHW conv's output, or computed from one by ops
    # that carry the layout (`OpSpec.carries_layout`); a conv reading it needs no transpose, any other op does
    conv_internal: bool = False
    # written by a loop that writes the layout its reader wants (a concat, `OpSpec.joins_loops`): no reader
    # transposes it, whatever `conv_internal` says
    any_layout: bool = False


@dataclass(frozen=True)
class NodeInContext:
    """One op application with the facts about its inputs and its output."""

    op: str
    attrs: Mapping[str, Any]
    input_shapes: tuple[Shape, ...]
    inputs: tuple[ValueContext, ...]
    output: ValueContext = ValueContext()

    @staticmethod
    def plain(op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> NodeInContext:
        """The node with no facts known (what `CostModel.op_cost` prices)."""
        shapes = tuple(tuple(s) for s in input_shapes)
        return NodeInContext(op, attrs, shapes, tuple(ValueContext() for _ in shapes))


@dataclass(frozen=True)
class NodePrice:
    """What one e-node costs in context: seconds, and its term of each knapsack row by name."""

    seconds: float
    rows: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@runtime_checkable
class InContextCostModel(CostModel, Protocol):
    """A `CostModel` that also prices a node in context (`op_cost` is `price` of the plain node)."""

    def price(self, node: NodeInContext) -> NodePrice: ...


@dataclass(frozen=True)
class ENode:
    """One tensor e-node as an analysis sees it: its op, attributes, class and its inputs' classes."""

    op: str
    attrs: Mapping[str, Any]
    eclass: str
    children: tuple[str, ...]  # input classes, in order


@dataclass(frozen=True)
class ENodes:
    """The tensor e-nodes of a serialized e-graph (by node id, in serialization order) and the
    shape of every class."""

    nodes: Mapping[str, ENode]
    shapes: Mapping[str, Shape]


@dataclass(frozen=True)
class EGraphContext:
    """A context analysis's answer: the e-nodes that are valid programs in context (the others are
    left out before extraction) and the facts about every class they reach."""

    kept: frozenset[str]
    classes: Mapping[str, ValueContext]

    def node(self, enodes: ENodes, node_id: str) -> NodeInContext:
        n = enodes.nodes[node_id]
        return NodeInContext(n.op, n.attrs, tuple(enodes.shapes[c] for c in n.children),
                             tuple(self.classes[c] for c in n.children), self.classes[n.eclass])


ContextAnalysis = Callable[[ENodes], EGraphContext]
"""Facts about every class of an e-graph, and which e-nodes are valid in context."""

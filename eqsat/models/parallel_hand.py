"""Megatron by hand: the tensor-parallel plan a practitioner writes, one split per weight.

A plan is a table weight name → split: `col` (the weight's output dim split, Megatron's column
parallel linear), `row` (its input dim split, the partial sums reduced: row parallel, and for an
embedding written as one-hot x table Megatron's vocabulary-parallel embedding), `heads` (a head-batched
weight split by head) or no entry (replicated: every device computes the op). The plan graph is
built op by op from the program: each value is replicated, split along one dim or a partial sum,
and is made replicated (`combine` / `reduce`) only where an op needs it, exactly as Megatron's `f`
/ `g` operators do. A split carries through reshapes (the same elements on each device: a column
block of q = x @ wq is a block of heads once reshaped to (B, T, H, dh)), transposes, reductions
over other dims, broadcasts and elementwise ops; behind a reshape that merges it under a leading dim
(the attention products batched over (B*H)) it is strided (`_Placed.outer`): each device runs its
heads of every batch row, and no `partition` of the merged value states it, so such a plan is outside
the joint search's e-graph. Tensor parallelism runs over the mesh's last axis; on a 2-D mesh the
other axis computes the same values. DP x TP by hand (the batch over the other axis) is not built:
every activation would carry a second device axis (the data axis inner, so the tensor-parallel
reduces stay over the outermost one), and each op's attributes shift by the value's device depth,
which this builder, one device axis deep, does not track.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from eqsat import ops
from eqsat.errors import EqsatError
from eqsat.ir import Graph, GraphBuilder, Node, Tensor
from eqsat.parallel.mesh import Mesh

__all__ = ["HAND_SPECS", "HandPlanError", "megatron_by_hand", "megatron_spec"]

ACTIVATIONS: Mapping[int, str] = MappingProxyType({1: "sigmoid", 2: "relu", 3: "tanh"})
ELEMENTWISE = frozenset(name for name, spec in ops.OPS.items() if spec.elementwise)  # keep a split as it is
REDUCTIONS = frozenset({"reduce_sum", "reduce_max"})

REP, LAST, HEADS, CHANNELS, PARTIAL = "replicated", "split-last", "split-heads", "split-channels", "partial"
SPLIT = "split"  # a split of any dim (`_Placed.dim`, from the end), strided when `_Placed.outer` > 1


class HandPlanError(EqsatError):
    """A hand-written plan that does not fit the program."""


def _mlp_spec(graph: Graph) -> dict[str, str]:
    """Layers in pairs: column then row (one all-reduce per pair); an odd last layer stays replicated."""
    names = [n.attr["name"] for _, n in graph.leaves("weight")]
    pairs = len(names) // 2 * 2
    return {name: ("col" if i % 2 == 0 else "row") for i, name in enumerate(names[:pairs])}


def _gpt_spec(graph: Graph) -> dict[str, str]:
    """Attention split by head: q, k, v column-parallel (a column block of wq is a block of heads
    once reshaped), the output projection row-parallel; the MLP column / row."""
    out = {}
    for _, n in graph.leaves("weight"):
        name = n.attr["name"]
        kind = name.rsplit(".", 1)[-1]
        out[name] = {"wq": "col", "wk": "col", "wv": "col", "wo": "row", "w1": "col", "w2": "row"}[kind]
    return out


def _dlrm_spec(graph: Graph) -> dict[str, str]:
    """Vocabulary-parallel embeddings, then the top MLP's first two layers column / row."""
    out = {}
    for _, n in graph.leaves("weight"):
        name = n.attr["name"]
        out[name] = "row" if name.startswith("emb") else {"top0": "col", "top1": "row"}.get(name, "")
    return {k: v for k, v in out.items() if v}


def _cnn_spec(graph: Graph) -> dict[str, str]:
    """Convolutions in column / row pairs over channels, as Megatron pairs linear layers."""
    return {"c0": "col", "c1": "row", "c2": "col", "head": "row"}


def _moe_spec(graph: Graph) -> dict[str, str]:
    """Expert parallelism: each device holds its experts' weights; the router stays replicated."""
    return {"w1": "heads", "w2": "heads"}


def _bottleneck_spec(graph: Graph) -> dict[str, str]:
    """The wide pair column / row; the narrow layers replicated, as Megatron leaves small layers."""
    return {"w1": "col", "w2": "row"}


HAND_SPECS: Mapping[str, Callable[[Graph], dict[str, str]]] = MappingProxyType({
    "unity-mlp": _mlp_spec, "mlp16": _mlp_spec, "gpt-block": _gpt_spec, "gpt12": _gpt_spec, "dlrm": _dlrm_spec,
    "mlp-bottleneck": _bottleneck_spec, "cnn": _cnn_spec, "moe": _moe_spec,
})


def megatron_spec(model: str, graph: Graph) -> dict[str, str]:
    if model not in HAND_SPECS:
        raise HandPlanError(f"no hand-written Megatron plan for '{model}'; known: {', '.join(HAND_SPECS)}")
    return HAND_SPECS[model](graph)


@dataclass(frozen=True)
class _Placed:
    tensor: Tensor
    layout: str
    broadcast_of: tuple[_Placed, tuple[int, ...]] | None = None  # a per-head broadcast of a replicated value
    dim: int = -1  # SPLIT: the dim (from the end) split into `parts` blocks ...
    outer: int = 1  # ... of its inner factor: dim = outer x inner, blocks of inner (1: contiguous blocks)

    def split_of(self) -> tuple[int, int] | None:
        """(dim, outer) of a split of one dim (LAST is the last dim's), else None."""
        if self.layout == SPLIT:
            return self.dim, self.outer
        return (-1, 1) if self.layout == LAST else None


def _prod(dims: tuple[int, ...] | list[int]) -> int:
    out = 1
    for n in dims:
        out *= int(n)
    return out


def _reshaped_split(old: tuple[int, ...], split: tuple[int, int], new: tuple[int, ...], parts: int) -> tuple[int, int] | None:
    """The split of a reshape's result that holds the same elements as `split` of its input on each
    device, or None. A split is the digit (flat row-major index // unit) % parts of the value, and
    a reshape keeps the flat index: the result's split is the dim whose elements that digit indexes."""
    dim, outer = split
    j = len(old) + dim
    unit = _prod(old[j + 1:]) * old[j] // (outer * parts)
    for k in range(len(new)):
        inner = _prod(new[k + 1:])
        span = inner * new[k]
        if new[k] > 1 and unit % inner == 0 and span % (unit * parts) == 0:
            return k - len(new), span // (unit * parts)
    return None


class _Builder:
    """Rebuilds the program with one mesh axis of tensor parallelism."""

    def __init__(self, graph: Graph, spec: Mapping[str, str], axis: int, parts: int) -> None:
        self.graph, self.spec, self.axis, self.parts = graph, spec, axis, parts
        self.b = GraphBuilder()

    def _op(self, op: str, inputs: list[Tensor], **attrs: object) -> Tensor:
        return self.b.apply(op, inputs, attrs)[0]

    def partition(self, t: Tensor, dim: int) -> Tensor:
        return self._op("partition", [t], dim=dim, axis=self.axis, parts=self.parts)

    def replicated(self, p: _Placed) -> Tensor:
        """Megatron's `g`: the whole value on every device."""
        if p.layout == REP:
            return p.tensor
        if p.layout == PARTIAL:
            return self._op("reduce", [p.tensor], axis=self.axis)
        if p.layout == SPLIT:
            if p.outer != 1:
                raise HandPlanError("a strided split (a split dim merged behind another) cannot be gathered by hand")
            return self._op("combine", [p.tensor], dim=p.dim, axis=self.axis)
        return self._op("combine", [p.tensor], dim=self._split_dim(p.layout, p.tensor, stacked=True), axis=self.axis)

    @staticmethod
    def _split_dim(layout: str, t: Tensor, stacked: bool) -> int:
        """The dim (from the end) a layout splits: the last, the heads (the first of the value, after
        the device axis when `stacked`), or NCHW's channels."""
        if layout == LAST:
            return -1
        if layout == CHANNELS:
            return -3
        return (1 if stacked else 0) - len(t.shape)

    def spread(self, p: _Placed) -> Tensor:
        """Megatron's `f`: a replicated value entering a split region (its backward all-reduces)."""
        return self._op("replicate", [self.replicated(p)], axis=self.axis, parts=self.parts)

    def split(self, p: _Placed, layout: str) -> Tensor:
        if p.layout == layout:
            return p.tensor
        whole = self.replicated(p)
        return self.partition(whole, self._split_dim(layout, whole, stacked=False))

    def build(self) -> Graph:
        g = self.graph
        vals: list[_Placed] = []
        for n in g.nodes:
            ins = [vals[v.node] for v in n.inputs]
            producers = [g.nodes[v.node] for v in n.inputs]
            shapes = [tuple(p.shapes[v.index]) for p, v in zip(producers, n.inputs)]
            placed = self.split_op(n.op, n.attr, ins, shapes, tuple(n.shapes[0])) if n.shapes else None
            vals.append(placed or self.node(n.op, n.attr, ins, producers))
        return self.b.build([self.replicated(vals[v.node]) for v in g.outputs])

    def _split(self, tensor: Tensor, dim: int, outer: int) -> _Placed:
        return _Placed(tensor, LAST) if (dim, outer) == (-1, 1) else _Placed(tensor, SPLIT, dim=dim, outer=outer)

    def _local(self, shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
        """The stacked shape of a value of global `shape` split along `dim`."""
        j = len(shape) + dim
        return (self.parts, *shape[:j], shape[j] // self.parts, *shape[j + 1:])

    def split_op(self, op: str, attrs: dict[str, Any], xs: list[_Placed], shapes: list[tuple[int, ...]],
                 out: tuple[int, ...]) -> _Placed | None:
        """An op on values split along one dim (heads through a transformer's reshapes and
        transposes): it runs on each device's piece where the split carries through it, else None
        (the op-specific cases of `node`)."""
        splits = [x.split_of() for x in xs]
        if not xs or all(sp is None for sp in splits):
            return None
        first = next(sp for sp in splits if sp is not None)
        dim, outer = first
        if op == "reshape":
            new = _reshaped_split(shapes[0], first, out, self.parts)
            if new is None:
                return None
            return self._split(self._op(op, [xs[0].tensor], shape=self._local(out, new[0])), *new)
        if op == "transpose":
            perm = tuple(int(p) for p in attrs["perm"])
            j = perm.index(len(out) + dim)
            return self._split(self._op(op, [xs[0].tensor], perm=(0, *(p + 1 for p in perm))), j - len(out), outer)
        if op in REDUCTIONS:
            axes = tuple(int(a) for a in attrs["axes"])
            j = len(shapes[0]) + dim
            if j in axes:
                return None
            kept = j - sum(a < j for a in axes)
            return self._split(self._op(op, [xs[0].tensor], axes=tuple(a + 1 for a in axes)), kept - len(out), outer)
        if op == "broadcast":
            j = int(tuple(attrs["dims"])[len(shapes[0]) + dim])
            dims = (0, *(int(d) + 1 for d in attrs["dims"]))
            return self._split(self._op(op, [xs[0].tensor], shape=self._local(out, j - len(out)), dims=dims),
                               j - len(out), outer)
        if op in ELEMENTWISE and all(sp == first or (x.layout == REP and s == out)
                                     for x, sp, s in zip(xs, splits, shapes)):
            if outer != 1 and any(sp is None for sp in splits):
                return None
            ins = [x.tensor if sp is not None else self.partition(x.tensor, dim) for x, sp in zip(xs, splits)]
            return self._split(self._op(op, ins, **attrs), dim, outer)
        if op == "matmul" and len(out) >= 3 and splits[0] == splits[1] and dim <= -3:  # batched over the split dim
            return self._split(self._op(op, [x.tensor for x in xs], **attrs), dim, outer)
        return None

    def node(self, op: str, attrs: dict[str, Any], xs: list[_Placed], producers: list[Node]) -> _Placed:
        if op in ("input", "weight"):
            return _Placed(self._op(op, [], **attrs), REP)
        if op == "matmul":
            return self.matmul(attrs, xs, producers)
        if op == "conv2d":
            return self.conv2d(attrs, xs, producers)
        if op in ELEMENTWISE and len({x.layout for x in xs}) == 1 and xs[0].layout != PARTIAL:
            return _Placed(self._op(op, [x.tensor for x in xs], **attrs), xs[0].layout)
        if op in ELEMENTWISE and {x.layout for x in xs} == {HEADS, REP} and all(
                x.layout == HEADS or x.broadcast_of is not None for x in xs):  # e.g. the mask added per head
            return _Placed(self._op(op, [x.tensor if x.layout == HEADS else self.heads_input(x) for x in xs]), HEADS)
        if op in REDUCTIONS and xs[0].layout == HEADS and 0 not in attrs["axes"]:  # softmax's max / sum per head
            return _Placed(self._op(op, [xs[0].tensor], axes=tuple(int(a) + 1 for a in attrs["axes"])), HEADS)
        if op == "broadcast" and xs[0].layout == HEADS and tuple(attrs["dims"])[:1] == (0,):
            heads, *rest = attrs["shape"]
            return _Placed(self._op(op, [xs[0].tensor], shape=(self.parts, heads // self.parts, *rest),
                                    dims=(0, *(int(d) + 1 for d in attrs["dims"]))), HEADS)
        if op == "broadcast" and xs[0].layout == REP and tuple(attrs["dims"]) == (1, 2):
            return _Placed(self._op(op, [xs[0].tensor], **attrs), REP, (xs[0], tuple(attrs["shape"])))
        if op == "transpose" and xs[0].layout == HEADS:
            perm = (0, *(int(p) + 1 for p in attrs["perm"]))
            return _Placed(self._op(op, [xs[0].tensor], perm=perm), HEADS)
        if op == "reduce_sum" and xs[0].layout == HEADS and tuple(attrs["axes"]) == (0,):
            return _Placed(self._op(op, [xs[0].tensor], axes=(1,)), PARTIAL)  # the sum over heads
        return _Placed(self._op(op, [self.replicated(x) for x in xs], **attrs), REP)

    def matmul(self, attrs: dict[str, Any], xs: list[_Placed], producers: list[Node]) -> _Placed:
        act = int(attrs.get("act", 0))
        x, w = xs
        kind = self.spec.get(producers[1].attr["name"], "") if producers[1].op == "weight" else ""
        if kind == "col":
            return _Placed(self._op("matmul", [self.spread(x), self.partition(w.tensor, -1)], act=act), LAST)
        if kind == "row":
            lhs = self.partition(x.tensor, -1) if producers[0].op == "input" else self.split(x, LAST)
            out = self._op("matmul", [lhs, self.partition(w.tensor, -2)], act=0)
            if not act:
                return _Placed(out, PARTIAL)
            return _Placed(self._op(ACTIVATIONS[act], [self._op("reduce", [out], axis=self.axis)]), REP)
        if kind == "heads":
            return _Placed(self._op("matmul", [self.heads_input(x), self.partition(w.tensor, -3)], act=act), HEADS)
        if x.layout == HEADS and w.layout == HEADS:  # attention inside each device's heads
            return _Placed(self._op("matmul", [x.tensor, w.tensor], act=act), HEADS)
        if HEADS in (x.layout, w.layout) and len(x.tensor.shape) == len(w.tensor.shape) == 3:
            # a product batched over heads (or experts) with one operand split: split the other alike
            pair = [p.tensor if p.layout == HEADS else self.heads_input(p) for p in (x, w)]
            return _Placed(self._op("matmul", pair, act=act), HEADS)
        return _Placed(self._op("matmul", [self.replicated(x), self.replicated(w)], act=act), REP)

    def conv2d(self, attrs: dict[str, Any], xs: list[_Placed], producers: list[Node]) -> _Placed:
        """Megatron's split for a convolution: `col` splits the output channels (the kernel's first
        dim), `row` the input channels (the kernel's second, and the input's channels: partial sums)."""
        act = int(attrs.get("act", 0))
        x, w = xs
        kind = self.spec.get(producers[1].attr["name"], "") if producers[1].op == "weight" else ""
        if kind == "col":
            return _Placed(self._op("conv2d", [self.spread(x), self.partition(w.tensor, -4)], **attrs), CHANNELS)
        if kind == "row":
            lhs = self.partition(x.tensor, -3) if producers[0].op == "input" else self.split(x, CHANNELS)
            out = self._op("conv2d", [lhs, self.partition(w.tensor, -3)], **{**attrs, "act": 0})
            if not act:
                return _Placed(out, PARTIAL)
            return _Placed(self._op(ACTIVATIONS[act], [self._op("reduce", [out], axis=self.axis)]), REP)
        return _Placed(self._op("conv2d", [self.replicated(x), self.replicated(w)], **attrs), REP)

    def heads_input(self, x: _Placed) -> Tensor:
        """A per-head input broadcast from a replicated value: each device broadcasts its own heads."""
        if x.broadcast_of is not None:
            source, (heads, *rest) = x.broadcast_of
            return self._op("broadcast", [self.spread(source)], shape=(self.parts, heads // self.parts, *rest), dims=(0, 2, 3))
        return self.split(x, HEADS)


def megatron_by_hand(model: str, graph: Graph, mesh: Mesh) -> Graph:
    """The hand-written Megatron plan of `model` on the mesh's last axis of more than one device (a
    size-1 axis splits nothing; with none, the program stays replicated)."""
    real = [i for i, size in enumerate(mesh.shape) if size > 1]
    if not real:
        return graph
    axis = real[-1]
    builder = _Builder(graph, megatron_spec(model, graph), axis, mesh.shape[axis])
    return builder.build().live()

"""The tensor IR: an immutable `Graph` of `Node`s, a `GraphBuilder` to make one, JSON save/load, and
a numpy interpreter that defines what a graph means.

Nodes are stored in topological order (inputs before users), so every pass is a single loop.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from eqsat import ops
from eqsat.errors import GraphFormatError, ShapeError
from eqsat.ops import Activation, Padding, Shape

__all__ = ["Value", "Node", "Graph", "GraphBuilder", "Tensor", "Activation", "Padding"]


GRAPH_FORMAT = "eqsat-graph-1"
"""The Graph JSON format version this code writes and reads; any other version is refused."""

MAX_ELEMENTS = 2**40
"""The largest integer attribute, dimension and tensor (in elements) Graph JSON may hold. 2**40
elements is 4 TiB of float32, far beyond any device's memory, so no real program is refused; and
it keeps egglog's i64 shape arithmetic (a tensor's element count, times a dimension or a
stride in a rule) well inside 2**63, where a larger value would overflow into an egglog panic."""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _node_ref(ref: object, where: str) -> tuple[int, int]:
    """A `[node, output]` pair of integers: `[0.7, 0]` or `[true, 0]` is refused, not rounded."""
    if not (isinstance(ref, (list, tuple)) and len(ref) == 2 and _is_int(ref[0]) and _is_int(ref[1])):
        raise GraphFormatError(f"{where}: a node reference must be [node, output], two integers; got {ref!r}")
    return int(ref[0]), int(ref[1])


def _check_ints(value: object, where: str) -> None:
    """Every integer in an attribute (nested in lists too) at most MAX_ELEMENTS in size."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_ELEMENTS:
            raise GraphFormatError(f"{where}: integer {value} is larger than {MAX_ELEMENTS} (2**40)")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_ints(item, where)
    elif isinstance(value, Mapping):
        for item in value.values():
            _check_ints(item, where)


def _check_size(shape: Shape, where: str) -> None:
    if math.prod(shape) > MAX_ELEMENTS:
        raise GraphFormatError(f"{where}: a tensor of shape {list(shape)} has more than 2**40 elements")


@dataclass(frozen=True, order=True)
class Value:
    """Output `index` of node `node`."""

    node: int
    index: int = 0


@dataclass(frozen=True)
class Node:
    """One op application. `attrs` is a sorted tuple of (name, value) pairs so nodes hash."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[Value, ...]
    shapes: tuple[Shape, ...]

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)


def _freeze(attrs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


@dataclass(frozen=True)
class Graph:
    """A dataflow graph: nodes in topological order and the values it returns."""

    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]

    def shape(self, value: Value) -> Shape:
        return self.nodes[value.node].shapes[value.index]

    @functools.cached_property
    def dtypes(self) -> tuple[tuple[str, ...], ...]:
        """Per node, its outputs' dtypes: inferred from the leaves' `dtype` attributes through the
        registry (`ops.infer_dtypes`), as shapes are, so a node stores none (float32 by default)."""
        out: list[tuple[str, ...]] = []
        for n in self.nodes:
            ins = [out[v.node][v.index] for v in n.inputs]
            out.append(ops.infer_dtypes(n.op, ins, n.attr, len(n.shapes)))
        return tuple(out)

    def dtype(self, value: Value) -> str:
        return self.dtypes[value.node][value.index]

    @functools.cached_property
    def users(self) -> Mapping[int, tuple[int, ...]]:
        """Node → the nodes that read it, once per read (`ewmul(x, x)` reads x twice), in order;
        nodes nobody reads are absent. Computed once per graph (graphs are immutable)."""
        users: dict[int, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                users.setdefault(v.node, []).append(i)
        return MappingProxyType({node: tuple(us) for node, us in users.items()})

    def leaves(self, op: str | None = None) -> list[tuple[int, Node]]:
        """Input and weight nodes (or only those of `op`) with their indices, in order."""
        return [(i, n) for i, n in enumerate(self.nodes) if ops.OPS[n.op].is_leaf and (op is None or n.op == op)]

    def leaf_shapes(self) -> dict[str, Shape]:
        return {n.attr["name"]: n.shapes[0] for _, n in self.leaves()}

    def leaf_dtypes(self) -> dict[str, str]:
        return {n.attr["name"]: str(n.attr["dtype"]) for _, n in self.leaves()}

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def live(self) -> Graph:
        """The same graph without nodes no output depends on (leaves are kept: they are the signature)."""
        needed = {v.node for v in self.outputs}
        for i in range(len(self.nodes) - 1, -1, -1):
            if i in needed:
                needed.update(v.node for v in self.nodes[i].inputs)
        keep = [i for i, n in enumerate(self.nodes) if i in needed or ops.OPS[n.op].is_leaf]
        renumber = {old: new for new, old in enumerate(keep)}
        nodes = tuple(
            Node(self.nodes[i].op, self.nodes[i].attrs,
                 tuple(Value(renumber[v.node], v.index) for v in self.nodes[i].inputs), self.nodes[i].shapes)
            for i in keep
        )
        return Graph(nodes, tuple(Value(renumber[v.node], v.index) for v in self.outputs))

    # --- meaning -----------------------------------------------------------------------------

    def random_inputs(self, seed: int = 0, dtype: Any = None) -> dict[str, np.ndarray]:
        """Inputs and weights drawn from N(0, 1/fan-in) so deep graphs stay in range; batchnorm
        variances are made positive by the interpreter's callers if they need to be. Each float
        leaf in its own dtype (or all in `dtype` if given); integer leaves in [0, 4), bool ones
        half true."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for _, n in self.leaves():
            shape, kind = n.shapes[0], ops.dtype_kind(n.attr["dtype"])
            own = ops.numpy_dtype(n.attr["dtype"])
            if kind == "int":
                out[n.attr["name"]] = rng.integers(0, 4, shape).astype(own)
                continue
            if kind == "bool":
                out[n.attr["name"]] = rng.integers(0, 2, shape).astype(bool)
                continue
            scale = 1.0 if n.op == "input" or len(shape) < 2 else 1.0 / math.sqrt(math.prod(shape[1:]))
            out[n.attr["name"]] = (rng.standard_normal(shape) * scale).astype(own if dtype is None else dtype)
        for n in self.nodes:
            if n.op == "batchnorm":  # variance inputs must be positive
                var = self.nodes[n.inputs[4].node]
                if ops.OPS[var.op].is_leaf:
                    out[var.attr["name"]] = np.abs(out[var.attr["name"]]) + 0.5
        return out

    def evaluate(self, inputs: Mapping[str, np.ndarray], widen: bool = False) -> list[np.ndarray]:
        """Run the graph with the numpy reference semantics of each op. With `widen` (float64
        inputs standing for the reals, as the pipeline's check runs a rewrite) a conversion between
        float dtypes is the identity, as the verifier models it: a bfloat16 product rewritten
        through float32 is the same real product, not one rounded to bfloat16 against an unrounded one."""
        values = self.node_values(inputs, widen)
        return [values[v.node][v.index] for v in self.outputs]

    def node_values(self, inputs: Mapping[str, np.ndarray], widen: bool = False) -> list[tuple[np.ndarray, ...]]:
        """Every node's outputs, as `evaluate` computes them (interior values too: a parallel plan's
        layout of each value is read from them, `eqsat.parallel.layouts`)."""
        values: list[tuple[np.ndarray, ...]] = []
        for node in self.nodes:
            if ops.OPS[node.op].is_leaf:
                name = node.attr["name"]
                if name not in inputs:
                    raise ShapeError(f"no value given for {node.op} '{name}'")
                array = np.asarray(inputs[name])
                if array.shape != node.shapes[0]:
                    raise ShapeError(f"{node.op} '{name}' has shape {node.shapes[0]}, given {array.shape}")
                values.append((array,))
            else:
                args = [values[v.node][v.index] for v in node.inputs]
                if (widen and node.op == "convert_element_type" and args[0].dtype.kind == "f"
                        and ops.dtype_kind(str(node.attr["dtype"])) == "float"):
                    values.append((args[0],))
                    continue
                values.append(ops.evaluate(node.op, args, node.attr))
        return values

    # --- cost-free summaries -----------------------------------------------------------------

    def total_flops(self) -> float:
        return sum(ops.flops(n.op, [self.shape(v) for v in n.inputs], n.attr)
                   for n in self.nodes if not ops.OPS[n.op].is_leaf)

    def runtime_nodes(self) -> list[int]:
        """The live nodes a call runs: not leaves, not computed from weights alone (those are folded
        once at load time, `ops.weight_derived`, as the cost models and the lowering fold them)."""
        live = self.live()
        folded = ops.weight_derived((i, n.op, [v.node for v in n.inputs]) for i, n in enumerate(live.nodes))
        return [i for i, n in enumerate(live.nodes) if i not in folded and not ops.OPS[n.op].is_leaf]

    def runtime_kernels(self) -> int:
        """Kernels a call launches before any fusion: runtime nodes whose op `launches_kernel`."""
        live = self.live()
        return sum(ops.OPS[live.nodes[i].op].launches_kernel for i in live.runtime_nodes())

    def runtime_flops(self) -> float:
        """FLOPs a call computes (weight-only values folded)."""
        live = self.live()
        return float(sum(ops.flops(live.nodes[i].op, [live.shape(v) for v in live.nodes[i].inputs], live.nodes[i].attr)
                         for i in live.runtime_nodes()))

    # --- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": GRAPH_FORMAT,
            "nodes": [  # a leaf's dtype is written only where it is not float32 (files of older eqsat read the same)
                {"op": n.op, "attrs": {k: list(v) if isinstance(v, tuple) else v for k, v in n.attrs
                                       if not (k == "dtype" and v == ops.DEFAULT_DTYPE and ops.OPS[n.op].is_leaf)},
                 "inputs": [[v.node, v.index] for v in n.inputs], "shapes": [list(s) for s in n.shapes]}
                for n in self.nodes
            ],
            "outputs": [[v.node, v.index] for v in self.outputs],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @staticmethod
    def from_json(data: Mapping[str, Any], source: str = "<graph>") -> Graph:
        """Rebuild through the builder, so shapes are re-inferred and checked against the file.
        Refuses, before any work, a format version other than `GRAPH_FORMAT`, a node reference
        that is not a pair of integers, and integers or tensors too large to be a real program
        (see `MAX_ELEMENTS`)."""
        try:
            version = data.get("format", GRAPH_FORMAT)
            if version != GRAPH_FORMAT:
                raise GraphFormatError(f"{source}: unknown graph format {version!r}; this eqsat reads {GRAPH_FORMAT!r}")
            builder = GraphBuilder()
            handles: list[tuple[Tensor, ...]] = []
            for i, entry in enumerate(data["nodes"]):
                args = []
                for ref in entry.get("inputs", []):
                    node, index = _node_ref(ref, f"{source}: node {i} input")
                    if not 0 <= node < i:
                        raise GraphFormatError(f"{source}: node {i} reads node {node}, which is not before it")
                    args.append(handles[node][index])
                _check_ints(entry.get("attrs", {}), f"{source}: node {i} ({entry['op']})")
                outs = builder.apply(entry["op"], args, entry.get("attrs", {}))
                for t in outs:
                    _check_size(t.shape, f"{source}: node {i} ({entry['op']})")
                stored = [tuple(s) for s in entry.get("shapes", [t.shape for t in outs])]
                if stored != [t.shape for t in outs]:
                    raise GraphFormatError(f"{source}: node {i} ({entry['op']}) stores shapes {stored}, "
                                           f"inferred {[t.shape for t in outs]}")
                handles.append(outs)
            refs = [_node_ref(ref, f"{source}: output") for ref in data["outputs"]]
            outputs = [handles[n][k] for n, k in refs]
        except GraphFormatError:
            raise
        except ShapeError as exc:
            raise GraphFormatError(f"{source}: {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise GraphFormatError(f"{source}: malformed graph JSON ({type(exc).__name__}: {exc})") from None
        return builder.build(outputs)

    @staticmethod
    def load(path: str | Path) -> Graph:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise GraphFormatError(f"{path}: cannot read graph JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise GraphFormatError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
        except RecursionError:
            raise GraphFormatError(f"{path}: JSON nested too deeply") from None
        return Graph.from_json(data, str(path))


@dataclass(frozen=True)
class Tensor:
    """A handle on one value while a graph is being built; supports `+`, `*` and `@`."""

    builder: GraphBuilder = field(repr=False, compare=False)
    value: Value
    shape: Shape
    dtype: str = ops.DEFAULT_DTYPE

    def __add__(self, other: Tensor) -> Tensor:
        return self.builder.ewadd(self, other)

    def __mul__(self, other: Tensor) -> Tensor:
        return self.builder.ewmul(self, other)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.builder.matmul(self, other)


class GraphBuilder:
    """Builds a `Graph` one op at a time, inferring and checking shapes as it goes.

    Identical nodes are shared (hash-consing), so building the same expression twice costs nothing.
    """

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._index: dict[Node, int] = {}
        self._names: set[str] = set()

    def apply(self, op: str, inputs: Sequence[Tensor], attrs: Mapping[str, Any] | None = None) -> tuple[Tensor, ...]:
        spec = ops.op_spec(op)
        attrs = spec.normalize_attrs(attrs or {})
        shapes = ops.infer_shapes(op, [t.shape for t in inputs], attrs)
        dtypes = ops.infer_dtypes(op, [t.dtype for t in inputs], attrs, len(shapes))
        node = Node(op, _freeze(attrs), tuple(t.value for t in inputs), shapes)
        if spec.is_leaf:
            if attrs["name"] in self._names:
                raise ShapeError(f"two leaves are named '{attrs['name']}'")
            self._names.add(attrs["name"])
        index = self._index.get(node)
        if index is None:
            index = len(self._nodes)
            self._nodes.append(node)
            self._index[node] = index
        return tuple(Tensor(self, Value(index, k), s, d) for k, (s, d) in enumerate(zip(shapes, dtypes)))

    def _one(self, op: str, *inputs: Tensor, **attrs: Any) -> Tensor:
        return self.apply(op, inputs, attrs)[0]

    def input(self, name: str, shape: Iterable[int], dtype: str = ops.DEFAULT_DTYPE) -> Tensor:
        return self._one("input", name=name, shape=tuple(shape), dtype=dtype)

    def weight(self, name: str, shape: Iterable[int], dtype: str = ops.DEFAULT_DTYPE) -> Tensor:
        return self._one("weight", name=name, shape=tuple(shape), dtype=dtype)

    def ewadd(self, a: Tensor, b: Tensor) -> Tensor:
        return self._one("ewadd", a, b)

    def ewmul(self, a: Tensor, b: Tensor) -> Tensor:
        return self._one("ewmul", a, b)

    def smul(self, a: Tensor, scalar: Tensor) -> Tensor:
        return self._one("smul", a, scalar)

    def matmul(self, a: Tensor, b: Tensor, act: int = Activation.NONE) -> Tensor:
        return self._one("matmul", a, b, act=act)

    def conv2d(self, x: Tensor, w: Tensor, stride: tuple[int, int] = (1, 1), pad: int = Padding.SAME,
               act: int = Activation.NONE) -> Tensor:
        return self._one("conv2d", x, w, stride_h=stride[0], stride_w=stride[1], pad=pad, act=act)

    def relu(self, x: Tensor) -> Tensor:
        return self._one("relu", x)

    def tanh(self, x: Tensor) -> Tensor:
        return self._one("tanh", x)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self._one("sigmoid", x)

    def _pool(self, op: str, x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], pad: int, act: int) -> Tensor:
        return self._one(op, x, kernel_h=kernel[0], kernel_w=kernel[1], stride_h=stride[0], stride_w=stride[1],
                         pad=pad, act=act)

    def poolmax(self, x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], pad: int = Padding.SAME,
                act: int = Activation.NONE) -> Tensor:
        return self._pool("poolmax", x, kernel, stride, pad, act)

    def poolavg(self, x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], pad: int = Padding.SAME,
                act: int = Activation.NONE) -> Tensor:
        return self._pool("poolavg", x, kernel, stride, pad, act)

    def concat(self, axis: int, *xs: Tensor) -> Tensor:
        return self._one("concat", *xs, axis=axis)

    def split(self, x: Tensor, axis: int, sizes: Sequence[int]) -> tuple[Tensor, ...]:
        return self.apply("split", [x], {"axis": axis, "sizes": tuple(sizes)})

    def slice(self, x: Tensor, axis: int, start: int, stop: int) -> Tensor:
        return self._one("slice", x, axis=axis, start=start, stop=stop)

    def transpose(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        return self._one("transpose", x, perm=tuple(perm))

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return self._one("reshape", x, shape=tuple(shape))

    def batchnorm(self, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, eps: float = 1e-5) -> Tensor:
        return self._one("batchnorm", x, scale, bias, mean, var, eps=eps)

    def enlarge(self, w: Tensor, ref: Tensor) -> Tensor:
        return self._one("enlarge", w, ref)

    def merge_gconv(self, w: Tensor, input_shape: Sequence[int], count: int) -> Tensor:
        return self._one("merge_gconv", w, input_shape=tuple(input_shape), count=count)

    def build(self, outputs: Sequence[Tensor]) -> Graph:
        """Freeze the graph; `outputs` marks the values it returns (one or several)."""
        if not outputs:
            raise ShapeError("a graph needs at least one output")
        return Graph(tuple(self._nodes), tuple(t.value for t in outputs))

"""`Graph` → JAX function, through one table from op name to a `jax.lax` / `jax.numpy` call.

Each lowering takes the op's input arrays and its normalized attributes and returns a tuple of
outputs, exactly like the numpy semantics in `eqsat/ops.py`, which it must match (tests/test_ops.py
checks every op). Window ops use explicit (low, high) paddings from `eqsat.ops.window_out_and_pads`
so SAME means TensorFlow's SAME on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat import ops
from eqsat.cost import weight_only_nodes  # the cost model and the runner agree on what folds
from eqsat.errors import ShapeError, UnknownOpError
from eqsat.ir import Graph, GraphBuilder, Tensor
from eqsat.ops import Activation

Array = jax.Array
Lowering = Callable[[Sequence[Array], Mapping[str, Any], Any], tuple[Array, ...]]

__all__ = ["LOWERINGS", "ACTIVATIONS", "to_jax", "to_jax_positional", "lower_node", "fold_weights", "PRECISIONS"]

ACTIVATIONS: Mapping[int, Callable[[Array], Array]] = MappingProxyType({
    Activation.NONE: lambda x: x,
    Activation.SIGMOID: jax.nn.sigmoid,
    Activation.RELU: jax.nn.relu,
    Activation.TANH: jnp.tanh,
})

PRECISIONS: Mapping[str, lax.Precision] = MappingProxyType({
    "default": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST,
})


def _act(x: Array, code: int) -> Array:
    return ACTIVATIONS[Activation(code)](x)


def _window_pads(shape: Sequence[int], kh: int, kw: int, sh: int, sw: int, pad: int) -> list[tuple[int, int]]:
    _, top, bottom = ops.window_out_and_pads(shape[2], kh, sh, pad)
    _, left, right = ops.window_out_and_pads(shape[3], kw, sw, pad)
    return [(top, bottom), (left, right)]


def _matmul(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    return (_act(jnp.matmul(xs[0], xs[1], precision=precision), a["act"]),)


def _conv2d(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    x, w = xs
    if x.ndim > 4:  # leading batch axes shared with the weight: one conv each
        return (jax.vmap(lambda xi, wi: _conv2d((xi, wi), a, precision)[0])(x, w),)
    pads = _window_pads(x.shape, w.shape[2], w.shape[3], a["stride_h"], a["stride_w"], a["pad"])
    out = lax.conv_general_dilated(
        x, w, window_strides=(a["stride_h"], a["stride_w"]), padding=pads,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=x.shape[1] // w.shape[1],
        precision=precision,
    )
    return (_act(out, a["act"]),)


def _conv2d_nhwc(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    x, w = xs  # NHWC x HWIO: XLA:CPU's own conv layout, no transposes around the call
    _, top, bottom = ops.window_out_and_pads(x.shape[1], w.shape[0], a["stride_h"], a["pad"])
    _, left, right = ops.window_out_and_pads(x.shape[2], w.shape[1], a["stride_w"], a["pad"])
    out = lax.conv_general_dilated(
        x, w, window_strides=(a["stride_h"], a["stride_w"]), padding=[(top, bottom), (left, right)],
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=x.shape[3] // w.shape[2],
        precision=precision,
    )
    return (_act(out, a["act"]),)


def _pool(reduce: str) -> Lowering:
    def lower(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
        x = xs[0]
        if x.ndim > 4:  # leading batch axes (one pool per device): one pool each
            return (jax.vmap(lambda xi: lower((xi,), a, precision)[0])(x),)
        kh, kw = a["kernel_h"], a["kernel_w"]
        pads = [(0, 0), (0, 0), *_window_pads(x.shape, kh, kw, a["stride_h"], a["stride_w"], a["pad"])]
        dims, strides = (1, 1, kh, kw), (1, 1, a["stride_h"], a["stride_w"])
        # numpy constants (not traced values), so JAX sees a max / sum pool and can differentiate it
        if reduce == "max":
            lowest = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min, x.dtype)
            out = lax.reduce_window(x, lowest, lax.max, dims, strides, pads)
        else:  # padded positions count as zeros, as in ops.py
            out = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, strides, pads) / (kh * kw)
        return (_act(out.astype(x.dtype), a["act"]),)

    return lower


def _split(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    cuts = np.cumsum(a["sizes"])[:-1].tolist()
    return tuple(jnp.split(xs[0], cuts, axis=a["axis"]))


def _batchnorm(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    x, scale, bias, mean, var = xs
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    inv = (scale / jnp.sqrt(var + jnp.asarray(a["eps"], dtype=x.dtype))).reshape(bshape)
    return ((x - mean.reshape(bshape)) * inv + bias.reshape(bshape),)


def _enlarge(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    w, ref = xs
    ph, pw = (ref.shape[2] - w.shape[2]) // 2, (ref.shape[3] - w.shape[3]) // 2
    return (jnp.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw))),)


def _merge_gconv(xs: Sequence[Array], a: Mapping[str, Any], precision: Any) -> tuple[Array, ...]:
    (w,), count = xs, a["count"]
    cg = w.shape[1]
    slots = ops.merged_group_slots(w.shape[0], a["input_shape"][1] // cg, count)
    out = jnp.zeros((w.shape[0], cg * count, *w.shape[2:]), dtype=w.dtype)
    for s in range(count):
        rows = np.flatnonzero(slots == s)
        out = out.at[rows, s * cg:(s + 1) * cg].set(w[rows])
    return (out,)


def _one(fn: Callable[..., Array]) -> Lowering:
    return lambda xs, a, precision: (fn(*xs),)


LOWERINGS: Mapping[str, Lowering] = MappingProxyType({
    "ewadd": _one(jnp.add),
    "ewmul": _one(jnp.multiply),
    "smul": lambda xs, a, p: (xs[0] * xs[1].reshape(()),),
    "matmul": _matmul,
    "conv2d": _conv2d,
    "conv2d_nhwc": _conv2d_nhwc,
    "relu": _one(jax.nn.relu),
    "tanh": _one(jnp.tanh),
    "sigmoid": _one(jax.nn.sigmoid),
    "poolmax": _pool("max"),
    "poolavg": _pool("avg"),
    "concat": lambda xs, a, p: (jnp.concatenate(list(xs), axis=a["axis"]),),
    "split": _split,
    "slice": lambda xs, a, p: (lax.slice_in_dim(xs[0], a["start"], a["stop"], axis=a["axis"]),),
    "transpose": lambda xs, a, p: (jnp.transpose(xs[0], a["perm"]),),
    "reshape": lambda xs, a, p: (jnp.reshape(xs[0], a["shape"]),),
    "batchnorm": _batchnorm,
    "enlarge": _enlarge,
    "merge_gconv": _merge_gconv,
    # ops that capture (jax_backend/capture.py) produces
    "ewsub": _one(jnp.subtract),
    "ewdiv": _one(jnp.divide),
    "ewmax": _one(jnp.maximum),
    "ewmin": _one(jnp.minimum),
    "pow": _one(lax.pow),
    "exp": _one(jnp.exp),
    "log": _one(jnp.log),
    "neg": _one(jnp.negative),
    "abs": _one(jnp.abs),
    "sin": _one(jnp.sin),
    "cos": _one(jnp.cos),
    "erf": _one(lax.erf),
    "erfc": _one(lax.erfc),
    "sqrt": _one(jnp.sqrt),
    "rsqrt": _one(lax.rsqrt),
    "reduce_sum": lambda xs, a, p: (jnp.sum(xs[0], axis=tuple(a["axes"])),),
    "reduce_max": lambda xs, a, p: (jnp.max(xs[0], axis=tuple(a["axes"])),),
    "broadcast": lambda xs, a, p: (lax.broadcast_in_dim(xs[0], tuple(a["shape"]), tuple(a["dims"])),),
    # mask and index math: integer and boolean values
    "iota": lambda xs, a, p: (lax.broadcasted_iota(ops.numpy_dtype(a["dtype"]), tuple(a["shape"]), a["dimension"]),),
    "lt": _one(lax.lt), "le": _one(lax.le), "gt": _one(lax.gt), "ge": _one(lax.ge), "eq": _one(lax.eq),
    "ne": _one(lax.ne),
    "select_n": _one(lax.select_n),
    "convert_element_type": lambda xs, a, p: (lax.convert_element_type(xs[0], ops.numpy_dtype(a["dtype"])),),
    "iadd": _one(lax.add), "isub": _one(lax.sub), "imul": _one(lax.mul), "imax": _one(lax.max), "imin": _one(lax.min),
    "and": _one(lax.bitwise_and), "or": _one(lax.bitwise_or), "not": _one(lax.bitwise_not),
    "stop_gradient": _one(lax.stop_gradient),
    # distribution ops (eqsat.distribution) on one device: their stacked meaning; on a mesh they
    # run as collectives (jax_backend/shard.py)
    "partition": lambda xs, a, p: (jnp.stack(jnp.split(xs[0], a["parts"], axis=xs[0].ndim + a["dim"])),),
    "combine": lambda xs, a, p: (jnp.concatenate(list(xs[0]), axis=xs[0].ndim - 1 + a["dim"]),),
    "replicate": lambda xs, a, p: (jnp.stack([xs[0]] * a["parts"]),),
    "reduce": lambda xs, a, p: (jnp.sum(xs[0], axis=0),),
    "all_reduce": lambda xs, a, p: (jnp.stack([jnp.sum(xs[0], axis=0)] * xs[0].shape[0]),),
    "all_gather": lambda xs, a, p: (jnp.stack([jnp.concatenate(list(xs[0]), axis=xs[0].ndim - 1 + a["dim"])]
                                              * xs[0].shape[0]),),
    "reduce_scatter": lambda xs, a, p: (jnp.stack(jnp.split(jnp.sum(xs[0], axis=0), xs[0].shape[0],
                                                            axis=xs[0].ndim - 1 + a["dim"])),),
    "all_to_all": lambda xs, a, p: (jnp.stack(jnp.split(jnp.concatenate(list(xs[0]), axis=xs[0].ndim - 1 + a["concat_dim"]),
                                                        xs[0].shape[0], axis=xs[0].ndim - 1 + a["split_dim"])),),
})
"""Op name → lowering(inputs, normalized attrs, matmul/conv precision) → outputs."""


def lower_node(op: str, inputs: Sequence[Array], attrs: Mapping[str, Any],
               precision: str = "highest") -> tuple[Array, ...]:
    """Run one op in JAX (attributes normalized through the registry)."""
    try:
        lowering = LOWERINGS[op]
    except KeyError:
        raise UnknownOpError(f"op '{op}' has no JAX lowering; lowered ops: {', '.join(sorted(LOWERINGS))}") from None
    return lowering(inputs, ops.op_spec(op).normalize_attrs(attrs), PRECISIONS[precision])


def _check_lowerable(graph: Graph) -> None:
    for node in graph.nodes:
        if not ops.op_spec(node.op).is_leaf and node.op not in LOWERINGS:
            raise UnknownOpError(f"op '{node.op}' has no JAX lowering; lowered ops: {', '.join(sorted(LOWERINGS))}")


def to_jax(graph: Graph, precision: str = "highest") -> Callable[[Mapping[str, Array]], list[Array]]:
    """A traceable function from {leaf name: array} to the graph's outputs (wrap it in `jax.jit`).

    `precision` applies to matmul and conv: "highest" (default) keeps float32 on GPUs so numerics
    match the numpy reference; "default" lets XLA use TF32/bf16 passes for speed.
    """
    if precision not in PRECISIONS:
        raise ShapeError(f"unknown precision '{precision}'; expected one of {', '.join(PRECISIONS)}")
    _check_lowerable(graph)
    prec = PRECISIONS[precision]
    plan = [(node.op, ops.op_spec(node.op).normalize_attrs(node.attr), node.inputs, node.shapes)
            for node in graph.nodes]
    is_leaf = [ops.op_spec(node.op).is_leaf for node in graph.nodes]
    outputs = graph.outputs

    def run(inputs: Mapping[str, Array]) -> list[Array]:
        values: list[tuple[Array, ...]] = []
        for leaf, (op, attrs, args, shapes) in zip(is_leaf, plan):
            if leaf:
                name = attrs["name"]
                if name not in inputs:
                    raise ShapeError(f"no value given for {op} '{name}'")
                array = inputs[name]
                if tuple(array.shape) != shapes[0]:
                    raise ShapeError(f"{op} '{name}' has shape {shapes[0]}, given {tuple(array.shape)}")
                values.append((array,))
            else:
                values.append(LOWERINGS[op]([values[v.node][v.index] for v in args], attrs, prec))
        return [values[v.node][v.index] for v in outputs]

    return run


def _read_at_run_time(graph: Graph, constant: set[int] | frozenset[int]) -> set[int]:
    """Nodes whose values run-time ops (nodes outside `constant`) or the outputs read."""
    return {v.node for i, n in enumerate(graph.nodes) if i not in constant for v in n.inputs} | \
        {v.node for v in graph.outputs}


def _foldable_nodes(graph: Graph, should_fold: Callable[[Graph, int], bool]) -> frozenset[int]:
    """Weight-only nodes, less those read at run time that `should_fold` rejects (a broadcast is
    cheaper to recompute inside its consumer's fusion than to read from memory); such a node's
    inputs are then precomputed instead, so `w * broadcast(k)` still folds to one weight."""
    constant = set(weight_only_nodes(graph))
    read_at_run_time = _read_at_run_time(graph, constant)
    while True:
        rejected = {i for i in read_at_run_time & constant
                    if graph.nodes[i].op != "weight" and not should_fold(graph, i)}
        if not rejected:
            return frozenset(constant)
        constant -= rejected
        read_at_run_time |= {v.node for i in rejected for v in graph.nodes[i].inputs}


def fold_weights(graph: Graph, values: Mapping[str, np.ndarray],
                 prefix: str = "folded",
                 should_fold: Callable[[Graph, int], bool] | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """Precompute every computed value that depends on weights alone (concatenated or enlarged
    kernels the optimizer introduces) and make it a new weight, as a model would at load time.

    Returns the graph where those values are weight leaves named `{prefix}{node}` and the values of
    all weights it reads (numpy reference semantics, once). `should_fold(graph, node)`, if given,
    keeps some weight-only nodes computed at run time (e.g. broadcasts, cheaper than their result).
    """
    constant = weight_only_nodes(graph) if should_fold is None else _foldable_nodes(graph, should_fold)
    users = _read_at_run_time(graph, constant)
    computed: dict[int, tuple[np.ndarray, ...]] = {}
    builder = GraphBuilder()
    handles: list[tuple[Tensor, ...]] = []
    out_values = dict(values)
    for i, node in enumerate(graph.nodes):
        spec = ops.op_spec(node.op)
        if i in constant:
            if spec.is_leaf:
                computed[i] = (np.asarray(values[node.attr["name"]]),)
            else:
                computed[i] = ops.evaluate(node.op, [computed[v.node][v.index] for v in node.inputs], node.attr)
            if i not in users:  # only read by other folded values
                handles.append(())
                continue
            if spec.is_leaf:
                handles.append(builder.apply(node.op, [], node.attr))
                continue
            names = [f"{prefix}{i}_{k}" if len(node.shapes) > 1 else f"{prefix}{i}" for k in range(len(node.shapes))]
            dtypes = graph.dtypes[i]
            handles.append(tuple(builder.weight(n, s, d) for n, s, d in zip(names, node.shapes, dtypes)))
            out_values.update((n, np.asarray(v).astype(ops.numpy_dtype(d))) for n, v, d in zip(names, computed[i], dtypes))
            continue
        handles.append(builder.apply(node.op, [handles[v.node][v.index] for v in node.inputs], node.attr))
    folded = builder.build([handles[v.node][v.index] for v in graph.outputs])
    return folded, {n.attr["name"]: out_values[n.attr["name"]] for _, n in folded.leaves()}


def to_jax_positional(graph: Graph, precision: str = "highest") -> tuple[list[str], Callable[..., list[Array]]]:
    """The leaf names in graph order and a function taking the leaves positionally in that order."""
    names = [n.attr["name"] for _, n in graph.leaves()]
    by_name = to_jax(graph, precision)

    def run(*arrays: Array) -> list[Array]:
        if len(arrays) != len(names):
            raise ShapeError(f"expected {len(names)} arrays ({', '.join(names)}), got {len(arrays)}")
        return by_name(dict(zip(names, arrays)))

    return names, run

"""Pallas kernels for fused patterns, each with a custom_vjp so `jax.grad` works through them.

- `matmul_bias_act`: (M,K) @ (K,N) + bias(N) followed by none / relu / tanh / sigmoid, one kernel.
- `elementwise`: a chain of same-shape elementwise ops in one kernel.

`to_jax_pallas(graph)` lowers a Graph like `lower.to_jax`, but replaces those patterns by kernel
calls. On CPU the kernels run with `interpret=True` (tests); the default CPU lowering does not use
them. On a GPU they compile through Triton/Mosaic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from eqsat import ops
from eqsat.ir import Graph, Value
from eqsat.ops import Activation
from jax_backend.lower import ACTIVATIONS, LOWERINGS, PRECISIONS

Array = jax.Array

__all__ = ["matmul_bias_act", "elementwise", "to_jax_pallas", "UNARY_CHAIN_OPS"]

# derivative of the activation, written in terms of its output y
_ACT_GRAD: Mapping[int, Callable[[Array], Array]] = {
    Activation.NONE: lambda y: jnp.ones_like(y), Activation.RELU: lambda y: (y > 0).astype(y.dtype),
    Activation.TANH: lambda y: 1.0 - y * y, Activation.SIGMOID: lambda y: y * (1.0 - y),
}
_ACT_OF_OP: Mapping[str, int] = {act.op_name: act for act in Activation if act.op_name}


def _unary(op: str) -> Callable[[Array], Array]:
    """The op's one lowering (`lower.LOWERINGS`) as a function of one array, so a fused chain
    computes, and differentiates, exactly as the unfused ops do under jax.jit."""
    lowering = LOWERINGS[op]
    return lambda x: lowering([x], {}, None)[0]


UNARY_CHAIN_OPS: Mapping[str, Callable[[Array], Array]] = {
    op: _unary(op) for op, spec in ops.OPS.items() if spec.is_unary_elementwise}
"""Ops an elementwise kernel chains: the registry's unary elementwise ops, lowered as `LOWERINGS`."""


def _block(dim: int, want: int = 128) -> int:
    return want if dim % want == 0 else dim


# --- matmul + bias + activation -----------------------------------------------------------------------

def _mba_kernel(act: int, x_ref: Any, w_ref: Any, b_ref: Any, o_ref: Any) -> None:
    z = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32) + b_ref[...]
    o_ref[...] = ACTIVATIONS[act](z).astype(o_ref.dtype)


def _mba_call(x: Array, w: Array, b: Array, act: int, interpret: bool) -> Array:
    m, k = x.shape
    n = w.shape[1]
    bm, bn = (m, n) if interpret else (_block(m), _block(n))
    return pl.pallas_call(
        functools.partial(_mba_kernel, act),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret,
    )(x, w, b.reshape(1, n))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def matmul_bias_act(x: Array, w: Array, b: Array, act: int = 0, interpret: bool = False) -> Array:
    """act(x @ w + b) in one Pallas kernel; x (M,K), w (K,N), b (N,)."""
    return _mba_call(x, w, b, act, interpret)


def _mba_fwd(x: Array, w: Array, b: Array, act: int, interpret: bool) -> tuple[Array, tuple[Array, ...]]:
    y = _mba_call(x, w, b, act, interpret)
    return y, (x, w, y)


def _mba_bwd(act: int, interpret: bool, res: tuple[Array, ...], g: Array) -> tuple[Array, Array, Array]:
    x, w, y = res
    dz = g * _ACT_GRAD[act](y)
    return dz @ w.T, x.T @ dz, jnp.sum(dz, axis=0)


matmul_bias_act.defvjp(_mba_fwd, _mba_bwd)


# --- elementwise chains --------------------------------------------------------------------------------

def _ew_call(fn: Callable[..., Array], xs: Sequence[Array], interpret: bool) -> Array:
    shape = xs[0].shape

    def kernel(*refs: Any) -> None:
        *ins, out = refs
        out[...] = fn(*(r[...] for r in ins)).astype(out.dtype)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, xs[0].dtype), interpret=interpret)(*xs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def elementwise(fn: Callable[..., Array], interpret: bool, *xs: Array) -> Array:
    """fn(*xs) (same-shape elementwise) as one Pallas kernel; the gradient is fn's own."""
    return _ew_call(fn, xs, interpret)


def _ew_fwd(fn: Callable[..., Array], interpret: bool, *xs: Array) -> tuple[Array, tuple[Array, ...]]:
    return _ew_call(fn, xs, interpret), xs


def _ew_bwd(fn: Callable[..., Array], interpret: bool, xs: tuple[Array, ...], g: Array) -> tuple[Array, ...]:
    _, vjp = jax.vjp(fn, *xs)
    return tuple(vjp(g))


elementwise.defvjp(_ew_fwd, _ew_bwd)


# --- lowering a graph ------------------------------------------------------------------------------------

def _row_bias(graph: Graph, value: Value, n: int) -> Value | None:
    """The (N,)-sized source of a chain of broadcasts that adds it to every row, if that is what it is."""
    while graph.nodes[value.node].op == "broadcast":
        node = graph.nodes[value.node]
        dims, src = node.attr["dims"], graph.shape(node.inputs[0])
        if src and dims[-1] != len(node.shapes[0]) - 1:
            return None
        value = node.inputs[0]
    shape = graph.shape(value)
    if not shape or shape[-1] != n or ops.numel(shape) != n:
        return None
    return value


def _plan(graph: Graph) -> tuple[dict[int, tuple[str, tuple[Any, ...]]], set[int]]:
    """Fused groups keyed by their last node, and the nodes they absorb."""
    users = graph.users
    outputs = {v.node for v in graph.outputs}
    only_user = {i: us[0] for i, us in users.items() if len(us) == 1 and i not in outputs}
    groups: dict[int, tuple[str, tuple[Any, ...]]] = {}
    absorbed: set[int] = set()
    for i, node in enumerate(graph.nodes):
        if i in absorbed or i in groups:
            continue
        if node.op == "matmul" and len(node.shapes[0]) == 2:
            tail, bias, act = i, None, node.attr["act"]
            nxt = only_user.get(i)
            if act == 0 and nxt is not None and graph.nodes[nxt].op == "ewadd":
                add = graph.nodes[nxt]
                other = add.inputs[1] if add.inputs[0].node == i else add.inputs[0]
                bias = _row_bias(graph, other, node.shapes[0][1])
                if bias is not None:
                    tail = nxt
                    after = only_user.get(nxt)
                    if after is not None and graph.nodes[after].op in _ACT_OF_OP:
                        tail, act = after, _ACT_OF_OP[graph.nodes[after].op]
            members = [j for j in (i, only_user.get(i), tail) if j is not None and i <= j <= tail]
            absorbed.update(j for j in members if j != tail)
            groups[tail] = ("matmul_bias_act", (node.inputs[0], node.inputs[1], bias, act))
        elif node.op in UNARY_CHAIN_OPS:
            chain = [i]
            while (nxt := only_user.get(chain[-1])) is not None and graph.nodes[nxt].op in UNARY_CHAIN_OPS:
                chain.append(nxt)
            absorbed.update(chain[:-1])
            groups[chain[-1]] = ("elementwise", (node.inputs[0], tuple(graph.nodes[j].op for j in chain)))
    return groups, absorbed


def _chain_fn(op_names: tuple[str, ...]) -> Callable[[Array], Array]:
    def fn(x: Array) -> Array:
        for name in op_names:
            x = UNARY_CHAIN_OPS[name](x)
        return x

    return fn


def to_jax_pallas(graph: Graph, interpret: bool = False) -> tuple[Callable[[Mapping[str, Array]], list[Array]],
                                                                    tuple[str, ...]]:
    """Like `lower.to_jax(graph)` with fused patterns as Pallas kernels; also names the kernels used."""
    groups, absorbed = _plan(graph)
    kernels = tuple(sorted({f"pallas:{kind}" + (f"[{'+'.join(args[1])}]" if kind == "elementwise" else "")
                            for kind, args in groups.values()}))
    prec = PRECISIONS["default"]

    def run(inputs: Mapping[str, Array]) -> list[Array]:
        values: dict[int, tuple[Array, ...]] = {}

        def get(v: Value) -> Array:
            return values[v.node][v.index]

        for i, node in enumerate(graph.nodes):
            if i in absorbed:
                continue
            spec = ops.op_spec(node.op)
            if spec.is_leaf:
                values[i] = (inputs[node.attr["name"]],)
            elif i in groups:
                kind, args = groups[i]
                if kind == "matmul_bias_act":
                    x, w, bias, act = args
                    n = graph.shape(w)[1]
                    b = jnp.zeros((n,), get(x).dtype) if bias is None else get(bias).reshape(n)
                    values[i] = (matmul_bias_act(get(x), get(w), b, act, interpret),)
                else:
                    src, names = args
                    values[i] = (elementwise(_chain_fn(names), interpret, get(src)),)
            else:
                values[i] = LOWERINGS[node.op]([get(v) for v in node.inputs], spec.normalize_attrs(node.attr), prec)
        return [get(v) for v in graph.outputs]

    return run, kernels

"""The JAX target programs of the benchmark: each a function plus example arguments.

Sizes are realistic (attention: seq 256, d 512; MLP: batch 256; inception: GoogLeNet's 3a block)
so that gains stand out of timing noise, yet small enough for the benchmark to run in minutes on
two CPU cores. Weights are closed over, as in inference: they are constants the optimizer may
precompute from (e.g. the concatenated Q/K/V weights); the mixed program keeps its weight as an
argument, so gradients with respect to weights are checked too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["JaxProgram", "PROGRAMS", "transformer_stack"]


@dataclass(frozen=True)
class JaxProgram:
    name: str
    fn: Callable[..., Any]
    make_args: Callable[[int], tuple[Any, ...]]
    batch_arg: int = 0  # the argument vmap maps over
    target: bool = True  # one of the six target programs (the headline geomean); else an extra
    weights: tuple[Any, ...] = ()  # the constants `fn` closes over, after its data arguments (see `bound`)

    def bound(self, variant: Callable[..., Any]) -> Callable[..., Any]:
        """`variant` (same signature as the unbound program: data, then weights) closed over this
        program's weights, as `fn` is; hand-written variants are compared this way."""
        return _with_weights(variant, self.weights) if self.weights else variant


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype=jnp.float32)


def attention(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array, heads: int = 8) -> jax.Array:
    """One self-attention block, separate Q/K/V projections."""
    s, d = x.shape
    q, k, v = x @ wq, x @ wk, x @ wv
    split = lambda t: t.reshape(s, heads, d // heads).transpose(1, 0, 2)  # noqa: E731
    scores = jnp.einsum("hqd,hkd->hqk", split(q), split(k)) / np.sqrt(d // heads)
    out = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), split(v))
    return x + out.transpose(1, 0, 2).reshape(s, d) @ wo


def _with_weights(fn: Callable[..., Any], weights: tuple[Any, ...]) -> Callable[..., Any]:
    """`fn` with trained weights closed over (inference: weights are constants, data are arguments)."""
    def bound(*data: Any) -> Any:
        return fn(*data, *weights)

    bound.__name__ = fn.__name__
    return bound


def _attention() -> JaxProgram:
    rng = np.random.default_rng(100)
    d = 512
    weights = tuple(_normal(rng, d, d, scale=d ** -0.5) for _ in range(4))
    return JaxProgram("attention", _with_weights(attention, weights),
                      lambda seed: (_normal(np.random.default_rng(seed), 256, d),), weights=weights)


def nasrnn(x: jax.Array, h: jax.Array, wx: jax.Array, wh: jax.Array) -> jax.Array:
    """A NasRNN-style cell: eight gates, each its own matmuls of x and h, combined pairwise."""
    gates = [jnp.tanh(x @ wx[i] + h @ wh[i]) if i % 2 else jax.nn.sigmoid(x @ wx[i] + h @ wh[i]) for i in range(8)]
    a = gates[0] * gates[1] + gates[2] * gates[3]
    b = jax.nn.relu(gates[4] + gates[5]) * jnp.tanh(gates[6] + gates[7])
    return jnp.tanh(a + b)


def _nasrnn(batch: int, name: str, target: bool = True) -> JaxProgram:
    """The cell at `batch` 64 (a target) or 1 (Tensat's inference setting, where each of the 16
    matmuls is a matrix-vector product and merging them pays)."""
    rng = np.random.default_rng(101)
    d = 512
    weights = (_normal(rng, 8, d, d, scale=d ** -0.5), _normal(rng, 8, d, d, scale=d ** -0.5))

    def make_args(seed: int) -> tuple[Any, ...]:
        r = np.random.default_rng(seed)
        return _normal(r, batch, d), _normal(r, batch, d)

    return JaxProgram(name, _with_weights(nasrnn, weights), make_args, target=target, weights=weights)


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


def inception(x: jax.Array, w1: jax.Array, r3: jax.Array, w3: jax.Array, r5: jax.Array, w5: jax.Array,
              wp: jax.Array) -> jax.Array:
    """GoogLeNet's inception block: a 1x1 branch, 1x1 reductions before a 3x3 and a 5x5 conv (the
    three 1x1 convs read the same input), and a pooled 1x1 branch, concatenated."""
    pooled = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")
    relu = jax.nn.relu
    branches = [relu(_conv(x, w1)), relu(_conv(relu(_conv(x, r3)), w3)), relu(_conv(relu(_conv(x, r5)), w5)),
                relu(_conv(pooled, wp))]
    return jnp.concatenate(branches, axis=1)


def _inception() -> JaxProgram:
    rng = np.random.default_rng(102)
    c = 192  # GoogLeNet's inception (3a) sizes on a 28x28 map
    kernel = lambda o, i, k: _normal(rng, o, i, k, k, scale=(k * k * i) ** -0.5)  # noqa: E731
    weights = (kernel(64, c, 1), kernel(96, c, 1), kernel(128, 96, 3), kernel(16, c, 1), kernel(32, 16, 5),
               kernel(32, c, 1))
    return JaxProgram("inception", _with_weights(inception, weights),
                      lambda seed: (_normal(np.random.default_rng(seed), 4, c, 28, 28),), weights=weights)


def mlp(x: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, w3: jax.Array) -> jax.Array:
    """Three-layer MLP with biases, relu and tanh."""
    h = jax.nn.relu(x @ w1 + b1)
    h = jnp.tanh(h @ w2 + b2)
    return h @ w3


def _mlp() -> JaxProgram:
    rng = np.random.default_rng(103)
    weights = (_normal(rng, 512, 1024, scale=512 ** -0.5), _normal(rng, 1024), _normal(rng, 1024, 1024, scale=1024 ** -0.5),
               _normal(rng, 1024), _normal(rng, 1024, 256, scale=1024 ** -0.5))
    return JaxProgram("mlp", _with_weights(mlp, weights), lambda seed: (_normal(np.random.default_rng(seed), 256, 512),),
                      weights=weights)


def conv_bn(x: jax.Array, w: jax.Array, scale: jax.Array, bias: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
    """Conv followed by inference batch norm and relu."""
    y = _conv(x, w)
    inv = scale / jnp.sqrt(var + 1e-5)
    return jax.nn.relu((y - mean[None, :, None, None]) * inv[None, :, None, None] + bias[None, :, None, None])


def _conv_bn() -> JaxProgram:
    rng = np.random.default_rng(104)
    c = 64
    weights = (_normal(rng, c, c, 3, 3, scale=(9 * c) ** -0.5), _normal(rng, c), _normal(rng, c), _normal(rng, c),
               jnp.abs(_normal(rng, c)) + 0.5)
    return JaxProgram("conv_bn", _with_weights(conv_bn, weights),
                      lambda seed: (_normal(np.random.default_rng(seed), 4, c, 32, 32),), weights=weights)


def mixed(x: jax.Array, w: jax.Array) -> jax.Array:
    """Supported ops around cumsum, sort and a fori_loop (replayed verbatim)."""
    h = jnp.tanh(x @ w)
    c = jnp.cumsum(h, axis=1)
    s = jnp.sort(c, axis=1)
    loop = lax.fori_loop(0, 3, lambda i, t: jnp.tanh(t @ w), s)
    return jax.nn.relu(loop @ w + h)


def _mixed_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return (_normal(rng, 256, 256), _normal(rng, 256, 256, scale=256 ** -0.5))


def transformer_stack(layers: int = 12, d: int = 128, s: int = 64) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A `layers`-deep stack of attention + MLP blocks (for the first-call overhead target)."""
    rng = np.random.default_rng(0)
    params = [tuple(_normal(rng, d, d, scale=d ** -0.5) for _ in range(6)) for _ in range(layers)]

    def fn(x: jax.Array, params: Any) -> jax.Array:
        for wq, wk, wv, wo, w1, w2 in params:
            x = attention(x, wq, wk, wv, wo)
            x = x + jax.nn.relu(x @ w1) @ w2
        return x

    return fn, (_normal(rng, s, d), params)


PROGRAMS: tuple[JaxProgram, ...] = (
    _attention(),
    _nasrnn(64, "nasrnn"),
    _nasrnn(1, "nasrnn_b1", target=False),
    _inception(),
    _mlp(),
    _conv_bn(),
    JaxProgram("mixed_cumsum_sort_loop", mixed, _mixed_args),
)

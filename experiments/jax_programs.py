"""The JAX target programs of the benchmark: each a function plus example arguments.

Sizes are CPU-sized (a few ms per call) so the benchmark runs in minutes on a small machine.
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


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype=jnp.float32)


def attention(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array) -> jax.Array:
    """One self-attention block, separate Q/K/V projections, 4 heads."""
    s, d = x.shape
    h = 4
    q, k, v = x @ wq, x @ wk, x @ wv
    split = lambda t: t.reshape(s, h, d // h).transpose(1, 0, 2)  # noqa: E731
    scores = jnp.einsum("hqd,hkd->hqk", split(q), split(k)) / np.sqrt(d // h)
    out = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), split(v))
    return x + out.transpose(1, 0, 2).reshape(s, d) @ wo


def _attention_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    d = 256
    return (_normal(rng, 128, d), *(_normal(rng, d, d, scale=d ** -0.5) for _ in range(4)))


def nasrnn(x: jax.Array, h: jax.Array, wx: jax.Array, wh: jax.Array) -> jax.Array:
    """A NasRNN-style cell: eight gates, each its own matmuls of x and h, combined pairwise."""
    gates = [jnp.tanh(x @ wx[i] + h @ wh[i]) if i % 2 else jax.nn.sigmoid(x @ wx[i] + h @ wh[i]) for i in range(8)]
    a = gates[0] * gates[1] + gates[2] * gates[3]
    b = jax.nn.relu(gates[4] + gates[5]) * jnp.tanh(gates[6] + gates[7])
    return jnp.tanh(a + b)


def _nasrnn_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    d = 256
    return (_normal(rng, 64, d), _normal(rng, 64, d), _normal(rng, 8, d, d, scale=d ** -0.5),
            _normal(rng, 8, d, d, scale=d ** -0.5))


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


def inception(x: jax.Array, w1: jax.Array, w3: jax.Array, w5: jax.Array, wp: jax.Array) -> jax.Array:
    """Inception-style block: parallel 1x1, 3x3, 5x5 convs and a pooled 1x1, concatenated."""
    pooled = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")
    branches = [jax.nn.relu(_conv(x, w1)), jax.nn.relu(_conv(x, w3)), jax.nn.relu(_conv(x, w5)),
                jax.nn.relu(_conv(pooled, wp))]
    return jnp.concatenate(branches, axis=1)


def _inception_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    c = 32
    return (_normal(rng, 2, c, 16, 16), _normal(rng, 16, c, 1, 1, scale=c ** -0.5),
            _normal(rng, 16, c, 3, 3, scale=(9 * c) ** -0.5), _normal(rng, 16, c, 5, 5, scale=(25 * c) ** -0.5),
            _normal(rng, 16, c, 1, 1, scale=c ** -0.5))


def mlp(x: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, w3: jax.Array) -> jax.Array:
    """Three-layer MLP with biases and relu / gelu-free activations."""
    h = jax.nn.relu(x @ w1 + b1)
    h = jnp.tanh(h @ w2 + b2)
    return h @ w3


def _mlp_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return (_normal(rng, 256, 512), _normal(rng, 512, 512, scale=512 ** -0.5), _normal(rng, 512),
            _normal(rng, 512, 512, scale=512 ** -0.5), _normal(rng, 512), _normal(rng, 512, 128, scale=512 ** -0.5))


def conv_bn(x: jax.Array, w: jax.Array, scale: jax.Array, bias: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
    """Conv followed by inference batch norm and relu."""
    y = _conv(x, w)
    inv = scale / jnp.sqrt(var + 1e-5)
    return jax.nn.relu((y - mean[None, :, None, None]) * inv[None, :, None, None] + bias[None, :, None, None])


def _conv_bn_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return (_normal(rng, 2, 32, 16, 16), _normal(rng, 32, 32, 3, 3, scale=(9 * 32) ** -0.5), _normal(rng, 32),
            _normal(rng, 32), _normal(rng, 32), jnp.abs(_normal(rng, 32)) + 0.5)


def mixed(x: jax.Array, w: jax.Array) -> jax.Array:
    """Supported ops around cumsum, sort and a fori_loop (replayed verbatim)."""
    h = jnp.tanh(x @ w)
    c = jnp.cumsum(h, axis=1)
    s = jnp.sort(c, axis=1)
    loop = lax.fori_loop(0, 3, lambda i, t: jnp.tanh(t @ w), s)
    return jax.nn.relu(loop @ w + h)


def _mixed_args(seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return (_normal(rng, 64, 128), _normal(rng, 128, 128, scale=128 ** -0.5))


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
    JaxProgram("attention", attention, _attention_args),
    JaxProgram("nasrnn", nasrnn, _nasrnn_args),
    JaxProgram("inception", inception, _inception_args),
    JaxProgram("mlp", mlp, _mlp_args),
    JaxProgram("conv_bn", conv_bn, _conv_bn_args),
    JaxProgram("mixed_cumsum_sort_loop", mixed, _mixed_args),
)

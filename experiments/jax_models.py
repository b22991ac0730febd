"""Real model code as `@eqsat.optimize` meets it: Flax (nnx and linen) and Equinox models called
with their parameters as pytrees, in place of `@jax.jit`.

Each program is `fn(params, x)` (the parameters a pytree of dozens of leaves, as the libraries
keep them), so gradients with respect to parameters and data are both checked, and `vmap` maps
over the data. Sizes follow the issue that asked for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.models.jax_programs import JaxProgram

__all__ = ["MODEL_BUILDERS", "model_programs"]


def _data(*shape: int) -> Callable[[int], jax.Array]:
    return lambda seed: jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _program(name: str, fn: Callable[..., Any], params: Any, data: Callable[[int], jax.Array]) -> JaxProgram:
    return JaxProgram(name, fn, lambda seed: (params, data(seed)), batch_arg=1, target=False)


def nnx_transformer_block() -> JaxProgram:
    """Pre-norm block: LayerNorm, 4-head self-attention, LayerNorm, GELU MLP; 4×64×128."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d: int, rngs: nnx.Rngs) -> None:
            self.norm1 = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=d, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(d, rngs=rngs)
            self.up = nnx.Linear(d, 4 * d, rngs=rngs)
            self.down = nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            x = x + self.attn(self.norm1(x))
            return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))

    graphdef, state = nnx.split(Block(128, nnx.Rngs(0)))

    def block(state: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    return _program("flax_nnx_transformer_block", block, state, _data(4, 64, 128))


def linen_resnet_block() -> JaxProgram:
    """Conv + BatchNorm (inference) + ReLU twice, with the residual; NHWC, 4×28×28×64."""
    import flax.linen as nn

    class ResBlock(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            y = nn.Conv(64, (3, 3), use_bias=False)(x)
            y = nn.relu(nn.BatchNorm(use_running_average=True)(y))
            y = nn.Conv(64, (3, 3), use_bias=False)(y)
            y = nn.BatchNorm(use_running_average=True)(y)
            return nn.relu(x + y)

    model, x = ResBlock(), _data(4, 28, 28, 64)(0)
    variables = model.init(jax.random.key(0), x)
    rng = np.random.default_rng(5)  # trained-looking statistics, not the initial zeros and ones
    stats = jax.tree_util.tree_map(lambda v: jnp.asarray(np.abs(rng.standard_normal(v.shape)) + 0.5, v.dtype),
                                   variables["batch_stats"])
    variables = {**variables, "batch_stats": stats}
    return _program("flax_linen_resnet_block", model.apply, variables, _data(4, 28, 28, 64))


def linen_cnn() -> JaxProgram:
    """The Flax MNIST example's CNN with average pooling; batch 16."""
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), (2, 2))
            x = x.reshape(x.shape[:-3] + (-1,))
            return nn.Dense(10)(nn.relu(nn.Dense(256)(x)))

    model = CNN()
    variables = model.init(jax.random.key(0), _data(16, 28, 28, 1)(0))
    return _program("flax_linen_cnn", model.apply, variables, _data(16, 28, 28, 1))


def equinox_mlp_vmap() -> JaxProgram:
    """`eqx.nn.MLP` (depth 3, width 512) applied with `jax.vmap` over a batch of 128."""
    import equinox as eqx

    mlp = eqx.nn.MLP(256, 64, width_size=512, depth=3, key=jax.random.key(0))
    params, static = eqx.partition(mlp, eqx.is_array)

    def batched(params: Any, x: jax.Array) -> jax.Array:
        return jax.vmap(eqx.combine(params, static))(x)

    return _program("equinox_mlp_vmap", batched, params, _data(128, 256))


def linen_rnn_scan() -> JaxProgram:
    """`nn.RNN(nn.LSTMCell)`: an LSTM scanned over 32 time steps; batch 8, 64 → 128 features."""
    import flax.linen as nn

    model = nn.RNN(nn.LSTMCell(128))
    variables = model.init(jax.random.key(0), _data(8, 32, 64)(0))
    return _program("flax_linen_rnn_scan", model.apply, variables, _data(8, 32, 64))


def depthwise_separable() -> JaxProgram:
    """A 3×3 depthwise conv (`feature_group_count=64`) then a 1×1 conv; NHWC 1×28×28×64."""
    import flax.linen as nn

    class Separable(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.relu(nn.Conv(64, (3, 3), feature_group_count=64)(x))
            return nn.Conv(128, (1, 1))(x)

    model = Separable()
    variables = model.init(jax.random.key(0), _data(1, 28, 28, 64)(0))
    return _program("depthwise_separable_conv", model.apply, variables, _data(1, 28, 28, 64))


MODEL_BUILDERS: tuple[Callable[[], JaxProgram], ...] = (
    nnx_transformer_block, linen_resnet_block, linen_cnn, equinox_mlp_vmap, linen_rnn_scan, depthwise_separable)


def model_programs() -> tuple[JaxProgram, ...]:
    """The real-model group (built on call: Flax and Equinox are imported only when asked for)."""
    return tuple(build() for build in MODEL_BUILDERS)

"""A held-out set of real programs for `@eqsat.optimize`, written anew the way users write them
(Flax linen / nnx, Equinox, optax, plain `jax.numpy`), none tuned to a rewrite the library knows.

Each program is `fn(*args)` with `make_args(seed, batch)`: the bench (`eqsat bench jax --groups
heldout`) calls it at one batch size (first call cold, then timed against `jax.jit`) and then at
`new_batch` (a new input shape of a program already optimized: the first call warm). Sizes keep
one call around a millisecond on two CPU cores, so a timing round is short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["HeldOut", "HELDOUT_BUILDERS", "HELDOUT_NAMES", "heldout_programs", "heldout_program"]


@dataclass(frozen=True)
class HeldOut:
    """One held-out program: `make_args(seed, batch)` gives its arguments at a batch size."""

    name: str
    fn: Callable[..., Any]
    make_args: Callable[[int, int], tuple[Any, ...]]
    batch: int
    new_batch: int
    differentiable: bool = True  # gradients of a sum of squares of the outputs w.r.t. every argument


def _normal(seed: int, *shape: int, dtype: Any = jnp.float32) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def gpt2_block() -> HeldOut:
    """Flax linen GPT-2 block: pre-LayerNorm, fused QKV projection, causal mask, GELU MLP."""
    import flax.linen as nn

    class Block(nn.Module):
        d: int = 128
        heads: int = 4

        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            b, t, d = x.shape
            h = nn.LayerNorm()(x)
            q, k, v = jnp.split(nn.Dense(3 * d)(h), 3, axis=-1)
            heads = lambda z: z.reshape(b, t, self.heads, d // self.heads).transpose(0, 2, 1, 3)  # noqa: E731
            scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(d // self.heads)
            mask = jnp.tril(jnp.ones((t, t), bool))
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
            att = (jax.nn.softmax(scores, axis=-1) @ heads(v)).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + nn.Dense(d)(att)
            return x + nn.Dense(d)(nn.gelu(nn.Dense(4 * d)(nn.LayerNorm()(x))))

    model = Block()
    params = model.init(jax.random.key(0), jnp.zeros((1, 32, 128)))

    def block(params: Any, x: jax.Array) -> Any:
        return model.apply(params, x)

    return HeldOut("gpt2_block_linen", block, lambda s, b: (params, _normal(s, b, 32, 128)), 4, 6)


def equinox_cnn_vmap() -> HeldOut:
    """An Equinox NCHW CNN written per example and mapped over the batch with `jax.vmap`."""
    import equinox as eqx

    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    net = [eqx.nn.Conv2d(3, 16, 3, padding=1, key=k1), eqx.nn.MaxPool2d(2, 2),
           eqx.nn.Conv2d(16, 32, 3, padding=1, key=k2), eqx.nn.Linear(32, 10, key=k3)]
    params, static = eqx.partition(net, eqx.is_array)

    def forward(params: Any, x: jax.Array) -> jax.Array:
        conv1, pool, conv2, head = eqx.combine(params, static)

        def one(img: jax.Array) -> jax.Array:
            h = pool(jax.nn.relu(conv1(img)))
            h = jax.nn.relu(conv2(h))
            return head(jnp.mean(h, axis=(1, 2)))

        return jax.vmap(one)(x)

    return HeldOut("equinox_cnn_vmap", forward, lambda s, b: (params, _normal(s, b, 3, 32, 32)), 8, 12)


def optax_adam_step() -> HeldOut:
    """One optax Adam training step of a 3-layer MLP: loss, grad, update, apply."""
    import optax

    rng = np.random.default_rng(2)
    sizes = (64, 256, 256, 10)
    params = [(jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a), jnp.float32), jnp.zeros((b,), jnp.float32))
              for a, b in zip(sizes, sizes[1:])]
    opt = optax.adam(1e-3)
    state = opt.init(params)

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return jnp.mean((x @ w + b - y) ** 2)

    def step(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return HeldOut("optax_adam_mlp_step", step, lambda s, b: (params, state, _normal(s, b, 64), _normal(s + 1, b, 10)),
                   128, 192, differentiable=False)


def bf16_mlp() -> HeldOut:
    """A bfloat16 MLP (weights and activations), as mixed-precision inference runs it."""
    rng = np.random.default_rng(3)
    ws = [jnp.asarray(rng.standard_normal((256, 256)) / 16, jnp.bfloat16) for _ in range(3)]
    bs = [jnp.zeros((256,), jnp.bfloat16) for _ in range(3)]

    def mlp(params: Any, x: jax.Array) -> jax.Array:
        for w, b in zip(*params):
            x = jax.nn.gelu(x @ w + b)
        return x

    return HeldOut("bf16_mlp", mlp, lambda s, b: ((ws, bs), _normal(s, b, 256, dtype=jnp.bfloat16)), 128, 192)


def scan_transformer() -> HeldOut:
    """Four identical transformer layers with stacked weights, run by `lax.scan` over the layers."""
    rng = np.random.default_rng(4)
    layers, d = 4, 64
    stack = {name: jnp.asarray(rng.standard_normal((layers, *shape)) / np.sqrt(shape[0]), jnp.float32)
             for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                                 ("up", (d, 4 * d)), ("down", (4 * d, d)))}

    def norm(x: jax.Array) -> jax.Array:
        mu = jnp.mean(x, -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5)

    def layer(x: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        h = norm(x)
        scores = (h @ p["wq"]) @ (h @ p["wk"]).swapaxes(-1, -2) / np.sqrt(d)
        x = x + (jax.nn.softmax(scores, -1) @ (h @ p["wv"])) @ p["wo"]
        return x + jax.nn.gelu(norm(x) @ p["up"]) @ p["down"], None

    def forward(stack: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jax.lax.scan(layer, x, stack)[0]

    return HeldOut("scan_transformer", forward, lambda s, b: (stack, _normal(s, b, 32, d)), 4, 6)


def unet_block() -> HeldOut:
    """A U-Net/diffusion residual block (linen): GroupNorm, SiLU, 3×3 conv twice, 1×1 skip."""
    import flax.linen as nn

    class ResBlock(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            h = nn.Conv(64, (3, 3))(nn.silu(nn.GroupNorm(num_groups=8)(x)))
            h = nn.Conv(64, (3, 3))(nn.silu(nn.GroupNorm(num_groups=8)(h)))
            return nn.Conv(64, (1, 1))(x) + h

    model = ResBlock()
    params = model.init(jax.random.key(5), jnp.zeros((1, 16, 16, 32)))
    return HeldOut("unet_groupnorm_block", lambda p, x: model.apply(p, x),
                   lambda s, b: (params, _normal(s, b, 16, 16, 32)), 4, 6)


def fire_block() -> HeldOut:
    """An Inception/SqueezeNet Fire block: 1×1 squeeze, 1×1 and 3×3 expands, a 3×3 stride-1
    max-pool branch with its 1×1 projection, concatenated (linen, NHWC)."""
    import flax.linen as nn

    class Fire(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            s = nn.relu(nn.Conv(16, (1, 1))(x))
            e1 = nn.relu(nn.Conv(32, (1, 1))(s))
            e3 = nn.relu(nn.Conv(32, (3, 3))(s))
            pool = nn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME")
            return jnp.concatenate([e1, e3, nn.relu(nn.Conv(32, (1, 1))(pool))], axis=-1)

    model = Fire()
    params = model.init(jax.random.key(6), jnp.zeros((1, 28, 28, 64)))
    return HeldOut("inception_fire_block", lambda p, x: model.apply(p, x),
                   lambda s, b: (params, _normal(s, b, 28, 28, 64)), 4, 6)


def separate_qkv_attention() -> HeldOut:
    """Multi-head self-attention with separate Q, K, V projections (plain jax.numpy)."""
    rng = np.random.default_rng(7)
    d, heads = 128, 4
    w = {k: jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32) for k in ("q", "k", "v", "o")}

    def attention(w: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        b, t, _ = x.shape
        split = lambda z: z.reshape(b, t, heads, d // heads).swapaxes(1, 2)  # noqa: E731
        q, k, v = split(x @ w["q"]), split(x @ w["k"]), split(x @ w["v"])
        att = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d // heads), axis=-1)
        return x + jnp.einsum("bhqk,bhkd->bhqd", att, v).swapaxes(1, 2).reshape(b, t, d) @ w["o"]

    return HeldOut("attention_separate_qkv", attention, lambda s, b: (w, _normal(s, b, 64, d)), 4, 6)


def mlp_mixer() -> HeldOut:
    """An MLP-Mixer block in Flax nnx: token-mixing MLP over patches, channel-mixing MLP."""
    from flax import nnx

    class Mixer(nnx.Module):
        def __init__(self, tokens: int, d: int, rngs: nnx.Rngs) -> None:
            self.norm1, self.norm2 = nnx.LayerNorm(d, rngs=rngs), nnx.LayerNorm(d, rngs=rngs)
            self.tok1, self.tok2 = nnx.Linear(tokens, 2 * tokens, rngs=rngs), nnx.Linear(2 * tokens, tokens, rngs=rngs)
            self.ch1, self.ch2 = nnx.Linear(d, 4 * d, rngs=rngs), nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            y = self.norm1(x).swapaxes(1, 2)
            x = x + self.tok2(nnx.gelu(self.tok1(y))).swapaxes(1, 2)
            return x + self.ch2(nnx.gelu(self.ch1(self.norm2(x))))

    graphdef, state = nnx.split(Mixer(64, 128, nnx.Rngs(8)))

    def mixer(state: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    return HeldOut("mlp_mixer_nnx", mixer, lambda s, b: (state, _normal(s, b, 64, 128)), 4, 6)


# each program's name (as its `HeldOut` names it) and builder: a name is known without building
# (initializing nine models compiles ~160 XLA programs, most of a minute on two cores)
HELDOUT_NAMES: dict[str, Callable[[], HeldOut]] = {
    "gpt2_block_linen": gpt2_block, "equinox_cnn_vmap": equinox_cnn_vmap, "optax_adam_mlp_step": optax_adam_step,
    "bf16_mlp": bf16_mlp, "scan_transformer": scan_transformer, "unet_groupnorm_block": unet_block,
    "inception_fire_block": fire_block, "attention_separate_qkv": separate_qkv_attention, "mlp_mixer_nnx": mlp_mixer}
HELDOUT_BUILDERS: tuple[Callable[[], HeldOut], ...] = tuple(HELDOUT_NAMES.values())


def heldout_programs() -> tuple[HeldOut, ...]:
    return tuple(build() for build in HELDOUT_BUILDERS)


def heldout_program(name: str) -> HeldOut:
    """The held-out program `name` (a key of `HELDOUT_NAMES`), built alone."""
    return HELDOUT_NAMES[name]()

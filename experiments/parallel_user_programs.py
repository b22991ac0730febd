"""User programs for `eqsat.parallel.plan`, written as users write them (none is a built-in case): an
MLP classifier, a GPT-2-style decoder (pre-LN, fused QKV + split, causal mask, GELU, batch x seq
x d, token embedding gather) and an MoE layer (top-k token dispatch), each with an optax Adam step;
a Flax Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, layers under `nn.scan`, AdamW after
global-norm clipping), a Flax CNN classifier (convolutions, pooling, a label mask, SGD with momentum),
an Equinox ViT (vmapped per-example model, class token, key padding mask, AdamW on a warmup-cosine
schedule) and a bf16 mixed-precision GRU language model (`lax.scan` over time, Lion).
For each program and mesh one JSON row:
plan time, the plan's predicted step and compiled bytes / memory beside the baselines', and whether
3 steps equal the single-device `jax.jit(train_step)`'s (loss rtol 1e-4, params within 2 lr steps;
`TOLERANCES` for the bf16 GRU).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.parallel_user_programs [PROGRAM] [MESH]

(PROGRAM: mlp, gpt, moe, llama, cnn, vit, gru; MESH: 8, 2x4, 4x2.)

Times (`*_ms`) are predictions of the `parallel` cost model. Each plan is also judged by running it
(`plan(measure_s=...)`): `measured_speedup` is its step against data parallel's on the devices at
hand, with the 99% interval; the 8 emulated CPU devices share this machine's two cores, so it says
which step runs faster here, not on a GPU cluster. Bytes and memory are the compiled programs'.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqsat.parallel as ep

LR = 1e-3
OPT = optax.adam(LR)
MEASURE_S = 8.0  # each plan judged by running it against data parallel (`plan(measure_s=...)`)


def _adam_step(model: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        x, y = batch

        def loss_fn(p: Any) -> Any:
            return optax.softmax_cross_entropy_with_integer_labels(model(p, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


# --- an MLP classifier ----------------------------------------------------------------------------

def mlp_problem(batch: int = 256, sizes: tuple[int, ...] = (256, 1024, 1024, 64)) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    keys = iter(jax.random.split(jax.random.key(0), 16))
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = jax.random.normal(next(keys), (a, b)) / a ** 0.5
        params[f"b{i}"] = jnp.zeros((b,))

    def mlp(p: Any, x: Any) -> Any:
        for i in range(len(sizes) - 1):
            x = x @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(sizes) - 2:
                x = jax.nn.relu(x)
        return x

    x = jax.random.normal(next(keys), (batch, sizes[0]))
    y = jax.random.randint(next(keys), (batch,), 0, sizes[-1])
    return _adam_step(mlp), (params, OPT.init(params), (x, y))


# --- a GPT-2-style decoder ------------------------------------------------------------------------

def gpt_problem(batch: int = 8, seq: int = 32, d: int = 128, heads: int = 4, vocab: int = 256,
                layers: int = 2) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    keys = iter(jax.random.split(jax.random.key(0), 64))

    def normal(*shape: int) -> Any:
        return jax.random.normal(next(keys), shape) * 0.02

    params = {"emb": normal(vocab, d), "lnf_g": jnp.ones(d), "lnf_b": jnp.zeros(d), "head": normal(d, vocab),
              "blocks": [{"ln1_g": jnp.ones(d), "ln1_b": jnp.zeros(d), "qkv": normal(d, 3 * d), "proj": normal(d, d),
                          "ln2_g": jnp.ones(d), "ln2_b": jnp.zeros(d), "fc": normal(d, 4 * d), "fc_b": jnp.zeros(4 * d),
                          "out": normal(4 * d, d)} for _ in range(layers)]}

    def layer_norm(x: Any, g: Any, b: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b

    def block(p: Any, x: Any) -> Any:
        b, t, _ = x.shape
        q, k, v = jnp.split(layer_norm(x, p["ln1_g"], p["ln1_b"]) @ p["qkv"], 3, axis=-1)

        def split_heads(z: Any) -> Any:
            return z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        scores = q @ k.transpose(0, 1, 3, 2) / (d // heads) ** 0.5
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        attn = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + attn @ p["proj"]
        h = layer_norm(x, p["ln2_g"], p["ln2_b"])
        return x + jax.nn.gelu(h @ p["fc"] + p["fc_b"]) @ p["out"]

    def gpt(p: Any, tokens: Any) -> Any:
        x = p["emb"][tokens]
        for blk in p["blocks"]:
            x = block(blk, x)
        return layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["head"]

    tokens = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    return _adam_step(gpt), (params, OPT.init(params), (tokens, jnp.roll(tokens, -1, axis=1)))


# --- a mixture-of-experts layer with token dispatch ----------------------------------------------

def moe_problem(batch: int = 8, seq: int = 32, d: int = 64, hidden: int = 256, experts: int = 8, top: int = 2,
                classes: int = 32) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Embed, a residual top-k MoE layer (router logits, `jax.lax.top_k`, one-hot dispatch einsum
    into per-expert MLPs stacked as (E, d, h), combine weighted by the renormalized router
    probabilities), mean-pool, classify."""
    keys = iter(jax.random.split(jax.random.key(0), 16))

    def normal(*shape: int) -> Any:
        return jax.random.normal(next(keys), shape) / shape[-2] ** 0.5

    params = {"embed": normal(d, d), "router": normal(d, experts), "w_in": normal(experts, d, hidden),
              "b_in": jnp.zeros((experts, hidden)), "w_out": normal(experts, hidden, d), "head": normal(d, classes)}

    def moe_layer(p: Any, x: Any) -> Any:
        probs = jax.nn.softmax(x @ p["router"], axis=-1)                      # (b, t, E)
        gate, choice = jax.lax.top_k(probs, top)                              # (b, t, k)
        gate = gate / gate.sum(-1, keepdims=True)
        dispatch = jax.nn.one_hot(choice, experts, dtype=x.dtype)             # (b, t, k, E)
        combine = jnp.einsum("btk,btke->bte", gate, dispatch)                 # each token's weight per expert
        xe = jnp.einsum("bte,btd->ebtd", dispatch.sum(2), x)                  # tokens routed to each expert
        h = jax.nn.gelu(jnp.einsum("ebtd,edh->ebth", xe, p["w_in"]) + p["b_in"][:, None, None, :])
        ye = jnp.einsum("ebth,ehd->ebtd", h, p["w_out"])
        return x + jnp.einsum("ebtd,bte->btd", ye, combine)

    def model(p: Any, x: Any) -> Any:
        h = moe_layer(p, jnp.tanh(x @ p["embed"]))
        return h.mean(1) @ p["head"]

    x = jax.random.normal(next(keys), (batch, seq, d))
    y = jax.random.randint(next(keys), (batch,), 0, classes)
    return _adam_step(model), (params, OPT.init(params), (x, y))


# --- a Llama-style decoder in Flax linen, its layers under `nn.scan` ------------------------------

def llama_problem(batch: int = 8, seq: int = 32, d: int = 128, heads: int = 4, hidden: int = 256, vocab: int = 256,
                  layers: int = 2) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Token embedding, `layers` pre-norm blocks stacked by `nn.scan` over their params (RMSNorm,
    rotary position embeddings on q and k by half-split slicing and concat, causal mask, SwiGLU
    MLP, no biases), a final RMSNorm and an untied head; next-token cross-entropy; optax AdamW
    chained after `clip_by_global_norm`."""
    import flax.linen as nn

    class RMSNorm(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
            return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def rope(x: Any) -> Any:  # (b, t, heads, hd)
        half = x.shape[-1] // 2
        freqs = 1.0 / 10000 ** (jnp.arange(half, dtype=jnp.float32) / half)
        angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freqs[None, :]
        cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
            b, t, _d = x.shape
            h = RMSNorm()(x)
            q, k, v = (nn.Dense(d, use_bias=False, name=n)(h).reshape(b, t, heads, d // heads) for n in ("wq", "wk", "wv"))
            q, k = rope(q), rope(k)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads).astype(x.dtype)
            s = jnp.where(nn.make_causal_mask(jnp.ones((b, t))), s, jnp.finfo(s.dtype).min)
            a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(b, t, d)
            x = x + nn.Dense(d, use_bias=False, name="wo")(a)
            h = RMSNorm()(x)
            mlp = jax.nn.silu(nn.Dense(hidden, use_bias=False, name="w_gate")(h)) * nn.Dense(hidden, use_bias=False, name="w_up")(h)
            return x + nn.Dense(d, use_bias=False, name="w_down")(mlp), None

    class Llama(nn.Module):
        @nn.compact
        def __call__(self, tokens: Any) -> Any:
            x = nn.Embed(vocab, d, name="embed")(tokens)
            stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=layers)
            x, _ = stack(name="layers")(x, None)
            return nn.Dense(vocab, use_bias=False, name="lm_head")(RMSNorm(name="final_norm")(x))

    model = Llama()
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    params = model.init(jax.random.key(0), tokens[:, :-1])["params"]
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, weight_decay=0.1))

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        inputs, targets = batch

        def loss_fn(p: Any) -> Any:
            logits = model.apply({"params": p}, inputs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt.init(params), (tokens[:, :-1], tokens[:, 1:]))


# --- a CNN image classifier in Flax linen --------------------------------------------------------

def cnn_problem(batch: int = 32, size: int = 16, channels: int = 3, features: tuple[int, ...] = (16, 32, 64),
                classes: int = 10) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """NHWC images through 3x3 convolutions with ReLU, average then max pooling between them, a
    mean over the spatial dims, a dense hidden layer and a dense head; softmax cross-entropy on
    one-hot labels weighted by a label mask (padded examples count zero); optax SGD with momentum."""
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for i, f in enumerate(features):
                x = nn.relu(nn.Conv(f, (3, 3))(x))
                if i < len(features) - 1:
                    pool = nn.avg_pool if i % 2 == 0 else nn.max_pool
                    x = pool(x, (2, 2), strides=(2, 2))
            x = nn.relu(nn.Dense(128)(x.mean(axis=(1, 2))))
            return nn.Dense(classes)(x)

    model = CNN()
    k_img, k_lab, k_init = jax.random.split(jax.random.key(0), 3)
    images = jax.random.normal(k_img, (batch, size, size, channels))
    labels = jax.random.randint(k_lab, (batch,), 0, classes)
    mask = (jnp.arange(batch) % 7 != 3).astype(jnp.float32)  # the padding of a last, partial batch
    params = model.init(k_init, images)["params"]
    opt = optax.sgd(10 * LR, momentum=0.9)

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        x, y, m = batch

        def loss_fn(p: Any) -> Any:
            ce = optax.softmax_cross_entropy(model.apply({"params": p}, x), jax.nn.one_hot(y, classes))
            return (ce * m).sum() / m.sum()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt.init(params), (images, labels, mask))


# --- a ViT classifier in Equinox ------------------------------------------------------------------

def vit_problem(batch: int = 16, size: int = 16, patch: int = 4, channels: int = 3, d: int = 64, heads: int = 4,
                hidden: int = 128, layers: int = 2, classes: int = 10) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """An Equinox ViT: patches cut by reshape and embedded by `eqx.nn.Linear` under `jax.vmap`, a
    class token concatenated in front, learned position embeddings, pre-norm blocks of
    `eqx.nn.LayerNorm` / `eqx.nn.MultiheadAttention` (a key padding mask: each image has a number of
    valid patches) / a GELU MLP, the class token's logits; the model written for one example and
    vmapped over the batch; params split by `eqx.partition(model, eqx.is_array)`, gradients by
    `eqx.filter_value_and_grad`, optax AdamW on a warmup-cosine schedule after global-norm clipping."""
    import equinox as eqx

    tokens = (size // patch) ** 2 + 1

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        fc1: eqx.nn.Linear
        fc2: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            k1, k2, k3 = jax.random.split(key, 3)
            self.ln1, self.ln2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
            self.fc1, self.fc2 = eqx.nn.Linear(d, hidden, key=k2), eqx.nn.Linear(hidden, d, key=k3)

        def __call__(self, x: Any, mask: Any) -> Any:
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=mask)
            h = jax.vmap(self.ln2)(x)
            return x + jax.vmap(lambda t: self.fc2(jax.nn.gelu(self.fc1(t))))(h)

    class ViT(eqx.Module):
        embed: eqx.nn.Linear
        cls: jax.Array
        pos: jax.Array
        blocks: list[Block]
        norm: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            keys = jax.random.split(key, layers + 4)
            self.embed = eqx.nn.Linear(patch * patch * channels, d, key=keys[0])
            self.cls = jax.random.normal(keys[1], (1, d)) * 0.02
            self.pos = jax.random.normal(keys[2], (tokens, d)) * 0.02
            self.blocks = [Block(k) for k in keys[4:]]
            self.norm = eqx.nn.LayerNorm(d)
            self.head = eqx.nn.Linear(d, classes, key=keys[3])

        def __call__(self, image: Any, valid: Any) -> Any:  # one (H, W, C) image, its number of valid patches
            g = size // patch
            patches = image.reshape(g, patch, g, patch, channels).transpose(0, 2, 1, 3, 4).reshape(g * g, -1)
            x = jnp.concatenate([self.cls, jax.vmap(self.embed)(patches)]) + self.pos
            keep = jnp.arange(tokens) <= valid  # the class token and the valid patches
            mask = jnp.broadcast_to(keep[None, :], (tokens, tokens))
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.norm(x[0]))

    model = ViT(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    schedule = optax.warmup_cosine_decay_schedule(0.0, LR, warmup_steps=2, decay_steps=100)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.05))
    k_img, k_lab, k_valid = jax.random.split(jax.random.key(1), 3)
    images = jax.random.normal(k_img, (batch, size, size, channels))
    labels = jax.random.randint(k_lab, (batch,), 0, classes)
    valid = jax.random.randint(k_valid, (batch,), tokens // 2, tokens)

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        x, y, n = batch

        @eqx.filter_value_and_grad
        def loss_fn(p: Any) -> Any:
            logits = jax.vmap(eqx.combine(p, static))(x, n)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = loss_fn(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt.init(params), (images, labels, valid))


# --- a bf16 GRU language model under `lax.scan` ---------------------------------------------------

def gru_problem(batch: int = 16, seq: int = 16, vocab: int = 64, d: int = 64,
                hidden: int = 128) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A GRU language model in bf16 mixed precision: f32 master params cast to bf16 for the
    compute, an embedding gather, the input projections of all steps at once, the recurrence under
    `lax.scan` over time (time-major), bf16 logits cast to f32 for a next-token cross-entropy
    masked by each sequence's length; optax Lion after global-norm clipping."""
    keys = iter(jax.random.split(jax.random.key(0), 8))

    def normal(*shape: int) -> Any:
        return jax.random.normal(next(keys), shape) / shape[0] ** 0.5

    params = {"embed": normal(vocab, d), "w_x": normal(d, 3 * hidden), "w_h": normal(hidden, 3 * hidden),
              "b": jnp.zeros(3 * hidden), "w_out": normal(hidden, vocab), "b_out": jnp.zeros(vocab)}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.lion(LR, weight_decay=1e-4))

    def gru(p: Any, tokens: Any) -> Any:
        p = jax.tree_util.tree_map(lambda w: w.astype(jnp.bfloat16), p)
        xs = p["embed"][tokens] @ p["w_x"] + p["b"]                        # (b, t, 3h), all steps at once

        def cell(h: Any, x: Any) -> tuple[Any, Any]:
            xr, xz, xn = jnp.split(x, 3, axis=-1)
            hr, hz, hn = jnp.split(h @ p["w_h"], 3, axis=-1)
            r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
            h = (1 - z) * jnp.tanh(xn + r * hn) + z * h
            return h, h

        h0 = jnp.zeros((tokens.shape[0], hidden), jnp.bfloat16)
        _, hs = jax.lax.scan(cell, h0, xs.swapaxes(0, 1))                  # (t, b, h)
        return (hs.swapaxes(0, 1) @ p["w_out"] + p["b_out"]).astype(jnp.float32)

    tokens = jax.random.randint(next(keys), (batch, seq + 1), 0, vocab)
    lengths = jax.random.randint(next(keys), (batch,), seq // 2, seq + 1)

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        tokens, lengths = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]

        def loss_fn(p: Any) -> Any:
            ce = optax.softmax_cross_entropy_with_integer_labels(gru(p, inputs), targets)
            mask = (jnp.arange(inputs.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
            return (ce * mask).sum() / mask.sum()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, opt.init(params), (tokens, lengths))


PROGRAMS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]] = {
    "mlp": mlp_problem, "gpt": gpt_problem, "moe": moe_problem, "llama": llama_problem, "cnn": cnn_problem,
    "vit": vit_problem, "gru": gru_problem}


TOLERANCES: dict[str, tuple[float, float]] = {"gru": (2.0 ** -8, 1.001)}
"""(loss rtol, params bound in units of 2 lr steps) of a program not checked at (1e-4, 1): the bf16
GRU's loss is compared at bf16's unit roundoff (2^-8: its sharded products round their partial sums
in bf16), and Lion's step is lr (1 + wd |p|) per element, so a noise-level gradient that flips sign
each step moves a parameter a hair over 2 lr per step."""


def same_as_single_device(plan: Any, step: Callable[..., Any], args: tuple[Any, ...], steps: int = 3,
                          tolerance: tuple[float, float] = (1e-4, 1.0)) -> dict[str, Any]:
    """Runs `steps` steps of the plan's jitted step and of the single-device `jax.jit(step)`: the worst
    relative loss difference, the largest parameter difference, and whether both are within
    `tolerance` (loss rtol, params bound in units of 2 lr steps)."""
    params, opt_state, batch = args
    sharded = plan.jit(donate_argnums=(0, 1))
    ref = jax.jit(step)
    mine = jax.tree_util.tree_map(jnp.copy, (params, opt_state))
    theirs = (params, opt_state)
    worst_loss = 0.0
    for _ in range(steps):
        *mine, loss = sharded(mine[0], mine[1], batch)
        *theirs, rloss = ref(theirs[0], theirs[1], batch)
        worst_loss = max(worst_loss, abs(float(loss) - float(rloss)) / max(abs(float(rloss)), 1e-30))
    worst_param = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                      zip(jax.tree_util.tree_leaves(mine[0]), jax.tree_util.tree_leaves(theirs[0])))
    return {"loss_rel_diff": worst_loss, "param_max_diff": worst_param,
            "same_as_single_device": worst_loss <= tolerance[0] and worst_param <= tolerance[1] * 2 * LR * steps}


def run(program: str, mesh_spec: str, time_limit: float = 60.0) -> dict[str, Any]:
    step, args = PROGRAMS[program]()
    shape = tuple(int(s) for s in mesh_spec.split("x"))
    mesh = jax.make_mesh(shape, ("data", "model")[: len(shape)])
    t = time.perf_counter()
    plan = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), time_limit=time_limit, measure_s=MEASURE_S)
    row: dict[str, Any] = {"program": program, "mesh": mesh_spec, "total_plan_s": time.perf_counter() - t,
                           **plan.report.to_json()}
    row.pop("leaf_specs")
    row["collectives"] = len(row["collectives"])
    row.update(same_as_single_device(plan, step, args, tolerance=TOLERANCES.get(program, (1e-4, 1.0))))
    dp = next(b for b in plan.report.baselines if b.name == "data-parallel")
    if dp.compiled is not None and plan.report.compiled is not None:
        row["bytes_le_dp"] = plan.report.compiled.wire_bytes <= dp.compiled.wire_bytes  # wire bytes, as judged
        row["dp_predicted_bytes"] = dp.predicted_comm_bytes
        row["memory_le_dp"] = plan.report.compiled.mem_bytes <= dp.compiled.mem_bytes
    row.update(summary(plan.report))
    print(plan.explain(), file=sys.stderr)
    return row


SUMMARY_COLUMNS = ("program", "mesh", "plan_s", "returned", "plan_ms", "dp_ms", "fsdp_ms", "plan_bytes", "dp_bytes",
                   "fsdp_bytes", "plan_wire", "dp_wire", "fsdp_wire", "plan_mem_mb", "dp_mem_mb", "fsdp_mem_mb",
                   "no_baseline_dominates", "faster_than_all_predicted", "measured_speedup", "measured_ci",
                   "loss_rel_diff", "same_as_single_device")
"""The flat fields of a row (`eqsat bench parallel --user-programs` writes these as its table)."""


def summary(report: Any) -> dict[str, Any]:
    """Predicted ms, compiled wire bytes, memory (MB) and buffer bytes per device of the plan, data
    parallel and FSDP; whether any baseline with a prediction is better in all three (time, wire
    bytes, memory: as `judge_compiled` compares), and whether the plan is predicted faster than
    every baseline with a prediction."""
    def figures(pred: float | None, compiled: Any) -> tuple[float | None, ...]:
        return (None if pred is None else pred * 1e3, None if compiled is None else compiled.wire_bytes,
                None if compiled is None else compiled.mem_bytes / 1e6, None if compiled is None else compiled.comm_bytes)

    mine = figures(report.predicted_step_s, report.compiled)
    m = report.measured  # the plan's step against data parallel's, run (None: the plan was not eqsat's)
    out: dict[str, Any] = {"returned": report.strategy.split(" (")[0],
                           **dict(zip(("plan_ms", "plan_wire", "plan_mem_mb", "plan_bytes"), mine)),
                           "measured_speedup": None if m is None else m.speedup,
                           "measured_ci": None if m is None else f"[{m.speedup_low:.2f}, {m.speedup_high:.2f}]"}
    for b in report.baselines:
        if b.name in ("data-parallel", "fsdp"):
            key = "dp" if b.name == "data-parallel" else "fsdp"
            out.update(zip((f"{key}_ms", f"{key}_wire", f"{key}_mem_mb", f"{key}_bytes"), figures(b.predicted_s, b.compiled)))
    rivals = [figures(b.predicted_s, b.compiled) for b in report.baselines if b.predicted_s is not None]
    if None in mine or any(None in r for r in rivals):
        return {**out, "no_baseline_dominates": None, "faster_than_all_predicted": None}
    def below(r: tuple[float | None, ...], i: int) -> bool:
        return float(r[i] or 0.0) < float(mine[i] or 0.0)

    out["no_baseline_dominates"] = not any(all(below(r, i) for i in range(3)) for r in rivals)
    out["faster_than_all_predicted"] = all(float(mine[0] or 0.0) < float(r[0] or 0.0) for r in rivals) if rivals else None
    return out


def main(argv: list[str]) -> None:
    programs = [a for a in argv if a in PROGRAMS] or list(PROGRAMS)
    meshes = [a for a in argv if a not in PROGRAMS] or ["8", "2x4", "4x2"]
    for program in programs:
        for mesh in meshes:
            print(json.dumps(run(program, mesh), default=lambda o: float(o) if isinstance(o, np.floating) else str(o)),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""A program written anew (stop 46): a Flax MLP-Mixer classifier (patches by reshape, token-mixing MLP on the
transposed sequence, channel-mixing MLP, LayerNorm, GELU, mean pooling), optax AdamW with a cosine schedule.
Planned with ep.plan(measure_s=8) on meshes 8, 2x4, 4x2; 3 steps against one device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/data/parallel_user/s19/mixer.py > mixer.jsonl
"""
import json
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import eqsat.parallel as ep

class MixerBlock(nn.Module):
    tokens: int
    channels: int
    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm()(x)
        y = jnp.swapaxes(y, 1, 2)
        y = nn.Dense(self.tokens)(nn.gelu(nn.Dense(self.tokens * 2)(y)))
        x = x + jnp.swapaxes(y, 1, 2)
        y = nn.LayerNorm()(x)
        y = nn.Dense(self.channels)(nn.gelu(nn.Dense(self.channels * 4)(y)))
        return x + y

class Mixer(nn.Module):
    classes: int = 10
    d: int = 128
    depth: int = 2
    patch: int = 4
    @nn.compact
    def __call__(self, img):
        b, h, w, c = img.shape
        p = self.patch
        x = img.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // p) * (w // p), p * p * c)
        x = nn.Dense(self.d)(x)
        for _ in range(self.depth):
            x = MixerBlock(x.shape[1], self.d)(x)
        x = nn.LayerNorm()(x).mean(axis=1)
        return nn.Dense(self.classes)(x)

model = Mixer()
imgs = jax.random.normal(jax.random.key(1), (64, 16, 16, 3))
labels = jax.random.randint(jax.random.key(2), (64,), 0, 10)
params = model.init(jax.random.key(0), imgs)["params"]
sched = optax.cosine_decay_schedule(1e-3, 100)
opt = optax.adamw(sched, weight_decay=1e-4)
opt_state = opt.init(params)

def train_step(params, opt_state, batch):
    x, y = batch
    def loss_fn(p):
        logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

for m in (sys.argv[1:] or ["8", "2x4", "4x2"]):
    shape = tuple(int(s) for s in m.split("x"))
    mesh = jax.make_mesh(shape, ("data", "model")[: len(shape)])
    t = time.perf_counter()
    plan = ep.plan(train_step, params, opt_state, (imgs, labels), mesh=mesh, params_argnums=(0, 1), measure_s=8.0)
    plan_s = time.perf_counter() - t
    step = plan.jit(donate_argnums=(0, 1))
    ref = jax.jit(train_step)
    mine = jax.tree_util.tree_map(jnp.copy, (params, opt_state))
    theirs = (params, opt_state)
    worst = 0.0
    for _ in range(3):
        *mine, loss = step(mine[0], mine[1], (imgs, labels))
        *theirs, rloss = ref(theirs[0], theirs[1], (imgs, labels))
        worst = max(worst, abs(float(loss) - float(rloss)) / abs(float(rloss)))
    pd = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(mine[0]), jax.tree_util.tree_leaves(theirs[0])))
    r = plan.report
    dp = next((b for b in r.baselines if b.name == "data-parallel"), None)
    print(json.dumps({"mesh": m, "strategy": r.strategy[:200], "plan_s": plan_s, "loss_rel": worst, "param_max_diff": pd,
                      "within_2lr_steps": pd <= 2 * 1e-3 * 3,
                      "predicted_ms": r.predicted_step_s and r.predicted_step_s * 1e3,
                      "dp_predicted_ms": dp and dp.predicted_s and dp.predicted_s * 1e3,
                      "wire": r.compiled and r.compiled.wire_bytes, "dp_wire": dp and dp.compiled and dp.compiled.wire_bytes,
                      "mem": r.compiled and r.compiled.mem_bytes, "dp_mem": dp and dp.compiled and dp.compiled.mem_bytes,
                      "measured": r.measured.to_json() if r.measured else None}), flush=True)
    print(plan.explain(), file=sys.stderr)

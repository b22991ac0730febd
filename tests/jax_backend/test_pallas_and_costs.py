"""Pallas kernels (interpret mode on CPU) match XLA in value and gradient; measured costs cache on
disk and discount what XLA fuses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqsat.cost import cost_model
from jax_backend.pallas import elementwise, matmul_bias_act


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("act,fn", [(0, lambda z: z), (1, jax.nn.sigmoid), (2, jax.nn.relu), (3, jnp.tanh)])
def test_matmul_bias_act_value_and_grad(act, fn) -> None:
    x, w, b = _rand(8, 16), _rand(16, 4, seed=1), _rand(4, seed=2)
    got = lambda x, w, b: jnp.sum(matmul_bias_act(x, w, b, act, True) ** 2)  # noqa: E731
    ref = lambda x, w, b: jnp.sum(fn(x @ w + b) ** 2)  # noqa: E731
    np.testing.assert_allclose(got(x, w, b), ref(x, w, b), rtol=1e-5)
    for g, r in zip(jax.grad(got, (0, 1, 2))(x, w, b), jax.grad(ref, (0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_elementwise_chain_grad() -> None:
    x = _rand(4, 8)
    chain = lambda t: jnp.exp(jnp.tanh(t))  # noqa: E731
    np.testing.assert_allclose(jax.grad(lambda t: elementwise(chain, True, t).sum())(x),
                               jax.grad(lambda t: chain(t).sum())(x), rtol=1e-5)


def test_measured_costs_cache_and_fusion_discount(tmp_path) -> None:
    model = cost_model("measured", repeats=5, warmup=1, cache_dir=tmp_path)
    mm = model.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)])
    # a map big enough that a pass over memory stands out of timer noise: fused into its producer,
    # a relu costs a small part of that pass
    relu = model.op_cost("relu", {}, [(512, 512)])
    assert mm > 0 and relu > 0
    assert model.op_cost("reshape", {"shape": (4096,)}, [(64, 64)]) == 0.0
    assert relu <= model.isolated_cost("relu", {}, [(512, 512)]) * 0.5
    model.save()
    again = cost_model("measured", cache_dir=str(tmp_path))  # a str path is fine too
    assert again.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)]) == mm  # read back, not re-measured

"""Pallas kernels (interpret mode on CPU) match XLA in value and gradient; measured costs are cached
on disk and charge fusible ops their marginal time."""

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


def test_fused_unary_chains_compute_and_differentiate_as_the_unfused_ops() -> None:
    """A chain fused into one Pallas kernel runs each op's one lowering (`lower.LOWERINGS`), so its
    values and gradients equal the XLA lowering's, relu's at 0 included (jax.nn.relu's 0, as
    under jax.jit, not jnp.maximum's 0.5)."""
    from eqsat.ir import GraphBuilder
    from jax_backend.lower import to_jax
    from jax_backend.pallas import to_jax_pallas

    b = GraphBuilder()
    graph = b.build([b.tanh(b.relu(b.input("x", (4, 8))))])
    x = _rand(4, 8).at[0].set(0.0)
    fused, kernels = to_jax_pallas(graph, interpret=True)
    assert kernels == ("pallas:elementwise[relu+tanh]",)
    grad = lambda run: jax.grad(lambda v: run({"x": v})[0].sum())(x)  # noqa: E731
    np.testing.assert_array_equal(fused({"x": x})[0], to_jax(graph)({"x": x})[0])
    np.testing.assert_array_equal(grad(fused), grad(to_jax(graph)))
    np.testing.assert_array_equal(grad(fused)[0], np.zeros(8))


def test_measured_costs_are_real_and_cached(tmp_path) -> None:
    model = cost_model("measured", repeats=5, warmup=1, cache_dir=tmp_path)
    mm = model.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)])
    assert mm > 0 and model.op_cost("relu", {}, [(64, 64)]) > 0
    assert model.op_cost("reshape", {"shape": (4096,)}, [(64, 64)]) == 0.0  # a view costs nothing
    # no save(): each measurement is written at once (a process that measures a few ops keeps them)
    again = cost_model("measured", cache_dir=str(tmp_path))  # a str path is fine too
    assert again.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)]) == mm  # read back, not re-measured


def test_fusible_ops_are_charged_their_marginal_time(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relu is timed inside a chain and charged what it adds to it (XLA fuses it into its
    producer's loop); a matmul is timed alone. The timer is replaced by a script, so the rule, not
    machine noise, is what is checked."""
    from jax_backend.measured_cost import MeasuredModel

    timings = iter([2e-4, 5e-4, 4.6e-4, 3e-4])  # matmul alone; relu chain with, without; relu alone
    monkeypatch.setattr(MeasuredModel, "_time", lambda self, fn, args: next(timings))
    model = cost_model("measured", cache_dir=tmp_path)
    assert model.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)]) == 2e-4
    assert model.op_cost("relu", {}, [(512, 512)]) == pytest.approx(4e-5)
    assert model.isolated_cost("relu", {}, [(512, 512)]) == 3e-4
    assert model.op_cost("relu", {}, [(512, 512)]) == pytest.approx(4e-5)  # cached: the script is spent


def test_the_producer_chain_is_timed_once_per_shape(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fusible ops on one shape share the `neg` chain's time (the same measurement), so a cold
    first call compiles and times it once, not once per op; another shape times its own."""
    from jax_backend.measured_cost import MeasuredModel

    timings = iter([5e-4, 4.6e-4, 4.9e-4, 7e-4, 6e-4])  # relu chain, neg alone, exp chain; relu at a new shape, neg
    monkeypatch.setattr(MeasuredModel, "_time", lambda self, fn, args: next(timings))
    model = cost_model("measured", cache_dir=tmp_path)
    assert model.op_cost("relu", {}, [(512, 512)]) == pytest.approx(4e-5)
    assert model.op_cost("exp", {}, [(512, 512)]) == pytest.approx(3e-5)  # the chain alone not timed again
    assert model.op_cost("relu", {}, [(256, 512)]) == pytest.approx(1e-4)

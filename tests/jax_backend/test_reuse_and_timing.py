"""Structurally identical regions are optimized once; weights a merge concatenates are folded at
optimization time; the speed decision needs confidence and its interval brackets the truth."""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.ir import GraphBuilder
from eqsat.structure import canonicalize
from jax_backend.decorator import EqsatFallbackWarning, optimize
from jax_backend.timing import bootstrap_median_ci, paired_timing, screen_timings


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[-1]), jnp.float32)


def _add_one_after_sleeping(seconds: float):
    """`t + 1` that takes at least `seconds`: a function known to be slower than its jitted copy."""
    def slow(t):
        time.sleep(seconds)
        return t + 1.0

    return slow


def test_canonical_form_ignores_leaf_names_only() -> None:
    def build(a: str, b: str, act: int) -> object:
        g = GraphBuilder()
        x, w = g.input(a, (4, 8)), g.weight(b, (8, 8))
        return g.build([g.matmul(x, w, act=act)])

    one, two, other = canonicalize(build("v1", "v2", 0)), canonicalize(build("v7", "v9", 0)), canonicalize(build("v1", "v2", 2))
    assert one.graph == two.graph and one.graph != other.graph
    assert two.restore(one.graph) == build("v7", "v9", 0)


def test_identical_layers_are_optimized_once() -> None:
    ws = [(_rand(32, 32, seed=3 * i), _rand(32, 32, seed=3 * i + 1), _rand(32, 32, seed=3 * i + 2)) for i in range(4)]

    def stack(x):
        for wq, wk, wv in ws:  # separate projections of one input, then a softmax
            q, k, v = x @ wq, x @ wk, x @ wv
            x = jax.lax.optimization_barrier(jax.nn.softmax(q @ k.T, axis=-1) @ v + x)  # opaque: splits graphs
        return x

    opt = optimize(stack, check_speed=False, time_limit=8.0)
    x = _rand(16, 32, seed=99)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)  # nothing may fail on the way
        np.testing.assert_allclose(opt(x), stack(x), rtol=2e-4, atol=1e-5)
    report = opt.report(x)
    assert report.reused_regions >= 2  # the middle layers reuse the first one's result
    assert report.distinct_regions < report.distinct_regions + report.reused_regions


def test_merged_weights_are_folded_and_grads_match() -> None:
    wq, wk, wv = _rand(64, 64, seed=1), _rand(64, 64, seed=2), _rand(64, 64, seed=3)

    def qkv(x):
        return jnp.tanh(x @ wq) * jax.nn.sigmoid(x @ wk) + x @ wv

    opt = optimize(qkv, cost_model="merge", check_speed=False, time_limit=5.0)  # merge: one call beats three
    x = _rand(32, 64, seed=4)
    np.testing.assert_allclose(jax.jit(opt)(x), qkv(x), rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda t: jnp.sum(opt(t) ** 2))(x),
                               jax.grad(lambda t: jnp.sum(qkv(t) ** 2))(x), rtol=2e-4, atol=1e-4)
    report = opt.report(x)
    assert report.used == "optimized", report.reason
    (seg,) = report.segments
    assert sum(n.op == "matmul" for n in seg.after.live().nodes) < 3
    assert any(n.op == "concat" for n in seg.after.nodes)  # the merged weight, built from the three
    hlo = jax.jit(opt).lower(x).as_text()
    assert "concatenate" not in hlo  # the concatenated weight is a constant, not run-time work


def test_bootstrap_interval_contains_median_and_narrows() -> None:
    rng = np.random.default_rng(0)
    small = bootstrap_median_ci(rng.normal(1.0, 0.1, 10))
    large = bootstrap_median_ci(rng.normal(1.0, 0.1, 400))
    assert small[0] <= 1.0 <= small[1] or abs(np.mean(small) - 1.0) < 0.1
    assert large[1] - large[0] < small[1] - small[0]


def test_paired_timing_detects_a_clearly_slower_function_and_not_a_copy() -> None:
    x = _rand(64, 64)
    fast = jax.jit(lambda t: t + 1.0)
    slower = paired_timing(fast, _add_one_after_sleeping(0.003), [x], rounds=10, budget_s=2.0)
    assert slower.speedup < 1.0 and not slower.faster_with_confidence
    same = paired_timing(fast, jax.jit(lambda t: t + 1.0), [x], rounds=10, budget_s=2.0)
    low, high = same.speedup_ci
    assert 0.5 < same.speedup < 2.0 and low <= same.speedup <= high  # a copy: as fast, within noise
    assert slower.speedup < 0.5 * same.speedup


def test_capture_writes_per_channel_broadcasts_in_the_form_folding_rules_match() -> None:
    from jax_backend.capture import capture

    def f(y: jax.Array, mean: jax.Array) -> jax.Array:
        return y - mean[None, :, None, None]

    program, _ = capture(f, jnp.ones((2, 3, 4, 4)), jnp.ones((3,)))
    broadcasts = [n for step in program.graphs for n in step.graph.nodes if n.op == "broadcast"]
    assert broadcasts and all(n.attr["dims"] == (1,) for n in broadcasts)


def test_screen_times_every_candidate_in_the_same_rounds() -> None:
    x = _rand(64, 64)
    base = jax.jit(lambda t: t + 1.0)
    copy, slower = screen_timings(base, [jax.jit(lambda t: t + 1.0), _add_one_after_sleeping(0.004)], [x], rounds=8, budget_s=2.0)
    assert copy.rounds == slower.rounds
    assert slower.speedup < 0.5 and not slower.faster_with_confidence
    assert slower.speedup < copy.speedup


def test_batchnorm_after_conv_folds_to_one_conv_and_one_bias() -> None:
    """Capture writes inference batchnorm as sub, mul and add of per-channel broadcasts; the folding
    rules move the scale into the conv weight and merge the two shifts, and lowering precomputes
    the scaled weight and the combined shift while the broadcast stays in the fusion."""
    rng = np.random.default_rng(5)
    w = jnp.asarray(rng.standard_normal((8, 4, 3, 3)) / 6, jnp.float32)
    scale, bias, mean = (jnp.asarray(rng.standard_normal(8), jnp.float32) for _ in range(3))
    var = jnp.asarray(np.abs(rng.standard_normal(8)) + 0.5, jnp.float32)

    def conv_bn(x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        inv = scale / jnp.sqrt(var + 1e-5)
        return jax.nn.relu((y - mean[None, :, None, None]) * inv[None, :, None, None] + bias[None, :, None, None])

    opt = optimize(conv_bn, cost_model="roofline", check_speed=False, time_limit=8.0)
    x = _rand(2, 4, 10, 10, seed=6)
    np.testing.assert_allclose(jax.jit(opt)(x), conv_bn(x), rtol=2e-4, atol=1e-5)
    report = opt.report(x)
    assert report.used == "optimized", report.reason
    full = (2, 8, 10, 10)
    run_time = [n.op for s in report.segments for n in s.after.live().nodes
                if n.op not in ("input", "weight") and full in n.shapes]
    assert sorted(run_time) == ["broadcast", "conv2d", "ewadd", "relu"]
    jaxpr = str(jax.make_jaxpr(opt)(x))
    assert "sqrt" not in jaxpr and jaxpr.count("mul ") == 0  # scale and shift were precomputed


def test_checks_and_timing_run_outside_any_trace() -> None:
    """The wrapper is usually first called while jax.jit traces; the optimization then runs on a
    worker thread where values are concrete and jitted candidates dispatch as in a user's calls."""
    from jax_backend.decorator import _outside_traces

    seen: list[bool] = []

    @jax.jit
    def traced(x):
        seen.append(isinstance(x + 1, jax.core.Tracer))
        seen.append(_outside_traces(lambda: isinstance(jnp.ones(2) + 1, jax.core.Tracer)))
        return x

    traced(jnp.ones(2))
    assert seen == [True, False]

"""Every path of `@eqsat.optimize` runs compiled, as `jax.jit` runs it; non-array arguments, PRNG
keys, side effects and closed-over globals behave as under `jax.jit`; a fuzz over call patterns."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import io_callback

import eqsat
from jax_backend.decorator import EqsatFallbackWarning, optimize


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


X = _rand(8, 8)


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EqsatFallbackWarning)
        yield


def _traced_only(seen: list[bool]) -> None:
    """The user function only ever ran on tracers, once per signature: it was compiled."""
    assert seen and all(seen), "the user function ran eagerly"


def test_original_path_is_compiled_not_eager() -> None:
    seen: list[bool] = []

    def f(x):
        seen.append(isinstance(x, jax.core.Tracer))
        return jnp.tanh(x) @ x

    opt = optimize(f, time_limit=1.0)
    for _ in range(3):
        np.testing.assert_array_equal(opt(X), jax.jit(f)(X))
    assert opt.report(X).used == "original"
    _traced_only(seen)
    traces = len(seen)
    opt(X)
    assert len(seen) == traces  # a steady-state call traces nothing: jax.jit's cache answers


def test_fallback_after_a_failure_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax_backend.decorator as dec

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("optimizer bug")

    monkeypatch.setattr(dec, "build_signature", broken)
    seen: list[bool] = []

    def f(x):
        seen.append(isinstance(x, jax.core.Tracer))
        return jnp.sin(x) + 1.0

    opt = optimize(f)
    with pytest.warns(EqsatFallbackWarning, match="optimizer bug"):
        out = opt(X)
    np.testing.assert_array_equal(out, jax.jit(f)(X))
    _traced_only(seen)


def test_a_failing_optimized_version_falls_back_while_tracing() -> None:
    def f(x):
        return jnp.tanh(x) * 2.0

    opt = optimize(f, check_speed=False, time_limit=1.0)
    opt.report(X)
    entry = next(iter(opt._cache.values()))

    def fails(*_: Any) -> Any:
        raise RuntimeError("lowering bug")

    entry.fn = fails
    with pytest.warns(EqsatFallbackWarning, match="lowering bug"):
        np.testing.assert_array_equal(opt(X), jax.jit(f)(X))
    assert opt.report(X).used == "original"


def test_non_array_arguments_are_static() -> None:
    seen: list[bool] = []

    def f(x, act="tanh", scale=2.0):
        seen.append(isinstance(x, jax.core.Tracer))
        return getattr(jnp, act)(x) * scale

    opt = optimize(f, time_limit=1.0)
    for act in ("tanh", "sin", "tanh"):
        out_kw, out_pos = opt(X, act=act), opt(X, act, 3.0)
        assert all(seen), "the user function ran eagerly"
        np.testing.assert_allclose(out_kw, f(X, act=act), rtol=1e-6)
        np.testing.assert_allclose(out_pos, f(X, act, 3.0), rtol=1e-6)
        seen.clear()
    assert len(opt.reports) == 4  # keyword or positional call × two strings; the float is traced, not static
    assert "static 'sin'" in opt.report(X, act="sin").signature


def test_unhashable_static_arguments_are_keyed_by_content() -> None:
    def f(x, factors):
        return jnp.tanh(x) * factors[0] + factors[1]

    opt = optimize(f, static_argnums=1, time_limit=1.0)
    np.testing.assert_allclose(opt(X, [2.0, 1.0]), f(X, [2.0, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(opt(X, [3.0, 0.0]), f(X, [3.0, 0.0]), rtol=1e-6)
    np.testing.assert_allclose(opt(X, [2.0, 1.0]), f(X, [2.0, 1.0]), rtol=1e-6)
    assert len(opt.reports) == 2


def test_inside_jit_grad_vmap() -> None:
    def f(x, w):
        return jnp.tanh(x @ w) @ w

    opt = optimize(f, check_speed=False, time_limit=1.0)
    w = _rand(8, 8, seed=1)
    np.testing.assert_allclose(jax.jit(opt)(X, w), f(X, w), rtol=2e-4, atol=1e-5)
    g = jax.grad(lambda a, b: opt(a, b).sum(), argnums=(0, 1))(X, w)
    r = jax.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1))(X, w)
    for a, b in zip(g, r):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4)
    xs = jnp.stack([X, _rand(8, 8, seed=2)])
    np.testing.assert_allclose(jax.vmap(opt, in_axes=(0, None))(xs, w), jax.vmap(f, in_axes=(0, None))(xs, w),
                               rtol=2e-4, atol=1e-5)


def dropout_mlp(key, x, w):
    keep = jax.random.bernoulli(key, 0.8, x.shape)
    h = jnp.where(keep, x / 0.8, 0.0)
    return jnp.tanh(h @ w) @ w


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey], ids=["typed", "legacy"])
def test_random_keys_as_arguments(make_key: Any) -> None:
    w = _rand(8, 8, seed=1)
    opt = optimize(dropout_mlp, time_limit=1.0)
    for seed in (0, 1):
        key = make_key(seed)
        np.testing.assert_allclose(opt(key, X, w), jax.jit(dropout_mlp)(key, X, w), rtol=2e-4, atol=1e-5)
    grads = jax.grad(lambda v: opt(make_key(0), v, w).sum())(X)
    np.testing.assert_allclose(grads, jax.grad(lambda v: dropout_mlp(make_key(0), v, w).sum())(X), rtol=2e-4,
                               atol=1e-4)
    assert "random_bits" in opt.report(make_key(0), X, w).opaque
    text = eqsat.explain(opt, make_key(0), X, w).text()
    assert "signature:" in text


def test_keys_made_inside_and_returned() -> None:
    def f(x):
        key, sub = jax.random.split(jax.random.key(3))
        return jnp.tanh(x) * jax.random.normal(sub, x.shape), key

    opt = optimize(f, time_limit=1.0)
    out, key = opt(X)
    ref_out, ref_key = jax.jit(f)(X)
    np.testing.assert_allclose(out, ref_out, rtol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(ref_key))
    assert "used:" in eqsat.explain(f, X).text()


def test_side_effects_run_once_per_call() -> None:
    calls: list[int] = []
    printed: list[int] = []

    def f(x):
        x = io_callback(lambda v: calls.append(1) or v, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        jax.debug.callback(lambda v: printed.append(1), x.sum())
        return jnp.tanh(x @ x) @ x

    opt = optimize(f)
    for k in range(1, 4):
        np.testing.assert_allclose(opt(X), jax.jit(f)(X), rtol=1e-6)
        jax.effects_barrier()
        assert len(calls) == 2 * k and len(printed) == 2 * k  # once for opt, once for the reference
    report = opt.report(X)
    assert report.used == "original" and "side effects" in report.reason
    assert report.time_original_s is None  # nothing was timed


COUNTER = {"scale": 1.0}
SCALE = 1.0


def scaled_by_global(x):
    return jnp.tanh(x) * SCALE


def test_closed_over_globals_behave_as_under_jax_jit() -> None:
    """A global is read when the function is traced (once per signature), as under jax.jit:
    rebinding it later does not change the compiled function."""
    global SCALE
    opt, jitted = optimize(scaled_by_global, time_limit=1.0), jax.jit(scaled_by_global)
    try:
        first = opt(X)
        np.testing.assert_array_equal(first, jitted(X))
        SCALE = 5.0
        np.testing.assert_array_equal(opt(X), jitted(X))  # both still scale by 1.0
        np.testing.assert_array_equal(opt(X), first)
        y = _rand(4, 8)  # a new signature is traced anew and reads the new value, as jax.jit does
        np.testing.assert_allclose(opt(y), jitted(y), rtol=1e-6)
        np.testing.assert_allclose(opt(y), np.tanh(np.asarray(y)) * 5.0, rtol=1e-6)
    finally:
        SCALE = 1.0


# --- fuzz: random call patterns ---------------------------------------------------------------------

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int32": jnp.int32}


@st.composite
def _calls(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "container": draw(st.sampled_from(["dict", "list", "tuple", "nested"])),
        "leaves": draw(st.integers(1, 4)),
        "dtype": draw(st.sampled_from(sorted(_DTYPES))),
        "rows": draw(st.integers(1, 5)),
        "mode": draw(st.sampled_from(["tanh", "sin", None])),
        "static_n": draw(st.integers(1, 3)),
        "with_key": draw(st.sampled_from([None, "typed", "legacy"])),
        "scalar": draw(st.sampled_from([None, 2, 0.5])),
        "transform": draw(st.sampled_from(["none", "jit", "vmap", "grad"])),
    }


def _tree(spec: dict[str, Any], seed: int) -> Any:
    rng = np.random.default_rng(seed)
    dtype = _DTYPES[spec["dtype"]]
    leaves = [jnp.asarray(rng.standard_normal((spec["rows"], 4)) * 3, dtype) for _ in range(spec["leaves"])]
    if spec["container"] == "dict":
        return {f"p{i}": v for i, v in enumerate(leaves)}
    if spec["container"] == "list":
        return leaves
    if spec["container"] == "tuple":
        return tuple(leaves)
    return {"a": leaves[:1], "b": {"c": tuple(leaves[1:])}}


def _program(tree: Any, n: int, key: Any = None, scalar: Any = None, *, mode: str | None = None) -> Any:
    total = 0.0
    for leaf in jax.tree_util.tree_leaves(tree):
        v = leaf.astype(jnp.float32)
        v = getattr(jnp, mode)(v) if mode else v
        total = total + (v @ jnp.ones((v.shape[-1], 3), jnp.float32)) * n
    if key is not None:
        total = total * jax.random.uniform(key, (3,))
    if scalar is not None:
        total = total + scalar
    return {"out": total, "n": n}


@pytest.mark.slow  # ~17 s
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls())
def test_fuzz_call_patterns(spec: dict[str, Any]) -> None:
    opt = optimize(_program, static_argnums=1, check_speed=False, time_limit=0.5)
    key = {None: None, "typed": jax.random.key(1), "legacy": jax.random.PRNGKey(1)}[spec["with_key"]]
    kwargs = {} if spec["mode"] is None else {"mode": spec["mode"]}
    tree = _tree(spec, 0)
    call = lambda f: lambda t: f(t, spec["static_n"], key, spec["scalar"], **kwargs)["out"]  # noqa: E731
    ref = jax.jit(call(_program)) if spec["mode"] is None else call(_program)
    if spec["transform"] == "jit":
        got, want = jax.jit(call(opt))(tree), ref(tree)
    elif spec["transform"] == "vmap":
        batched = jax.tree_util.tree_map(lambda v: jnp.stack([v, v * 2]), tree)
        got, want = jax.vmap(call(opt))(batched), jax.vmap(call(_program))(batched)
    elif spec["transform"] == "grad" and spec["dtype"] == "float32":
        got = jax.grad(lambda t: call(opt)(t).sum())(tree)
        want = jax.grad(lambda t: call(_program)(t).sum())(tree)
    else:
        got, want = call(opt)(tree), ref(tree)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2)
    assert opt(tree, spec["static_n"], key, spec["scalar"], **kwargs)["n"] == spec["static_n"]

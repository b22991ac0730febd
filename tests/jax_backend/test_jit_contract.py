"""`@eqsat.optimize` keeps `jax.jit`'s contract, each item checked side by side with `jax.jit`:
methods (plain classes, Equinox, Flax nnx and linen), static arguments by position or name,
donation, `.lower` / `.trace` / `.eval_shape` / `.clear_cache`, `functools.wraps` metadata, and the
errors `jax.jit` raises (the same type, with no eqsat warning first)."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_backend.decisions import EqsatCacheWarning
from jax_backend.decorator import BoundOptimizedFunction, EqsatFallbackWarning, OptimizedFunction, optimize

FAST = {"check_speed": False, "time_limit": 0.5}


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[-1]), jnp.float32)


X, W = _rand(8, 8), _rand(8, 8, seed=1)


@pytest.fixture
def no_eqsat_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)
        warnings.simplefilter("error", EqsatCacheWarning)
        yield


def _both(fun: Callable[..., Any], **jit_kwargs: Any) -> tuple[Any, Any]:
    return jax.jit(fun, **jit_kwargs), optimize(fun, **jit_kwargs, **FAST)


def _same(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


# --- methods ---------------------------------------------------------------------------------------

def _plain_class(deco: Callable[[Callable[..., Any]], Any]) -> Any:
    class Layer:
        def __init__(self, scale: float) -> None:
            self.scale = scale

        @deco
        def __call__(self, x: jax.Array, w: jax.Array) -> jax.Array:
            return jnp.tanh(x @ w) * self.scale

    return Layer


def test_method_of_a_plain_class_gets_self(no_eqsat_warnings: None) -> None:
    """`@partial(jax.jit, static_argnums=0)` on a method, and the same with eqsat."""
    jitted = _plain_class(functools.partial(jax.jit, static_argnums=0))
    ours = _plain_class(functools.partial(optimize, static_argnums=0, **FAST))
    _same(ours(2.0)(X, W), jitted(2.0)(X, W))
    _same(ours(3.0)(X, W), jitted(3.0)(X, W))  # another instance: another static value
    layer = ours(2.0)
    bound = layer.__call__
    assert isinstance(bound, BoundOptimizedFunction) and bound.__self__ is layer
    assert isinstance(type(layer).__dict__["__call__"], OptimizedFunction)
    assert bound.__name__ == "__call__" and bound.report(X, W).signature
    _same(bound.lower(X, W).compile()(X, W), jitted(2.0)(X, W))  # a bound jax.jit method cannot lower: ours can
    assert bound.eval_shape(X, W) == jax.ShapeDtypeStruct((8, 8), jnp.float32)


def test_method_without_static_self_is_made_static() -> None:
    """Without `static_argnums=0`, `jax.jit` refuses a plain `self`; eqsat makes a non-array
    argument static instead (documented), so the same method works."""
    ours = _plain_class(functools.partial(optimize, **FAST))
    with pytest.raises(TypeError):
        _plain_class(jax.jit)(2.0)(X, W)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)
        _same(ours(2.0)(X, W), jnp.tanh(X @ W) * 2.0)


def _eqx_model(deco: Callable[[Callable[..., Any]], Any]) -> Any:
    class Model(eqx.Module):
        w: jax.Array
        b: jax.Array

        @deco
        def __call__(self, x: jax.Array) -> jax.Array:
            return jax.nn.relu(x @ self.w + self.b)

    return Model(W, _rand(8, seed=2))


def test_equinox_module_method(no_eqsat_warnings: None) -> None:
    jitted, ours = _eqx_model(jax.jit), _eqx_model(functools.partial(optimize, **FAST))
    _same(ours(X), jitted(X))
    loss = lambda m: jnp.sum(m(X) ** 2)  # noqa: E731
    _same(jax.grad(loss)(ours), jax.grad(loss)(jitted))  # gradients with respect to the module's fields
    _same(jax.vmap(ours)(jnp.stack([X, 2 * X])), jax.vmap(jitted)(jnp.stack([X, 2 * X])))


def _nnx_model(deco: Callable[[Callable[..., Any]], Any]) -> Any:
    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.dense = nnx.Linear(8, 8, rngs=rngs)

        @deco
        def __call__(self, x: jax.Array) -> jax.Array:
            return jnp.tanh(self.dense(x))

    return Model(nnx.Rngs(0))


def test_flax_nnx_module_method(no_eqsat_warnings: None) -> None:
    _same(_nnx_model(functools.partial(optimize, **FAST))(X), _nnx_model(jax.jit)(X))


def test_flax_linen_module_method_runs_the_original_with_one_warning() -> None:
    """A bound linen module is not hashable: `jax.jit(..., static_argnums=0)` refuses it; eqsat
    warns once and runs the original (compiled), with the right result."""
    def model(deco: Callable[[Callable[..., Any]], Any]) -> Any:
        class Model(linen.Module):
            @linen.compact
            def __call__(self, x: jax.Array) -> jax.Array:
                return self.act(linen.Dense(8)(x))

            @deco
            def act(self, h: jax.Array) -> jax.Array:
                return jnp.tanh(h) * 2.0

        return Model()

    plain = model(lambda f: f)
    params = plain.init(jax.random.key(0), X)
    with pytest.raises(ValueError, match="hash"):
        model(functools.partial(jax.jit, static_argnums=0)).apply(params, X)
    ours = model(functools.partial(optimize, static_argnums=0, **FAST))
    with pytest.warns(EqsatFallbackWarning, match="no content-based key") as record:
        _same(ours.apply(params, X), plain.apply(params, X))
        _same(ours.apply(params, X), plain.apply(params, X))
    assert len([w for w in record if issubclass(w.category, EqsatFallbackWarning)]) == 1


# --- static arguments, donation ----------------------------------------------------------------------

def scaled(x: jax.Array, w: jax.Array, n: int, act: str = "tanh") -> jax.Array:
    return getattr(jnp, act)(x @ w) * n + jnp.ones(n).sum()  # `n` must be concrete (a shape)


@pytest.mark.parametrize(("jit_kwargs", "call_args", "call_kwargs"), [
    ({"static_argnames": "n"}, (X, W, 3), {}),  # a static name passed by position
    ({"static_argnames": "n"}, (X, W), {"n": 3}),
    ({"static_argnums": 2}, (X, W), {"n": 3}),  # a static position passed by name
    ({"static_argnums": -1}, (X, W, 3), {}),  # counted from the end (of the signature)
    ({"static_argnums": -2}, (X, W, 3), {}),
    ({"static_argnames": ("n", "act")}, (X, W, 2, "sin"), {}),
])
def test_static_arguments_as_jax_jit(jit_kwargs: dict[str, Any], call_args: tuple[Any, ...],
                                     call_kwargs: dict[str, Any], no_eqsat_warnings: None) -> None:
    jitted, ours = _both(scaled, **jit_kwargs)
    try:
        expected = jitted(*call_args, **call_kwargs)
    except Exception as exc:  # noqa: BLE001 - then the same error (static_argnums=-1 is `act` here, as jax.jit counts)
        with pytest.raises(type(exc)):
            ours(*call_args, **call_kwargs)
        return
    _same(ours(*call_args, **call_kwargs), expected)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")  # (0, 1): one output, two buffers
@pytest.mark.parametrize("jit_kwargs", [{"donate_argnums": 0}, {"donate_argnames": "x"}, {"donate_argnums": (0, 1)}])
def test_donation_as_jax_jit(jit_kwargs: dict[str, Any], no_eqsat_warnings: None) -> None:
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w) + x

    jitted, ours = _both(f, **jit_kwargs)
    mine, theirs = (X + 0.0, W + 0.0), (X + 0.0, W + 0.0)
    _same(ours(*mine), jitted(*theirs))
    assert [a.is_deleted() for a in mine] == [a.is_deleted() for a in theirs]
    assert mine[0].is_deleted()


def test_bad_donations_as_jax_jit() -> None:
    """A static argument cannot be donated (refused at decoration, as by `jax.jit`); a donated
    Python number is not a buffer (the same JAX warning, the same result)."""
    f = lambda x, n: x * n  # noqa: E731
    for make in (lambda: jax.jit(f, static_argnums=1, donate_argnums=1),
                 lambda: optimize(f, static_argnums=1, donate_argnums=1, **FAST)):
        with pytest.raises(ValueError, match="cannot intersect"):
            make()
    jitted, ours = _both(f, donate_argnums=1)
    for fn in (jitted, ours):
        with pytest.warns(UserWarning, match="donated buffers were not usable"):
            _same(fn(X, 3.0), X * 3.0)


def test_donation_with_a_non_array_argument() -> None:
    """Where `jax.jit` refuses a string argument, eqsat makes it static and still donates."""
    ours = optimize(lambda x, act: getattr(jnp, act)(x) + 1.0, donate_argnums=0, **FAST)
    x = X + 0.0
    _same(ours(x, "sin"), jnp.sin(X) + 1.0)
    assert x.is_deleted()


# --- stages, caches, metadata ------------------------------------------------------------------------

def body(x: jax.Array, w: jax.Array) -> jax.Array:
    """A docstring that must survive the decorator."""
    return jax.nn.relu(x @ w) @ w.T


def test_lower_trace_eval_shape_as_jax_jit(no_eqsat_warnings: None) -> None:
    jitted, ours = _both(body)
    lowered = ours.lower(X, W)
    assert "stablehlo" in lowered.as_text() or "func.func" in lowered.as_text()
    _same(lowered.compile()(X, W), jitted(X, W))
    traced, reference = ours.trace(X, W), jitted.trace(X, W)
    assert traced.out_avals == reference.out_avals and traced.in_avals == reference.in_avals
    _same(traced.lower().compile()(X, W), jitted(X, W))
    assert ours.eval_shape(X, W) == jitted.eval_shape(X, W)
    spec = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert ours.eval_shape(spec, spec) == jitted.eval_shape(spec, spec)
    _same(ours.lower(spec, spec).compile()(X, W), jitted(X, W))  # lowering from abstract values, as jax.jit


OFFSET = 0.0


def shifted(x: jax.Array) -> jax.Array:
    return jnp.tanh(x) + OFFSET


def test_clear_cache_retraces_as_jax_jit(no_eqsat_warnings: None) -> None:
    global OFFSET
    jitted, ours = _both(shifted)
    try:
        _same(ours(X), jitted(X))
        OFFSET = 1.0
        _same(ours(X), jitted(X))  # both still use the traced 0.0
        _same(ours(X), jnp.tanh(X))
        jitted.clear_cache()
        ours.clear_cache()
        _same(ours(X), jitted(X))  # both read the new global
        _same(ours(X), jnp.tanh(X) + 1.0)
    finally:
        OFFSET = 0.0


def test_wraps_metadata_as_jax_jit() -> None:
    jitted, ours = _both(body)
    for name in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
        assert getattr(ours, name) == getattr(jitted, name), name
    assert ours.__wrapped__ is body
    assert inspect.signature(ours) == inspect.signature(jitted) == inspect.signature(body)


# --- errors jax.jit raises ------------------------------------------------------------------------------

def _error_of(call: Callable[[], Any]) -> type[BaseException]:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the type is the answer
        return type(exc)
    raise AssertionError("no error")


@pytest.mark.parametrize(("args", "kwargs"), [
    ((X, _rand(3, 5)), {}),  # wrong shape: the matmul fails while tracing
    ((X,), {}),  # missing argument
    ((X, W, W), {}),  # one too many
    ((X,), {"v": W}),  # unknown keyword
    ((X, jnp.ones((8, 8), jnp.int32) > 0), {}),  # a mask where a float is expected: fine for both
    ((X, "w"), {}),  # a string: jax.jit refuses it, eqsat makes it static and the matmul refuses it
])
def test_errors_as_jax_jit_with_no_eqsat_warning(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    jitted, ours = _both(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eqsat warning (or any other) before jax.jit's error
        try:
            expected = jitted(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            with pytest.raises(type(exc)):
                ours(*args, **kwargs)
            return
        _same(ours(*args, **kwargs), expected)


def test_function_errors_propagate_once_without_warning() -> None:
    def bad(x: jax.Array) -> jax.Array:
        raise ZeroDivisionError("user bug")

    jitted, ours = _both(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _error_of(lambda: ours(X)) is _error_of(lambda: jitted(X)) is ZeroDivisionError
        assert _error_of(lambda: ours.lower(X)) is _error_of(lambda: jitted.lower(X)) is ZeroDivisionError

"""Pooling and convolution windows under `jax.vmap` (5-D and 6-D windows, vmapped weights) are
captured with the batch axes folded into N and C (issue 25)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_backend.capture import GraphStep, capture, graph_leaf_name, replay
from jax_backend.lower import to_jax


def _lowered(step: GraphStep, values: Sequence[Any]) -> Sequence[Any]:
    return to_jax(step.graph)({graph_leaf_name(i): v for i, v in zip(step.inputs, values)})


def maxpool(x: jax.Array) -> jax.Array:  # NCHW, 3x3 stride 1 SAME
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")


def avgpool_nhwc(x: jax.Array) -> jax.Array:  # NHWC, 2x2 stride 2 VALID
    return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4


def maxpool_1x3(x: jax.Array) -> jax.Array:  # a window over one axis
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 1, 3), (1, 1, 1, 2), "VALID")


def conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.lax.conv(x, w, (1, 1), "SAME")


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...], str]]:
    k = jax.random.split(jax.random.key(0), 3)
    xb = jax.random.normal(k[0], (2, 4, 3, 8, 8))
    return [
        ("vmap_maxpool", jax.vmap(maxpool), (xb,), "poolmax"),
        ("vmap_avgpool_nhwc", jax.vmap(avgpool_nhwc), (jnp.moveaxis(xb, 2, -1),), "poolavg"),
        ("vmap_vmap_maxpool", jax.vmap(jax.vmap(maxpool)), (xb[None],), "poolmax"),
        ("vmap_maxpool_1x3", jax.vmap(maxpool_1x3), (xb,), "poolmax"),
        ("vmap_conv_shared_weight", jax.vmap(conv, in_axes=(0, None)), (xb, jax.random.normal(k[1], (5, 3, 3, 3))),
         "conv2d"),
        ("vmap_conv_vmapped_weight", jax.vmap(conv), (xb, jax.random.normal(k[2], (2, 5, 3, 3, 3))), "conv2d"),
    ]


@pytest.mark.parametrize("name, fn, args, op", _cases(), ids=[c[0] for c in _cases()])
def test_windows_under_vmap_are_captured_and_equal(name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                                                   op: str) -> None:
    program, _ = capture(fn, *args)
    assert not program.opaque, [(s.name, s.why) for s in program.opaque]
    assert len(program.graphs) == 1 and program.graphs[0].graph.op_counts().get(op) == 1
    got = replay(program, _lowered, list(args))[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-5, atol=1e-5)


def test_a_window_over_three_axes_stays_opaque() -> None:
    def pool3d(x: jax.Array) -> jax.Array:
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 2), (1, 1, 1, 1), "VALID")

    program, _ = capture(pool3d, jnp.ones((2, 4, 4, 4)))
    assert [s.name for s in program.opaque] == ["reduce_window_max"]


def test_stack_is_captured_as_a_concat() -> None:
    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.stack([a, b, a * b], axis=1)

    a, b = jnp.arange(6.0).reshape(2, 3), jnp.arange(6.0, 12.0).reshape(2, 3)
    program, _ = capture(f, a, b)
    assert not program.opaque and program.graphs[0].graph.op_counts().get("concat") == 1
    np.testing.assert_array_equal(np.asarray(replay(program, _lowered, [a, b])[0]), np.asarray(f(a, b)))

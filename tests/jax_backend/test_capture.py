"""Capture must preserve meaning: replaying the program (IR graphs in numpy, the rest verbatim)
gives the original outputs, and unsupported equations are kept, not dropped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_backend.capture import capture, numpy_runner, replay


def _args(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _check(fn, args, opaque: set[str] = frozenset()) -> None:
    program, _ = capture(fn, *args)
    got = replay(program, numpy_runner, args)
    want = jax.tree_util.tree_leaves(fn(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    assert opaque <= {s.name for s in program.opaque}


def test_supported_ops_become_ir_and_replay_equal() -> None:
    def f(x, w, b):
        y = jax.nn.relu(x @ w + b) * 2.0
        a, c = jnp.split(y, 2, axis=1)
        z = jnp.einsum("bhqd,bhkd->bhqk", y.reshape(2, 2, 4, 2), y.reshape(2, 2, 4, 2))
        return jnp.tanh(y).sum(axis=0), jnp.mean(y), a - c, z, y[:, 1:3], y ** 2, jnp.exp(-y) / (1 + y * y)

    program, _ = capture(f, *_args((4, 8), (8, 8), (8,)))
    assert not program.opaque  # everything is IR
    _check(f, _args((4, 8), (8, 8), (8,)))


def test_unsupported_parts_replayed_verbatim() -> None:
    def f(x, w):
        h = jnp.tanh(x @ w)
        s = jnp.sort(jnp.cumsum(h, axis=1), axis=1)
        loop = lax.fori_loop(0, 2, lambda i, t: jnp.tanh(t @ w), s)
        return jax.nn.relu(loop @ w + h), jnp.argmax(h, axis=1)

    _check(f, _args((4, 8), (8, 8)), {"cumsum", "sort"})


def test_softmax_and_conv_and_pytrees() -> None:
    def f(params, x):
        y = lax.conv_general_dilated(x, params["w"], (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y2 = lax.conv_general_dilated(x, params["w"], (2, 2), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return {"soft": jax.nn.softmax(y, axis=1), "valid": y2, "cat": jnp.concatenate([y, y], axis=1)}

    x, w = _args((1, 3, 8, 8), (4, 3, 3, 3))
    program, tree = capture(lambda w, x: jax.tree_util.tree_leaves(f({"w": w}, x)), w, x)
    assert sum(n.op == "conv2d" for s in program.graphs for n in s.graph.nodes) == 2
    _check(lambda w, x: f({"w": w}, x), [w, x])


def test_constants_are_kept() -> None:
    table = np.arange(8, dtype=np.float32)
    _check(lambda x: x * jnp.asarray(table) + 3.0, _args((2, 8)))


def test_max_pooling_becomes_poolmax_and_other_windows_stay_opaque() -> None:
    def pools(x):
        same = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")
        strided = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "VALID")
        uneven = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 3), (1, 1, 2, 1), "SAME")
        return same, strided, uneven

    def over_channels(x):  # a window across batch and channels is no 2-D pool in NCHW or NHWC: replayed as it is
        return lax.reduce_window(x, -jnp.inf, lax.max, (2, 2, 1, 1), (1, 1, 1, 1), "VALID")

    args = _args((2, 3, 9, 8))
    program, _ = capture(pools, *args)
    assert not program.opaque
    assert sum(n.op == "poolmax" for s in program.graphs for n in s.graph.nodes) == 3
    _check(pools, args)
    program, _ = capture(over_channels, *args)
    assert [s.name for s in program.opaque] == ["reduce_window_max"]
    _check(over_channels, args)


def test_sum_pooling_becomes_an_average_pool_times_its_window() -> None:
    def average(x):  # JAX's average pooling: a window sum divided by the window size
        return lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2), "SAME") / 9.0

    args = _args((2, 3, 9, 8))
    program, _ = capture(average, *args)
    assert not program.opaque
    assert [n.op for n in program.graphs[0].graph.nodes if n.op.startswith("pool")] == ["poolavg"]
    _check(average, args)


def test_flax_layouts_groups_pooling_and_gelu_are_captured() -> None:
    """NHWC / HWIO convolutions (grouped and depthwise too), NHWC average and max pooling and
    GELU's x**3 become IR (between transposes) and replay equal."""
    def f(x, w, dw):
        dn = ("NHWC", "HWIO", "NHWC")
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
        y = lax.conv_general_dilated(y, dw, (1, 1), "SAME", dimension_numbers=dn, feature_group_count=8)
        y = lax.reduce_window(y, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), "SAME")
        return jax.nn.gelu(y, approximate=True)

    args = _args((2, 8, 8, 4), (3, 3, 4, 8), (3, 3, 1, 8))
    program, _ = capture(f, *args)
    assert not program.opaque
    ops = {n.op for g in program.graphs for n in g.graph.nodes}
    assert {"conv2d", "poolavg", "poolmax", "transpose"} <= ops
    _check(f, args)


def test_opaque_equations_say_why() -> None:
    def f(x):
        return lax.stop_gradient(jnp.cumsum(x, axis=0)) + jnp.abs(x.astype(jnp.complex64)).astype(jnp.float32)

    program, _ = capture(f, *_args((4, 4)))
    why = {s.name: s.why for s in program.opaque}
    assert "scan" in why["cumsum"] and "complex64" in why["convert_element_type"] and "stop_gradient" not in why


def test_relu_is_jax_nn_relu_and_a_bare_maximum_keeps_its_gradient() -> None:
    """Only jax.nn.relu becomes the IR's relu (lowered as jax.nn.relu: gradient 0 at 0); a bare
    `jnp.maximum(x, 0)` becomes ewmax, whose gradient splits at a tie as lax.max's does, so the
    lowered program differentiates at 0 exactly as the original."""
    from jax_backend.capture import graph_leaf_name
    from jax_backend.lower import to_jax

    x = jnp.asarray([0.0, 1.0, -1.0, 0.0])
    for fn, op in ((lambda v: jax.nn.relu(v) * 2.0, "relu"), (lambda v: jnp.maximum(v, 0.0) * 2.0, "ewmax")):
        program, _ = capture(fn, x)
        (step,) = program.graphs
        seen = {n.op for n in step.graph.nodes}
        assert op in seen and ({"relu", "ewmax"} - {op}).isdisjoint(seen)
        run = to_jax(step.graph)
        consts = {graph_leaf_name(i): jnp.asarray(program.consts[i]) for i in step.inputs if i in program.consts}
        lowered = jax.grad(lambda v, run=run, consts=consts: run({**consts, graph_leaf_name(0): v})[0].sum())(x)
        np.testing.assert_array_equal(lowered, jax.grad(lambda v, fn=fn: fn(v).sum())(x))

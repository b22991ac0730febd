"""`lax.scan` (and `fori_loop` with a static trip count) captured as a loop whose body is IR graphs:
optimized inside the loop, replayed as a `lax.scan`, the same numbers and gradients (issue 25)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_backend.capture import GraphStep, LoopStep, Program, capture, graph_leaf_name, replay
from jax_backend.lower import to_jax


def _lowered(step: GraphStep, values: Sequence[Any]) -> Sequence[Any]:
    return to_jax(step.graph)({graph_leaf_name(i): v for i, v in zip(step.inputs, values)})


def _replayed(program: Program) -> Callable[..., Any]:
    return lambda *args: replay(program, _lowered, list(args))


def scan_layers(x: jax.Array, ws: jax.Array, bs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Layers under lax.scan, with a per-layer output stacked by the scan."""
    def layer(h: jax.Array, wb: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        w, b = wb
        return jax.nn.relu(h @ w + b) + h, jnp.sum(h * h)

    return jax.lax.scan(layer, x, (ws, bs))


def scan_attention(x: jax.Array, wqkv: jax.Array) -> jax.Array:
    """Transformer-style layers: separate Q/K/V products of one input (a merge candidate) per layer."""
    def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
        q, k, v = h @ w[0], h @ w[1], h @ w[2]
        return jax.nn.softmax(q @ k.T / 4.0, axis=-1) @ v + h, None

    return jax.lax.scan(layer, x, wqkv)[0]


def fori_layers(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.lax.fori_loop(0, 4, lambda i, h: jnp.tanh(h @ w) + i, x)


def reverse_scan(x: jax.Array, ws: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, reverse=True)[0]


def _cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (4, 8))
    return [
        ("scan_layers", scan_layers, (x, jax.random.normal(k[1], (3, 8, 8)) / 3, jax.random.normal(k[2], (3, 8)))),
        ("scan_attention", scan_attention, (x, jax.random.normal(k[1], (2, 3, 8, 8)) / 3)),
        ("fori_layers", fori_layers, (x, jax.random.normal(k[1], (8, 8)) / 3)),
        ("reverse_scan", reverse_scan, (x, jax.random.normal(k[1], (3, 8, 8)) / 3)),
    ]


@pytest.mark.parametrize("name, fn, args", _cases(), ids=[c[0] for c in _cases()])
def test_the_loop_is_kept_its_body_captured_and_the_numbers_equal(name: str, fn: Callable[..., Any],
                                                                  args: tuple[Any, ...]) -> None:
    program, _ = capture(fn, *args)
    assert not program.opaque, [(s.name, s.why) for s in program.opaque]
    assert len(program.loops) == 1 and program.graphs  # the body's graphs are the program's graphs
    assert all(isinstance(s, GraphStep) for s in program.loops[0].body)
    run = _replayed(program)
    assert "scan" in {str(e.primitive) for e in jax.make_jaxpr(run)(*args).eqns}  # still a loop
    for got, want in zip(jax.tree.leaves(jax.jit(run)(*args)), jax.tree.leaves(jax.jit(fn)(*args))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_gradients_through_the_replayed_loop_equal() -> None:
    _, fn, args = _cases()[0]
    program, _ = capture(fn, *args)
    run = _replayed(program)
    loss = lambda f: lambda *a: sum(jnp.sum(o) for o in jax.tree.leaves(f(*a)))  # noqa: E731
    for got, want in zip(jax.grad(loss(run), argnums=(0, 1, 2))(*args), jax.grad(loss(fn), argnums=(0, 1, 2))(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_an_optimized_body_runs_inside_the_loop() -> None:
    """`with_graphs` replaces the body's graphs; the replayed scan runs the replacement."""
    _, fn, args = _cases()[2]
    program, _ = capture(fn, *args)
    (step,) = program.graphs
    scaled = []
    from eqsat.ir import GraphBuilder

    b = GraphBuilder()
    leaves = {n.attr["name"]: b.apply(n.op, [], n.attr)[0] for _, n in step.graph.leaves()}
    tensors = {}
    for i, n in enumerate(step.graph.nodes):
        tensors[i] = leaves[n.attr["name"]] if n.op in ("input", "weight") else \
            b.apply(n.op, [tensors[v.node] for v in n.inputs], n.attr)[0]
    outs = [tensors[v.node] for v in step.graph.outputs]
    scaled = [b.ewadd(o, o) if o.dtype == "float32" else o for o in outs]  # doubles the float carry
    changed = program.with_graphs([b.build(scaled)])
    assert isinstance(changed.steps[0], LoopStep) and changed.graphs[0].graph != step.graph
    assert not np.allclose(np.asarray(_replayed(changed)(*args)), np.asarray(fn(*args)))


def test_a_dynamic_trip_count_stays_opaque_and_says_why() -> None:
    def f(x: jax.Array, n: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, n, lambda i, h: jnp.tanh(h), x)

    program, _ = capture(f, jnp.ones((3,)), jnp.int32(4))
    why = {s.name: s.why for s in program.opaque}
    assert "control flow" in why["while"]
    np.testing.assert_allclose(np.asarray(_replayed(program)(jnp.ones((3,)), jnp.int32(4))[0]),
                               np.asarray(f(jnp.ones((3,)), jnp.int32(4))))


def test_a_body_with_nothing_captured_stays_one_opaque_scan() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, r: (jax.lax.cumsum(c, axis=0), None), x[0], x)[0] * 2

    x = jnp.arange(12.0).reshape(3, 4)
    program, _ = capture(f, x)
    assert [s.name for s in program.opaque] == ["scan"] and "nothing in its body" in program.opaque[0].why
    assert sorted(program.avals) == list(range(len(program.avals)))  # the body's ids were given back
    np.testing.assert_allclose(np.asarray(_replayed(program)(x)[0]), np.asarray(f(x)))


@pytest.mark.slow  # the decorator's search on the loop body (~10-30 s on a loaded 2-core machine)
def test_the_decorator_optimizes_inside_the_loop() -> None:
    import eqsat

    _, fn, args = _cases()[1]
    f = eqsat.optimize(fn, check_speed=False)
    report = f.report(*args)
    assert not report.opaque and report.used == "optimized", report.reason
    assert any(r.startswith("matmul-merge") for s in report.segments for r in s.rules_fired)
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(jax.jit(fn)(*args)), rtol=1e-5, atol=1e-5)
    assert "scan" in str(jax.make_jaxpr(f)(*args))

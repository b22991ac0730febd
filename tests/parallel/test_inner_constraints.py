"""A plan's layouts inside the captured graphs: read back from the plan (`eqsat.parallel.layouts`),
found in the traced step (`Program.where`, inside inlined calls too) and held there with
`with_sharding_constraint` (`constraints.constrained_step`), the step's numbers unchanged."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat.parallel as ep
from eqsat.ir import GraphBuilder
from eqsat.parallel import api
from eqsat.parallel import constraints
from eqsat.parallel.layouts import value_layouts
from jax_backend.capture import capture_jaxpr

needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")


def _part(b: GraphBuilder, x: Any, dim: int, axis: int, parts: int = 2) -> Any:
    return b.apply("partition", [x], {"dim": dim, "axis": axis, "parts": parts})[0]


def _original() -> tuple[Any, int]:
    b = GraphBuilder()
    x, w = b.input("x", (8, 4)), b.weight("w", (4, 6))
    y = b.matmul(x, w)
    g = b.build([b.relu(y)])
    return g, y.value.node


def test_a_row_split_product_is_read_as_split_on_its_rows() -> None:
    """Batch split over axis 0, then over axis 1: the product's rows are split over (0, 1), major first."""
    g, mm = _original()
    b = GraphBuilder()
    x, w = b.input("x", (8, 4)), b.weight("w", (4, 6))
    xs = _part(b, _part(b, x, -2, 0), -2, 1)
    ws = b.apply("replicate", [b.apply("replicate", [w], {"axis": 0, "parts": 2})[0]], {"axis": 1, "parts": 2})[0]
    y = b.relu(b.matmul(xs, ws))
    y = b.apply("combine", [y], {"dim": -2, "axis": 1})[0]
    plan = b.build([b.apply("combine", [y], {"dim": -2, "axis": 0})[0]])
    layout = value_layouts(g, plan, {mm})[(mm, 0)]
    assert layout.split == ((0, (0, 1)),) and layout.op == "matmul"


def test_column_split_and_summed_products() -> None:
    """A column split reads as split on the last dim; a contraction split leaves partial sums in the
    product, so the value is where `reduce` sums them (held whole); a wrong plan gives nothing."""
    g, mm = _original()
    b = GraphBuilder()
    x, w = b.input("x", (8, 4)), b.weight("w", (4, 6))
    y = b.matmul(b.apply("replicate", [x], {"axis": 0, "parts": 2})[0], _part(b, w, -1, 0))
    plan = b.build([b.relu(b.apply("combine", [y], {"dim": -1, "axis": 0})[0])])
    assert value_layouts(g, plan, {mm})[(mm, 0)].split == ((1, (0,)),)

    b = GraphBuilder()
    x, w = b.input("x", (8, 4)), b.weight("w", (4, 6))
    partial = b.matmul(_part(b, x, -1, 0), _part(b, w, -2, 0))
    plan = b.build([b.relu(b.apply("reduce", [partial], {"axis": 0})[0])])
    layout = value_layouts(g, plan, {mm})[(mm, 0)]
    assert layout.split == () and layout.op == "reduce"

    b = GraphBuilder()
    x, w = b.input("x", (8, 4)), b.weight("w", (4, 6))
    plan = b.build([b.relu(b.matmul(x, b.relu(w)))])  # another value
    assert value_layouts(g, plan, {mm}) == {}


def test_capture_records_where_each_value_is_held() -> None:
    """An einsum is a call (`pjit`) in the jaxpr: its product is found at the call's output, a
    variable of the step itself; a value only inside a call gets the path through it."""
    @jax.jit
    def inner(a: Any) -> Any:
        return jnp.tanh(a) * 2.0

    def f(x: Any, w: Any) -> Any:
        return jnp.sum(inner(jnp.einsum("bd,de->be", x, w)))

    closed = jax.make_jaxpr(f)(jnp.ones((8, 4)), jnp.ones((4, 6)))
    program = capture_jaxpr(closed)
    top = {id(e) for e in closed.jaxpr.eqns}
    (step,) = program.graphs
    mm = next(vid for vid, node, _ in step.sources if step.graph.nodes[node].op == "matmul")
    where = program.where[mm]
    assert len(where) == 1 and any(where[0] in e.outvars for e in closed.jaxpr.eqns)
    tanh = next(vid for vid, node, _ in step.sources if step.graph.nodes[node].op == "tanh")
    path = program.where[tanh]
    assert len(path) == 2 and id(path[0]) in top and str(path[0].primitive) in ("pjit", "jit")
    assert path[1] in path[0].params["jaxpr"].jaxpr.eqns[0].outvars


def _constraint_lines(text: str) -> list[str]:
    """Shardy's sharding_constraint, or GSPMD's @Sharding custom call, in lowered text."""
    return [ln for ln in text.splitlines() if "sharding_constraint" in ln or "@Sharding" in ln]


@needs8
def test_constrained_step_holds_a_value_inside_a_call() -> None:
    """A constraint on a variable inside a jitted helper (a path): the call is run inlined with the
    value held; the result is the step's."""
    @jax.jit
    def inner(a: Any) -> Any:
        return jnp.tanh(a) * 2.0

    def f(x: Any, w: Any) -> Any:
        return jnp.sum(inner(x @ w))

    x, w = jax.random.normal(jax.random.key(0), (16, 8)), jax.random.normal(jax.random.key(1), (8, 4))
    closed, out = jax.make_jaxpr(f, return_shape=True)(x, w)
    call = next(e for e in closed.jaxpr.eqns if "jaxpr" in e.params)
    tanh_var = call.params["jaxpr"].jaxpr.eqns[0].outvars[0]
    mesh = api.auto_mesh(jax.make_mesh((8,), ("data",)))
    g = constraints.constrained_step(closed, jax.tree_util.tree_structure(out), [((call, tanh_var), ("data",))], mesh)
    np.testing.assert_allclose(float(jax.jit(g)(x, w)), float(jax.jit(f)(x, w)), rtol=1e-5)
    found = _constraint_lines(jax.jit(g).lower(x, w).as_text())
    assert len(found) == 1 and ('"data"' in found[0] or "devices=[8" in found[0]), found
    assert constraints.where_str((call, tanh_var)).startswith("inner/")


@needs8
@pytest.mark.slow  # one MLP plan on 8 devices, compiled, and 3 steps run: 30-60 s (several minutes under load)
def test_plan_holds_its_product_layouts_in_the_lowered_step() -> None:
    """An MLP Adam step planned on 8 devices: its products' split layouts are constraints of the
    lowered step (reported as inside a captured graph), and its loss and parameters are the
    single-device step's."""
    optax = pytest.importorskip("optax")
    from experiments.parallel_user_programs import mlp_problem, same_as_single_device

    # the bench's MLP: one small enough (batch 64, width 128) is best run replicated, with no split product to hold
    step, args = mlp_problem()
    mesh = jax.make_mesh((8,), ("data",))
    with pytest.raises(api.ApiError, match="constrain must be one of"):
        ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), constrain="everything")
    plan = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), time_limit=10, baselines=False, within=None)
    assert optax is not None and plan.report.strategy == "eqsat", plan.report.strategy
    r = plan.report
    # each layer's product held at the plan's split (the others held are outputs the plan leaves split:
    # the graph's open outputs, `constraints.inner_constraints`)
    assert r.inner_constraints.count("matmul") >= 3, r.inner_constraints
    inner = r.constraints[len(r.constraints) - len(r.inner_constraints):]
    assert all(spec != "PartitionSpec()" for _, spec in inner)
    assert "inside a captured graph" in plan.explain()
    text = plan.jit().lower(*plan.place(*args)).as_text()
    assert len(_constraint_lines(text)) >= len(r.constraints)
    assert same_as_single_device(plan, step, args)["same_as_single_device"]

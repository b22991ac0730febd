"""The Equinox ViT and the bf16 GRU user programs (experiments/parallel_user_programs.py: `vit`, a
per-example model vmapped over the batch with a class token and a key padding mask, AdamW on a
warmup-cosine schedule; `gru`, f32 master weights cast to bf16, `lax.scan` over time, Lion): they
build and capture, a cast of a weight stands for the weight, a jitted step is planned as its body,
and the GRU planned on 2x4 gives the single-device step's losses."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("optax")
pytest.importorskip("equinox")
needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")


def small_vit() -> tuple[Any, tuple[Any, ...]]:
    from experiments.parallel_user_programs import vit_problem

    return vit_problem(batch=8, size=8, patch=4, d=16, heads=2, hidden=32, layers=2, classes=4)


def small_gru() -> tuple[Any, tuple[Any, ...]]:
    from experiments.parallel_user_programs import gru_problem

    return gru_problem(batch=8, seq=8, vocab=24, d=16, hidden=32)


def forward_program(step: Any, args: tuple[Any, ...]) -> Any:
    from eqsat.parallel.step_args import forward_jaxpr
    from jax_backend.capture import capture_jaxpr

    flat, treedef = jax.tree_util.tree_flatten(args)
    closed = jax.make_jaxpr(lambda *xs: step(*jax.tree_util.tree_unflatten(treedef, xs)))(*flat)
    n_state = len(jax.tree_util.tree_leaves(args[:2]))
    found = forward_jaxpr(closed, set(closed.jaxpr.invars[:n_state]))
    assert found is not None
    return capture_jaxpr(found[0]), n_state


@pytest.mark.slow
def test_vit_is_one_graph_between_its_label_gathers() -> None:
    """Params are `eqx.partition(model, eqx.is_array)`'s (None where the model holds no array), and
    the forward captures to one graph holding every product: the opaque equations (the labels'
    gathers, `is_finite`) come after the logits and cut nothing."""
    step, (params, opt_state, batch) = small_vit()
    assert params.blocks[0].attn.query_proj.weight.shape == (16, 16) and params.blocks[0].attn.dropout.p is None
    program, _ = forward_program(step, (params, opt_state, batch))
    with_products = [g for g in program.graphs if any(n.op == "matmul" for n in g.graph.nodes)]
    assert len(with_products) == 1 and sum(n.op == "matmul" for n in with_products[0].graph.nodes) == 2 + 2 * 8
    assert {o.name for o in program.opaque} <= {"gather", "is_finite"}


def test_bf16_casts_of_weights_stand_for_the_f32_weights() -> None:
    """The GRU casts its f32 master weights to bf16 before the embedding gather (an opaque
    equation), so the casts are in an earlier graph than the products that read them; each bf16
    weight a product graph reads, the scan body's recurrent weight included, maps back to its f32
    argument (so the planner prices it as a parameter and its plan shards the argument)."""
    from eqsat.parallel.step_planner import loop_origins

    step, args = small_gru()
    program, n_state = forward_program(step, args)
    origins = loop_origins(program)
    flat = jax.tree_util.tree_leaves(args)
    weights = {(16, 96), (32, 96), (32, 24)}
    read = [(g, name, shape) for g in program.graphs if any(n.op == "matmul" for n in g.graph.nodes)
            for name, shape in g.graph.leaf_shapes().items() if g.graph.leaf_dtypes()[name] == "bfloat16" and shape in weights]
    assert len(read) == 3  # w_x, w_h (in the scan body), w_out
    for _, name, shape in read:
        arg, stacked = origins[int(name[1:])]
        assert arg < n_state and stacked == 0 and flat[arg].shape == shape and flat[arg].dtype == jnp.float32


def test_a_jitted_step_is_planned_as_its_body() -> None:
    """A `train_step` decorated with `jax.jit` or `eqx.filter_jit` traces to one call equation over
    every argument; `unwrap_jit` gives its body, whose forward is the loss's
    equations alone, not the whole step with its backward and update (the call kept whole)."""
    import equinox as eqx

    from eqsat.parallel.step_args import forward_jaxpr, unwrap_jit
    from experiments.parallel_user_programs import mlp_problem

    step, args = mlp_problem(batch=8, sizes=(8, 16, 4))
    flat, treedef = jax.tree_util.tree_flatten(args)
    n_state = len(jax.tree_util.tree_leaves(args[:2]))

    def traced(f: Any) -> Any:
        return jax.make_jaxpr(lambda *xs: f(*jax.tree_util.tree_unflatten(treedef, xs)))(*flat)

    plain = traced(step)
    forward = forward_jaxpr(plain, set(plain.jaxpr.invars[:n_state]))
    assert forward is not None
    for wrap in (jax.jit, eqx.filter_jit):
        closed = traced(wrap(step))
        assert len(closed.jaxpr.eqns) == 1
        body = unwrap_jit(closed)
        assert len(body.jaxpr.eqns) == len(plain.jaxpr.eqns)
        assert [v.aval for v in body.jaxpr.outvars] == [v.aval for v in plain.jaxpr.outvars]
        found = forward_jaxpr(body, set(body.jaxpr.invars[:n_state]))
        assert found is not None and found[1] == forward[1] and len(found[0].jaxpr.eqns) == len(forward[0].jaxpr.eqns)
    assert unwrap_jit(plain) is plain


def test_an_equinox_model_passed_whole_is_refused_in_one_line_that_says_how() -> None:
    """An `eqx.Module` holds functions besides its arrays: as a `params_argnums` argument it is one
    `EqsatError` line naming what it holds and how to pass its arrays alone."""
    import equinox as eqx

    import eqsat.parallel as ep
    from eqsat.errors import EqsatError

    model = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    with pytest.raises(EqsatError) as err:
        ep.plan(lambda m, x: jnp.mean(jax.vmap(m)(x)), model, jnp.ones((8, 4)),
                mesh=jax.make_mesh((len(jax.devices()),), ("data",)), params_argnums=(0,))
    said = str(err.value)
    assert "not a pytree of arrays" in said and "eqx.partition(model, eqx.is_array)" in said and "\n" not in said


@needs8
@pytest.mark.slow
def test_gru_planned_on_2x4_equals_single_device() -> None:
    import eqsat.parallel as ep
    from experiments.parallel_user_programs import TOLERANCES, same_as_single_device

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    step, args = small_gru()
    plan = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), time_limit=10, baselines=False, within=None)
    assert plan.report.strategy == "eqsat", plan.report.warnings
    found = same_as_single_device(plan, step, args, tolerance=TOLERANCES["gru"])
    assert found["same_as_single_device"], found

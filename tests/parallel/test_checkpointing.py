"""Activation checkpointing as a planning choice (issue 26, item 5): recompute twin e-nodes priced
by memory and recompute time (`planner.with_recompute`), the liveness simulation of a recomputed
product (`memory.step_memory(recompute=...)`), and the lowering that really recomputes in the
user's step (`eqsat.parallel.remat`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqsat.parallel import step_args
from eqsat.parallel.planner import (COST_SCALE, PlanError, RECOMPUTE_SUFFIX, plan_graph, plan_report,
                                    saturate_and_price, verified_parallel_rules, with_recompute)
from eqsat.parallel.remat import checkpointed_step, find_remat
from jax_backend.capture import graph_leaf_name
from tests.parallel.test_training_state import DP_RULES, MESH, _mlp, _model


@pytest.fixture(scope="module")
def dp_rules() -> list:
    """Data parallel's verified rules, made once for the module (verifying is most of a test)."""
    return verified_parallel_rules(MESH, DP_RULES)


@pytest.fixture
def heavy(dp_rules: list) -> tuple:
    """A 3-layer MLP whose activations (batch 4096) outweigh its weights, and the DP rules."""
    return _mlp(layers=3, batch=4096, d=128), dp_rules


def test_recompute_lowers_the_simulated_peak_and_costs_its_forward(heavy: tuple) -> None:
    graph, rules = heavy
    free = plan_graph(graph, MESH, model=_model(None), rules=rules, check=False)
    plan = free.plan.live()
    first = next(i for i, n in enumerate(plan.nodes) if n.op == "matmul")
    kept = plan_report(plan, _model(None))
    again = plan_report(plan, _model(None), [first])
    assert again.recompute == (first,)
    assert again.mem_bytes < kept.mem_bytes
    assert again.mem_row_bytes < kept.mem_row_bytes
    assert again.step_s > kept.step_s
    assert again.contractions == kept.contractions + 1
    # a node that is no product is never recomputed on its own
    other = next(i for i, n in enumerate(plan.nodes) if n.op == "combine")
    assert plan_report(plan, _model(None), [other]).recompute == ()


def test_twins_are_priced_by_the_cost_model_terms(heavy: tuple) -> None:
    graph, rules = heavy
    pe = saturate_and_price(graph, MESH, model=_model(None), rules=rules)
    grown = with_recompute(pe)
    nodes = grown.priced.json["nodes"]
    twins = [nid for nid in nodes if nid.endswith(RECOMPUTE_SUFFIX)]
    assert twins and grown.data.n_nodes == pe.data.n_nodes + len(twins)
    for nid in twins:
        base, twin = nodes[nid[: -len(RECOMPUTE_SUFFIX)]], nodes[nid]
        assert base["op"] in ("matmul", "conv2d") and twin["eclass"] == base["eclass"]
        assert twin["cost"] == pytest.approx(base["cost"] + COST_SCALE * base["rows"]["recompute_s"])
        assert twin["rows"]["mem"] == pytest.approx(base["rows"]["mem"] - base["rows"]["recompute_mem"])


def test_checkpointing_is_chosen_only_under_a_budget_that_needs_it(heavy: tuple) -> None:
    graph, rules = heavy
    free = plan_graph(graph, MESH, model=_model(None), rules=rules)
    assert free.report.recompute == ()
    budget = free.report.mem_bytes * 0.85
    tight = plan_graph(graph, MESH, model=_model(None), rules=rules, mem_budget=budget)
    assert tight.numerics_ok and tight.report.mem_bytes <= budget
    assert tight.report.recompute and tight.report.step_s > free.report.step_s
    with pytest.raises(PlanError, match="no plan within"):
        plan_graph(graph, MESH, model=_model(None), rules=rules, mem_budget=budget, recompute=False)
    roomy = plan_graph(graph, MESH, model=_model(None), rules=rules, mem_budget=free.report.mem_bytes * 1.5)
    assert roomy.report.recompute == () and roomy.report.step_s == pytest.approx(free.report.step_s)


def _mlp_step(batch: int = 512, sizes: tuple[int, ...] = (64, 256, 256, 16), einsum: bool = False) -> tuple:
    keys = iter(jax.random.split(jax.random.key(0), 8))
    params = {f"w{i}": jax.random.normal(next(keys), (a, b)) / a ** 0.5 for i, (a, b) in enumerate(zip(sizes, sizes[1:]))}
    x = jax.random.normal(next(keys), (batch, sizes[0]))

    def train_step(p: dict, x: jax.Array) -> tuple:
        def loss_fn(p: dict) -> jax.Array:
            h = x
            for i in range(len(sizes) - 1):
                h = jnp.einsum("bd,dh->bh", h, p[f"w{i}"]) if einsum else h @ p[f"w{i}"]
                if i < len(sizes) - 2:
                    h = jax.nn.relu(h)
            return jnp.mean(h ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, p, grads), loss

    return train_step, (params, x)


@pytest.mark.parametrize("einsum", [False, True])
def test_lowered_recompute_is_the_same_step_with_less_memory(einsum: bool) -> None:
    """The first layer recomputed in the traced step's backward: the same outputs bit for bit, one
    more product's flops, and less compiled temporary memory; also where the product is a call
    (`jnp.einsum` is jitted)."""
    step, args = _mlp_step(einsum=einsum)
    leaves, treedef = step_args.flat_leaves(args, (0,))
    flat = jax.tree_util.tree_leaves(args)

    def fn(*xs: jax.Array) -> tuple:
        return step(*jax.tree_util.tree_unflatten(treedef, xs))

    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*flat)
    found = step_args.forward_jaxpr(closed, {v for v, s in zip(closed.jaxpr.invars, leaves.state) if s})
    assert found is not None
    state = {graph_leaf_name(i) for i, s in enumerate(leaves.state) if s}
    w0 = graph_leaf_name(next(i for i, p in enumerate(leaves.paths) if "w0" in str(p)))
    remat = find_remat(closed, found[0], [((w0,), 0)], state)
    assert remat is not None and remat.products == 1
    assert find_remat(closed, found[0], [(("no-such-weight",), 0)], state) is None
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    again = checkpointed_step(closed, jax.tree_util.tree_structure(out_shape), remat, (), mesh)
    plain_c, again_c = jax.jit(fn).lower(*flat).compile(), jax.jit(again).lower(*flat).compile()
    for a, b in zip(jax.tree_util.tree_leaves(jax.jit(fn)(*flat)), jax.tree_util.tree_leaves(jax.jit(again)(*flat))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    batch, (d_in, d_out) = args[1].shape[0], args[0]["w0"].shape
    extra = again_c.cost_analysis()["flops"] - plain_c.cost_analysis()["flops"]
    assert extra == pytest.approx(2 * batch * d_in * d_out, rel=0.05)
    assert again_c.memory_analysis().temp_size_in_bytes < plain_c.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
def test_plan_under_a_budget_recomputes_and_equals_the_single_device_step() -> None:
    """The user API: an activation-heavy MLP classifier (Adam) on 2x4 under a budget below its
    unbudgeted plan's prediction is planned with a recomputed product and fits; the compiled step
    recomputes (more flops) and needs less memory than the same shardings without the recompute,
    and runs as the single-device step."""
    import eqsat.parallel as ep
    from eqsat.parallel.api import compile_figures
    from experiments.parallel_user_programs import LR, mlp_problem

    step, args = mlp_problem(batch=8192, sizes=(256, 512, 512, 64))
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    free = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), baselines=False, within=None)
    assert free.report.recomputed == 0
    budget = 0.9 * float(free.report.predicted_mem_bytes or 0)
    tight = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), memory_budget=budget, baselines=False, within=None)
    r = tight.report
    assert r.recomputed >= 1 and r.predicted_mem_bytes is not None and r.predicted_mem_bytes <= budget
    abstract = tuple(jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args))
    plain = compile_figures(jax.jit(step, in_shardings=tight.in_shardings, out_shardings=tight.out_shardings), abstract)
    assert r.compiled is not None and r.compiled.flops is not None and plain.flops is not None
    assert r.compiled.flops > plain.flops  # it really recomputes
    assert r.compiled.mem_bytes < plain.mem_bytes
    ref, run = jax.jit(step), tight.jit()
    a, b = args, tight.place(*args)
    for _ in range(3):
        oa, ob = ref(*a), run(*b)
        np.testing.assert_allclose(float(ob[2]), float(oa[2]), rtol=1e-4)
        for x, y in zip(jax.tree_util.tree_leaves(oa[0]), jax.tree_util.tree_leaves(ob[0])):
            np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2 * LR * 3)
        a, b = (oa[0], oa[1], args[2]), (ob[0], ob[1], b[2])

"""Steps whose layers run under `lax.scan` / `nn.scan`, and the Flax user programs `llama` (RMSNorm,
rotary embeddings, SwiGLU, `nn.scan`, AdamW after clipping) and `cnn` (convolutions, pooling, a label
mask, SGD with momentum) of experiments/parallel_user_programs.py: a scan body's slice of a stacked
weight is planned as that weight (its layer dim whole), the body's figures count once per layer, a
constraint inside a scan body lands there, and planned on 2x4 both programs give the single-device
step's losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("optax")
pytest.importorskip("flax")
needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")

LAYERS = 3


def stacked_mlp(ws: Any, x: Any) -> Any:
    """`LAYERS` tanh layers of stacked (L, d, d) weights under `lax.scan`, summed to a scalar."""
    def layer(h: Any, w: Any) -> tuple[Any, None]:
        return jnp.tanh(h @ w), None

    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.sum(h * h)


def args() -> tuple[Any, Any]:
    return (jax.random.normal(jax.random.key(0), (LAYERS, 16, 16)) / 4, jax.random.normal(jax.random.key(1), (8, 16)))


def test_scan_body_reads_map_to_the_stacked_weight_and_count_once_per_layer() -> None:
    from eqsat.parallel.step_planner import loop_origins, loop_trips
    from jax_backend.capture import GraphStep, LoopStep, capture_jaxpr

    program = capture_jaxpr(jax.make_jaxpr(stacked_mlp)(*args()))
    loop = next(s for s in program.steps if isinstance(s, LoopStep))
    origins = loop_origins(program)
    carry, weight = loop.body_inputs  # no consts: the carry (x), then one slice of the stacked weights
    assert origins[weight] == (0, 1)  # argument 0, one leading (layer) dim more than the slice
    assert origins[carry] == (1, 0)  # the carry stands for x itself
    body = next(s for s in loop.body if isinstance(s, GraphStep))
    trips = loop_trips(program)
    assert trips[id(body)] == LAYERS and sorted(trips.values()) == [1, LAYERS]  # the sum after the scan: once


def test_stacked_weights_read_in_a_scan_are_parameters_with_adam_state() -> None:
    """The weights a scan body reads slice by slice count as read parameters: Adam's state is two
    copies of them (three leaves per parameter, the step count aside), not an unread remainder."""
    import optax

    from eqsat.parallel import step_args, step_planner
    from jax_backend.capture import capture_jaxpr

    ws, x = args()
    params = {"ws": ws, "head": jnp.ones((16,))}
    opt = optax.adam(1e-3)

    def step(p: Any, s: Any, batch: Any) -> Any:
        loss, g = jax.value_and_grad(lambda q: stacked_mlp(q["ws"], batch) + jnp.sum(batch @ q["head"]))(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    state = (params, opt.init(params), x)
    flat, treedef = jax.tree_util.tree_flatten(state)
    closed = jax.make_jaxpr(lambda *xs: step(*jax.tree_util.tree_unflatten(treedef, xs)))(*flat)
    leaves, _ = step_args.flat_leaves(state, (0, 1))
    found = step_args.forward_jaxpr(closed, {v for v, st in zip(closed.jaxpr.invars, leaves.state) if st})
    assert found is not None
    copies = step_planner.optimizer_state_copies(capture_jaxpr(found[0]), leaves)
    assert 2.0 <= copies < 2.01, copies


def test_a_constraint_inside_a_scan_body_lands_there() -> None:
    """`Program.where` of a body value goes through the scan equation; `constrained_step` reruns the
    scan with the constraint in its body: same result, and the constraint is in the lowered loop."""
    from eqsat.parallel.api import auto_mesh
    from eqsat.parallel.constraints import constrained_step
    from jax_backend.capture import GraphStep, LoopStep, capture_jaxpr

    ws, x = args()
    closed, out = jax.make_jaxpr(stacked_mlp, return_shape=True)(ws, x)
    program = capture_jaxpr(closed)
    loop = next(s for s in program.steps if isinstance(s, LoopStep))
    body = next(s for s in loop.body if isinstance(s, GraphStep))
    product = next(vid for vid, node, _ in body.sources if body.graph.nodes[node].op == "matmul")
    path = program.where[product]
    assert path[0] is loop.eqn and len(path) == 2  # (the scan, its body's variable)
    mesh = auto_mesh(jax.make_mesh((len(jax.devices()),), ("data",)))
    step = constrained_step(closed, jax.tree_util.tree_structure(out), [(path, ("data",))], mesh)
    np.testing.assert_allclose(float(jax.jit(step)(ws, x)), float(jax.jit(stacked_mlp)(ws, x)), rtol=1e-6)
    text = jax.jit(step).lower(ws, x).as_text()
    assert any("sharding_constraint" in ln or "@Sharding" in ln for ln in text.splitlines())
    assert not any("sharding_constraint" in ln or "@Sharding" in ln for ln in jax.jit(stacked_mlp).lower(ws, x).as_text().splitlines())


def small_llama() -> tuple[Any, tuple[Any, ...]]:
    from experiments.parallel_user_programs import llama_problem

    return llama_problem(batch=8, seq=8, d=32, heads=2, hidden=64, vocab=64, layers=2)


def small_cnn() -> tuple[Any, tuple[Any, ...]]:
    from experiments.parallel_user_programs import cnn_problem

    return cnn_problem(batch=16, size=8, features=(8, 16), classes=8)


@pytest.mark.slow
def test_llama_and_cnn_programs_train_and_capture() -> None:
    """Their pieces: Llama's layer weights stacked by `nn.scan` (L, ...) with the scan and the
    rotary concat in the jaxpr; the CNN's convolutions; both lower the loss and capture with a
    product in a graph (the Llama's inside its scan body)."""
    from jax_backend.capture import LoopStep, capture

    for make, primitive in ((small_llama, "scan"), (small_cnn, "conv_general_dilated")):
        step, (params, opt_state, batch) = make()
        assert primitive in str(jax.make_jaxpr(step)(params, opt_state, batch))
        jitted = jax.jit(step)
        p, s, loss = jitted(params, opt_state, batch)
        _, _, loss2 = jitted(p, s, batch)
        assert np.isfinite(float(loss)) and float(loss2) < float(loss)
        flat, treedef = jax.tree_util.tree_flatten((params, opt_state, batch))
        program, _ = capture(lambda *xs, f=step, t=treedef: f(*jax.tree_util.tree_unflatten(t, xs)), *flat)
        assert any(n.op in ("matmul", "conv2d") for g in program.graphs for n in g.graph.nodes)
        if primitive == "scan":
            assert params["layers"]["wq"]["kernel"].shape == (2, 32, 32)
            assert any(isinstance(s, LoopStep) for s in program.steps)


def test_bench_knows_the_new_programs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from experiments import bench_parallel, parallel_user_programs

    monkeypatch.setattr(parallel_user_programs, "run", lambda program, mesh, time_limit=60.0: {"program": program, "mesh": mesh})
    rows = bench_parallel.run_user_programs(tmp_path, ["llama", "cnn"], ["2x4"])
    assert [r["program"] for r in rows] == ["llama", "cnn"]


@needs8
@pytest.mark.slow
def test_llama_planned_on_2x4_plans_its_stacked_weights_and_equals_single_device() -> None:
    """The planner's own plan (unbounded): each stacked layer weight that it splits keeps its layer
    dim whole (at this size it may split none: replicated layers are predicted fastest), and 3
    steps equal the single-device step's."""
    import eqsat.parallel as ep
    from experiments.parallel_user_programs import same_as_single_device

    step, args = small_llama()
    plan = ep.plan(step, *args, mesh=jax.make_mesh((2, 4), ("data", "model")), params_argnums=(0, 1),
                   time_limit=30, baselines=False, within=None)
    assert plan.report.strategy == "eqsat", plan.report.warnings
    layer_specs = [s.spec for s in jax.tree_util.tree_leaves(plan.in_shardings[0]["layers"])]
    assert all(len(spec) == 0 or spec[0] is None for spec in layer_specs), layer_specs
    found = same_as_single_device(plan, step, args)
    assert found["same_as_single_device"] and found["loss_rel_diff"] <= 1e-4, found


@needs8
@pytest.mark.slow
def test_cnn_planned_on_2x4_equals_single_device_within_data_parallel() -> None:
    """Bounded by data parallel (the default): never more compiled wire bytes or memory than data
    parallel's, and 3 steps equal the single-device step's."""
    import eqsat.parallel as ep
    from experiments.parallel_user_programs import same_as_single_device

    step, args = small_cnn()
    plan = ep.plan(step, *args, mesh=jax.make_mesh((2, 4), ("data", "model")), params_argnums=(0, 1), time_limit=30)
    dp = next(b for b in plan.report.baselines if b.name == "data-parallel")
    assert plan.report.compiled is not None and dp.compiled is not None
    assert plan.report.compiled.wire_bytes <= dp.compiled.wire_bytes  # wire bytes, as judged
    assert plan.report.compiled.mem_bytes <= dp.compiled.mem_bytes
    found = same_as_single_device(plan, step, args)
    assert found["same_as_single_device"] and found["loss_rel_diff"] <= 1e-4, found


@needs8
@pytest.mark.slow
def test_a_scanned_layer_stacks_gradient_sync_is_predicted_as_compiled() -> None:
    """Data parallel over 3 scanned layers (a batch big enough that the planner splits it): the
    planner's plan is returned (it compiles to data parallel's bytes and memory), and its gradient
    sync, run once per layer (`runs`), is what the compiled step moves, collectives in the loop
    counted once per trip. The body's outputs (its carry and residual) are left split, as GSPMD
    leaves them (`planner.with_open_outputs`), so the sync is the whole prediction (docs/parallel.md)."""
    import eqsat.parallel as ep

    ws = jax.random.normal(jax.random.key(0), (LAYERS, 64, 64)) / 8
    x = jax.random.normal(jax.random.key(1), (1024, 64))

    def step(ws: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(stacked_mlp)(ws, x)
        return ws - 0.1 * g, loss

    plan = ep.plan(step, ws, x, mesh=jax.make_mesh((8,), ("data",)), params_argnums=(0,), time_limit=20)
    r = plan.report
    dp = next(b.compiled for b in r.baselines if b.name == "data-parallel")
    assert r.strategy == "eqsat", r.strategy
    assert r.compiled is not None and dp is not None
    assert r.compiled.wire_bytes <= dp.wire_bytes and r.compiled.mem_bytes <= dp.mem_bytes
    sync = [c for c in r.collectives if c["phase"] == "grad-sync"]
    assert sync and all(c["runs"] == LAYERS for c in sync)
    predicted_sync = sum(c["bytes"] * c["runs"] for c in sync)
    assert predicted_sync == LAYERS * 64 * 64 * 4
    assert sum(c["bytes"] * c["runs"] for c in r.collectives) == predicted_sync  # no gather of the carry
    assert 0 <= r.compiled.comm_bytes - predicted_sync <= 64  # and the loss's all-reduce
    _, loss = plan.jit()(ws, x)
    np.testing.assert_allclose(float(loss), float(jax.jit(step)(ws, x)[1]), rtol=1e-5)

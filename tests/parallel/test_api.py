"""`eqsat.parallel.plan` on a user's own training step: an MLP classifier with optax Adam, written as
a user writes it. The sharded step must give the single-device step's losses and parameters; bad
input is refused in one line; a step with nothing to plan falls back to data parallel with a warning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat.parallel as ep
from eqsat.errors import EqsatError
from eqsat.ir import GraphBuilder
from eqsat.parallel import api
from eqsat.parallel import step_args, step_planner
from eqsat.parallel import constraints as step_constraints
from eqsat.parallel import specs

optax = pytest.importorskip("optax")
needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
LR = 1e-3
STEPS = 3


def init_mlp(key: Any, sizes: tuple[int, ...] = (32, 128, 128, 16)) -> dict[str, Any]:
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, k = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(k, (a, b)) / a ** 0.5
        params[f"b{i}"] = jnp.zeros((b,))
    return params


def mlp(params: dict[str, Any], x: Any) -> Any:
    n = len(params) // 2
    for i in range(n):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


OPT = optax.adam(LR)


def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
    x, y = batch

    def loss_fn(p: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(mlp(p, x), y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def problem() -> tuple[Any, Any, Any]:
    params = init_mlp(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (64, 32))
    y = jax.random.randint(jax.random.key(2), (64,), 0, 16)
    return params, OPT.init(params), (x, y)


def mesh_of(shape: tuple[int, ...]) -> Any:
    return jax.make_mesh(shape, ("data", "model")[: len(shape)])


def check_steps(plan: Any, params: Any, opt_state: Any, batch: Any, reference: Callable[..., Any] | None = None) -> None:
    """3 steps of the plan's jitted step against single-device `jax.jit(reference)` (this file's
    `train_step` by default); both steps take Adam at `LR`."""
    assert jax.tree_util.tree_structure(plan.in_shardings) == jax.tree_util.tree_structure((params, opt_state, batch))
    step = plan.jit(donate_argnums=(0, 1))
    ref = jax.jit(reference or train_step)
    mine = jax.tree_util.tree_map(jnp.copy, (params, opt_state))
    theirs = (params, opt_state)
    for _ in range(STEPS):
        p, s, loss = step(mine[0], mine[1], batch)
        mine = (p, s)
        rp, rs, rloss = ref(theirs[0], theirs[1], batch)
        theirs = (rp, rs)
        np.testing.assert_allclose(float(loss), float(rloss), rtol=1e-4)
    for a, b in zip(jax.tree_util.tree_leaves(mine[0]), jax.tree_util.tree_leaves(theirs[0])):
        assert float(jnp.max(jnp.abs(a - b))) <= 2 * LR * STEPS
    for leaf, sharding in zip(jax.tree_util.tree_leaves(mine[0]), jax.tree_util.tree_leaves(plan.in_shardings[0])):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)  # new params placed as the old: donation works


# --- reading a plan graph -------------------------------------------------------------------------

def test_leaf_splits_follow_partitions_through_broadcast_and_transpose() -> None:
    """A weight split on its columns over axis 1, read through a transpose, and a data leaf split
    twice on its rows (axes 0 then 1: one PartitionSpec entry ('data', 'model'))."""
    b = GraphBuilder()
    x = b.input("x", (8, 4))
    w = b.weight("w", (4, 6))
    bias = b.weight("bias", (6,))
    xs = b.apply("partition", [x], {"dim": -2, "axis": 0, "parts": 2})[0]
    xs = b.apply("partition", [xs], {"dim": -2, "axis": 1, "parts": 2})[0]
    wt = b.transpose(w, (1, 0))
    wts = b.apply("partition", [wt], {"dim": -2, "axis": 1, "parts": 2})[0]
    bb = b.apply("broadcast", [bias], {"shape": (8, 6), "dims": (1,)})[0]
    g = b.build([xs, wts, bb])
    splits = specs.leaf_splits(g)
    assert splits["x"] == [{0: [0, 1]}]
    assert splits["w"] == [{1: [1]}]
    assert splits["bias"] == [{}]
    sizes = {"data": 2, "model": 2}
    assert specs.partition_spec(splits["x"][0], (8, 4), ("data", "model"), sizes) == (("data", "model"),)
    assert specs.partition_spec(splits["w"][0], (4, 6), ("data", "model"), sizes) == (None, "model")
    assert specs.partition_spec({0: [0]}, (7, 4), ("data", "model"), sizes) == ()  # 7 rows do not split in 2


def test_optimizer_state_mirrors_its_parameter_and_labels_follow_the_batch() -> None:
    params, opt_state, batch = problem()
    leaves, _ = step_args.flat_leaves((params, opt_state, batch), (0, 1))
    specs: list[Any] = [None] * len(leaves.paths)
    w1 = next(i for i, p in enumerate(leaves.paths) if p[0] == 0 and str(p[-1]) == "['w1']")
    x = next(i for i, p in enumerate(leaves.paths) if p[0] == 2 and leaves.shapes[i] == (64, 32))
    specs[w1] = (None, "model")
    specs[x] = ("data",)
    filled = step_args.mirror(leaves, specs)
    for i, path in enumerate(leaves.paths):
        if path[0] == 1 and str(path[-1]) == "['w1']":
            assert filled[i] == (None, "model"), path  # Adam's mu and nu of w1
        elif path[0] == 1:
            assert filled[i] == (), path
    y = next(i for i, p in enumerate(leaves.paths) if p[0] == 2 and leaves.shapes[i] == (64,))
    assert filled[y] == ("data",)


# --- bad input ------------------------------------------------------------------------------------

@needs8
def test_bad_input_is_one_line() -> None:
    params, opt_state, batch = problem()
    with pytest.raises(EqsatError, match="mesh has 4 devices but JAX has 8"):
        ep.plan(train_step, params, opt_state, batch, mesh=jax.make_mesh((4,), ("data",), devices=jax.devices()[:4]),
                params_argnums=(0, 1))
    with pytest.raises(EqsatError, match="names argument 5, but the step takes 3"):
        ep.plan(train_step, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 5))
    with pytest.raises(EqsatError, match="not a pytree of arrays"):
        ep.plan(lambda p, s, b: p, params, "adam", batch, mesh=mesh_of((8,)), params_argnums=(0, 1))
    with pytest.raises(EqsatError, match="memory_budget must be"):
        ep.plan(train_step, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 1), memory_budget=-1)
    with pytest.raises(EqsatError, match="mesh must be a jax.sharding.Mesh"):
        ep.plan(train_step, params, opt_state, batch, mesh=(2, 4), params_argnums=(0, 1))
    with pytest.raises(EqsatError, match="measure_s must be a number of seconds > 0"):
        ep.plan(train_step, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 1), measure_s=0)
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, opt_state, batch))
    with pytest.raises(EqsatError, match="measure_s runs the step, so it needs arrays, not ShapeDtypeStruct"):
        ep.plan(train_step, *shapes, mesh=mesh_of((8,)), params_argnums=(0, 1), measure_s=2.0)


@needs8
def test_nothing_to_plan_falls_back_to_data_parallel_with_a_warning() -> None:
    """A step whose loss has no product: data parallel, said in one warning; still exact."""
    def step(w: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x * w) ** 2))(w)
        return w - LR * g, loss

    mesh = mesh_of((2, 4))  # Explicit axes (jax.make_mesh's default); the arrays committed to it
    w = jax.device_put(jnp.ones((16,)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("model")))
    x = jax.device_put(jax.random.normal(jax.random.key(0), (64, 16)),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    with pytest.warns(UserWarning, match="data parallel because the loss captures to no matmul"):
        plan = ep.plan(step, w, x, mesh=mesh, params_argnums=(0,), baselines=False)
    assert "Auto" in plan.report.mesh_note and "Explicit" in plan.report.mesh_note
    assert plan.report.strategy == "data-parallel (fallback)"
    assert plan.in_shardings[1].spec == jax.sharding.PartitionSpec(("data", "model"))
    assert plan.in_shardings[0].spec == jax.sharding.PartitionSpec()
    jitted = plan.jit()
    new_w, loss = jitted(w, x)
    ref_w, ref_loss = jax.jit(step)(w, x)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(new_w), np.asarray(ref_w), rtol=1e-5)


@needs8
def test_no_loss_output_falls_back() -> None:
    def step(w: Any, x: Any) -> Any:
        return w - LR * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    with pytest.warns(UserWarning, match="returns no float scalar"):
        plan = ep.plan(step, jnp.ones((16, 8)), jnp.ones((64, 16)), mesh=mesh_of((8,)), params_argnums=(0,),
                       baselines=False)
    assert plan.report.strategy == "data-parallel (fallback)"
    assert [path for path, _ in plan.report.leaf_specs] == ["w", "x"]  # the step's parameter names


# --- the planned step -----------------------------------------------------------------------------

@needs8
@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8,), (2, 4)])
def test_mlp_adam_step_equals_single_device(shape: tuple[int, ...]) -> None:
    """The e-graph plan of a user's MLP + Adam step is returned and takes the same losses and
    parameters over 3 steps. The MLP is the bench's (batch 256, 256-1024-1024-64), where splitting
    pays: this file's small one (batch 64, width 128) is best replicated by the time model, and such a
    plan holds the whole batch on every device, so the compiled check rightly returns data parallel."""
    from experiments.parallel_user_programs import LR as BENCH_LR
    from experiments.parallel_user_programs import mlp_problem

    assert BENCH_LR == LR
    step_fn, (params, opt_state, batch) = mlp_problem()
    plan = ep.plan(step_fn, params, opt_state, batch, mesh=mesh_of(shape), params_argnums=(0, 1),
                   time_limit=30, baselines=shape == (2, 4))
    assert plan.report.strategy == "eqsat", plan.report.warnings
    assert "Auto" in plan.report.mesh_note
    assert plan.report.compiled is not None
    check_steps(plan, params, opt_state, batch, reference=step_fn)
    if shape == (2, 4):
        names = [b.name for b in plan.report.baselines]
        assert names == ["data-parallel", "fsdp", "megatron", "dp-x-tp"]
        dp = plan.report.baselines[0]
        assert dp.compiled is not None and plan.report.compiled.mem_bytes <= dp.compiled.mem_bytes
        assert "eqsat plan" in plan.explain()


@needs8
def test_a_plan_judged_by_running_is_kept_when_its_step_is_faster() -> None:
    """The bench's MLP on 8 devices: the plan's step runs about 5x data parallel's here (batch and
    hidden split where data parallel replicates the 1024x1024 products' weights and all-reduces
    their gradients), so the one keep/discard decision keeps it."""
    from experiments.parallel_user_programs import mlp_problem

    step_fn, (params, opt_state, batch) = mlp_problem()

    def scaled_step(params: Any, opt_state: Any, batch: Any, scale: float) -> Any:  # a Python float argument too
        new_params, new_state, loss = step_fn(params, opt_state, batch)
        return new_params, new_state, loss * scale

    step = ep.parallelize(scaled_step, mesh=mesh_of((8,)), params_argnums=(0, 1), time_limit=30, baselines=False)
    _, _, loss = step(params, opt_state, batch, 2.0)  # parallelize measures by default
    _, _, ref_loss = jax.jit(scaled_step)(params, opt_state, batch, 2.0)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    (plan,) = step.plans.values()
    m = plan.report.measured
    assert m is not None and m.verdict == "faster" and m.speedup_low > m.threshold
    assert plan.report.strategy == "eqsat"
    assert "measured on the mesh's devices" in plan.explain() and plan.report.to_json()["measured"]["verdict"] == "faster"


@needs8
def test_a_plan_measured_slower_returns_the_baseline_it_was_run_against(monkeypatch: Any) -> None:
    """When the decision says the plan's step is slower, `within`'s shardings are returned (data
    parallel: parameters and Adam state replicated, the batch split), the strategy says why, and
    the step is still the user's."""
    from experiments.parallel_user_programs import mlp_problem
    from jax_backend.timing import Choice, Decision

    slower = Decision("slower", 0.5, 0.4, 0.6, 1.01, 8, 1.0, 2.0, 0.99, 0.1, 1)
    ran: list[int] = []

    def decided(base: Any, candidates: Any, args: Any, **_: Any) -> Choice:
        ran.append(len(candidates))
        jax.block_until_ready((base(), candidates[0]()))  # both steps run on their shardings
        return Choice(0, slower, (slower.as_paired(),))

    monkeypatch.setattr(api, "choose_faster", decided)
    step_fn, (params, opt_state, batch) = mlp_problem()
    plan = ep.plan(step_fn, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 1), time_limit=30,
                   baselines=False, measure_s=1.0)
    assert ran == [1] and plan.report.measured == slower
    assert plan.report.strategy.startswith("data-parallel (measured: the plan's step ran 0.50x as fast [0.40, 0.60], slower)")
    specs = dict(plan.report.leaf_specs)
    assert all(v == "P()" for k, v in specs.items() if not k.startswith("batch")), specs
    assert all("data" in v for k, v in specs.items() if k.startswith("batch")), specs
    check_steps(plan, params, opt_state, batch, reference=step_fn)


@needs8
def test_a_step_that_fails_when_measured_is_one_line(monkeypatch: Any) -> None:
    """A step that fails on the devices while measured (out of memory, a runtime check) is one
    `EqsatError` line that says how to plan without running, not a traceback from inside JAX."""
    from experiments.parallel_user_programs import mlp_problem

    def out_of_memory(*_: Any, **__: Any) -> Any:
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4096 bytes.\nmore")

    monkeypatch.setattr(api, "choose_faster", out_of_memory)
    step_fn, (params, opt_state, batch) = mlp_problem()
    with pytest.raises(EqsatError) as err:
        ep.plan(step_fn, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 1), time_limit=30,
                baselines=False, measure_s=1.0)
    assert len(str(err.value).splitlines()) == 1
    assert "RESOURCE_EXHAUSTED" in str(err.value) and "measure_s=None" in str(err.value)


@needs8
@pytest.mark.slow
def test_parallelize_plans_once_per_signature_and_budget_too_small_is_refused() -> None:
    params, opt_state, batch = problem()
    step = ep.parallelize(train_step, mesh=mesh_of((8,)), params_argnums=(0, 1), time_limit=20, baselines=False)
    p, s, loss = step(params, opt_state, batch)
    p, s, loss2 = step(p, s, batch)
    assert len(step.plans) == 1 and float(loss2) < float(loss)
    with pytest.raises(EqsatError, match="no plan of the step's planned part meets the budget"):
        ep.plan(train_step, params, opt_state, batch, mesh=mesh_of((8,)), params_argnums=(0, 1), memory_budget=1.0,
                time_limit=20, baselines=False)


def test_capture_takes_a_whole_adam_step() -> None:
    """The whole step (backward and optax update too) captures: a level whose instructions are all
    dead makes no graph (it used to fail with "a graph needs at least one output")."""
    from jax_backend.capture import capture

    args = problem()
    flat, treedef = jax.tree_util.tree_flatten(args)
    program, _ = capture(lambda *xs: train_step(*jax.tree_util.tree_unflatten(treedef, xs)), *flat)
    assert program.graphs and all(s.graph.outputs for s in program.graphs)


@needs8
@pytest.mark.slow
def test_gpt_style_decoder_step_equals_single_device() -> None:
    """A GPT-2-style decoder as a user writes it (pre-LN, fused QKV + split, causal mask, GELU,
    embedding gather; experiments/parallel_user_programs.py) on 2x4: the same 3 steps. Unbounded
    (`within=None`), so the plan itself runs, its layouts held inside the graphs too (bounded by
    data parallel, this plan compiles to more bytes than data parallel and is replaced by it)."""
    from experiments.parallel_user_programs import gpt_problem, same_as_single_device

    step, args = gpt_problem(batch=8, seq=16, d=64, heads=4, vocab=128, layers=1)
    plan = ep.plan(step, *args, mesh=mesh_of((2, 4)), params_argnums=(0, 1), time_limit=30, baselines=False,
                   within=None)
    assert plan.report.strategy == "eqsat", plan.report.warnings
    assert plan.report.inner_constraints
    assert jax.tree_util.tree_structure(plan.in_shardings) == jax.tree_util.tree_structure(args)
    assert same_as_single_device(plan, step, args)["same_as_single_device"]


@needs8
def test_constrained_step_is_the_step_with_its_boundary_held() -> None:
    """`constrained_step` replays the traced step with a `with_sharding_constraint` on a value an
    opaque equation makes: same result, and the constraint is in the lowered program."""
    def f(x: Any, w: Any) -> Any:
        return jnp.sum(jnp.sin(x) @ w)

    x, w = jax.random.normal(jax.random.key(0), (16, 8)), jax.random.normal(jax.random.key(1), (8, 4))
    closed, out = jax.make_jaxpr(f, return_shape=True)(x, w)
    sin = next(e for e in closed.jaxpr.eqns if str(e.primitive) == "sin")
    mesh = api.auto_mesh(mesh_of((8,)))
    g = step_constraints.constrained_step(closed, jax.tree_util.tree_structure(out), [(sin.outvars[0], ("data",))], mesh)
    np.testing.assert_allclose(float(jax.jit(g)(x, w)), float(jax.jit(f)(x, w)), rtol=1e-5)
    def constraints(fn: Any) -> list[str]:  # Shardy's sharding_constraint, or GSPMD's @Sharding custom call
        text = jax.jit(fn).lower(x, w).as_text()
        return [ln for ln in text.splitlines() if "sharding_constraint" in ln or "@Sharding" in ln]

    found = constraints(g)
    assert len(found) == 1 and ('"data"' in found[0] or "devices=[8" in found[0]), found
    assert constraints(f) == []


def test_the_loss_is_no_new_state_even_when_a_parameter_is_a_scalar() -> None:
    """A scalar parameter's new value is a float scalar computed from the state too; the forward is
    cut at the loss (the output that is no new state), not there."""
    def step(params: Any, x: Any) -> Any:
        loss, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"]) * p["t"]))(params)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, params, g), loss

    params, x = {"t": jnp.float32(1.0), "w": jnp.ones((8, 4))}, jnp.ones((16, 8))
    closed, out = jax.make_jaxpr(step, return_shape=True)(params, x)
    state = {v for v in closed.jaxpr.invars[:2]}
    not_loss = step_args.state_outputs(out, (params, x), (0,))
    assert not_loss == {0, 1}
    forward, index = step_args.forward_jaxpr(closed, state, not_loss)
    assert index == 2
    assert step_args.forward_jaxpr(closed, state)[1] == 0  # without it, the new `t` would pass for the loss
    assert len(forward.jaxpr.eqns) < len(closed.jaxpr.eqns)


# --- the CLI for Graph JSON users ----------------------------------------------------------------

def _mlp_graph_file(tmp_path: Any) -> str:
    b = GraphBuilder()
    x = b.input("x", (32, 16))
    h = b.matmul(x, b.input("w1", (16, 64)), act=1)
    g = b.build([b.matmul(h, b.input("w2", (64, 8)))])
    path = tmp_path / "mine.json"
    g.save(path)
    return str(path)


def test_a_graph_plan_no_faster_than_data_parallel_when_run_is_not_kept(tmp_path: Any) -> None:
    """`eqsat parallel`'s judge: a plan timed against itself is never faster with confidence (so a
    plan that only ties data parallel is not kept), and the row's `kept` follows the decision."""
    from eqsat.commands import parallel as parallel_command
    from eqsat.ir import Graph
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_graph, with_weights
    from jax_backend.parallel_calibrate import judge_plan

    graph = with_weights(Graph.load(_mlp_graph_file(tmp_path)), ["w1", "w2"])
    mesh = parse_mesh("2")
    dp = plan_graph(graph, mesh, "data-parallel", time_limit=5)
    joint = plan_graph(graph, mesh, "joint", time_limit=5)
    itself = judge_plan(graph, dp.plan, dp.plan, mesh, 2.0)
    assert not itself.keep and itself.speedup_low < itself.threshold
    row = parallel_command._judged_by_running(graph, mesh, joint, dp, 2.0)
    if row["measured"] is None:
        assert row["kept"] == "joint" and joint.plan.to_json() == dp.plan.to_json()
    else:
        assert row["kept"] == ("joint" if row["measured"]["verdict"] == "faster" else "data-parallel")
        low, high = row["measured_speedup_ci"]
        assert low <= row["measured_speedup_vs_data_parallel"] <= high


def test_cli_graph_file_bad_input_is_exit_2(tmp_path: Any, capsys: Any) -> None:
    from eqsat import cli

    path = _mlp_graph_file(tmp_path)
    assert cli.main(["parallel", "--graph", path, "--weights", "w1,nope", "--mesh", "2", "--no-measure"]) == 2
    assert "no leaf named nope" in capsys.readouterr().err
    assert cli.main(["parallel", "--weights", "w1", "--mesh", "2", "--no-measure"]) == 2
    assert cli.main(["parallel", "mlp16", "--graph", path, "--mesh", "2", "--no-measure"]) == 2
    assert cli.main(["parallel", "--mesh", "2", "--no-measure"]) == 2
    capsys.readouterr()
    assert cli.main(["parallel", "--graph", path, "--mesh", "2", "--measure-s", "0"]) == 2
    assert "--measure-s must be a number of seconds > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_plans_a_graph_file_with_its_weights(tmp_path: Any, capsys: Any) -> None:
    """`eqsat parallel --graph FILE --weights ...` plans a user's graph (checked in numpy); there is
    no Megatron-by-hand baseline for it."""
    import json

    from eqsat import cli

    path = _mlp_graph_file(tmp_path)
    assert cli.main(["parallel", "--graph", path, "--weights", "w1,w2", "--mesh", "2", "--no-measure", "--json",
                     "--time-limit", "5"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["model"] == "mine" and row["numerics_ok"]
    assert "megatron_s" not in row and "data_parallel_s" in row


def test_with_weights_marks_the_named_leaves() -> None:
    from eqsat.parallel.planner import PlanError, with_weights

    b = GraphBuilder()
    g = b.build([b.matmul(b.weight("x", (4, 4)), b.input("w", (4, 4)))])
    ops_of = {n.attr["name"]: n.op for _, n in with_weights(g, ["w"]).leaves()}
    assert ops_of == {"x": "input", "w": "weight"}
    with pytest.raises(PlanError, match="no leaf named v"):
        with_weights(g, ["v"])


def test_adam_state_is_two_copies_of_the_parameters() -> None:
    """What the planner charges per weight for the optimizer (ZeRO / FSDP shards it with the
    weight): Adam's mu and nu, and its step count, over the parameters the forward reads."""
    params, opt_state, batch = problem()
    args = (params, opt_state, batch)
    leaves, treedef = step_args.flat_leaves(args, (0, 1))
    closed = jax.make_jaxpr(lambda *xs: train_step(*jax.tree_util.tree_unflatten(treedef, xs)))(
        *jax.tree_util.tree_leaves(args))
    state_vars = {v for v, s in zip(closed.jaxpr.invars, leaves.state) if s}
    found = step_args.forward_jaxpr(closed, state_vars, step_args.state_outputs(
        jax.eval_shape(train_step, *args), args, (0, 1)))
    assert found is not None
    from jax_backend.capture import capture_jaxpr

    copies = step_planner.optimizer_state_copies(capture_jaxpr(found[0]), leaves)
    n_params = sum(int(np.prod(np.shape(p))) for p in jax.tree_util.tree_leaves(params))
    assert copies == pytest.approx(2 + 1 / n_params)

"""A batch split through a Llama layer as captured (issue 26): RMSNorm's scale broadcast over
(B, T), rotary's (T, dh) tables broadcast over (B, H), SwiGLU's sigmoid, scalars' broadcasts (their
rank pinned to 0, so the concrete verifier samples a scalar), rank-2 `ewsub` / `ewmax`, and the
attention's products batched over (B, H) (`batch-matmul4`: the batch a batch dim of both operands).
Each instance is proved for every shape and trusted by the planner's policy at N = 2 and 4; wrong
variants are refuted. And outputs left split (`planner.with_open_outputs`): a small scanned MLP's
predicted bytes are what XLA compiles."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

from eqsat.parallel.rules import _items, instantiate
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted

from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

LLAMA_RULES = ("batch-scale-bcast3", "batch-rope-bcast4", "partition-sigmoid", "batch-matmul4", "batch-scalar-bcast2",
               "batch-scalar-bcast3", "batch-scalar-bcast4", "partition-ewsub2", "partition-ewmax2", "partition-ewadd2",
               "partition-relu2", "batch-bias-bcast2", "batch-max2", "partition-ewmax1", "batch-scalar-bcast1")
ACTIVATIONS = 4  # batch-matmul4 expands over the fused activation codes


@pytest.mark.parametrize("parts", [2, 4])
def test_every_llama_batch_rule_instance_is_proved_for_all_shapes(parts: int) -> None:
    rules = instantiate(0, parts, names=LLAMA_RULES)
    assert len(rules) == len(LLAMA_RULES) + ACTIVATIONS - 1
    assert_proved_for_all_shapes(rules)
    for rule, result in zip(rules, verify_rules(rules), strict=True):  # what the planner's trust policy reads
        assert is_trusted(result), (rule.name, result.status, result.guarded_status)


@pytest.mark.parametrize("text", [
    # a relu fused into the split product that the product did not have
    "(partition -4 0 2 (matmul 0 ?x ?w)) => (matmul 2 (partition -4 0 2 ?x) (partition -4 0 2 ?w))"
    " if (= (rank ?x) 4) (= (rank ?w) 4)",
    # the operands swapped (typed where both are square and alike)
    "(partition -4 0 2 (matmul 0 ?x ?w)) => (matmul 0 (partition -4 0 2 ?w) (partition -4 0 2 ?x))"
    " if (= (rank ?x) 4) (= (rank ?w) 4)",
    # RMSNorm's scale broadcast along T instead of d (typed where T = d)
    "(partition -3 0 2 (broadcast ?S [2] ?b)) => (broadcast (items 4 (partition -3 0 2 (broadcast ?S [2] ?b)))"
    " [0 2] (replicate 0 2 ?b)) if (= (rank ?S) 3)",
    # rotary's table with its two dims read transposed (typed where T = dh)
    "(partition -4 0 2 (broadcast ?S [1 3] ?m)) => (broadcast (items 5 (partition -4 0 2 (broadcast ?S [1 3] ?m)))"
    " [0 2 4] (replicate 0 2 (transpose [1 0] ?m))) if (= (rank ?S) 4)",
    # a difference's operands swapped
    "(partition -2 0 2 (ewsub ?x ?y)) => (ewsub (partition -2 0 2 ?y) (partition -2 0 2 ?x))",
])
def test_wrong_llama_batch_rules_are_refuted(text: str) -> None:
    rule = parse_rule_text(_items(text))[0]
    assert_refuted(rule)


def test_rules_are_in_every_strategy() -> None:
    """The batch rules are shared: data parallel's own plan (the `within` bound) uses them."""
    from eqsat.parallel.planner import STRATEGY_RULES, _strategy_names

    for strategy in STRATEGY_RULES:
        names = _strategy_names(strategy)
        assert names is None or set(LLAMA_RULES) <= set(names), strategy


LAYERS = 3


def _scanned_step() -> tuple[Any, Any, Any]:
    def loss(ws: Any, x: Any) -> Any:
        def layer(h: Any, w: Any) -> tuple[Any, None]:
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(layer, x, ws)
        return jnp.sum(h * h)

    def step(ws: Any, x: Any) -> Any:
        value, g = jax.value_and_grad(loss)(ws, x)
        return ws - 0.1 * g, value

    ws = jax.random.normal(jax.random.key(0), (LAYERS, 64, 64)) / 8
    x = jax.random.normal(jax.random.key(1), (1024, 64))
    return step, ws, x


def test_open_outputs_leave_a_scan_bodys_carry_and_residual_split() -> None:
    """The scan body's carry (tanh) and residual (1 - tanh², its derivative) are graph outputs: with
    `open_outputs` the planner's data-parallel plan leaves both split (they were all-gathered at every
    trip, 2 x 262,144 bytes a layer), so it moves its gradient sync alone; without it, it gathers."""
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_graph, verified_parallel_rules, with_weights
    from jax_backend.capture import capture_jaxpr
    from eqsat.parallel.step_args import forward_jaxpr

    step, ws, x = _scanned_step()
    closed = jax.make_jaxpr(step)(ws, x)
    found = forward_jaxpr(closed, {closed.jaxpr.invars[0]})
    assert found is not None
    body = next(s.graph for s in capture_jaxpr(found[0]).graphs if any(n.op == "matmul" for n in s.graph.nodes))
    graph = with_weights(body, [str(n.attr["name"]) for _, n in body.leaves() if n.shapes[0] == (64, 64)])
    mesh = parse_mesh("8")
    rules = verified_parallel_rules(mesh, ("dp-matmul", "tanh-combine", "ewmul-combine", "partition-ewsub2",
                                           "batch-scalar-bcast2", "partition-combine", "combine-partition"))
    closed_plan = plan_graph(graph, mesh, "data-parallel", time_limit=10, rules=rules)
    opened = plan_graph(graph, mesh, "data-parallel", time_limit=10, rules=rules, open_outputs=True)
    assert opened.numerics_ok, opened.max_abs_diff
    assert opened.report.comm_bytes(None) == 64 * 64 * 4  # the weight's gradient all-reduce alone
    assert len(opened.report.open) == 2
    assert closed_plan.report.comm_bytes(None) >= opened.report.comm_bytes(None) + 2 * 1024 * 64 * 4


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
@pytest.mark.slow  # verifies the whole rule library once per session (`RuleBook`), then plans and compiles
def test_a_scanned_mlps_predicted_bytes_are_what_xla_compiles() -> None:
    """The planned step's predicted bytes (each body collective once per trip) within 1.01x of the
    compiled step's (which adds the loss's 4-byte all-reduce); they were 33x before outputs could
    stay split. Data parallel's predicted bytes are as close."""
    import eqsat.parallel as ep

    step, ws, x = _scanned_step()
    plan = ep.plan(step, ws, x, mesh=jax.make_mesh((8,), ("data",)), params_argnums=(0,), time_limit=20,
                   baselines=False)
    r = plan.report
    assert r.compiled is not None
    predicted = sum(c["bytes"] * c["runs"] for c in r.collectives)
    assert predicted <= r.compiled.comm_bytes <= 1.01 * predicted, (predicted, r.compiled.comm_bytes)
    _, loss = plan.jit()(ws, x)
    assert abs(float(loss) - float(jax.jit(step)(ws, x)[1])) <= 1e-5 * abs(float(loss))

"""The parallel coverage of softmax attention, convolutions and a mixture of experts: each plan runs on
8 emulated JAX devices equal to the single-device program (outputs and gradients), the compiled
program communicates what the planner predicted, and the plans are the known ones (a batched GPT
block's softmax split over the devices, channel-split convs, expert parallelism)."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

if jax.device_count() < 8:
    pytest.skip("needs 8 JAX devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8", allow_module_level=True)

from eqsat.ir import Graph
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import PlanResult, plan_graph
from jax_backend.checks import check_on_devices
from eqsat.models.parallel_cases import cnn, gpt, moe


def _forward_kinds(result: PlanResult) -> list[str]:
    return sorted(c.kind for _, c in result.report.collectives if c.phase == "forward")


def _on_devices(graph: Graph, result: PlanResult) -> dict[str, object]:
    """The plan on the devices: numerics (outputs and gradients) and compiled bytes = predicted."""
    assert result.numerics_ok  # numpy, float64
    check = check_on_devices(graph, result.plan, result.mesh)
    assert check["outputs_ok"] and check["gradients_ok"]
    assert check["measured_collectives"] == _forward_kinds(result)
    assert check["measured_comm_bytes"] == pytest.approx(result.report.comm_bytes("forward"), rel=0.05)
    assert check["measured_step_comm_bytes"] == pytest.approx(result.report.comm_bytes(None), rel=0.05)
    return check


@pytest.mark.slow
def test_batched_gpt_block_runs_its_softmax_split_on_devices() -> None:
    """x (8, 16, 64), 8 heads, a causal (additive) mask broadcast over batch and heads: the plan
    splits the softmax over the devices, by batch (each device its batch row, all heads) or by head
    (every batch row, its head), and runs equal to the program."""
    graph = gpt(1, d=64, heads=8, seq=16, batch=8)
    assert {"reduce_max", "exp", "ewdiv", "reshape"} <= set(graph.op_counts())
    result = plan_graph(graph, parse_mesh("8"))
    softmax = [n for n in result.plan.nodes if n.op in ("reduce_max", "exp", "ewdiv")]
    # (device, B/8, H, ...) or (device, B, H/8, ...); a replicated softmax would be (device, B, H, ...)
    assert softmax and all(n.shapes[0][:3] in ((8, 1, 8), (8, 8, 1)) for n in softmax), [n.shapes for n in softmax]
    _on_devices(graph, result)


@pytest.mark.parametrize("strategy", ["joint", pytest.param("data-parallel", marks=pytest.mark.slow), "megatron"])
def test_cnn_plans_on_devices(strategy: str) -> None:
    graph = cnn(batch=8, channels=4, size=8, classes=8)
    result = plan_graph(graph, parse_mesh("8"), strategy)
    convs = [n for n in result.plan.nodes if n.op == "conv2d"]
    assert convs
    if strategy == "megatron":  # output- then input-channel split: one all-reduce per pair of convs
        assert any(len(n.shapes[0]) == 5 for n in convs) and "all-reduce" in _forward_kinds(result)
    if strategy == "data-parallel":  # the 3x3 convs on their slice of the batch, weights replicated (the
        # head may run whole: gathering its input costs less than syncing its weight's gradient)
        assert all(len(n.shapes[0]) == 5 and n.shapes[0][1] == 1 for n in convs[:3])
    _on_devices(graph, result)


def test_moe_is_expert_parallel() -> None:
    graph = moe()
    result = plan_graph(graph, parse_mesh("8"))
    experts = [n for n in result.plan.nodes if n.op == "matmul" and len(n.shapes[0]) == 4]
    assert len(experts) == 4 and all(n.shapes[0][:2] == (8, 1) for n in experts)  # one expert per device
    assert _forward_kinds(result) == ["all-reduce"]
    _on_devices(graph, result)


@pytest.mark.slow
def test_batched_gpt_stack_plans_on_devices() -> None:
    """Three batched blocks (x (8, 16, 64)) on 8 devices: the plan equals the program on the devices
    and compiles to the collectives and bytes predicted."""
    graph = gpt(3, d=64, heads=8, seq=16, batch=8)
    result = plan_graph(graph, parse_mesh("8"), time_limit=30.0)
    assert result.plan.op_counts().get("partition", 0) > 0
    _on_devices(graph, result)

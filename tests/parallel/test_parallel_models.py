"""The parallel coverage of softmax attention, convolutions and a mixture of experts: each plan runs on
8 emulated JAX devices equal to the single-device program (outputs and gradients), the compiled
program communicates what the planner predicted, and the plans are the known ones (Megatron's two
all-reduces for a softmax GPT block, channel-split convs, expert parallelism)."""

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
def test_softmax_gpt_block_is_megatron_with_heads_split_through_the_softmax() -> None:
    graph = gpt(1)  # softmax attention with a causal (additive) mask, d 256, 8 heads
    assert {"reduce_max", "exp", "ewdiv"} <= set(graph.op_counts())
    result = plan_graph(graph, parse_mesh("8"))
    assert _forward_kinds(result) == ["all-reduce", "all-reduce"]
    axes_free = {n.op for n in result.plan.nodes if n.op in ("combine", "all_gather")}
    assert not axes_free  # the softmax runs on each device's heads: nothing gathered
    _on_devices(graph, result)


@pytest.mark.parametrize("strategy", ["joint", "data-parallel", "megatron"])
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
def test_gpt12_has_two_all_reduces_per_block() -> None:
    graph = gpt(12)
    result = plan_graph(graph, parse_mesh("8"), time_limit=60.0)
    assert _forward_kinds(result) == ["all-reduce"] * 24
    _on_devices(graph, result)

"""The planner without JAX: plans equal the program (numpy, float64), the joint search finds the
known plans, never loses to its own baselines, and respects a memory budget."""

from __future__ import annotations

import pytest

from eqsat.cost import cost_model
from eqsat.extract.selection import is_valid_choice
from eqsat.ir import Node
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import PRESETS, parse_mesh
from eqsat.parallel.planner import (
    PlanError,
    plan_graph,
    plan_report,
    random_plans,
    saturate_and_price,
)
from eqsat.pipeline import numerics_match
from eqsat.models.parallel_cases import dlrm, gpt, unity_mlp


def _forward_kinds(result: object) -> list[str]:
    return sorted(c.kind for _, c in result.report.collectives if c.phase == "forward")  # type: ignore[attr-defined]


def test_unity_mlp_on_two_devices_is_megatron_with_one_all_reduce() -> None:
    graph = unity_mlp()  # at small sizes the latency term makes no parallelism the best plan
    mesh = parse_mesh("2")
    joint = plan_graph(graph, mesh)
    dp = plan_graph(graph, mesh, "data-parallel")
    assert joint.numerics_ok and dp.numerics_ok
    assert _forward_kinds(joint) == ["all-reduce"]
    assert joint.report.comm_bytes(None) * 100 < dp.report.comm_bytes(None)  # gradient sync of 2 weights avoided
    assert joint.report.step_s <= dp.report.step_s


def test_batched_gpt_block_on_eight_devices_splits_the_batch_through_attention() -> None:
    """x (8, 16, 64), 8 heads: a split runs through the captured reshapes into the attention products
    and the softmax (each device its B*H/8 slices: by batch in the merged (B*H) products, or by head
    in the products over (B, H), `bmm-unmerge`), which the data-parallel search (row splits of the
    2-D products only) cannot do, so it is faster."""
    graph = gpt(1, d=64, heads=8, seq=16, batch=8)
    mesh = parse_mesh("8")
    joint = plan_graph(graph, mesh)
    assert joint.numerics_ok
    attention = [n.shapes[0] for n in joint.plan.nodes if n.op == "matmul" and len(n.shapes[0]) >= 4]
    slices = [s[1] if len(s) == 4 else s[1] * s[2] for s in attention]  # (device, B*H/8, ..) or (device, B', H', ..)
    assert len(attention) == 2 and all(s[0] == 8 for s in attention) and slices == [8 * 8 // 8] * 2, attention
    softmax = [n for n in joint.plan.nodes if n.op == "reduce_max"]
    assert softmax and all(n.shapes[0][0] == 8 for n in softmax)  # on each device's piece
    dp, megatron = (plan_graph(graph, mesh, s, check=False).report.step_s for s in ("data-parallel", "megatron"))
    assert joint.report.step_s < dp and joint.report.step_s <= megatron * (1 + 1e-9)


@pytest.mark.slow  # ~40 s: the joint search of the default gpt-block on 2x4
def test_batched_gpt_block_on_2x4_splits_data_and_model() -> None:
    """The default gpt-block (x (8, 32, 256)) on 2x4: a projection with its rows (the batch) split
    over one axis and its weight's columns over the other: data x model."""
    graph = gpt(1)
    joint = plan_graph(graph, parse_mesh("2x4"))
    assert joint.numerics_ok
    rows, d = 8 * 32, 256

    def both(n: Node) -> bool:
        lhs, rhs = (joint.plan.nodes[v.node].shapes[v.index] for v in n.inputs)
        return len(lhs) == 4 and any(lhs[-2] * a == rows and rhs[-1] * b == rhs_full
                                     for a, b in ((2, 4), (4, 2)) for rhs_full in (d, 4 * d))

    assert any(both(n) for n in joint.plan.nodes if n.op == "matmul")


@pytest.mark.parametrize("model", ["unity-mlp", pytest.param("dlrm", marks=pytest.mark.slow)])
def test_joint_never_worse_than_baselines(model: str) -> None:
    graph = unity_mlp(32, 128, 512, 128) if model == "unity-mlp" else dlrm(tables=4, batch=32, rows=64, dim=16)
    mesh = parse_mesh("8")
    joint = plan_graph(graph, mesh)
    for strategy in ("data-parallel", "megatron", "algebra-first"):
        base = plan_graph(graph, mesh, strategy)
        assert joint.report.step_s <= base.report.step_s * (1 + 1e-9)


def test_memory_budget_is_an_ilp_constraint() -> None:
    graph = unity_mlp(32, 128, 512, 128)
    mesh = parse_mesh("8")
    model = ParallelCostModel(mesh, cost_model("roofline", mesh.device))
    replicated = plan_report(graph, model).mem_bytes
    free = plan_graph(graph, mesh, "data-parallel")
    budget = 0.4 * replicated
    assert free.report.mem_bytes > budget  # data parallelism keeps every weight (and gradient) whole
    with pytest.raises(PlanError, match="no plan within"):
        plan_graph(graph, mesh, "data-parallel", mem_budget=budget)
    joint = plan_graph(graph, mesh, mem_budget=budget)
    assert joint.report.mem_bytes <= joint.report.mem_bound_bytes <= budget and joint.numerics_ok


def test_random_plans_equal_the_program() -> None:
    graph = gpt(1, d=32, heads=4, seq=8, batch=2)
    pe = saturate_and_price(graph, parse_mesh("2x4"))
    plans = random_plans(pe, 6, seed=3)
    assert len({p.op_counts().get("partition", 0) for p in plans} | {0}) > 1  # not all the same plan
    for plan in plans:
        ok, diff = numerics_match(graph, plan)
        assert ok, diff


def test_presets_and_mesh_errors() -> None:
    assert PRESETS["h100x32"].shape == (4, 8)
    assert parse_mesh("4x2").shape == (4, 2)
    from eqsat.parallel.mesh import MeshError

    with pytest.raises(MeshError):
        parse_mesh("3x4")
    with pytest.raises(MeshError):
        parse_mesh("eight")
    nv = PRESETS["h100x8"]
    s = 1e9
    assert nv.collective_seconds("all-reduce", 0, s) == pytest.approx(5e-6 + 2 * 7 / 8 * s / 450e9)
    assert nv.collective_seconds("all-gather", 0, s) == pytest.approx(5e-6 + 7 / 8 * s / 450e9)


def test_step_memory_of_a_single_device_mlp_by_hand() -> None:
    """y = relu(x W0) W1 on one device, x 64x8, W 8x8: arguments x, W0, W1; outputs dW0, dW1; at
    the peak (the backward of W1's product) the kept h = relu(x W0), the product x W0 under the relu
    (its derivative's mask), the output's cotangent and dh are live (none fits into a weight's 8x8
    output buffer). XLA's memory_analysis() of this step: 11,280 bytes, 16 more (the output tuple)."""
    from eqsat.parallel.memory import step_memory
    from eqsat.models.parallel_cases import mlp

    graph = mlp(2, 64, 8).live()
    mem = step_memory(graph, [()] * len(graph.nodes))
    f = 4.0
    assert mem.arguments == f * (64 * 8 + 2 * 8 * 8)
    assert mem.outputs == f * (2 * 8 * 8)
    assert mem.peak == mem.arguments + mem.outputs + f * 4 * 64 * 8


def test_memory_row_bounds_the_simulated_peak() -> None:
    """The ILP's linear memory row, summed over a plan, is never below the predicted peak."""
    graph = dlrm(tables=4, batch=32, rows=64, dim=16)
    pe = saturate_and_price(graph, parse_mesh("2x4"))
    for plan in random_plans(pe, 8, seed=2):
        report = plan_report(plan, pe.model)
        assert report.mem_bytes <= report.mem_bound_bytes * (1 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8", "2x4"])
def test_forty_percent_budget_fits_dlrm(mesh: str) -> None:
    """On 2x4 the MIP finds no plan under the memory row in time; pricing memory into the costs
    does, and the plan's simulated peak is within the budget."""
    graph = dlrm()
    m = parse_mesh(mesh)
    budget = 0.4 * plan_report(graph, ParallelCostModel(m, cost_model("roofline", m.device))).mem_bytes
    res = plan_graph(graph, m, mem_budget=budget)
    assert res.report.mem_bytes <= budget and res.numerics_ok


@pytest.mark.slow  # ~3 min: gpt12 on 2x4, searched three ways
def test_joint_egraph_holds_the_stage_plans_and_every_class_has_a_shape() -> None:
    """gpt12 on 2x4: every rule at once stops at the node limit. Staged (DP x TP, algebra first,
    Megatron, then every rule) on one e-graph, each stage's plan is carried into the final e-graph
    as a start for the ILP, so the joint plan is never predicted slower than the DP x TP or
    Megatron search's own, even where a later stage stops on its limits (since the head-split
    rules, the algebra-first stage reaches the node limit here: the joint search no longer
    saturates, docs/parallel.md). This e-graph is also where egglog left congruent nodes in two
    classes (one without a shape): the serializer merges them, so pricing sees a shape for every class."""
    graph, mesh = gpt(12), parse_mesh("2x4")
    joint = saturate_and_price(graph, mesh, "joint")
    assert all(data["shape"] is not None for data in joint.priced.json["class_data"].values())
    assert len(joint.hints) == 3 and all(is_valid_choice(joint.data, h) for h in joint.hints)
    megatron = plan_graph(graph, mesh, "megatron", check=False)
    assert megatron.stop_reason == "saturated" and joint.priced.enodes > megatron.enodes
    staged = plan_graph(graph, mesh, priced=joint, check=False).report.step_s
    for strategy in ("megatron", "dp-x-tp"):
        base = megatron if strategy == "megatron" else plan_graph(graph, mesh, strategy, check=False)
        assert staged <= base.report.step_s * (1 + 1e-9), strategy

"""Training state in the search (issue 26, item 5): a weight may be kept sharded with its gradient
and optimizer state and all-gathered before use (ZeRO / FSDP, the `fsdp-gather` rule), priced by
the memory row (state held as the weight is passed) and the update time (on the device's piece).
The rule's proof is `test_parallel_rules.test_every_instance_is_accepted`'s, its run on devices
`test_rule_devices`'s."""

from __future__ import annotations

from eqsat.cost import cost_model
from eqsat.ir import Graph, GraphBuilder
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.memory import step_memory
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import graph_axes, plan_graph, plan_report, verified_parallel_rules

MESH = parse_mesh("8")
# data parallel and its FSDP form only: a small e-graph, so the test is quick
DP_RULES = ("dp-matmul", "combine-partition", "partition-combine", "relu-combine", "unfuse-relu")
RULES = (*DP_RULES, "fsdp-gather", "fsdp-gather-rows")


def _mlp(layers: int = 2, batch: int = 512, d: int = 256) -> Graph:
    b = GraphBuilder()
    h = b.input("x", (batch, d))
    for i in range(layers):
        h = b.matmul(h, b.weight(f"w{i}", (d, d)), act=2 if i < layers - 1 else 0)
    return b.build([h])


def _model(state_copies: float | None) -> ParallelCostModel:
    return ParallelCostModel(MESH, cost_model("roofline", MESH.device), state_copies=state_copies)


def _gathered_weights(plan: Graph) -> int:
    """Weights kept sharded and all-gathered before use."""
    g = plan.live()
    return sum(1 for n in g.nodes if n.op == "all_gather" and g.nodes[n.inputs[0].node].op == "partition"
               and g.nodes[g.nodes[n.inputs[0].node].inputs[0].node].op == "weight")


def test_fsdp_is_chosen_when_memory_binds() -> None:
    """Without optimizer pricing data parallel is cheapest (one all-reduce per weight against an
    all-gather and a reduce-scatter); under a budget below its peak the ILP keeps weights sharded."""
    graph = _mlp()
    rules = verified_parallel_rules(MESH, RULES)
    free = plan_graph(graph, MESH, model=_model(None), rules=rules)
    assert free.numerics_ok and _gathered_weights(free.plan) == 0
    budget = free.report.mem_bytes * 0.9
    tight = plan_graph(graph, MESH, model=_model(None), rules=rules, mem_budget=budget)
    assert tight.numerics_ok and tight.report.mem_bytes <= budget
    assert _gathered_weights(tight.plan) >= 1
    kinds = {(c.kind, c.phase) for _, c in tight.report.collectives}
    assert ("all-gather", "forward") in kinds and ("reduce-scatter", "backward") in kinds


def test_optimizer_state_and_update_are_priced_on_the_shard() -> None:
    """With Adam's state (2 copies per weight) the update and state of a sharded weight cost 1/8:
    the plan keeps the weights sharded even with no budget, and its memory counts the state."""
    graph = _mlp()
    rules = verified_parallel_rules(MESH, RULES)
    adam = plan_graph(graph, MESH, model=_model(2.0), rules=rules)
    assert adam.numerics_ok and _gathered_weights(adam.plan) == 2
    dp = plan_graph(graph, MESH, model=_model(2.0), rules=verified_parallel_rules(MESH, DP_RULES))
    assert _gathered_weights(dp.plan) == 0
    assert adam.report.step_s < dp.report.step_s
    assert adam.report.mem_bytes < dp.report.mem_bytes
    # the same data-parallel plan, priced without the optimizer: 2 weights x 2 copies of state less
    plain = plan_report(dp.plan, _model(None))
    assert dp.report.memory is not None and plain.memory is not None
    assert dp.report.memory.arguments - plain.memory.arguments == 2 * 2 * 256 * 256 * 4
    assert dp.report.compute_s > plain.compute_s


def test_state_is_sharded_with_its_weight() -> None:
    b = GraphBuilder()
    w = b.apply("partition", [b.weight("w", (64, 32))], {"dim": -2, "axis": 0, "parts": 8})[0]
    x = b.apply("replicate", [b.input("x", (16, 64))], {"axis": 0, "parts": 8})[0]
    graph = b.build([b.matmul(x, b.apply("all_gather", [w], {"dim": -2, "axis": 0})[0])])
    axes = graph_axes(graph)
    with_state = step_memory(graph, axes, 2.0).arguments - step_memory(graph, axes).arguments
    assert with_state == 2 * 64 * 32 * 4 / 8


def test_fsdp_strategy_is_data_parallel_with_sharded_weights() -> None:
    """The FSDP baseline's search (`eqsat.parallel.plan` predicts that baseline with it)."""
    from eqsat.parallel.planner import STRATEGY_RULES

    names = set(STRATEGY_RULES["fsdp"] or ())
    assert {"dp-matmul", "fsdp-gather", "fsdp-gather-rows"} <= names
    assert not names & {"col-matmul", "row-matmul", "batch-matmul"}

"""A head split through the captured attention (Megatron's, issue 26), and the DP x TP strategy.

The built-in GPT cases are captured as JAX computes them: `x @ w` between (B, T, d) <-> (B*T, d)
reshapes, heads by reshape and transpose, the attention products batched over the merged (B*H)
dims. `bmm-unmerge` states those products batched over (B, H) (so `batch-matmul` splits them by
head), `reshape-partition-last-*` / `-merge` / `-split` move a split of d or of the heads through
the reshapes, and `heads-*` through the transposes, the mask and softmax. Each instance is proved
for every shape (the symbolic prover reads a reshape that keeps the first and last dims through
the flat index of the middle); wrong variants are not. The joint search then reaches Megatron's
attention: on a small block its plan splits the products by head and is predicted no slower than
Megatron by hand, and it runs on the devices equal to the program.
"""

from __future__ import annotations

import pytest

from eqsat.models.parallel_cases import gpt
from eqsat.models.parallel_hand import megatron_by_hand
from eqsat.parallel.mesh import parse_mesh
from eqsat.cost import cost_model
from eqsat.ir import Graph
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import Mesh
from eqsat.parallel.planner import STRATEGY_RULES, PlanError, graph_axes, plan_graph, plan_report, rules_on
from eqsat.parallel.rules import instantiate, mesh_rules
from eqsat.rewrites.parser import parse_rule_text

from .on_devices import assert_plan_runs_on_devices
from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

HEAD_RULES = ("bmm-unmerge", "reshape-partition-last-2", "reshape-partition-last-3", "reshape-partition-last-4-3",
              "reshape-partition-last-3-4", "reshape-partition-merge",
              "reshape-partition-split", "heads-transpose-in", "heads-transpose-out", "heads-keys-transpose",
              "heads-mask4", "heads-max4", "heads-sum4", "heads-bcast4")


@pytest.mark.parametrize("parts", [2, 4])
def test_every_head_rule_instance_is_proved_for_all_shapes(parts: int) -> None:
    rules = instantiate(0, parts, names=HEAD_RULES)
    assert len(rules) == len(HEAD_RULES)
    assert_proved_for_all_shapes(rules)


@pytest.mark.parametrize("text", [
    # the last dims not equal: a split of (B*T)'s d' is no split of (B, T, d)'s d
    "(partition -1 0 2 (reshape ?S ?y)) => (reshape (shape (partition -1 0 2 (reshape ?S ?y))) (partition -1 0 2 ?y))"
    " if (= (rank ?S) 2) (= (rank ?y) 3)",
    # (B, T, d) -> (B, T, H, dh) with the leading dims not kept: a split of H is no split of d
    "(partition -2 0 2 (reshape ?S ?y)) => (reshape (shape (partition -2 0 2 (reshape ?S ?y))) (partition -1 0 2 ?y))"
    " if (= (rank ?S) 4) (= (rank ?y) 3)",
    # the right operand read transposed (the keys' transpose counted twice)
    "(reshape ?S (matmul 0 (reshape ?S1 ?a) (reshape ?S2 ?b))) => (matmul 0 ?a (transpose [0 1 3 2] ?b))"
    " if (= (rank ?a) 4) (= (rank ?b) 4)"
    " (= (rank ?S1) 3) (= (rank ?S2) 3) (= (rank ?S) 4) (= (dim ?a 0) (dim ?b 0)) (= (dim ?a 1) (dim ?b 1))"
    " (= (dim ?S1 1) (dim ?a 2)) (= (dim ?S1 2) (dim ?a 3)) (= (dim ?S2 1) (dim ?b 2)) (= (dim ?S2 2) (dim ?b 3))"
    " (= (dim ?S 0) (dim ?a 0)) (= (dim ?S 1) (dim ?a 1)) (= (dim ?S 2) (dim ?a 2)) (= (dim ?S 3) (dim ?b 3))",
    # the head transpose moved the wrong axes
    "(partition -3 0 2 (transpose [0 2 1 3] ?z)) => (transpose [0 1 2 4 3] (partition -2 0 2 ?z))",
    # the mask split by head, as if it had one
    "(partition -3 0 2 (broadcast ?S [2 3] ?m)) => (broadcast (shape (partition -3 0 2 (broadcast ?S [2 3] ?m)))"
    " [0 3 4] (partition -2 0 2 ?m)) if (= (rank ?S) 4)",
])
def test_wrong_head_rules_are_refuted(text: str) -> None:
    rule = parse_rule_text(text)[0]
    assert_refuted(rule)


def test_dp_x_tp_splits_the_batch_over_the_data_axes_and_megatron_over_the_last() -> None:
    mesh = parse_mesh("2x4")
    rules = rules_on(mesh_rules(mesh), STRATEGY_RULES["dp-x-tp"], mesh)
    axes: dict[str, set[int]] = {}
    for r in rules:
        axes.setdefault(r.name.split("[")[0].split("@")[0], set()).add(int(r.name.rsplit("@", 1)[1]))
    assert axes == {"dp-matmul": {0}, "dp-conv": {0}, "col-matmul": {1}, "row-matmul": {1}, "batch-matmul": {1},
                    "col-conv": {1}, "row-conv": {1}}
    both = rules_on(mesh_rules(mesh), ("dp-matmul",), mesh)  # unscoped: every axis
    assert {int(r.name.rsplit("@", 1)[1]) for r in both} == {0, 1}
    with pytest.raises(PlanError, match="scope"):
        rules_on(mesh_rules(mesh), ("dp-matmul@batch",), mesh)


def _block() -> tuple[Graph, Mesh]:  # a small batched block: x (2, 8, 64), 4 heads
    return gpt(1, d=64, heads=4, seq=8, batch=2), parse_mesh("4")


@pytest.mark.slow  # ~60-200 s on a loaded machine: rule verification (cold), saturation, the ILP, 4 devices
def test_the_megatron_search_splits_attention_by_head_no_slower_than_by_hand() -> None:
    graph, mesh = _block()
    res = plan_graph(graph, mesh, "megatron", time_limit=20.0)
    assert res.numerics_ok
    hand = plan_report(megatron_by_hand("gpt-block", graph, mesh), ParallelCostModel(mesh, cost_model("roofline", mesh.device)))
    assert res.report.step_s <= hand.step_s * (1 + 1e-9)
    plan = res.plan.live()
    axes = graph_axes(plan)
    # the attention products batched over (B, H), split by head: a 4-D product behind the device axis
    heads = [n for n, a in zip(plan.nodes, axes) if n.op == "matmul" and len(n.shapes[0]) == 5 and a]
    assert len(heads) == 2, [n.shapes for n in plan.nodes if n.op == "matmul"]
    assert_plan_runs_on_devices(graph, res.plan, mesh)


@pytest.mark.parametrize("text", [
    # (B*T, d, E) -> (B, T, d, E) read with the experts not last: a split of E is no split of d
    "(partition -1 0 2 (reshape ?S ?y)) => (reshape (shape (partition -1 0 2 (reshape ?S ?y))) (partition -2 0 2 ?y))"
    " if (= (rank ?S) 4) (= (rank ?y) 3) (= (dim ?S 3) (dim ?y 2))",
    # (B, T, d, E) -> (B*T, d, E) with the last dims not equal
    "(partition -1 0 2 (reshape ?S ?y)) => (reshape (shape (partition -1 0 2 (reshape ?S ?y))) (partition -1 0 2 ?y))"
    " if (= (rank ?S) 3) (= (rank ?y) 4)",
])
def test_wrong_expert_reshape_rules_are_refuted(text: str) -> None:
    assert_refuted(parse_rule_text(text)[0])

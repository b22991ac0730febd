"""Partition rules for a transformer's norms and activations (issue 26, item 4): a batch split
stays on through the elementwise ops (rsqrt, erf, max, ...) and a sum or max over the last
(unsplit) dim, so the plan combines once at the end; the plan equals the program in numpy. The
rules' proofs are `test_parallel_rules`'s, their runs on devices `test_rule_devices`'s."""

from __future__ import annotations

from eqsat.ir import Graph, GraphBuilder
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import graph_axes, plan_graph, verified_parallel_rules

MESH = parse_mesh("4")


def _norm_of_product(batch: int = 256, d: int = 64) -> Graph:
    """rsqrt(sum(erf(x @ w)^2, -1)) and max(x @ w, -1) + ...: an RMS norm's statistic and a row max."""
    b = GraphBuilder()
    h = b.matmul(b.input("x", (batch, d)), b.weight("w", (d, d)))
    e = b.apply("erf", [h])[0]
    ss = b.apply("reduce_sum", [b.apply("ewmul", [e, e])[0]], {"axes": [1]})[0]
    m = b.apply("reduce_max", [b.apply("ewmax", [h, e])[0]], {"axes": [1]})[0]
    return b.build([b.apply("ewadd", [b.apply("rsqrt", [ss])[0], m])[0]])


def test_batch_split_goes_through_norm_and_activation() -> None:
    graph = _norm_of_product()
    rules = verified_parallel_rules(MESH, ("dp-matmul", "combine-partition", "partition-combine", "ewmul-combine",
                                           "ewadd-combine", "erf-combine", "ewmax-combine", "rsqrt-combine",
                                           "sum-last-combine", "max-last-combine"))
    res = plan_graph(graph, MESH, rules=rules, time_limit=10.0)
    assert res.numerics_ok
    plan = res.plan.live()
    axes = graph_axes(plan)
    on_devices = {n.op for n, a in zip(plan.nodes, axes) if a}
    assert {"erf", "rsqrt", "reduce_sum", "reduce_max", "ewmax"} <= on_devices
    assert plan.op_counts().get("combine", 0) == 1  # once, at the output

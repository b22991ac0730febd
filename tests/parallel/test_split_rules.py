"""A split of another dim through `split` and `concat` (issue 26), and plan nodes that split a device axis.

`partition-slice` / `partition-concat`: a partition of dim D of a slice (concat) along axis K is the
slice (concat) along K + 1 of the partition(s); a slice's start and stop are integer attribute
variables (`?a`, `?b`), which the verifier samples and the symbolic prover keeps symbolic. Every
instance is proved for all shapes; a split along the sliced axis is not. The captured `jnp.split`
is the IR's `split`, which the e-graph holds as slices; a data-parallel plan of a fused QKV keeps the
batch split through it and runs on devices equal to the program.

A `partition` whose dim names one of its input's device axes passes the stacked numpy check but no
per-device program expresses it: the planner's context leaves such e-nodes out (so no plan
extracts one) and `graph_axes` refuses a plan holding one, saying why.
"""

from __future__ import annotations

import pytest

from eqsat.context import ENode, ENodes
from eqsat.ir import Graph, GraphBuilder
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import PlanError, graph_axes, plan_graph, spmd_context
from eqsat.parallel.rules import instantiate
from eqsat.rewrites.concrete import REFUTED, VerifyOptions, verify_concrete
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.symbolic import prove_symbolic
from eqsat.rewrites.verify import verify_rule
from eqsat.rulesets import is_trusted

from .on_devices import assert_plan_runs_on_devices

SPLIT_RULES = ("partition-slice", "partition-concat")


def test_instances_cover_every_rank_axis_and_other_dim() -> None:
    rules = instantiate(0, 2, names=SPLIT_RULES)
    assert len(rules) == 2 * 36  # ranks 2..5, every axis, every dim -1..-4 within the rank but the sliced one
    names = {r.name for r in rules}
    assert "partition-slice[D=-3,K=2,R=3]@0" in names  # (B, T, 3D) split along its last axis, the batch split
    assert "partition-slice[D=-1,K=2,R=3]@0" not in names  # a split along the sliced axis is no rule


def _proved_for_all_shapes(rule: Rule) -> None:
    how = prove_symbolic(rule)
    assert how is not None and "symbolic dims" in how, rule.name
    assert verify_concrete(rule, VerifyOptions(samples=8)).status == "proved", rule.name


def test_the_rank_3_split_rules_are_proved_for_all_shapes() -> None:
    """The instances a (B, T, 3D) fused QKV meets (the full sweep is the slow test below)."""
    rules = [r for r in instantiate(0, 2, names=SPLIT_RULES) if "R=3]" in r.name]
    assert len(rules) == 2 * 6
    for rule in rules:
        _proved_for_all_shapes(rule)


@pytest.mark.slow  # ~40 s each on a loaded machine
@pytest.mark.parametrize("parts", [2, 4])
def test_every_split_rule_instance_is_proved_for_all_shapes(parts: int) -> None:
    for rule in instantiate(0, parts, names=SPLIT_RULES):
        how = prove_symbolic(rule)
        assert how is not None and "symbolic dims" in how, rule.name
        assert verify_concrete(rule, VerifyOptions(samples=8)).status == "proved", rule.name


@pytest.mark.parametrize("text", [
    # a split along the sliced axis: device d's piece of x[a:b] starts at a + d (b - a) / N, not at d S / N
    "(partition -1 0 2 (slice 2 ?a ?b ?x)) => (slice 3 ?a ?b (partition -1 0 2 ?x)) if (= (rank ?x) 3)",
    # the concat's pieces swapped
    "(partition -2 0 2 (concat 2 3 ?x ?y)) => (concat 3 4 (partition -2 0 2 ?y) (partition -2 0 2 ?x)) if (= (rank ?x) 3)",
    # a concat split along its own axis
    "(partition -1 0 2 (concat 2 3 ?x ?y)) => (concat 3 4 (partition -1 0 2 ?x) (partition -1 0 2 ?y)) if (= (rank ?x) 3)",
])
def test_wrong_split_rules_are_refuted(text: str) -> None:
    rule = parse_rule_text(text)[0]
    assert prove_symbolic(rule) is None
    assert verify_concrete(rule, VerifyOptions(samples=24)).status == REFUTED
    assert not is_trusted(verify_rule(rule, axioms=()))


def test_jnp_split_captures_to_split_held_as_slices() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from eqsat.egraph import TensorEGraph
    from jax_backend.capture import capture

    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        q, k, v = jnp.split(x @ w, 3, axis=-1)
        return q * k + v + jax.lax.slice_in_dim(x @ w, 2, 6, axis=2)  # lax.slice: a slice

    program, _ = capture(f, jnp.ones((2, 8, 4)), jnp.ones((4, 12)))
    (step,) = program.graphs  # one graph: nothing left opaque
    counts = step.graph.op_counts()
    split = [n for n in step.graph.nodes if n.op in ("split", "slice") and n.attr["axis"] == 2]
    assert split and counts.get("slice", 0) + counts.get("split", 0) >= 2, counts
    if split[0].op == "split":
        assert tuple(split[0].attr["sizes"]) == (4, 4, 4)
    lines, _, _ = TensorEGraph.encoding_program(step.graph)
    assert sum("(Slice 2 " in ln for ln in lines) == 4  # the split's three slices and lax.slice's


def _qkv(batch: int = 64, seq: int = 16, d: int = 128) -> Graph:
    """A fused QKV as JAX captures `jnp.split(x @ w_qkv, 3, axis=-1)` on (B, T, D)."""
    b = GraphBuilder()
    h = b.apply("reshape", [b.input("x", (batch, seq, d))], {"shape": [batch * seq, d]})[0]
    h = b.apply("reshape", [b.matmul(h, b.weight("w", (d, 3 * d)))], {"shape": [batch, seq, 3 * d]})[0]
    q, k, v = b.apply("split", [h], {"axis": 2, "sizes": [d, d, d]})
    s = b.apply("reshape", [b.apply("ewadd", [b.apply("ewmul", [q, k])[0], v])[0]], {"shape": [batch * seq, d]})[0]
    return b.build([b.matmul(s, b.weight("w2", (d, d)))])


@pytest.mark.slow  # rule verification (cold), saturation, the ILP and a run on 4 devices
def test_data_parallel_keeps_the_batch_split_through_a_fused_qkv_split() -> None:
    mesh = parse_mesh("4")
    res = plan_graph(_qkv(), mesh, strategy="data-parallel", time_limit=10.0)
    assert res.numerics_ok
    plan = res.plan.live()
    axes = graph_axes(plan)
    assert [a for n, a in zip(plan.nodes, axes) if n.op == "slice"] == [(0,)] * 3  # q, k, v stay split
    assert plan.op_counts().get("combine", 0) == 1  # gathered once, at the output
    assert_plan_runs_on_devices(_qkv(), plan, mesh)


def _device_axis_partition() -> Graph:
    """x (8, 16) split over mesh axis 1 along dim -2 (a (2, 4, 16) stack), then 'split' along dim -3:
    its device axis, which the stacked numpy semantics allow and no per-device program expresses."""
    b = GraphBuilder()
    x = b.apply("partition", [b.input("x", (8, 16))], {"dim": -2, "axis": 1, "parts": 2})[0]
    y = b.apply("partition", [x], {"dim": -3, "axis": 0, "parts": 2})[0]
    return b.build([b.apply("combine", [b.apply("combine", [y], {"dim": -3, "axis": 0})[0]], {"dim": -2, "axis": 1})[0]])


def test_a_plan_splitting_a_device_axis_is_refused_with_the_reason() -> None:
    with pytest.raises(PlanError, match=r"node 2 \(partition\).*dim -3 names a device axis"):
        graph_axes(_device_axis_partition())


def test_the_context_leaves_out_a_partition_of_a_device_axis() -> None:
    """The same node in an e-graph: not kept, so no extraction (ILP, greedy, random plans) picks it."""
    nodes = {"n0": ENode("input", {"name": "x"}, "c0", ()),
             "n1": ENode("partition", {"dim": -2, "axis": 1, "parts": 2}, "c1", ("c0",)),
             "n2": ENode("partition", {"dim": -3, "axis": 0, "parts": 2}, "c2", ("c1",)),  # a device axis
             "n3": ENode("partition", {"dim": -1, "axis": 0, "parts": 2}, "c3", ("c1",))}  # a data dim
    shapes = {"c0": (8, 16), "c1": (2, 4, 16), "c2": (2, 1, 4, 16), "c3": (2, 2, 4, 8)}
    kept = spmd_context(ENodes(nodes, shapes)).kept
    assert {"n0", "n1", "n3"} <= kept and "n2" not in kept

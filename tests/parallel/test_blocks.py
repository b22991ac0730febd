"""Deep models: finding identical blocks, composing a block's plan over every copy, and planning
one block instead of the whole chain (`eqsat.parallel.blocks`)."""

from __future__ import annotations

import numpy as np
import pytest

from eqsat.ir import Graph, GraphBuilder, Value
from eqsat.models.parallel_cases import gpt, gpt_per_head, mlp
from eqsat.cost import cost_model
from eqsat.parallel.blocks import block_graph, compose, find_blocks, plan_hash, plan_repeated, rest_graph
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.memory import sharded_leaves
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import PlanError, graph_axes, plan_report
from eqsat.pipeline import numerics_match


def _tiny_gpt(layers: int) -> Graph:
    return gpt(layers, d=16, heads=2, seq=8, batch=2)


def test_gpt_blocks_are_found_whatever_the_depth() -> None:
    for layers in (2, 6):
        g = _tiny_gpt(layers)
        b = find_blocks(g)
        assert b is not None and b.copies == layers
        assert b.entries[0] == next(Value(i) for i, n in g.leaves() if n.attr["name"] == "x")
        assert all(b.entries[k + 1] == b.exits[k] for k in range(layers - 1))
        assert b.exits[-1] == g.outputs[0]
        # each copy has its own six weights, in the same roles
        names = [[str(g.nodes[i].attr["name"]) for i in own] for own in b.own_leaves]
        assert [[n.split(".")[1] for n in copy] for copy in names] == [[n.split(".")[1] for n in names[0]]] * layers
        assert all(n.startswith(f"b{k}.") for k, copy in enumerate(names) for n in copy)


def test_the_deep_benches_per_head_gpt_is_a_chain_too() -> None:
    """`gpt_per_head` (the form `experiments/parallel_deep.py` plans): its blocks are found, each
    with its per-head weights (H, d, dh)."""
    g = gpt_per_head(4, d=16, heads=2, seq=8)
    b = find_blocks(g)
    assert b is not None and b.copies == 4
    assert g.leaf_shapes()["b0.wq"] == (2, 16, 8) and g.leaf_shapes()["x"] == (8, 16)


def test_one_block_and_blocks_of_different_shapes_are_no_chain() -> None:
    assert find_blocks(_tiny_gpt(1)) is None
    b = GraphBuilder()
    h = b.input("x", (4, 8))
    for i, (m, n) in enumerate(((8, 16), (16, 32), (32, 64))):
        h = b.matmul(h, b.weight(f"w{i}", (m, n)), act=2)
    assert find_blocks(b.build([h])) is None


def test_mlp_chain_with_a_different_last_layer_leaves_it_to_the_rest() -> None:
    g = mlp(5, 16, 32)  # relu on the first four layers, none on the last
    b = find_blocks(g)
    assert b is not None and b.copies == 4
    rest, exit_name, where = rest_graph(g, b)
    assert rest is not None and exit_name in rest.leaf_shapes() and where == (0,)


@pytest.mark.parametrize("make", [lambda: _tiny_gpt(3), lambda: mlp(5, 16, 32)])
def test_composing_the_block_itself_is_the_program(make) -> None:  # type: ignore[no-untyped-def]
    """The block graph is a (replicated) plan of the block: composed over the copies it must
    compute exactly the program, on each copy's own weights."""
    g = make()
    b = find_blocks(g)
    assert b is not None
    block, entry = block_graph(g, b)
    rest, exit_name, where = rest_graph(g, b)
    whole = compose(g, b, block, entry, rest, exit_name, where)
    assert whole.leaf_shapes() == g.leaf_shapes()
    ok, diff = numerics_match(g, whole)
    assert ok, diff


def test_composing_a_sharded_block_plan_keeps_it_sharded_in_every_copy() -> None:
    """A Megatron block plan written by hand (w1 split by columns, w2 by rows over axis 0, the
    product summed) composed over 4 copies: every copy is sharded, the whole is one SPMD program
    and equals the program."""
    g = mlp(5, 8, 16)
    b = find_blocks(g)
    assert b is not None
    block, entry = block_graph(g, b)
    (_, x), (_, w) = block.leaves()[0], block.leaves()[1]
    pb = GraphBuilder()
    xi = pb.input(str(x.attr["name"]), x.shapes[0])
    wi = pb.weight(str(w.attr["name"]), w.shapes[0])
    parts = pb.apply("partition", [wi], {"dim": -1, "parts": 2, "axis": 0})[0]
    rep = pb.apply("replicate", [xi], {"parts": 2, "axis": 0})[0]
    y = pb.matmul(rep, parts, act=2)
    out = pb.apply("combine", [y], {"dim": -1, "axis": 0})[0]
    plan = pb.build([out])
    assert numerics_match(block, plan)[0]
    rest, exit_name, where = rest_graph(g, b)
    whole = compose(g, b, plan, entry, rest, exit_name, where)
    graph_axes(whole)  # one SPMD program
    assert whole.op_counts()["partition"] == 4 and whole.op_counts()["combine"] == 4
    assert numerics_match(g, whole)[0]


def test_plan_hash_tells_plans_apart() -> None:
    assert plan_hash(_tiny_gpt(2)) == plan_hash(_tiny_gpt(2))
    assert plan_hash(_tiny_gpt(2)) != plan_hash(_tiny_gpt(3))


@pytest.mark.slow
def test_six_layers_plan_as_the_two_layer_plan_repeated() -> None:
    """The deep target on a small depth: 2 and 6 layers plan the same block plan, once each, and
    the 6-layer plan is that block plan over six copies, checked against the program."""
    mesh = parse_mesh("2x4")
    two, four, six = (plan_repeated(gpt(n, d=64, heads=4, seq=16, batch=2), mesh) for n in (2, 4, 6))
    for res, n in ((two, 2), (four, 4), (six, 6)):
        assert res.info["blocks"]["copies"] == n and res.info["blocks"]["planned_once"]
        assert res.numerics_ok and res.info["numerics"] == "whole plan checked"
    assert two.info["blocks"]["block_plan_hash"] == four.info["blocks"]["block_plan_hash"] \
        == six.info["blocks"]["block_plan_hash"]
    # the same block plan: every copy after the first (which reads the input, so no gradient flows
    # back through its entry) adds the same bytes and ops
    comm = [r.report.comm_bytes(None) for r in (two, four, six)]
    np.testing.assert_allclose(comm[2] - comm[1], comm[1] - comm[0], rtol=1e-9)
    counts = [r.plan.live().op_counts() for r in (two, four, six)]
    assert all(counts[2].get(op, 0) - counts[1].get(op, 0) == counts[1].get(op, 0) - counts[0].get(op, 0)
               for op in counts[2])


def test_plan_repeated_plans_the_block_once_and_the_last_layer_beside() -> None:
    """Data parallel (a quick search) on an MLP whose last layer differs: four copies of one block
    plan, the last layer planned as the rest, the whole checked against the program and re-priced
    as a whole; optimizer state counted by the cost model."""
    g = mlp(5, 64, 32)
    res = plan_repeated(g, parse_mesh("8"), "data-parallel")
    blocks = res.info["blocks"]
    assert blocks["copies"] == 4 and blocks["rest_planned"] and blocks["planned_once"]
    assert res.numerics_ok and res.info["numerics"] == "whole plan checked"
    assert res.plan.leaf_shapes() == g.leaf_shapes()
    assert res.report == plan_report(res.plan, ParallelCostModel(parse_mesh("8"), cost_model("roofline", "cpu-nominal")))
    # optimizer state is the cost model's (`state_copies`, Adam: 2 copies of each weight as passed)
    adam = ParallelCostModel(parse_mesh("8"), cost_model("roofline", "cpu-nominal"), state_copies=2.0)
    with_state = plan_repeated(g, parse_mesh("8"), "data-parallel", model=adam)
    assert plan_hash(with_state.plan) == plan_hash(res.plan)
    shards = 0.0
    split = sharded_leaves(res.plan)
    for i, n in res.plan.leaves("weight"):
        parts = res.plan.nodes[res.plan.users[i][0]].attr["parts"] if i in split else 1
        shards += 4.0 * float(np.prod(n.shapes[0])) / parts
    assert with_state.report.mem_bytes == pytest.approx(res.report.mem_bytes + 2 * shards)


@pytest.mark.slow
def test_a_budget_no_block_plan_meets_is_refused() -> None:
    with pytest.raises(PlanError):
        plan_repeated(mlp(5, 64, 32), parse_mesh("8"), "data-parallel", mem_budget=1.0)


@pytest.mark.slow
def test_user_gpt_with_four_layers_reuses_its_block_plan() -> None:
    """`eqsat.parallel.plan` on a 4-layer GPT-2-style program: the captured graph's four layers are
    planned once, and the report says so."""
    import jax

    import eqsat.parallel as ep
    from experiments.parallel_user_programs import gpt_problem

    step, args = gpt_problem(layers=4)
    plan = ep.plan(step, *args, mesh=jax.make_mesh((2, 4), ("data", "model")), params_argnums=(0, 1),
                   baselines=False)
    assert any("4 identical blocks" in line for line in plan.report.blocks), (plan.report.strategy, plan.report.blocks)
    assert "deep model: 4 identical blocks" in plan.explain()
    specs = dict(plan.report.leaf_specs)
    params = plan.report.leaf_specs[0][0].split("[")[0]  # the step's name for its first argument
    for name in ("qkv", "proj", "fc", "out"):  # every layer's weight split as the first layer's
        assert len({specs[f"{params}['blocks'][{k}]['{name}']"] for k in range(4)}) == 1, specs


def test_rest_graph_returns_an_output_computed_from_leaves_alone() -> None:
    """A graph output made from leaves without a product (a mask the step also returns) is in no
    block and not in the rest's kept nodes: the rest graph still returns it, its nodes included
    (it once read past the rest's nodes and failed with a KeyError, or was dropped with no rest)."""
    for head in (True, False):
        b = GraphBuilder()
        h = b.input("x", (4, 8))
        for i in range(3):
            h = b.tanh(b.matmul(h, b.weight(f"w{i}", (8, 8))))
        m = b.input("m", (4, 8))
        g = b.build([b.matmul(h, b.weight("head", (8, 2))) if head else h, b.tanh(b.ewmul(m, m))])
        blocks = find_blocks(g)
        assert blocks is not None and blocks.copies == 3
        rest, _, where = rest_graph(g, blocks)
        assert rest is not None and where == ((0, 1) if head else (None, 0))
        assert [n.op for n in rest.nodes if n.op not in ("input", "weight")][-2:] == ["ewmul", "tanh"]
        assert rest.shape(rest.outputs[1 if head else 0]) == (4, 8)

"""The per-graph rule filter (`rules.applicable`) is keyed by op and `OpSpec.rank_attr` (a
transpose's permutation, a reshape's rank): a rule whose left side needs a rank-5 transpose stays out
of a graph of rank-3 values, and no rule that fires on a graph in an unfiltered saturation is left
out (exact)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eqsat.egraph import TensorEGraph
from eqsat.ir import Graph, GraphBuilder
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import DEFAULT_LIMITS, seeded, strategy_rules
from eqsat.parallel.rules import applicable, instantiate
from eqsat.saturate import saturate


def attention() -> Graph:
    """Rank-3/4 values only: heads split by a reshape and transposed, keys transposed."""
    b = GraphBuilder()
    x = b.input("x", (128, 32))
    q = b.apply("reshape", [b.matmul(x, b.weight("wq", (32, 32)))], {"shape": [8, 16, 4, 8]})[0]
    k = b.apply("reshape", [b.matmul(x, b.weight("wk", (32, 32)))], {"shape": [8, 16, 4, 8]})[0]
    qh = b.apply("transpose", [q], {"perm": [0, 2, 1, 3]})[0]
    kt = b.apply("transpose", [k], {"perm": [0, 2, 3, 1]})[0]
    return b.build([b.matmul(qh, kt)])


def patch_cut() -> Graph:
    """The ViT's patchify: (B, H, W, C) -> (B, g, p, g, p, C) -> [0 1 3 2 4 5] -> (B, g*g, p*p*C)."""
    b = GraphBuilder()
    x = b.input("x", (8, 8, 8, 3))
    six = b.apply("reshape", [x], {"shape": [8, 2, 4, 2, 4, 3]})[0]
    moved = b.apply("transpose", [six], {"perm": [0, 1, 3, 2, 4, 5]})[0]
    flat = b.apply("reshape", [moved], {"shape": [8, 4, 48]})[0]
    rows = b.apply("reshape", [flat], {"shape": [32, 48]})[0]
    return b.build([b.relu(b.matmul(rows, b.weight("w", (48, 16))))])


def mlp() -> Graph:
    b = GraphBuilder()
    h = b.relu(b.matmul(b.input("x", (16, 32)), b.weight("w1", (32, 64))))
    return b.build([b.matmul(h, b.weight("w2", (64, 8)))])


def test_a_rank5_transpose_rule_is_left_out_of_a_rank3_graph() -> None:
    b = GraphBuilder()
    x = b.input("x", (8, 16, 32))
    rows = b.apply("reshape", [b.apply("transpose", [x], {"perm": [0, 2, 1]})[0]], {"shape": [256, 16]})[0]
    g = b.build([b.matmul(rows, b.weight("w", (16, 4)))])
    rules = instantiate(0, 2)
    kept = {r.name for r in applicable(rules, g)}
    batch = {n for n in kept if n.startswith("partition-transpose-batch")}
    # [0 2 1] splits to [0 1 3 2], then [0 1 2 4 3]: the only batch transposes this graph can grow
    assert batch <= {"partition-transpose-batch[BPERM=0.1.2.4.3]@0", "partition-transpose-batch[BPERM=0.1.2.3.5.4]@0"}
    assert "partition-transpose-batch[BPERM=0.4.3.2.1]@0" not in kept
    assert "transpose-partition@0" in kept  # the rank-3 [0 2 1] rule stays
    assert not any("PERM=1.0," in n for n in kept)  # a rank-2 transpose's rules: no rank-2 transpose held


def test_only_the_patch_cuts_permutation_joins() -> None:
    kept = {r.name for r in applicable(instantiate(0, 2), patch_cut())}
    batch = {n for n in kept if n.startswith("partition-transpose-batch")}
    assert batch == {"partition-transpose-batch[BPERM=0.1.3.2.4.5]@0"}


def test_a_rule_built_by_an_earlier_stage_is_kept() -> None:
    """The right side of a rank-6 batch transpose on axis 0 builds a rank-7 transpose; the rank-6
    rule it feeds on axis 1 must join the second axis's stage, which never saw the graph hold it."""
    first = instantiate(0, 2)
    second = [r for r in instantiate(1, 4, names=("partition-transpose-batch",)) if r.name.count(".") == 5]
    b = GraphBuilder()
    five = b.apply("reshape", [b.input("x", (8, 64))], {"shape": [8, 2, 4, 2, 4]})[0]
    g5 = seeded(b.build([b.apply("transpose", [five], {"perm": [0, 1, 3, 2, 4]})[0]]), parse_mesh("2x4"))
    alone = {r.name for r in applicable(second, g5)}
    assert not alone  # rank-6 rules only; the graph holds a rank-5 transpose
    later = {r.name for r in applicable(second, g5, before=first)}
    assert "partition-transpose-batch[BPERM=0.1.2.4.3.5]@1" in later  # axis 0's rank-6 result


def _fired_survive(graph: Graph, mesh_spec: str, seconds: float, verified: bool = True) -> None:
    mesh = parse_mesh(mesh_spec)
    rules = strategy_rules(mesh, "joint") if verified else [r for i, ax in enumerate(mesh.axes)
                                                            for r in instantiate(i, ax.size)]
    held = seeded(graph, mesh)
    report = saturate(TensorEGraph.from_graph(held), rules, replace(DEFAULT_LIMITS, seconds=seconds))
    fired = {name for name, n in report.total_matches.items() if n}
    kept = {r.name for r in applicable(rules, held)}
    assert fired and fired <= kept, sorted(fired - kept)
    assert len(kept) < len(rules)


@pytest.mark.parametrize("build", [attention, patch_cut, mlp])
def test_every_rule_that_fires_survives_the_filter(build: object) -> None:
    assert callable(build)
    _fired_survive(build(), "2x4", 10.0, verified=False)


@pytest.mark.slow  # captures and saturates the user programs' graphs (about a minute)
@pytest.mark.parametrize("program", ["mlp", "gpt", "moe", "vit"])
def test_every_rule_that_fires_on_a_user_program_survives_the_filter(program: str) -> None:
    import jax

    from eqsat.parallel.step_args import flat_leaves, forward_jaxpr
    from experiments.parallel_user_programs import PROGRAMS
    from jax_backend.capture import capture_jaxpr

    step, args = PROGRAMS[program]()
    closed = jax.make_jaxpr(step)(*args)
    leaves, _ = flat_leaves(args, (0, 1))
    found = forward_jaxpr(closed, {v for v, s in zip(closed.jaxpr.invars, leaves.state) if s})
    assert found is not None
    graphs = [s.graph for s in capture_jaxpr(found[0]).graphs if any(n.op == "matmul" for n in s.graph.nodes)]
    assert graphs
    for graph in graphs:
        for mesh in ("8", "2x4"):
            _fired_survive(graph, mesh, 20.0)

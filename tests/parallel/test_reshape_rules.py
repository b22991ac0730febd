"""A batch split through a transformer's reshapes, mask and softmax (issue 26, item 4).

`reshape-partition-K` / `-kept-K` say that a split of the first dim of a reshape's result is the
reshape of a split of its input's first dim (both cut the row-major buffer into N equal runs); the
conditions name the reshape's target shape (`(rank ?S)`), which conditions may now do. Each instance
is proved for every shape under the guard (the prover reads reshape through the flat index); wrong
variants are not. The planner keeps a batch split through `reshape`, and the plan runs on devices
equal to the program.
"""

from __future__ import annotations

import pytest

from eqsat.ir import Graph, GraphBuilder
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import graph_axes, plan_graph, verified_parallel_rules
from eqsat.parallel.rules import instantiate
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.to_egglog import to_egglog

from .on_devices import assert_plan_runs_on_devices
from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

BATCH_RULES = ("reshape-partition-1", "reshape-partition-2", "reshape-partition-3", "reshape-partition-4",
               "reshape-partition-kept-1", "reshape-partition-kept-2", "reshape-partition-kept-3",
               "reshape-partition-kept-4", "partition-rsqrt", "partition-tanh", "partition-ewmax",
               "partition-stop-gradient", "partition-stop-gradient4", "partition-ewadd4", "partition-ewsub4",
               "partition-ewdiv4", "partition-ewmul4", "partition-exp4", "partition-tanh4", "partition-select4", "batch-max4",
               "batch-sum4", "batch-bcast4", "batch-heads-transpose", "batch-keys-transpose")


def _one(name: str, parts: int = 2) -> Rule:
    return next(r for r in instantiate(0, parts) if r.name == name)


@pytest.mark.parametrize("parts", [2, pytest.param(4, marks=pytest.mark.slow)])  # ~10 s each on a loaded machine
def test_every_batch_rule_instance_is_proved_for_all_shapes(parts: int) -> None:
    rules = instantiate(0, parts, names=BATCH_RULES)
    assert len(rules) == 8 * 4 + 17
    assert_proved_for_all_shapes(rules)


@pytest.mark.parametrize("text", [
    # the split of the result's last dim is no split of the input's first
    "(partition -1 0 2 (reshape ?S ?y)) => (reshape (shape (partition -1 0 2 (reshape ?S ?y))) (partition -3 0 2 ?y))"
    " if (= (rank ?y) 3) (= (rank ?S) 2)",
    # (B*T, D) from (B, T, D): a split of T is a strided, not a contiguous, piece of B*T
    "(partition -2 0 2 (reshape ?S ?y)) => (reshape (shape (partition -2 0 2 (reshape ?S ?y))) (partition -2 0 2 ?y))"
    " if (= (rank ?y) 3) (= (rank ?S) 2)",
    # behind a leading dim, only where both keep it (the condition left out)
    "(partition -2 0 2 (reshape ?S ?y)) => (reshape (shape (partition -2 0 2 (reshape ?S ?y))) (partition -3 0 2 ?y))"
    " if (= (rank ?y) 4) (= (rank ?S) 3)",
    # the mask's branches swapped
    "(partition -4 0 2 (select_n ?p ?x ?y)) => (select_n (partition -4 0 2 ?p) (partition -4 0 2 ?y) (partition -4 0 2 ?x))",
    # the heads transpose moved the wrong axes
    "(partition -4 0 2 (transpose [0 2 1 3] ?k)) => (transpose [0 1 2 4 3] (partition -4 0 2 ?k))",
])
def test_wrong_batch_rules_are_not_proved(text: str) -> None:
    rule = parse_rule_text(text)[0]
    assert_refuted(rule)


def test_a_condition_names_the_reshape_target() -> None:
    """`(rank ?S)` of a list attribute reads the matched shape; a pinned rank binds the input's shape
    item by item, so the right side's element count is computed in the query."""
    text = to_egglog(_one("reshape-partition-2[E=-3]@0", 4), "rs")[0].text
    assert "(= (vec-length a_S) 2)" in text
    assert "(= (vec-length sh_v_y) 3)" in text and "numel" not in text


def _flattened(batch: int = 64, seq: int = 16, d: int = 256, e: int = 512) -> Graph:
    """(B, T, D) -> (B*T, D) @ w1 -> (B, T, E) -> tanh -> (B*T, E) @ w2: a transformer's MLP as
    JAX captures it (the products on flattened tokens)."""
    b = GraphBuilder()
    h = b.apply("reshape", [b.input("x", (batch, seq, d))], {"shape": [batch * seq, d]})[0]
    h = b.apply("reshape", [b.matmul(h, b.weight("w1", (d, e)))], {"shape": [batch, seq, e]})[0]
    h = b.apply("reshape", [b.apply("tanh", [h])[0]], {"shape": [batch * seq, e]})[0]
    return b.build([b.matmul(h, b.weight("w2", (e, d)))])


@pytest.mark.slow  # ~30-80 s: rule verification (cold), saturation, the ILP and a run on 4 devices
def test_batch_split_stays_on_through_reshapes() -> None:
    mesh = parse_mesh("4")
    rules = verified_parallel_rules(mesh, ("dp-matmul", "combine-partition", "partition-combine", "partition-tanh",
                                           "all-gather", *(f"reshape-partition-{k}" for k in (1, 2, 3, 4))))
    res = plan_graph(_flattened(), mesh, rules=rules, time_limit=10.0)
    assert res.numerics_ok
    plan = res.plan.live()
    axes = graph_axes(plan)
    assert sum(1 for n, a in zip(plan.nodes, axes) if n.op == "reshape" and a) == 2  # both inner reshapes split
    assert plan.op_counts().get("combine", 0) == 1  # gathered once, at the output
    assert_plan_runs_on_devices(_flattened(), plan, mesh)


def test_masked_scores_split_by_batch_run_on_devices() -> None:
    """`partition-select4`'s right side (a bool mask, the scores and the fill each split by batch,
    selected per device) lowered to `shard_map` equals the masked scores in numpy."""
    import numpy as np

    jax = pytest.importorskip("jax")
    if jax.device_count() < 2:
        pytest.skip("needs 2 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from jax_backend.shard import shard_plan

    shape = (4, 2, 3, 3)
    b = GraphBuilder()
    pred, fill, scores = b.input("m", shape, "bool"), b.input("f", shape), b.input("s", shape)
    parts = [b.apply("partition", [v], {"dim": -4, "axis": 0, "parts": 2})[0] for v in (pred, fill, scores)]
    picked = b.apply("select_n", parts)[0]
    graph = b.build([b.apply("combine", [b.apply("exp", [picked])[0]], {"dim": -4, "axis": 0})[0]])
    rng = np.random.default_rng(0)
    values = {"m": rng.random(shape) > 0.5, "f": np.full(shape, -1e9, np.float32),
              "s": rng.standard_normal(shape).astype(np.float32)}
    program = shard_plan(graph, parse_mesh("2"))
    got = np.asarray(program.fn(*program.place(values))[0])
    np.testing.assert_allclose(got, np.exp(np.where(values["m"], values["s"], values["f"])), rtol=1e-5)

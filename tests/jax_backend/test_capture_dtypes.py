"""Dtypes in the IR and mask / index math as IR ops (issue 25, item 2): what real code contains is
captured as one graph, lowered to the same numbers in the same dtype, and never rewritten across
dtypes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqsat import ops
from eqsat.compare import outputs_agree
from eqsat.egraph import TensorEGraph, decode
from eqsat.errors import GraphFormatError, ShapeError
from eqsat.extract import extract, load_egraph
from eqsat.ir import Graph, GraphBuilder
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.to_egglog import dtype_guards
from eqsat.rulesets import dtype_scope, trusted_rules
from eqsat.saturate import Limits, saturate
from jax_backend.capture import GraphStep, Program, capture, graph_leaf_name, numpy_runner, replay
from jax_backend.lower import to_jax

# --- the programs users write ---------------------------------------------------------------------


def causal_attention(x: jax.Array, wqkv: jax.Array) -> jax.Array:
    """GPT-2 style: fused QKV, a jnp.tril mask applied with jnp.where, softmax."""
    t, d = x.shape
    q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
    scores = q @ k.T / np.sqrt(d)
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1) @ v


def iota_mask_attention(x: jax.Array, w: jax.Array) -> jax.Array:
    """The mask written with iotas and a comparison (what jnp.tril traces to)."""
    s = (x @ w) @ x.T
    rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    return jax.nn.softmax(jnp.where(cols <= rows, s, -1e9), axis=-1)


def one_hot_embed(labels: jax.Array, table: jax.Array) -> jax.Array:
    return jax.nn.one_hot(labels, table.shape[0]) @ table


def bf16_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def mixed_precision(x: jax.Array, w: jax.Array) -> jax.Array:
    """bfloat16 weights, float32 accumulation and layer norm (`preferred_element_type`)."""
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
    return h.astype(jnp.bfloat16)


def int_index_math(i: jax.Array, j: jax.Array) -> jax.Array:
    return jnp.maximum(i * 3 + j, j - i) * 2


def _key(n: int) -> list[jax.Array]:
    return list(jax.random.split(jax.random.key(0), n))


def _programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    k = _key(6)
    bf = jnp.bfloat16
    return [
        ("causal_attention", causal_attention, (jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 48)))),
        ("iota_mask_attention", iota_mask_attention, (jax.random.normal(k[0], (6, 8)), jax.random.normal(k[1], (8, 8)))),
        ("one_hot", one_hot_embed, (jnp.array([0, 3, 9, 3, 7]), jax.random.normal(k[2], (10, 4)))),
        ("bf16_mlp", bf16_mlp, (jax.random.normal(k[3], (4, 16), bf), jax.random.normal(k[4], (16, 32), bf) / 4,
                                jax.random.normal(k[5], (32, 8), bf) / 6)),
        ("mixed_precision", mixed_precision, (jax.random.normal(k[0], (4, 16), bf), jax.random.normal(k[1], (16, 8), bf))),
        ("int_index_math", int_index_math, (jnp.arange(12, dtype=jnp.int32).reshape(3, 4),
                                            jnp.arange(12, 24, dtype=jnp.int32).reshape(3, 4))),
    ]


def _lowered_runner(step: GraphStep, values: Sequence[Any]) -> Sequence[Any]:
    return to_jax(step.graph)({graph_leaf_name(i): v for i, v in zip(step.inputs, values)})


def _capture(fn: Callable[..., Any], args: Sequence[Any]) -> Program:
    program, _ = capture(fn, *args)
    return program


@pytest.mark.parametrize("name, fn, args", _programs(), ids=[p[0] for p in _programs()])
def test_captured_as_one_graph_nothing_opaque_and_lowered_equal(name: str, fn: Callable[..., Any],
                                                                 args: tuple[Any, ...]) -> None:
    program = _capture(fn, args)
    assert not program.opaque, [(s.name, s.why) for s in program.opaque]
    assert len(program.graphs) == 1
    want = jax.jit(fn)(*args)
    got = jax.jit(lambda *a: replay(program, _lowered_runner, list(a))[0])(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    # the lowered graph runs the same lax ops in the same dtypes: equal to rounding of fused kernels
    assert outputs_agree([np.asarray(want)], [np.asarray(got)], rtol=1e-5, atol=1e-6, same_dtype=True).ok
    # and the IR's numpy meaning agrees too (the dtype each value carries)
    ref = replay(program, numpy_runner, [np.asarray(a) for a in args])[0]
    assert ref.dtype == np.asarray(want).dtype
    assert outputs_agree([np.asarray(want)], [ref], rtol=1e-4, atol=1e-5).ok


def test_values_keep_their_dtypes_in_the_graph() -> None:
    k = _key(3)
    program = _capture(mixed_precision, (jax.random.normal(k[0], (4, 16), jnp.bfloat16),
                                         jax.random.normal(k[1], (16, 8), jnp.bfloat16)))
    graph = program.graphs[0].graph
    assert set(graph.leaf_dtypes().values()) >= {"bfloat16"}
    assert graph.dtype(graph.outputs[0]) == "bfloat16"
    matmul = next(i for i, n in enumerate(graph.nodes) if n.op == "matmul")
    assert graph.dtypes[matmul] == ("float32",)  # accumulated in float32 as preferred_element_type says
    mask = _capture(causal_attention, _programs()[0][2]).graphs[0].graph
    assert {"bool", "int32", "float32"} <= {d for ds in mask.dtypes for d in ds}
    assert not {"ewadd", "ewsub", "ewmul"} & {n.op for i, n in enumerate(mask.nodes)
                                              if any(mask.dtype(v) != "float32" for v in n.inputs)}


def test_integer_arithmetic_uses_the_integer_ops() -> None:
    program = _capture(int_index_math, _programs()[-1][2])
    counts = program.graphs[0].graph.op_counts()
    assert counts.get("imul") and counts.get("iadd") and counts.get("imax") and counts.get("isub")
    assert not {"ewadd", "ewmul", "ewmax", "ewsub"} & set(counts)


def test_what_stays_opaque_says_why() -> None:
    def f(x: jax.Array, i: jax.Array) -> jax.Array:
        return jnp.abs(x.astype(jnp.complex64)).astype(jnp.float32) + (i // 2).astype(jnp.float32)

    program = _capture(f, (jnp.ones((3,)), jnp.arange(3)))
    why = {s.name: s.why for s in program.opaque}
    assert "complex64" in why["convert_element_type"]  # no complex dtype in the IR
    assert "div" in why  # integer division: no IR op (its rounding is not the float quotient's)


# --- the IR: dtype inference, JSON, random inputs -------------------------------------------------

def test_float_ops_refuse_integers_and_operands_must_agree() -> None:
    b = GraphBuilder()
    i = b.input("i", (2, 3), "int32")
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3), "bfloat16")
    with pytest.raises(ShapeError, match="takes float values, got int32"):
        b.ewadd(i, i)
    with pytest.raises(ShapeError, match="different dtypes"):
        b.ewadd(x, y)
    with pytest.raises(ShapeError, match="predicate must be bool"):
        b.apply("select_n", [x, x, x])
    with pytest.raises(ShapeError, match="unknown dtype"):
        b.input("z", (2,), "complex64")
    assert b.apply("iadd", [i, i])[0].dtype == "int32"
    assert b.apply("lt", [x, x])[0].dtype == "bool"


def test_graph_json_dtype_round_trips_and_missing_means_float32() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3), "bfloat16")
    w = b.weight("w", (3, 4), "bfloat16")
    f = b.input("f", (2, 4))
    out = b.ewadd(b.apply("convert_element_type", [b.matmul(x, w)], {"dtype": "float32"})[0], f)
    graph = b.build([out])
    data = graph.to_json()
    assert "dtype" not in data["nodes"][2]["attrs"]  # float32 is not written: older files read the same
    again = Graph.from_json(json.loads(json.dumps(data)))
    assert again == graph and again.dtypes == graph.dtypes
    data["nodes"][0]["attrs"]["dtype"] = "int32"  # an integer matmul: refused with the file named
    with pytest.raises(GraphFormatError, match="takes float values"):
        Graph.from_json(data, "g.json")
    inputs = graph.random_inputs(0)
    assert inputs["x"].dtype == ops.numpy_dtype("bfloat16") and inputs["f"].dtype == np.float32


def test_egraph_round_trip_keeps_dtypes() -> None:
    from tests.test_egraph import FlopsCost

    program = _capture(causal_attention, _programs()[0][2])
    graph = program.graphs[0].graph
    data = TensorEGraph.from_graph(graph).serialize(FlopsCost())
    egraph = load_egraph(data)
    decoded = decode(data, extract(egraph, "greedy-dag").as_ids(egraph))
    assert decoded.leaf_dtypes() == graph.leaf_dtypes()
    assert [decoded.dtype(v) for v in decoded.outputs] == [graph.dtype(v) for v in graph.outputs]


# --- rules never rewrite across dtypes ------------------------------------------------------------

def _fires(graph: Graph, rule_text: str) -> int:
    rules = parse_rule_text(rule_text)
    egraph = TensorEGraph.from_graph(graph)
    report = saturate(egraph, rules, Limits(iterations=3, seconds=30))
    return sum(report.total_matches.values())


_RELU_MERGE = ("relu-merge-1: (relu ?a) ; (relu ?b) => (split_0 (split 1 (relu (concat 1 2 ?a ?b)))) ; "
               "(split_1 (split 1 (relu (concat 1 2 ?a ?b)))) if (= (rank ?a) 2) (= (rank ?b) 2) (= (dim ?a 0) (dim ?b 0))")


def _two_relus(da: str, db: str) -> Graph:
    b = GraphBuilder()
    return b.build([b.relu(b.input("a", (4, 3), da)), b.relu(b.input("b", (4, 5), db))])


def test_a_merge_never_joins_values_of_two_dtypes() -> None:
    assert dtype_guards(parse_rule_text(_RELU_MERGE)[0]) == ["(= (dtype v_a) (dtype v_b))"]
    assert _fires(_two_relus("float32", "float32"), _RELU_MERGE) > 0
    assert _fires(_two_relus("bfloat16", "float32"), _RELU_MERGE) == 0  # guarded: no concat of bf16 and f32


def test_a_float_rule_never_fires_on_integers() -> None:
    rule = "t-add: (transpose [1 0] (ewadd ?a ?b)) => (ewadd (transpose [1 0] ?a) (transpose [1 0] ?b))"
    b = GraphBuilder()
    i = b.input("i", (2, 3), "int32")
    ints = b.build([b.transpose(b.apply("iadd", [i, i])[0], (1, 0))])
    assert _fires(ints, rule) == 0
    b = GraphBuilder()
    x = b.input("x", (2, 3), "bfloat16")
    floats = b.build([b.transpose(b.ewadd(x, x), (1, 0))])
    assert _fires(floats, rule) > 0  # the same rule on bfloat16 values


def test_a_float_op_is_never_applied_to_a_value_the_left_side_leaves_untyped() -> None:
    rule = parse_rule_text("bad: (transpose [1 0] (transpose [1 0] ?x)) => (relu ?x)")[0]
    assert dtype_guards(rule) == ["(float_dtype (dtype v_x))"]
    b = GraphBuilder()
    i = b.input("i", (2, 3), "int32")
    assert _fires(b.build([b.transpose(b.transpose(i, (1, 0)), (1, 0))]), "bad: (transpose [1 0] (transpose [1 0] ?x)) => (relu ?x)") == 0


def test_rule_policy_by_dtype() -> None:
    move = parse_rule_text("tt: (transpose [1 0] (transpose [1 0] ?x)) => ?x")[0]
    compute = parse_rule_text("c: (ewadd ?a ?b) => (ewadd ?b ?a)")[0]
    integer = parse_rule_text("i: (iadd ?a ?b) => (iadd ?b ?a)")[0]
    assert (dtype_scope(move), dtype_scope(compute), dtype_scope(integer)) == ("any", "float", "")
    assert integer not in trusted_rules([integer], allow_unproved=True)
    assert all(dtype_scope(r) for r in library_rules())  # the library has no integer rule


def test_low_precision_outputs_are_compared_at_their_epsilon() -> None:
    ref = np.linspace(-1, 1, 16).astype(ops.numpy_dtype("bfloat16"))
    off = (ref.astype(np.float32) + 0.02).astype(ref.dtype)  # ~2.5 bfloat16 epsilons
    assert outputs_agree([ref], [off], rtol=2e-4).ok
    assert not outputs_agree([ref.astype(np.float32)], [off.astype(np.float32)], rtol=2e-4).ok
    assert not outputs_agree([ref], [(ref.astype(np.float32) + 0.2).astype(ref.dtype)], rtol=2e-4).ok


# --- through the decorator ------------------------------------------------------------------------

def test_explain_shows_nothing_opaque_for_masks_one_hot_and_bf16() -> None:
    import eqsat

    for name, fn, args in _programs()[:4]:
        report = eqsat.explain(eqsat.optimize(fn, check_speed=False), *args).report
        assert not report.opaque, (name, report.opaque_why)
        assert len(report.segments) == 1 and not report.segments[0].error, name


@pytest.mark.slow  # ~9 s with a warm verification cache
def test_bf16_merge_rules_fire_and_numerics_hold() -> None:
    import eqsat

    def two_heads(x: jax.Array, w1: jax.Array, w2: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.nn.relu(x @ w1), jax.nn.relu(x @ w2)

    k = _key(3)
    args = (jax.random.normal(k[0], (16, 32), jnp.bfloat16), jax.random.normal(k[1], (32, 32), jnp.bfloat16) / 6,
            jax.random.normal(k[2], (32, 32), jnp.bfloat16) / 6)
    f = eqsat.optimize(two_heads, check_speed=False)
    report = f.report(*args)
    assert not report.opaque
    assert any(r for s in report.segments for r in s.rules_fired), report.segments
    assert report.used == "optimized", report.reason
    got, want = f(*args), jax.jit(two_heads)(*args)
    assert all(g.dtype == jnp.bfloat16 for g in got)
    assert outputs_agree([np.asarray(w) for w in want], [np.asarray(g) for g in got], rtol=2e-4, same_dtype=True).ok


def test_an_adam_step_is_captured_whole() -> None:
    """Adam's bias correction (`b1 ** count`, an integer count) and tanh's gradient
    (`one_minus_square`) are IR ops: the step replays with nothing opaque, equal to JAX."""
    def adam_step(w: jax.Array, m: jax.Array, v: jax.Array, count: jax.Array, x: jax.Array) -> list[jax.Array]:
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        m, v, count = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g, count + 1
        mhat, vhat = m / (1 - 0.9 ** count), v / (1 - 0.999 ** count)
        return [w - 1e-3 * mhat / (jnp.sqrt(vhat) + 1e-8), m, v, count]

    k = _key(2)
    args = (jax.random.normal(k[0], (8, 8)), jnp.zeros((8, 8)), jnp.zeros((8, 8)), jnp.int32(3),
            jax.random.normal(k[1], (4, 8)))
    program = _capture(adam_step, args)
    assert not program.opaque, [(s.name, s.why) for s in program.opaque]
    got = jax.jit(lambda *a: replay(program, _lowered_runner, list(a)))(*args)
    want = adam_step(*args)
    assert outputs_agree([np.asarray(w) for w in want], [np.asarray(g) for g in got], rtol=1e-5, atol=1e-7,
                         same_dtype=True).ok

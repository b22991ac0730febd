"""The op registry: shape inference rejects bad input with clear errors, and every op's JAX lowering
computes what its numpy reference semantics say."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqsat import ops
from eqsat.errors import ShapeError, UnknownOpError
from eqsat.ir import GraphBuilder
from jax_backend.lower import LOWERINGS, lower_node, to_jax

Case = tuple[Sequence[tuple[int, ...]], Mapping[str, Any]]

# --- shape inference errors -----------------------------------------------------------------------

BAD: list[tuple[str, list[tuple[int, ...]], dict[str, Any], str]] = [
    ("matmul", [(2, 3), (4, 5)], {}, "inner dimensions differ"),
    ("matmul", [(2, 2, 3), (3, 3, 4)], {}, "batch dimensions differ"),
    ("matmul", [(2, 3), (3,)], {}, "2-D or two 3-D"),
    ("matmul", [(2, 3), (3, 4)], {"act": 7}, "activation code 7"),
    ("conv2d", [(1, 6, 8, 8), (4, 4, 3, 3)], {}, "not a multiple"),
    ("conv2d", [(1, 4, 8, 8), (5, 2, 3, 3)], {}, "not divisible by groups"),
    ("conv2d", [(1, 4, 8, 8), (4, 4, 3, 3)], {"pad": 2}, "padding code 2"),
    ("conv2d", [(1, 4, 2, 2), (4, 4, 3, 3)], {"pad": 1}, "larger than"),
    ("conv2d", [(1, 4, 8, 8), (4, 4, 3, 3)], {"stride_h": 0}, "strides must be positive"),
    ("conv2d", [(4, 8, 8), (4, 4, 3, 3)], {}, "NCHW"),
    ("poolmax", [(1, 2, 4, 4)], {"kernel_h": 5, "kernel_w": 5, "stride_h": 1, "stride_w": 1, "pad": 1},
     "larger than"),
    ("poolavg", [(1, 2, 4, 4)], {"kernel_h": 0, "kernel_w": 2, "stride_h": 1, "stride_w": 1, "pad": 0}, "positive"),
    ("ewadd", [(2, 3), (3, 2)], {}, "same shape"),
    ("ewmul", [(2, 3), (2, 3, 1)], {}, "same shape"),
    ("smul", [(2, 3), (2,)], {}, "scalar"),
    ("concat", [(2, 3), (3, 3)], {"axis": 1}, "agree on every dimension"),
    ("concat", [(2, 3), (2, 3)], {"axis": 2}, "out of range"),
    ("split", [(4, 6)], {"axis": 1, "sizes": (2, 3)}, "add up to 6"),
    ("split", [(4, 6)], {"axis": 1, "sizes": (0, 6)}, "positive"),
    ("slice", [(4, 6)], {"axis": 0, "start": 2, "stop": 5}, "within 4"),
    ("transpose", [(4, 6)], {"perm": (0, 0)}, "not a permutation"),
    ("reshape", [(4, 6)], {"shape": (5, 5)}, "element counts differ"),
    ("batchnorm", [(1, 3, 4, 4), (3,), (3,), (4,), (3,)], {}, "must have shape (3,)"),
    ("enlarge", [(4, 4, 3, 3), (4, 4, 4, 4)], {}, "even amount"),
    ("merge_gconv", [(8, 1, 3, 3)], {"input_shape": (1, 4, 5, 5), "count": 3}, "multiple of count"),
    ("merge_gconv", [(8, 3, 3, 3)], {"input_shape": (1, 4, 5, 5), "count": 1}, "multiple of the kernel"),
    ("relu", [(2, 3), (2, 3)], {}, "takes 1 input"),
    ("concat", [], {"axis": 0}, "at least one input"),
]


@pytest.mark.parametrize("op, shapes, attrs, message", BAD, ids=[f"{b[0]}-{b[3][:20]}" for b in BAD])
def test_shape_inference_rejects_bad_input_naming_the_op(op: str, shapes: list[tuple[int, ...]],
                                                          attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError) as info:
        ops.infer_shapes(op, shapes, attrs)
    assert message in str(info.value)
    assert str(info.value).startswith(op)


def test_attribute_errors_name_the_attribute() -> None:
    with pytest.raises(ShapeError, match="unknown attribute"):
        ops.infer_shapes("matmul", [(2, 3), (3, 4)], {"activation": 1})
    with pytest.raises(ShapeError, match="missing attribute 'sizes'"):
        ops.infer_shapes("split", [(4, 6)], {"axis": 1})
    with pytest.raises(ShapeError, match="'axis' must be int"):
        ops.infer_shapes("concat", [(2, 3)], {"axis": 1.5})


def test_unknown_op_lists_known_ops() -> None:
    with pytest.raises(UnknownOpError, match="unknown op 'fft'.*matmul"):
        ops.infer_shapes("fft", [(2, 3)], {})
    with pytest.raises(UnknownOpError, match="no JAX lowering"):
        lower_node("fft", [], {})


def test_builder_rejects_duplicate_leaf_names_and_bad_leaf_shapes() -> None:
    b = GraphBuilder()
    b.input("x", (2, 3))
    with pytest.raises(ShapeError, match="two leaves are named 'x'"):
        b.weight("x", (2, 3))
    with pytest.raises(ShapeError, match="positive"):
        b.input("y", (2, 0))


# --- numpy semantics == JAX lowering --------------------------------------------------------------

POSITIVE_OPS = frozenset({"log", "sqrt", "rsqrt", "ewdiv", "pow"})  # inputs drawn away from 0 and negatives


def _pool_attrs(kh: int, kw: int, sh: int, sw: int, pad: int, act: int = 0) -> dict[str, int]:
    return dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, pad=pad, act=act)


CASES: Mapping[str, list[Case]] = {
    "ewadd": [([(3, 5), (3, 5)], {})],
    "ewmul": [([(2, 3, 4), (2, 3, 4)], {})],
    "smul": [([(3, 5), (1,)], {}), ([(2, 2), (1, 1)], {})],
    "matmul": [([(4, 6), (6, 3)], {"act": a}) for a in range(4)] + [([(2, 4, 6), (2, 6, 3)], {"act": 2})],
    "conv2d": [([(2, 4, 7, 9), (6, 2, 3, 3)], {"stride_h": 2, "stride_w": 1, "pad": 0, "act": 1}),
               ([(1, 3, 8, 8), (5, 3, 1, 1)], {"stride_h": 1, "stride_w": 1, "pad": 1, "act": 0}),
               ([(1, 4, 9, 9), (4, 1, 3, 3)], {"stride_h": 2, "stride_w": 2, "pad": 0, "act": 2})],
    "conv2d_nhwc": [([(2, 7, 9, 4), (3, 3, 2, 6)], {"stride_h": 2, "stride_w": 1, "pad": 0, "act": 1}),
                    ([(1, 8, 8, 3), (1, 1, 3, 5)], {"stride_h": 1, "stride_w": 1, "pad": 1, "act": 2})],
    "relu": [([(3, 5)], {})],
    "tanh": [([(3, 5)], {})],
    "sigmoid": [([(3, 5)], {})],
    "poolmax": [([(1, 3, 7, 8)], _pool_attrs(3, 3, 2, 2, 0)), ([(2, 2, 6, 6)], _pool_attrs(2, 2, 2, 2, 1, 2))],
    "poolavg": [([(1, 3, 7, 8)], _pool_attrs(3, 3, 2, 2, 0)), ([(1, 2, 13, 13)], _pool_attrs(13, 13, 13, 13, 1, 3))],
    "concat": [([(2, 3), (2, 4), (2, 1)], {"axis": 1}), ([(1, 2, 3)], {"axis": 0})],
    "split": [([(2, 7, 3)], {"axis": 1, "sizes": (2, 4, 1)}), ([(4, 2)], {"axis": 0, "sizes": (4,)})],
    "slice": [([(2, 7, 3)], {"axis": 1, "start": 2, "stop": 6})],
    "transpose": [([(2, 3, 4)], {"perm": (2, 0, 1)})],
    "reshape": [([(2, 3, 4)], {"shape": (4, 6)})],
    "batchnorm": [([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], {"eps": 1e-3}), ([(5, 3), (3,), (3,), (3,), (3,)], {})],
    "enlarge": [([(4, 2, 1, 3), (4, 2, 5, 5)], {})],
    "merge_gconv": [([(8, 1, 3, 3)], {"input_shape": (1, 4, 5, 5), "count": 2}),
                    ([(6, 2, 1, 3)], {"input_shape": (2, 6, 4, 4), "count": 3})],
    # ops that JAX capture added to the registry
    "ewsub": [([(3, 5), (3, 5)], {})],
    "ewdiv": [([(3, 5), (3, 5)], {})],
    "ewmax": [([(3, 5), (3, 5)], {})],
    "exp": [([(3, 5)], {})],
    "log": [([(3, 5)], {})],
    "neg": [([(3, 5)], {})],
    "sqrt": [([(3, 5)], {})],
    "rsqrt": [([(3, 5)], {})],
    "reduce_sum": [([(2, 3, 4)], {"axes": (0, 2)})],
    "reduce_max": [([(2, 3, 4)], {"axes": (1,)})],
    "broadcast": [([(3, 1)], {"shape": (2, 3, 4), "dims": (1, 2)})],
    "ewmin": [([(3, 4), (3, 4)], {})],
    **{op: [([(3, 4)], {})] for op in ("abs", "sin", "cos", "erf", "erfc")},
    "pow": [([(3, 4), (3, 4)], {})],
    # mask and index math (inputs' dtypes in CASE_DTYPES)
    "iota": [([], {"shape": (3, 4), "dimension": 1}), ([], {"shape": (2, 3, 4), "dimension": 0, "dtype": "float32"})],
    **{op: [([(3, 4), (3, 4)], {})] for op in ("lt", "le", "gt", "ge", "eq", "ne", "iadd", "isub", "imul", "imax",
                                               "imin", "and", "or")},
    "select_n": [([(3, 4), (3, 4), (3, 4)], {})],
    "convert_element_type": [([(3, 4)], {"dtype": "int32"}), ([(3, 4)], {"dtype": "bfloat16"})],
    "not": [([(3, 4)], {})],
    "stop_gradient": [([(3, 4)], {})],
    # distribution ops (eqsat.distribution): single-device meaning over the stacked pieces
    "partition": [([(4, 6)], {"dim": -1, "axis": 0, "parts": 2}), ([(4, 6)], {"dim": -2, "axis": 1, "parts": 4})],
    "combine": [([(2, 4, 3)], {"dim": -1, "axis": 0})],
    "replicate": [([(3, 5)], {"axis": 0, "parts": 4})],
    "reduce": [([(4, 3, 5)], {"axis": 0})],
    "all_reduce": [([(4, 3, 5)], {"axis": 0})],
    "all_gather": [([(2, 3, 5)], {"dim": -2, "axis": 0})],
    "reduce_scatter": [([(2, 4, 5)], {"dim": -2, "axis": 0})],
    "all_to_all": [([(2, 4, 6)], {"split_dim": -1, "concat_dim": -2, "axis": 0})],
}


CASE_DTYPES: Mapping[str, tuple[str, ...]] = {
    **{op: ("int32", "int32") for op in ("iadd", "isub", "imul", "imax", "imin", "and", "or")},
    "eq": ("int32", "int32"), "select_n": ("bool", "float32", "float32"), "not": ("bool",),
}
"""Input dtypes of the ops whose cases do not take float32 (integer and boolean ops)."""


def _arrays(op: str, shapes: Sequence[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if op in CASE_DTYPES:
        kinds = CASE_DTYPES[op]
        return [a if d == "float32" else (a > 0) if d == "bool" else rng.integers(-5, 5, a.shape).astype(d)
                for a, d in zip(arrays, kinds)]
    if op in POSITIVE_OPS:
        return [np.abs(a) + 0.5 for a in arrays]
    if op == "batchnorm":  # the variance must be positive
        return arrays[:4] + [np.abs(arrays[4]) + 0.5]
    return arrays


def _check_same(op: str, shapes: Sequence[tuple[int, ...]], attrs: Mapping[str, Any], seed: int = 0) -> None:
    xs = _arrays(op, shapes, seed)
    expected_shapes = ops.infer_shapes(op, shapes, attrs)
    want = ops.evaluate(op, xs, attrs)
    got = lower_node(op, [jax.numpy.asarray(x) for x in xs], attrs)
    assert len(want) == len(got) == len(expected_shapes)
    for w, g, s in zip(want, got, expected_shapes):
        assert w.shape == tuple(g.shape) == s
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5, err_msg=f"{op} {shapes} {dict(attrs)}")


def test_every_op_has_a_lowering_and_a_test_case() -> None:
    computed = {name for name, spec in ops.OPS.items() if not spec.is_leaf}
    assert computed - set(LOWERINGS) == set(), "ops without a JAX lowering"
    assert computed - set(CASES) == set(), "ops without a numerics case in tests/test_ops.py"


@pytest.mark.parametrize("op, shapes, attrs", [(op, s, a) for op, cases in CASES.items() for s, a in cases],
                         ids=[f"{op}-{i}" for op, cases in CASES.items() for i in range(len(cases))])
def test_lowering_matches_numpy(op: str, shapes: Sequence[tuple[int, ...]], attrs: Mapping[str, Any]) -> None:
    _check_same(op, shapes, attrs)


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], dict[str, int]]:
    groups = draw(st.sampled_from([1, 2, 3]))
    cin_per_group = draw(st.integers(1, 3))
    cout_per_group = draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pad = draw(st.sampled_from([0, 1]))
    h, w = draw(st.integers(kh, 10)), draw(st.integers(kw, 10))
    x = (draw(st.integers(1, 2)), groups * cin_per_group, h, w)
    wt = (groups * cout_per_group, cin_per_group, kh, kw)
    return [x, wt], dict(stride_h=sh, stride_w=sw, pad=pad, act=draw(st.integers(0, 3)))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases(), st.integers(0, 2**16))
def test_conv_grouped_strided_same_valid_matches_numpy(case: tuple[list[tuple[int, ...]], dict[str, int]],
                                                       seed: int) -> None:
    shapes, attrs = case
    _check_same("conv2d", shapes, attrs, seed)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases(), st.integers(0, 2**16))
def test_conv_nhwc_matches_its_lowering_and_the_nchw_conv(case: tuple[list[tuple[int, ...]], dict[str, int]],
                                                          seed: int) -> None:
    """conv2d_nhwc's numpy meaning equals its JAX lowering, and equals conv2d on the NCHW / OIHW views."""
    (x, w), attrs = case
    shapes = [(x[0], x[2], x[3], x[1]), (w[2], w[3], w[1], w[0])]
    _check_same("conv2d_nhwc", shapes, attrs, seed)
    xs = _arrays("conv2d_nhwc", shapes, seed)
    (nhwc,) = ops.evaluate("conv2d_nhwc", xs, attrs)
    (nchw,) = ops.evaluate("conv2d", [xs[0].transpose(ops.NHWC_OUT), xs[1].transpose(3, 2, 0, 1)], attrs)
    np.testing.assert_allclose(nhwc, nchw.transpose(ops.NHWC_IN), rtol=1e-5, atol=1e-5)
    assert ops.flops("conv2d_nhwc", shapes, attrs) == ops.flops("conv2d", [x, w], attrs)


@st.composite
def pool_cases(draw: st.DrawFn) -> tuple[str, list[tuple[int, ...]], dict[str, int]]:
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h, w = draw(st.integers(kh, 9)), draw(st.integers(kw, 9))
    attrs = _pool_attrs(kh, kw, draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([0, 1])),
                        draw(st.integers(0, 3)))
    return draw(st.sampled_from(["poolmax", "poolavg"])), [(1, draw(st.integers(1, 3)), h, w)], attrs


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_cases(), st.integers(0, 2**16))
def test_pooling_same_valid_matches_numpy(case: tuple[str, list[tuple[int, ...]], dict[str, int]], seed: int) -> None:
    op, shapes, attrs = case
    _check_same(op, shapes, attrs, seed)


def test_avgpool_counts_padding_as_zeros() -> None:
    x = np.ones((1, 1, 2, 2), np.float32)
    attrs = _pool_attrs(3, 3, 1, 1, 0)
    want = np.full((1, 1, 2, 2), 4 / 9, np.float32)
    np.testing.assert_allclose(ops.evaluate("poolavg", [x], attrs)[0], want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lower_node("poolavg", [jax.numpy.asarray(x)], attrs)[0]), want, rtol=1e-6)


def test_same_padding_is_tensorflow_asymmetric() -> None:
    """Even total padding splits evenly; odd puts the extra row/column at the bottom/right."""
    assert ops.window_out_and_pads(224, 3, 2, 0) == (112, 0, 1)
    assert ops.window_out_and_pads(7, 3, 1, 0) == (7, 1, 1)
    assert ops.window_out_and_pads(7, 3, 2, 1) == (3, 0, 0)


# --- whole random graphs --------------------------------------------------------------------------

UNARY = ("relu", "tanh", "sigmoid")
BINARY = ("ewadd", "ewmul")


@st.composite
def random_graphs(draw: st.DrawFn) -> Any:
    """Random DAGs over (n, n) tensors: unary, binary, matmul (with act), concat+split round trips."""
    n = draw(st.integers(1, 5))
    b = GraphBuilder()
    pool = [b.input("x", (n, n)), b.input("y", (n, n))]
    for k in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "concat-split", "transpose"]))
        a = draw(st.sampled_from(pool))
        if kind == "unary":
            pool.append(b.apply(draw(st.sampled_from(UNARY)), [a])[0])
        elif kind == "binary":
            pool.append(b.apply(draw(st.sampled_from(BINARY)), [a, draw(st.sampled_from(pool))])[0])
        elif kind == "matmul":
            w = b.weight(f"w{k}", (n, n))
            pool.append(b.matmul(a, w, act=draw(st.integers(0, 3))))
        elif kind == "transpose":
            pool.append(b.transpose(a, (1, 0)))
        else:
            axis = draw(st.integers(0, 1))
            joined = b.concat(axis, a, draw(st.sampled_from(pool)))
            pool.append(b.split(joined, axis, (n, n))[draw(st.integers(0, 1))])
    outs = draw(st.lists(st.sampled_from(pool[2:] or pool), min_size=1, max_size=3))
    return b.build(outs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.integers(0, 2**16))
def test_lowered_random_graphs_match_the_interpreter(graph: Any, seed: int) -> None:
    inputs = graph.random_inputs(seed)
    want = graph.evaluate(inputs)
    got = to_jax(graph)({k: jax.numpy.asarray(v) for k, v in inputs.items()})
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)


def test_to_jax_rejects_missing_or_misshapen_inputs() -> None:
    b = GraphBuilder()
    x = b.input("x", (2, 3))
    g = b.build([b.relu(x)])
    fn = to_jax(g)
    with pytest.raises(ShapeError, match="no value given for input 'x'"):
        fn({})
    with pytest.raises(ShapeError, match=r"input 'x' has shape \(2, 3\), given \(3, 2\)"):
        fn({"x": np.zeros((3, 2), np.float32)})


# --- weight derivation (the one definition of weight folding) --------------------------------------

# key, op, child keys: w1, w2 weights, x an input; "wc" concat of weights, "wr" a weight replicated then
# partitioned (moved only), "xw" a product with data, "rw" a relu of a moved weight
_NODES = [("w1", "weight", []), ("w2", "weight", []), ("x", "input", []), ("wc", "concat", ["w1", "w2"]),
          ("rep", "replicate", ["w1"]), ("wr", "partition", ["rep"]), ("xw", "matmul", ["x", "wc"]),
          ("rw", "relu", ["wr"]), ("rx", "replicate", ["x"])]


def test_weight_derived_folds_through_any_op_and_moves_only_through_distribution_ops() -> None:
    assert ops.weight_derived(_NODES) == {"w1", "w2", "wc", "rep", "wr", "rw"}
    assert ops.weight_derived(_NODES, moved_only=True) == {"w1", "w2", "rep", "wr"}
    assert ops.weight_derived(reversed(_NODES)) == ops.weight_derived(_NODES)  # any order: a fixpoint


def test_weight_derived_takes_a_class_when_one_of_its_nodes_is() -> None:
    # e-class "c" holds relu(x) and concat(w1, w2): it folds; "d" = relu(c) then folds too
    nodes = [("w1", "weight", []), ("w2", "weight", []), ("x", "input", []), ("d", "relu", ["c"]),
             ("c", "relu", ["x"]), ("c", "concat", ["w1", "w2"])]
    assert ops.weight_derived(nodes) == {"w1", "w2", "c", "d"}


def test_weight_derivation_facts() -> None:
    kinds = {name: spec.weight_derivation for name, spec in ops.OPS.items()}
    assert kinds["weight"] == "weight" and kinds["input"] == "never"
    assert {n for n, k in kinds.items() if k == "moves"} == ops.DISTRIBUTION_OPS
    assert kinds["matmul"] == kinds["concat"] == "computes"

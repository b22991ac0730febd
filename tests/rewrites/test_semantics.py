"""The one op table, run over the prime field and over polynomials, agrees with the registry."""

import numpy as np
import pytest

from eqsat import ops
from eqsat.rewrites import parse_rule_text
from eqsat.rewrites.semantics import FieldAlgebra, Poly, PolyAlgebra, evaluate_numpy, evaluate_pattern, poly_eval

CASES = [
    ("(conv2d 1 1 0 0 ?x ?w)", {"x": (1, 2, 4, 3), "w": (3, 2, 3, 3)}),
    ("(conv2d 2 2 0 0 ?x ?w)", {"x": (2, 4, 4, 4), "w": (2, 2, 3, 3)}),  # grouped, stride 2, SAME
    ("(conv2d 2 1 1 0 ?x ?w)", {"x": (1, 2, 4, 3), "w": (2, 1, 1, 3)}),  # VALID, groups 2
    ("(matmul 0 ?a ?b)", {"a": (2, 3, 4), "b": (2, 4, 1)}),
    ("(concat 1 2 (transpose [1 0] ?a) ?b)", {"a": (3, 2), "b": (2, 1)}),
    ("(poolavg ?x 3 3 1 1 0 0)", {"x": (1, 1, 3, 4)}),
    ("(slice 0 1 3 (ewmul ?a ?b))", {"a": (4, 2), "b": (4, 2)}),
]


@pytest.mark.parametrize("text, shapes", CASES)
def test_field_semantics_match_registry_on_small_integers(text: str, shapes: dict) -> None:
    pattern = parse_rule_text(f"{text} => {text}")[0].lhs[0]
    rng = np.random.default_rng(0)
    ints = {k: rng.integers(0, 5, size=s) for k, s in shapes.items()}
    alg = FieldAlgebra()
    got = evaluate_pattern(pattern, {k: v.astype(np.int64) for k, v in ints.items()}, alg)
    want = evaluate_numpy(pattern, {k: v.astype(np.float64) for k, v in ints.items()})
    if "poolavg" in text:  # the field divides by 9 modulo p: compare 9 * result
        got, want = got * 9 % alg.p, want * 9
    np.testing.assert_array_equal(got, np.rint(want).astype(np.int64) % alg.p)


@pytest.mark.parametrize("text, shapes", CASES[:4])
def test_polynomial_semantics_match_registry(text: str, shapes: dict) -> None:
    pattern = parse_rule_text(f"{text} => {text}")[0].lhs[0]
    alg = PolyAlgebra()
    symbolic = evaluate_pattern(pattern, {k: alg.symbols(k, s) for k, s in shapes.items()}, alg)
    rng = np.random.default_rng(1)
    values = {k: rng.normal(size=s) for k, s in shapes.items()}
    atoms = {i: values[arg[0]][arg[1]] for i, (kind, arg) in enumerate(alg.atoms) if kind == "input"}
    got = np.vectorize(lambda p: poly_eval(p, atoms))(symbolic)
    np.testing.assert_allclose(got, evaluate_numpy(pattern, values), rtol=1e-9, atol=1e-9)


def test_relu_atoms_are_canonical() -> None:
    alg = PolyAlgebra()
    x, y = alg.symbols("x", (1,)), alg.symbols("y", (1,))
    assert alg.activation("relu", x + y)[0] == alg.activation("relu", y + x)[0]
    assert (x * (y + x))[0] == (x * x + y * x)[0] and Poly({}) == Poly({(): 0})


def test_activation_codes_cover_registry() -> None:
    for act in ops.Activation:
        assert act is ops.Activation.NONE or ops.OPS[act.op_name].is_unary_elementwise


NEW_OP_CASES = [
    ("(ewsub ?a (neg ?b))", {"a": (2, 3), "b": (2, 3)}),
    ("(broadcast [2 3 4] [1] ?a)", {"a": (3,)}),
    ("(broadcast [2 3] [0 1] ?a)", {"a": (1, 3)}),
    ("(reduce_sum [0 2] ?a)", {"a": (2, 3, 2)}),
    ("(ewmax ?a ?b)", {"a": (3,), "b": (3,)}),
]


@pytest.mark.parametrize("text, shapes", NEW_OP_CASES)
def test_new_ops_match_registry(text: str, shapes: dict) -> None:
    pattern = parse_rule_text(f"{text} => {text}")[0].lhs[0]
    rng = np.random.default_rng(2)
    ints = {k: rng.integers(-4, 5, size=s) for k, s in shapes.items()}
    want = evaluate_numpy(pattern, {k: v.astype(np.float64) for k, v in ints.items()})
    alg = FieldAlgebra()
    got = evaluate_pattern(pattern, {k: (v % alg.p).astype(np.int64) for k, v in ints.items()}, alg)
    if "ewmax" not in text:  # the field's max is an opaque symmetric function
        np.testing.assert_array_equal(got, np.rint(want).astype(np.int64) % alg.p)
    poly = PolyAlgebra()
    symbolic = evaluate_pattern(pattern, {k: poly.symbols(k, s) for k, s in shapes.items()}, poly)
    assert symbolic.shape == want.shape
    if "ewmax" not in text:
        atoms = {i: ints[arg[0]][arg[1]] for i, (kind, arg) in enumerate(poly.atoms) if kind == "input"}
        np.testing.assert_allclose(np.vectorize(lambda p: poly_eval(p, atoms))(symbolic), want)


def test_padded_poolmax_is_exact_over_polynomials() -> None:
    pattern = parse_rule_text("(poolmax ?x 3 3 2 2 0 0) => ?x")[0].lhs[0]  # SAME: padded windows
    alg = PolyAlgebra()
    symbolic = evaluate_pattern(pattern, {"x": alg.symbols("x", (1, 2, 4, 3))}, alg)
    values = np.random.default_rng(3).normal(size=(1, 2, 4, 3))
    import z3

    from eqsat.rewrites.concrete import _to_z3

    cache: dict = {}
    model_values = {f"x{list(idx)}": float(values[idx]) for idx in np.ndindex(*values.shape)}
    want = evaluate_numpy(pattern, {"x": values})
    for idx in np.ndindex(*symbolic.shape):
        expr = z3.substitute(_to_z3(symbolic[idx], alg, cache),
                             *[(z3.Real(k), z3.RealVal(v)) for k, v in model_values.items()])
        got = z3.simplify(expr)
        assert abs(float(got.as_fraction()) - want[idx]) < 1e-9

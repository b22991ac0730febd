"""The verifier decides true rules as proved, wrong rules as refuted with a usable counterexample."""

import numpy as np
import pytest

from eqsat.rewrites import library_rules, parse_rule_text
from eqsat.rewrites.semantics import evaluate_numpy, rule_split_sizes
from eqsat.rewrites.verify import VerifyOptions, verified_rules, verify_concrete, verify_rule, verify_rules
from eqsat.rewrites.derive import axiom_base


def rule(text: str):
    return parse_rule_text(text, "test")[0]


# True rules that are not in the library, one per proof path.
TRUE_RULES = [
    "(ewmul (ewadd ?a ?b) (ewadd ?a ?b)) => (ewadd (ewmul ?a (ewadd ?a ?b)) (ewmul ?b (ewadd ?b ?a)))",
    "(transpose [1 0] (matmul 0 (matmul 0 ?a ?b) ?c)) => "
    "(matmul 0 (transpose [1 0] ?c) (matmul 0 (transpose [1 0] ?b) (transpose [1 0] ?a)))",
    "(relu (ewadd (relu ?x) (relu ?x))) => (ewadd (relu ?x) (relu ?x))",  # needs relu's meaning: z3
    "(conv2d 2 2 0 2 (ewadd ?x ?y) ?w) => (relu (ewadd (conv2d 2 2 0 0 ?x ?w) (conv2d 2 2 0 0 ?y ?w)))",
    "(tanh (concat 0 2 ?a ?b)) => (concat 0 2 (tanh ?a) (tanh ?b))",
    "(matmul 0 ?a ?b) ; (matmul 0 ?c ?b) => (split_0 (split 0 (matmul 0 (concat 0 2 ?a ?c) ?b))) ; "
    "(split_1 (split 0 (matmul 0 (concat 0 2 ?a ?c) ?b))) if (= (rank ?a) 2)",
    "(ewmax (ewmax ?a ?b) ?c) => (ewmax ?a (ewmax ?c ?b))",  # max is associative: a polynomial identity
    "(ewmax ?a (ewmax ?a ?b)) => (ewmax ?b ?a)",  # and idempotent
]

# Wrong rules, each with what the counterexample must show.
WRONG_RULES = [
    ("(matmul 0 ?a ?b) => (matmul 0 ?b ?a)", None),
    ("(relu (ewadd ?x ?y)) => (ewadd (relu ?x) (relu ?y))", "inputs"),
    ("(transpose [1 0] (matmul 0 ?a ?b)) => (matmul 0 (transpose [1 0] ?a) (transpose [1 0] ?b))", None),
    ("(conv2d 1 1 0 0 ?x ?w) => (conv2d 1 1 1 0 ?x ?w)", "shapes"),  # SAME vs VALID
    ("(conv2d 1 1 0 0 (concat 1 4 ?x ?y) (concat 1 4 ?w ?v)) => (ewadd (conv2d 1 1 0 0 ?x ?w) (conv2d 1 1 0 0 ?y ?v))"
     " if (= (dim ?w 2) (dim ?v 2)) (= (dim ?w 3) (dim ?v 3))", None),  # wrong for grouped convs
    ("(concat 0 2 ?a ?b) => (concat 0 2 ?b ?a)", "inputs"),
    ("(ewmul (sigmoid ?x) ?y) => (ewmul (tanh ?x) ?y)", "inputs"),
    # a separable pool whose row pass is one row short: same shape, different values
    ("(poolmax ?x 3 3 1 1 0 0) => (poolmax (poolmax ?x 1 3 1 1 0 0) 2 1 1 1 0 0)", "inputs"),
    ("(poolavg ?x 3 3 1 1 0 0) => (poolavg (poolmax ?x 1 3 1 1 0 0) 3 1 1 1 0 0)", "inputs"),  # max for mean
    ("(ewmax (ewadd ?a ?b) ?c) => (ewadd ?a (ewmax ?b ?c))", "inputs"),
]


@pytest.mark.parametrize("text", TRUE_RULES)
def test_true_rules_are_proved(text: str) -> None:
    result = verify_rule(rule(text), axioms=())
    assert result.status == "proved", result
    assert result.scope.startswith("tested on") and result.shapes and result.verdict == "tested"


@pytest.mark.parametrize("text, needs", WRONG_RULES)
def test_wrong_rules_are_refuted_with_a_counterexample(text: str, needs: str | None) -> None:
    r = rule(text)
    result = verify_concrete(r)
    assert result.status == "refuted", result
    cex = result.counterexample
    assert cex is not None and "shapes" in cex
    if needs:
        assert needs in cex
    if "inputs" in cex and "lhs" in cex:  # replay: the sides really differ on those inputs
        env = {k: tuple(v) for k, v in cex["shapes"].items()}
        values = {k: np.asarray(v, dtype=np.float64).reshape(env[k]) for k, v in cex["inputs"].items()}
        sizes = rule_split_sizes(r, env)
        i = cex["side"]
        assert not np.allclose(evaluate_numpy(r.lhs[i], values, sizes), evaluate_numpy(r.rhs[i], values, sizes))


def test_shape_changing_rule_is_refuted_with_shapes() -> None:
    result = verify_concrete(rule("(matmul 0 ?a ?b) => (matmul 0 (transpose [1 0] ?b) (transpose [1 0] ?a))"))
    assert result.status == "refuted" and result.method == "shapes"
    assert "right shape" in result.counterexample["reason"] or "ill-typed" in result.counterexample["reason"]


def test_z3_refutes_a_relu_identity_that_polynomials_cannot_decide() -> None:
    result = verify_concrete(rule("(relu (ewadd ?x (relu ?x))) => (ewadd (relu ?x) (relu ?x))"), VerifyOptions())
    assert result.status == "proved"  # relu(x + relu x) = 2 relu x holds: only z3 knows
    wrong = verify_concrete(rule("(relu (ewadd ?x (relu ?x))) => (relu ?x)"))
    assert wrong.status == "refuted"


def test_unsupported_op_is_unknown_with_reason() -> None:
    result = verify_concrete(rule("(poolmax ?x 3 3 1 1 0 0) => (poolmax ?x 3 3 1 1 0 0)"))
    assert result.status in ("proved", "unknown")
    if result.status == "unknown":
        assert result.counterexample["reason"]


def test_every_shipped_rule_is_proved() -> None:
    rules = library_rules()
    results = verify_rules(rules)  # the default options: the session cache shares them with the other tests
    bad = [(r.name, res.status, res.counterexample) for r, res in zip(rules, results) if not res.proved]
    assert not bad
    # TASO's operator properties are algebra over the axioms: most must be proved for all shapes
    # (merges and folding use concat / broadcast shapes the axioms do not cover, so they stay
    # proved on the listed shapes).
    properties = [res for r, res in zip(rules, results) if r.source.startswith("properties.rules")]
    assert sum(res.scope == "all shapes" for res in properties) >= 2 * len(properties) // 3


@pytest.mark.parametrize("name", ["poolmax-separable-3x3-s1-same", "poolmax-separable-3x3-s2-same",
                                  "poolmax-separable-3x3-s1-valid", "poolmax-separable-2x2-s2-valid",
                                  "poolavg-separable-3x3-s2-same", "poolavg-separable-3x3-s1-valid"])
def test_separable_pools_are_identities_on_maps_with_interior_windows(name: str) -> None:
    """The verifier's grid (dims up to 4) barely holds a 3x3 window; on a 7x6 map every kind of
    window (corner, edge, interior) occurs, and the two sides are the same max atoms."""
    from eqsat.rewrites.concrete import prove_on

    r = next(r for r in library_rules(["decompositions"]) if r.name == name)
    assert prove_on(r, {"x": (1, 2, 7, 6)}, VerifyOptions()) == "polynomial identity"


def test_verified_rules_drops_refuted_unless_opted_in() -> None:
    good = rule("(ewadd ?a ?b) => (ewadd ?b ?a)")
    bad = rule("(ewadd ?a ?b) => (ewmul ?b ?a)")
    assert verified_rules([good, bad]) == [good]


def test_axiom_base_is_fully_proved() -> None:
    from eqsat.rewrites.derive import axiom_templates

    assert len(axiom_base()) == len(axiom_templates())


def test_folding_that_forgets_the_mean_is_refuted() -> None:
    wrong = rule("(batchnorm ?eps (matmul 0 ?x ?w) ?s ?b ?m ?v) => (ewadd (matmul 0 ?x (batchnorm ?eps ?w ?s "
                 "(ewsub ?m ?m) (ewsub ?m ?m) ?v)) (broadcast (shape (matmul 0 ?x ?w)) [1] ?b)) if (= (rank ?x) 2)")
    result = verify_concrete(wrong)
    assert result.status == "refuted" and result.method != "shapes" and result.guarded_status == "refuted"


def test_gating_without_the_all_shapes_attempt_admits_the_same_tested_rules(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path) -> None:
    """`all_shapes=False` skips widening a proof's scope: with tested rules admitted the same rules
    pass, no axiom base is built, and an all-shapes result already cached is reused."""
    import eqsat.rewrites.verify as verify
    from eqsat.rewrites.verify import verify_rules

    rules = library_rules(("fusion",))
    built: list[int] = []
    original = verify.axiom_base
    monkeypatch.setattr(verify, "axiom_base", lambda *a, **k: built.append(1) or original(*a, **k))
    quick = verified_rules(rules, all_shapes=False, allow_tested=True)
    assert not built
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))  # a fresh cache for the full verification
    full = verified_rules(rules, allow_tested=True)
    assert built and [r.name for r in quick] == [r.name for r in full]
    assert set(verified_rules(rules)) <= set(full)
    built.clear()
    reused = verify_rules(rules, all_shapes=False)
    assert not built and any(res.scope == "all shapes" for res in reused)

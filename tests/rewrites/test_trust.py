"""Trusted means proved for every shape (issue 27): a rule proved only on the tested shapes is
`tested`, never trusted by default; adversarial shapes drawn from a rule's attributes refute the
rules that are wrong only where the likely shapes do not reach; and wrong rules made by varying an
attribute of a true rule are refuted or at least not trusted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eqsat import ops
from eqsat.rewrites import library_rules, parse_rule_text
from eqsat.rewrites.concrete import TESTED, VerifyOptions
from eqsat.rewrites.mutate import mutants
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.semantics import evaluate_numpy, rule_split_sizes
from eqsat.rewrites.shapes import ShapeChecker, adversarial_assignments, attribute_dims, op_corners
from eqsat.rewrites.verify import verify_rule, verify_rules
from eqsat.rulesets import is_trusted, scope, trusted_rules


def rule(text: str) -> Rule:
    return parse_rule_text(text, "test")[0]


ENLARGE_S2 = "(conv2d 2 2 0 0 ?x (enlarge ?w ?v)) => (conv2d 2 2 0 0 ?x ?w)"
ENLARGE_S3 = "(conv2d 3 3 0 0 ?x (enlarge ?w ?v)) => (conv2d 3 3 0 0 ?x ?w)"


def test_the_issues_counterexample_is_real() -> None:
    """x = arange(16) as 1x1x4x4, a 1x1 kernel of ones enlarged to 3x3: stride 2 SAME reads other pixels."""
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    w, v = np.ones((1, 1, 1, 1)), np.zeros((1, 1, 3, 3))
    conv = {"stride_h": 2, "stride_w": 2, "pad": 0, "act": 0}
    (big,) = ops.evaluate("enlarge", [w, v], {})
    (lhs,) = ops.evaluate("conv2d", [x, big], conv)
    (rhs,) = ops.evaluate("conv2d", [x, w], conv)
    assert lhs[0, 0].tolist() == [[5, 7], [13, 15]] and rhs[0, 0].tolist() == [[0, 2], [8, 10]]


@pytest.mark.parametrize("text", [ENLARGE_S2, ENLARGE_S3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_false_strided_enlarge_rules_are_refuted_with_a_counterexample(text: str, seed: int) -> None:
    r = rule(text)
    result = verify_rule(r, VerifyOptions(seed=seed))
    assert result.status == "refuted" and result.method != "shapes", result
    assert not is_trusted(result) and not is_trusted(result, trust_tested=True)
    cex = result.counterexample
    env = {k: tuple(s) for k, s in cex["shapes"].items()}
    values = {k: np.asarray(a, dtype=np.float64).reshape(env[k]) for k, a in cex["inputs"].items()}
    sizes = rule_split_sizes(r, env)
    assert not np.allclose(evaluate_numpy(r.lhs[0], values, sizes), evaluate_numpy(r.rhs[0], values, sizes))


def test_the_same_rule_at_stride_1_is_not_refuted() -> None:
    result = verify_rule(rule("(conv2d 1 1 0 0 ?x (enlarge ?w ?v)) => (conv2d 1 1 0 0 ?x ?w)"))
    assert result.status == "proved"


def test_adversarial_shapes_come_from_the_attributes() -> None:
    r = rule(ENLARGE_S2)
    assert {2, 3, 4, 5} <= set(attribute_dims(r)) and 1 in attribute_dims(r)  # both residues mod 2, size 1
    corners = op_corners(r)
    assert {"x": {-2: 4, -1: 4}, "w": {-2: 1, -1: 1}, "v": {-2: 3, -1: 3}} in corners  # all at once
    envs = adversarial_assignments(r, 16, seed=0)
    checker = ShapeChecker(r)
    assert envs and all(checker.lhs_shapes(e) is not None for e in envs)
    assert any(e["w"][2] < e["v"][2] and e["x"][2] % 2 == 0 for e in envs)  # unequal kernels, clipped SAME
    concat = rule("(concat 1 2 (ewadd ?a ?b) (ewadd ?c ?d)) => (ewadd (concat 1 2 ?a ?c) (concat 1 2 ?b ?d))")
    assert {"a": {1: 1}, "c": {1: 3}} in op_corners(concat)  # uneven pieces along the axis


TESTED_ONLY = "(sqrt (ewadd (relu ?x) (relu ?x))) => (sqrt (relu (ewadd ?x ?x)))"


def test_a_rule_proved_only_on_tested_shapes_is_tested_not_trusted() -> None:
    # sqrt(relu(x) + relu(x)) = sqrt(relu(x + x)): no axiom derives it and sqrt has no symbolic
    # semantics, so it is proved on the tested shapes only
    r = rule(TESTED_ONLY)
    result = verify_rule(r)
    assert result.status == "proved" and result.verdict == TESTED
    assert result.scope.startswith("tested on ") and scope(result) == result.scope
    assert not is_trusted(result) and is_trusted(result, trust_tested=True)
    assert trusted_rules([r]) == []
    with pytest.warns(UserWarning, match="proved only on tested shapes.*test"):
        assert trusted_rules([r], trust_tested=True) == [r]


def test_a_rule_derived_from_axioms_is_proved_for_all_shapes_and_trusted() -> None:
    result = verify_rule(rule("(ewadd ?a (ewadd ?b ?c)) => (ewadd (ewadd ?c ?b) ?a)"))
    assert (result.verdict, result.scope) == ("proved", "all shapes") and is_trusted(result)


def test_rules_verify_reports_scope_method_time_and_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eqsat.cli import main

    path = tmp_path / "t.rules"
    path.write_text(f"s2: {ENLARGE_S2}\ncomm: (ewadd ?a ?b) => (ewadd ?b ?a)\ndouble: {TESTED_ONLY}\n")
    assert main(["rules", "verify", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["refuted"], out["proved_all_shapes"], out["tested"], out["trusted"]) == (1, 1, 1, 1)
    rows = {r["name"]: r for r in out["rules"]}
    assert rows["comm"]["policy_scope"] == "all shapes" and rows["comm"]["trusted"]
    assert rows["double"]["policy_scope"].startswith("tested on ") and not rows["double"]["trusted"]
    assert "no symbolic semantics for sqrt" in rows["double"]["resists"] and "resists" not in rows["comm"]
    assert all(r["method"] and r["seconds"] >= 0 for r in out["rules"])
    with pytest.warns(UserWarning, match="double"):
        assert main(["rules", "verify", str(path), "--json", "--trust-tested"]) == 0
    assert json.loads(capsys.readouterr().out)["trusted"] == 2


def _strided_enlarge_mutants() -> list[Rule]:
    rules = [r for r in library_rules() if "enlarge" in r.name or "extend" in r.name]
    return [m for r in rules for m in mutants(r) if "~conv2d.stride" in m.name]


def test_every_strided_mutant_of_an_enlarge_rule_is_refuted() -> None:
    found = _strided_enlarge_mutants()
    assert len(found) >= 32
    results = verify_rules(found)
    wrong = [(m.name, res.status, res.method) for m, res in zip(found, results) if res.status != "refuted"]
    assert not wrong


def _check_mutants(every: int, at_least: int) -> None:
    """Every `every`-th mutant of the library (strides, pads, windows, axes, permutations varied):
    none is trusted unless proved for all shapes, and most are refuted outright."""
    found = [m for r in library_rules() for m in mutants(r)][::every]
    assert len(found) >= at_least
    results = verify_rules(found)
    for m, res in zip(found, results):
        assert not is_trusted(res) or scope(res) == "all shapes", m.name
    refuted = sum(res.status == "refuted" and res.guarded_status != "proved" for res in results)
    assert refuted >= len(found) // 2, refuted


def test_mutants_of_true_rules_are_refuted_or_not_trusted() -> None:
    _check_mutants(every=64, at_least=30)


@pytest.mark.slow
def test_many_mutants_of_true_rules_are_refuted_or_not_trusted() -> None:
    _check_mutants(every=4, at_least=400)


SYMBOLIC_TRUE = [
    "(transpose [1 0] (matmul 0 ?a ?b)) => (matmul 0 (transpose [1 0] ?b) (transpose [1 0] ?a))",
    "(transpose [1 0] (concat 0 2 ?a ?b)) => (concat 1 2 (transpose [1 0] ?a) (transpose [1 0] ?b))",
    "(sigmoid (matmul 0 ?a ?b)) => (matmul 1 ?a ?b)",
    "(concat 1 2 (concat 1 2 ?a ?b) ?c) => (concat 1 2 ?a (concat 1 2 ?b ?c))",
    "(matmul 0 ?a ?b) ; (matmul 0 ?a ?c) => (split_0 (split 1 (matmul 0 ?a (concat 1 2 ?b ?c)))) ; "
    "(split_1 (split 1 (matmul 0 ?a (concat 1 2 ?b ?c)))) if (= (rank ?a) 2)",
    "(ewadd (matmul 0 ?a ?b) (matmul 0 ?c ?d)) => (matmul 0 (concat 1 2 ?a ?c) (concat 0 2 ?b ?d)) if (= (rank ?a) 2)",
]
SYMBOLIC_FALSE = [
    "(ewadd (matmul 0 ?a ?b) (matmul 0 ?c ?d)) => (matmul 0 (concat 1 2 ?c ?a) (concat 0 2 ?b ?d)) if (= (rank ?a) 2)",
    "(transpose [1 0] (concat 0 2 ?a ?b)) => (concat 0 2 (transpose [1 0] ?a) (transpose [1 0] ?b))",
    "(sigmoid (matmul 0 ?a ?b)) => (matmul 3 ?a ?b)",
    "(concat 1 2 (concat 1 2 ?a ?b) ?c) => (concat 1 2 ?b (concat 1 2 ?a ?c))",
    "(matmul 0 ?a ?b) ; (matmul 0 ?a ?c) => (split_1 (split 1 (matmul 0 ?a (concat 1 2 ?b ?c)))) ; "
    "(split_0 (split 1 (matmul 0 ?a (concat 1 2 ?b ?c)))) if (= (rank ?a) 2)",
    "(relu (ewadd ?a ?b)) => (ewadd (relu ?a) (relu ?b))",
]


@pytest.mark.parametrize("text", SYMBOLIC_TRUE)
def test_symbolic_prover_proves_index_rules_for_every_shape(text: str) -> None:
    from eqsat.rewrites.symbolic import prove_symbolic

    r = rule(text)
    assert prove_symbolic(r) is not None and prove_symbolic(r, guarded=True) is not None
    result = verify_rule(r)
    assert (result.verdict, result.scope) == ("proved", "all shapes") and is_trusted(result)


@pytest.mark.parametrize("text", SYMBOLIC_FALSE)
def test_symbolic_prover_proves_nothing_false(text: str) -> None:
    from eqsat.rewrites.symbolic import prove_symbolic

    assert prove_symbolic(rule(text)) is None


def test_symbolic_prover_says_why_a_rule_resists() -> None:
    from eqsat.rewrites.symbolic import prove_symbolic, why_not

    r = rule(ENLARGE_S2)
    assert why_not(r) is None and prove_symbolic(r) is None  # modelled (conv2d, enlarge), and false
    assert "sqrt" in (why_not(rule(TESTED_ONLY)) or "")
    assert why_not(rule("(ewadd ?a ?b) => (ewadd ?b ?a)")) is None  # rank-polymorphic, but elementwise:
    assert "rank 1 stands for every" in (prove_symbolic(rule("(ewadd ?a ?b) => (ewadd ?b ?a)")) or "")
    unbounded = rule("(transpose [1 0] (transpose [1 0] ?x)) => ?x")  # rank 2 only: proved
    assert prove_symbolic(unbounded) is not None


def test_library_and_tensat_proved_for_all_shapes_counts() -> None:
    """The share of the library proved for all shapes (45 of 138 before symbolic shapes, 71 before conv,
    84 before pools, broadcasts, batchnorm and channel groups): strictly, or under the guard (trusted)."""
    results = verify_rules(library_rules())
    assert sum(res.verdict == "proved" for res in results) >= 110
    assert sum(map(is_trusted, results)) >= 132

"""Guarded validity (equal wherever the applier's right-side type guard passes) and the cache."""

import numpy as np
import pytest

from eqsat.rewrites import parse_rule_text
from eqsat.rewrites.semantics import evaluate_numpy, pattern_shape, rule_split_sizes
from eqsat.rewrites.shapes import ShapeChecker
from eqsat.rewrites.verify import VerifyOptions, verified_rules, verify_rule, verify_rules


def rule(text: str):
    return parse_rule_text(text, "test")[0]


# Tensat-style: right side ill-typed unless ?a and ?c have one shape, and then equal.
SWAP = rule("(ewadd (concat 1 2 ?a ?b) (concat 1 2 ?c ?d)) => (ewadd (concat 1 2 ?c ?b) (concat 1 2 ?a ?d))")
# Two-output merge without the rank condition: ill-typed for rank-1 inputs, equal where typed.
MERGE = rule("(relu ?a) ; (relu ?b) => (split_0 (split 1 (relu (concat 1 2 ?a ?b)))) ; "
             "(split_1 (split 1 (relu (concat 1 2 ?a ?b))))")
# Channel concat of grouped convs: where both sides are typed, the groups mix the wrong channels.
GROUPED = rule("(ewadd (conv2d 1 1 0 0 ?x ?w) (conv2d 1 1 0 0 ?y ?v)) => "
               "(conv2d 1 1 0 0 (concat 1 4 ?x ?y) (concat 1 4 ?w ?v))")


def test_shape_refuted_rule_is_proved_under_the_guard() -> None:
    result = verify_rule(SWAP)
    assert result.status == "refuted" and result.method == "shapes"
    assert result.guarded_status == "proved" and "guarded concrete shapes" in result.guarded_method
    assert result.guarded_scope == "all shapes"  # z3 over symbolic dims: concat offsets, elementwise sums
    for env in result.counterexample["shapes"], :  # the strict counterexample really is ill-typed
        shapes = {k: tuple(v) for k, v in env.items()}
        assert ShapeChecker(SWAP).lhs_shapes(shapes) is not None
        assert ShapeChecker(SWAP, guarded=True).lhs_shapes(shapes) is None


def test_two_output_rule_is_proved_for_all_shapes_under_the_guard() -> None:
    result = verify_rule(MERGE)
    assert result.status == "refuted" and result.method == "shapes"
    assert (result.guarded_status, result.guarded_scope) == ("proved", "all shapes"), result


def test_grouped_conv_rule_is_refuted_on_values_under_the_guard() -> None:
    result = verify_rule(GROUPED)
    assert result.status == "refuted" and result.method == "shapes"
    assert result.guarded_status == "refuted"
    cex = result.guarded_counterexample
    env = {k: tuple(v) for k, v in cex["shapes"].items()}
    assert pattern_shape(GROUPED.lhs[0], env) == pattern_shape(GROUPED.rhs[0], env)  # guard passes
    values = {k: np.asarray(v, dtype=np.float64).reshape(env[k]) for k, v in cex["inputs"].items()}
    sizes = rule_split_sizes(GROUPED, env)
    assert not np.allclose(evaluate_numpy(GROUPED.lhs[0], values, sizes), evaluate_numpy(GROUPED.rhs[0], values, sizes))


def test_value_refuted_rule_is_refuted_under_the_guard_too() -> None:
    result = verify_rule(rule("(ewadd ?a ?b) => (ewmul ?b ?a)"))
    assert result.status == "refuted" and result.method != "shapes"
    assert result.guarded_status == "refuted" and result.guarded_counterexample


def test_verified_rules_admits_guarded_rules_only_when_asked() -> None:
    good = rule("(ewadd ?a ?b) => (ewadd ?b ?a)")
    rules = [good, SWAP, GROUPED]
    assert verified_rules(rules) == [good]
    assert verified_rules(rules, allow_guarded=True, allow_tested=True) == [good, SWAP]
    swap_everywhere = verify_rule(SWAP).guarded_scope == "all shapes"
    assert verified_rules(rules, allow_guarded=True) == ([good, SWAP] if swap_everywhere else [good])


def test_cache_answers_warm_runs_without_verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    import eqsat.rewrites.verify as verify

    rules = [SWAP, rule("(ewmul ?a ?b) => (ewmul ?b ?a)")]
    cold = verify_rules(rules, all_shapes=False)

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("verified again despite a warm cache")

    monkeypatch.setattr(verify, "verify_rule", boom)
    warm = verify_rules(rules, all_shapes=False)
    assert [r.to_json() | {"seconds": 0} for r in warm] == [r.to_json() | {"seconds": 0} for r in cold]
    renamed = parse_rule_text("other: (ewmul ?a ?b) => (ewmul ?b ?a)")[0]
    assert verify_rules([renamed], all_shapes=False)[0].name == "other"  # name is not part of the key
    with pytest.raises(AssertionError, match="warm cache"):  # other options: a miss
        verify_rules(rules, VerifyOptions(seed=1), all_shapes=False)
    with pytest.raises(AssertionError, match="warm cache"):
        verify_rules(rules, all_shapes=False, cache=False)


def test_rules_with_attribute_variables_round_trip_through_the_cache() -> None:
    from eqsat.rewrites import library_rules

    rules = [r for r in library_rules(["folding"]) if r.name in ("matmul-bn-fold", "matmul-scale-fold")]
    cold = verify_rules(rules, VerifyOptions(samples=8))
    warm = verify_rules(rules, VerifyOptions(samples=8))
    assert [r.status for r in cold] == [r.status for r in warm] == ["proved", "proved"]
    assert [r.shapes for r in cold] == [r.shapes for r in warm]

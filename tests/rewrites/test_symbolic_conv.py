"""Symbolic proofs over windows (issue 27): conv2d (strides, SAME/VALID padding, channel groups,
fused activations) and `enlarge` proved for every shape, and the wrong ones (the strided enlarge
rules, perturbed attributes) never proved."""

from __future__ import annotations

import pytest

from eqsat.rewrites import library_rules, parse_rule_text
from eqsat.rewrites.concrete import verify_concrete
from eqsat.rewrites.mutate import mutants
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.symbolic import WINDOW_OPS, ops_used_by, prove_symbolic, why_not
from eqsat.rewrites.verify import verify_rule


def rule(text: str) -> Rule:
    return parse_rule_text(text, "test")[0]


TRUE = [
    "(conv2d 1 1 0 0 ?x (enlarge ?w ?v)) => (conv2d 1 1 0 0 ?x ?w)",  # stride 1 SAME: the window lands alike
    "(relu (conv2d 2 2 0 0 ?x ?w)) => (conv2d 2 2 0 2 ?x ?w)",  # grouped or not, any rank the op takes
    "(sigmoid (conv2d 1 1 1 0 ?x ?w)) => (conv2d 1 1 1 1 ?x ?w)",
    "(conv2d 2 2 0 0 (concat 0 4 ?x ?y) ?w) => (concat 0 4 (conv2d 2 2 0 0 ?x ?w) (conv2d 2 2 0 0 ?y ?w))",
]
FALSE = [
    "(conv2d 2 2 0 0 ?x (enlarge ?w ?v)) => (conv2d 2 2 0 0 ?x ?w)",  # clipped SAME padding moves the window
    "(conv2d 3 3 0 0 ?x (enlarge ?w ?v)) => (conv2d 3 3 0 0 ?x ?w)",
    "(conv2d 1 1 1 0 ?x (enlarge ?w ?v)) => (conv2d 1 1 1 0 ?x ?w)",  # VALID: a smaller output
    "(relu (conv2d 2 2 0 0 ?x ?w)) => (conv2d 2 2 0 1 ?x ?w)",  # the wrong activation
    "(relu (conv2d 2 2 0 0 ?x ?w)) => (conv2d 2 1 0 2 ?x ?w)",  # the wrong stride
    "(conv2d 1 1 0 0 ?x ?w) => (conv2d 1 1 1 0 ?x ?w)",  # the wrong padding
]


@pytest.mark.parametrize("text", TRUE)
def test_true_conv_rules_are_proved_for_every_shape(text: str) -> None:
    assert prove_symbolic(rule(text)) is not None


@pytest.mark.parametrize("text", FALSE)
def test_false_conv_rules_are_not_proved(text: str) -> None:
    assert prove_symbolic(rule(text)) is None


def test_the_false_enlarge_rule_holds_under_the_guard_only_where_enlarge_is_the_identity() -> None:
    # VALID stride 1: both sides have one shape only when the kernels have one size
    assert prove_symbolic(rule(FALSE[2]), guarded=True) is not None
    assert prove_symbolic(rule(FALSE[0]), guarded=True) is None


@pytest.mark.parametrize("name", ["concat-conv-s2-weights", "concat-conv-valid-weights", "conv-relu-s2",
                                  "conv-batch-concat"])
def test_library_conv_rules_are_proved_for_all_shapes(name: str) -> None:
    (r,) = [r for r in library_rules() if r.name == name]
    result = verify_rule(r)
    assert (result.verdict, result.scope) == ("proved", "all shapes"), result


def _window_mutants() -> list[Rule]:
    rules = [r for r in library_rules() if why_not(r) is None and ops_used_by(r) & WINDOW_OPS]
    return [m for r in rules for m in mutants(r)]


@pytest.mark.slow  # ~35 s: every mutant of the conv rules through both verifiers
def test_no_mutant_of_a_conv_rule_that_numbers_refute_is_proved() -> None:
    """Every 12th mutant of the library's conv / enlarge rules (strides, pads, axes varied): whatever
    the symbolic prover proves, the concrete verifier does not refute (strictly, or under the guard);
    a mutant that changes a stride on both sides is often still true."""
    found = _window_mutants()[::12]
    assert len(found) >= 20
    for m in found:
        strict, guarded = prove_symbolic(m), prove_symbolic(m, guarded=True)
        if strict is None and guarded is None:
            continue
        res = verify_concrete(m)
        if strict is not None:
            assert res.status == "proved", m.name
        # under the guard: never refuted (unknown where the sampler finds no shapes the guard admits,
        # e.g. a VALID piece that keeps its shape only for 1x1 kernels, where VALID is SAME)
        assert res.status == "proved" or res.guarded_status != "refuted", m.name


def test_a_merge_whose_right_side_is_ill_typed_at_rank_5_is_proved_under_the_guard_only() -> None:
    """conv2d takes batched rank-5 operands, but `(concat 0 4 ?w ?v)` demands rank 4: strictly the
    rule fails there (the shape check says so), under the applier's guard it holds for every shape."""
    from eqsat.rewrites.concrete import _Refuted, check_shapes

    (r,) = [r for r in library_rules() if r.name == "conv-merge-weights"]
    assert prove_symbolic(r) is None and prove_symbolic(r, guarded=True) is not None
    with pytest.raises(_Refuted, match="shapes"):
        check_shapes(r, {"x": (2, 2, 2, 3, 3), "w": (2, 2, 2, 1, 1), "v": (2, 2, 2, 1, 1)})

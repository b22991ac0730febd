"""All-shapes proofs by derivation: sound (never derives a refuted rule) and useful."""

import pytest

from eqsat.rewrites import parse_rule_text
from eqsat.rewrites.derive import EGraph, axiom_base, derivable


def rule(text: str):
    return parse_rule_text(text, "test")[0]


@pytest.mark.parametrize("text", [
    "(matmul 0 (matmul 0 (matmul 0 ?a ?b) ?c) ?d) => (matmul 0 ?a (matmul 0 ?b (matmul 0 ?c ?d)))",
    "(ewadd ?c (ewadd ?a ?b)) => (ewadd ?b (ewadd ?a ?c))",
    "(relu (concat 1 4 ?x (conv2d 1 1 0 0 ?y ?w))) => (concat 1 4 (relu ?x) (conv2d 1 1 0 2 ?y ?w))",
])
def test_derives_true_rules(text: str) -> None:
    used = derivable(rule(text), axiom_base())
    assert used


@pytest.mark.parametrize("text", [
    "(ewadd (concat 1 4 ?a ?b) (concat 1 4 ?c ?d)) => (ewadd (concat 1 4 ?c ?b) (concat 1 4 ?a ?d))",
    "(ewadd (conv2d 1 1 0 0 ?x ?w) (conv2d 1 1 0 0 ?x ?v)) => (conv2d 1 1 0 0 ?x (ewadd ?w ?v))",
    "(matmul 0 ?a ?b) => (matmul 0 ?b ?a)",
])
def test_does_not_derive_rules_that_fail_for_some_shapes(text: str) -> None:
    assert derivable(rule(text), axiom_base()) is None


def test_egraph_congruence() -> None:
    g = EGraph()
    fa = g.add(rule("(relu ?a) => ?a").lhs[0])
    fb = g.add(rule("(relu ?b) => ?b").lhs[0])
    g.union(g.add(rule("?a => ?a").lhs[0]), g.add(rule("?b => ?b").lhs[0]))
    g.rebuild()
    assert g.find(fa) == g.find(fb)

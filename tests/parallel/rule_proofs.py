"""One check for the parallel rule tests: an instance is proved by the symbolic prover for every
shape (with or without its guard), and a wrong variant is neither proved nor left unrefuted."""

from __future__ import annotations

from collections.abc import Iterable

from eqsat.rewrites.concrete import REFUTED, VerifyOptions, verify_concrete
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.symbolic import prove_symbolic


def assert_proved_for_all_shapes(rules: Iterable[Rule]) -> None:
    for rule in rules:
        how = prove_symbolic(rule) or prove_symbolic(rule, guarded=True)
        assert how is not None and "symbolic dims" in how, rule.name


def assert_refuted(rule: Rule) -> None:
    assert prove_symbolic(rule) is None and prove_symbolic(rule, guarded=True) is None
    got = verify_concrete(rule, VerifyOptions(samples=24))  # one decision: it is deterministic
    assert REFUTED in {got.status, got.guarded_status}

"""One rule-set policy: what `select_rules` trusts is what the verifier proves (or proves under the
guard), for the library and Tensat's files alike, and filtering by ops only drops rules that cannot
match."""

from __future__ import annotations

import pytest

from eqsat.errors import EqsatError
from eqsat.paths import tensat_rules_dir
from eqsat.rewrites import library_rules
from eqsat.rewrites.rule import rules_that_can_match
from eqsat.rewrites.verify import verified_rules, verify_rules
from eqsat.rulesets import XLA_GROUPS, given_rules, is_trusted, select_rules


def test_library_selection_is_the_verified_library() -> None:
    chosen = select_rules(None)
    assert chosen.given == tuple(library_rules(XLA_GROUPS)) == chosen.can_match
    assert list(chosen.trusted) == verified_rules(list(chosen.given), allow_guarded=True)


def test_filtering_by_ops_keeps_what_can_match() -> None:
    ops = {"input", "weight", "matmul", "relu", "add"}
    chosen = select_rules(None, ops)
    assert chosen.can_match == tuple(rules_that_can_match(library_rules(XLA_GROUPS), ops))
    assert set(chosen.trusted) <= set(chosen.can_match)
    assert chosen.counts() == {"rules_given": len(chosen.given), "rules_can_match": len(chosen.can_match),
                               "rules_used": len(chosen.trusted)}


@pytest.mark.skipif(not tensat_rules_dir().exists(), reason="Tensat rule files not present")
def test_the_policy_admits_guarded_rules_and_never_value_refuted_ones() -> None:
    rules = given_rules("tensat")
    results = verify_rules(rules)
    trusted = {r.name for r in select_rules("tensat").trusted}
    assert trusted == {r.name for r, res in zip(rules, results) if is_trusted(res)}
    assert any(res.status == "refuted" and res.name in trusted for res in results)  # guarded-proved ones
    assert not any(res.status == "refuted" and res.guarded_status == "refuted" and res.name in trusted
                   for res in results)
    # issue 27: trusted means proved for all shapes; at least 95% of the guarded-true rules are
    true = [res for res in results if "proved" in (res.status, res.guarded_status)]
    assert len(trusted) >= 0.95 * len(true) and all(is_trusted(res) for res in results if res.name in trusted)


def test_bad_sources_are_one_clear_error() -> None:
    with pytest.raises(EqsatError, match="rules must be"):
        given_rules(42)
    with pytest.raises(EqsatError, match="rules must be"):
        given_rules([1.5])

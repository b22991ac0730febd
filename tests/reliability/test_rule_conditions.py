"""Side conditions are parsed completely or rejected: a dropped guard would make an unsound rule
look proved."""

from __future__ import annotations

from pathlib import Path

import pytest

from eqsat.errors import RuleParseError
from eqsat.rewrites.parser import load_rules, parse_rule_text, parse_rules


@pytest.mark.parametrize("line, message", [
    ("(ewadd ?x ?y) => (ewadd ?y ?x) if (= (dim ?z 0) 1)", "does not bind"),
    ("(ewmul ?x ?y) => (ewmul ?y ?x) if (= (dim ?x 0) (dim ?y 0)", "cut short"),
    ("(relu ?x) => ?x if (= (dim ?x 0) (dim ?x 0)", "cut short"),
    ("(relu ?x) => ?x if (= (dim ?x 0) 1))", "unexpected"),
    ("(relu ?x) => ?x if (dim ?x 0)", "bad condition"),
    ("(relu ?x) => ?x if ?x", "bad condition"),
    ("(relu ?x) => ?x if (= ?x 1)", "bad condition"),
    ("(relu ?x) => ?x if (= (dim (relu ?x) 0) 1)", "takes a .variable"),
    ("(relu ?x) => ?x if (= (dim ?x 0) 1) (= (rank ?x)", "cut short"),
])
def test_bad_conditions_are_errors(line: str, message: str) -> None:
    with pytest.raises(RuleParseError, match=message):
        parse_rule_text(line)


def test_complete_conditions_are_kept() -> None:
    (rule,) = parse_rule_text("(relu ?x) => ?x if (= (dim ?x 0) 1) (<= (rank ?x) (+ 1 2))")
    assert len(rule.conditions) == 2


def test_two_output_rules_keep_their_conditions() -> None:
    rules = parse_rules(["(relu ?x) => (relu ?x) if (= (rank ?x) 2)", "(tanh ?y) => (tanh ?y)"], "m", multi=True)
    assert len(rules[0].conditions) == 1


def test_deep_nesting_is_one_error() -> None:
    line = "(relu " * 5000 + "?x" + ")" * 5000 + " => ?x"
    with pytest.raises(RuleParseError, match="nested"):
        parse_rule_text(line)


def test_non_utf8_rule_file_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.rules"
    path.write_bytes(b"\xff\xfe(relu ?x) => ?x\n")
    with pytest.raises(RuleParseError, match="UTF-8"):
        load_rules(path)

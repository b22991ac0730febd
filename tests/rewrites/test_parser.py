"""The rule parser: Tensat's files load unchanged, our extensions parse, errors say where and what."""

from pathlib import Path

import pytest

from eqsat.errors import RuleParseError
from eqsat.paths import tensat_rules_dir
from eqsat.rewrites import library_rules, load_rules, parse_rule_text
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import Term, Var

TENSAT = tensat_rules_dir()
needs_tensat = pytest.mark.skipif(not TENSAT.exists(), reason="Tensat rule files not present")


@needs_tensat
def test_tensat_files_load_with_expected_counts() -> None:
    single = load_rules(TENSAT / "converted.txt")
    multi = load_rules(TENSAT / "converted_multi.txt")
    assert len(single) == 120 and len(multi) == 13
    assert all(r.is_multi for r in multi) and not any(r.is_multi for r in single)


def test_concat_guard_and_split_part() -> None:
    (rule,) = load_rules_text("(relu ?a) ; (relu ?b) => (split_0 (split 1 (relu (concat 1 2 ?a ?b)))) ; "
                              "(split_1 (split 1 (relu (concat 1 2 ?a ?b))))")
    part = rule.rhs[0]
    assert isinstance(part, Term) and part.op == "split_part" and part.attr == {"axis": 1, "index": 0}
    concat = part.args[0].args[0]  # type: ignore[union-attr]
    assert concat.op == "concat" and concat.guards == (("ndim", 2),)


def load_rules_text(line: str):
    return parse_rule_text(line, "test:1")


def test_named_bidirectional_rule_with_condition() -> None:
    fwd, rev = parse_rule_text("comm: (ewadd ?x ?y) <=> (ewadd ?y ?x) if (= (rank ?x) 2)")
    assert (fwd.name, rev.name) == ("comm", "comm-rev")
    assert rev.lhs == fwd.rhs and fwd.conditions and fwd.conditions[0].op == "="
    assert fwd.lhs[0] == Term("ewadd", (), (Var("x"), Var("y")))


@pytest.mark.parametrize("line, expected", [
    ("(ewadd ?x ?y) => (ewadd ?x ?z)", "not bound on the left"),
    ("(matmul ?x ?y) => ?x", "'matmul' takes 3 arguments"),
    ("(frobnicate ?x) => ?x", "unknown operator 'frobnicate'"),
    ("(ewadd ?x ?y => ?x", "missing ')'"),
    ("(concat a 2 ?x ?y) => ?x", "expected an integer for concat's axis"),
])
def test_parse_errors_name_place_and_expectation(line: str, expected: str) -> None:
    with pytest.raises(RuleParseError, match="test:1") as info:
        parse_rule_text(line, "test:1")
    assert expected in str(info.value)


def test_parse_error_in_file_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.rules"
    f.write_text("# comment\n(ewadd ?x ?y) => (ewadd ?y ?x)\n(ewadd ?x) => ?x\n")
    with pytest.raises(RuleParseError, match=r"bad.rules:3"):
        load_rules(f)


def test_printed_rules_parse_back_to_the_same_rules() -> None:
    for rule in library_rules():
        again = parse_rule_text(rule_text(rule))[0]
        assert (again.lhs, again.rhs, again.conditions) == (rule.lhs, rule.rhs, rule.conditions)


def test_attribute_references_parse_print_and_check() -> None:
    from eqsat.rewrites.rule import AttrVar, DimOf, ShapeOf

    (r,) = parse_rule_text("f: (batchnorm ?eps (matmul 0 ?x ?w) ?s ?b ?m ?v) => (batchnorm ?eps (broadcast "
                           "(shape (matmul 0 ?x ?w)) [0 1] (broadcast [1 (dim ?m 0)] [1] ?m)) ?s ?b ?m ?v)")
    assert r.lhs[0].attr["eps"] == AttrVar("eps", "float")  # type: ignore[union-attr]
    outer = r.rhs[0].args[0]  # type: ignore[union-attr]
    assert isinstance(outer.attr["shape"], ShapeOf) and isinstance(outer.args[0].attr["shape"][1], DimOf)
    assert parse_rule_text(rule_text(r))[0] == r
    with pytest.raises(RuleParseError, match="not bound on the left"):
        parse_rule_text("(relu ?x) => (batchnorm ?eps ?x ?x ?x ?x ?x)", "test:1")
    with pytest.raises(RuleParseError, match="only appear on a right side"):
        parse_rule_text("(broadcast (shape ?x) [0] ?x) => ?x", "test:1")

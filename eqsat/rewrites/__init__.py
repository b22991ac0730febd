"""Rewrite rules: the term language, rule files, the verifier and the synthesizer."""

from eqsat.rewrites.parser import load_rules, parse_rule_text
from eqsat.rewrites.rule import Rule, Term, Var

__all__ = ["Rule", "Term", "Var", "load_rules", "parse_rule_text"]

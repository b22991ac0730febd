"""Rewrite rules: the term language, rule files, the verifier and the synthesizer."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from eqsat.errors import RuleParseError
from eqsat.rewrites.parser import load_rules, parse_rule_text
from eqsat.rewrites.rule import Rule, Term, Var

LIBRARY_DIR = Path(__file__).parent / "library"
LIBRARY_GROUPS: tuple[str, ...] = ("properties", "fusion", "merges", "folding", "decompositions", "conv_merges",
                                   "nary_merges", "precision", "layout")


def library_rules(groups: Iterable[str] | None = None) -> list[Rule]:
    """The rules the project ships, by group: properties (TASO's operator properties), fusion
    (activation fusion, elementwise chains), merges (two-output concat/split merges), folding
    (batchnorm / per-channel scales folded into conv and matmul weights, matmul + bias merges; these
    use attribute references, see `parser.py`), decompositions (one op as cheaper ones: separable
    max and average pools), conv_merges (Tensat's convolution merges guarded to ungrouped convs, and
    its `enlarge` merges of a small kernel with a larger one), nary_merges (a third, fourth, ... op
    merged into an existing two-way merge; run in the merge rounds of `eqsat.saturate`), precision
    (bfloat16 matmuls and elementwise ops as float32 ones on converted operands, rounded once), layout
    (convs as conv2d_nhwc between transposes that cancel along a chain: XLA:CPU's native conv layout)."""
    chosen = list(LIBRARY_GROUPS if groups is None else groups)
    unknown = [g for g in chosen if g not in LIBRARY_GROUPS]
    if unknown:
        raise RuleParseError(f"unknown rule group(s) {unknown}; expected some of {list(LIBRARY_GROUPS)}")
    rules: list[Rule] = []
    for group in chosen:
        rules.extend(load_rules(LIBRARY_DIR / f"{group}.rules", multi=False))
    return rules


__all__ = ["Rule", "Term", "Var", "load_rules", "parse_rule_text", "library_rules", "LIBRARY_GROUPS"]

"""The decorator's default rules: the shipped library's groups that pay under XLA, proved ones only.

Verification results are cached on disk by the verifier (`eqsat.rewrites.verify_cache`), so after
the first run this costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eqsat.rewrites.rule import Rule

__all__ = ["DEFAULT_GROUPS", "proved_library_rules"]

DEFAULT_GROUPS: tuple[str, ...] = ("fusion", "merges", "folding", "decompositions")
"""Merges (Q/K/V-style matmuls and parallel convs on one input), activation fusion, folding of
batchnorms and per-channel scales into weights, and decompositions (separable max and average
pools); TASO's general properties (associativity, commutativity) only grow the e-graph for these
programs."""


def proved_library_rules(groups: Sequence[str] = DEFAULT_GROUPS, ops: Iterable[str] | None = None) -> list[Rule]:
    """The library rules of `groups` that the verifier proves; with `ops`, only those that can
    match a graph of these ops (the others are not even verified)."""
    from eqsat.rewrites import library_rules
    from eqsat.rewrites.rule import rules_that_can_match
    from eqsat.rewrites.verify import verified_rules

    rules = library_rules(groups)
    return verified_rules(rules if ops is None else rules_that_can_match(rules, ops), all_shapes=False)

"""The decorator's default rules: the library's `XLA_GROUPS`, selected by `eqsat.rulesets`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eqsat.rewrites import library_rules
from eqsat.rewrites.rule import Rule
from eqsat.rulesets import XLA_GROUPS, select_rules

__all__ = ["DEFAULT_GROUPS", "proved_library_rules"]

DEFAULT_GROUPS = XLA_GROUPS


def proved_library_rules(groups: Sequence[str] = XLA_GROUPS, ops: Iterable[str] | None = None) -> list[Rule]:
    """The library rules of `groups` that the rule-set policy trusts; with `ops`, only those that
    can match a graph of these ops (the others are not even verified)."""
    return list(select_rules(library_rules(groups), ops).trusted)

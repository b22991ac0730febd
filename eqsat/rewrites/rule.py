"""Rules as values: patterns over IR ops, and single- or multi-pattern rules.

A pattern is a tree of `Term`s (an IR op name, its integer attributes, its tensor arguments) with
`Var` leaves. Two terms exist only in patterns: `split_part` (piece `index` of a two-way split along
`axis`, whose sizes come from the shapes of the rule's two left sides, as in Tensat's two-output
rules) and the `ndim` guard some Tensat concats carry (the rule only applies at that rank).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Var:
    name: str  # without the leading '?'

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True)
class Term:
    op: str
    attrs: tuple[tuple[str, Any], ...] = ()
    args: tuple[Pattern, ...] = ()
    guards: tuple[tuple[str, int], ...] = ()  # e.g. (("ndim", 4),): the term has that rank

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def __str__(self) -> str:
        parts = [self.op, *(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in self.attrs),
                 *(f"{k}!{v}" for k, v in self.guards), *map(str, self.args)]
        return "(" + " ".join(parts) + ")"


Pattern = Var | Term


def variables(p: Pattern) -> Iterator[str]:
    """Variable names in first-occurrence order (with repeats)."""
    if isinstance(p, Var):
        yield p.name
    else:
        for a in p.args:
            yield from variables(a)


def subterms(p: Pattern) -> Iterator[Term]:
    """Every Term in `p`, children before parents."""
    if isinstance(p, Term):
        for a in p.args:
            yield from subterms(a)
        yield p


def ops_used(p: Pattern) -> set[str]:
    return {t.op for t in subterms(p)}


@dataclass(frozen=True)
class Rule:
    """`lhs[i]` rewrites to `rhs[i]`; with two sides each it is a multi-pattern (two-output) rule."""

    name: str
    lhs: tuple[Pattern, ...]
    rhs: tuple[Pattern, ...]
    source: str = ""  # "file:line" it came from
    conditions: tuple[Term, ...] = field(default=())  # extra side conditions, see parser

    @property
    def is_multi(self) -> bool:
        return len(self.lhs) > 1

    def text(self) -> str:
        return " ; ".join(map(str, self.lhs)) + " => " + " ; ".join(map(str, self.rhs))

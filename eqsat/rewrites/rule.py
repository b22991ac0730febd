"""Rules as values: patterns over IR ops, and single- or multi-pattern rules.

A pattern is a tree of `Term`s (an IR op name, its integer attributes, its tensor arguments) with
`Var` leaves. Two terms exist only in patterns: `split_part` (piece `index` of a two-way split along
`axis`, whose sizes come from the shapes of the rule's two left sides, as in Tensat's two-output
rules) and the `ndim` guard some Tensat concats carry (the rule only applies at that rank).

Attribute values are literals, or references (our extension, see `parser.py`): `AttrVar` (`?eps`,
`?S`: an attribute matched as a variable on the left and reused on the right), `ShapeOf`
(`(shape P)`: the shape of pattern P as a list attribute) and `DimOf` (`(dim P i)` inside a list).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


ORDER_CONDITION = "order"
"""A side condition `(order ?a ?b)`: ?a and ?b are values of the input graph, ?a's first."""
NEXT_CONDITION = "next"
"""A side condition `(next ?a ?b)`: ?a and ?b are the operands at one position of two ops of the
input graph alike in everything else (siblings: q, k, v's weights), ?b the next such after ?a."""
DTYPE_CONDITION = "dtype"
"""A side condition `(dtype ?a bfloat16)`: ?a's e-class has that dtype (the e-graph's dtype analysis).
The verifier proves identities over the reals, where every dtype is the reals and a conversion
between float dtypes is the identity, so it only picks where a rule applies (a rule that moves a
bfloat16 product into float32 must not fire on float32 values: it would convert them to bfloat16)."""
CLASS_CONDITIONS: tuple[str, ...] = (ORDER_CONDITION, NEXT_CONDITION, DTYPE_CONDITION)
"""Conditions on e-classes, not shapes: they pick some applications of a rule, so they hold for the verifier."""


@dataclass(frozen=True)
class Var:
    name: str  # without the leading '?'

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True)
class AttrVar:
    """An attribute matched as a variable (`?eps` for a float, `?S` for a list of ints)."""

    name: str
    kind: str  # the registry's attribute kind: "float" | "ints"

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True)
class ShapeOf:
    """`(shape P)`: the shape of the tensor pattern P, as a list attribute (right sides)."""

    pattern: Pattern

    def __str__(self) -> str:
        return f"(shape {self.pattern})"


@dataclass(frozen=True)
class DimOf:
    """`(dim P i)`: one dimension of the tensor pattern P, as an item of a list attribute."""

    pattern: Pattern
    index: int

    def __str__(self) -> str:
        return f"(dim {self.pattern} {self.index})"


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


def attr_references(value: Any) -> Iterator[AttrVar | ShapeOf | DimOf]:
    """The references inside one attribute value (a literal has none)."""
    if isinstance(value, (AttrVar, ShapeOf, DimOf)):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from attr_references(v)


def term_attr_refs(t: Term) -> list[AttrVar | ShapeOf | DimOf]:
    """References in `t`'s own attributes (not its arguments')."""
    return [r for _, v in t.attrs for r in attr_references(v)]


def has_attr_refs(p: Pattern) -> bool:
    return any(term_attr_refs(t) for t in subterms(p))


def attr_variables(p: Pattern) -> Iterator[AttrVar]:
    """Attribute variables in `p`, in post-order (a term's after its arguments')."""
    for t in subterms(p):
        for r in term_attr_refs(t):
            if isinstance(r, AttrVar):
                yield r
            else:
                yield from attr_variables(r.pattern)


def referenced_variables(t: Term) -> set[str]:
    """Tensor and attribute variables that `t`'s own attributes need bound."""
    out: set[str] = set()
    for r in term_attr_refs(t):
        if isinstance(r, AttrVar):
            out.add(r.name)
        else:
            out.update(variables(r.pattern))
            out.update(a.name for a in attr_variables(r.pattern))
    return out


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


Signature = tuple[str, tuple[tuple[str, Any], ...]]
"""An op and its attributes as the e-graph holds them, None where any value may be there or be
matched (a rule's attribute variable or computed attribute; a slice's bounds from a split)."""

_PLACEHOLDER: dict[str, Any] = {"int": 0, "ints": (), "float": 0.0, "str": ""}


def signature(op: str, attrs: Mapping[str, Any], unknown: Iterable[str] = ()) -> Signature:
    """`op` with `attrs` normalized by the registry; the attributes named in `unknown`, and required
    ones `attrs` leaves out, are None (any value)."""
    from eqsat import ops
    from eqsat.errors import EqsatError

    if op not in ops.OPS:
        return op, ()  # an op outside the registry (a rule the translator will refuse): any node of it
    spec = ops.op_spec(op)
    kinds = {a.name: a.kind for a in spec.attrs}
    open_names = set(unknown) | {a.name for a in spec.attrs if a.default is None and a.name not in attrs}
    filled = {k: v for k, v in attrs.items() if k not in open_names}
    filled.update({k: _PLACEHOLDER.get(kinds[k], 0) for k in open_names if k in kinds})
    try:
        normal = spec.normalize_attrs(filled)
    except EqsatError:
        return op, tuple((a.name, None) for a in spec.attrs)
    return op, tuple((a.name, None if a.name in open_names else normal[a.name]) for a in spec.attrs)


def term_signature(t: Term) -> Signature:
    """The signature of the e-nodes a pattern term matches (left side) or builds (right side)."""
    if t.op == "split_part":
        return signature("slice", {"axis": t.attr["axis"]}, ("start", "stop"))
    return signature(t.op, dict(t.attrs), [k for k, v in t.attrs if any(True for _ in attr_references(v))])


def _meet(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> bool:
    return all(x is None or y is None or x == y for (_, x), (_, y) in zip(a, b))


def rules_that_can_match(rules: Sequence[Rule], present: Iterable[str | Signature]) -> list[Rule]:
    """The rules that can ever match in an e-graph built from a graph with `present` ops, in their
    order: op names (any attributes) or `Signature`s (e.g. `eqsat.egraph.encoded_signatures`).

    A rule matches only where every term of its left sides meets a present signature (same op,
    equal attributes where both are known), and a signature enters the e-graph only from the graph
    or from the right side of a rule that can match; the fixpoint of that is exact up to shapes and
    nesting. Dropping the rest before verification and saturation costs nothing in what saturation
    finds (e.g. a transformer never needs the conv rules verified; VGG's ReLU matmuls never meet the
    associativity rules, written for matmuls without activation)."""
    known: dict[str, set[tuple[tuple[str, Any], ...]]] = {}

    def add(sig: str | Signature) -> None:
        op, attrs = (sig, None) if isinstance(sig, str) else sig
        if attrs is None:
            from eqsat import ops

            attrs = tuple((a.name, None) for a in ops.op_spec(op).attrs) if op in ops.OPS else ()
        known.setdefault(op, set()).add(attrs)

    for sig in present:
        add(sig)
    lhs = [[term_signature(t) for side in r.lhs for t in subterms(side)] for r in rules]
    rhs = [{term_signature(t) for side in r.rhs for t in subterms(side)} for r in rules]
    kept = [False] * len(rules)
    grew = True
    while grew:
        grew = False
        for i in range(len(rules)):
            if not kept[i] and all(any(_meet(attrs, have) for have in known.get(op, ())) for op, attrs in lhs[i]):
                kept[i] = grew = True
                for sig in rhs[i]:
                    add(sig)
    return [r for r, k in zip(rules, kept) if k]

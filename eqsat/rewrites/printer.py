"""Write patterns and rules back in the rule-file syntax that `parser.py` reads (round-trips)."""

from __future__ import annotations

import re

from eqsat import ops
from eqsat.rewrites.parser import TENSAT_SLOTS
from eqsat.rewrites.rule import AttrVar, DimOf, Pattern, Rule, ShapeOf, Term, Var


def _value(v: object) -> str:
    if isinstance(v, tuple):
        return "[" + " ".join(map(_value, v)) + "]"
    if isinstance(v, ShapeOf):
        return f"(shape {pattern_text(v.pattern)})"
    if isinstance(v, DimOf):
        return f"(dim {pattern_text(v.pattern)} {v.index})"
    if isinstance(v, AttrVar):
        return f"?{v.name}"
    return repr(v) if isinstance(v, float) else str(v)


def pattern_text(p: Pattern) -> str:
    if isinstance(p, Var):
        return f"?{p.name}"
    if p.op == "split_part":
        return f"(split_{p.attr['index']} (split {p.attr['axis']} {pattern_text(p.args[0])}))"
    attrs, guards = p.attr, dict(p.guards)
    slots = TENSAT_SLOTS.get(p.op) or (*(a.name for a in ops.op_spec(p.op).attrs), *("*",) * len(p.args))
    args = iter(p.args)
    parts = [p.op]
    for slot in slots:
        if slot == "*":
            parts.append(pattern_text(next(args)))
        elif slot == "ndim":
            parts.append(str(guards["ndim"]))
        else:
            parts.append(_value(attrs[slot]))
    return "(" + " ".join(parts) + ")"


def condition_text(c: Term | Var) -> str:
    if isinstance(c, Var):
        return f"?{c.name}"
    if c.op == "const":
        return str(c.attr["value"])
    return "(" + " ".join([c.op, *map(condition_text, c.args), *(str(v) for _, v in c.attrs)]) + ")"


def rule_text(rule: Rule) -> str:
    """One line: `name: LHS => RHS [if COND...]` (two-output rules with `;`)."""
    name = re.sub(r"[^\w.\-]", "_", rule.name)
    if not re.match(r"[A-Za-z_]", name):
        name = "r" + name
    text = (f"{name}: " + " ; ".join(map(pattern_text, rule.lhs)) + " => "
            + " ; ".join(map(pattern_text, rule.rhs)))
    if rule.conditions:
        text += " if " + " ".join(map(condition_text, rule.conditions))
    return text

"""Wrong rules made from true ones, to test the verifier: vary one attribute of a rule (a stride, a
padding, an axis, a window size, a permutation) everywhere it occurs with one value, or at one
occurrence on the right side only. A verifier that trusts a mutant it cannot prove for all shapes,
or proves one that numpy tells apart, is unsound; see tests/rewrites/test_trust.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import Pattern, Rule, Term

VARIANTS: dict[str, tuple[int, ...]] = {
    "stride_h": (1, 2, 3), "stride_w": (1, 2, 3), "pad": (0, 1), "kernel_h": (1, 2, 3), "kernel_w": (1, 2, 3),
    "axis": (0, 1, 2, 3, -1),
}
"""The values an integer attribute is varied over (every other value of its key)."""

Site = tuple[str, str, Any]  # (op, attribute key, value)


def _values(key: str, value: Any) -> list[Any]:
    if key in VARIANTS and isinstance(value, int):
        return [v for v in VARIANTS[key] if v != value]
    if key == "perm" and isinstance(value, tuple) and len(value) > 1:
        rotated, swapped = value[1:] + value[:1], (value[1], value[0], *value[2:])
        return [p for p in dict.fromkeys((rotated, swapped, tuple(reversed(value)))) if p != value]
    return []


def _sites(p: Pattern) -> Iterator[Site]:
    if isinstance(p, Term):
        for key, value in p.attrs:
            if _values(key, value):
                yield p.op, key, value
        for a in p.args:
            yield from _sites(a)


def _rewrite(p: Pattern, change: Callable[[Term, str, Any], Any]) -> Pattern:
    if not isinstance(p, Term):
        return p
    attrs = tuple((k, change(p, k, v)) for k, v in p.attrs)
    return dataclasses.replace(p, attrs=attrs, args=tuple(_rewrite(a, change) for a in p.args))


def mutants(rule: Rule) -> list[Rule]:
    """The rule with one attribute varied: everywhere it occurs with one value (both sides, e.g.
    every conv's stride 1 -> 2), or at one right-side occurrence only. Named `<rule>~<change>`;
    distinct and unlike the rule."""
    out: dict[str, Rule] = {rule_text(dataclasses.replace(rule, name="r")): rule}
    sites = list(dict.fromkeys(s for p in rule.lhs + rule.rhs for s in _sites(p)))
    for op, key, value in sites:
        for new in _values(key, value):
            def everywhere(t: Term, k: str, v: Any, op: str = op, key: str = key, value: Any = value,
                           new: Any = new) -> Any:
                return new if (t.op, k, v) == (op, key, value) else v

            mutant = dataclasses.replace(rule, name=f"{rule.name}~{op}.{key}={new}",
                                         lhs=tuple(_rewrite(p, everywhere) for p in rule.lhs),
                                         rhs=tuple(_rewrite(p, everywhere) for p in rule.rhs))
            out.setdefault(rule_text(dataclasses.replace(mutant, name="r")), mutant)
    for i, p in enumerate(rule.rhs):
        occurrences = list(_sites(p))
        for j, (op, key, value) in enumerate(occurrences):
            n = occurrences[:j].count((op, key, value))  # which occurrence of this site
            for new in _values(key, value):
                seen = iter(range(10_000))

                def once(t: Term, k: str, v: Any, op: str = op, key: str = key, value: Any = value,
                         n: int = n, new: Any = new, seen: Iterator[int] = seen) -> Any:
                    if (t.op, k, v) == (op, key, value) and next(seen) == n:
                        return new
                    return v

                rhs = rule.rhs[:i] + (_rewrite(p, once),) + rule.rhs[i + 1:]
                mutant = dataclasses.replace(rule, name=f"{rule.name}~rhs{i}.{j}.{op}.{key}={new}", rhs=rhs)
                out.setdefault(rule_text(dataclasses.replace(mutant, name="r")), mutant)
    return [m for m in out.values() if m is not rule]


__all__ = ["mutants", "VARIANTS"]

"""Prove rules for all shapes by deriving them in a small e-graph from a base of verified axioms.

Every axiom is directional and valid in the strong sense the verifier checks (a well-typed left side
gives a well-typed, equal right side of the same shape). Starting from a rule's left side (which is
well-typed by assumption) every term the e-graph then represents is well-typed and equal to it, by
induction over rewrites and congruence; so if the right side shows up in the left side's class, the
rule holds for every shape the axioms hold for. The axioms themselves are checked on concrete
shapes, which is how TASO and Tensat checked their operator properties.

Under the applier's guard (both sides well-typed with one shape) a weaker argument suffices: grow
the e-graph from both sides at once; every term in it is then well-typed and equal to the side it
came from, so if the two classes meet the sides are equal wherever the guard holds
(`derivable_guarded`). A two-output rule `L0 ; L1 => split_0 (split A T) ; split_1 (split A T)`
holds under the guard iff `concat A L0 L1 = T` does under its guard (the pieces of T then have the
shapes of L0 and L1, so the concat is well-typed), which is derived the same way, once per rank the
rule admits (the axioms' concats carry Tensat's rank guard).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eqsat.errors import ShapeError
from eqsat.rewrites.concrete import VerifyOptions, verify_concrete
from eqsat.rewrites.parser import parse_rules
from eqsat.rewrites.rule import Pattern, Rule, Term, Var, ops_used, variables
from eqsat.rewrites.semantics import pattern_shape
from eqsat.rewrites.shapes import rank_choices
from eqsat.rewrites.verify_cache import VerificationCache, prove_missing

NodeKey = tuple[Any, ...]
ENode = tuple[NodeKey, tuple[int, ...]]

AXIOMS_FILE = Path(__file__).parent / "library" / "axioms.rules"


def _key(t: Term) -> NodeKey:
    return (t.op, t.attrs, t.guards)


@dataclass
class EGraph:
    """Hash-consed e-nodes over union-find classes; enough for rule derivations of a few hundred nodes."""

    parent: list[int] = field(default_factory=list)
    hashcons: dict[ENode, int] = field(default_factory=dict)

    def find(self, c: int) -> int:
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def add_node(self, node: ENode) -> int:
        node = (node[0], tuple(self.find(c) for c in node[1]))
        if node in self.hashcons:
            return self.find(self.hashcons[node])
        c = len(self.parent)
        self.parent.append(c)
        self.hashcons[node] = c
        return c

    def add(self, p: Pattern, subst: Mapping[str, int] | None = None) -> int:
        if isinstance(p, Var):
            return subst[p.name] if subst is not None else self.add_node((("var", p.name), ()))
        return self.add_node((_key(p), tuple(self.add(a, subst) for a in p.args)))

    def lookup(self, p: Pattern) -> int | None:
        """The class of a ground term (variables as leaves) if the e-graph represents it."""
        if isinstance(p, Var):
            node: ENode = (("var", p.name), ())
        else:
            kids = [self.lookup(a) for a in p.args]
            if any(k is None for k in kids):
                return None
            node = (_key(p), tuple(self.find(k) for k in kids))  # type: ignore[arg-type]
        c = self.hashcons.get(node)
        return None if c is None else self.find(c)

    def union(self, a: int, b: int) -> bool:
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        self.parent[max(a, b)] = min(a, b)
        return True

    def rebuild(self) -> None:
        """Re-canonicalize nodes, merging classes that congruence makes equal, to a fixpoint."""
        changed = True
        while changed:
            changed = False
            table: dict[ENode, int] = {}
            for (key, kids), c in self.hashcons.items():
                node = (key, tuple(self.find(k) for k in kids))
                c = self.find(c)
                if node in table and self.find(table[node]) != c:
                    self.union(table[node], c)
                    changed = True
                table[node] = c
            self.hashcons = table

    def classes(self) -> dict[int, list[ENode]]:
        out: dict[int, list[ENode]] = {}
        for node, c in self.hashcons.items():
            out.setdefault(self.find(c), []).append(node)
        return out

    def ematch(self, p: Pattern, c: int, classes: Mapping[int, list[ENode]],
               subst: dict[str, int]) -> Iterator[dict[str, int]]:
        if isinstance(p, Var):
            bound = subst.get(p.name)
            if bound is None:
                yield {**subst, p.name: c}
            elif self.find(bound) == c:
                yield subst
            return
        key = _key(p)
        for k, kids in classes.get(c, ()):
            if k == key and len(kids) == len(p.args):
                yield from self._match_args(p.args, kids, classes, subst)

    def _match_args(self, pats: Sequence[Pattern], kids: Sequence[int], classes: Mapping[int, list[ENode]],
                    subst: dict[str, int]) -> Iterator[dict[str, int]]:
        if not pats:
            yield subst
            return
        for s in self.ematch(pats[0], self.find(kids[0]), classes, subst):
            yield from self._match_args(pats[1:], kids[1:], classes, s)

    def saturate(self, rules: Sequence[Rule], iterations: int = 6, max_nodes: int = 3000) -> set[str]:
        """Apply rules until nothing changes or a limit; returns the names of rules that merged classes."""
        fired: set[str] = set()
        for _ in range(iterations):
            classes = self.classes()
            matches = [(r, c, s) for r in rules for c in classes for s in self.ematch(r.lhs[0], c, classes, {})]
            changed = False
            for r, c, s in matches:
                if len(self.hashcons) > max_nodes:
                    return fired
                if self.union(c, self.add(r.rhs[0], s)):
                    changed = True
                    fired.add(r.name)
            self.rebuild()
            if not changed:
                break
        return fired


def derivable(rule: Rule, axioms: Sequence[Rule], iterations: int = 6, max_nodes: int = 3000) -> list[str] | None:
    """Names of axioms used (those whose rewrites fired) if `rule` follows from `axioms`, else None.

    A two-output rule without split pieces holds if each of its halves does (each left side is
    well-typed on its own), so its halves are derived one by one."""
    if rule.conditions:
        return None
    if rule.is_multi:
        halves = _halves(rule)
        if halves is None:
            return None
        used: set[str] = set()
        for half in halves:
            got = derivable(half, axioms, iterations, max_nodes)
            if got is None:
                return None
            used.update(got)
        return sorted(used)
    g = EGraph()
    root = g.add(rule.lhs[0])
    usable = [a for a in axioms if not a.is_multi and not a.conditions]
    fired = g.saturate(usable, iterations, max_nodes)
    found = g.lookup(rule.rhs[0])
    if found is None or found != g.find(root):
        return None
    return _used(rule, [a for a in usable if a.name in fired], iterations, max_nodes)


def _used(rule: Rule, axioms: Sequence[Rule], iterations: int, max_nodes: int, both: bool = False) -> list[str]:
    """A smaller set of axioms that still derives the rule (greedy removal of each fired axiom)."""
    keep = list(axioms)
    for name in [a.name for a in axioms]:
        trial = [a for a in keep if a.name != name]
        if _meets(rule, trial, iterations, max_nodes, both):
            keep = trial
    return sorted({a.name for a in keep})


def _meets(rule: Rule, axioms: Sequence[Rule], iterations: int, max_nodes: int, both: bool) -> bool:
    g = EGraph()
    root = g.add(rule.lhs[0])
    other = g.add(rule.rhs[0]) if both else None
    g.saturate(axioms, iterations, max_nodes)
    if other is not None:
        return g.find(root) == g.find(other)
    return g.lookup(rule.rhs[0]) == g.find(root)


def _halves(rule: Rule) -> list[Rule] | None:
    """The single rules `lhs[i] => rhs[i]` of a two-output rule with no split pieces, else None."""
    if any("split_part" in ops_used(p) for p in rule.rhs):
        return None
    return [Rule(f"{rule.name}#{i}", (lhs,), (rhs,), rule.source)
            for i, (lhs, rhs) in enumerate(zip(rule.lhs, rule.rhs))]


def derivable_guarded(rule: Rule, axioms: Sequence[Rule], iterations: int = 6,
                      max_nodes: int = 3000) -> tuple[str, list[str]] | None:
    """(how, axioms used) if `rule` holds wherever both sides are well-typed with one shape, by an
    e-graph grown from both sides (and, for a two-output rule, from its concat form); else None."""
    if rule.conditions:
        return None
    usable = [a for a in axioms if not a.is_multi and not a.conditions]
    if not rule.is_multi:
        if not _meets(rule, usable, iterations, max_nodes, both=True):
            return None
        return "e-graph derivation from both sides", _used(rule, usable, iterations, max_nodes, both=True)
    halves = _halves(rule)
    if halves is not None:  # the guard on both right sides is the guard on each
        found = [derivable_guarded(h, axioms, iterations, max_nodes) for h in halves]
        if any(f is None for f in found):
            return None
        return ("each half derived from both sides",
                sorted({a for f in found for a in f[1]}))  # type: ignore[index]
    single = concat_forms(rule)
    if not single:
        return None
    used: set[str] = set()
    for r in single:
        if not _meets(r, usable, iterations, max_nodes, both=True):
            return None
        used.update(_used(r, usable, iterations, max_nodes, both=True))
    ranks = sorted(dict(r.lhs[0].guards)["ndim"] for r in single)  # type: ignore[union-attr]
    return (f"two-output rule as concat of its left sides = the split term, derived from both sides "
            f"at rank(s) {ranks}"), sorted(used)


def concat_forms(rule: Rule) -> list[Rule]:
    """`concat A nd L0 L1 => T` for each rank nd the two-output rule admits (ranks up to 6 tried), or
    [] when its right sides are not the two pieces of one split term."""
    pieces = rule.rhs
    if len(pieces) != 2 or not all(isinstance(p, Term) and p.op == "split_part" for p in pieces):
        return []
    (a, b) = pieces
    assert isinstance(a, Term) and isinstance(b, Term)
    if a.args != b.args or a.attr["axis"] != b.attr["axis"] or (a.attr["index"], b.attr["index"]) != (0, 1):
        return []
    axis, whole = a.attr["axis"], a.args[0]
    first = next(iter(variables(rule.lhs[0])), None)
    if first is None:
        return []
    ranks: set[int] = set()
    for choice in rank_choices(rule, guarded=True, ranks=tuple(range(1, 7))):
        try:
            ranks.add(len(pattern_shape(rule.lhs[0], {v: (2,) * r for v, r in choice.items()})))
        except ShapeError:  # typed only with unequal dims: its rank is not known this way
            return []
    if not ranks or any(r <= axis for r in ranks):
        return []
    return [Rule(f"{rule.name}#concat{nd}", (Term("concat", (("axis", axis),), tuple(rule.lhs), (("ndim", nd),)),),
                 (whole,), rule.source) for nd in sorted(ranks)]


def axiom_templates() -> list[Rule]:
    """The axiom file, with `{ax}`/`{nd}` (concat axis / rank) and `{s}`/`{p}` (conv stride / padding)
    instantiated over the values the rule files use."""
    text = AXIOMS_FILE.read_text()
    lines: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        variants = [line]
        if "{ax}" in line:
            variants = [v.replace("{ax}", str(ax)).replace("{nd}", str(nd)) .replace(":", f".ax{ax}nd{nd}:", 1)
                        for v in variants for nd in (2, 4) for ax in range(2)]
        if "{s}" in line:
            variants = [v.replace("{s}", str(s)).replace("{p}", str(p)).replace(":", f".s{s}p{p}:", 1)
                        for v in variants for s in (1, 2) for p in (0, 1)]
        lines.extend(variants)
    return parse_rules(lines, AXIOMS_FILE.name)


@functools.cache
def axiom_base(cache: bool = True) -> tuple[Rule, ...]:
    """The axioms that the concrete prover proves (memoized: a pure function of the shipped file;
    with `cache`, their verification also goes through the on-disk verification cache)."""
    options = VerifyOptions(samples=12)
    store = VerificationCache.default() if cache else None
    axioms = axiom_templates()
    results = [store.get(a, options, False) if store else None for a in axioms]
    prove_missing(store, axioms, options, False, results, lambda a: verify_concrete(a, options))
    return tuple(a for a, result in zip(axioms, results) if result is not None and result.proved)


__all__ = ["EGraph", "derivable", "derivable_guarded", "concat_forms", "axiom_base", "axiom_templates"]

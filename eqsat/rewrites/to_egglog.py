"""Translate `Rule` values into egglog rules, guarded so that every right side is well-typed.

A rule's left sides become query atoms (one per subterm); its right sides become `union` actions.
Guards come from the symbolic shape table in `eqsat.egglog_schema`: the query binds the shapes of
the variables the right side uses, computes each right-side subterm's shape, and requires the
facts that make it well-typed, so an ill-typed right side is never built. A right side whose root
shape differs from the left side's is not guarded against: egglog then stops with a shape conflict,
which `eqsat.saturate` reports naming the rule.

Attribute references (see `eqsat.rewrites.rule`): an attribute variable (`?eps`, `?S`) is a query
variable in its left-side constructor's attribute slot, so a repeated one is an equality, and the
right side reuses the matched value. `(shape P)` and `(dim P i)` are computed in the query from
the shapes of P's variables (P itself is not built, but its well-typedness is guarded); a list
written item by item stays a `vec-of`, so the op's shape case is still chosen by its length.

Two-output rules join both left sides in one query, on distinct e-classes; when swapping the two
sides (and renaming variables) gives the same rule back, only one order is kept (`uid` order). A
two-output rule whose left sides share no variable and whose right sides use only their own side
is two independent rules and is split, which avoids matching every pair of e-classes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from eqsat import ops
from eqsat.egglog_schema import (
    DTYPE_FUNCTION,
    FLOAT_RELATION,
    INPUT_ORDER_FUNCTION,
    NEXT_SIBLING_RELATION,
    PAIR_FUNCTION,
    SHAPE_RULES,
    attr_literal,
    attr_names,
    case_facts,
    check_encodable,
    constructor,
    select_cases,
    string_literal,
    vec_items,
    vec_of,
)
from eqsat.errors import EqsatError, RuleError, UnknownOpError
from eqsat.rewrites.rule import (DTYPE_CONDITION, NEXT_CONDITION, ORDER_CONDITION, AttrVar, DimOf, Pattern, Rule,
                                 ShapeOf, Term, Var, attr_variables, subterms, variables)
from eqsat.rewrites.shapes import pinned_ranks


CANDIDATE_RULESET = "pairs"  # prefixed per installation


@dataclass(frozen=True)
class EgglogRule:
    """One egglog rule: its unique name (reported per iteration), the source rule, and its text."""

    name: str
    rule: Rule
    text: str
    multi: bool  # joins two left sides (or came from a two-output rule): run only in multi rounds
    candidate: str = ""  # a joined two-output rule: the rule that records its pairs (see `PAIR_FUNCTION`)


def _var(name: str) -> str:
    return "v_" + re.sub(r"\W", "_", name)


def _attr_var(name: str) -> str:
    """The query variable of an attribute variable (`?eps` → `a_eps`); one name per rule, so a
    repeated attribute variable is an equality of the attribute slots it occupies."""
    return "a_" + re.sub(r"\W", "_", name)


class _Query:
    """Accumulates query atoms with fresh names; shapes are bound once per e-class variable."""

    def __init__(self, ranks: Mapping[str, int] | None = None) -> None:
        self.atoms: list[str] = []
        self.shape_of: dict[str, str] = {}
        self.ranks = dict(ranks or {})  # e-class variable -> the rank a condition pins (`shapes.pinned_ranks`)
        self.built: dict[Pattern, tuple[str, str]] = {}  # right-side pattern → (expression, shape)
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def shape(self, term_var: str) -> str:
        if term_var not in self.shape_of:
            s = f"sh_{term_var}"
            self.atoms.append(f"(= {s} (shape {term_var}))")
            self.shape_of[term_var] = s
            if term_var in self.ranks:  # a pinned rank: the shape item by item, so shapes computed from
                # it have literal items (a right-side reshape's element count needs no `numel` table entry)
                r = self.ranks[term_var]
                self.atoms.append(f"(= (vec-length {s}) {r})")
                self.shape_of[term_var] = vec_of([self.bind(f"(vec-get {s} {k})") for k in range(r)])
        return self.shape_of[term_var]

    def bind(self, expr: str) -> str:
        """Name a computed primitive value (keeps the query's expressions small)."""
        name = self.fresh("q")
        self.atoms.append(f"(= {name} {expr})")
        return name


def _attrs_of(term: Term, q: _Query, roots: Sequence[str], where: str) -> dict[str, str]:
    """The term's attributes as egglog expressions (registry defaults fill the ones it leaves out).

    Literals become egglog literals; an attribute variable becomes its query variable (bound where
    it first occurs on a left side); `(shape P)` / `(dim P i)` (right sides only, the parser checks)
    are computed in the query from the shapes of P's variables, with P's well-typedness guarded."""
    refs = {k: v for k, v in term.attrs if _is_reference(v)}
    literal = Term(term.op, tuple((k, _placeholder(term.op, k)) if k in refs else (k, v) for k, v in term.attrs))
    try:
        attrs = ops.op_spec(term.op).normalize_attrs(literal.attr)
        out = {a: attr_literal(term.op, a, attrs[a]) for a in attr_names(term.op)}
    except EqsatError as exc:
        raise RuleError(f"{where}: {exc}") from None
    for k, v in refs.items():
        out[k] = _reference(v, q, roots, where)
    return out


def _is_reference(value: object) -> bool:
    return isinstance(value, (AttrVar, ShapeOf, DimOf)) or (
        isinstance(value, tuple) and any(isinstance(v, DimOf) for v in value))


def _placeholder(op: str, name: str) -> object:
    """A valid literal of the attribute's kind, so registry defaults and checks apply to the rest."""
    kind = {a.name: a.kind for a in ops.op_spec(op).attrs}[name]
    return {"int": 0, "ints": (), "float": 0.0}.get(kind, "")


def _reference(value: object, q: _Query, roots: Sequence[str], where: str) -> str:
    if isinstance(value, AttrVar):
        return _attr_var(value.name)
    if isinstance(value, ShapeOf):
        return _pattern_shape(value.pattern, q, roots, where)
    if isinstance(value, DimOf):
        shape, index = _pattern_shape(value.pattern, q, roots, where), int(value.index)
        items = vec_items(shape)
        if items is not None and 0 <= index < len(items):
            return items[index]
        return q.bind(f"(vec-get {shape} {index})")
    assert isinstance(value, tuple)
    return vec_of([_reference(v, q, roots, where) if isinstance(v, DimOf) else str(int(v)) for v in value])


def _pattern_shape(p: Pattern, q: _Query, roots: Sequence[str], where: str) -> str:
    """The shape of pattern P as a query expression (P is not built: only its shape is needed)."""
    return _rhs(p, q, roots, where)[1]


def _lhs(p: Pattern, bound: str | None, q: _Query, where: str) -> str:
    """Match `p` (optionally at e-class variable `bound`); returns the e-class variable."""
    if isinstance(p, Var):
        v = _var(p.name)
        if bound is not None:
            q.atoms.append(f"(= {bound} {v})")
        return v
    if p.op == "split_part":
        raise RuleError(f"{where}: split_i may only appear on a right side")
    _check_op(p.op, where)
    here = bound or q.fresh("t")
    args = [_lhs(a, None, q, where) for a in p.args]
    attrs = _attrs_of(p, q, (), where)
    q.atoms.append(f"(= {here} ({constructor(p.op)} {' '.join([*attrs.values(), *args])}))")
    for guard, value in p.guards:
        if guard != "ndim":
            raise RuleError(f"{where}: unknown guard '{guard}'")
        q.atoms.append(f"(= (vec-length {q.shape(here)}) {int(value)})")
    return here


def _check_op(op: str, where: str) -> None:
    try:
        check_encodable(op, where)
    except UnknownOpError as exc:
        raise RuleError(str(exc)) from None
    if ops.OPS[op].is_leaf:
        raise RuleError(f"{where}: leaves ({op}) cannot appear in rules")


def _rhs(p: Pattern, q: _Query, roots: Sequence[str], where: str) -> tuple[str, str]:
    """Build `p`'s egglog expression and its shape (guarding its well-typedness in `q`); a pattern
    that occurs more than once (or also under `(shape P)`) is guarded once."""
    if p not in q.built:
        q.built[p] = _build_rhs(p, q, roots, where)
    return q.built[p]


def _build_rhs(p: Pattern, q: _Query, roots: Sequence[str], where: str) -> tuple[str, str]:
    if isinstance(p, Var):
        v = _var(p.name)
        return v, q.shape(v)
    if p.op == "split_part":
        axis, index = int(p.attr["axis"]), int(p.attr["index"])
        if len(roots) != 2 or index not in (0, 1):
            raise RuleError(f"{where}: split_{index} needs a two-output rule")
        first = q.bind(f"(vec-get {q.shape(roots[0])} {axis})")
        start, stop = ("0", first) if index == 0 else (first, q.bind(f"(+ {first} (vec-get {q.shape(roots[1])} {axis}))"))
        sliced = Term("slice", (("axis", axis), ("start", 0), ("stop", 0)), p.args)
        inner, inner_shape = _rhs(p.args[0], q, roots, where)
        attrs = {"axis": str(axis), "start": start, "stop": stop}
        return _apply(sliced.op, attrs, [inner], [inner_shape], q, where)
    _check_op(p.op, where)
    built = [_rhs(a, q, roots, where) for a in p.args]
    attrs = _attrs_of(p, q, roots, where)
    expr, shape = _apply(p.op, attrs, [b[0] for b in built], [b[1] for b in built], q, where)
    for _, value in p.guards:
        q.atoms.append(f"(= (vec-length {shape}) {int(value)})")
    return expr, shape


def _apply(op: str, attrs: dict[str, str], args: list[str], shapes: list[str], q: _Query, where: str) -> tuple[str, str]:
    cases = select_cases(op, attrs, shapes)
    if len(cases) != 1:
        raise RuleError(f"{where}: cannot guard {op} with these attributes ({len(cases)} shape cases apply)")
    q.atoms.extend(case_facts(cases[0], attrs))
    result = cases[0].result
    shape = result if vec_items(result) is not None else q.bind(result)  # known items stay decidable
    return f"({constructor(op)} {' '.join([*attrs.values(), *args])})", shape


def _listed(name: str, q: _Query, lists: frozenset[str]) -> str:
    """What (dim ?v i) / (rank ?v) read: the shape of tensor variable ?v, or the matched value of
    list attribute variable ?v (a reshape's target `?S`), so a condition can say which dims a
    reshape keeps."""
    return _attr_var(name) if name in lists else q.shape(_var(name))


def _condition(t: Term | Var, q: _Query, where: str, lists: frozenset[str] = frozenset()) -> str:
    if isinstance(t, Var):
        raise RuleError(f"{where}: a condition uses ?{t.name} where an integer is expected")
    if t.op == "const":
        return str(int(t.attr["value"]))
    if t.op == DTYPE_CONDITION:
        (v,) = t.args
        assert isinstance(v, Var)
        return f"(= ({DTYPE_FUNCTION} {_var(v.name)}) {string_literal(str(t.attr['dtype']))})"
    if t.op in _CLASS_CONDITIONS:
        a, b = t.args
        assert isinstance(a, Var) and isinstance(b, Var)
        return _CLASS_CONDITIONS[t.op](_var(a.name), _var(b.name))
    if t.op == "dim":
        v, i = t.args
        if not isinstance(v, Var):
            raise RuleError(f"{where}: (dim ...) takes a ?variable")
        return f"(vec-get {_listed(v.name, q, lists)} {_condition(i, q, where, lists)})"
    if t.op == "rank":
        (v,) = t.args
        if not isinstance(v, Var):
            raise RuleError(f"{where}: (rank ...) takes a ?variable")
        return f"(vec-length {_listed(v.name, q, lists)})"
    args = " ".join(_condition(a, q, where, lists) for a in t.args)
    return f"({t.op} {args})"


_CLASS_CONDITIONS: dict[str, Callable[[str, str], str]] = {
    ORDER_CONDITION: lambda a, b: f"(< ({INPUT_ORDER_FUNCTION} {a}) ({INPUT_ORDER_FUNCTION} {b}))",
    NEXT_CONDITION: lambda a, b: f"({NEXT_SIBLING_RELATION} {a} {b})",
}
"""Condition on e-classes → its egglog query atom (facts the encoder put in: `eqsat.egraph`)."""


def _canonical(sides: Sequence[Pattern]) -> str:
    """The sides' text with variables renamed by first occurrence (to detect symmetric pairs)."""
    order: dict[str, str] = {}
    for side in sides:
        for v in variables(side):
            order.setdefault(v, f"x{len(order)}")

    def show(p: Pattern) -> str:
        if isinstance(p, Var):
            return order[p.name]
        attrs = tuple((k, attr_name(v)) for k, v in p.attrs)
        return f"({p.op} {attrs} {p.guards} {' '.join(show(a) for a in p.args)})"

    def attr_name(value: object) -> object:  # attribute variables renamed like tensor variables
        if isinstance(value, AttrVar):
            return order.setdefault("?" + value.name, f"a{len(order)}")
        return value

    return " ; ".join(show(s) for s in sides)


def is_symmetric(rule: Rule) -> bool:
    return rule.is_multi and _canonical(rule.lhs) == _canonical(rule.lhs[::-1])


def is_separable(rule: Rule) -> bool:
    """Two independent rules written as one: no shared variables, no split sizes across sides."""
    if not rule.is_multi:
        return False
    left = [set(variables(s)) for s in rule.lhs]
    right = [set(variables(s)) for s in rule.rhs]
    uses_split = any(t.op == "split_part" for s in rule.rhs for t in subterms(s))
    return not (left[0] & left[1]) and right[0] <= left[0] and right[1] <= left[1] and not uses_split


def dtype_guards(rule: Rule) -> list[str]:
    """Query atoms that keep a right side from mixing dtypes: where it joins, under an op whose
    operands must share a dtype (`ops.OpSpec.result_dtype`), values the left side does not already
    tie to one dtype, `(= (dtype a) (dtype b))`; where it applies a float-only op to a value the
    left side does not already make float, `(float_dtype (dtype a))`. Most rules need none (their
    left side ties every variable through float ops); the e-graph's `dtype` analysis is `:no-merge`,
    so a mix that slipped through would be an egglog error, never a wrong graph."""
    parent: dict[str, str] = {}
    floats: set[str] = set()
    witness: dict[str, str] = {}  # class → a variable in it (what a guard can name)
    counter = [0]

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            if ra in floats:
                floats.add(rb)
            if ra in witness:
                witness.setdefault(rb, witness[ra])

    def fresh() -> str:
        counter[0] += 1
        return f"#{counter[0]}"

    guards: list[str] = []

    def visit(p: Pattern, right: bool) -> str:
        if isinstance(p, Var):
            key = "?" + p.name
            witness.setdefault(find(key), _var(p.name))
            return key
        kids = [visit(a, right) for a in p.args]
        node = fresh()
        if p.op == "split_part" or p.op not in ops.OPS:
            if kids:
                union(node, kids[0])
            return node
        spec = ops.op_spec(p.op)
        operands = kids[1:] if spec.result_dtype == "select" else kids
        if spec.result_dtype != "attr":
            for k in operands[1:]:
                if right and find(k) != find(operands[0]) and find(k) in witness and find(operands[0]) in witness:
                    guards.append(f"(= ({DTYPE_FUNCTION} {witness[find(operands[0])]}) "
                                  f"({DTYPE_FUNCTION} {witness[find(k)]}))")
                union(k, operands[0])
        if spec.operand_kinds == ops.FLOAT_ONLY and operands:
            root = find(operands[0])
            if right and root not in floats and root in witness:
                guards.append(f"({FLOAT_RELATION} ({DTYPE_FUNCTION} {witness[root]}))")
            floats.add(root)
        if spec.result_dtype in ("same", "select") and operands:
            union(node, operands[0])
        return node

    for side in rule.lhs:
        visit(side, right=False)
    for side in rule.rhs:
        visit(side, right=True)
    return guards


def to_egglog(rule: Rule, ruleset: str, name: str | None = None) -> list[EgglogRule]:
    """The egglog rule(s) for `rule`, in `ruleset` (one, or two for a separable two-output rule)."""
    name = name or rule.name
    where = f"rule {name}" + (f" ({rule.source})" if rule.source and rule.source != name else "")
    if is_separable(rule):
        parts = [Rule(f"{name}#{i}", (rule.lhs[i],), (rule.rhs[i],), rule.source, rule.conditions) for i in range(2)]
        return [EgglogRule(p.name, rule, _text(p, ruleset, p.name, where), True) for p in parts]
    candidate = _text(rule, CANDIDATE_RULESET, name, where, candidate=True) if rule.is_multi else ""
    return [EgglogRule(name, rule, _text(rule, ruleset, name, where), rule.is_multi, candidate)]


def _text(rule: Rule, ruleset: str, name: str, where: str, candidate: bool = False) -> str:
    """The egglog rule; for a joined two-output rule it fires only on pairs recorded as unrelated
    (`PAIR_FUNCTION` = 0), and `candidate` gives the rule that records the pairs it matches."""
    q = _Query({_var(v): r for v, r in pinned_ranks(rule).items()})
    roots = [f"r{i}" for i in range(len(rule.lhs))]
    for root, side in zip(roots, rule.lhs):
        if isinstance(side, Var):
            raise RuleError(f"{where}: a left side may not be a bare variable")
        _lhs(side, root, q, where)
    for root, side in zip(roots, rule.lhs):  # a right side naming a left side (`(dim P i)`) reads the match
        q.built.setdefault(side, (root, q.shape(root)))
    if len(roots) == 2:
        q.atoms.append(f"(!= {roots[0]} {roots[1]})")
        if is_symmetric(rule):
            q.atoms.append(f"(< (uid {roots[0]}) (uid {roots[1]}))")
    lists = frozenset(a.name for p in rule.lhs for a in attr_variables(p) if a.kind == "ints")
    for cond in rule.conditions:
        q.atoms.append(_condition(cond, q, where, lists))
    q.atoms.extend(dtype_guards(rule))
    actions = []
    for root, side in zip(roots, rule.rhs):
        expr, _ = _rhs(side, q, roots, where)
        actions.append(f"(union {root} {expr})")
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    q.atoms = list(dict.fromkeys(q.atoms))  # a shape fact the left and right sides both need is checked once
    if len(roots) == 2:
        q.atoms += [f"(= pair_u0 (uid {roots[0]}))", f"(= pair_u1 (uid {roots[1]}))"]
        if candidate:
            return (f"(rule ({' '.join(q.atoms)}) ((set ({PAIR_FUNCTION} pair_u0 pair_u1) 0)) "
                    f":ruleset {ruleset} :name \"{escaped}?\")")
        q.atoms.append(f"(= ({PAIR_FUNCTION} pair_u0 pair_u1) 0)")
    return f"(rule ({' '.join(q.atoms)}) ({' '.join(actions)}) :ruleset {ruleset} :name \"{escaped}\")"


def supported(rule: Rule) -> bool:
    """Whether every op in the rule can be put in the e-graph."""
    ops_in = {t.op for s in (*rule.lhs, *rule.rhs) for t in subterms(s)} - {"split_part"}
    return all(op in SHAPE_RULES for op in ops_in)


def rule_ops(rules: Iterable[Rule]) -> set[str]:
    """The e-graph ops the rules' sides use (a right side's `split_i` is built as a slice): the
    ops whose shape rules an e-graph needs to run them."""
    return {"slice" if t.op == "split_part" else t.op for r in rules for s in (*r.lhs, *r.rhs) for t in subterms(s)}


def translate_all(rules: Sequence[Rule], ruleset_prefix: str = "rw") -> Iterator[tuple[str, EgglogRule]]:
    """(ruleset name, egglog rule) for each rule; every egglog rule gets its own ruleset."""
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        base = rule.name
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}~{seen[base]}"
        for k, er in enumerate(to_egglog(rule, f"{ruleset_prefix}{i}_{0}", name)):
            rs = f"{ruleset_prefix}{i}_{k}"
            yield rs, EgglogRule(er.name, er.rule, er.text.replace(f":ruleset {ruleset_prefix}{i}_0 ", f":ruleset {rs} "),
                                 er.multi, er.candidate.replace(f":ruleset {CANDIDATE_RULESET} ",
                                                                f":ruleset {ruleset_prefix}{CANDIDATE_RULESET} "))

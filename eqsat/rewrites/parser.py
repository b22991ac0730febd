"""Read rule files: Tensat's `converted.txt` / `converted_multi.txt` unchanged, plus our extensions.

Grammar of one line (blank lines and `#` comments are skipped):

    [name:] LHS => RHS [if COND ...]          one rule
    [name:] LHS <=> RHS [if COND ...]         a rule and its reverse (named name, name-rev)
    [name:] L1 ; L2 => R1 ; R2                a two-output (multi-pattern) rule

In a file read with `multi=True` (Tensat's two-output format) consecutive lines pair up into one
multi-pattern rule. Terms are s-expressions with integer attributes written positionally, as Tensat
writes them: `(matmul ACT a b)`, `(conv2d SH SW PAD ACT x w)`, `(concat AXIS NDIM a b)`,
`(split_0 (split AXIS t))`, `(poolmax x KH KW SH SW PAD ACT)`; any other IR op is written with its
attributes first, in registry order, then its tensor arguments; list attributes as `[1 0]`.
Conditions are s-expressions over shapes, e.g. `(= (dim ?x 1) (dim ?y 1))`, `(= (rank ?x) 4)`.

Attribute references (our extension; Tensat's files use none): a float attribute may be written
`?eps` and a list attribute `?S`, matching any value on the left side and reusing it on the right;
a list attribute may be `(shape P)` (the shape of a tensor pattern P of the rule) and a list item
`(dim P I)` (one of its dimensions), e.g. `(broadcast (shape (matmul 0 ?x ?w)) [1] ?b)` or
`[1 (dim ?m 0)]`. These let a right side broadcast per-channel vectors to shapes that the rule does
not spell out (batchnorm folding, bias merges). A right side may only use attribute variables bound
on the left.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from eqsat import ops
from eqsat.errors import RuleParseError
from eqsat.rewrites.rule import CLASS_CONDITIONS, DTYPE_CONDITION, AttrVar, DimOf, Pattern, Rule, ShapeOf, Term, Var

Sexp = str | list["Sexp"]

# Tensat's spelling of ops whose layout differs from "attributes first, then tensors":
# each slot is an attribute name, "*" for a tensor argument, or "ndim" for the rank guard.
TENSAT_SLOTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "concat": ("axis", "ndim", "*", "*"),
    "poolmax": ("*", "kernel_h", "kernel_w", "stride_h", "stride_w", "pad", "act"),
    "poolavg": ("*", "kernel_h", "kernel_w", "stride_h", "stride_w", "pad", "act"),
})

_TOKEN = re.compile(r"\s*(?:(\()|(\))|(\[)|(\])|([^\s()\[\]]+))")


def _tokenize(text: str, where: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise RuleParseError(f"{where}: unexpected character {text[pos]!r} at column {pos + 1}")
        tokens.append(m.group(m.lastindex or 0))
        pos = m.end()
    return tokens


def _read(tokens: list[str], pos: int, where: str) -> tuple[Sexp, int]:
    if pos >= len(tokens):
        raise RuleParseError(f"{where}: expected a term, found the end of the line")
    tok = tokens[pos]
    if tok in "([":
        close = ")" if tok == "(" else "]"
        items: list[Sexp] = ["[" ] if tok == "[" else []
        pos += 1
        while pos < len(tokens) and tokens[pos] != close:
            if tokens[pos] in ")]":
                raise RuleParseError(f"{where}: '{tokens[pos]}' closes a '{tok}'")
            item, pos = _read(tokens, pos, where)
            items.append(item)
        if pos >= len(tokens):
            raise RuleParseError(f"{where}: missing '{close}'")
        return items, pos + 1
    if tok in ")]":
        raise RuleParseError(f"{where}: unexpected '{tok}'")
    return tok, pos + 1


MAX_DEPTH = 100  # nesting deeper than any real rule; every later stage recurses over terms


def parse_sexp(text: str, where: str = "<rule>") -> Sexp:
    tokens = _tokenize(text, where)
    depth = deepest = 0
    for tok in tokens:
        depth += tok in "([" and 1 or (tok in ")]" and -1 or 0)
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise RuleParseError(f"{where}: terms nested {deepest} deep; at most {MAX_DEPTH} are accepted")
    sexp, pos = _read(tokens, 0, where)
    if pos != len(tokens):
        raise RuleParseError(f"{where}: unexpected text after the term: {' '.join(tokens[pos:])}")
    return sexp


def _int(tok: Sexp, what: str, where: str) -> int:
    if isinstance(tok, str) and re.fullmatch(r"-?\d+", tok):
        return int(tok)
    raise RuleParseError(f"{where}: expected an integer for {what}, found {_show(tok)}")


def _show(s: Sexp) -> str:
    return s if isinstance(s, str) else "(" + " ".join(map(_show, s)) + ")"


def _slots(op: str, where: str) -> tuple[str, ...]:
    if op in TENSAT_SLOTS:
        return TENSAT_SLOTS[op]
    if op not in ops.OPS or ops.OPS[op].is_leaf or ops.OPS[op].arity is None:
        known = sorted({*TENSAT_SLOTS, "split", "split_0", "split_1",
                        *(n for n, s in ops.OPS.items() if not s.is_leaf)})
        raise RuleParseError(f"{where}: unknown operator '{op}'; expected one of {', '.join(known)}")
    spec = ops.OPS[op]
    return tuple(a.name for a in spec.attrs) + ("*",) * (spec.arity or 0)


def to_pattern(s: Sexp, where: str) -> Pattern:
    """Turn an s-expression in Tensat's surface syntax into a `Pattern`."""
    if isinstance(s, str):
        if s.startswith("?") and len(s) > 1:
            return Var(s[1:])
        raise RuleParseError(f"{where}: expected a term or a ?variable, found '{s}'")
    if not s or not isinstance(s[0], str):
        raise RuleParseError(f"{where}: a term must start with an operator name, found {_show(s)}")
    op, args = s[0], s[1:]
    if op in ("split_0", "split_1"):
        inner = args[0] if len(args) == 1 else None
        if not (isinstance(inner, list) and inner and inner[0] == "split" and len(inner) == 3):
            raise RuleParseError(f"{where}: {op} must be applied to (split AXIS term), found {_show(s)}")
        axis = _int(inner[1], "split's axis", where)
        return Term("split_part", (("axis", axis), ("index", int(op[-1]))), (to_pattern(inner[2], where),))
    if op == "split":
        raise RuleParseError(f"{where}: (split ...) may only appear under split_0 or split_1")
    slots = _slots(op, where)
    if len(args) != len(slots):
        raise RuleParseError(f"{where}: '{op}' takes {len(slots)} arguments ({' '.join(slots)}), got {len(args)}")
    spec = ops.OPS[op]
    kinds = {a.name: a.kind for a in spec.attrs}
    attrs: list[tuple[str, Any]] = []
    guards: list[tuple[str, int]] = []
    tensors: list[Pattern] = []
    for slot, arg in zip(slots, args):
        if slot == "*":
            tensors.append(to_pattern(arg, where))
        elif slot == "ndim":
            guards.append(("ndim", _int(arg, f"{op}'s ndim", where)))
        elif isinstance(arg, str) and arg.startswith("?") and kinds.get(slot) in ("int", "ints", "float") and len(arg) > 1:
            attrs.append((slot, AttrVar(arg[1:], kinds[slot])))
        elif kinds.get(slot) == "ints" and isinstance(arg, list) and arg[:1] == ["shape"] and len(arg) == 2:
            attrs.append((slot, ShapeOf(to_pattern(arg[1], where))))
        elif kinds.get(slot) == "ints":
            if not (isinstance(arg, list) and arg[:1] == ["["]):
                raise RuleParseError(f"{where}: expected a list like [1 0], (shape P) or ?S for {op}'s {slot}, "
                                     f"found {_show(arg)}")
            attrs.append((slot, tuple(_list_item(a, f"{op}'s {slot}", where) for a in arg[1:])))
        elif kinds.get(slot) == "str":
            attrs.append((slot, _dtype_name(arg, f"{op}'s {slot}", where)))
        elif kinds.get(slot) == "float":
            try:
                attrs.append((slot, float(arg if isinstance(arg, str) else "not a number")))
            except ValueError:
                raise RuleParseError(f"{where}: expected a number for {op}'s {slot}, found {_show(arg)}") from None
        else:
            attrs.append((slot, _int(arg, f"{op}'s {slot}", where)))
    return Term(op, tuple(sorted(attrs)), tuple(tensors), tuple(guards))


def _dtype_name(tok: Sexp, what: str, where: str) -> str:
    """A dtype written bare (`bfloat16`, `float32`): the only string attribute a rule may name
    (`convert_element_type`'s target, a `(dtype ?x NAME)` condition's dtype)."""
    if isinstance(tok, str) and tok in ops.DTYPES:
        return tok
    raise RuleParseError(f"{where}: expected a dtype ({', '.join(ops.DTYPES)}) for {what}, found {_show(tok)}")


def _list_item(item: Sexp, what: str, where: str) -> int | DimOf:
    if isinstance(item, list) and item[:1] == ["dim"] and len(item) == 3:
        return DimOf(to_pattern(item[1], where), _int(item[2], "a dim index", where))
    return _int(item, what, where)


def _sides(text: str, where: str) -> tuple[Pattern, ...]:
    return tuple(to_pattern(parse_sexp(part, where), where) for part in text.split(";"))


_LINE = re.compile(r"^\s*(?:(?P<name>[A-Za-z_][\w.\-]*)\s*:\s*)?(?P<lhs>.*?)\s*(?P<arrow><=>|=>)\s*(?P<rhs>.*)$")


def parse_rule_text(line: str, where: str = "<rule>", name: str | None = None, check: bool = True) -> list[Rule]:
    """Parse one rule line; returns one rule, or two for `<=>`."""
    m = _LINE.match(line)
    if not m or not m.group("lhs"):
        raise RuleParseError(f"{where}: expected 'LHS => RHS', found {line.strip()!r}")
    rhs_text, conditions = m.group("rhs"), cast(tuple[Term, ...], ())
    if " if " in rhs_text:
        rhs_text, cond_text = rhs_text.split(" if ", 1)
        conditions = tuple(_condition(parse_sexp(c, where), where) for c in _split_top(cond_text, where))
    lhs, rhs = _sides(m.group("lhs"), where), _sides(rhs_text, where)
    if len(lhs) != len(rhs):
        raise RuleParseError(f"{where}: {len(lhs)} left side(s) but {len(rhs)} right side(s)")
    rule_name = m.group("name") or name or where
    rules = [Rule(rule_name, lhs, rhs, where, conditions)]
    if m.group("arrow") == "<=>":
        rules.append(Rule(rule_name + "-rev", rhs, lhs, where, conditions))
    for rule in rules if check else ():
        _check_vars(rule, where)
    return rules


def _split_top(text: str, where: str) -> list[str]:
    """Split `(a) (b)` into its top-level s-expressions. Every token must end up in one: a
    condition cut short (a missing `)`) is an error, never silently dropped, since a dropped
    guard would make an unsound rule look proved."""
    tokens, out, depth, start = _tokenize(text, where), [], 0, 0
    for i, tok in enumerate(tokens):
        depth += tok in "([" and 1 or (tok in ")]" and -1 or 0)
        if depth < 0:
            raise RuleParseError(f"{where}: unexpected '{tok}' in the condition {text.strip()!r}")
        if depth == 0:
            out.append(" ".join(tokens[start:i + 1]).replace("( ", "(").replace(" )", ")"))
            start = i + 1
    if start < len(tokens):
        raise RuleParseError(f"{where}: the condition {' '.join(tokens[start:])!r} is cut short (missing ')')")
    if not out:
        raise RuleParseError(f"{where}: 'if' must be followed by a condition such as (= (dim ?x 0) 1)")
    return out


_COMPARISONS = {"=": 2, "!=": 2, "<": 2, "<=": 2}
_CONDITION_OPS = {**_COMPARISONS, "dim": 2, "rank": 1, "+": 2, "*": 2, "-": 2, "%": 2}
_CONDITION_HELP = ("use (= a b), (!= a b), (< a b), (<= a b) over (dim ?x I), (rank ?x), integers, + - * %, "
                   "or (order ?a ?b), (next ?a ?b), (dtype ?a DTYPE)")


def _condition(s: Sexp, where: str, top: bool = True) -> Term:
    """Side conditions: a comparison of integer expressions over `(dim ?x i)` and `(rank ?x)`;
    a ?variable may appear only as the tensor of dim / rank. `(order ?a ?b)` (top level only) asks
    that ?a and ?b be values of the input graph (their e-classes hold a term the encoder put in)
    and ?a come first in it: it picks one of several equivalent applications (an n-ary merge of the
    input's ops built in one order, not in all n!), restricts only where a rule applies, and so is
    true for the verifier. `(next ?a ?b)` narrows that to consecutive siblings (see
    `eqsat.rewrites.rule.NEXT_CONDITION`), so an n-ary merge builds runs of siblings, not every subset.
    `(dtype ?a bfloat16)` (top level only) asks that ?a have that dtype (`rule.DTYPE_CONDITION`)."""
    if top and isinstance(s, list) and s and s[0] == DTYPE_CONDITION:
        if len(s) != 3 or not (isinstance(s[1], str) and s[1].startswith("?") and len(s[1]) > 1):
            raise RuleParseError(f"{where}: bad condition {_show(s)}; (dtype ?a DTYPE) takes a ?variable and a dtype")
        name = _dtype_name(s[2], "a dtype condition", where)
        return Term(DTYPE_CONDITION, (("dtype", name),), (Var(s[1][1:]),))
    if top and isinstance(s, list) and s and s[0] in CLASS_CONDITIONS:
        if len(s) != 3 or not all(isinstance(a, str) and a.startswith("?") and len(a) > 1 for a in s[1:]):
            raise RuleParseError(f"{where}: bad condition {_show(s)}; ({s[0]} ?a ?b) takes two ?variables")
        return Term(str(s[0]), (), tuple(Var(str(a)[1:]) for a in s[1:]))
    if isinstance(s, str):
        if top or s.startswith("?"):
            raise RuleParseError(f"{where}: bad condition {_show(s)}; {_CONDITION_HELP}")
        return Term("const", (("value", _int(s, "a condition constant", where)),))
    ops_here = _COMPARISONS if top else _CONDITION_OPS
    if not s or not isinstance(s[0], str) or s[0] not in ops_here or len(s) - 1 != ops_here[s[0]]:
        raise RuleParseError(f"{where}: bad condition {_show(s)}; {_CONDITION_HELP}")
    if s[0] in ("dim", "rank"):
        tensor = s[1]
        if not (isinstance(tensor, str) and tensor.startswith("?") and len(tensor) > 1):
            raise RuleParseError(f"{where}: ({s[0]} ...) takes a ?variable of the rule, found {_show(tensor)}")
        rest = tuple(_condition(a, where, top=False) for a in s[2:])
        return Term(s[0], (), (Var(tensor[1:]), *rest))
    return Term(s[0], (), tuple(_condition(a, where, top=False) for a in s[1:]))


def _check_vars(rule: Rule, where: str) -> None:
    from eqsat.rewrites.rule import attr_variables, referenced_variables, subterms, term_attr_refs, variables

    bound = {v for p in rule.lhs for v in variables(p)} | {a.name for p in rule.lhs for a in attr_variables(p)}
    used = {v for p in rule.rhs for v in variables(p)} | {a.name for p in rule.rhs for a in attr_variables(p)}
    used |= {v for p in rule.rhs for t in subterms(p) for v in referenced_variables(t)}
    free = used - bound
    if free:
        raise RuleParseError(f"{where}: right side uses ?{', ?'.join(sorted(free))}, not bound on the left")
    in_conditions = {v for c in rule.conditions for v in variables(c)}
    unknown = in_conditions - bound
    if unknown:
        raise RuleParseError(f"{where}: condition names ?{', ?'.join(sorted(unknown))}, which the left side "
                             "does not bind")
    derived = [r for p in rule.lhs for t in subterms(p) for r in term_attr_refs(t) if not isinstance(r, AttrVar)]
    if derived:
        raise RuleParseError(f"{where}: {derived[0]} may only appear on a right side (a left side matches "
                             "literal attributes or ?variables)")
    if len(rule.lhs) == 1 and any(t.op == "split_part" for p in (*rule.lhs, *rule.rhs) for t in subterms(p)):
        raise RuleParseError(f"{where}: split_0/split_1 may only appear in a two-output rule (L0 ; L1 => R0 ; R1), "
                             "whose two left sides give the split sizes")


def parse_rules(lines: Iterable[str], source: str, multi: bool = False) -> list[Rule]:
    rules: list[Rule] = []
    numbered = [(i + 1, line.strip()) for i, line in enumerate(lines)]
    numbered = [(n, line) for n, line in numbered if line and not line.startswith("#")]
    if not multi:
        for n, line in numbered:
            rules.extend(parse_rule_text(line, f"{source}:{n}"))
        return rules
    if len(numbered) % 2:
        raise RuleParseError(f"{source}: a two-output rule file needs pairs of lines, found {len(numbered)} rules lines")
    for (n1, a), (n2, b) in zip(numbered[::2], numbered[1::2]):
        first = parse_rule_text(a, f"{source}:{n1}", check=False)[0]
        second = parse_rule_text(b, f"{source}:{n2}", check=False)[0]
        rule = Rule(f"{source}:{n1}-{n2}", first.lhs + second.lhs, first.rhs + second.rhs, f"{source}:{n1}",
                    first.conditions + second.conditions)
        _check_vars(rule, rule.source)
        rules.append(rule)
    return rules


def load_rules(path: str | Path, multi: bool | None = None) -> list[Rule]:
    """Load a rule file; `multi=None` treats files named `*multi*` as Tensat two-output files."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleParseError(f"{path}: cannot read rule file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleParseError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    if multi is None:
        multi = "multi" in path.name
    return parse_rules(text.splitlines(), path.name, multi)


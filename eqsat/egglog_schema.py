"""The egglog vocabulary for tensor terms: one constructor per IR op and shapes as egglog values.

Shapes live inside egglog as `(shape T) -> (Vec i64)`, a function without a merge, so a rewrite
that gives one e-class two shapes is an egglog error instead of a silent wrong graph. The same
symbolic shape table produces both the analysis rules that compute shapes from children and the
guards that keep a rule's right side well-typed (see `eqsat.rewrites.to_egglog`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from eqsat import ops
from eqsat.errors import UnknownOpError

SHAPE_SORT = "IV"
TERM_SORT = "T"
SHAPE_RULESET = "shapes"

# Egglog expressions are plain strings: variable names, integer literals, or calls.
Expr = str


@dataclass(frozen=True)
class ShapeCase:
    """One way an op can be well-typed: facts that must hold and the resulting shape.

    `attr_equals` are conditions on integer attributes (e.g. pad = SAME); when the attribute is a
    literal they are decided in Python, otherwise they become egglog facts.
    """

    facts: tuple[Expr, ...]
    result: Expr
    attr_equals: tuple[tuple[str, int], ...] = ()


ShapeFn = Callable[[Mapping[str, Expr], Sequence[Expr]], tuple[ShapeCase, ...]]


def _length(s: Expr) -> Expr:
    return f"(vec-length {s})"


def _get(s: Expr, i: Expr | int) -> Expr:
    return f"(vec-get {s} {i})"


def _same(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase(tuple(f"(= {xs[0]} {x})" for x in xs[1:]), xs[0]),)


def _smul(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    scalars = ["(vec-empty)"] + ["(vec-of " + " ".join(["1"] * r) + ")" for r in range(1, 5)]
    return tuple(ShapeCase((f"(= {xs[1]} {s})",), xs[0]) for s in scalars)


def _act_ok(act: Expr) -> tuple[Expr, ...]:
    return (f"(>= {act} 0)", f"(<= {act} 3)")


def _matmul(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    a, b = xs
    n = _length(a)
    facts = (
        f"(= {n} {_length(b)})", f"(>= {n} 2)", f"(<= {n} 3)",
        f"(= {_get(a, f'(- {n} 1)')} {_get(b, f'(- {n} 2)')})",
        f"(= (vec-pop (vec-pop {a})) (vec-pop (vec-pop {b})))",  # equal batch prefix
        *_act_ok(attrs["act"]),
    )
    return (ShapeCase(facts, f"(vec-push (vec-pop {a}) {_get(b, f'(- {n} 1)')})"),)


def _window(size: Expr, k: Expr, stride: Expr, pad: int) -> Expr:
    """Output length of a window op, TensorFlow's SAME / VALID rule (as `ops.window_out_and_pads`)."""
    if pad == ops.Padding.SAME:
        return f"(/ (+ {size} (- {stride} 1)) {stride})"
    return f"(+ (/ (- {size} {k}) {stride}) 1)"


def _conv2d(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    x, w = xs
    sh, sw = attrs["stride_h"], attrs["stride_w"]
    c, ci, o = _get(x, 1), _get(w, 1), _get(w, 0)
    cases = []
    for pad in ops.Padding:
        ho, wo = _window(_get(x, 2), _get(w, 2), sh, pad), _window(_get(x, 3), _get(w, 3), sw, pad)
        facts = (
            f"(= {_length(x)} 4)", f"(= {_length(w)} 4)", f"(>= {sh} 1)", f"(>= {sw} 1)", f"(> {ci} 0)",
            f"(= (% {c} {ci}) 0)", f"(= (% {o} (/ {c} {ci})) 0)", f"(>= {ho} 1)", f"(>= {wo} 1)",
            *_act_ok(attrs["act"]),
        )
        cases.append(ShapeCase(facts, f"(vec-of {_get(x, 0)} {o} {ho} {wo})", (("pad", int(pad)),)))
    return tuple(cases)


def _pool(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,) = xs
    kh, kw, sh, sw = attrs["kernel_h"], attrs["kernel_w"], attrs["stride_h"], attrs["stride_w"]
    cases = []
    for pad in ops.Padding:
        ho, wo = _window(_get(x, 2), kh, sh, pad), _window(_get(x, 3), kw, sw, pad)
        facts = (f"(= {_length(x)} 4)", f"(>= {kh} 1)", f"(>= {kw} 1)", f"(>= {sh} 1)", f"(>= {sw} 1)",
                 f"(>= {ho} 1)", f"(>= {wo} 1)", *_act_ok(attrs["act"]))
        cases.append(ShapeCase(facts, f"(vec-of {_get(x, 0)} {_get(x, 1)} {ho} {wo})", (("pad", int(pad)),)))
    return tuple(cases)


def _concat(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    a, b = xs
    axis = attrs["axis"]
    facts = (f"(>= {axis} 0)", f"(< {axis} {_length(a)})",
             f"(= (vec-set {a} {axis} 0) (vec-set {b} {axis} 0))")  # agree on every other axis
    return (ShapeCase(facts, f"(vec-set {a} {axis} (+ {_get(a, axis)} {_get(b, axis)}))"),)


def _slice(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,) = xs
    axis, start, stop = attrs["axis"], attrs["start"], attrs["stop"]
    facts = (f"(>= {axis} 0)", f"(< {axis} {_length(x)})", f"(>= {start} 0)", f"(< {start} {stop})",
             f"(<= {stop} {_get(x, axis)})")
    return (ShapeCase(facts, f"(vec-set {x} {axis} (- {stop} {start}))"),)


def _enlarge(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    w, ref = xs
    facts = (f"(= {_length(w)} 4)", f"(= {_length(ref)} 4)",
             *(f"(<= {_get(w, i)} {_get(ref, i)})" for i in (2, 3)),
             *(f"(= (% (- {_get(ref, i)} {_get(w, i)}) 2) 0)" for i in (2, 3)))
    return (ShapeCase(facts, f"(vec-of {_get(w, 0)} {_get(w, 1)} {_get(ref, 2)} {_get(ref, 3)})"),)


# IR op → symbolic shape function. Ops missing here (split: encoded as slices; transpose, reshape,
# batchnorm: list/float attributes) cannot be put in the e-graph.
SHAPE_RULES: Mapping[str, ShapeFn] = {
    "ewadd": _same, "ewmul": _same, "relu": _same, "tanh": _same, "sigmoid": _same,
    "smul": _smul, "matmul": _matmul, "conv2d": _conv2d, "poolmax": _pool, "poolavg": _pool,
    "concat": _concat, "slice": _slice, "enlarge": _enlarge,
}
BINARY_ONLY = frozenset({"concat"})  # variadic in the IR, binary (nested) in the e-graph


def constructor(op: str) -> str:
    """The egglog constructor name of an IR op: stable, capitalised (`matmul` → `Matmul`)."""
    return op[:1].upper() + op[1:]


def op_of_constructor(name: str) -> str:
    return name[:1].lower() + name[1:]


def tensor_arity(op: str) -> int:
    spec = ops.op_spec(op)
    return 2 if op in BINARY_ONLY else int(spec.arity or 0)


def encodable_ops() -> tuple[str, ...]:
    return tuple(op for op in ops.OPS if op in SHAPE_RULES or ops.OPS[op].is_leaf)


def check_encodable(op: str, where: str) -> None:
    if op not in ops.OPS:
        raise UnknownOpError(f"{where}: unknown op '{op}'")
    if op not in SHAPE_RULES and not ops.OPS[op].is_leaf:
        raise UnknownOpError(f"{where}: op '{op}' cannot be put in the e-graph; "
                             f"supported: {', '.join(encodable_ops())} (and split, as slices)")


def int_attr_names(op: str) -> tuple[str, ...]:
    """Integer attributes in registry order: the constructor's leading arguments."""
    return tuple(a.name for a in ops.op_spec(op).attrs if a.kind == "int")


def select_cases(op: str, attrs: Mapping[str, Expr], shapes: Sequence[Expr]) -> list[ShapeCase]:
    """The op's cases whose attribute conditions are not refuted by literal attributes."""
    out = []
    for case in SHAPE_RULES[op](attrs, shapes):
        literal = [(k, v) for k, v in case.attr_equals if _is_int(attrs[k])]
        if all(int(attrs[k]) == v for k, v in literal):
            out.append(case)
    return out


def case_facts(case: ShapeCase, attrs: Mapping[str, Expr]) -> list[Expr]:
    return [*(f"(= {attrs[k]} {v})" for k, v in case.attr_equals if not _is_int(attrs[k])), *case.facts]


def _is_int(expr: Expr) -> bool:
    return expr.lstrip("-").isdigit()


def declarations() -> str:
    """Sorts, constructors, the shape function, and the shape-analysis ruleset."""
    ctors = []
    for op in encodable_ops():
        spec = ops.OPS[op]
        if spec.is_leaf:
            ctors.append(f"({constructor(op)} String)")
        else:
            args = ["i64"] * len(int_attr_names(op)) + [TERM_SORT] * tensor_arity(op)
            ctors.append(f"({constructor(op)} {' '.join(args)})")
    lines = [
        f"(sort {SHAPE_SORT} (Vec i64))",
        f"(datatype {TERM_SORT} {' '.join(ctors)})",
        f"(function shape ({TERM_SORT}) {SHAPE_SORT} :no-merge)",
        f"(function uid ({TERM_SORT}) i64 :merge (min old new))",
        f"(ruleset {SHAPE_RULESET})",
    ]
    for op in SHAPE_RULES:
        lines.extend(_analysis_rules(op))
    return "\n".join(lines)


def _analysis_rules(op: str) -> list[str]:
    attrs = {a: f"a_{a}" for a in int_attr_names(op)}
    kids = [f"x{i}" for i in range(tensor_arity(op))]
    shapes = [f"s{i}" for i in range(len(kids))]
    term = f"({constructor(op)} {' '.join([*attrs.values(), *kids])})"
    rules = []
    for k, case in enumerate(select_cases(op, attrs, shapes)):
        query = [f"(= e {term})", *(f"(= {s} (shape {x}))" for s, x in zip(shapes, kids)), *case_facts(case, attrs)]
        rules.append(f"(rule ({' '.join(query)}) ((set (shape e) {case.result})) "
                     f":ruleset {SHAPE_RULESET} :name \"shape:{op}:{k}\")")
    return rules

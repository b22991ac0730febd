"""The egglog vocabulary for tensor terms: one constructor per IR op and shapes as egglog values.

Constructors are derived from the op registry: each attribute becomes a leading argument of the
egglog sort its kind maps to (`ATTR_SORTS`: int → i64, ints → `Vec i64`, float → f64, str →
String), then one `T` per tensor input. Leaves carry their shape as an attribute, so every shape,
leaves' included, is computed inside egglog.

Shapes live inside egglog as `(shape T) -> (Vec i64)`, a function without a merge, so a rewrite
that gives one e-class two shapes is an egglog error instead of a silent wrong graph. The same
symbolic shape table (`SHAPE_RULES`, one entry per registry op) produces both the analysis rules
that compute shapes from children and the guards that keep a rule's right side well-typed (see
`eqsat.rewrites.to_egglog`). Every op's shape is computed in egglog; none is asserted from Python.
Ops whose shape depends on a list attribute's length (transpose, reshape, reductions, broadcast)
have one case per length up to `MAX_RANK`; a literal attribute selects its case in Python, and so
does a `(vec-of ...)` of computed items (a rule's `[1 (dim ?m 0)]`), whose length is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eqsat import ops
from eqsat.errors import ShapeError, UnknownOpError

SHAPE_SORT = "IV"
TERM_SORT = "T"
SHAPE_RULESET = "shapes"
INPUT_ORDER_FUNCTION = "input_order"  # e-class → its first value's index in the input graph (input values only)
NEXT_SIBLING_RELATION = "input_next"  # (class, class): consecutive sibling operands in the input graph
DTYPE_FUNCTION = "dtype"  # e-class → its dtype, :no-merge: a rewrite that mixes two dtypes is an egglog error
FLOAT_RELATION = "float_dtype"  # the float dtype names (`ops.FLOAT_DTYPES`), for rules' dtype guards
PAIR_FUNCTION = "pair_related"  # (uid, uid) → 1 if one class descends from the other, 0 if not
MAX_RANK = 7  # highest rank the list-attribute ops (and `numel`) have shape cases for

# Registry attribute kind → egglog sort of the constructor argument.
ATTR_SORTS: Mapping[str, str] = {"int": "i64", "ints": SHAPE_SORT, "float": "f64", "str": "String"}

# Egglog expressions are plain strings: variable names, literals, or calls.
Expr = str


@dataclass(frozen=True)
class ShapeCase:
    """One way an op can be well-typed: facts that must hold and the resulting shape.

    `attr_equals` (integer attribute = value) and `attr_lengths` (list attribute has that length)
    select the case: decided in Python when the attribute is a literal, else egglog facts.
    """

    facts: tuple[Expr, ...]
    result: Expr
    attr_equals: tuple[tuple[str, int], ...] = ()
    attr_lengths: tuple[tuple[str, int], ...] = ()


ShapeFn = Callable[[Mapping[str, Expr], Sequence[Expr]], tuple[ShapeCase, ...]]


# --- literals -------------------------------------------------------------------------------------

def literal_int(expr: Expr) -> int | None:
    return int(expr) if expr.lstrip("-").isdigit() else None


def vec_items(expr: Expr) -> tuple[Expr, ...] | None:
    """The items of `(vec-of a b ...)` (each an expression), else None: a list attribute built item
    by item (`[1 (dim ?m 0)]`) or a shape computed item by item has a known length and items."""
    if expr == "(vec-empty)":
        return ()
    if not (expr.startswith("(vec-of ") and expr.endswith(")")):
        return None
    items, depth, start = [], 0, None
    for i, c in enumerate(expr[len("(vec-of "):-1], len("(vec-of ")):
        if c == " " and depth == 0:
            if start is not None:
                items.append(expr[start:i])
                start = None
            continue
        if start is None:
            start = i
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            return None  # the first ')' closed the vec-of: not one call
    if depth != 0:
        return None
    if start is not None:
        items.append(expr[start:-1])
    return tuple(items)


def vec_literal(values: Sequence[int]) -> Expr:
    return "(vec-of" + "".join(f" {int(v)}" for v in values) + ")"


def float_literal(value: float) -> Expr:
    if not math.isfinite(value):
        raise ShapeError(f"float attribute {value!r} cannot be put in the e-graph (not finite)")
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def string_literal(text: str) -> Expr:
    if '"' in text or "\\" in text:
        raise ShapeError(f"string attribute {text!r} may not contain quotes or backslashes")
    return f'"{text}"'


# List attributes whose order does not matter; kept sorted so one term has one spelling (and the
# reductions' shape rule removes axes from the back).
SORTED_ATTRS: frozenset[tuple[str, str]] = frozenset({("reduce_sum", "axes"), ("reduce_max", "axes")})


def attr_literal(op: str, name: str, value: Any) -> Expr:
    """An attribute value as an egglog literal, by its registry kind."""
    kind = {a.name: a.kind for a in ops.op_spec(op).attrs}[name]
    if kind == "int":
        return str(int(value))
    if kind == "ints":
        items = [int(v) for v in value]
        return vec_literal(sorted(items) if (op, name) in SORTED_ATTRS else items)
    if kind == "float":
        return float_literal(float(value))
    return string_literal(str(value))


# --- shape helpers --------------------------------------------------------------------------------

def _length(s: Expr) -> Expr:
    items = vec_items(s)
    return str(len(items)) if items is not None else f"(vec-length {s})"


def _get(s: Expr, i: Expr | int) -> Expr:
    lit, idx = vec_items(s), literal_int(str(i))
    if lit is not None and idx is not None and 0 <= idx < len(lit):
        return str(lit[idx])
    return f"(vec-get {s} {i})"


def _product(items: Sequence[Expr]) -> Expr:
    if all(literal_int(x) is not None for x in items):
        return str(math.prod(int(x) for x in items))
    if not items:
        return "1"
    out = items[0]
    for item in items[1:]:
        out = f"(* {out} {item})"  # egglog's * is binary
    return out


def _numel(shape: Expr) -> Expr:
    """Element count of a shape: computed here for a literal, else the `numel` table (filled for
    every e-class's shape, so a guard on a right-side subterm whose shape is computed and not
    literal finds no row and the rule does not fire there)."""
    items = vec_items(shape)
    return _product(items) if items is not None else f"(numel {shape})"


def _items(vec: Expr, n: int) -> list[Expr]:
    return [_get(vec, i) for i in range(n)]


def _increasing(items: Sequence[Expr]) -> list[Expr]:
    return [f"(< {a} {b})" for a, b in zip(items, items[1:])]


def _act_ok(act: Expr) -> tuple[Expr, ...]:
    return (f"(>= {act} 0)", f"(<= {act} 3)")


# --- shape rules ----------------------------------------------------------------------------------

def _leaf(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase((), attrs["shape"]),)


def _same(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase(tuple(f"(= {xs[0]} {x})" for x in xs[1:]), xs[0]),)


def _smul(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase((f"(= {_numel(xs[1])} 1)",), xs[0]),)


def _matmul(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    a, b = xs
    n = _length(a)
    facts = (
        f"(= {n} {_length(b)})", f"(>= {n} 2)", f"(<= {n} {ops.MATMUL_MAX_RANK})",
        f"(= {_get(a, f'(- {n} 1)')} {_get(b, f'(- {n} 2)')})",
        f"(= (vec-pop (vec-pop {a})) (vec-pop (vec-pop {b})))",  # equal batch prefix
        *_act_ok(attrs["act"]),
    )
    items = vec_items(a)
    if items is not None and len(items) >= 1:  # a known rank: the result's items stay known
        return (ShapeCase(facts, vec_of([*items[:-1], _get(b, len(items) - 1)])),)
    return (ShapeCase(facts, f"(vec-push (vec-pop {a}) {_get(b, f'(- {n} 1)')})"),)


def _window(size: Expr, k: Expr, stride: Expr, pad: int) -> Expr:
    """Output length of a window op, TensorFlow's SAME / VALID rule (as `ops.window_out_and_pads`)."""
    if pad == ops.Padding.SAME:
        return f"(/ (+ {size} (- {stride} 1)) {stride})"
    return f"(+ (/ (- {size} {k}) {stride}) 1)"


def _conv2d(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    """NCHW x OIHW, with any leading batch axes the input and the weight share (`ops.CONV_MAX_RANK`)."""
    x, w = xs
    sh, sw = attrs["stride_h"], attrs["stride_w"]

    def back(s: Expr, k: int) -> Expr:  # the k-th dim from the end
        return _get(s, _from_end(s, str(-k)))

    c, ci, o = back(x, 3), back(w, 3), back(w, 4)
    n = _length(x)
    lead_x, lead_w = x, w
    for _ in range(4):
        lead_x, lead_w = f"(vec-pop {lead_x})", f"(vec-pop {lead_w})"
    cases = []
    for pad in ops.Padding:
        ho, wo = _window(back(x, 2), back(w, 2), sh, pad), _window(back(x, 1), back(w, 1), sw, pad)
        facts = (
            f"(= {n} {_length(w)})", f"(>= {n} 4)", f"(<= {n} {ops.CONV_MAX_RANK})", f"(= {lead_x} {lead_w})",
            f"(>= {sh} 1)", f"(>= {sw} 1)", f"(> {ci} 0)",
            f"(= (% {c} {ci}) 0)", f"(= (% {o} (/ {c} {ci})) 0)", f"(>= {ho} 1)", f"(>= {wo} 1)",
            *_act_ok(attrs["act"]),
        )
        items = vec_items(x)
        if items is not None:  # a known rank: the result's items stay known
            result = vec_of([*items[:-3], o, ho, wo])
        else:
            result = f"(vec-push (vec-push (vec-push (vec-pop (vec-pop (vec-pop {x}))) {o}) {ho}) {wo})"
        cases.append(ShapeCase(facts, result, (("pad", int(pad)),)))
    return tuple(cases)


def _conv2d_nhwc(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    """NHWC x HWIO → NHWC (rank 4 only): conv2d's facts with the axes where this layout keeps them."""
    x, w = xs
    sh, sw = attrs["stride_h"], attrs["stride_w"]
    c, ci, o = _get(x, 3), _get(w, 2), _get(w, 3)
    cases = []
    for pad in ops.Padding:
        ho, wo = _window(_get(x, 1), _get(w, 0), sh, pad), _window(_get(x, 2), _get(w, 1), sw, pad)
        facts = (f"(= {_length(x)} 4)", f"(= {_length(w)} 4)", f"(>= {sh} 1)", f"(>= {sw} 1)", f"(> {ci} 0)",
                 f"(= (% {c} {ci}) 0)", f"(= (% {o} (/ {c} {ci})) 0)", f"(>= {ho} 1)", f"(>= {wo} 1)",
                 *_act_ok(attrs["act"]))
        cases.append(ShapeCase(facts, vec_of([_get(x, 0), ho, wo, o]), (("pad", int(pad)),)))
    return tuple(cases)


def _pool(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    """NCHW, with any leading (device) axes, as `_conv2d`: the last two dims are pooled."""
    (x,) = xs
    kh, kw, sh, sw = attrs["kernel_h"], attrs["kernel_w"], attrs["stride_h"], attrs["stride_w"]
    h, w = _get(x, _from_end(x, "-2")), _get(x, _from_end(x, "-1"))
    cases = []
    for pad in ops.Padding:
        ho, wo = _window(h, kh, sh, pad), _window(w, kw, sw, pad)
        facts = (f"(>= {_length(x)} 4)", f"(<= {_length(x)} {ops.CONV_MAX_RANK})", f"(>= {kh} 1)", f"(>= {kw} 1)",
                 f"(>= {sh} 1)", f"(>= {sw} 1)", f"(>= {ho} 1)", f"(>= {wo} 1)", *_act_ok(attrs["act"]))
        items = vec_items(x)
        result = (vec_of([*items[:-2], ho, wo]) if items is not None
                  else f"(vec-push (vec-push (vec-pop (vec-pop {x})) {ho}) {wo})")
        cases.append(ShapeCase(facts, result, (("pad", int(pad)),)))
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


def _merge_gconv(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (w,), x, count = xs, attrs["input_shape"], attrs["count"]
    groups = f"(/ {_get(x, 1)} {_get(w, 1)})"
    facts = (f"(= {_length(w)} 4)", f"(= {_length(x)} 4)", f"(>= {count} 1)", f"(> {_get(w, 1)} 0)",
             f"(= (% {_get(x, 1)} {_get(w, 1)}) 0)", f"(= (% {groups} {count}) 0)", f"(= (% {_get(w, 0)} {groups}) 0)")
    return (ShapeCase(facts, f"(vec-of {_get(w, 0)} (* {_get(w, 1)} {count}) {_get(w, 2)} {_get(w, 3)})"),)


def _transpose(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,), perm = xs, attrs["perm"]
    cases = []
    for r in range(MAX_RANK + 1):
        p = _items(perm, r)
        facts = [f"(= {_length(x)} {r})", *(f"(>= {i} 0)" for i in p), *(f"(< {i} {r})" for i in p),
                 *(f"(!= {a} {b})" for k, a in enumerate(p) for b in p[k + 1:])]  # a permutation
        cases.append(ShapeCase(tuple(facts), vec_of(_get(x, i) for i in p), attr_lengths=(("perm", r),)))
    return tuple(cases)


def _reshape(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,), shape = xs, attrs["shape"]
    cases = []
    for r in range(MAX_RANK + 1):
        dims = _items(shape, r)
        facts = (*(f"(>= {d} 1)" for d in dims), f"(= {_numel(x)} {_product(dims)})")
        cases.append(ShapeCase(facts, shape, attr_lengths=(("shape", r),)))
    return tuple(cases)


def _batchnorm(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    x, *params = xs
    channel = f"(vec-of {_get(x, 1)})"
    return (ShapeCase((f"(>= {_length(x)} 2)", *(f"(= {p} {channel})" for p in params)), x),)


def _reduce(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    """Axes are kept sorted (`SORTED_ATTRS`), so removing them from the back gives the shape."""
    (x,), axes = xs, attrs["axes"]
    cases = []
    for k in range(MAX_RANK + 1):
        a = _items(axes, k)
        facts = [*_increasing(a), *([f"(>= {a[0]} 0)", f"(< {a[-1]} {_length(x)})"] if a else [])]
        result = x
        for axis in reversed(a):
            result = f"(vec-remove {result} {axis})"
        cases.append(ShapeCase(tuple(facts), result, attr_lengths=(("axes", k),)))
    return tuple(cases)


def _broadcast(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,), shape, dims = xs, attrs["shape"], attrs["dims"]
    cases = []
    for k in range(MAX_RANK + 1):
        d = _items(dims, k)
        facts = [f"(= {_length(x)} {k})", *_increasing(d),
                 *([f"(>= {d[0]} 0)", f"(< {d[-1]} {_length(shape)})"] if d else [])]
        for i, di in enumerate(d):  # x_i is 1 or the output's size at dims[i]: (x_i - 1)(x_i - y) = 0
            xi = _get(x, i)
            facts.append(f"(= (* (- {xi} 1) (- {xi} {_get(shape, di)})) 0)")
        cases.append(ShapeCase(tuple(facts), shape, attr_lengths=(("dims", k),)))
    return tuple(cases)


# --- distribution ops (eqsat.distribution): dims counted from the end, a leading device axis -------

def _from_end(s: Expr, dim: Expr) -> Expr:
    """Index from the front of the dim `dim` (< 0) of shape `s`."""
    n, d = literal_int(_length(s)), literal_int(dim)
    return str(n + d) if n is not None and d is not None else f"(+ {_length(s)} {dim})"


def _dim_facts(s: Expr, dim: Expr) -> tuple[Expr, ...]:
    return (f"(< {dim} 0)", f"(>= {_from_end(s, dim)} 0)")


def _scaled(s: Expr, i: Expr, op: str, by: Expr) -> Expr:
    items, k = vec_items(s), literal_int(i)
    if items is not None and k is not None and 0 <= k < len(items):  # known items stay known (`numel` needs none)
        return vec_of([*items[:k], f"({op} {items[k]} {by})", *items[k + 1:]])
    return f"(vec-set {s} {i} ({op} {_get(s, i)} {by}))"


def _prepend(n: Expr, s: Expr) -> Expr:
    items = vec_items(s)
    return vec_of([n, *items]) if items is not None else f"(vec-append (vec-of {n}) {s})"


def _partition(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (x,), n = xs, attrs["parts"]
    i = _from_end(x, attrs["dim"])
    facts = (*_dim_facts(x, attrs["dim"]), f"(>= {n} 1)", f"(= (% {_get(x, i)} {n}) 0)")
    return (ShapeCase(facts, _prepend(n, _scaled(x, i, "/", n))),)


def _combine(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (y,) = xs
    piece = f"(vec-remove {y} 0)"
    i = _from_end(piece, attrs["dim"])
    return (ShapeCase((f"(>= {_length(y)} 2)", *_dim_facts(piece, attrs["dim"])), _scaled(piece, i, "*", _get(y, 0))),)


def _replicate(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase((f"(>= {attrs['parts']} 1)",), _prepend(attrs["parts"], xs[0])),)


def _reduce_devices(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase((f"(>= {_length(xs[0])} 2)",), f"(vec-remove {xs[0]} 0)"),)


def _all_reduce(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    return (ShapeCase((f"(>= {_length(xs[0])} 2)",), xs[0]),)


def _all_gather(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (y,) = xs
    i = _from_end(y, attrs["dim"])
    return (ShapeCase((f"(>= {_length(y)} 2)", f"(< {attrs['dim']} 0)", f"(>= {i} 1)"), _scaled(y, i, "*", _get(y, 0))),)


def _reduce_scatter(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    (y,) = xs
    i = _from_end(y, attrs["dim"])
    facts = (f"(>= {_length(y)} 2)", f"(< {attrs['dim']} 0)", f"(>= {i} 1)", f"(= (% {_get(y, i)} {_get(y, 0)}) 0)")
    return (ShapeCase(facts, _scaled(y, i, "/", _get(y, 0))),)


def _all_to_all(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    gathered = _all_gather({"dim": attrs["concat_dim"]}, xs)[0]
    split = _reduce_scatter({"dim": attrs["split_dim"]}, (gathered.result,))[0]
    return (ShapeCase((*gathered.facts, *split.facts), split.result),)


def _iota(attrs: Mapping[str, Expr], xs: Sequence[Expr]) -> tuple[ShapeCase, ...]:
    shape, dim = attrs["shape"], attrs["dimension"]
    return (ShapeCase((f"(>= {dim} 0)", f"(< {dim} {_length(shape)})"), shape),)


def vec_of(items: Sequence[Expr] | Any) -> Expr:
    items = list(items)
    return "(vec-of" + "".join(f" {i}" for i in items) + ")"


# Same-shape elementwise ops: one shape rule for all (inputs of one shape, output of that shape).
ELEMENTWISE: frozenset[str] = frozenset(op for op, spec in ops.OPS.items() if spec.elementwise)

# Mask and index math (inputs of one shape, output of that shape, any dtype their `operand_kinds` take).
MASK_OPS: tuple[str, ...] = ("lt", "le", "gt", "ge", "eq", "ne", "select_n", "convert_element_type", "iadd", "isub",
                             "imul", "imax", "imin", "and", "or", "not", "stop_gradient")

# IR op → symbolic shape function, for every registry op but `split` (encoded as slices).
SHAPE_RULES: Mapping[str, ShapeFn] = {
    "input": _leaf, "weight": _leaf,
    **{op: _same for op in sorted(ELEMENTWISE)},
    "smul": _smul, "matmul": _matmul, "conv2d": _conv2d, "conv2d_nhwc": _conv2d_nhwc, "poolmax": _pool, "poolavg": _pool,
    "concat": _concat, "slice": _slice, "enlarge": _enlarge, "merge_gconv": _merge_gconv, "transpose": _transpose, "reshape": _reshape,
    "batchnorm": _batchnorm, "reduce_sum": _reduce, "reduce_max": _reduce, "broadcast": _broadcast,
    "partition": _partition, "combine": _combine, "replicate": _replicate, "reduce": _reduce_devices,
    "all_reduce": _all_reduce, "all_gather": _all_gather, "reduce_scatter": _reduce_scatter, "all_to_all": _all_to_all,
    "iota": _iota, **{op: _same for op in MASK_OPS},
}
ENCODED_AS: Mapping[str, str] = {"split": "slice"}  # ops the encoder writes with other constructors
BINARY_ONLY = frozenset({"concat"})  # variadic in the IR, binary (nested) in the e-graph


def constructor(op: str) -> str:
    """The egglog constructor name of an IR op: stable, capitalised (`matmul` → `Matmul`)."""
    return op[:1].upper() + op[1:]


def tensor_arity(op: str) -> int:
    spec = ops.op_spec(op)
    return 2 if op in BINARY_ONLY else int(spec.arity or 0)


def term_ops() -> tuple[str, ...]:
    """Registry ops that have an egglog constructor (all but those in `ENCODED_AS`)."""
    return tuple(op for op in ops.OPS if op in SHAPE_RULES)


def encodable_ops() -> tuple[str, ...]:
    return tuple(op for op in ops.OPS if op in SHAPE_RULES or op in ENCODED_AS)


def check_encodable(op: str, where: str) -> None:
    if op not in ops.OPS:
        raise UnknownOpError(f"{where}: unknown op '{op}'")
    if op not in SHAPE_RULES and op not in ENCODED_AS:
        raise UnknownOpError(f"{where}: op '{op}' has no egglog shape rule; "
                             f"supported: {', '.join(encodable_ops())}")


def attr_names(op: str) -> tuple[str, ...]:
    """Attributes in registry order: the constructor's leading arguments."""
    return tuple(a.name for a in ops.op_spec(op).attrs)


def attr_kinds(op: str) -> tuple[str, ...]:
    return tuple(a.kind for a in ops.op_spec(op).attrs)


def select_cases(op: str, attrs: Mapping[str, Expr], shapes: Sequence[Expr]) -> list[ShapeCase]:
    """The op's cases whose attribute conditions are not refuted by literal attributes."""
    out = []
    for case in SHAPE_RULES[op](attrs, shapes):
        ok = all(literal_int(attrs[k]) in (None, v) for k, v in case.attr_equals)
        ok = ok and all(len(items) == n for k, n in case.attr_lengths if (items := vec_items(attrs[k])) is not None)
        decided = [_decide(f) for f in case.facts]
        if ok and False not in decided:
            out.append(ShapeCase(tuple(f for f, d in zip(case.facts, decided) if d is None), case.result,
                                 case.attr_equals, case.attr_lengths))
    return out


_COMPARISONS: Mapping[str, Callable[[int, int], bool]] = {
    "=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _decide(fact: Expr) -> bool | None:
    """A comparison of two integer literals, decided here (True/False); None for anything else."""
    parts = fact[1:-1].split() if fact.startswith("(") and fact.endswith(")") else []
    if len(parts) != 3 or parts[0] not in _COMPARISONS:
        return None
    a, b = literal_int(parts[1]), literal_int(parts[2])
    return None if a is None or b is None else _COMPARISONS[parts[0]](a, b)


def case_facts(case: ShapeCase, attrs: Mapping[str, Expr]) -> list[Expr]:
    return [*(f"(= {attrs[k]} {v})" for k, v in case.attr_equals if literal_int(attrs[k]) is None),
            *(f"(= (vec-length {attrs[k]}) {n})" for k, n in case.attr_lengths if vec_items(attrs[k]) is None),
            *case.facts]


_FLOAT_FACTS = tuple(f'({FLOAT_RELATION} "{d}")' for d in ops.FLOAT_DTYPES)


def declarations(ops: Collection[str] | None = None) -> str:
    """Sorts, constructors, the shape and numel functions, and the shape-analysis ruleset with the
    rules of `ops` (every op's when None; see `shape_rules`)."""
    ctors = []
    for op in term_ops():
        args = [ATTR_SORTS[k] for k in attr_kinds(op)] + [TERM_SORT] * tensor_arity(op)
        ctors.append(f"({constructor(op)} {' '.join(args)})")
    lines = [
        f"(sort {SHAPE_SORT} (Vec i64))",
        f"(datatype {TERM_SORT} {' '.join(ctors)})",
        f"(function shape ({TERM_SORT}) {SHAPE_SORT} :no-merge)",
        f"(function {DTYPE_FUNCTION} ({TERM_SORT}) String :no-merge)",
        f"(relation {FLOAT_RELATION} (String))",
        *_FLOAT_FACTS,
        f"(function numel ({SHAPE_SORT}) i64 :no-merge)",
        f"(function uid ({TERM_SORT}) i64 :merge (min old new))",
        f"(function {INPUT_ORDER_FUNCTION} ({TERM_SORT}) i64 :merge (min old new))",
        f"(function {PAIR_FUNCTION} (i64 i64) i64 :merge (max old new))",
        f"(relation {NEXT_SIBLING_RELATION} ({TERM_SORT} {TERM_SORT}))",
        f"(ruleset {SHAPE_RULESET})",
    ]
    for r in range(MAX_RANK + 1):
        dims = [f"(vec-get s {i})" for i in range(r)]
        lines.append(f"(rule ((= s (shape e)) (= (vec-length s) {r})) ((set (numel s) {_product(dims) if dims else 1})) "
                     f":ruleset {SHAPE_RULESET} :name \"numel:{r}\")")
    return "\n".join([*lines, shape_rules(term_ops() if ops is None else ops)])


def shape_rules(ops: Collection[str]) -> str:
    """The shape-analysis and uid rules of the term ops among `ops`, in registry order. egglog
    compiles each rule (~1 ms, ~100 rules for all ops), so an e-graph declares those of the ops it
    can hold; rules of ops absent from the e-graph never fire."""
    lines = []
    for op in term_ops():
        if op in ops:
            lines.extend(_analysis_rules(op))
            lines.extend(_dtype_rules(op))
            lines.extend(_uid_rules(op))
    return "\n".join(lines)


UID_MODULUS = 2_147_483_647  # uids stay below 2^31 so that `h * UID_MULTIPLIER + x` fits an i64
UID_MULTIPLIER = 1_000_003


def _uid_rules(op: str) -> list[str]:
    """Give every class built by a rule a `uid` (a structural hash of its op, integer attributes
    and children's uids), so that symmetric two-output rules can order any pair of classes.
    Leaves get theirs from the encoder (their index); `uid` merges by min, so a class keeps one.
    A collision only makes a symmetric rule skip that one pair."""
    if ops.op_spec(op).is_leaf:
        return []
    attrs = {a: f"a_{a}" for a in attr_names(op)}
    kids = [f"x{i}" for i in range(tensor_arity(op))]
    uids = [f"u{i}" for i in range(len(kids))]
    term = f"({constructor(op)} {' '.join([*attrs.values(), *kids])})"
    h = str(term_ops().index(op) + 1)
    ints = [attrs[a] for a, k in zip(attr_names(op), attr_kinds(op)) if k == "int"]
    for x in [*ints, *uids]:
        h = f"(% (+ (* {h} {UID_MULTIPLIER}) (% {x} {UID_MODULUS})) {UID_MODULUS})"
    query = [f"(= e {term})", *(f"(= {u} (uid {x}))" for u, x in zip(uids, kids))]
    return [f"(rule ({' '.join(query)}) ((set (uid e) {h})) :ruleset {SHAPE_RULESET} :name \"uid:{op}\")"]


def _dtype_rules(op: str) -> list[str]:
    """The dtype analysis (`ops.OpSpec.result_dtype`): a class's dtype from its attribute, or from
    its operands (the first; for select_n the first case): the IR refuses mixed operands, so the
    first stands for all, and `eqsat.rewrites.to_egglog` guards rules that could mix them."""
    spec = ops.op_spec(op)
    attrs = {a: f"a_{a}" for a in attr_names(op)}
    kids = [f"x{i}" for i in range(tensor_arity(op))]
    term = f"({constructor(op)} {' '.join([*attrs.values(), *kids])})"
    query = [f"(= e {term})"]
    if spec.result_dtype == "attr":
        value = attrs["dtype"]
    elif spec.result_dtype == "bool":
        value = string_literal("bool")
    elif kids:
        source = kids[1] if spec.result_dtype == "select" else kids[0]
        query.append(f"(= d ({DTYPE_FUNCTION} {source}))")
        value = "d"
    else:
        value = string_literal(ops.DEFAULT_DTYPE)
    return [f"(rule ({' '.join(query)}) ((set ({DTYPE_FUNCTION} e) {value})) :ruleset {SHAPE_RULESET} "
            f":name \"dtype:{op}\")"]


def _analysis_rules(op: str) -> list[str]:
    attrs = {a: f"a_{a}" for a in attr_names(op)}
    kids = [f"x{i}" for i in range(tensor_arity(op))]
    shapes = [f"s{i}" for i in range(len(kids))]
    term = f"({constructor(op)} {' '.join([*attrs.values(), *kids])})"
    rules = []
    for k, case in enumerate(select_cases(op, attrs, shapes)):
        query = [f"(= e {term})", *(f"(= {s} (shape {x}))" for s, x in zip(shapes, kids)), *case_facts(case, attrs)]
        rules.append(f"(rule ({' '.join(query)}) ((set (shape e) {case.result})) "
                     f":ruleset {SHAPE_RULESET} :name \"shape:{op}:{k}\")")
    return rules

"""One evaluator of patterns over tensors whose elements live in an algebra.

The same op table computes a pattern over exact polynomials (for proofs), over integers modulo a
prime (a fast randomized filter and the synthesizer's fingerprints) and over floats (the registry's
numpy semantics, for counterexamples). Non-linear activations are atoms: in the polynomial algebra
`relu(p)` is an opaque atom keyed by the canonical form of `p` (so two sides that agree with relu
uninterpreted are equal for every relu), and z3 later gives relu its exact meaning, If(x > 0, x, 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol, cast

import numpy as np

from eqsat import distribution, ops
from eqsat.errors import RuleError, ShapeError
from eqsat.ops import Shape
from eqsat.rewrites.rule import (
    AttrVar,
    attr_variables,
    DimOf,
    Pattern,
    Rule,
    ShapeOf,
    Term,
    Var,
    has_attr_refs,
    term_attr_refs,
    variables,
)

Coeff = int | Fraction
Monomial = tuple[int, ...]  # sorted atom ids, with repeats


class Poly:
    """A polynomial over atoms with exact rational coefficients, in canonical form."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, Coeff]) -> None:
        self.terms: dict[Monomial, Coeff] = {m: c for m, c in terms.items() if c != 0}
        self._hash: int | None = None

    @staticmethod
    def const(c: Coeff) -> Poly:
        return Poly({(): c})

    def __add__(self, other: Any) -> Poly:
        if not isinstance(other, Poly):
            other = Poly.const(other)
        if len(other.terms) > len(self.terms):
            self, other = other, self
        out = dict(self.terms)
        for m, c in other.terms.items():
            out[m] = out.get(m, 0) + c
        return Poly(out)

    __radd__ = __add__

    def __mul__(self, other: Any) -> Poly:
        if not isinstance(other, Poly):
            other = Poly.const(other)
        out: dict[Monomial, Coeff] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2)) if m1 and m2 else m1 or m2
                out[m] = out.get(m, 0) + c1 * c2
        return Poly(out)

    __rmul__ = __mul__

    def __neg__(self) -> Poly:
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Any) -> Poly:
        return self + (-other if isinstance(other, Poly) else Poly.const(-other))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.terms.items()))
        return self._hash

    def atoms(self) -> set[int]:
        return {a for m in self.terms for a in m}

    def __repr__(self) -> str:
        return " + ".join(f"{c}*{'*'.join(f'a{a}' for a in m) or '1'}" for m, c in self.terms.items()) or "0"


class Algebra(Protocol):
    """What the op table needs from a number system."""

    def zeros(self, shape: Shape) -> np.ndarray: ...
    def const(self, value: float | Fraction) -> Any: ...
    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    def tensordot(self, a: np.ndarray, b: np.ndarray, axes: tuple[list[int], list[int]]) -> np.ndarray: ...
    def activation(self, name: str, x: np.ndarray) -> np.ndarray: ...
    def maximum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...


@dataclass
class PolyAlgebra:
    """Exact polynomials; activations become interned atoms (the only state: the atom table)."""

    atoms: list[tuple[str, Any]] = field(default_factory=list)
    index: dict[tuple[str, Any], int] = field(default_factory=dict)

    def atom(self, key: tuple[str, Any]) -> Poly:
        if key not in self.index:
            self.index[key] = len(self.atoms)
            self.atoms.append(key)
        return Poly({(self.index[key],): 1})

    def symbols(self, name: str, shape: Shape) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            out[idx] = self.atom(("input", (name, idx)))
        return out

    def zeros(self, shape: Shape) -> np.ndarray:
        out = np.empty(shape, dtype=object)
        out.fill(Poly({}))
        return out

    def const(self, value: float | Fraction) -> Any:
        return Poly.const(Fraction(value))

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a * b

    def tensordot(self, a: np.ndarray, b: np.ndarray, axes: tuple[list[int], list[int]]) -> np.ndarray:
        out = np.tensordot(a, b, axes)
        return _fill_zero(out, self)

    def activation(self, name: str, x: np.ndarray) -> np.ndarray:
        return _map(lambda p: self.atom((name, p)), x)

    def maximum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """max as one atom over the set of its operands, nested maxes flattened: max is associative,
        commutative and idempotent, so equal operand sets are equal maxes (a separable pool's
        max of row maxes is the same atom as the window's max)."""
        def one(p: Poly, q: Poly) -> Poly:
            operands = self._max_operands(p) | self._max_operands(q)
            return next(iter(operands)) if len(operands) == 1 else self.atom(("max", operands))

        return np.vectorize(one, otypes=[object])(a, b)

    def _max_operands(self, p: Poly) -> frozenset[Poly]:
        if len(p.terms) == 1:
            ((m, c),) = p.terms.items()
            if c == 1 and len(m) == 1 and self.atoms[m[0]][0] == "max":
                return self.atoms[m[0]][1]
        return frozenset((p,))


def _map(fn: Callable[[Any], Any], x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(*x.shape):
        out[idx] = fn(x[idx])
    return out


def _fill_zero(x: np.ndarray, alg: PolyAlgebra) -> np.ndarray:
    """np.tensordot over empty axes yields int 0s; keep every element a Poly."""
    if x.dtype != object:
        return alg.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        if not isinstance(x[idx], Poly):
            x[idx] = Poly.const(cast(Coeff, x[idx]))
    return x


@dataclass(frozen=True)
class FieldAlgebra:
    """Integers modulo a prime; activations are fixed pseudo-random functions (same on both sides)."""

    p: int = 1_000_003
    salt: int = 0

    def random(self, shape: Shape, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, self.p, size=shape, dtype=np.int64)

    def zeros(self, shape: Shape) -> np.ndarray:
        return np.zeros(shape, dtype=np.int64)

    def const(self, value: float | Fraction) -> Any:
        f = Fraction(value)
        return (f.numerator % self.p) * pow(f.denominator, -1, self.p) % self.p

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + b) % self.p

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b) % self.p

    def tensordot(self, a: np.ndarray, b: np.ndarray, axes: tuple[list[int], list[int]]) -> np.ndarray:
        return np.tensordot(a, b, axes) % self.p  # p < 2**20: sums of < 2**23 products fit in int64

    def activation(self, name: str, x: np.ndarray) -> np.ndarray:
        h = (x * 40503 + (sum(map(ord, name)) * 7919 + self.salt)) & 0xFFFFFFFF
        h ^= h >> 15
        h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
        h ^= h >> 12
        h = (h * 0x297A2D39) & 0xFFFFFFFF
        h ^= h >> 15
        return h % self.p

    def maximum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The larger representative: associative, commutative and idempotent like max (identities
        that also need max's order against + and * are left to the proof)."""
        return np.maximum(a, b)


# --- the op table ---------------------------------------------------------------------------------

Impl = Callable[[Algebra, Sequence[np.ndarray], Mapping[str, Any]], np.ndarray]


def _act(alg: Algebra, x: np.ndarray, code: int) -> np.ndarray:
    return x if code == ops.Activation.NONE else alg.activation(ops.Activation(code).op_name, x)


def _matmul(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    return _act(alg, _batched_matmul(alg, xs[0], xs[1]), a["act"])


def _batched_matmul(alg: Algebra, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.ndim == 2:
        return alg.tensordot(x, y, ([1], [0]))
    return np.stack([_batched_matmul(alg, x[b], y[b]) for b in range(x.shape[0])])


def _pad_hw(alg: Algebra, x: np.ndarray, pads: tuple[int, int, int, int]) -> np.ndarray:
    n, c, h, w = x.shape
    pt, pb, pl, pr = pads
    out = alg.zeros((n, c, h + pt + pb, w + pl + pr))
    out[:, :, pt:pt + h, pl:pl + w] = x
    return out


def _conv(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x, w = xs
    if x.ndim > 4:  # leading batch axes shared with the weight (a conv per device)
        return np.stack([_conv(alg, (xi, wi), a) for xi, wi in zip(x, w)])
    sh, sw = a["stride_h"], a["stride_w"]
    o, ci, kh, kw = w.shape
    ho, pt, pb = ops.window_out_and_pads(x.shape[2], kh, sh, a["pad"])
    wo, pl, pr = ops.window_out_and_pads(x.shape[3], kw, sw, a["pad"])
    xp = _pad_hw(alg, x, (pt, pb, pl, pr))
    groups, og = x.shape[1] // ci, o // (x.shape[1] // ci)
    parts = []
    for g in range(groups):
        # every kernel position's window, stacked on one axis (i major, as the kernel flattens), so that
        # one contraction over channels and positions sums what a loop over positions would
        wins = np.stack([xp[:, g * ci:(g + 1) * ci, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw]
                         for i in range(kh) for j in range(kw)], axis=2)
        acc = alg.tensordot(wins, w[g * og:(g + 1) * og].reshape(og, ci, kh * kw), ([1, 2], [1, 2]))
        parts.append(np.transpose(acc, (0, 3, 1, 2)))
    return _act(alg, np.concatenate(parts, axis=1), a["act"])


def _conv_nhwc(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """`ops` conv2d_nhwc: conv2d on the NCHW / OIHW views of its NHWC input and HWIO kernel."""
    x, w = xs
    return np.transpose(_conv(alg, (np.transpose(x, ops.NHWC_OUT), np.transpose(w, (3, 2, 0, 1))), a), ops.NHWC_IN)


def _pool(reduce: str) -> Impl:
    def run(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
        x = xs[0]
        if x.ndim > 4:  # leading batch axes (one pool per device): one pool each
            return np.stack([run(alg, [xi], a) for xi in x])
        kh, kw, sh, sw = a["kernel_h"], a["kernel_w"], a["stride_h"], a["stride_w"]
        ho, pt, pb = ops.window_out_and_pads(x.shape[2], kh, sh, a["pad"])
        wo, pl, pr = ops.window_out_and_pads(x.shape[3], kw, sw, a["pad"])
        if reduce == "max":
            return _act(alg, _max_windows(alg, x, (kh, kw, sh, sw), (ho, wo, pt, pl)), a["act"])
        xp = _pad_hw(alg, x, (pt, pb, pl, pr))
        acc = None
        for i in range(kh):
            for j in range(kw):
                win = xp[:, :, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw]
                acc = win if acc is None else (alg.add(acc, win) if reduce == "avg" else alg.maximum(acc, win))
        assert acc is not None  # the kernel has at least one position
        if reduce == "avg":
            acc = alg.mul(acc, _full(alg, acc.shape, alg.const(Fraction(1, kh * kw))))
        return _act(alg, acc, a["act"])

    return run


def _max_windows(alg: Algebra, x: np.ndarray, window: tuple[int, int, int, int],
                 out: tuple[int, int, int, int]) -> np.ndarray:
    """Max over each window's in-bounds elements: padding is -inf, which never wins a max, so it is
    left out rather than represented (every SAME window overlaps the input)."""
    kh, kw, sh, sw = window
    ho, wo, pt, pl = out
    h, w = x.shape[2], x.shape[3]
    result = alg.zeros((x.shape[0], x.shape[1], ho, wo))
    for oi in range(ho):
        for oj in range(wo):
            acc = None
            for i in range(kh):
                for j in range(kw):
                    r, q = oi * sh + i - pt, oj * sw + j - pl
                    if 0 <= r < h and 0 <= q < w:
                        acc = x[:, :, r, q] if acc is None else alg.maximum(acc, x[:, :, r, q])
            if acc is None:
                raise ShapeError(f"poolmax: window ({oi}, {oj}) lies entirely in the padding")
            result[:, :, oi, oj] = acc
    return result


def _full(alg: Algebra, shape: Shape, value: Any) -> np.ndarray:
    out = alg.zeros(shape)
    out[...] = value
    return out


def _batchnorm(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    x, scale, bias, mean, var = xs
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    eps = _full(alg, var.shape, alg.const(a["eps"]))
    inv = alg.mul(scale, alg.activation("rsqrt", alg.add(var, eps))).reshape(bshape)
    neg_mean = alg.mul(mean, _full(alg, mean.shape, alg.const(-1))).reshape(bshape)
    b = np.broadcast_to
    return alg.add(alg.mul(alg.add(x, b(neg_mean, x.shape)), b(inv, x.shape)), b(bias.reshape(bshape), x.shape))


def _enlarge(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    w, ref = xs
    ph, pw = (ref.shape[2] - w.shape[2]) // 2, (ref.shape[3] - w.shape[3]) // 2
    return _pad_hw(alg, w, (ph, ph, pw, pw))


def _merge_gconv(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    (w,), count = xs, a["count"]
    out = alg.zeros((w.shape[0], w.shape[1] * count, *w.shape[2:]))
    return ops.merge_gconv_into(out, w, a["input_shape"][1] // w.shape[1], count)


def _slice(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["stop"])
    return xs[0][tuple(index)]


def _negate(alg: Algebra, x: np.ndarray) -> np.ndarray:
    return alg.mul(x, _full(alg, x.shape, alg.const(-1)))


def _broadcast(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    expanded = [1] * len(a["shape"])
    for i, d in enumerate(a["dims"]):
        expanded[d] = xs[0].shape[i]
    return np.broadcast_to(xs[0].reshape(expanded), a["shape"]).copy()


def _reduce(combine: str) -> Impl:
    def run(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
        x, axes = xs[0], tuple(a["axes"])
        kept = [i for i in range(x.ndim) if i not in axes]
        y = np.transpose(x, kept + list(axes)).reshape([x.shape[i] for i in kept] + [-1])
        fn = alg.add if combine == "sum" else alg.maximum
        acc = y[..., 0]
        for i in range(1, y.shape[-1]):
            acc = fn(acc, y[..., i])
        return np.asarray(acc, dtype=y.dtype)

    return run


def _opaque(name: str) -> Impl:
    """A unary function the identities treat as an uninterpreted atom (sqrt, rsqrt, exp, log)."""
    return lambda alg, xs, a: alg.activation(name, xs[0])


def _float_convert(alg: Algebra, xs: Sequence[np.ndarray], a: Mapping[str, Any]) -> np.ndarray:
    """`convert_element_type` to a float dtype: the identity on the reals (every float dtype stands
    for the reals here; rounding is the numerics check's business, as for every float op). A
    conversion to an integer or boolean dtype truncates: it has no meaning here."""
    if ops.dtype_kind(str(a["dtype"])) != "float":
        raise RuleError(f"no symbolic semantics for convert_element_type to {a['dtype']} (only float dtypes)")
    return xs[0]


def _distributed(op: str) -> Impl:
    """A distribution op (eqsat.distribution): data movement plus sums taken in the algebra."""
    return lambda alg, xs, a: distribution.semantics(alg.add)[op](xs, a)


OP_IMPLS: Mapping[str, Impl] = {
    "ewadd": lambda alg, xs, a: alg.add(xs[0], xs[1]),
    "ewmul": lambda alg, xs, a: alg.mul(xs[0], xs[1]),
    "smul": lambda alg, xs, a: alg.mul(xs[0], np.broadcast_to(xs[1].reshape(()), xs[0].shape)),
    "matmul": _matmul,
    "conv2d": _conv,
    "conv2d_nhwc": _conv_nhwc,
    "relu": lambda alg, xs, a: alg.activation("relu", xs[0]),
    "tanh": lambda alg, xs, a: alg.activation("tanh", xs[0]),
    "sigmoid": lambda alg, xs, a: alg.activation("sigmoid", xs[0]),
    "poolavg": _pool("avg"),
    "poolmax": _pool("max"),
    "concat": lambda alg, xs, a: np.concatenate(xs, axis=a["axis"]),
    "slice": _slice,
    "transpose": lambda alg, xs, a: np.transpose(xs[0], a["perm"]),
    "reshape": lambda alg, xs, a: xs[0].reshape(a["shape"]),
    "batchnorm": _batchnorm,
    "enlarge": _enlarge,
    "merge_gconv": _merge_gconv,
    "ewsub": lambda alg, xs, a: alg.add(xs[0], _negate(alg, xs[1])),
    "neg": lambda alg, xs, a: _negate(alg, xs[0]),
    "ewdiv": lambda alg, xs, a: alg.mul(xs[0], alg.activation("recip", xs[1])),  # 1/b as an atom
    "ewmax": lambda alg, xs, a: alg.maximum(xs[0], xs[1]),
    "ewmin": lambda alg, xs, a: _negate(alg, alg.maximum(_negate(alg, xs[0]), _negate(alg, xs[1]))),  # -max(-a, -b)
    "sqrt": _opaque("sqrt"),
    "rsqrt": _opaque("rsqrt"),  # the same atom batchnorm uses for 1/sqrt(var + eps)
    "exp": _opaque("exp"),
    **{op: _opaque(op) for op in ("abs", "sin", "cos", "erf", "erfc")},
    "log": _opaque("log"),
    "broadcast": _broadcast,
    # where(pred, yes, no) as no + s(pred) * (yes - no), s an opaque atom: select_n for s in {0, 1}, and
    # an identity for every s is one for the select; stop_gradient is the value
    "select_n": lambda alg, xs, a: alg.add(xs[1], alg.mul(alg.activation("nonzero", xs[0]),
                                                          alg.add(xs[2], _negate(alg, xs[1])))),
    "stop_gradient": lambda alg, xs, a: xs[0],
    "reduce_sum": _reduce("sum"),
    "reduce_max": _reduce("max"),
    "convert_element_type": _float_convert,
    **{op: _distributed(op) for op in ops.OPS if op in ops.DISTRIBUTION_OPS},
}


# --- shapes and values of patterns -------------------------------------------------------------------

SplitSizes = Callable[[int], tuple[int, int]]


def term_shape(t: Term, arg_shapes: Sequence[Shape], split_sizes: SplitSizes | None) -> Shape:
    """Shape of one pattern node from its arguments' shapes; ShapeError when ill-typed."""
    if t.op == "split_part":
        axis, index = t.attr["axis"], t.attr["index"]
        (x,) = arg_shapes
        if split_sizes is None:
            raise RuleError("split_0/split_1 appear where no two-output rule gives their sizes")
        if not 0 <= axis < len(x):
            raise ShapeError(f"split: axis {axis} out of range for shape {x}")
        sizes = split_sizes(axis)
        if sum(sizes) != x[axis] or min(sizes) < 1:
            raise ShapeError(f"split: sizes {list(sizes)} do not add up to {x[axis]} (shape {x}, axis {axis})")
        out: Shape = x[:axis] + (sizes[index],) + x[axis + 1:]
    else:
        out = ops.infer_shapes(t.op, arg_shapes, t.attr)[0]
    for kind, value in t.guards:
        if kind == "ndim" and len(out) != value:
            raise ShapeError(f"{t.op}: guard ndim {value} but the result has rank {len(out)}")
    return out


FLOAT_ATTR_VALUE = 0.0009765625  # a float attribute variable (?eps) is verified at this value, see below


def int_attr_value(drawn: Any) -> int:
    """An integer attribute variable (`?start` of a slice) is sampled as a rank-1 shape (d,), like a
    list one, and stands for d - 1, so it ranges over 0, 1, 2, ... (a shape's dims are positive); the
    symbolic prover reads its positive dim the same way. Any other rank is ill-typed."""
    if len(drawn) != 1:
        raise ShapeError(f"an integer attribute variable is drawn as one dim, not {list(drawn)}")
    return int(drawn[0]) - 1


def bind_attrs(t: Term, env: Mapping[str, Any], split_sizes: SplitSizes | None = None) -> Term:
    """`t` with its attribute references replaced by values: attribute variables from `env`, `(shape P)`
    and `(dim P i)` from the shapes of P under `env`. A float variable only ever feeds opaque atoms
    (rsqrt(var + eps)) identically on both sides, so an identity proved at one value holds at all."""
    if not term_attr_refs(t):
        return t

    def value(v: Any) -> Any:
        if isinstance(v, AttrVar):
            if v.name not in env:
                raise RuleError(f"attribute variable ?{v.name} is not bound")
            return int_attr_value(env[v.name]) if v.kind == "int" else env[v.name]
        if isinstance(v, ShapeOf):
            return pattern_shape(v.pattern, env, split_sizes)
        if isinstance(v, DimOf):
            shape = pattern_shape(v.pattern, env, split_sizes)
            if not 0 <= v.index < len(shape):
                raise ShapeError(f"(dim {v.pattern} {v.index}): index out of range for shape {list(shape)}")
            return shape[v.index]
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v

    return Term(t.op, tuple((k, value(v)) for k, v in t.attrs), t.args, t.guards)


def _bind_all(p: Pattern, env: Mapping[str, Any], split_sizes: SplitSizes | None) -> Pattern:
    if isinstance(p, Var):
        return p
    t = bind_attrs(p, env, split_sizes)
    return Term(t.op, t.attrs, tuple(_bind_all(a, env, split_sizes) for a in t.args), t.guards)


def instantiate(rule: Rule, env: Mapping[str, Any]) -> tuple[Rule, dict[str, Shape]]:
    """The rule with every attribute reference resolved under `env`, and `env` cut to tensor variables."""
    if not any(has_attr_refs(p) for p in rule.lhs + rule.rhs):
        return rule, dict(env)
    lhs = tuple(_bind_all(p, env, None) for p in rule.lhs)
    tensors = {v: env[v] for p in rule.lhs for v in variables(p)}
    sizes = rule_split_sizes(Rule(rule.name, lhs, lhs), tensors)
    rhs = tuple(_bind_all(p, env, sizes) for p in rule.rhs)
    lists = {a.name for p in rule.lhs for a in attr_variables(p) if a.kind == "ints" and a.name in env}
    conditions = tuple(_bind_condition(c, env, lists) for c in rule.conditions)
    return Rule(rule.name, lhs, rhs, rule.source, conditions), tensors


def _bind_condition(c: Any, env: Mapping[str, Any], lists: set[str]) -> Any:
    """A condition with `(rank ?S)` / `(dim ?S i)` of a list attribute variable resolved to a
    constant (the instantiated rule keeps only tensor variables)."""
    if not isinstance(c, Term) or not c.args:
        return c
    head = c.args[0]
    if c.op in ("rank", "dim") and isinstance(head, Var) and head.name in lists:
        value = tuple(env[head.name])
        if c.op == "rank":
            return Term("const", (("value", len(value)),))
        index = c.args[1]
        if isinstance(index, Term) and index.op == "const":
            i = int(index.attr["value"])
            return Term("const", (("value", value[i] if 0 <= i < len(value) else -1),))
    return Term(c.op, c.attrs, tuple(_bind_condition(a, env, lists) for a in c.args), c.guards)


def pattern_shape(p: Pattern, env: Mapping[str, Shape], split_sizes: SplitSizes | None = None,
                  memo: dict[int, Shape] | None = None) -> Shape:
    if isinstance(p, Var):
        return env[p.name]
    if memo is not None and id(p) in memo:
        return memo[id(p)]
    out = term_shape(bind_attrs(p, env, split_sizes), [pattern_shape(a, env, split_sizes, memo) for a in p.args],
                     split_sizes)
    if memo is not None:
        memo[id(p)] = out
    return out


def rule_split_sizes(rule: Rule, env: Mapping[str, Shape]) -> SplitSizes | None:
    """Tensat's convention: piece i of a split along `axis` is as long as left side i along `axis`."""
    if not rule.is_multi:
        return None
    shapes = [pattern_shape(p, env) for p in rule.lhs]

    def sizes(axis: int) -> tuple[int, int]:
        if any(axis >= len(s) for s in shapes):
            raise ShapeError(f"split along axis {axis}, but a left side has shape {shapes}")
        return shapes[0][axis], shapes[1][axis]

    return sizes


def evaluate_pattern(p: Pattern, env: Mapping[str, np.ndarray], alg: Algebra,
                     split_sizes: SplitSizes | None = None, memo: dict[Any, np.ndarray] | None = None) -> np.ndarray:
    """Value of a pattern with its variables bound to tensors of `alg`'s elements."""
    memo = {} if memo is None else memo
    if isinstance(p, Var):
        return env[p.name]
    if p in memo:
        return memo[p]
    args = [evaluate_pattern(a, env, alg, split_sizes, memo) for a in p.args]
    if p.op == "split_part":
        term_shape(p, [a.shape for a in args], split_sizes)
        axis, index = p.attr["axis"], p.attr["index"]
        start = 0 if index == 0 else split_sizes(axis)[0]  # type: ignore[misc]
        cut = [slice(None)] * args[0].ndim
        cut[axis] = slice(start, start + split_sizes(axis)[index])  # type: ignore[misc]
        out = args[0][tuple(cut)]
    else:
        if p.op not in OP_IMPLS:
            raise RuleError(f"no symbolic semantics for op '{p.op}'")
        term_shape(p, [a.shape for a in args], split_sizes)
        spec = ops.op_spec(p.op)
        out = OP_IMPLS[p.op](alg, args, spec.normalize_attrs(p.attr))
    memo[p] = out
    return out


def evaluate_numpy(p: Pattern, env: Mapping[str, np.ndarray], split_sizes: SplitSizes | None = None) -> np.ndarray:
    """The registry's own numpy semantics (an independent check of the table above)."""
    if isinstance(p, Var):
        return env[p.name]
    args = [evaluate_numpy(a, env, split_sizes) for a in p.args]
    if p.op == "split_part":
        axis, index = p.attr["axis"], p.attr["index"]
        sizes = split_sizes(axis)  # type: ignore[misc]
        cut = [slice(None)] * args[0].ndim
        cut[axis] = slice(0, sizes[0]) if index == 0 else slice(sizes[0], sizes[0] + sizes[1])
        return args[0][tuple(cut)]
    return ops.evaluate(p.op, args, p.attr)[0]


def poly_eval(p: Poly, values: Mapping[int, float]) -> float:
    return float(sum(c * math.prod(values[a] for a in m) for m, c in p.terms.items()))

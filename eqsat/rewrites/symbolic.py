"""Prove a rule for every shape: dims as z3 integers, elements as index expressions.

Each variable of rank r gets r positive integer dims and an uninterpreted element function of r
indices. Each op gives its output's dims, the constraints that make it well-typed (the registry's
own: equal shapes for elementwise ops, agreeing dims and the summed axis for concat, a permutation
for transpose, the inner dims for a (batched) matmul), and its element at a symbolic index (concat: an
If on the axis offset; transpose: the permuted index; split pieces: the offset of Tensat's
convention; matmul: an uninterpreted sum over the products masked to the inner range, equal when they agree
there, split in two over a concatenated inner dim; conv2d: the same sum over the group's input channels
and the input positions its window covers, SAME/VALID padding as `ops.window_out_and_pads` writes it,
channel groups as the registry infers them (C / Ci groups), a fused activation on top; enlarge: the
kernel zero-padded around, centred).
z3 then shows that a well-typed left side (and the rule's conditions) gives a well-typed right side
of the same shape whose element equals the left side's at every in-range index: strictly, or under
the applier's guard (both sides well-typed with one shape). relu is exact (If), other activations
uninterpreted, as in the concrete prover.

Pools unroll their window (a literal size): avg sums it with the padding as zeros, max takes the
in-bounds reads. broadcast reads index 0 on a size-1 input axis (an If on the symbolic dim);
batchnorm is the per-channel affine map with an uninterpreted rsqrt; reshape only where it adds or
drops literal size-1 axes (on a strict right side). Sums are taken apart by linearity (`_linear`),
so a weight scaled or added per output channel (batchnorm folded into a conv) leaves the same
sums. Channel groups are written as products (`_parametrize`: C = G * Ci, O = G * og, fresh G, og),
so a grouped conv's channel arithmetic is polynomial and a merge_gconv's block is decided per
residue of the group mod its count.

Distribution ops (`eqsat.distribution`, a leading device axis) in rules that use them: device d's
piece of a partition into a literal N reads d * (S / N) + i (under an assumed typing a fresh piece p
with S = N * p, so a sum over S splits into N partial sums), combine concatenates (an If per device
for a literal count, quotient and remainder by the piece for a symbolic one; a sum over a combined
axis is a sum over devices of sums over pieces), replicate reads x, reduce sums over devices, the
collectives are their definitions; exp, erf, log, rsqrt, sqrt and ewdiv are atoms, ewmax and ewmin
selects, reduce_sum nested sums and reduce_max an uninterpreted MAX there. Dims the hypotheses
equate become one symbol (`_unify`), goals are
shown at each value of a literal (device) axis, and `device_bound` bounds the rank.

Ranks are enumerated (`shapes.rank_choices` up to rank 7); a rule whose variables may take rank 7
is not bounded in rank unless it is made of elementwise ops and broadcasts only (`tail_bound`:
axes past the broadcast ones are passed through, so rank B + 1 stands for every higher rank).
Others are left to the axiom derivation, as is any op outside the table: these rules stay
`tested`, with the reason in `resists`.

Summing a conv over input positions rather than kernel offsets is what makes `enlarge` provable: at
stride 1 SAME the enlarged kernel's padding grows by exactly the zeros added, so both sums have the
same terms; at stride 2 or 3 the clipped SAME padding differs and z3 finds the shifted window. The
prover only declines, never guesses: a spent z3 budget (an rlimit, not wall-clock time, so the
outcome does not depend on load; sums over channel groups make the index arithmetic non-linear:
those get a smaller one) leaves the rule `tested`. Ranks come from `shapes.rank_choices`
(equal dims); a condition that may hold only for unequal dims (an inequality, a parity) is dropped
for that enumeration, never for the proof.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from eqsat import ops
from eqsat.rewrites.rule import CLASS_CONDITIONS, AttrVar, DimOf, Pattern, Rule, ShapeOf, Term, Var, ops_used, subterms
from eqsat.rewrites.shapes import pinned_ranks, rank_choices
from eqsat.rewrites.z3budget import Budget, WallClockCapped, check

SUPPORTED: frozenset[str] = frozenset({"ewadd", "ewmul", "ewsub", "neg", "relu", "sigmoid", "tanh", "transpose", "concat",
                                       "matmul", "split_part", "conv2d", "conv2d_nhwc", "enlarge", "poolmax", "poolavg",
                                       "broadcast", "batchnorm", "reshape", "merge_gconv", "convert_element_type", "slice"})
# (a float convert_element_type is the identity: it passes every axis through, as the others)
ELEMENTWISE = frozenset({"ewadd", "ewmul", "ewsub", "neg", "relu", "sigmoid", "tanh", "convert_element_type"})
CONV_RANKS = (4, 5, 6)  # NCHW x OIHW, or both with the same leading batch axes (`ops.CONV_MAX_RANK`)
WINDOW_OPS = frozenset({"conv2d", "conv2d_nhwc", "enlarge", "poolmax", "poolavg"})
# z3 budgets (`z3budget`: an rlimit, so a proof does not depend on machine load, and a wall-clock cap
# against hangs only, far above the time a spent rlimit takes on a loaded machine: an 8M query that spent
# its rlimit took 3.7 s at load 7 on 2 cores, and a 10 s cap cut such queries off under CI's load).
# Chosen from the rlimit the successful queries of each class used over the library rules and the
# symbolic tests (see CHANGES.md). One query's count also varies with what the process asked z3 before
# (its terms' ids steer z3's heuristics): the stride-1 enlarge proof used 0.1M-3.9M over 12 runs in one
# process, hence the window and grouped room.
DEFAULT_BUDGET = Budget(rlimit=200_000, wall_ms=4_000)  # most used: ~16k (was 400 ms)
IMPLIED_BUDGET = Budget(rlimit=50_000, wall_ms=2_000)  # a side condition's implication; most used: ~3k (was 200 ms)
WINDOW_BUDGET = Budget(rlimit=8_000_000, wall_ms=60_000)  # sums over windows: z3 needs more than for matmul (was 1 s)
POOL_OPS = frozenset({"poolmax", "poolavg"})
POOL_BUDGET = Budget(rlimit=25_000_000, wall_ms=180_000)  # a 3x3 max over window decompositions: z3 case-splits
# on the nine reads; most used: ~6.5M (was 4 s)
GROUPED_BUDGET = Budget(rlimit=8_000_000, wall_ms=60_000)  # channel groups: non-linear index arithmetic (was 1 s)
ACTIVATIONS = {0: None, 1: "sigmoid", 2: "relu", 3: "tanh"}  # `ops.Activation` codes
DISTRIBUTION = frozenset({"partition", "combine", "replicate", "reduce", "all_reduce", "all_gather", "reduce_scatter",
                          "all_to_all"})
UNARY_ATOMS = frozenset({"exp", "erf", "log", "rsqrt", "sqrt"})  # elementwise, each an uninterpreted function
BINARY_SELECTS: dict[str, Callable[[z3.ArithRef, z3.ArithRef], z3.ArithRef]] = {
    "ewmax": lambda x, y: z3.If(x >= y, x, y), "ewmin": lambda x, y: z3.If(x <= y, x, y)}
DISTRIBUTED_ONLY = UNARY_ATOMS | set(BINARY_SELECTS) | {"ewdiv", "reduce_sum", "reduce_max", "select_n",
                                                         "stop_gradient"}  # modelled in rules with distribution ops
MAX_RANK = 6  # ranks are enumerated up to MAX_RANK + 1; a variable typed at that rank means the rank is unbounded

Dims = tuple[z3.ArithRef, ...]
Elem = Callable[[Sequence[z3.ArithRef]], z3.ArithRef]


class Unsupported(Exception):
    """The rule is outside what the symbolic prover models (the message says why)."""


View = tuple[int, Callable[[Sequence[z3.ArithRef], z3.ArithRef], z3.ArithRef]]
Tail = tuple[int, int, Callable[[Sequence[z3.ArithRef], z3.ArithRef, Sequence[z3.ArithRef]], z3.ArithRef]]


@dataclass(frozen=True)
class _Value:
    dims: Dims
    elem: Elem
    # (k, G): elem(i) = G(i[:k], the row-major flat index of i[k:]) — what reshape keeps (see `_flat_view`)
    view: View | None = None
    # (k, s, H): elem(i) = H(i[:k], the flat index of the middle i[k:r-s], the last s indices i[r-s:]):
    # what a reshape that keeps the first k and last s dims keeps (see `_tail_view`)
    tail: Tail | None = None


def _flat(idx: Sequence[z3.ArithRef], dims: Sequence[z3.ArithRef]) -> z3.ArithRef:
    """The row-major flat index of `idx` in `dims` (a polynomial)."""
    out: z3.ArithRef = z3.IntVal(0)
    for i, d in zip(idx, dims):
        out = out * d + i
    return _poly(out)


def _product(dims: Sequence[z3.ArithRef]) -> z3.ArithRef:
    out: z3.ArithRef = z3.IntVal(1)
    for d in dims:
        out = out * d
    return _poly(out)


@dataclass
class _Builder:
    """Symbolic values of a rule's patterns for one rank assignment (the constraints it collects are
    the well-typedness of what it built)."""

    ranks: Mapping[str, int]
    dims: dict[str, Dims]
    funcs: dict[str, z3.FuncDeclRef]
    sum_fn: z3.FuncDeclRef
    sum_fns: dict[int, z3.FuncDeclRef] = field(default_factory=dict)
    assumed: list[z3.BoolRef] = field(default_factory=list)  # hypotheses: dims, conditions, the left side's typing
    typed_is_assumed: bool = True  # building the left side: its own typing so far is a hypothesis too
    guarded_mode: bool = False  # the right side's typing is a hypothesis too (the applier's guard)
    grouped: bool = False  # a conv whose group count is not known to be 1 (index arithmetic beyond linear)
    split_dims: tuple[Dims, ...] = ()
    depth: int = 0  # sums being built around the current one: names their bound indices (alpha-equal sums are one term)
    floats: dict[str, z3.ArithRef] = field(default_factory=dict)  # float attribute variables (?eps)
    factors: list[z3.ArithRef] = field(default_factory=list)  # group counts and sizes (`_parametrize`)
    defs: list[z3.BoolRef] = field(default_factory=list)  # definitions of fresh quotients (always satisfiable)
    quotients: dict[tuple[int, int], tuple[z3.ArithRef, z3.ArithRef]] = field(default_factory=dict)
    slots: tuple[int, int] = (0, 0)  # (count, case): the one fresh quotient is count * q' + case
    sliced: dict[tuple[int, int], z3.ArithRef] = field(default_factory=dict)  # quotient key -> q'
    pieces: dict[tuple[int, int], z3.ArithRef] = field(default_factory=dict)  # (dim, parts) -> a partition's piece
    multiples: dict[int, tuple[int, z3.ArithRef]] = field(default_factory=dict)  # dim -> (parts, piece): dim = parts * piece
    blocked: dict[int, tuple[z3.ArithRef, z3.ArithRef]] = field(default_factory=dict)  # combined dim -> (piece, count)
    digits: dict[tuple[int, int], tuple[z3.ArithRef, z3.ArithRef]] = field(default_factory=dict)  # (index, piece) -> (q, r)
    flat_leaves: bool = False  # a rule with reshape: variables read through one function of the flat index
    flat_funcs: dict[str, z3.FuncDeclRef] = field(default_factory=dict)

    def _flat_leaf(self, name: str) -> _Value:
        """A variable as F(row-major flat index): every tensor of fixed dims is one (the flat index is
        a bijection onto [0, numel)), so F uninterpreted is as general as an element function of r
        indices; it gives reshape and the leading-dim partition an index map z3 can follow."""
        if name not in self.flat_funcs:
            self.flat_funcs[name] = z3.Function(f"F_{name}", z3.IntSort(), z3.RealSort())
        f, dims = self.flat_funcs[name], self.dims[name]

        def read(pre: Sequence[z3.ArithRef], flat: z3.ArithRef) -> z3.ArithRef:
            return f(flat)

        return _Value(dims, lambda i: f(_flat(i, dims)), (0, read))

    def value(self, p: Pattern, typed: list[z3.BoolRef]) -> _Value:
        if isinstance(p, Var):
            if self.flat_leaves:
                return self._flat_leaf(p.name)
            f = self.funcs[p.name]

            def element(idx: Sequence[z3.ArithRef]) -> z3.ArithRef:
                return f(*idx)

            return _Value(self.dims[p.name], element)
        args = [self.value(a, typed) for a in p.args]
        out = self._op(p, args, typed)
        for kind, value in p.guards:
            if kind == "ndim" and len(out.dims) != value:
                raise _IllTyped(f"{p.op}: guard ndim {value} but rank {len(out.dims)}")
        return out

    def _op(self, t: Term, args: list[_Value], typed: list[z3.BoolRef]) -> _Value:
        a = t.attr
        if t.op in ("ewadd", "ewmul"):
            x, y = args
            _same_rank(t.op, x, y)
            typed += [d == e for d, e in zip(x.dims, y.dims)]
            if t.op == "ewadd":
                return _Value(x.dims, lambda i: x.elem(i) + y.elem(i))
            return _Value(x.dims, lambda i: x.elem(i) * y.elem(i))
        if t.op == "ewsub":
            x, y = args
            _same_rank(t.op, x, y)
            typed += [d == e for d, e in zip(x.dims, y.dims)]
            return _Value(x.dims, lambda i: x.elem(i) - y.elem(i))
        if t.op == "neg":
            (x,) = args
            return _Value(x.dims, lambda i: -x.elem(i))
        if t.op == "convert_element_type":  # between float dtypes: the identity on the reals (semantics._float_convert)
            if ops.dtype_kind(str(a["dtype"])) != "float":
                raise Unsupported(f"convert_element_type to {a['dtype']} (only float dtypes are the reals)")
            return args[0]
        if t.op in ("relu", "sigmoid", "tanh"):
            (x,) = args
            return _Value(x.dims, lambda i: _act(t.op, x.elem(i)))
        if t.op == "stop_gradient":  # the value unchanged (its gradient is not what a rule states)
            return args[0]
        if t.op == "select_n":  # where(pred, third, second): the predicate's element read as nonzero
            pred, no, yes = args
            _same_rank(t.op, pred, no)
            _same_rank(t.op, pred, yes)
            typed += [d == e for d, e in zip(pred.dims, no.dims)] + [d == e for d, e in zip(pred.dims, yes.dims)]
            return _Value(pred.dims, lambda i: z3.If(pred.elem(i) != 0, yes.elem(i), no.elem(i)))
        if t.op in ("poolmax", "poolavg"):
            return self._pool(t, args[0], typed)
        if t.op == "broadcast":
            return self._broadcast(t, args[0], typed)
        if t.op == "batchnorm":
            return self._batchnorm(t, args, typed)
        if t.op == "reshape":
            return self._reshape(t, args[0], typed)
        if t.op == "merge_gconv":
            return self._merge_gconv(t, args[0], typed)
        if t.op in DISTRIBUTION:
            return self._distribution(t, args[0], typed)
        if t.op in UNARY_ATOMS:
            (x,) = args
            name = t.op

            def atom(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                return _act(name, x.elem(i))
            return _Value(x.dims, atom)
        if t.op in BINARY_SELECTS:
            x, y = args
            _same_rank(t.op, x, y)
            typed += [d == e for d, e in zip(x.dims, y.dims)]
            pick = BINARY_SELECTS[t.op]

            def select(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                return pick(x.elem(i), y.elem(i))
            return _Value(x.dims, select)
        if t.op == "ewdiv":  # x * (1/y), 1/y an atom (as the concrete prover's "recip")
            x, y = args
            _same_rank(t.op, x, y)
            typed += [d == e for d, e in zip(x.dims, y.dims)]
            return _Value(x.dims, lambda i: x.elem(i) * _act("recip", y.elem(i)))
        if t.op in ("reduce_sum", "reduce_max"):
            return self._reduction(t, args[0], typed)
        if t.op == "transpose":
            (x,) = args
            perm = tuple(a["perm"])
            if sorted(perm) != list(range(len(x.dims))):
                raise _IllTyped("transpose: not a permutation of the rank")
            inverse = [perm.index(k) for k in range(len(perm))]
            return _Value(tuple(x.dims[p] for p in perm), lambda i: x.elem([i[inverse[k]] for k in range(len(perm))]))
        if t.op == "concat":
            x, y = args
            _same_rank(t.op, x, y)
            ax = a["axis"]
            if not 0 <= ax < len(x.dims):
                raise _IllTyped("concat: axis out of range")
            typed += [d == e for k, (d, e) in enumerate(zip(x.dims, y.dims)) if k != ax]
            dims = x.dims[:ax] + (x.dims[ax] + y.dims[ax],) + x.dims[ax + 1:]
            cut = x.dims[ax]

            def concat(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                shifted = list(i[:ax]) + [i[ax] - cut] + list(i[ax + 1:])
                return z3.If(i[ax] < cut, x.elem(i), y.elem(shifted))

            return _Value(dims, concat)
        if t.op == "slice":  # [start, stop) of one axis; start and stop literals or integer variables (?a)
            (x,) = args
            ax = a["axis"]
            if type(ax) is not int or not 0 <= ax < len(x.dims):
                raise _IllTyped("slice: axis out of range")
            lo, hi = (self.attr(a[k], typed) for k in ("start", "stop"))
            lo, hi = (z3.IntVal(v) if type(v) is int else v for v in (lo, hi))
            typed += [lo >= 0, lo < hi, hi <= x.dims[ax]]

            def sliced(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                return x.elem(list(i[:ax]) + [_poly(i[ax] + lo)] + list(i[ax + 1:]))

            return _Value(x.dims[:ax] + (_poly(hi - lo),) + x.dims[ax + 1:], sliced)
        if t.op == "matmul":
            x, y = args
            r = len(x.dims)
            if r < 2 or len(y.dims) != r or (r == 2) != (len(y.dims) == 2):
                raise _IllTyped("matmul: ranks")
            typed += [d == e for d, e in zip(x.dims[:-2], y.dims[:-2])] + [x.dims[-1] == y.dims[-2]]
            act = _activation(t.op, a.get("act", 0))

            def product(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                batch = list(i[:-2])

                def body(j: z3.ArithRef) -> z3.ArithRef:
                    return x.elem([*batch, i[-2], j]) * y.elem([*batch, j, i[-1]])

                total = self._sum(body, x.dims[-1])
                return total if act is None else _act(act, total)

            return _Value((*x.dims[:-1], y.dims[-1]), product, None, self._batched_tail(x, y, act))
        if t.op == "split_part":
            (x,) = args
            ax, index = a["axis"], a["index"]
            if not self.split_dims or not 0 <= ax < len(x.dims) or any(ax >= len(d) for d in self.split_dims):
                raise _IllTyped("split: axis out of range")
            first, second = self.split_dims[0][ax], self.split_dims[1][ax]
            typed.append(first + second == x.dims[ax])
            size, start = (first, 0) if index == 0 else (second, first)
            return _Value(x.dims[:ax] + (size,) + x.dims[ax + 1:],
                          lambda i: x.elem(list(i[:ax]) + [i[ax] + start] + list(i[ax + 1:])))
        if t.op == "conv2d":
            return self._conv(t, args, typed)
        if t.op == "conv2d_nhwc":  # `ops`: conv2d on the NCHW / OIHW views of an NHWC input and HWIO kernel
            x, w = args
            if len(x.dims) != 4 or len(w.dims) != 4:
                raise _IllTyped("conv2d_nhwc: ranks")
            return _permuted(self._conv(t, [_permuted(x, ops.NHWC_OUT), _permuted(w, (3, 2, 0, 1))], typed),
                             ops.NHWC_IN)
        if t.op == "enlarge":
            w, ref = args
            if len(w.dims) != 4 or len(ref.dims) != 4:
                raise _IllTyped("enlarge: needs two OIHW kernels")
            typed += [w.dims[k] <= ref.dims[k] for k in (2, 3)] + [(ref.dims[k] - w.dims[k]) % 2 == 0 for k in (2, 3)]
            ph, pw = (ref.dims[2] - w.dims[2]) / 2, (ref.dims[3] - w.dims[3]) / 2

            def enlarge(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
                o, c, p, q = i
                inside = z3.And(ph <= p, p < ph + w.dims[2], pw <= q, q < pw + w.dims[3])
                return z3.If(inside, w.elem([o, c, p - ph, q - pw]), z3.RealVal(0))

            return _Value((w.dims[0], w.dims[1], ref.dims[2], ref.dims[3]), enlarge)
        raise Unsupported(f"no symbolic semantics for {t.op}")

    def _conv(self, t: Term, args: list[_Value], typed: list[z3.BoolRef]) -> _Value:
        """`ops.conv2d`: out[b.., n, o, i, j] = act(sum over c < Ci and input positions (r, s) of
        x[b.., n, g(o) * Ci + c, r, s] * w[b.., o, c, r - i * sh + pt, s - j * sw + pl]), both reads
        in range (padding reads 0), g(o) = o div (O / groups) the output's group, groups = C / Ci.
        The spatial sum runs over input positions, not kernel offsets, so a kernel zero-padded
        around (`enlarge`) sums the same terms exactly where its window lands on the same pixels."""
        x, w = args
        a = t.attr
        sh, sw, pad = a.get("stride_h", 1), a.get("stride_w", 1), a.get("pad", 0)
        if not all(type(v) is int for v in (sh, sw, pad, a.get("act", 0))):
            raise Unsupported("conv2d: attributes that are not integer literals")
        act = _activation(t.op, a.get("act", 0))
        r = len(x.dims)
        if len(w.dims) != r or r not in CONV_RANKS or sh < 1 or sw < 1 or pad not in (0, 1):
            raise _IllTyped("conv2d: ranks, strides or padding")
        *lead, _n, c, h, wd = x.dims
        o, ci, kh, kw = w.dims[-4:]
        typed += [d == e for d, e in zip(lead, w.dims[:-4])]
        groups_known_one = self._implied(c == ci, typed)
        factored = None if groups_known_one else self._factor_groups(c, ci, o)
        if groups_known_one:
            typed += [c % ci == 0, o % (c / ci) == 0]
            groups, og = z3.IntVal(1), o  # one group (the common case): keeps the index arithmetic linear
        elif factored is not None:  # C = groups * Ci and O = groups * og as polynomials: typed, no division
            groups, og = factored
        else:
            typed += [c % ci == 0, o % (c / ci) == 0]  # terms, not fresh unknowns: a right side's typing is a goal
            groups = c / ci
            og = o / groups
            self.grouped = True
        ho, pt = _window(h, kh, sh, pad, typed)
        wo, pl = _window(wd, kw, sw, pad, typed)

        def conv(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            outer, oc, oi, oj = list(i[:-3]), i[-3], i[-2], i[-1]
            # one group: channel base 0 (an element is only ever read at an in-range output channel),
            # which keeps the index arithmetic linear
            if groups_known_one:
                base = z3.IntVal(0)
            elif factored is not None:
                base = _poly(self._quotient(oc, og)[0] * ci)
            else:
                base = (oc / og) * ci

            def body(ks: Sequence[z3.ArithRef]) -> z3.ArithRef:
                k, rr, ss = ks
                p, q = rr - oi * sh + pt, ss - oj * sw + pl
                inside = z3.And(rr >= 0, rr < h, ss >= 0, ss < wd, p >= 0, p < kh, q >= 0, q < kw)
                term = x.elem([*outer, _poly(base + k), rr, ss]) * w.elem([*outer[:-1], oc, k, p, q])
                return z3.If(inside, term, z3.RealVal(0))

            total = self._sum_n(body, ci, 3)
            return total if act is None else _act(act, total)

        return _Value((*x.dims[:-3], o, ho, wo), conv)

    def attr(self, v: Any, typed: list[z3.BoolRef]) -> Any:
        """An attribute's value: a literal, or a reference (`?S`: the variable's symbolic dims; `?eps`: a
        real; `(shape P)` / `(dim P i)`: P's symbolic dims, P's typing joining `typed`)."""
        if isinstance(v, AttrVar):
            if v.kind == "ints":
                return self.dims[v.name]
            if v.kind == "int":  # drawn as one positive dim d, standing for d - 1 (`semantics.int_attr_value`)
                if len(self.dims[v.name]) != 1:
                    raise _IllTyped(f"?{v.name}: an integer attribute is one dim")
                return self.dims[v.name][0] - 1
            return self.floats.setdefault(v.name, z3.Real(f"attr_{v.name}"))
        if isinstance(v, ShapeOf):
            return self.value(v.pattern, typed).dims
        if isinstance(v, DimOf):
            dims = self.value(v.pattern, typed).dims
            if not 0 <= v.index < len(dims):
                raise _IllTyped("dim: index out of range")
            return dims[v.index]
        if isinstance(v, (tuple, list)):
            out: list[Any] = []
            for item in v:
                got = self.attr(item, typed)
                out += list(got) if isinstance(item, ShapeOf) else [got]
            return tuple(z3.IntVal(x) if type(x) is int else x for x in out)
        return v

    def _pool(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """`ops` poolmax / poolavg on NCHW: the window (its size a literal) unrolled, each read at
        (oi * sh + i - pt, oj * sw + j - pl) as `semantics._pool` does; avg sums the window with the
        padding as zeros and divides by kh * kw; max takes the in-bounds reads (padding is -inf), and
        the op's typing asks every window to overlap the input (low and high padding below the
        kernel, as `semantics._max_windows` demands)."""
        a = t.attr
        kh, kw, sh, sw, pad, code = (a.get(k, 0) for k in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad", "act"))
        if not all(type(v) is int for v in (kh, kw, sh, sw, pad, code)):
            raise Unsupported(f"{t.op}: attributes that are not integer literals")
        act = _activation(t.op, code)
        if not 4 <= len(x.dims) <= 6 or min(kh, kw, sh, sw) < 1 or pad not in (0, 1):
            raise _IllTyped(f"{t.op}: rank, kernel, strides or padding")
        if kh * kw > 64:
            raise Unsupported(f"{t.op}: a window of {kh * kw} reads")
        *lead, h, wd = x.dims  # leading (batch, channel, device) axes are read in place
        ho, pt = _window(h, z3.IntVal(kh), sh, pad, typed)
        wo, pl = _window(wd, z3.IntVal(kw), sw, pad, typed)
        if t.op == "poolmax":  # each window overlaps the input: padding on each side below the kernel
            typed += [pt < kh, (ho - 1) * sh + kh - h - pt < kh, pl < kw, (wo - 1) * sw + kw - wd - pl < kw]
        typed += [ho >= 1, wo >= 1]

        def pool(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            *front, oi, oj = i
            reads = []
            for di in range(kh):
                for dj in range(kw):
                    r, q = oi * sh + di - pt, oj * sw + dj - pl
                    reads.append((z3.And(r >= 0, r < h, q >= 0, q < wd), x.elem([*front, r, q])))
            if t.op == "poolavg":
                total = z3.Sum([z3.If(inb, v, z3.RealVal(0)) for inb, v in reads])
                out = total / z3.RealVal(kh * kw)
            else:
                out, seen = z3.RealVal(0), z3.BoolVal(False)
                for inb, v in reads:
                    out = z3.If(inb, z3.If(z3.And(seen, out >= v), out, v), out)
                    seen = z3.Or(seen, inb)
            return out if act is None else _act(act, out)

        return _Value((*lead, ho, wo), pool)

    def _broadcast(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """`ops` broadcast: input axis k lands on output axis dims[k] (increasing), its size 1 or the
        output's; a size-1 axis reads index 0 (a symbolic size-1 dim: the If picks)."""
        shape, dims = self.attr(t.attr["shape"], typed), t.attr["dims"]
        if not all(type(d) is int for d in dims):
            raise Unsupported("broadcast: dims that are not literals")
        if len(dims) != len(x.dims) or any(not 0 <= d < len(shape) for d in dims) or list(dims) != sorted(set(dims)):
            raise _IllTyped("broadcast: dims")
        typed += [z3.Or(xd == 1, xd == shape[d]) for xd, d in zip(x.dims, dims)] + [d >= 1 for d in shape]

        def broadcast(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            return x.elem([z3.If(xd == 1, z3.IntVal(0), i[d]) for xd, d in zip(x.dims, dims)])

        return _Value(tuple(shape), broadcast)

    def _batchnorm(self, t: Term, args: list[_Value], typed: list[z3.BoolRef]) -> _Value:
        """`ops` batchnorm: (x - mean[c]) * (scale[c] * rsqrt(var[c] + eps)) + bias[c], c the index on
        axis 1, rsqrt an uninterpreted function (as the concrete prover's atom)."""
        x, scale, bias, mean, var = args
        if len(x.dims) < 2 or any(len(v.dims) != 1 for v in (scale, bias, mean, var)):
            raise _IllTyped("batchnorm: ranks")
        typed += [v.dims[0] == x.dims[1] for v in (scale, bias, mean, var)]
        eps = self.attr(t.attr["eps"], typed)
        eps = z3.RealVal(eps) if isinstance(eps, (int, float)) else eps
        rsqrt = z3.Function("rsqrt", z3.RealSort(), z3.RealSort())

        def batchnorm(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            c = [i[1]]
            inv = scale.elem(c) * rsqrt(var.elem(c) + eps)
            return (x.elem(i) - mean.elem(c)) * inv + bias.elem(c)

        return _Value(x.dims, batchnorm)

    def _reshape(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """reshape that only adds or drops literal size-1 axes (the rest equal in order): the
        row-major index map keeps the other indices. Only on a strict right side: there its typing is
        a goal, and equal remaining dims are a stronger goal than equal element counts, so a proof
        stays sound; as a hypothesis (a left side, or the guard) it would assume too much."""
        if x.view is not None or x.tail is not None:
            try:
                return self._flat_view(t, x, typed)
            except Unsupported:
                out = self._tail_view(t, x, typed)
                if out is None:
                    raise
                return out
        if self.typed_is_assumed or self.guarded_mode:
            raise Unsupported("reshape on a left side or under the guard (row-major index maps over symbolic dims)")
        shape = self.attr(t.attr["shape"], typed)
        keep_out = [k for k, d in enumerate(shape) if not (z3.is_int_value(d) and d.as_long() == 1)]
        keep_in = [k for k, d in enumerate(x.dims) if not (z3.is_int_value(d) and d.as_long() == 1)]
        if len(keep_out) != len(keep_in):
            raise Unsupported("reshape beyond adding or dropping size-1 axes")
        typed += [shape[o] == x.dims[k] for o, k in zip(keep_out, keep_in)] + [d >= 1 for d in shape]

        def reshape(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            idx = [z3.IntVal(0)] * len(x.dims)
            for o, k in zip(keep_out, keep_in):
                idx[k] = i[o]
            return x.elem(idx)

        return _Value(tuple(shape), reshape)

    def _flat_view(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """reshape of a value read as G(prefix, flat index of the rest) (`_Value.view`) that keeps the
        k prefix dims: row-major, element i of the result is G(i[:k], flat index of i[k:] in the
        new dims), whatever the dims (no div / mod). Typed where the element counts agree (also
        stated past the longest common prefix: implied by the whole count, as each dim is >= 1)."""
        if x.view is None:
            raise Unsupported("reshape of a value with no flat view")
        k, read = x.view
        shape = tuple(self.attr(t.attr["shape"], typed))
        if len(shape) < k or any(not z3.eq(_poly(a), _poly(b)) for a, b in zip(shape[:k], x.dims[:k])):
            raise Unsupported("reshape that does not keep the leading dims its input is read by")
        common = 0
        while common < min(len(shape), len(x.dims)) and z3.eq(_poly(shape[common]), _poly(x.dims[common])):
            common += 1
        typed += [d >= 1 for d in shape] + [_product(shape) == _product(x.dims)]
        typed.append(_product(shape[common:]) == _product(x.dims[common:]))
        rest = shape[k:]
        return _Value(shape, lambda i: read(i[:k], _flat(i[k:], rest)), (k, read))

    def _batched_tail(self, x: _Value, y: _Value, act: str | None) -> Tail | None:
        """A batched product of two values read through their batch dims' flat index (`_tail` with
        the two matrix dims last, the same prefix): its elements read through that index too."""
        if len(x.dims) < 3:
            return None
        tx, ty = _tail(x, 2), _tail(y, 2)
        if tx is None or ty is None or tx[0] != ty[0]:
            return None
        (k, rx), (_, ry) = tx, ty
        inner = x.dims[-1]

        def read(pre: Sequence[z3.ArithRef], m: z3.ArithRef, post: Sequence[z3.ArithRef]) -> z3.ArithRef:
            def body(j: z3.ArithRef) -> z3.ArithRef:
                return rx(pre, m, [post[0], j]) * ry(pre, m, [j, post[1]])

            total = self._sum(body, inner)
            return total if act is None else _act(act, total)

        return (k, 2, read)

    def _tail_view(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value | None:
        """reshape that keeps x's first k and last s dims (x read as H(prefix, flat middle, last s),
        `_tail`): element i of the result is H(i[:k], flat index of its middle, i[r-s:]), the
        row-major map of the middle alone, whatever the dims (no div / mod). A split of the last dim
        through (B*T, d) <-> (B, T, d), a product batched over merged dims. None: no such view."""
        shape = tuple(self.attr(t.attr["shape"], typed))
        suffix = 0
        while suffix < min(len(shape), len(x.dims)) and z3.eq(_poly(shape[-1 - suffix]), _poly(x.dims[-1 - suffix])):
            suffix += 1
        for s in range(suffix, 0, -1):
            found = _tail(x, s)
            if found is None:
                continue
            k, read = found
            r_new, r_old = len(shape), len(x.dims)
            if k > r_new - s or any(not z3.eq(_poly(a), _poly(b)) for a, b in zip(shape[:k], x.dims[:k])):
                continue
            middle = shape[k:r_new - s]
            typed += [d >= 1 for d in shape] + [_product(shape) == _product(x.dims)]
            typed.append(_product(middle) == _product(x.dims[k:r_old - s]))

            def elem(i: Sequence[z3.ArithRef], k: int = k, s: int = s, read: Any = read,
                     middle: Dims = middle) -> z3.ArithRef:
                return read(i[:k], _flat(i[k:len(i) - s], middle), i[len(i) - s:])

            return _Value(shape, elem, None, (k, s, read))
        return None

    def _merge_gconv(self, t: Term, w: _Value, typed: list[z3.BoolRef]) -> _Value:
        """`ops.merge_gconv_into`: the kernel of a conv with G groups as that of the same conv with
        G / count groups, block-diagonal: output channel o keeps its Ci weights at input block
        (o div og) mod count of its merged group, zeros elsewhere (og = O / G). Modelled where the
        group arithmetic factors (`_parametrize`), so no division by a symbolic size."""
        shape, count = self.attr(t.attr["input_shape"], typed), t.attr["count"]
        if type(count) is not int or count < 1 or len(w.dims) != 4 or len(shape) != 4:
            raise _IllTyped("merge_gconv: count, kernel or input rank")
        o, ci = w.dims[0], w.dims[1]
        factored = self._factor_groups(shape[1], ci, o)
        if factored is None:
            raise _NeedsFactors("merge_gconv: group arithmetic that does not factor")
        groups, og = factored
        if not any(_identical(groups, count * f) for f in self.factors):
            typed.append(groups % count == 0)

        def merged(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            oc, c, p, q = i
            quotient = self._quotient(oc, og)[0]
            cased = self.slots[0] == count and (oc.get_id(), og.get_id()) in self.sliced  # the quotient split by residue
            slot = z3.IntVal(self.slots[1]) if cased else quotient % count
            inside = z3.And(slot * ci <= c, c < slot * ci + ci)
            return z3.If(inside, w.elem([oc, _poly(c - slot * ci), p, q]), z3.RealVal(0))

        return _Value((o, ci * count, w.dims[2], w.dims[3]), merged)

    def _distribution(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """`eqsat.distribution` in the stacked representation: a distributed value has a leading
        device axis. partition along dim a into n pieces: device d's piece reads x at d * (S / n) + i
        on axis a (typed when n divides S); combine: concatenation of the device slices (a literal
        count: an If per device, as concat; a symbolic one: quotient and remainder by the piece);
        replicate: every device reads x; reduce: the sum over the device axis. The collectives are
        their definitions (all_reduce = replicate . reduce, all_gather = replicate . combine,
        reduce_scatter = partition . reduce, all_to_all = partition . combine)."""
        a = t.attr
        if any(type(v) is not int for k, v in a.items() if k != "axis"):
            raise Unsupported(f"{t.op}: attributes that are not integer literals")
        if t.op == "partition":
            return self._partition(x, a["dim"], a["parts"], typed)
        if t.op == "replicate":
            if a["parts"] < 1:
                raise _IllTyped("replicate: parts")
            return _replicate(x, z3.IntVal(a["parts"]))
        if len(x.dims) < 2:
            raise _IllTyped(f"{t.op}: needs a leading device axis and one more")
        count = z3.simplify(x.dims[0])
        if t.op == "combine":
            return self._combine(x, a["dim"])
        if t.op == "reduce":
            return self._reduce(x)
        if t.op == "all_reduce":
            return _replicate(self._reduce(x), x.dims[0])
        if t.op == "all_gather":
            return _replicate(self._combine(x, a["dim"]), x.dims[0])
        if not z3.is_int_value(count):
            raise Unsupported(f"{t.op}: a symbolic device count")
        inner = self._reduce(x) if t.op == "reduce_scatter" else self._combine(x, a["concat_dim"])
        return self._partition(inner, a["dim" if t.op == "reduce_scatter" else "split_dim"], count.as_long(), typed)

    def _partition(self, x: _Value, dim: int, parts: int, typed: list[z3.BoolRef]) -> _Value:
        r = len(x.dims)
        if not -r <= dim < 0 or parts < 1:
            raise _IllTyped("partition: dim or parts")
        ax = r + dim
        piece = self._piece(x.dims[ax], parts, typed)

        def part(idx: Sequence[z3.ArithRef]) -> z3.ArithRef:
            device, rest = z3.simplify(idx[0]), list(idx[1:])

            def read(d: int) -> z3.ArithRef:
                return x.elem(rest[:ax] + [_poly(d * piece + rest[ax])] + rest[ax + 1:])

            if z3.is_int_value(device):
                return read(device.as_long())
            out = read(parts - 1)
            for d in reversed(range(parts - 1)):
                out = z3.If(device == d, read(d), out)
            return out

        return _Value((z3.IntVal(parts), *x.dims[:ax], piece, *x.dims[ax + 1:]), part,
                      _partition_view(x, ax, parts, piece), _partition_tail(x, ax, piece))

    def _piece(self, size: z3.ArithRef, parts: int, typed: list[z3.BoolRef]) -> z3.ArithRef:
        """size / parts with parts | size: a literal multiple divides exactly; where the typing is a
        hypothesis, a fresh piece p with size = parts * p (so a sum over size splits into parts sums
        over p, `_sum_n`); where it is a goal, the term size / parts and the goal parts | size."""
        if parts == 1:
            return size
        poly = _poly(size)
        if z3.is_mul(poly) and poly.num_args() == 2 and z3.is_int_value(poly.arg(0)) \
                and poly.arg(0).as_long() % parts == 0:
            return _poly(poly.arg(0).as_long() // parts * poly.arg(1))
        key = (poly.get_id(), parts)
        if key in self.pieces:
            return self.pieces[key]
        if self.typed_is_assumed or self.guarded_mode:
            p = z3.Int(f"piece{len(self.pieces)}")
            typed.append(poly == parts * p)
            self.pieces[key] = p
            self.multiples[poly.get_id()] = (parts, p)
            return p
        typed.append(poly % parts == 0)
        return poly / parts

    def _combine(self, y: _Value, dim: int) -> _Value:
        r = len(y.dims) - 1
        if not -r <= dim < 0:
            raise _IllTyped("combine: dim")
        ax = r + dim
        count, piece = z3.simplify(y.dims[0]), y.dims[1 + ax]
        rest_dims = list(y.dims[1:])
        if z3.is_int_value(count):
            n = count.as_long()

            def concat(idx: Sequence[z3.ArithRef]) -> z3.ArithRef:
                def read(d: int) -> z3.ArithRef:
                    return y.elem([z3.IntVal(d), *idx[:ax], _poly(idx[ax] - d * piece), *idx[ax + 1:]])

                out = read(n - 1)
                for d in reversed(range(n - 1)):
                    out = z3.If(idx[ax] < (d + 1) * piece, read(d), out)
                return out

            rest_dims[ax] = _poly(n * piece)
            # along the first axis the devices' pieces lie in flat order: the same flat view
            return _Value(tuple(rest_dims), concat, y.view if ax == 0 and y.view is not None and y.view[0] == 0 else None)
        out = piece * y.dims[0]
        self.blocked[out.get_id()] = (piece, y.dims[0])

        def gathered(idx: Sequence[z3.ArithRef]) -> z3.ArithRef:
            q, rem = self.digits.get((idx[ax].get_id(), piece.get_id())) or self._quotient(idx[ax], piece)
            return y.elem([q, *idx[:ax], rem, *idx[ax + 1:]])

        rest_dims[ax] = out
        return _Value(tuple(rest_dims), gathered)

    def _reduce(self, y: _Value) -> _Value:
        count = z3.simplify(y.dims[0])
        if z3.is_int_value(count):
            return _Value(y.dims[1:], lambda i: z3.Sum([y.elem([z3.IntVal(d), *i]) for d in range(count.as_long())]))
        return _Value(y.dims[1:], lambda i: self._sum(lambda d: y.elem([d, *i]), y.dims[0]))

    def _reduction(self, t: Term, x: _Value, typed: list[z3.BoolRef]) -> _Value:
        """reduce_sum / reduce_max over literal axes (counted from the front): nested sums (`_sum_n`),
        or nested maxima as an uninterpreted MAX of the length and the masked body."""
        axes = t.attr["axes"]
        if not all(type(v) is int for v in axes):
            raise Unsupported(f"{t.op}: axes that are not literals")
        if len(set(axes)) != len(axes) or any(not 0 <= v < len(x.dims) for v in axes):
            raise _IllTyped(f"{t.op}: axes")
        kept = [k for k in range(len(x.dims)) if k not in axes]
        order = sorted(axes)

        def element(i: Sequence[z3.ArithRef]) -> z3.ArithRef:
            def level(pos: int, chosen: dict[int, z3.ArithRef]) -> z3.ArithRef:
                if pos == len(order):
                    full = dict(zip(kept, i)) | chosen
                    return x.elem([full[k] for k in range(len(x.dims))])
                ax = order[pos]
                body = lambda k: level(pos + 1, {**chosen, ax: k})  # noqa: E731
                return self._sum(body, x.dims[ax]) if t.op == "reduce_sum" else self._max(body, x.dims[ax])

            return level(0, {})

        return _Value(tuple(x.dims[k] for k in kept), element)

    def _max(self, body: Callable[[z3.ArithRef], z3.ArithRef], n: z3.ArithRef) -> z3.ArithRef:
        """max(body(k) for 0 <= k < n), uninterpreted: equal lengths and equal masked bodies give equal
        maxima (the length is an argument: the masked body alone does not determine the range)."""
        k = z3.Int(f"m{self.depth}")
        self.depth += 1
        try:
            expr = body(k)
        finally:
            self.depth -= 1
        fn = z3.Function("MAX", z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.RealSort()), z3.RealSort())
        return fn(n, z3.Lambda([k], z3.If(z3.And(k >= 0, k < n), expr, z3.RealVal(0))))

    def _factor_groups(self, c: z3.ArithRef, ci: z3.ArithRef, o: z3.ArithRef) -> tuple[z3.ArithRef, z3.ArithRef] | None:
        """(groups, O / groups) when C = groups * Ci and O = groups * og are polynomial identities for
        some groups, og built from the group factors `_parametrize` introduced (small multiples of
        one, or sums): the grouped conv is then typed and its channel arithmetic needs no division."""
        candidates = [m * f for f in self.factors for m in (1, 2)]
        groups = next((g for g in candidates if _identical(c, g * ci)), None)
        if groups is None:
            return None
        og = next((q for q in candidates if _identical(o, groups * q)), None)
        return None if og is None else (groups, og)

    def _quotient(self, a: z3.ArithRef, d: z3.ArithRef) -> tuple[z3.ArithRef, z3.ArithRef]:
        """(a div d, a mod d) for a group size d >= 1, as terms: a - m * d reuses a's quotient
        (minus m), m * d (m a literal) divides a's quotient by d by m; otherwise a fresh quotient and
        remainder with their definition a = q * d + r, 0 <= r < d (always satisfiable)."""
        key = (a.get_id(), d.get_id())
        if key not in self.quotients:
            got = None
            if z3.is_app_of(d, z3.Z3_OP_MUL) and d.num_args() == 2 and z3.is_int_value(d.arg(0)):
                m, unit = d.arg(0).as_long(), d.arg(1)
                q, r = self._quotient(a, unit)
                inner = self.sliced.get((a.get_id(), unit.get_id()))
                count, case = self.slots
                got = (inner, case * unit + r) if inner is not None and m == count else (q / m, (q % m) * unit + r)
            elif z3.is_sub(a) and a.num_args() == 2:
                shift = next((f for f in self.factors if _identical(a.arg(1), f * d)), None)
                if shift is not None:
                    q, r = self._quotient(a.arg(0), d)
                    self.defs.append((a.arg(0) >= a.arg(1)) == (q >= shift))
                    got = (q - shift, r)
            if got is None:
                n = len(self.quotients)
                q, r = z3.Int(f"quot{n}"), z3.Int(f"rem{n}")
                count, case = self.slots
                if count > 1:  # proved once per residue of q mod count: sound for one fresh quotient only
                    if self.sliced:
                        raise _NeedsFactors("two quotients under a merge_gconv's case split")
                    self.sliced[key] = q
                    q = count * q + case
                self.defs += [a == q * d + r, r >= 0, r < d]
                got = (q, r)
            self.quotients[key] = got
        return self.quotients[key]

    def _implied(self, claim: z3.BoolRef, typed: list[z3.BoolRef]) -> bool:
        """Whether the hypotheses imply `claim` (z3, briefly; False when it cannot tell)."""
        solver = z3.Solver()
        solver.add(*self.assumed, *(typed if self.typed_is_assumed else ()), z3.Not(claim))
        return check(solver, IMPLIED_BUDGET) == z3.unsat

    def _sum_n(self, body: Callable[[Sequence[z3.ArithRef]], z3.ArithRef], n: z3.ArithRef, arity: int,
               tag: str = "") -> z3.ArithRef:
        """The sum of body(k, ...) over 0 <= k < n and every integer for the other `arity - 1`
        indices (the body is zero outside a finite range), as uninterpreted sums of lambdas, taken
        apart by linearity (`_linear`): factors free of the summed indices come out, so sums whose
        terms agree up to such factors (a scaled or added weight, a batchnorm folded into it) are
        equal. Bound indices are named by nesting depth, so alpha-equal sums are one z3 term. A
        length a + b (a concatenated dim) is split into [0, a) and [a, a + b)."""
        if n.get_id() in self.multiples:  # n = parts * piece (a partitioned dim): one sum per piece
            count, size = self.multiples[n.get_id()]
            return z3.Sum([self._sum_n(lambda ks, j=j: body([_poly(ks[0] + j * size), *ks[1:]]), size, arity)  # type: ignore[misc]
                           for j in range(count)])
        if arity == 1 and n.get_id() in self.blocked:  # n = piece * count (a combined dim): sum over devices of pieces
            piece, count = self.blocked[n.get_id()]

            def device(ds: Sequence[z3.ArithRef]) -> z3.ArithRef:
                def within(hs: Sequence[z3.ArithRef]) -> z3.ArithRef:
                    k = ds[0] * piece + hs[0]
                    self.digits[(k.get_id(), piece.get_id())] = (ds[0], hs[0])
                    return body([k])

                return self._sum_n(within, piece, 1)

            return self._sum_n(device, count, 1)
        if z3.is_add(n) and n.num_args() == 2:
            first, second = n.arg(0), n.arg(1)
            return (self._sum_n(body, first, arity)
                    + self._sum_n(lambda ks: body([ks[0] + first, *ks[1:]]), second, arity))
        if z3.is_mul(n) and n.num_args() == 2 and any(z3.is_int_value(a) and 1 < a.as_long() <= 4 for a in n.children()):
            m, a = (n.arg(0), n.arg(1)) if z3.is_int_value(n.arg(0)) else (n.arg(1), n.arg(0))
            return z3.Sum([self._sum_n(lambda ks, j=j: body([ks[0] + j * a, *ks[1:]]), a, arity)  # type: ignore[misc]
                           for j in range(m.as_long())])
        ks = [z3.Int(f"k{self.depth}_{m}") for m in range(arity)]
        if arity not in self.sum_fns:
            self.sum_fns[arity] = z3.Function(f"SUM{arity}", z3.ArraySort(*([z3.IntSort()] * arity), z3.RealSort()),
                                              z3.RealSort())
        self.depth += 1
        try:
            expr = body(ks)
        finally:
            self.depth -= 1
        mask = z3.And(ks[0] >= 0, ks[0] < n)
        bound = {k.get_id() for k in ks}
        grouped: dict[int, tuple[z3.ArithRef, list[z3.ArithRef]]] = {}
        for coef, term in _linear(expr, bound, {}):
            grouped.setdefault(term.get_id(), (term, []))[1].append(coef)
        parts = []
        for term, coefs in grouped.values():
            total = self.sum_fns[arity](z3.Lambda(ks, z3.If(mask, term, z3.RealVal(0))))
            parts += [p for c in coefs if not _is_const(p := _scale(c, total), 0)]
        return z3.Sum(parts) if len(parts) > 1 else parts[0] if parts else z3.RealVal(0)

    def _sum(self, body: Callable[[z3.ArithRef], z3.ArithRef], n: z3.ArithRef, k: z3.ArithRef | None = None) -> z3.ArithRef:
        """sum(body(k) for 0 <= k < n): `_sum_n` of arity 1."""
        return self._sum_n(lambda ks: body(ks[0]), n, 1)


Linear = list[tuple[z3.ArithRef, z3.ArithRef]]


def _linear(e: z3.ArithRef, bound: set[int], memo: dict[int, bool]) -> Linear:
    """`e` as a sum of coefficient * term, the coefficients free of the bound indices: sums are
    linear, so sum(e) is the sum of coefficient * sum(term). Products distribute, an If on a free
    condition splits into two coefficients, an If(c, t, 0) on a bound one keeps its mask on each
    term; anything else is one term (or a coefficient, when free)."""
    one = z3.RealVal(1)
    if not _mentions(e, bound, memo):
        return [(e, one)]
    if z3.is_add(e):
        return [ct for a in e.children() for ct in _linear(a, bound, memo)]
    if z3.is_sub(e):
        first, *rest = e.children()
        return _linear(first, bound, memo) + [(-c, t) for a in rest for c, t in _linear(a, bound, memo)]
    if z3.is_app_of(e, z3.Z3_OP_UMINUS):
        return [(-c, t) for c, t in _linear(e.arg(0), bound, memo)]
    if z3.is_mul(e):
        out: Linear = [(one, one)]
        for a in e.children():
            out = [(_times(c1, c2), _times(t1, t2)) for c1, t1 in out for c2, t2 in _linear(a, bound, memo)]
            if len(out) > 64:
                return [(one, e)]
        return out
    if z3.is_app_of(e, z3.Z3_OP_ITE) and e.sort() == z3.RealSort():
        cond, yes, no = e.children()
        zero = _is_const(no, 0)
        if not _mentions(cond, bound, memo):
            return ([(z3.If(cond, c, z3.RealVal(0)), t) for c, t in _linear(yes, bound, memo)]
                    + ([] if zero else [(z3.If(cond, z3.RealVal(0), c), t) for c, t in _linear(no, bound, memo)]))
        if zero:
            return [(c, z3.If(cond, t, z3.RealVal(0))) for c, t in _linear(yes, bound, memo)]
    return [(one, e)]


def _times(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    """a * b with an If on either side pushed out (If(c, x, y) * b = If(c, x * b, y * b)), so a
    coefficient stays a case split over products, never an If times a sum (non-linear for z3)."""
    for u, v in ((a, b), (b, a)):
        if _is_const(u, 1):
            return v
        if _is_const(u, 0):
            return z3.RealVal(0)
    for u, v in ((a, b), (b, a)):
        if z3.is_app_of(u, z3.Z3_OP_ITE):
            return z3.If(u.arg(0), _times(u.arg(1), v), _times(u.arg(2), v))
    return a * b


def _scale(coef: z3.ArithRef, total: z3.ArithRef) -> z3.ArithRef:
    """coef * total, an If in the coefficient (a concat's side, free of the summed indices) kept as
    a case split around the sum."""
    return _times(coef, total)


def _is_const(e: z3.ExprRef, value: int) -> bool:
    return z3.is_rational_value(e) and e.as_fraction() == value


def _mentions(e: z3.ExprRef, bound: set[int], memo: dict[int, bool]) -> bool:
    """Whether `e` contains one of the bound index constants."""
    key = e.get_id()
    if key not in memo:
        memo[key] = e.get_id() in bound or any(_mentions(c, bound, memo) for c in e.children())
    return memo[key]


def _poly(e: z3.ArithRef) -> z3.ArithRef:
    """`e` as a sum of monomials (z3's som normal form): index arithmetic written two ways
    ((q - m) * Ci + k and q * Ci + k - m * Ci) becomes one term."""
    return z3.simplify(e, som=True)


def _identical(a: z3.ArithRef, b: z3.ArithRef) -> bool:
    """a = b as polynomials (for every value of their symbols)."""
    return _is_const(_poly(a - b), 0) or _poly(a).eq(_poly(b))


def _parametrize(rule: Rule, dims: dict[str, Dims], guarded: bool) -> list[z3.ArithRef]:
    """Write the dims that grouped convs divide as products, so their channel arithmetic is
    polynomial: dims equal by a condition become one symbol; a conv on variables x, w whose typing is
    a hypothesis (a left side; a right side under the guard) has C = G * Ci and O = G * og for fresh
    G, og >= 1 (what `C % Ci == 0` and `O % (C / Ci) == 0` say), and a merge_gconv of count k has
    G = k * H. Every assignment of the old dims that types those ops is one of the new ones, so the
    proof covers the same shapes. Returns the fresh factors (each >= 1)."""
    factors: list[z3.ArithRef] = []

    def substitute(old: z3.ArithRef, new: z3.ArithRef) -> None:
        for v in dims:
            dims[v] = tuple(z3.substitute(d, (old, new)) for d in dims[v])

    def plain(d: z3.ArithRef) -> bool:
        return z3.is_const(d) and not z3.is_int_value(d)

    for c in rule.conditions:  # (= (dim ?a i) (dim ?b j)): one symbol
        if isinstance(c, Term) and c.op == "=" and all(isinstance(a, Term) and a.op == "dim" for a in c.args):
            try:
                a, b = (_condition(x, dims) for x in c.args)
            except Unsupported:
                continue
            if plain(a) and plain(b) and not a.eq(b):
                substitute(b, a)
    sides = rule.lhs + (rule.rhs if guarded else ())
    terms = [t for p in sides for t in subterms(p)]
    for t in terms:
        x = t.attr.get("input_shape")
        if t.op == "merge_gconv" and isinstance(x, ShapeOf) and isinstance(x.pattern, Var) \
                and isinstance(t.args[0], Var) and type(t.attr.get("count")) is int:
            xd, wd = dims.get(x.pattern.name, ()), dims.get(t.args[0].name, ())
            if len(xd) == 4 and len(wd) == 4 and plain(xd[1]):
                h = z3.Int(f"H{len(factors)}")
                factors.append(h)
                substitute(xd[1], t.attr["count"] * h * wd[1])
    for t in terms:
        if t.op == "conv2d" and all(isinstance(a, Var) for a in t.args):
            xd, wd = dims[t.args[0].name], dims[t.args[1].name]  # type: ignore[union-attr]
            if len(xd) not in CONV_RANKS or len(wd) != len(xd):
                continue
            c, ci, o = xd[-3], wd[-3], wd[-4]
            if plain(c) and not c.eq(ci):
                g = z3.Int(f"G{len(factors)}")
                factors.append(g)
                substitute(c, g * ci)
                c = dims[t.args[0].name][-3]  # type: ignore[union-attr]
            groups = next((f2 for f in factors for f2 in (f, 2 * f) if _identical(c, f2 * ci)), None)
            if groups is not None and plain(o):
                og = z3.Int(f"og{len(factors)}")
                factors.append(og)
                substitute(o, groups * og)
    return factors


def _window(size: z3.ArithRef, k: z3.ArithRef, stride: int, pad: int,
            typed: list[z3.BoolRef]) -> tuple[z3.ArithRef, z3.ArithRef]:
    """`ops.window_out_and_pads`: the output length and the low padding (SAME: ceil(size / stride)
    outputs, the total padding max((out - 1) * stride + k - size, 0), its lower half first; VALID:
    (size - k) // stride + 1 outputs, no padding), with the op's demand of at least one output."""
    if pad == 1:
        typed.append(size >= k)
        return (size - k) / stride + 1, z3.IntVal(0)
    out = (size + stride - 1) / stride
    total = (out - 1) * stride + k - size
    return out, z3.If(total > 0, total, 0) / 2


def _partition_view(x: _Value, ax: int, parts: int, piece: z3.ArithRef) -> View | None:
    """The flat view of a partition along axis `ax` of x (read as (k, G), k <= ax): device d's
    element (pre, i, rest) is x's at flat offset d * piece * R within the block after x's first
    `ax` dims (R: the dims after ax). Along the first axis (k = ax = 0) that is x's own flat index,
    so the view stays (0, G); otherwise the device and x's first `ax` dims become the prefix."""
    if x.view is None or x.view[0] > ax:
        return None
    k, read = x.view
    if ax == 0:
        return (0, read)
    after = _product(x.dims[ax + 1:])
    block = _poly(x.dims[ax] * after)

    def view(pre: Sequence[z3.ArithRef], flat: z3.ArithRef) -> z3.ArithRef:
        d, outer = pre[0], list(pre[1:])
        return read(outer[:k], _poly(_flat(outer[k:], x.dims[k:ax]) * block + d * piece * after + flat))

    return (ax + 1, view)


def _tail(x: _Value, s: int) -> tuple[int, Callable[[Sequence[z3.ArithRef], z3.ArithRef, Sequence[z3.ArithRef]], z3.ArithRef]] | None:
    """x read as H(i[:k], flat index of i[k:r-s], i[r-s:]) (`_Value.tail`), from its tail or its flat
    view (G(pre, m * (product of the last s dims) + their flat index)), or None."""
    r = len(x.dims)
    if x.tail is not None and x.tail[1] == s:
        return x.tail[0], x.tail[2]
    if x.view is None or x.view[0] > r - s:
        return None
    k, read = x.view
    last = x.dims[r - s:]
    width = _product(last)

    def h(pre: Sequence[z3.ArithRef], m: z3.ArithRef, post: Sequence[z3.ArithRef]) -> z3.ArithRef:
        return read(pre, _poly(m * width + _flat(post, last)))

    return k, h


def _partition_tail(x: _Value, ax: int, piece: z3.ArithRef) -> Tail | None:
    """The tail view of a partition along x's last axis (x read through a flat view (k, G)):
    device d's element (pre, middle, j) is G(pre, flat(middle) * S + d * piece + j), so a reshape
    that keeps the device, x's first k dims and the piece keeps it (a split of the last dim through
    (B*T, d) <-> (B, T, d))."""
    if x.view is None or ax != len(x.dims) - 1 or x.view[0] > ax:
        return None
    k, read = x.view
    size = x.dims[ax]

    def h(pre: Sequence[z3.ArithRef], m: z3.ArithRef, post: Sequence[z3.ArithRef]) -> z3.ArithRef:
        return read(pre[1:], _poly(m * size + pre[0] * piece + post[0]))

    return (1 + k, 1, h)


def _permuted(x: _Value, perm: Sequence[int]) -> _Value:
    """`x` transposed by `perm` (a permutation of its rank): output axis k is input axis perm[k]."""
    inverse = [list(perm).index(k) for k in range(len(perm))]
    return _Value(tuple(x.dims[p] for p in perm), lambda i: x.elem([i[inverse[k]] for k in range(len(perm))]))


def _replicate(x: _Value, parts: z3.ArithRef) -> _Value:
    return _Value((parts, *x.dims), lambda i: x.elem(i[1:]))


def _activation(op: str, code: Any) -> str | None:
    if type(code) is not int or code not in ACTIVATIONS:
        raise Unsupported(f"{op}: activation code {code!r}")
    return ACTIVATIONS[code]


class _NeedsFactors(Exception):
    """An op modelled only with the group arithmetic as products (`_parametrize`)."""


class _IllTyped(Exception):
    """Ill-typed for every choice of dims at this rank assignment."""


def _same_rank(op: str, x: _Value, y: _Value) -> None:
    if len(x.dims) != len(y.dims):
        raise _IllTyped(f"{op}: ranks differ")


def _act(name: str, v: z3.ArithRef) -> z3.ArithRef:
    if name == "relu":
        return z3.If(v > 0, v, z3.RealVal(0))
    return z3.Function(name, z3.RealSort(), z3.RealSort())(v)


def _condition(c: Any, dims: Mapping[str, Dims]) -> Any:
    if isinstance(c, Var):
        raise Unsupported("a bare variable in a condition")
    if c.op == "const":
        return z3.IntVal(c.attr["value"])
    if c.op in CLASS_CONDITIONS:
        return z3.BoolVal(True)
    if c.op == "dim":
        var, index = c.args[0], c.args[1]
        i = _condition(index, dims)
        if not isinstance(var, Var) or not z3.is_int_value(i):
            raise Unsupported("dim of a non-variable")
        shape = dims[var.name]
        k = i.as_long()
        return shape[k] if 0 <= k < len(shape) else z3.IntVal(-1)
    if c.op == "rank":
        if not isinstance(c.args[0], Var):
            raise Unsupported("rank of a non-variable")
        return z3.IntVal(len(dims[c.args[0].name]))
    a, b = (_condition(x, dims) for x in c.args)
    ops: dict[str, Callable[[Any, Any], Any]] = {
        "=": lambda x, y: x == y, "!=": lambda x, y: x != y, "<": lambda x, y: x < y, "<=": lambda x, y: x <= y,
        "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "%": _python_mod}
    if c.op not in ops:
        raise Unsupported(f"condition op {c.op}")
    return ops[c.op](a, b)


def ops_used_by(rule: Rule) -> set[str]:
    return {o for p in rule.lhs + rule.rhs for o in ops_used(p)}


def _python_mod(x: Any, y: Any) -> Any:
    """Python's a % b (the sign of b; -1 for b = 0, as `shapes.condition_holds`); z3's mod is never negative."""
    return z3.If(y == 0, z3.IntVal(-1), z3.If(y > 0, x % y, -((-x) % (-y))))


def why_not(rule: Rule) -> str | None:
    """Why the symbolic prover cannot take the rule (None when it can try)."""
    used = {o for p in rule.lhs + rule.rhs for o in ops_used(p)}
    other = sorted(used - SUPPORTED - ((DISTRIBUTION | DISTRIBUTED_ONLY) if used & DISTRIBUTION else frozenset()))
    if other:
        return f"no symbolic semantics for {', '.join(other)} (index arithmetic of windows, broadcasts, reshapes)"
    if any(_condition_ops(c) - _CONDITION_OPS for c in rule.conditions):
        return "a condition op the symbolic prover does not model"
    return None


_RANK_SAFE = frozenset({"=", "dim", "rank", "const", *CLASS_CONDITIONS})
_CONDITION_OPS = _RANK_SAFE | {"!=", "<", "<=", "+", "-", "*", "%"}


def _rank_assignments(rule: Rule, guarded: bool) -> list[dict[str, int]]:
    """Every rank assignment that may type the rule (`shapes.rank_choices`, which tries equal dims).
    A condition beyond equalities of dims and ranks (an inequality, a parity) may hold only for
    unequal dims, so it is dropped for the enumeration: more assignments, each still proved under
    the conditions."""
    if any(_condition_ops(c) - _RANK_SAFE for c in rule.conditions):  # a rank condition (`pinned_ranks`) stays
        rule = replace(rule, conditions=tuple(c for c in rule.conditions if not _condition_ops(c) - _RANK_SAFE
                                              or pinned_ranks(replace(rule, conditions=(c,)))))
    return rank_choices(rule, guarded=guarded, ranks=tuple(range(1, MAX_RANK + 2)), limit=256,
                        only=_forced_ranks(rule, guarded))


def _forced_ranks(rule: Rule, guarded: bool) -> dict[str, tuple[int, ...]]:
    """Ranks the ops' typing forces on a variable they read directly (batchnorm's per-channel
    vectors: 1; a broadcast's input: its dims list's length; a conv's operands: `CONV_RANKS`), so
    the enumeration skips ranks that are ill-typed anyway: on the left sides, and on the right
    ones too under the guard (strictly, a left side typed where the right is not must be seen)."""
    out: dict[str, set[int]] = {}
    for p in rule.lhs + (rule.rhs if guarded else ()):
        for t in subterms(p):
            forced: list[tuple[Pattern, tuple[int, ...]]] = []
            if t.op == "batchnorm":
                forced = [(a, (1,)) for a in t.args[1:]]
            elif t.op == "broadcast" and all(type(d) is int for d in t.attr["dims"]):
                forced = [(t.args[0], (len(t.attr["dims"]),))]
            elif t.op == "conv2d":
                forced = [(a, CONV_RANKS) for a in t.args]
            elif t.op == "conv2d_nhwc":
                forced = [(a, (4,)) for a in t.args]
            for a, allowed in forced:
                if isinstance(a, Var):
                    out[a.name] = out.get(a.name, set(allowed)) & set(allowed)
    return {v: tuple(sorted(r)) for v, r in out.items()}


def _condition_ops(c: Any) -> set[str]:
    if isinstance(c, Var):
        return set()
    return {c.op} | {o for a in c.args for o in _condition_ops(a)}


def resists(rule: Rule, guarded: bool = False) -> str:
    """Why no proof for all shapes was found (for a rule the concrete prover only tested)."""
    reason = why_not(rule)
    if reason is not None:
        return reason
    wide = _rank_assignments(rule, guarded)
    if any(r > MAX_RANK for c in wide for r in c.values()):
        return "rank-polymorphic (a variable may take any rank), and the axiom derivation did not reach it"
    return ("z3 found no proof over symbolic dims in time: sums over products reassociated or exchanged (a sum "
            "inside a sum's terms, as in matmul associativity; sums are uninterpreted beyond linearity), or a "
            "reshape under the guard (row-major index maps over symbolic dims are not modelled)")


def prove_symbolic(rule: Rule, guarded: bool = False, budget: Budget = DEFAULT_BUDGET) -> str | None:
    """How the rule was proved for every shape (strictly, or under the guard), or None when the
    prover cannot show it (unsupported, unbounded rank, or z3 finds no proof within `budget` a
    rank assignment: sums over products reassociated, as in matmul associativity, need the
    axioms' derivation, not z3)."""
    return prove_symbolic_outcome(rule, guarded, budget)[0]


def prove_symbolic_outcome(rule: Rule, guarded: bool = False, budget: Budget = DEFAULT_BUDGET) -> tuple[str | None, bool]:
    """`prove_symbolic`, and whether a z3 check hit its wall-clock cap (then a None depends on
    machine load: a caller must not cache it)."""
    try:
        return _prove(rule, guarded, budget), False
    except WallClockCapped:
        return None, True


def _prove(rule: Rule, guarded: bool, budget: Budget) -> str | None:
    if why_not(rule) is not None:
        return None
    # under the guard, the right side's typing may need unequal dims (a merge_gconv's even group
    # count) that the enumeration's equal dims miss: the left side's ranks are a superset then
    wide = _rank_assignments(rule, guarded) or (_rank_assignments(rule, False) if guarded else [])
    if guarded and ops_used_by(rule) & DISTRIBUTION:  # the guard may need unequal dims (a size-1 broadcast axis)
        wide += [c for c in _rank_assignments(rule, False) if c not in wide]
    tail, middle = tail_bound(rule), device_bound(rule, guarded)
    if tail is not None:  # higher ranks collapse onto rank tail + 1 (see `tail_bound`)
        wide = [c for c in wide if max(c.values(), default=0) <= tail + 1]
    elif middle is not None:  # higher ranks collapse onto rank `middle` (see `device_bound`)
        wide = [c for c in wide if max(c.values(), default=0) <= middle]
    top = MAX_RANK if middle is None else middle  # a bound from `device_bound` covers the ranks above it
    if not wide or len(wide) >= 256 or any(r > top for c in wide for r in c.values()):
        return None  # no rank types it, too many, or the rank is unbounded (rank-polymorphic rules)
    used = ops_used_by(rule)
    if used & WINDOW_OPS:
        budget = max(budget, POOL_BUDGET if used & POOL_OPS else WINDOW_BUDGET, key=lambda b: b.rlimit)
    try:
        for ranks in reversed(wide):  # higher ranks first: where a rule fails (a guard on rank 4), it fails fast
            holds, grouped = _holds(rule, ranks, guarded, budget)
            if not holds and not (grouped and _holds_factored(rule, ranks, guarded, budget)):
                return None
    except Unsupported:
        return None
    except (z3.Z3Exception, KeyError, TypeError, ValueError, IndexError):  # a shape the table misreads: no proof
        return None
    assignments = sorted({tuple(sorted(c.items())) for c in wide})
    every = (f"rank {tail + 1} stands for every higher rank: axes from {tail} on are only passed through"
             if tail is not None else
             f"rank {middle} stands for every higher rank: axes between the device axis and the last "
             f"{middle - 2} are only passed through" if middle is not None else "every rank that types the rule")
    return (f"z3 over symbolic dims and indices, {'under the guard, ' if guarded else ''}"
            f"{len(assignments)} rank assignment(s) ({every})")


def _holds_factored(rule: Rule, ranks: Mapping[str, int], guarded: bool, budget: Budget) -> bool:
    """Again with the group arithmetic as products; with a merge_gconv of count k, once per
    residue of the output channel's group mod k (the block its kernel lands in)."""
    counts = {t.attr.get("count") for p in rule.lhs + rule.rhs for t in subterms(p) if t.op == "merge_gconv"}
    count = counts.pop() if len(counts) == 1 else 0
    if not (type(count) is int and 1 < count <= 4):
        return _holds(rule, ranks, guarded, budget, factor=True)[0]
    return all(_holds(rule, ranks, guarded, budget, factor=True, slots=(count, case))[0] for case in range(count))


def tail_bound(rule: Rule) -> int | None:
    """For a rule of elementwise ops and broadcasts only: the first axis B that no broadcast maps an
    input axis to and no condition reads (None for other rules). Axes from B on are then only
    passed through (elementwise) or replicated (broadcast), so the same index reads the same
    elements on both sides for every value of those axes: flattening them into one axis maps a
    counterexample at any rank above B + 1 to one at rank B + 1, and a proof at ranks up to B + 1
    holds at every rank (B = 0 for elementwise rules: one symbolic index stands for any rank)."""
    if not ops_used_by(rule) <= ELEMENTWISE | {"broadcast"}:
        return None
    bound = 0
    for p in rule.lhs + rule.rhs:
        for t in subterms(p):
            if t.op == "broadcast":
                dims = t.attr["dims"]
                if not all(type(d) is int for d in dims) or isinstance(t.attr["shape"], (tuple, list)):
                    return None  # a literal shape fixes the rank anyway; symbolic dims lists are not modelled
                bound = max(bound, max(dims, default=-1) + 1)
    for c in rule.conditions:
        for t in _condition_terms(c):
            if t.op == "rank":
                return None
            if t.op == "dim":
                index = t.args[1]
                if not isinstance(index, Term) or index.op != "const":
                    return None
                bound = max(bound, index.attr["value"] + 1)
    return bound


FIXED = -1  # `_front` of a value whose rank is a literal (a broadcast to a shape of listed dims)


def device_bound(rule: Rule, guarded: bool = False) -> int | None:
    """For a rule with distribution ops made of elementwise ops, matmul, broadcasts with literal dims
    and distribution ops with literal dims counted from the end (T: the deepest such dim, 2 for a
    matmul): a rank that stands for every higher rank (None for other rules). Each value has front
    axes (its device axes; a broadcast's output up to its last mapped axis) and its last T axes;
    every op passes the axes between them through unchanged (elementwise ops and matmul's batch
    axes read the same index, partition and combine act at a dim counted from the end, replicate
    and reduce at the front, a broadcast repeats them), so flattening them into one axis maps a
    counterexample at any rank onto one at rank front + 1 + T or less, and a proof there holds at
    every rank. Conditions may only equate device counts (dim 0 of a variable with a device axis)
    or bound a rank by at most 1 + T (both survive the flattening). Under the guard a side of a
    literal rank matches the other at any front: above the bound the ranks differ and the guard
    never holds."""
    used = ops_used_by(rule)
    modelled = (ELEMENTWISE | UNARY_ATOMS | set(BINARY_SELECTS) | {"ewdiv", "select_n", "stop_gradient", "matmul", "broadcast"}
                | DISTRIBUTION)
    if not used & DISTRIBUTION or not used <= modelled:
        return None
    deepest, names = 1, set()
    for p in rule.lhs + rule.rhs:
        for t in subterms(p):
            if t.op == "matmul":
                deepest = max(deepest, 2)
            if t.op == "broadcast" and not all(type(d) is int for d in t.attr["dims"]):
                return None
            for key in ("dim", "split_dim", "concat_dim"):
                if t.op in DISTRIBUTION and key in t.attr:
                    v = t.attr[key]
                    if type(v) is not int or v >= 0:
                        return None
                    deepest = max(deepest, -v)
            names |= {a.name for a in t.args if isinstance(a, Var)}
    for values in itertools.product((0, 1), repeat=len(names)):  # device axes per variable: one consistent scheme
        depth: dict[str, int] = dict(zip(sorted(names), values))
        sides = [[_front(p, depth) for p in side] for side in (rule.lhs, rule.rhs)]
        if None in sides[0] + sides[1] or any(a != b and not (guarded and FIXED in (a, b)) for a, b in zip(*sides)):
            continue
        if all(_flattening_keeps(c, depth, deepest) for c in rule.conditions):
            bound = max([*depth.values(), 0]) + 1 + deepest
            return bound if bound <= MAX_RANK + 1 else None
    return None


def _front(p: Pattern, depth: dict[str, int]) -> int | None:
    """How many front axes `p` has (never flattened) when each variable has `depth`'s (an
    attribute variable giving a broadcast's shape gets its own entry); None when an op would read a
    value's middle axes specially (then flattening them is not harmless)."""
    if isinstance(p, Var):
        return depth[p.name]
    if p.op == "broadcast":
        shape, need = p.attr["shape"], max(p.attr["dims"], default=-1) + 1
        if isinstance(shape, AttrVar) and depth.setdefault(f"shape {shape.name}", need) == need:
            return need
        if isinstance(shape, (tuple, list)):  # a literal rank: nothing to flatten
            return FIXED if need <= len(shape) and _front(p.args[0], depth) is not None else None
        got = _front(shape.pattern, depth) if isinstance(shape, ShapeOf) else None
        return got if got is not None and got >= need and _front(p.args[0], depth) is not None else None
    ds = [_front(a, depth) for a in p.args]
    if None in ds or not ds:
        return None
    if FIXED in ds:  # its rank is a literal, and so are its operands' where it is typed
        return FIXED
    first = ds[0]
    assert first is not None
    if p.op in ("partition", "replicate"):
        return first + 1
    if p.op in DISTRIBUTION:  # combine and reduce leave the axis; the collectives keep it
        return None if first < 1 else first - (p.op in ("combine", "reduce"))
    return first if all(d == first for d in ds) else None


def _flattening_keeps(c: Any, depth: Mapping[str, int], deepest: int) -> bool:
    """A condition that still holds after flattening middle axes: equal device counts (dim 0 of a
    variable with a device axis) or constants, a lower bound on a rank of at most 1 + deepest, or
    any upper bound on a rank."""
    def device_count(x: Any) -> bool:
        return isinstance(x, Term) and (x.op == "const" or (
            x.op == "dim" and isinstance(x.args[0], Var) and depth[x.args[0].name] >= 1
            and isinstance(x.args[1], Term) and x.args[1].op == "const" and x.args[1].attr["value"] == 0))

    if not isinstance(c, Term):
        return False
    if c.op == "=" and all(device_count(a) for a in c.args):
        return True
    if c.op == "<=" and _is_rank_of_var(c.args[0]) and isinstance(c.args[1], Term) and c.args[1].op == "const":
        return True  # an upper bound on a rank: flattening only lowers ranks, so it still holds
    bound, rank = c.args if c.op == "<=" else sorted(c.args, key=lambda a: isinstance(a, Term) and a.op == "rank")
    return (c.op in ("<=", "=") and isinstance(bound, Term) and bound.op == "const" and isinstance(rank, Term)
            and rank.op == "rank" and bound.attr["value"] <= 1 + deepest)


def _is_rank_of_var(x: Any) -> bool:
    return isinstance(x, Term) and x.op == "rank" and isinstance(x.args[0], Var)


def _unify(rule: Rule, ranks: Mapping[str, int], guarded: bool, dims: dict[str, Dims],
           funcs: dict[str, z3.FuncDeclRef], sum_fn: z3.FuncDeclRef) -> None:
    """Dims that the hypotheses equate (the conditions, the left side's typing, and under the guard
    the right side's) become one symbol or literal, in `dims`: x = y, or x * c = y * c for a dim c
    >= 1. Only shapes that violate a hypothesis are lost, and the proof is over those that satisfy
    them; one symbol per dim lets two partitions of one dim share their piece and sums match."""
    for _ in range(2):
        scratch = _Builder(ranks, dict(dims), funcs, sum_fn, flat_leaves="reshape" in ops_used_by(rule))
        facts: list[z3.BoolRef] = []
        try:
            facts += [_condition(c, dims) for c in rule.conditions]
            for p in rule.lhs:
                scratch.value(p, facts)
            if guarded:
                scratch.guarded_mode, scratch.typed_is_assumed = True, False
                rhs: list[z3.BoolRef] = []
                for p in rule.rhs:
                    scratch.value(p, rhs)
                facts += rhs
        except (_IllTyped, Unsupported, _NeedsFactors, KeyError, IndexError, TypeError):
            pass
        plain = {d.get_id() for ds in dims.values() for d in ds if z3.is_const(d) and not z3.is_int_value(d)}
        parent = _union(facts, plain)
        if not parent:
            return
        pairs = [(d, _find(parent, d)) for ds in dims.values() for d in ds if d.get_id() in parent]
        for v in dims:
            dims[v] = tuple(z3.substitute(d, *pairs) if pairs else d for d in dims[v])


def _find(parent: Mapping[int, z3.ArithRef], d: z3.ArithRef) -> z3.ArithRef:
    while d.get_id() in parent:
        d = parent[d.get_id()]
    return d


def _union(facts: Sequence[z3.BoolRef], plain: set[int]) -> dict[int, z3.ArithRef]:
    """Union-find over the dims that `facts` equate (x = y, x * c = y * c for a dim c): each plain dim
    symbol points towards its class's representative (a literal where the class has one)."""
    parent: dict[int, z3.ArithRef] = {}
    for f in facts:
        if not (z3.is_eq(f) and f.arg(0).sort() == z3.IntSort()):
            continue
        a, b = f.arg(0), f.arg(1)
        if z3.is_mul(a) and z3.is_mul(b) and a.num_args() == b.num_args() == 2 and a.arg(1).eq(b.arg(1)) \
                and a.arg(1).get_id() in plain:
            a, b = a.arg(0), b.arg(0)
        if not all(x.get_id() in plain or z3.is_int_value(x) for x in (a, b)):
            continue
        a, b = _find(parent, a), _find(parent, b)
        if a.eq(b):
            continue
        if z3.is_int_value(a) or (not z3.is_int_value(b) and str(b) < str(a)):
            a, b = b, a
        if a.get_id() in plain:
            parent[a.get_id()] = b
    return parent


def _goal_points(dims: Dims) -> list[dict[int, z3.ArithRef]]:
    """Values for the output axes of literal size (a device axis: at most 8): the goal is shown at
    each, so a partition's device index is a literal and its reads stay linear."""
    points: list[dict[int, z3.ArithRef]] = [{}]
    for k, d in enumerate(dims):
        size = z3.simplify(d)
        if z3.is_int_value(size) and 1 <= size.as_long() <= 8:
            points = [p | {k: z3.IntVal(v)} for p in points for v in range(size.as_long())]
    return points


def _condition_terms(c: Any) -> list[Term]:
    if isinstance(c, Var):
        return []
    return [c] + [t for a in c.args for t in _condition_terms(a)]


def _holds(rule: Rule, ranks: Mapping[str, int], guarded: bool, budget: Budget,
           factor: bool = False, slots: tuple[int, int] = (0, 0)) -> tuple[bool, bool]:
    """Whether the rule holds at these ranks, and whether a conv had channel groups it could not
    rule out (then `factor` tries again with the group arithmetic as products, `_parametrize`)."""
    try:
        return _holds_at(rule, ranks, guarded, budget, factor, slots)
    except _NeedsFactors:
        if factor:
            raise Unsupported("group arithmetic that does not factor") from None
        return False, True


def _holds_at(rule: Rule, ranks: Mapping[str, int], guarded: bool, budget: Budget, factor: bool,
              slots: tuple[int, int]) -> tuple[bool, bool]:
    dims = {v: tuple(z3.Int(f"{v}_{k}") for k in range(r)) for v, r in ranks.items()}
    funcs = {v: z3.Function(f"T_{v}", *([z3.IntSort()] * r), z3.RealSort()) for v, r in ranks.items()}
    sum_fn = z3.Function("SUM", z3.ArraySort(z3.IntSort(), z3.RealSort()), z3.RealSort())
    distributed = bool(ops_used_by(rule) & DISTRIBUTION)
    # a reshape on the left side is read through the flat index too (a product batched over merged dims)
    flat = "reshape" in ops_used_by(rule) and (distributed or any("reshape" in ops_used(p) for p in rule.lhs))
    if distributed or flat:
        _unify(rule, ranks, guarded, dims, funcs, sum_fn)
    factors = _parametrize(rule, dims, guarded) if factor else []
    builder = _Builder(ranks, dims, funcs, sum_fn, factors=factors, slots=slots, flat_leaves=flat)
    conditions = [_condition(c, dims) for c in rule.conditions]
    builder.assumed = [d >= 1 for ds in dims.values() for d in ds] + [f >= 1 for f in factors] + conditions
    lhs_typed: list[z3.BoolRef] = []
    try:
        lhs = [builder.value(p, lhs_typed) for p in rule.lhs]
    except _IllTyped:
        return True, False  # no left side of these ranks is well-typed: nothing to show
    builder.split_dims = tuple(v.dims for v in lhs) if rule.is_multi else ()
    builder.guarded_mode = guarded
    builder.assumed = builder.assumed + lhs_typed
    builder.typed_is_assumed = False  # the right side's typing is what the strict question must show
    rhs_typed: list[z3.BoolRef] = []
    try:
        rhs = [builder.value(p, rhs_typed) for p in rule.rhs]
    except _IllTyped:
        rhs = None
    facts = [d >= 1 for ds in dims.values() for d in ds] + [f >= 1 for f in factors] + lhs_typed
    facts += conditions
    if rhs is None or any(len(a.dims) != len(b.dims) for a, b in zip(lhs, rhs)):
        if guarded:
            return True, False  # the guard never holds at these ranks
        solver = z3.Solver()
        solver.add(*facts)
        return check(solver, budget) == z3.unsat, False  # fine only if no left side of these ranks is well-typed
    same_shape = [d == e for a, b in zip(lhs, rhs) for d, e in zip(a.dims, b.dims)]
    solver = z3.Solver()
    # channel groups make the index arithmetic non-linear: z3 proves those quickly or not at all
    if builder.grouped:
        budget = min(budget, GROUPED_BUDGET, key=lambda b: b.rlimit)
    solver.add(*facts)
    if guarded:
        solver.add(*rhs_typed, *same_shape)
    goals = []
    for n, (a, b) in enumerate(zip(lhs, rhs)):
        idx = [z3.Int(f"i{n}_{k}") for k in range(len(a.dims))]
        solver.add(*[z3.And(i >= 0, i < d) for i, d in zip(idx, a.dims)])
        for point in _goal_points(a.dims) if distributed else [{}]:
            at = [point.get(k, i) for k, i in enumerate(idx)]
            goals.append(a.elem(at) == b.elem(at))
    goal = z3.And(*goals) if guarded else z3.And(*rhs_typed, *same_shape, *goals)
    zero_sums = [f(z3.Lambda([z3.Int(f"z{m}") for m in range(arity)], z3.RealVal(0))) == 0
                 for arity, f in builder.sum_fns.items()]  # a sum of zeros is zero
    solver.add(*builder.defs, *zero_sums, z3.Not(goal))
    return check(solver, budget) == z3.unsat, builder.grouped


__all__ = ["prove_symbolic", "prove_symbolic_outcome", "why_not", "resists", "SUPPORTED", "Unsupported"]

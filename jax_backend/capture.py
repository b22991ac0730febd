"""JAX function → `Program`: IR graphs for what eqsat understands, verbatim equations for the rest.

A jaxpr is walked once. Equations whose primitive has a handler in `CAPTURE_RULES` (and whose values
all have an IR dtype, `eqsat.ops.DTYPES`: float32, bfloat16, float16, integers, bool, with positive
dimensions) become IR instructions, each value keeping its dtype; `jit` calls are inlined; every
other equation (custom_jvp/vjp calls other than relu, control flow, RNG, ...) is kept as an
`OpaqueStep` and replayed exactly as it was, so gradients and effects of those parts do not change.
Integer and boolean arithmetic becomes the IR's mask ops (iadd, lt, select_n, ...), never the float
ops, so no float rule rewrites it.

Instructions are grouped into as few IR graphs as possible: an instruction's *level* is the number
of opaque equations on its longest input path, and all instructions of one level form one graph
(`GraphStep`). Running levels in order (opaque equations of level L, then graph L) respects every
dependency, so unrelated supported work on both sides of an opaque call still lands in one graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import jax
import jax.extend.core as jcore
import numpy as np

from eqsat import ops
from eqsat.errors import EqsatError
from eqsat.ir import Graph, GraphBuilder, Tensor
from eqsat.ops import Padding, Shape
from eqsat.regions import levels

__all__ = ["Program", "GraphStep", "OpaqueStep", "LoopStep", "CaptureError", "capture_jaxpr", "capture", "replay",
           "graph_leaf_name", "CAPTURE_RULES"]

CAPTURED_DTYPE = np.dtype(np.float32)  # the dtype of values the IR makes where JAX gives none (constants)


class CaptureError(EqsatError):
    """A function that cannot be traced into a jaxpr with the given arguments."""


@dataclass(frozen=True)
class GraphStep:
    """One IR graph: its leaves read value ids `inputs` (leaf i is named `graph_leaf_name(inputs[i])`)."""

    graph: Graph
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    # (value id, node, output index) for every value the graph's instructions make, interior ones
    # included: where a plan's layout of a value is held in the traced step (`Program.where`)
    sources: tuple[tuple[int, int, int], ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, eq=False)
class OpaqueStep:
    """One jaxpr equation replayed verbatim."""

    eqn: Any  # jax.extend.core.JaxprEqn
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    why: str = ""  # why it was not captured

    @property
    def name(self) -> str:
        return str(self.eqn.primitive)


@dataclass(frozen=True, eq=False)
class LoopStep:
    """A `lax.scan` equation (`fori_loop` with a static trip count traces to one) whose body is
    captured: its own steps over value ids `body_inputs` (the scan's consts, carry, then one slice
    of each scanned input) returning `body_outputs` (carry, then the stacked outputs' slices).
    Replayed as a `lax.scan` with the same parameters, the body run by the same graph runner, so
    the body's graphs are optimized like any other and the loop is kept."""

    eqn: Any  # the scan equation (its params: length, reverse, unroll, num_consts, num_carry)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    body_inputs: tuple[int, ...]
    body: tuple[Step, ...]
    body_outputs: tuple[int, ...]

    @property
    def name(self) -> str:
        return str(self.eqn.primitive)


Step = GraphStep | OpaqueStep | LoopStep
_S = TypeVar("_S", GraphStep, OpaqueStep)


def _steps_of(steps: Sequence[Step], kind: type[_S]) -> list[_S]:
    """The steps of one kind, loop bodies' included (depth first, in order)."""
    out: list[_S] = []
    for s in steps:
        if isinstance(s, kind):
            out.append(s)
        elif isinstance(s, LoopStep):
            out += _steps_of(s.body, kind)
    return out


def _graphs_in(steps: Sequence[Step]) -> list[GraphStep]:
    """The graph steps, loop bodies' included: what the optimizer sees."""
    return _steps_of(steps, GraphStep)


def _opaque_in(steps: Sequence[Step]) -> list[OpaqueStep]:
    return _steps_of(steps, OpaqueStep)


def _with_graphs(steps: Sequence[Step], graphs: Iterator[Graph]) -> tuple[Step, ...]:
    out: list[Step] = []
    for s in steps:
        if isinstance(s, GraphStep):
            out.append(GraphStep(next(graphs), s.inputs, s.outputs))
        elif isinstance(s, LoopStep):
            out.append(LoopStep(s.eqn, s.inputs, s.outputs, s.body_inputs, _with_graphs(s.body, graphs),
                                s.body_outputs))
        else:
            out.append(s)
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Program:
    """A captured function over flat arguments: value ids 0..n_inputs-1 are the arguments."""

    n_inputs: int
    consts: Mapping[int, Any]  # value id → constant array (closed-over consts and literals)
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    avals: Mapping[int, tuple[Shape, Any]] = field(repr=False)  # value id → (shape, dtype)
    effects: tuple[str, ...] = ()  # the jaxpr's effects (callbacks, debug prints): more than computing
    # value id -> (the inlined call equations it is inside, outermost first, then its jaxpr variable):
    # where the traced function computes it (a loop body's: behind its scan equation)
    where: Mapping[int, tuple[Any, ...]] = field(default_factory=dict, repr=False)

    @property
    def graphs(self) -> list[GraphStep]:
        """Every IR graph, those in loop bodies included (value ids are unique across bodies)."""
        return _graphs_in(self.steps)

    @property
    def opaque(self) -> list[OpaqueStep]:
        """Every equation replayed verbatim, those in loop bodies included."""
        return _opaque_in(self.steps)

    @property
    def loops(self) -> list[LoopStep]:
        return [s for s in self.steps if isinstance(s, LoopStep)]

    def with_graphs(self, graphs: Sequence[Graph]) -> Program:
        """The same program with each graph of `graphs` (in `graphs`' order) replaced (same leaves
        and outputs, in order)."""
        steps = _with_graphs(self.steps, iter(graphs))
        return Program(self.n_inputs, self.consts, steps, self.outputs, self.avals, self.effects, self.where)


def graph_leaf_name(value_id: int) -> str:
    return f"v{value_id}"


# --- the walk -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Instr:
    op: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


class _Capturer:
    """Mutable state of one capture (local to `capture_jaxpr`)."""

    def __init__(self) -> None:
        self.avals: dict[int, tuple[Shape, Any]] = {}
        self.consts: dict[int, Any] = {}
        self.items: list[_Instr | OpaqueStep | LoopStep] = []
        self.reshape_sources: dict[int, int] = {}  # output of a captured reshape -> its input
        self.in_relu = False  # walking jax.nn.relu's custom_jvp body, where max(x, 0) is relu
        self.calls: tuple[Any, ...] = ()  # the inlined call equations being walked, outermost first
        self.where: dict[int, tuple[Any, ...]] = {}  # value id -> (*calls, jaxpr variable): `Program.where`

    def new(self, shape: Shape, dtype: Any) -> int:
        vid = len(self.avals)
        self.avals[vid] = (tuple(int(d) for d in shape), _dtype(dtype))
        return vid

    def shape(self, vid: int) -> Shape:
        return self.avals[vid][0]

    def dtype(self, vid: int) -> str:
        """The value's IR dtype name (`eqsat.ops.DTYPES`); only values that have one reach here."""
        return ops.dtype_name(self.avals[vid][1]) or ops.DEFAULT_DTYPE

    def kind(self, vid: int) -> str:
        return ops.dtype_kind(self.dtype(vid))

    def const_value(self, vid: int) -> np.ndarray | None:
        value = self.consts.get(vid)
        if value is None or isinstance(value, jax.core.Tracer):
            return None
        return np.asarray(value)

    def emit(self, op: str, inputs: Sequence[int], **attrs: Any) -> tuple[int, ...]:
        """Append one IR instruction; shapes are inferred (and checked) by the op registry."""
        spec = ops.op_spec(op)
        norm = spec.normalize_attrs(attrs)
        shapes = ops.infer_shapes(op, [self.shape(i) for i in inputs], norm)
        dtypes = ops.infer_dtypes(op, [self.dtype(i) for i in inputs], norm, len(shapes))
        outs = tuple(self.new(s, ops.numpy_dtype(d)) for s, d in zip(shapes, dtypes))
        frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in norm.items()))
        self.items.append(_Instr(op, frozen, tuple(inputs), outs))
        return outs

    def emit1(self, op: str, inputs: Sequence[int], **attrs: Any) -> int:
        return self.emit(op, inputs, **attrs)[0]

    def broadcast_to(self, vid: int, shape: Shape) -> int:
        """lax's implicit broadcasting (scalars, size-1 axes of equal rank) made explicit."""
        have = self.shape(vid)
        if have == shape:
            return vid
        dims = tuple(range(len(shape) - len(have), len(shape))) if have else ()
        return self.broadcast(vid, shape, dims)

    def broadcast(self, vid: int, shape: Shape, dims: tuple[int, ...]) -> int:
        """A broadcast in canonical form: size-1 input axes that get expanded are dropped first, so
        `mean[None, :, None, None]` broadcast to NCHW reads as `broadcast(mean, dims=[1])`, the form
        the folding rules match (a reshape that only added those axes is looked through)."""
        have = self.shape(vid)
        keep = [i for i, d in enumerate(dims) if have[i] == shape[d]]
        if keep and len(keep) < len(have):  # (a scalar-like input stays as it is)
            squeezed = tuple(have[i] for i in keep)
            source = self.reshape_sources.get(vid)
            vid = source if source is not None and self.shape(source) == squeezed else \
                self.emit1("reshape", [vid], shape=squeezed)
            dims = tuple(dims[i] for i in keep)
        if self.shape(vid) == shape and dims == tuple(range(len(shape))):
            return vid
        return self.emit1("broadcast", [vid], shape=shape, dims=dims)

    # --- walking ----------------------------------------------------------------------------

    def read(self, env: dict[Any, int], atom: Any) -> int:
        if isinstance(atom, jcore.Literal):
            aval: Any = atom.aval  # a literal's abstract value is a ShapedArray (typed as its base class)
            dtype = aval.dtype
            vid = self.new(np.shape(atom.val), dtype)
            self.consts[vid] = np.asarray(atom.val, dtype=dtype)
            return vid
        return env[atom]

    def walk(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[int]) -> list[int]:
        env: dict[Any, int] = {}
        for var, value in zip(jaxpr.constvars, consts):
            vid = self.new(var.aval.shape, var.aval.dtype)
            self.consts[vid] = value
            env[var] = vid
        for var, vid in zip(jaxpr.invars, args):
            env[var] = vid
        for eqn in jaxpr.eqns:
            ins = [self.read(env, a) for a in eqn.invars]
            outs, why = self.capture_eqn(eqn, ins)
            if outs is None:
                outs = [self.new(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
                self.items.append(OpaqueStep(eqn, tuple(ins), tuple(outs), why))
            for var, vid in zip(eqn.outvars, outs):
                env[var] = vid
                known = self.where.get(vid)
                if isinstance(var, jcore.Var) and (known is None or len(known) > len(self.calls) + 1):
                    self.where[vid] = (*self.calls, var)  # the outermost variable: a call's output outside it
        return [self.read(env, a) for a in jaxpr.outvars]

    def capture_eqn(self, eqn: Any, ins: list[int]) -> tuple[list[int] | None, str]:
        """The equation's output ids, or None and why it stays opaque."""
        name = str(eqn.primitive)
        if name in _CALLS:
            closed = eqn.params["jaxpr"]
            self.calls = (*self.calls, eqn)
            try:
                return self.walk(closed.jaxpr, closed.consts, ins), ""
            finally:
                self.calls = self.calls[:-1]
        if name == "scan":
            return self.capture_scan(eqn, ins)
        rule = CAPTURE_RULES.get(name)
        if rule is None:
            return None, _NOT_CAPTURED.get(name, "no IR op for this primitive")
        why = _uncaptureable(eqn)
        if why:
            return None, why
        mark = len(self.items)
        try:
            outs = rule(self, eqn, ins)
            why = "" if outs is not None else "parameters the IR op cannot express"
        except EqsatError as exc:  # a shape the IR cannot express: leave the equation as it was
            outs, why = None, str(exc)
        if outs is None:
            del self.items[mark:]
        return outs, why


    def capture_scan(self, eqn: Any, ins: list[int]) -> tuple[list[int] | None, str]:
        """A scan whose body captures at least one graph becomes a `LoopStep`; the body's values
        get ids in this capture's id space (one namespace, one table of constants)."""
        closed = eqn.params["jaxpr"]
        try:
            scan_counts(eqn.params, len(ins))
        except CaptureError as exc:
            return None, f"{exc} (replayed as JAX traces it)"
        body = _Capturer()
        body.avals, body.consts = self.avals, self.consts  # shared: ids stay unique
        args = [body.new(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
        mark = len(self.avals)
        outs = body.walk(closed.jaxpr, closed.consts, args)
        steps = _build_steps(body, outs)
        if not _graphs_in(steps):
            for vid in range(mark, len(self.avals)):  # forget the body's values (ids stay dense)
                self.avals.pop(vid, None)
                self.consts.pop(vid, None)
            return None, "control flow: nothing in its body is captured (replayed as JAX traces it)"
        # a body value is held where the body computes it: inside the scan equation (`constrained_step` opens it)
        self.where.update({vid: (*self.calls, eqn, *path) for vid, path in body.where.items()})
        results = [self.new(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
        self.items.append(LoopStep(eqn, tuple(ins), tuple(results), tuple(args), steps, tuple(outs)))
        return results, ""


def scan_counts(params: Mapping[str, Any], n_inputs: int) -> tuple[int, int]:
    """(consts, carry) counts of a scan equation with `n_inputs` operands: `num_consts` /
    `num_carry` in older JAX, the flat sizes of `ft_in`'s three groups in newer ones."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    try:
        consts, carry, xs = (list(g) for g in params["ft_in"].update(list(range(n_inputs))).unpack())
    except Exception as exc:  # noqa: BLE001 - a JAX whose scan this code does not know: stay opaque
        raise CaptureError(f"scan parameters not understood ({type(exc).__name__}: {exc})") from None
    if consts + carry + xs != list(range(n_inputs)):
        raise CaptureError("scan parameters not understood (operands out of order)")
    return len(consts), len(carry)


def _dtype(dtype: Any) -> Any:
    """A numpy dtype, or JAX's own dtype object where numpy has none (PRNG key types)."""
    return dtype if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else np.dtype(dtype)


def _uncaptureable(eqn: Any) -> str:
    """Why the equation's values cannot be IR values ("" when they can)."""
    for atom in [*eqn.invars, *eqn.outvars]:
        aval = atom.aval
        if not hasattr(aval, "dtype") or jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended) or \
                ops.dtype_name(aval.dtype) is None:
            return f"{getattr(aval, 'dtype', 'non-array')} values (the IR has {', '.join(ops.DTYPES)})"
        if any(not isinstance(d, int) or d < 1 for d in aval.shape):
            return "a zero-size or symbolic dimension"
    return ""


_NOT_CAPTURED: Mapping[str, str] = {
    "while": "control flow (its body is replayed as JAX traces it)",
    "cond": "control flow (its body is replayed as JAX traces it)",
    "custom_vjp_call": "a custom gradient rule (replayed to keep it)",
    "cumsum": "no IR op for scans along an axis",
    "sort": "no IR op for sorting",
}
"""Why common primitives without a capture rule stay opaque (others: "no IR op for this primitive")."""


_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})

# --- capture rules: primitive name → handler(capturer, eqn, input ids) → output ids or None -----

CaptureRule = Callable[[_Capturer, Any, list[int]], list[int] | None]


def _out_shape(eqn: Any) -> Shape:
    return tuple(eqn.outvars[0].aval.shape)


def _binary(op: str, integer: str = "", boolean: str = "") -> CaptureRule:
    """The float op `op`, or on integer (boolean) operands the IR's `integer` (`boolean`) op; a
    kind without one stays opaque (integer division, ...)."""
    def rule(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
        shape = _out_shape(eqn)
        chosen = {"float": op, "int": integer, "bool": boolean}[c.kind(ins[0])]
        if not chosen:
            return None
        return [c.emit1(chosen, [c.broadcast_to(i, shape) for i in ins])]

    return rule


def _pow(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """x ** y for a float x (Adam's bias correction `b1 ** count`): an integer exponent is
    converted to x's dtype first (the same power, up to the last bit)."""
    if c.kind(ins[0]) != "float":
        return None
    x, y = ins
    if c.dtype(y) != c.dtype(x):
        y = c.emit1("convert_element_type", [y], dtype=c.dtype(x))
    shape = _out_shape(eqn)
    return [c.emit1("pow", [c.broadcast_to(x, shape), c.broadcast_to(y, shape)])]


def _one_minus_square(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """1 - x * x (tanh's derivative in JAX's gradient of tanh)."""
    dtype = c.avals[ins[0]][1]
    one = c.new((), dtype)
    c.consts[one] = np.asarray(1, dtype=dtype)
    shape = c.shape(ins[0])
    return [c.emit1("ewsub", [c.broadcast_to(one, shape), c.emit1("ewmul", [ins[0], ins[0]])])]


def _select_n(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """lax.select_n with a boolean predicate and two cases (jnp.where, jnp.tril's mask)."""
    if len(ins) != 3 or c.dtype(ins[0]) != "bool":
        return None
    shape = _out_shape(eqn)
    return [c.emit1("select_n", [c.broadcast_to(i, shape) for i in ins])]


def _iota(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    p = eqn.params
    dtype = ops.dtype_name(p["dtype"])
    if p.get("sharding") is not None or dtype is None:
        return None
    return [c.emit1("iota", [], shape=tuple(int(d) for d in p["shape"]), dimension=int(p["dimension"]), dtype=dtype)]


def _convert(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """A conversion to the value's own dtype emits nothing; any other one is the IR's op."""
    dtype = ops.dtype_name(eqn.params["new_dtype"])
    if dtype is None or eqn.params.get("sharding") is not None:
        return None
    return [ins[0] if dtype == c.dtype(ins[0]) else c.emit1("convert_element_type", ins, dtype=dtype)]


def _is_zero(c: _Capturer, vid: int) -> bool:
    value = c.const_value(vid)
    return value is not None and value.size >= 1 and not np.any(value)


def _max(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """ewmax; max(x, 0) is relu only inside jax.nn.relu, whose gradient at 0 is 0 (the relu
    lowering's): a bare `jnp.maximum(x, 0)` splits the gradient at a tie, as ewmax does."""
    shape = _out_shape(eqn)
    for x, other in ((ins[0], ins[1]), (ins[1], ins[0])):
        if c.in_relu and _is_zero(c, other) and c.shape(x) == shape:
            return [c.emit1("relu", [x])]
    return _binary("ewmax", "imax")(c, eqn, ins)


def _unary(op: str) -> CaptureRule:
    return lambda c, eqn, ins: [c.emit1(op, ins)]


def _square(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """x**y for y in 1..4 as products (GELU's tanh form has x**3); other powers stay opaque."""
    y = int(eqn.params.get("y", 2))
    if not 1 <= y <= 4:
        return None
    out = ins[0]
    for _ in range(y - 1):
        out = c.emit1("ewmul", [out, ins[0]])
    return [out]


def _reduce(op: str) -> CaptureRule:
    def rule(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
        axes = tuple(sorted(int(a) for a in eqn.params["axes"]))
        if not axes:
            return [ins[0]]
        return [c.emit1(op, ins, axes=axes)]

    return rule


def _reshape(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """A reshape; one with `dimensions` (vmap of a conv over its weights makes one) reads the input
    in that axis order first: a transpose, then the reshape."""
    dims = eqn.params.get("dimensions")
    vid = ins[0] if dims is None else _transpose_by(c, ins[0], tuple(int(d) for d in dims))
    return [_reshape_to(c, vid, _out_shape(eqn))]


def _reshape_to(c: _Capturer, vid: int, shape: Shape) -> int:
    if c.shape(vid) == tuple(shape):
        return vid
    out = c.emit1("reshape", [vid], shape=tuple(shape))
    c.reshape_sources[out] = vid
    return out


def _as_reshape(c: _Capturer, eqn: Any, ins: list[int]) -> list[int]:
    return [_reshape_to(c, ins[0], _out_shape(eqn))]


def _transpose(c: _Capturer, eqn: Any, ins: list[int]) -> list[int]:
    perm = tuple(int(p) for p in eqn.params["permutation"])
    return [_transpose_by(c, ins[0], perm)]


def _transpose_by(c: _Capturer, vid: int, perm: tuple[int, ...]) -> int:
    return vid if perm == tuple(range(len(perm))) else c.emit1("transpose", [vid], perm=perm)


def _broadcast_in_dim(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    if eqn.params.get("sharding") is not None or len(eqn.invars) != 1:
        return None
    shape, dims = _out_shape(eqn), tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    return [c.broadcast(ins[0], shape, dims)]


def _concatenate(c: _Capturer, eqn: Any, ins: list[int]) -> list[int]:
    return [c.emit1("concat", ins, axis=int(eqn.params["dimension"]))]


def _slice(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    strides = eqn.params.get("strides")
    if strides is not None and any(s != 1 for s in strides):
        return None
    vid, shape = ins[0], c.shape(ins[0])
    for axis, (lo, hi) in enumerate(zip(eqn.params["start_indices"], eqn.params["limit_indices"])):
        if (lo, hi) != (0, shape[axis]):
            vid = c.emit1("slice", [vid], axis=axis, start=int(lo), stop=int(hi))
    return [vid]


def _stack(c: _Capturer, eqn: Any, ins: list[int]) -> list[int]:
    """jnp.stack: each input with a size-1 axis at `axis`, then one concat."""
    axis = int(eqn.params["axis"])
    parts = []
    for i in ins:
        shape = c.shape(i)
        parts.append(_reshape_to(c, i, (*shape[:axis], 1, *shape[axis:])))
    return [parts[0] if len(parts) == 1 else c.emit1("concat", parts, axis=axis)]


def _split(c: _Capturer, eqn: Any, ins: list[int]) -> list[int]:
    sizes = tuple(int(s) for s in eqn.params["sizes"])
    return list(c.emit("split", ins, axis=int(eqn.params["axis"]), sizes=sizes))


def _identity(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    return [ins[0]]


def _dot_general(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """Any dot_general as transposes/reshapes around a 2-D or batched 3-D matmul."""
    if eqn.params.get("out_sharding") is not None:
        return None
    lhs, rhs = _contraction_operands(c, eqn, ins)
    if lhs is None or rhs is None:
        return None
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = c.shape(lhs), c.shape(rhs)
    lc, rc, lb, rb = (tuple(int(d) for d in ds) for ds in (lc, rc, lb, rb))
    lf = tuple(d for d in range(len(ls)) if d not in lc and d not in lb)
    rf = tuple(d for d in range(len(rs)) if d not in rc and d not in rb)
    batch = tuple(ls[d] for d in lb)
    m, k, n = (int(np.prod([ls[d] for d in lf])), int(np.prod([ls[d] for d in lc])),
               int(np.prod([rs[d] for d in rf])))
    a = _transpose_by(c, lhs, lb + lf + lc)
    b = _transpose_by(c, rhs, rb + rc + rf)
    if batch:
        nb = int(np.prod(batch))
        a, b = _reshape_to(c, a, (nb, m, k)), _reshape_to(c, b, (nb, k, n))
    else:
        a, b = _reshape_to(c, a, (m, k)), _reshape_to(c, b, (k, n))
    out = c.emit1("matmul", [a, b], act=0)
    return [_reshape_to(c, out, _out_shape(eqn))]


def _contraction_operands(c: _Capturer, eqn: Any, ins: list[int]) -> tuple[int | None, int | None]:
    """The operands of a float dot / conv in its output dtype: a bfloat16 product accumulated in
    float32 (`preferred_element_type`) is the float32 product of the converted operands (exact:
    a product of two bfloat16 numbers is a float32 number). None where the operands are not floats."""
    out = ops.dtype_name(eqn.outvars[0].aval.dtype)
    if out is None or ops.dtype_kind(out) != "float" or any(c.kind(i) != "float" for i in ins):
        return None, None
    lhs, rhs = (i if c.dtype(i) == out else c.emit1("convert_element_type", [i], dtype=out) for i in ins)
    return lhs, rhs


def _conv(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """2-D convolutions in any layout (NCHW / OIHW, Flax's NHWC / HWIO, ...) and with groups
    (`feature_group_count`, depthwise included), padded as TensorFlow's SAME or VALID: the IR's
    NCHW conv2d between transposes (a transpose of a weight folds away at optimization time)."""
    p = eqn.params
    dn = p["dimension_numbers"]
    lhs, rhs, out = (tuple(int(d) for d in spec) for spec in (dn.lhs_spec, dn.rhs_spec, dn.out_spec))
    if len(lhs) != 4:
        return None
    if any(d != 1 for d in (*p["lhs_dilation"], *p["rhs_dilation"])) or p["batch_group_count"] != 1:
        return None
    xin, win = _contraction_operands(c, eqn, ins)
    if xin is None or win is None:
        return None
    x, w = _transpose_by(c, xin, lhs), _transpose_by(c, win, rhs)
    xs, ws = c.shape(x), c.shape(w)
    if xs[1] != ws[1] * p["feature_group_count"]:
        return None
    sh, sw = (int(s) for s in p["window_strides"])
    pads = tuple(tuple(int(v) for v in pr) for pr in p["padding"])
    for code in Padding:
        want = tuple(ops.window_out_and_pads(xs[2 + i], ws[2 + i], (sh, sw)[i], code)[1:] for i in range(2))
        if want == pads:
            y = c.emit1("conv2d", [x, w], stride_h=sh, stride_w=sw, pad=int(code), act=0)
            return [_transpose_by(c, y, tuple(int(i) for i in np.argsort(out)))]
    return None


_POOL_LAYOUTS: tuple[tuple[tuple[int, int], tuple[int, ...]], ...] = (((2, 3), (0, 1, 2, 3)), ((1, 2), (0, 3, 1, 2)))
"""(spatial axes, permutation to NCHW) of the layouts pooling is captured in: NCHW and NHWC."""


def _pool_attrs(c: _Capturer, eqn: Any, x: int) -> tuple[dict[str, int], tuple[int, ...]] | None:
    """A window over the spatial axes of a 4-D NCHW or NHWC value, or over two axes of a value of
    rank 3 to 6 (a pool under vmap), padded as TensorFlow's SAME or VALID: the pool attributes and
    the permutation that puts the window's axes last (NCHW); None for any other window."""
    p = eqn.params
    shape = c.shape(x)
    window, strides = tuple(int(d) for d in p["window_dimensions"]), tuple(int(d) for d in p["window_strides"])
    if any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"])):
        return None
    pads = tuple(tuple(int(v) for v in pr) for pr in p["padding"])
    layouts = _POOL_LAYOUTS
    if len(shape) != 4:  # under vmap (or without a batch axis): the window's two axes, the rest folded
        pair = _window_pair(window, strides, pads)
        if pair is None or not 3 <= len(shape) <= 6:
            return None
        layouts = ((pair, (*(a for a in range(len(shape)) if a not in pair), *pair)),)
    for spatial, perm in layouts:
        other = [a for a in range(len(shape)) if a not in spatial]
        if any(window[a] != 1 or strides[a] != 1 or pads[a] != (0, 0) for a in other):
            continue
        for code in Padding:
            want = tuple(ops.window_out_and_pads(shape[a], window[a], strides[a], code)[1:] for a in spatial)
            if want == tuple(pads[a] for a in spatial):
                (h, w) = spatial
                return {"kernel_h": window[h], "kernel_w": window[w], "stride_h": strides[h], "stride_w": strides[w],
                        "pad": int(code), "act": 0}, perm
    return None


def _pooled(c: _Capturer, op: str, x: int, found: tuple[dict[str, int], tuple[int, ...]]) -> int:
    """The pool on NCHW: `perm` moves x's two window axes last; a value of another rank than 4 (a
    pool under vmap: a 5-D window) has its other axes folded into N and C, and unfolded after."""
    attrs, perm = found
    moved = _transpose_by(c, x, perm)
    shape = c.shape(moved)
    if len(shape) == 4:
        return _transpose_by(c, c.emit1(op, [moved], **attrs), tuple(int(i) for i in np.argsort(perm)))
    lead = shape[:-2]
    folded = _reshape_to(c, moved, (int(np.prod(lead[:-1], dtype=np.int64)), lead[-1] if lead else 1, *shape[-2:]))
    y = c.emit1(op, [folded], **attrs)
    y = _reshape_to(c, y, (*lead, *c.shape(y)[-2:]))
    return _transpose_by(c, y, tuple(int(i) for i in np.argsort(perm)))


def _window_pair(window: Sequence[int], strides: Sequence[int], pads: Sequence[tuple[int, ...]]) -> tuple[int, int] | None:
    """The two axes a window of any rank slides over (the others: size 1, stride 1, no padding),
    for pooling under vmap; a window over one axis is paired with its neighbour, where it is the
    identity. None where more than two axes are windowed."""
    moving = [a for a in range(len(window)) if (window[a], strides[a], pads[a]) != (1, 1, (0, 0))]
    if len(moving) > 2 or len(window) < 2:
        return None
    if len(moving) == 2:
        return moving[0], moving[1]
    if len(moving) == 1:
        a = moving[0]
        return (a - 1, a) if a > 0 else (a, a + 1)
    return len(window) - 2, len(window) - 1


def _reduce_window_max(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """Max pooling (padding never wins a max)."""
    found = _pool_attrs(c, eqn, ins[0])
    return None if found is None else [_pooled(c, "poolmax", ins[0], found)]


def _reduce_window_sum(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """Sum pooling as the IR's average pool (zero padding counted) times the window size: JAX's
    average pooling is this sum divided by the window size."""
    found = _pool_attrs(c, eqn, ins[0])
    if found is None:
        return None
    pooled = _pooled(c, "poolavg", ins[0], found)
    dtype = c.avals[ins[0]][1]
    size = c.new((), dtype)
    c.consts[size] = np.asarray(found[0]["kernel_h"] * found[0]["kernel_w"], dtype=dtype)
    return [c.emit1("ewmul", [pooled, c.broadcast_to(size, c.shape(pooled))])]


def _custom_jvp(c: _Capturer, eqn: Any, ins: list[int]) -> list[int] | None:
    """Only jax.nn.relu's wrapper is understood (its rule is restored by the relu lowering)."""
    closed = eqn.params["call_jaxpr"]
    inner = _Capturer()
    inner.avals = dict(c.avals)
    inner.consts = dict(c.consts)
    inner.in_relu = True
    outs = inner.walk(closed.jaxpr, closed.consts, ins)
    new_items = inner.items
    if len(new_items) == 1 and isinstance(new_items[0], _Instr) and new_items[0].op == "relu":
        return [c.emit1("relu", [new_items[0].inputs[0]])] if outs == list(new_items[0].outputs) else None
    return None


CAPTURE_RULES: Mapping[str, CaptureRule] = {
    "add": _binary("ewadd", "iadd"), "sub": _binary("ewsub", "isub"), "mul": _binary("ewmul", "imul"),
    "div": _binary("ewdiv"), "max": _max, "min": _binary("ewmin", "imin"), "pow": _pow, "one_minus_square": _one_minus_square,
    "lt": _binary("lt", "lt"), "le": _binary("le", "le"), "gt": _binary("gt", "gt"), "ge": _binary("ge", "ge"),
    "eq": _binary("eq", "eq", "eq"), "ne": _binary("ne", "ne", "ne"),
    "and": _binary("", "and", "and"), "or": _binary("", "or", "or"), "not": lambda c, eqn, ins: (
        None if c.kind(ins[0]) == "float" else [c.emit1("not", ins)]),
    "select_n": _select_n, "iota": _iota, "stop_gradient": _unary("stop_gradient"),
    "tanh": _unary("tanh"), "logistic": _unary("sigmoid"), "exp": _unary("exp"),
    "abs": _unary("abs"), "sin": _unary("sin"), "cos": _unary("cos"), "erf": _unary("erf"), "erfc": _unary("erfc"),
    "log": _unary("log"), "neg": _unary("neg"), "sqrt": _unary("sqrt"), "rsqrt": _unary("rsqrt"),
    "integer_pow": _square, "square": _square,
    "reduce_sum": _reduce("reduce_sum"), "reduce_max": _reduce("reduce_max"),
    "reshape": _reshape, "squeeze": _as_reshape, "expand_dims": _as_reshape, "transpose": _transpose,
    "broadcast_in_dim": _broadcast_in_dim, "concatenate": _concatenate, "stack": _stack, "slice": _slice, "split": _split,
    "convert_element_type": _convert, "copy": _identity, "copy_p": _identity,
    "dot_general": _dot_general, "conv_general_dilated": _conv, "custom_jvp_call": _custom_jvp,
    "reduce_window_max": _reduce_window_max, "reduce_window_sum": _reduce_window_sum,
}
"""Primitive name → how it becomes IR; anything not listed is replayed verbatim."""


# --- from instructions to steps ------------------------------------------------------------------

def _build_steps(c: _Capturer, outputs: Sequence[int]) -> tuple[Step, ...]:
    """The items grouped by level (`eqsat.regions.levels`, the grouping regions use; opaque
    equations are the barriers): per level its opaque steps, then one graph of its instructions."""
    producer = {o: k for k, item in enumerate(c.items) for o in item.outputs}
    opaque = [not isinstance(item, _Instr) for item in c.items]  # opaque equations and loops: barriers
    item_levels = levels(([producer[i] for i in item.inputs if i in producer] for item in c.items), opaque)
    group = list(zip(item_levels, opaque))
    # values some item outside their producer's group reads (with the program's outputs: what a graph exports)
    read_outside = {i for k, item in enumerate(c.items) for i in item.inputs
                    if i in producer and group[producer[i]] != group[k]}
    exported = read_outside | set(outputs)
    steps: list[Step] = []
    for lv in range(max(item_levels, default=-1) + 1):
        steps += [item for item, il in zip(c.items, item_levels) if il == lv and not isinstance(item, _Instr)]
        members = [k for k, il in enumerate(item_levels) if il == lv and isinstance(c.items[k], _Instr)]
        if any(o in exported for k in members for o in c.items[k].outputs):  # (dead instructions: no graph)
            steps.append(_graph_step(c, members, exported))
    return tuple(steps)


def _graph_step(c: _Capturer, members: list[int], exported: set[int]) -> GraphStep:
    """One graph of `members`, returning the values among `exported` they produce."""
    produced = {o for k in members for o in c.items[k].outputs}
    builder = GraphBuilder()
    tensors: dict[int, Tensor] = {}
    inputs: list[int] = []
    for k in members:
        for i in c.items[k].inputs:
            if i not in produced and i not in tensors:
                leaf = "weight" if i in c.consts else "input"
                tensors[i] = builder.apply(leaf, [], {"name": graph_leaf_name(i), "shape": c.shape(i),
                                                      "dtype": c.dtype(i)})[0]
                inputs.append(i)
    for k in members:
        item = c.items[k]
        assert isinstance(item, _Instr)
        outs = builder.apply(item.op, [tensors[i] for i in item.inputs], dict(item.attrs))
        tensors.update(zip(item.outputs, outs))
    returned = [o for o in sorted(produced) if o in exported]
    sources = tuple((o, tensors[o].value.node, tensors[o].value.index) for o in sorted(produced))
    return GraphStep(builder.build([tensors[o] for o in returned]), tuple(inputs), tuple(returned), sources)


def capture_jaxpr(closed: Any) -> Program:
    """A ClosedJaxpr → Program over its flat arguments."""
    c = _Capturer()
    args = [c.new(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    outputs = c.walk(closed.jaxpr, closed.consts, args)
    steps = _build_steps(c, outputs)
    effects = tuple(sorted(str(e) for e in closed.effects))
    return Program(len(args), dict(c.consts), steps, tuple(outputs), dict(c.avals), effects, dict(c.where))


def capture(fun: Callable[..., Any], *args: Any) -> tuple[Program, Any]:
    """Trace `fun` on (abstract or concrete) flat array arguments; returns the program and out tree."""
    try:
        closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
    except EqsatError:
        raise
    except Exception as exc:
        raise CaptureError(f"cannot trace {getattr(fun, '__name__', fun)}: {type(exc).__name__}: {exc}") from exc
    return capture_jaxpr(closed), jax.tree_util.tree_structure(out_shape)


# --- running a program -----------------------------------------------------------------------------

GraphRunner = Callable[[GraphStep, Sequence[Any]], Sequence[Any]]


def bind_eqn(eqn: Any, args: Sequence[Any]) -> list[Any]:
    """Run one jaxpr equation on values (concrete or traced) exactly as jax.core.eval_jaxpr does."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: list[Any] = []
    if isinstance(params, tuple):  # jax < 0.7 returned (subfuns, params)
        subfuns, params = params
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *args, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def replay(program: Program, run_graph: GraphRunner, args: Sequence[Any]) -> list[Any]:
    """Evaluate `program` on flat `args`; `run_graph` evaluates one GraphStep on its input values."""
    env: dict[int, Any] = dict(program.consts)
    env.update(enumerate(args))
    _run_steps(program.steps, env, run_graph, program.consts)
    return [env[o] for o in program.outputs]


def _run_steps(steps: Sequence[Step], env: dict[int, Any], run_graph: GraphRunner, consts: Mapping[int, Any]) -> None:
    for step in steps:
        values = [env[i] for i in step.inputs]
        outs: Sequence[Any]
        if isinstance(step, OpaqueStep):
            outs = bind_eqn(step.eqn, values)
        elif isinstance(step, LoopStep):
            outs = _run_loop(step, values, run_graph, consts)
        else:
            outs = run_graph(step, values)
        env.update(zip(step.outputs, outs))


def _run_loop(step: LoopStep, values: Sequence[Any], run_graph: GraphRunner, consts: Mapping[int, Any]) -> list[Any]:
    """The scan again, as `lax.scan` with the equation's parameters and the body's steps."""
    p = step.eqn.params
    n_consts, n_carry = scan_counts(p, len(values))
    fixed, init, xs = values[:n_consts], list(values[n_consts:n_consts + n_carry]), list(values[n_consts + n_carry:])

    def body(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        env: dict[int, Any] = dict(consts)
        env.update(zip(step.body_inputs, [*fixed, *carry, *x]))
        _run_steps(step.body, env, run_graph, consts)
        outs = [env[o] for o in step.body_outputs]
        return outs[:n_carry], outs[n_carry:]

    length, reverse = int(p["length"]), bool(p["reverse"])
    if length > 0 and not any(isinstance(v, jax.core.Tracer) for v in values):
        # concrete values (the numpy reference runner checking capture, which cannot be traced):
        # the same loop in Python, step by step
        carry, stacked = init, []
        for t in (reversed(range(length)) if reverse else range(length)):
            carry, y = body(carry, [x[t] for x in xs])
            stacked.append(y)
        stacked = stacked[::-1] if reverse else stacked
        return [*carry, *(np.stack([np.asarray(y[k]) for y in stacked]) for k in range(len(stacked[0])))]
    carry, ys = jax.lax.scan(body, init, xs, length=length, reverse=reverse, unroll=p.get("unroll", 1))
    return [*carry, *ys]


def numpy_runner(step: GraphStep, values: Sequence[Any]) -> list[Any]:
    """Reference GraphRunner: the IR's numpy semantics (for checking capture itself)."""
    named = {graph_leaf_name(i): np.asarray(v) for i, v in zip(step.inputs, values)}
    outs = step.graph.evaluate(named)
    return [np.asarray(o, dtype=ops.numpy_dtype(step.graph.dtype(v))) for o, v in zip(outs, step.graph.outputs)]

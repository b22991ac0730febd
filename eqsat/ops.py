"""The operator registry: one `OpSpec` per op, the single source of truth for every stage.

Each entry gives the op's attribute schema, shape inference, reference semantics in numpy, the
flops / bytes it moves, and the facts later stages ask about it (elementwise, fusible, its role in
a parallel plan, what its gradient reads, how it relates to the weights). Encoders, verifiers, cost
models, lowerings and the parallel planner look ops up here, or in tables derived from it
(`ops_where`, `with_role`), instead of branching on op names. Layouts follow TASO/Tensat: tensors
NCHW, conv weights OIHW, activations and paddings as small integers so that Tensat's rule files
read unchanged.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import numpy as np

from eqsat import distribution
from eqsat.errors import ShapeError, UnknownOpError

Shape = tuple[int, ...]
Attrs = Mapping[str, Any]
Role = Literal["enter", "leave", "keep", "none"]
"""A distribution op's effect on a value's leading device axes (`eqsat.distribution`): `enter` puts
its mesh axis in front (partition, replicate), `leave` takes the leading one off (combine, reduce),
`keep` is a collective that leaves them as they are; `none`: no distribution op."""
GradReads = Literal["", "input", "output"]
FusionKind = Literal["leaf", "view", "loop", "copy", "library", "kernel"]
"""What XLA makes of an op (`OpSpec.fusion`, read by `eqsat.xla_cost`): `leaf` and `view` launch
nothing; `loop` ops join the loop fusion of their elementwise neighbours; `copy` ops move bytes (a
concat, a transpose); `library` ops are a dot or conv call of their own; `kernel`: any other op
is its own kernel (pools, reductions)."""
ConvLayout = Literal["NCHW", "NHWC"]
"""A convolution's operand layout (`OpSpec.conv_layout`): NCHW x OIHW, or NHWC x HWIO (XLA:CPU's own)."""
DtypeKind = Literal["float", "int", "bool"]
ResultDtype = Literal["same", "bool", "attr", "select"]
"""How an op's output dtype follows from its operands: `same` (operands of one dtype, the output of
that dtype), `bool` (operands of one dtype, a boolean output: comparisons), `attr` (the `dtype`
attribute: leaves, iota, conversions), `select` (a boolean predicate, then cases of one dtype)."""
WeightDerivation = Literal["weight", "never", "moves", "computes"]


# --- dtypes ---------------------------------------------------------------------------------------

DEFAULT_DTYPE = "float32"
"""A value's dtype where none is written: Graph JSON and Tensat's models are float32."""
FLOAT_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")
INT_DTYPES: tuple[str, ...] = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES: tuple[str, ...] = (*FLOAT_DTYPES, *INT_DTYPES, "bool")
"""The dtypes an IR value may have (numpy names; bfloat16 is ml_dtypes')."""
FLOAT_ONLY: frozenset[DtypeKind] = frozenset({"float"})
NUMERIC: frozenset[DtypeKind] = frozenset({"float", "int"})
ANY_KIND: frozenset[DtypeKind] = frozenset({"float", "int", "bool"})


def dtype_kind(dtype: str) -> DtypeKind:
    """float, int or bool: what an op's `operand_kinds` and the rule policy (`eqsat.rulesets`) test."""
    if dtype in FLOAT_DTYPES:
        return "float"
    if dtype in INT_DTYPES:
        return "int"
    if dtype == "bool":
        return "bool"
    raise ShapeError(f"unknown dtype '{dtype}'; the IR has {', '.join(DTYPES)}")


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of an IR dtype name (bfloat16 through ml_dtypes, which JAX installs)."""
    dtype_kind(dtype)
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def dtype_name(dtype: Any) -> str | None:
    """The IR name of a numpy / JAX dtype, or None where the IR has no such dtype (complex, keys)."""
    try:
        name = str(np.dtype(dtype))
    except TypeError:
        return None
    return name if name in DTYPES else None


class Activation(IntEnum):
    """Fused activation codes, numbered as in Tensat's rule files."""

    NONE = 0
    SIGMOID = 1
    RELU = 2
    TANH = 3

    @property
    def op_name(self) -> str:
        """The unary op computing this activation on its own ("" for NONE)."""
        return "" if self is Activation.NONE else self.name.lower()


class Padding(IntEnum):
    """Padding codes, numbered as in Tensat's rule files."""

    SAME = 0
    VALID = 1


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: its name, what kind of value it holds, and its default (None: required)."""

    name: str
    kind: str  # "int" | "ints" | "str" | "float"
    default: Any = None


@dataclass(frozen=True)
class Collectives:
    """What a distribution op runs on a mesh: its forward collective and its transpose's in the
    backward (None: a local slice, or nothing), each moving the per-device bytes of its input or
    output (`measured_on`: "in" | "out", as `compile().as_text()` shows the collective's buffer)."""

    forward: str | None
    backward: str | None
    measured_on: str


@dataclass(frozen=True)
class OpSpec:
    """Everything the pipeline needs to know about one op."""

    name: str
    attrs: tuple[AttrSpec, ...]
    arity: int | None  # None: variadic (at least one input)
    infer: Callable[[Sequence[Shape], Attrs], tuple[Shape, ...]]
    numpy: Callable[[Sequence[np.ndarray], Attrs], tuple[np.ndarray, ...]]
    flops: Callable[[Sequence[Shape], Sequence[Shape], Attrs], float]
    is_leaf: bool = False
    is_view: bool = False  # moves no data under XLA (slices of concats, reshapes)
    doc: str = ""
    elementwise: bool = False  # inputs and output of one shape, each element computed on its own
    fusible: bool = False  # XLA fuses it into its producer's loop (charged its marginal cost there)
    positive_domain: bool = False  # real-valued only for positive inputs (log, square roots)
    # --- facts of parallel plans (eqsat.parallel) ---
    distribution: Role = "none"  # see `Role`
    collectives: Collectives | None = None  # a distribution op's collectives (eqsat.parallel.cost)
    aliases: bool = False  # a distribution op whose output shares its input's buffer under shard_map
    contraction: bool = False  # sums products (matmul, conv2d): a dot on the device
    grad_reads: GradReads = ""  # the one buffer an elementwise op's derivative reads, as the memory model keeps it
    on_devices: Callable[[Attrs, int], bool] | None = None  # runs on a value with k leading device axes, each
    # device on its piece, for these attributes (None: never on distributed values)
    fusion_kind: FusionKind | None = None  # what XLA makes of it, where `fusion` cannot derive it
    conv_layout: ConvLayout | None = None  # a convolution's operand layout (None: not a convolution)
    # XLA's layout assignment carries its operand's physical layout through it (a concat; elementwise ops
    # always do): an NCHW conv's output, NHWC inside XLA:CPU, stays NHWC past it. Not a slice or split:
    # XLA:CPU slices an NCHW conv's channels in NCHW, each reading fusion transposing them back and forth
    keeps_layout: bool = False
    # XLA's loop fusion takes it in (a concat): its elementwise producers fuse into it and its elementwise
    # consumers join it, so it moves only the bytes of the operands no loop wrote, and it writes the layout its
    # reader wants (XLA:CPU transposes NHWC operands inside the concat's loop at no measurable cost)
    joins_loops: bool = False
    # the ints attribute whose length is the output's rank (a transpose's perm, a reshape's shape): a rule
    # pattern's literal there names the instances it can match, so a rule set can be cut per graph
    # (`eqsat.parallel.rules.applicable`)
    rank_attr: str | None = None

    @property
    def carries_layout(self) -> bool:
        """Whether a value's physical layout passes through the op (`keeps_layout`, or elementwise)."""
        return self.keeps_layout or self.fusion == "loop"

    @property
    def fusion(self) -> FusionKind:
        """What XLA makes of the op: given, else derived from the other facts (see `FusionKind`)."""
        if self.fusion_kind is not None:
            return self.fusion_kind
        if self.is_leaf or self.is_view:
            return "leaf" if self.is_leaf else "view"
        return "loop" if self.fusible else "library" if self.contraction else "kernel"

    @property
    def launches_kernel(self) -> bool:
        """Runs as a kernel of its own when not folded (the roofline charges it a launch): neither a
        leaf nor a view. The kernel counts of `Graph.runtime_kernels` count these."""
        return not (self.is_leaf or self.is_view)

    # --- dtypes (`infer_dtypes`) ---
    operand_kinds: frozenset[DtypeKind] = FLOAT_ONLY  # what its tensor operands may be (select: its cases)
    result_dtype: ResultDtype = "same"  # see `ResultDtype`

    @property
    def is_unary_elementwise(self) -> bool:
        """One input, elementwise: a link of a unary chain (the Pallas backend fuses such chains)."""
        return self.elementwise and self.arity == 1

    @property
    def weight_derivation(self) -> WeightDerivation:
        """How a node of this op relates to the weights (`weight_derived`): a `weight` is one, an
        input leaf `never` is; a distribution op `moves` its input (a moved weight is still the
        weight: its gradient is the weight's gradient); any other op `computes` a value from its
        inputs (derived from weights, foldable, when every input is)."""
        if self.is_leaf:
            return "weight" if self.name == "weight" else "never"
        return "computes" if self.distribution == "none" else "moves"

    def normalize_attrs(self, attrs: Attrs) -> dict[str, Any]:
        """Fill defaults, convert kinds, and reject unknown or missing attributes."""
        known = {a.name for a in self.attrs}
        unknown = set(attrs) - known
        if unknown:
            raise ShapeError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; expected {sorted(known)}")
        out: dict[str, Any] = {}
        for spec in self.attrs:
            value = attrs.get(spec.name, spec.default)
            if value is None:
                raise ShapeError(f"{self.name}: missing attribute '{spec.name}'")
            out[spec.name] = _convert(self.name, spec, value)
        return out


def _convert(op: str, spec: AttrSpec, value: Any) -> Any:
    try:
        if spec.kind == "int":
            return _exact_int(value)
        if spec.kind == "ints":
            if isinstance(value, (str, bytes)):
                raise ValueError
            return tuple(_exact_int(v) for v in value)
        if spec.kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        raise ShapeError(f"{op}: attribute '{spec.name}' must be {spec.kind}, got {value!r}") from None


def _exact_int(value: Any) -> int:
    """An integer written as one (2 or 2.0), never a bool, a fraction, a string or a NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError
    if int(value) != value:
        raise ValueError
    return int(value)


# --- helpers ------------------------------------------------------------------------------------

def numel(shape: Shape) -> int:
    return math.prod(shape)


def _fail(op: str, shapes: Sequence[Shape], why: str) -> ShapeError:
    listed = ", ".join(str(tuple(s)) for s in shapes)
    return ShapeError(f"{op}: {why} (input shapes: {listed})")


def _activate(x: np.ndarray, act: int) -> np.ndarray:
    return ACTIVATIONS[Activation(act)](x)


def _special(name: str, x: np.ndarray) -> np.ndarray:
    import scipy.special  # scipy comes with JAX; only the numpy meaning of erf / erfc needs it

    return np.asarray(getattr(scipy.special, name)(x)).astype(np.asarray(x).dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


ACTIVATIONS: Mapping[Activation, Callable[[np.ndarray], np.ndarray]] = MappingProxyType({
    Activation.NONE: lambda x: x,
    Activation.SIGMOID: _sigmoid,
    Activation.RELU: lambda x: np.maximum(x, 0),
    Activation.TANH: np.tanh,
})


def _check_act(op: str, shapes: Sequence[Shape], act: int) -> None:
    if act not in tuple(Activation):
        raise _fail(op, shapes, f"activation code {act} is not one of 0 none, 1 sigmoid, 2 relu, 3 tanh")


def window_out_and_pads(size: int, k: int, stride: int, pad: int) -> tuple[int, int, int]:
    """Output length and (low, high) padding of a window op, TensorFlow's SAME/VALID rule."""
    if pad == Padding.VALID:
        return (size - k) // stride + 1, 0, 0
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return out, total // 2, total - total // 2


def _windows(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, pad: int, fill: float) -> np.ndarray:
    """(N, C, Ho, Wo, kh, kw) windows of an NCHW array, padded with `fill`."""
    _, _, h, w = x.shape
    _, pt, pb = window_out_and_pads(h, kh, sh, pad)
    _, pl, pr = window_out_and_pads(w, kw, sw, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return win[:, :, ::sh, ::sw]


# --- elementwise ----------------------------------------------------------------------------------

def _same_shape(op: str) -> Callable[[Sequence[Shape], Attrs], tuple[Shape, ...]]:
    def infer(shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
        if any(s != shapes[0] for s in shapes):
            raise _fail(op, shapes, "inputs must have the same shape")
        return (tuple(shapes[0]),)

    return infer


def _pointwise_flops(per_element: float) -> Callable[[Sequence[Shape], Sequence[Shape], Attrs], float]:
    return lambda ins, outs, attrs: per_element * numel(outs[0])


def _unary(name: str, fn: Callable[[np.ndarray], np.ndarray], flops_per: float, doc: str, **facts: Any) -> OpSpec:
    """An elementwise float op: each device runs it on its piece, at any device depth."""
    return OpSpec(name, (), 1, _same_shape(name), lambda xs, a: (fn(xs[0]),), _pointwise_flops(flops_per), doc=doc,
                  elementwise=True, fusible=True, **{"on_devices": _any_depth, **facts})


def _binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], doc: str, **facts: Any) -> OpSpec:
    return OpSpec(name, (), 2, _same_shape(name), lambda xs, a: (fn(xs[0], xs[1]),), _pointwise_flops(1), doc=doc,
                  elementwise=True, fusible=True, **{"on_devices": _any_depth, **facts})


# --- on values with leading device axes (`OpSpec.on_devices`) --------------------------------------

def _any_depth(attrs: Attrs, k: int) -> bool:
    """Acts on trailing dims (elementwise, matmul, conv): each device runs it on its piece."""
    return True


def _keeps_leading(key: str) -> Callable[[Attrs, int], bool]:
    """Its index list (counted from the front) keeps the k device axes in front, in place."""
    return lambda attrs, k: tuple(attrs[key])[:k] == tuple(range(k))


def _keeps_device_dims(attrs: Attrs, k: int) -> bool:
    """A reshape of a value with k leading device axes: its shape keeps k leading dims, which the
    parallel rules that build one (`reshape-partition*`) make the device axes' (the shape is
    `(shape P)` of the left side's partition, or kept by a condition); each device reshapes its
    piece to the rest (`distribution.LOCAL_ATTRS`)."""
    return len(tuple(attrs["shape"])) > k


def _axis_past_devices(attrs: Attrs, k: int) -> bool:
    """A slice or concat along a data axis (counted from the front, past the k device axes)."""
    return int(attrs["axis"]) >= k


def _reduces_trailing(attrs: Attrs, k: int) -> bool:
    """Sums / maxes over no device axis."""
    return min(attrs["axes"], default=k) >= k


def _smul_infer(shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
    if numel(shapes[1]) != 1:
        raise _fail("smul", shapes, "the second input must be a scalar (one element)")
    return (tuple(shapes[0]),)


# --- matmul ---------------------------------------------------------------------------------------

MATMUL_MAX_RANK = 5  # 3-D batched matmuls on a 2-D device mesh (eqsat.distribution) stack to 5-D

def _matmul_infer(shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
    a, b = shapes
    _check_act("matmul", shapes, attrs["act"])
    if len(a) == 2 and len(b) == 2:
        if a[1] != b[0]:
            raise _fail("matmul", shapes, f"inner dimensions differ ({a[1]} vs {b[0]})")
        return ((a[0], b[1]),)
    if len(a) == len(b) and 3 <= len(a) <= MATMUL_MAX_RANK:  # batched; stacks of devices add batch axes
        if a[:-2] != b[:-2]:
            raise _fail("matmul", shapes, f"batch dimensions differ ({a[:-2]} vs {b[:-2]})")
        if a[-1] != b[-2]:
            raise _fail("matmul", shapes, f"inner dimensions differ ({a[-1]} vs {b[-2]})")
        return ((*a[:-1], b[-1]),)
    raise _fail("matmul", shapes, f"needs two 2-D or two 3-D inputs (or two batched of one rank up to {MATMUL_MAX_RANK})")


def _matmul_flops(ins: Sequence[Shape], outs: Sequence[Shape], attrs: Attrs) -> float:
    return 2.0 * numel(outs[0]) * ins[0][-1] + (numel(outs[0]) if attrs["act"] else 0)


# --- conv2d ---------------------------------------------------------------------------------------

CONV_MAX_RANK = 6  # leading batch axes shared by input and weight: a conv per device of a 2-D mesh (eqsat.distribution)


def _conv_infer(shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
    x, w = shapes
    _check_act("conv2d", shapes, attrs["act"])
    if len(x) != len(w) or not 4 <= len(x) <= CONV_MAX_RANK:
        raise _fail("conv2d", shapes, "needs an NCHW input and an OIHW weight (or both with the same leading batch axes)")
    if x[:-4] != w[:-4]:
        raise _fail("conv2d", shapes, f"leading batch axes differ ({x[:-4]} vs {w[:-4]})")
    if attrs["stride_h"] < 1 or attrs["stride_w"] < 1:
        raise _fail("conv2d", shapes, "strides must be positive")
    if attrs["pad"] not in tuple(Padding):
        raise _fail("conv2d", shapes, f"padding code {attrs['pad']} is not 0 SAME or 1 VALID")
    c, o, ci = x[-3], w[-4], w[-3]
    if ci == 0 or c % ci != 0:
        raise _fail("conv2d", shapes, f"input channels {c} are not a multiple of the weight's {ci}")
    groups = c // ci
    if o % groups != 0:
        raise _fail("conv2d", shapes, f"output channels {o} are not divisible by groups {groups}")
    ho, _, _ = window_out_and_pads(x[-2], w[-2], attrs["stride_h"], attrs["pad"])
    wo, _, _ = window_out_and_pads(x[-1], w[-1], attrs["stride_w"], attrs["pad"])
    if ho < 1 or wo < 1:
        raise _fail("conv2d", shapes, "the kernel is larger than the (unpadded) input")
    return ((*x[:-3], o, ho, wo),)


def conv2d_numpy(x: np.ndarray, w: np.ndarray, stride_h: int, stride_w: int, pad: int) -> np.ndarray:
    """Grouped 2-D convolution (cross-correlation, as every framework), groups = C_in / W_in; leading
    batch axes (shared by x and w) run one convolution each."""
    if x.ndim > 4:
        return np.stack([conv2d_numpy(xi, wi, stride_h, stride_w, pad) for xi, wi in zip(x, w)])
    groups = x.shape[1] // w.shape[1]
    win = _windows(x, w.shape[2], w.shape[3], stride_h, stride_w, pad, 0.0)
    n, c, ho, wo, kh, kw = win.shape
    o, cg = w.shape[0], c // groups
    # im2col: one (positions x window) matrix per group, so the product runs in BLAS (a 7-index
    # einsum over the windows is ~40x slower on a GoogLeNet-sized 3x3 conv)
    cols = win.reshape(n, groups, cg, ho, wo, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6).reshape(
        groups, n * ho * wo, cg * kh * kw)
    out = np.matmul(cols, w.reshape(groups, o // groups, cg * kh * kw).transpose(0, 2, 1))
    return out.reshape(groups, n, ho, wo, o // groups).transpose(1, 0, 4, 2, 3).reshape(n, o, ho, wo)


def _conv_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    out = conv2d_numpy(xs[0], xs[1], a["stride_h"], a["stride_w"], a["pad"])
    return (_activate(out, a["act"]),)


def _conv_flops(ins: Sequence[Shape], outs: Sequence[Shape], attrs: Attrs) -> float:
    w = ins[1]
    return 2.0 * numel(outs[0]) * w[-3] * w[-2] * w[-1] + (numel(outs[0]) if attrs["act"] else 0)


NHWC_IN, NHWC_OUT, HWIO_FROM_OIHW = (0, 2, 3, 1), (0, 3, 1, 2), (2, 3, 1, 0)
"""conv2d_nhwc's layouts as transposes: NCHW → NHWC, back, and an OIHW kernel → HWIO (`layout.rules`)."""


def _conv_nhwc_infer(shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
    x, w = shapes
    if len(x) != 4 or len(w) != 4:
        raise _fail("conv2d_nhwc", shapes, "needs an NHWC input and an HWIO weight")
    (out,) = _conv_infer([tuple(x[p] for p in NHWC_OUT), (w[3], w[2], w[0], w[1])], attrs)
    return (tuple(out[p] for p in NHWC_IN),)


def _conv_nhwc_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    x, w = xs
    (out,) = _conv_numpy([x.transpose(NHWC_OUT), w.transpose(3, 2, 0, 1)], a)
    return (out.transpose(NHWC_IN),)


def _conv_nhwc_flops(ins: Sequence[Shape], outs: Sequence[Shape], attrs: Attrs) -> float:
    kh, kw, ci, _ = ins[1]
    return 2.0 * numel(outs[0]) * ci * kh * kw + (numel(outs[0]) if attrs["act"] else 0)


# --- pooling --------------------------------------------------------------------------------------

_POOL_ATTRS = (
    AttrSpec("kernel_h", "int"), AttrSpec("kernel_w", "int"), AttrSpec("stride_h", "int"),
    AttrSpec("stride_w", "int"), AttrSpec("pad", "int"), AttrSpec("act", "int", 0),
)


def _pool_infer(op: str) -> Callable[[Sequence[Shape], Attrs], tuple[Shape, ...]]:
    def infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
        x = shapes[0]
        _check_act(op, shapes, a["act"])
        if not 4 <= len(x) <= CONV_MAX_RANK:  # leading axes: one pool per device (eqsat.distribution)
            raise _fail(op, shapes, "needs an NCHW input (or one with leading batch axes)")
        if min(a["kernel_h"], a["kernel_w"], a["stride_h"], a["stride_w"]) < 1:
            raise _fail(op, shapes, "kernel and strides must be positive")
        if a["pad"] not in tuple(Padding):
            raise _fail(op, shapes, f"padding code {a['pad']} is not 0 SAME or 1 VALID")
        ho, _, _ = window_out_and_pads(x[-2], a["kernel_h"], a["stride_h"], a["pad"])
        wo, _, _ = window_out_and_pads(x[-1], a["kernel_w"], a["stride_w"], a["pad"])
        if ho < 1 or wo < 1:
            raise _fail(op, shapes, "the window is larger than the (unpadded) input")
        return ((*x[:-2], ho, wo),)

    return infer


def _pool_numpy(reduce: str) -> Callable[[Sequence[np.ndarray], Attrs], tuple[np.ndarray, ...]]:
    def run(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
        if xs[0].ndim > 4:  # leading batch axes: one pool each
            return (np.stack([run([x], a)[0] for x in xs[0]]),)
        fill = -np.inf if reduce == "max" else 0.0
        win = _windows(xs[0], a["kernel_h"], a["kernel_w"], a["stride_h"], a["stride_w"], a["pad"], fill)
        out = win.max(axis=(4, 5)) if reduce == "max" else win.mean(axis=(4, 5))  # avg counts padding
        return (_activate(out.astype(xs[0].dtype), a["act"]),)

    return run


def _pool_flops(ins: Sequence[Shape], outs: Sequence[Shape], a: Attrs) -> float:
    return float(numel(outs[0]) * a["kernel_h"] * a["kernel_w"])


# --- data movement --------------------------------------------------------------------------------

def _axis(op: str, shapes: Sequence[Shape], axis: int, rank: int) -> int:
    if not 0 <= axis < rank:
        raise _fail(op, shapes, f"axis {axis} is out of range for rank {rank}")
    return axis


def _concat_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    first = shapes[0]
    axis = _axis("concat", shapes, a["axis"], len(first))
    for s in shapes[1:]:
        if len(s) != len(first) or any(d != e for i, (d, e) in enumerate(zip(s, first)) if i != axis):
            raise _fail("concat", shapes, f"inputs must agree on every dimension but axis {axis}")
    return (first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:],)


def _split_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x = shapes[0]
    axis = _axis("split", shapes, a["axis"], len(x))
    sizes = a["sizes"]
    if len(sizes) < 1 or any(s < 1 for s in sizes) or sum(sizes) != x[axis]:
        raise _fail("split", shapes, f"sizes {list(sizes)} must be positive and add up to {x[axis]} (axis {axis})")
    return tuple(x[:axis] + (s,) + x[axis + 1:] for s in sizes)


def _split_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    cuts = np.cumsum(a["sizes"])[:-1]
    return tuple(np.split(xs[0], cuts, axis=a["axis"]))


def _slice_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x = shapes[0]
    axis = _axis("slice", shapes, a["axis"], len(x))
    if not 0 <= a["start"] < a["stop"] <= x[axis]:
        raise _fail("slice", shapes, f"[{a['start']}, {a['stop']}) is not a non-empty range within {x[axis]} (axis {axis})")
    return (x[:axis] + (a["stop"] - a["start"],) + x[axis + 1:],)


def _slice_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["stop"])
    return (xs[0][tuple(index)],)


def _transpose_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x, perm = shapes[0], a["perm"]
    if sorted(perm) != list(range(len(x))):
        raise _fail("transpose", shapes, f"perm {list(perm)} is not a permutation of 0..{len(x) - 1}")
    return (tuple(x[p] for p in perm),)


def _reshape_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    if any(d < 1 for d in a["shape"]) or numel(a["shape"]) != numel(shapes[0]):
        raise _fail("reshape", shapes, f"cannot reshape to {list(a['shape'])}: element counts differ")
    return (tuple(a["shape"]),)


def _batchnorm_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x = shapes[0]
    if len(x) < 2:
        raise _fail("batchnorm", shapes, "needs an input with a channel axis (axis 1)")
    if any(s != (x[1],) for s in shapes[1:]):
        raise _fail("batchnorm", shapes, f"scale, bias, mean and var must have shape ({x[1]},)")
    return (tuple(x),)


def _batchnorm_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    x, scale, bias, mean, var = xs
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    inv = (scale / np.sqrt(var + np.asarray(a["eps"], dtype=x.dtype))).reshape(bshape)
    return ((x - mean.reshape(bshape)) * inv + bias.reshape(bshape),)


def _enlarge_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    w, ref = shapes
    if len(w) != 4 or len(ref) != 4:
        raise _fail("enlarge", shapes, "needs two OIHW kernels")
    if w[2] > ref[2] or w[3] > ref[3] or (ref[2] - w[2]) % 2 or (ref[3] - w[3]) % 2:
        raise _fail("enlarge", shapes, "the reference kernel must be larger by an even amount in H and W")
    return ((w[0], w[1], ref[2], ref[3]),)


def _enlarge_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    w, ref = xs
    ph, pw = (ref.shape[2] - w.shape[2]) // 2, (ref.shape[3] - w.shape[3]) // 2
    return (np.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw))),)


def _merge_gconv_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    (w,), x, count = shapes, a["input_shape"], a["count"]
    if len(w) != 4 or len(x) != 4:
        raise _fail("merge_gconv", shapes, f"needs an OIHW kernel and its conv's NCHW input shape, got {list(x)}")
    if count < 1 or w[1] < 1 or x[1] % w[1]:
        raise _fail("merge_gconv", shapes, f"count {count} must be positive and input channels {x[1]} a multiple "
                                           f"of the kernel's {w[1]}")
    groups = x[1] // w[1]
    if groups % count or w[0] % groups:
        raise _fail("merge_gconv", shapes, f"the conv's {groups} groups must be a multiple of count {count} and "
                                           f"divide its {w[0]} output channels")
    return ((w[0], w[1] * count, w[2], w[3]),)


def merged_group_slots(out_channels: int, groups: int, count: int) -> np.ndarray:
    """For each output channel of a grouped conv whose groups are joined `count` at a time, which of
    the joined group's `count` blocks of input channels its kernel reads (the others are zeros)."""
    return (np.arange(out_channels) // (out_channels // groups)) % count


def merge_gconv_into(out: np.ndarray, w: np.ndarray, groups: int, count: int) -> np.ndarray:
    """Write kernel `w` (of a conv with `groups` groups) into the zeros `out` block-diagonally, as the
    kernel of the same conv with groups / count groups; returns `out`."""
    cg = w.shape[1]
    slots = merged_group_slots(w.shape[0], groups, count)
    for s in range(count):
        out[slots == s, s * cg:(s + 1) * cg] = w[slots == s]
    return out


def _merge_gconv_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    (w,), count = xs, a["count"]
    out = np.zeros((w.shape[0], w.shape[1] * count, *w.shape[2:]), dtype=w.dtype)
    return (merge_gconv_into(out, w, a["input_shape"][1] // w.shape[1], count),)


def _leaf_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    if any(d < 1 for d in a["shape"]):
        raise ShapeError(f"{a['name']}: every dimension must be positive, got {list(a['shape'])}")
    dtype_kind(a["dtype"])
    return (tuple(a["shape"]),)


def _no_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    raise ShapeError("leaves are bound to values, not computed")


def _zero_flops(ins: Sequence[Shape], outs: Sequence[Shape], a: Attrs) -> float:
    return 0.0


# --- ops that JAX capture needs (jax_backend/capture.py) -----------------------------------------

def _reduce_infer(op: str) -> Callable[[Sequence[Shape], Attrs], tuple[Shape, ...]]:
    def infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
        x, axes = shapes[0], a["axes"]
        if len(set(axes)) != len(axes) or any(not 0 <= ax < len(x) for ax in axes):
            raise _fail(op, shapes, f"axes {list(axes)} must be distinct and within rank {len(x)}")
        return (tuple(d for i, d in enumerate(x) if i not in axes),)

    return infer


def _reduce_flops(ins: Sequence[Shape], outs: Sequence[Shape], a: Attrs) -> float:
    return float(numel(ins[0]))


def _broadcast_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    x, shape, dims = shapes[0], a["shape"], a["dims"]
    if len(dims) != len(x) or any(not 0 <= d < len(shape) for d in dims) or list(dims) != sorted(set(dims)):
        raise _fail("broadcast", shapes, f"dims {list(dims)} must map each input axis to an increasing output axis of {list(shape)}")
    if any(x[i] not in (1, shape[d]) for i, d in enumerate(dims)):
        raise _fail("broadcast", shapes, f"input dims must be 1 or equal the output's {list(shape)} at {list(dims)}")
    return (tuple(shape),)


def _broadcast_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    shape, dims = a["shape"], a["dims"]
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = xs[0].shape[i]
    return (np.broadcast_to(xs[0].reshape(expanded), shape).copy(),)


_LEAF_ATTRS = (AttrSpec("name", "str"), AttrSpec("shape", "ints"), AttrSpec("dtype", "str", DEFAULT_DTYPE))


# --- mask and index math: integer and boolean values (jax_backend/capture.py) -----------------------

def _iota_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    shape, dim = tuple(a["shape"]), a["dimension"]
    if any(d < 1 for d in shape) or not 0 <= dim < len(shape):
        raise _fail("iota", shapes, f"dimension {dim} must index shape {list(shape)} (positive dimensions)")
    if dtype_kind(a["dtype"]) == "bool":
        raise _fail("iota", shapes, "counts in a number type, not bool")
    return (shape,)


def _iota_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    shape, dim = tuple(a["shape"]), a["dimension"]
    line = np.arange(shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(shape))])
    return (np.broadcast_to(line, shape).astype(numpy_dtype(a["dtype"])),)


def _select_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    return (np.where(xs[0], xs[2], xs[1]),)


def _convert_infer(shapes: Sequence[Shape], a: Attrs) -> tuple[Shape, ...]:
    dtype_kind(a["dtype"])
    return (tuple(shapes[0]),)


def _convert_numpy(xs: Sequence[np.ndarray], a: Attrs) -> tuple[np.ndarray, ...]:
    return (np.asarray(xs[0]).astype(numpy_dtype(a["dtype"])),)


def _typed(name: str, arity: int, fn: Callable[..., np.ndarray], doc: str, kinds: frozenset[DtypeKind],
           result: ResultDtype = "same") -> OpSpec:
    """An elementwise op on values of any shape (all inputs of one shape) typed by `kinds`: mask
    and index math, which no float rule matches (they are separate ops, see `eqsat.rulesets`)."""
    return OpSpec(name, (), arity, _same_shape(name), lambda xs, a: (np.asarray(fn(*xs)),), _pointwise_flops(1),
                  doc=doc, fusible=True, operand_kinds=kinds, result_dtype=result)


def _distribution_op(name: str, attrs: tuple[str, ...], infer: Callable[[Sequence[Shape], Attrs], tuple[Shape, ...]],
                     role: Role, collectives: tuple[str | None, str | None, str], doc: str, sums: bool = False,
                     aliases: bool = False, kinds: frozenset[DtypeKind] | None = None) -> OpSpec:
    """A distribution op (`eqsat.distribution`): integer attributes, one stacked input (`kinds`: the
    dtypes it moves, floats unless given)."""
    fn = distribution.NUMPY[name]
    spec = OpSpec(name, tuple(AttrSpec(a, "int") for a in attrs), 1, infer, lambda xs, a: (fn(xs, a),),
                  distribution.sum_flops if sums else _zero_flops, doc=doc, distribution=role,
                  collectives=Collectives(*collectives), aliases=aliases)
    return spec if kinds is None else replace(spec, operand_kinds=kinds)


OPS: Mapping[str, OpSpec] = {spec.name: spec for spec in (
    OpSpec("input", _LEAF_ATTRS, 0, _leaf_infer, _no_numpy, _zero_flops, is_leaf=True, doc="a graph input",
           result_dtype="attr"),
    OpSpec("weight", _LEAF_ATTRS, 0, _leaf_infer, _no_numpy, _zero_flops, is_leaf=True, doc="a parameter",
           result_dtype="attr"),
    _binary("ewadd", np.add, "elementwise sum", on_devices=_any_depth),
    _binary("ewmul", np.multiply, "elementwise product", on_devices=_any_depth),
    OpSpec("smul", (), 2, _smul_infer, lambda xs, a: (xs[0] * xs[1].reshape(()),), _pointwise_flops(1),
           doc="multiply by a one-element tensor", fusible=True),
    OpSpec("matmul", (AttrSpec("act", "int", 0),), 2, _matmul_infer,
           lambda xs, a: (_activate(np.matmul(xs[0], xs[1]), a["act"]),), _matmul_flops,
           doc="2-D or batched 3-D matrix product with a fused activation", contraction=True, on_devices=_any_depth),
    OpSpec("conv2d", (AttrSpec("stride_h", "int", 1), AttrSpec("stride_w", "int", 1), AttrSpec("pad", "int", 0),
                      AttrSpec("act", "int", 0)), 2, _conv_infer, _conv_numpy, _conv_flops,
           doc="NCHW x OIHW convolution; groups = input channels / weight's input channels; shared leading axes batch it",
           contraction=True, on_devices=_any_depth, conv_layout="NCHW"),
    OpSpec("conv2d_nhwc", (AttrSpec("stride_h", "int", 1), AttrSpec("stride_w", "int", 1), AttrSpec("pad", "int", 0),
                           AttrSpec("act", "int", 0)), 2, _conv_nhwc_infer, _conv_nhwc_numpy, _conv_nhwc_flops,
           doc="conv2d in the layout XLA:CPU runs natively: NHWC x HWIO → NHWC (the layout rules make it)",
           fusion_kind="library", conv_layout="NHWC"),
    _unary("relu", lambda x: np.maximum(x, 0), 1, "max(x, 0)", grad_reads="input", on_devices=_any_depth),
    _unary("tanh", np.tanh, 4, "hyperbolic tangent", grad_reads="output", on_devices=_any_depth),
    _unary("sigmoid", _sigmoid, 4, "logistic function", grad_reads="output", on_devices=_any_depth),
    OpSpec("poolmax", _POOL_ATTRS, 1, _pool_infer("poolmax"), _pool_numpy("max"), _pool_flops, doc="max pooling",
           on_devices=_any_depth),
    OpSpec("poolavg", _POOL_ATTRS, 1, _pool_infer("poolavg"), _pool_numpy("avg"), _pool_flops,
           doc="average pooling; padded positions count as zeros", on_devices=_any_depth),
    OpSpec("concat", (AttrSpec("axis", "int"),), None, _concat_infer,
           lambda xs, a: (np.concatenate(xs, axis=a["axis"]),), _zero_flops, doc="join along an axis",
           fusion_kind="copy", operand_kinds=ANY_KIND, on_devices=_axis_past_devices, keeps_layout=True,
           joins_loops=True),
    OpSpec("split", (AttrSpec("axis", "int"), AttrSpec("sizes", "ints")), 1, _split_infer, _split_numpy,
           _zero_flops, is_view=True, doc="cut along an axis into pieces of the given sizes", operand_kinds=ANY_KIND),
    OpSpec("slice", (AttrSpec("axis", "int"), AttrSpec("start", "int"), AttrSpec("stop", "int")), 1,
           _slice_infer, _slice_numpy, _zero_flops, is_view=True, doc="one piece of a split", operand_kinds=ANY_KIND,
           on_devices=_axis_past_devices),
    OpSpec("transpose", (AttrSpec("perm", "ints"),), 1, _transpose_infer,
           lambda xs, a: (np.transpose(xs[0], a["perm"]),), _zero_flops, doc="permute axes",
           on_devices=_keeps_leading("perm"), fusion_kind="copy", operand_kinds=ANY_KIND, rank_attr="perm"),
    OpSpec("reshape", (AttrSpec("shape", "ints"),), 1, _reshape_infer,
           lambda xs, a: (xs[0].reshape(a["shape"]),), _zero_flops, is_view=True, doc="row-major reshape",
           operand_kinds=ANY_KIND, on_devices=_keeps_device_dims, rank_attr="shape"),
    OpSpec("batchnorm", (AttrSpec("eps", "float", 1e-5),), 5, _batchnorm_infer, _batchnorm_numpy,
           _pointwise_flops(2), doc="inference batch norm over axis 1: (x - mean) / sqrt(var + eps) * scale + bias",
           fusion_kind="loop"),
    OpSpec("enlarge", (), 2, _enlarge_infer, _enlarge_numpy, _zero_flops,
           doc="zero-pad a kernel to the H, W of a reference kernel, centred", fusion_kind="copy"),
    OpSpec("merge_gconv", (AttrSpec("input_shape", "ints"), AttrSpec("count", "int")), 1, _merge_gconv_infer,
           _merge_gconv_numpy, _zero_flops, fusion_kind="copy",
           doc="TASO's merge_gconv: the kernel of a grouped conv on an input of input_shape, as the kernel of the "
               "same conv with every count neighbouring groups joined into one (zeros off the block diagonal)"),
    _binary("ewsub", np.subtract, "elementwise difference", on_devices=_any_depth),
    _binary("ewdiv", np.divide, "elementwise quotient", on_devices=_any_depth),
    _binary("ewmax", np.maximum, "elementwise maximum"),
    _binary("ewmin", np.minimum, "elementwise minimum"),
    _binary("pow", np.power, "x to the power y (jnp.power, lax.pow; an integer exponent is converted first)"),
    _unary("exp", np.exp, 4, "e to the x", grad_reads="output", on_devices=_any_depth),
    _unary("log", np.log, 4, "natural logarithm", positive_domain=True),
    _unary("neg", np.negative, 1, "-x"),
    _unary("abs", np.abs, 1, "|x|"),
    _unary("sin", np.sin, 4, "sine (rotary position embeddings)"),
    _unary("cos", np.cos, 4, "cosine (rotary position embeddings)"),
    _unary("erf", lambda x: _special("erf", x), 8, "the error function"),
    _unary("erfc", lambda x: _special("erfc", x), 8, "1 - erf(x), computed without cancellation (exact GELU)"),
    _unary("sqrt", np.sqrt, 4, "square root", positive_domain=True),
    _unary("rsqrt", lambda x: 1.0 / np.sqrt(x), 4, "reciprocal square root", positive_domain=True),
    OpSpec("reduce_sum", (AttrSpec("axes", "ints"),), 1, _reduce_infer("reduce_sum"),
           lambda xs, a: (np.sum(xs[0], axis=tuple(a["axes"])).astype(xs[0].dtype),), _reduce_flops,
           doc="sum over the listed axes (dropped)", on_devices=_reduces_trailing),
    OpSpec("reduce_max", (AttrSpec("axes", "ints"),), 1, _reduce_infer("reduce_max"),
           lambda xs, a: (np.max(xs[0], axis=tuple(a["axes"])),), _reduce_flops,
           doc="maximum over the listed axes (dropped)", on_devices=_reduces_trailing),
    OpSpec("broadcast", (AttrSpec("shape", "ints"), AttrSpec("dims", "ints")), 1, _broadcast_infer,
           _broadcast_numpy, _zero_flops, doc="lax.broadcast_in_dim: input axis i goes to output axis dims[i]",
           fusible=True, on_devices=_keeps_leading("dims"), operand_kinds=ANY_KIND),
    # mask and index math (integer and boolean values): ops of their own, so no float rule matches them
    OpSpec("iota", (AttrSpec("shape", "ints"), AttrSpec("dimension", "int"), AttrSpec("dtype", "str", "int32")), 0,
           _iota_infer, _iota_numpy, _zero_flops, doc="lax.iota broadcast: each element's index along `dimension`",
           fusible=True, result_dtype="attr"),
    *(_typed(name, 2, fn, f"elementwise {name} comparison (a boolean result)",
             ANY_KIND if name in ("eq", "ne") else NUMERIC, "bool")
      for name, fn in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                       ("eq", np.equal), ("ne", np.not_equal))),
    OpSpec("select_n", (), 3, _same_shape("select_n"), _select_numpy, _pointwise_flops(1),
           doc="lax.select_n with two cases: where(pred, on_true (the third input), on_false (the second))",
           fusible=True, operand_kinds=ANY_KIND, result_dtype="select", on_devices=_any_depth),
    OpSpec("convert_element_type", (AttrSpec("dtype", "str"),), 1, _convert_infer, _convert_numpy,
           _pointwise_flops(1), doc="lax.convert_element_type to `dtype`", fusible=True, operand_kinds=ANY_KIND,
           result_dtype="attr"),
    _typed("iadd", 2, np.add, "integer sum (wraps around)", frozenset({"int"})),
    _typed("isub", 2, np.subtract, "integer difference (wraps around)", frozenset({"int"})),
    _typed("imul", 2, np.multiply, "integer product (wraps around)", frozenset({"int"})),
    _typed("imax", 2, np.maximum, "integer maximum", frozenset({"int"})),
    _typed("imin", 2, np.minimum, "integer minimum", frozenset({"int"})),
    _typed("and", 2, np.bitwise_and, "logical (bool) or bitwise (int) and", frozenset({"int", "bool"})),
    _typed("or", 2, np.bitwise_or, "logical (bool) or bitwise (int) or", frozenset({"int", "bool"})),
    _typed("not", 1, np.invert, "logical (bool) or bitwise (int) not", frozenset({"int", "bool"})),
    replace(_typed("stop_gradient", 1, lambda x: x, "the value unchanged; its gradient is zero (lax.stop_gradient)",
                   ANY_KIND), on_devices=_any_depth),
    # distribution ops: collectives (forward, backward) as `eqsat.parallel.cost` prices them
    _distribution_op("partition", ("dim", "axis", "parts"), distribution.partition_infer, "enter",
                     (None, "all-reduce", "in"),
                     "split dim into `parts` blocks, one per device of mesh axis `axis` (a new leading axis)",
                     kinds=ANY_KIND),  # a boolean mask is split like the scores it selects (`partition-select4`)
    _distribution_op("combine", ("dim", "axis"), distribution.combine_infer, "leave", ("all-gather", None, "out"),
                     "concatenate the devices' blocks along dim (drops the leading device axis)"),
    _distribution_op("replicate", ("axis", "parts"), distribution.replicate_infer, "enter", (None, "all-reduce", "in"),
                     "every device of mesh axis `axis` holds the whole value", aliases=True),
    _distribution_op("reduce", ("axis",), distribution.reduce_infer, "leave", ("all-reduce", None, "out"),
                     "sum the devices' partial values", sums=True, aliases=True),
    _distribution_op("all_reduce", ("axis",), distribution.all_reduce_infer, "keep", ("all-reduce", "all-reduce", "out"),
                     "every device gets the sum (replicate . reduce)", sums=True),
    _distribution_op("all_gather", ("dim", "axis"), distribution.all_gather_infer, "keep",
                     ("all-gather", "reduce-scatter", "out"), "every device gets the concatenation (replicate . combine)"),
    _distribution_op("reduce_scatter", ("dim", "axis"), distribution.reduce_scatter_infer, "keep",
                     ("reduce-scatter", "all-gather", "in"), "device i gets block i of the sum (partition . reduce)",
                     sums=True),
    _distribution_op("all_to_all", ("split_dim", "concat_dim", "axis"), distribution.all_to_all_infer, "keep",
                     ("all-to-all", "all-to-all", "in"),
                     "re-partition: concatenate along concat_dim, split along split_dim (partition . combine)"),
)}


def ops_where(fact: Callable[[OpSpec], bool]) -> frozenset[str]:
    """The registry ops with a fact: the one way op-name tables are made."""
    return frozenset(name for name, spec in OPS.items() if fact(spec))


def with_role(role: Role) -> frozenset[str]:
    """The ops with this distribution role (`Role`)."""
    return ops_where(lambda spec: spec.distribution == role)


DISTRIBUTION_OPS = ops_where(lambda spec: spec.distribution != "none")
"""partition, combine, replicate, reduce and the collectives (`eqsat.distribution`)."""

_Key = TypeVar("_Key", bound=Hashable)


def weight_derived(nodes: Iterable[tuple[_Key, str, Sequence[_Key]]], moved_only: bool = False) -> frozenset[_Key]:
    """Which values are derived from weights alone: the one definition of weight folding, used for
    free weight-only nodes (`eqsat.cost.weight_only_nodes`, Tensat's convention), zero-cost e-classes
    (`eqsat.egraph.constant_classes`), load-time folding (`jax_backend.lower.fold_weights`) and the
    parallel planner's weights moved across devices (`moved_only`).

    `nodes`: (key, op, child keys); a key is a graph node, or an e-class that several nodes share
    (derived when one of its nodes is). A weight is derived and an input never is
    (`OpSpec.weight_derivation`); any other node is when all its children are. So a nullary op
    that is no leaf (a constant made from its attributes; the registry has none today) is derived:
    it reads nothing at run time and folds at load time like a computed weight.
    `moved_only`: derived through distribution ops only (a weight's value moved across devices, whose
    gradient is the weight's gradient and waits for the gradient sync), not through computing ops.
    The least fixpoint, by worklist: linear in nodes and edges, in any node order."""
    listed = list(nodes)
    users: dict[_Key, list[int]] = {}
    for i, (_, _, kids) in enumerate(listed):
        for kid in set(kids):
            users.setdefault(kid, []).append(i)
    through = ("weight", "moves") if moved_only else ("weight", "moves", "computes")
    derived: set[_Key] = set()
    queue = deque(range(len(listed)))
    while queue:
        key, op, kids = listed[queue.popleft()]
        if key in derived or op_spec(op).weight_derivation not in through or not all(k in derived for k in kids):
            continue
        derived.add(key)
        queue.extend(users.get(key, ()))
    return frozenset(derived)


def op_spec(name: str) -> OpSpec:
    """The registry entry for `name`, or a clear error listing the known ops."""
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op '{name}'; known ops: {', '.join(sorted(OPS))}") from None


def infer_shapes(op: str, input_shapes: Sequence[Shape], attrs: Attrs) -> tuple[Shape, ...]:
    """Output shapes of `op`, with arity checked; errors name the op and the input shapes."""
    spec = op_spec(op)
    if spec.arity is not None and len(input_shapes) != spec.arity:
        raise _fail(op, input_shapes, f"takes {spec.arity} input(s), got {len(input_shapes)}")
    if spec.arity is None and not input_shapes:
        raise _fail(op, input_shapes, "takes at least one input")
    return spec.infer([tuple(s) for s in input_shapes], spec.normalize_attrs(attrs))


def infer_dtypes(op: str, input_dtypes: Sequence[str], attrs: Attrs, outputs: int = 1) -> tuple[str, ...]:
    """Output dtypes of `op` (`outputs` of them) from its operands' (`OpSpec.result_dtype`); refuses
    operands of a kind the op does not take (`OpSpec.operand_kinds`: a float op on integers) and
    operands of different dtypes where they must agree, so a graph never mixes dtypes silently."""
    spec = op_spec(op)
    a = spec.normalize_attrs(attrs)
    operands = list(input_dtypes)
    if spec.result_dtype == "select":
        if operands and operands[0] != "bool":
            raise ShapeError(f"{op}: the predicate must be bool, got {operands[0]}")
        operands = operands[1:]
    for d in operands:
        if dtype_kind(d) not in spec.operand_kinds:
            raise ShapeError(f"{op}: takes {'/'.join(sorted(spec.operand_kinds))} values, got {d}")
    if spec.result_dtype != "attr" and len(set(operands)) > 1:
        raise ShapeError(f"{op}: operands of different dtypes ({', '.join(operands)}); convert one first")
    if spec.result_dtype == "attr":
        out = str(a["dtype"])
    elif spec.result_dtype == "bool":
        out = "bool"
    else:
        out = operands[0] if operands else DEFAULT_DTYPE
    return (out,) * outputs


def evaluate(op: str, inputs: Sequence[np.ndarray], attrs: Attrs) -> tuple[np.ndarray, ...]:
    """Reference semantics: run `op` in numpy."""
    spec = op_spec(op)
    return spec.numpy(inputs, spec.normalize_attrs(attrs))


def flops(op: str, input_shapes: Sequence[Shape], attrs: Attrs) -> float:
    spec = op_spec(op)
    a = spec.normalize_attrs(attrs)
    return spec.flops(input_shapes, spec.infer(input_shapes, a), a)


def bytes_moved(op: str, input_shapes: Sequence[Shape], attrs: Attrs, itemsize: int = 4) -> float:
    """Bytes read and written by one op run alone (views move nothing)."""
    spec = op_spec(op)
    if spec.is_leaf or spec.is_view:
        return 0.0
    outs = spec.infer(input_shapes, spec.normalize_attrs(attrs))
    return float(itemsize * (sum(numel(s) for s in input_shapes) + sum(numel(s) for s in outs)))

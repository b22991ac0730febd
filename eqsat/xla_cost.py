"""The "xla" cost model: price the kernels XLA launches, from a calibration of this device.

A sum of per-op times does not predict a jitted program, because XLA fuses: a chain of elementwise
ops is one loop over memory, whatever its length, and the activation after a dot is the head of
such a loop (the dot itself is a library call). So the model prices e-nodes in context
(`eqsat.context`): each value knows whether it is the output of a loop fusion (`fused_loop`: every
e-node of its class ends in an elementwise loop), and

- an elementwise (`OpSpec.fusion == "loop"`) node whose input is such a value joins that loop: it
  costs its arithmetic and the bytes of its other operands, no launch and no write; otherwise it
  starts a loop: a kernel of its own, its reads and its write;
- a dot or conv (`"library"`) costs what the calibration measured for a call of its size (seconds
  against flops, interpolated in log-log between measured shapes) or the time to read its operands
  as a matrix-vector product of that reduction length and width took per byte (`Calibration.gemv_kn`,
  else `Calibration.gemv` by width alone), whichever is longer (a
  dense conv by its GEMM shape, rows x weight, on the NHWC surface `Calibration.conv1x1_nhwc`), plus the loop
  of its activation,
  plus a loop kernel copying each operand that is a strided slice (a slice out of the middle of a
  value as XLA holds it, NHWC for an NCHW conv's output, or a view of one: a library call reads dense operands);
- an NCHW conv is what XLA:CPU runs for it (its optimized HLO): the NHWC conv, a transpose of its
  weight to HWIO on every call (the weight is an argument of the call), a transpose of its input
  unless that is already NHWC inside XLA (`ValueContext.conv_internal`: XLA's layout assignment keeps
  a conv's NHWC output through elementwise ops and concats), and a transpose back before an
  op that does not carry the layout (a pool, a reshape, a dot, a slice: XLA:CPU slices the channels
  of a conv's output in NCHW, every fusion reading the slice transposing), all at the measured transpose
  curves (`Calibration.transpose_2d`, `transpose_kxk` for weights, `transpose_act` for activations:
  seconds against bytes as a program runs them, one transpose-copy fusion feeding a conv, since
  XLA:CPU's transposes slow down per byte as they grow past its caches); so NCHW and NHWC plans are priced on one conv
  surface and differ only by transposes, not by two independently probed curves;
- a copy (`"copy"`) costs a read and write of its output: a transpose of a dense value at the
  transpose bandwidth, a concat or a transpose of a strided slice
  as a loop kernel; but a concat (`OpSpec.joins_loops`) is written by the loop fusion of its elementwise
  operands (XLA:CPU fuses relu(a), relu(b) and their concat into one loop), so it copies only the operands
  no loop wrote, and an elementwise consumer joins its loop;
- views (`"view"`) and leaves cost nothing; any other op (`"kernel"`: pools, reductions) its roofline
  under the measured bandwidth and loop arithmetic rate.

A kernel of its own costs the larger of its work and the device's floor for a kernel of that kind
(`Calibration.floors`), not a launch cost plus its work: on a GPU a small kernel takes a few
microseconds from one kernel's end to the next, whatever its size (the calibration measures it as
the slope of a chain of N dependent tiny kernels of each kind). A grouped convolution (a group of
more than one channel: ResNeXt's) has a curve of its own (`Calibration.gconv`): cuDNN runs it far
below a dense conv of the same flops. A call of a program costs `Calibration.call_s` more than its
kernels (dispatch and the wait for the result: every call is timed to completion, as plans are
judged), which `program_seconds` adds and the per-node prices do not (it is the same for every plan
of a program).

The e-graph's extraction prices one e-node at a time, so a value counts as fused only when every
e-node of its class ends in a loop: the ILP never gets a discount that the node it picks would not
give. The calibration (`Calibration`) is measured by `jax_backend.calibrate` (`eqsat calibrate`)
and cached per machine, device and JAX version; this module reads, checks and writes the cache and
never measures.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from eqsat import ops
from eqsat.atomic_write import atomic_write_text
from eqsat.calibration_cache import read_cached_calibration
from eqsat.context import EGraphContext, ENode, ENodes, NodeInContext, NodePrice, ValueContext
from eqsat.cost import Shape, weight_only_nodes
from eqsat.errors import EqsatError

if TYPE_CHECKING:
    from eqsat.ir import Graph

__all__ = ["CALIBRATION_FORMAT", "FLOOR_KINDS", "Calibration", "CalibrationError", "ChainFit", "Curve", "Surface", "XlaModel",
           "fit_chain", "fit_taps", "fusion_context", "graph_enodes", "read_calibration", "write_calibration"]

CALIBRATION_FORMAT = "eqsat-xla-calibration-13"
"""3: per-kind kernel floors, the per-call time and grouped convs; 4: matrix-vector products by size
(`Calibration.gemv`) and NHWC convs (`Calibration.conv_nhwc`); 5: 1x1 convs by rows and weight
(`Calibration.conv1x1`); 6: matrix-vector products by reduction length and width (`Calibration.gemv_kn`); 7: the bandwidth of
a layout transpose (`Calibration.transpose_2d` and `transpose_kxk`: an NCHW conv is priced as its NHWC
form and the transposes XLA:CPU puts around it); 8: transposes as a program runs them (a transpose-copy
fusion feeding a conv, not a program that only returns them, which XLA:CPU runs as a copy and a
transpose) and an activation's NCHW <-> NHWC on a curve of its own (`Calibration.transpose_act`); 9:
depthwise convs on a curve of their own (`Calibration.dwconv`); 10: dots probed as a model runs them,
independent products on distinct weights read from memory (`jax_backend.calibrate._independent_dots`;
chained on a few cached weights before), and each grouped probe's width and rate (`Calibration.gconv_rates`);
11: dots of 2048 and 3072 columns between the 1024- and 4096-wide ones (`jax_backend.calibrate.MATMUL_SHAPES`);
12: weight transposes probed on weights past the last-level cache, as a model's are (`TRANSPOSE_BYTES`);
13: depthwise convs priced per output element and tap (`Calibration.dwconv_taps`), not by flops on a curve.
An older cache is refused and measured again (docs/tensat.md has what each change moved)."""

FLOOR_KINDS: tuple[str, ...] = ("loop", "copy", "kernel", "dot", "conv")
"""The kinds of kernel whose floor the calibration measures (`Calibration.floors`)."""


class CalibrationError(EqsatError):
    """No usable calibration: missing (run `eqsat calibrate`), damaged, or from another machine."""


@dataclass(frozen=True)
class Curve:
    """Seconds of one library call against its flops, measured at a few shapes (flops increasing);
    interpolated linearly in log-log, flat below the smallest shape (a call costs at least what the
    smallest one did) and at the largest shape's rate above it."""

    flops: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.flops) < 2 or len(self.flops) != len(self.seconds):
            raise CalibrationError("a calibration curve needs at least two (flops, seconds) points")
        if not all(_positive(x) for x in (*self.flops, *self.seconds)):
            raise CalibrationError("a calibration curve holds a non-positive or non-finite number")
        if any(b <= a for a, b in zip(self.flops, self.flops[1:])):
            raise CalibrationError("a calibration curve's flops are not increasing")

    @staticmethod
    def fit(points: Sequence[tuple[float, float]]) -> Curve:
        """A curve through measured (flops, seconds) points: sorted, one point per flop count (the
        geometric mean), made non-decreasing in seconds (more work never takes less time) by
        pooling adjacent violators in log space, so one noisy point moves its neighbours a little
        instead of dragging every smaller shape down to it."""
        xs, logs = _grouped_logs(points)
        return Curve(tuple(xs), tuple(math.exp(v) for v in _isotonic(logs, rising=True)))

    @staticmethod
    def fit_monotone_rate(points: Sequence[tuple[float, float]], rate_falls: bool = True) -> Curve:
        """A curve through measured points whose rate (flops per second) is monotone in the size: for
        kernels whose work is independent per channel (depthwise convs). With `rate_falls` (a CPU's
        fact) a larger call never runs at a higher rate: merging two calls cannot gain, though noise
        between probes of different shapes would say it does. Without, monotone in the direction the
        probes show (`_monotone`): on a GPU the rate rises while a call is too small to fill the
        device, and merging calls does gain."""
        xs, logs = _grouped_logs((f, sec / f) for f, sec in points)
        (fitted,) = _monotone([logs], rate_falls)
        return Curve(tuple(xs), tuple(x * math.exp(v) for x, v in zip(xs, fitted)))

    def seconds_for(self, flops: float) -> float:
        xs, ys = self.flops, self.seconds
        if flops <= xs[0]:
            return ys[0]
        if flops >= xs[-1]:
            return ys[-1] * flops / xs[-1]
        for i in range(1, len(xs)):
            if flops <= xs[i]:
                t = (math.log(flops) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
                return math.exp(math.log(ys[i - 1]) + t * (math.log(ys[i]) - math.log(ys[i - 1])))
        return ys[-1]  # pragma: no cover - the loop returns

    def rate(self, flops: float) -> float:
        """Achieved FLOP/s at this size (what the calibration reports as efficiency)."""
        return flops / self.seconds_for(flops)


@dataclass(frozen=True)
class Surface:
    """Seconds of a dense 1x1 conv (a GEMM of `rows` output pixels by a cin x cout weight) on a grid of
    rows x weight elements (cin * cout), both increasing, `seconds` row-major (rows outer). Priced at
    the seconds per flop interpolated bilinearly in log space, clamped to the grid: on XLA:CPU such a
    conv's rate falls with fewer rows and with a larger weight, so neither flops alone nor a GEMM of
    the same shape (which XLA does not make of it) predicts it. Any conv XLA:CPU runs as a GEMM is
    priced at the rate for its GEMM shape (`_gemm_shape`)."""

    rows: tuple[float, ...]
    weights: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.rows) < 2 or len(self.weights) < 2 or len(self.seconds) != len(self.rows) * len(self.weights):
            raise CalibrationError("a calibration surface needs a grid of at least 2 x 2 (rows, weight) points")
        if not all(_positive(x) for x in (*self.rows, *self.weights, *self.seconds)):
            raise CalibrationError("a calibration surface holds a non-positive or non-finite number")
        if any(b <= a for axis in (self.rows, self.weights) for a, b in zip(axis, axis[1:])):
            raise CalibrationError("a calibration surface's rows or weights are not increasing")

    @staticmethod
    def fit(rows: Sequence[float], weights: Sequence[float], seconds: Sequence[float],
            rate_falls: bool = True) -> Surface:
        """A surface through a measured grid, each row count's seconds per flop made monotone in the
        weight. With `rate_falls` (a CPU's fact) a larger weight never runs at a higher rate (past L2
        it streams from further away), and one noisy fast point would otherwise make every merge
        toward it look like a gain. Without, in the one direction (for the whole grid) the probes
        show best: on a GPU a larger weight runs at a higher rate while it cannot fill the device."""
        n = len(weights)
        logs = [[math.log(seconds[i * n + j] / (2.0 * r * w)) for j, w in enumerate(weights)] for i, r in enumerate(rows)]
        fitted = _monotone(logs, rate_falls)
        pooled = [2.0 * r * w * math.exp(v) for r, row in zip(rows, fitted) for w, v in zip(weights, row)]
        return Surface(tuple(rows), tuple(weights), tuple(pooled))

    def seconds_for(self, rows: float, weights: float) -> float:
        """Seconds of a 1x1 conv of `rows` output pixels and `weights` weight elements (2 * rows * weights flops)."""
        (i, t), (j, u) = _cell(self.rows, rows), _cell(self.weights, weights)
        n = len(self.weights)

        def log_rate(a: int, b: int) -> float:  # log seconds per flop at grid point (a, b)
            return math.log(self.seconds[a * n + b] / (2.0 * self.rows[a] * self.weights[b]))

        low = (1 - u) * log_rate(i, j) + u * log_rate(i, j + 1)
        high = (1 - u) * log_rate(i + 1, j) + u * log_rate(i + 1, j + 1)
        return 2.0 * rows * weights * math.exp((1 - t) * low + t * high)


def _cell(axis: Sequence[float], x: float) -> tuple[int, float]:
    """The grid cell [axis[i], axis[i + 1]] holding x and x's place in it (0..1, in log space), clamped."""
    lx = math.log(min(max(x, axis[0]), axis[-1]))
    for i in range(len(axis) - 1):
        if lx <= math.log(axis[i + 1]) or i == len(axis) - 2:
            return i, (lx - math.log(axis[i])) / (math.log(axis[i + 1]) - math.log(axis[i]))
    raise AssertionError("unreachable")  # pragma: no cover


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf


def _grouped_logs(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The points' distinct x, sorted, and the mean log of the y measured at each."""
    groups: dict[float, list[float]] = {}
    for x, y in points:
        groups.setdefault(float(x), []).append(math.log(y))
    xs = sorted(groups)
    return xs, [sum(groups[x]) / len(groups[x]) for x in xs]


def _isotonic(values: Sequence[float], rising: bool) -> list[float]:
    """The least-squares fit to `values` that never falls (`rising`) or never rises along them:
    adjacent violators pooled into their mean."""
    sign = 1.0 if rising else -1.0
    blocks: list[tuple[float, int]] = []  # (mean, points pooled)
    for v in values:
        blocks.append((sign * v, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks[-2], blocks[-1]
            blocks[-2:] = [((a * n + b * m) / (n + m), n + m)]
    return [sign * mean for mean, n in blocks for _ in range(n)]


def _monotone(rows: Sequence[Sequence[float]], rate_falls: bool) -> list[list[float]]:
    """Each row of log seconds per flop (along increasing sizes) made monotone, all in one direction:
    never falling (a rate that never rises with size, a CPU's fact) with `rate_falls`, else the
    direction that fits the measured points better in least squares (a tie keeps the CPU's). Which
    way an accelerator's rate goes with size is read from its probes, not assumed."""
    up = [_isotonic(row, True) for row in rows]
    if rate_falls:
        return up
    down = [_isotonic(row, False) for row in rows]

    def misfit(fitted: Sequence[Sequence[float]]) -> float:
        return sum((a - b) ** 2 for row, fit in zip(rows, fitted) for a, b in zip(row, fit))

    return up if misfit(up) <= misfit(down) else down


@dataclass(frozen=True)
class ChainFit:
    """What a chain of N dependent kernels of one kind shows: `floor_s`, the seconds one more
    kernel adds (measured on the longest chains), and `call_s`, what a call costs beyond its
    kernels (the line's intercept: dispatch and the wait for the result)."""

    floor_s: float
    call_s: float


def fit_chain(points: Sequence[tuple[int, float]], device_bound: int = 3) -> ChainFit:
    """Fit (kernels, seconds per call) of chains of one kind of kernel. A short chain can hide
    behind the call's dispatch and add next to nothing per kernel; the longest chains show the
    device's own time per kernel. The floor is the median of the pairwise slopes (Theil-Sen: one
    noisy chain moves it little) among the `device_bound` longest chains; the call time is the
    shortest chain's median less its kernels (at least 0)."""
    by_n: dict[int, list[float]] = {}
    for n, sec in points:
        if not (isinstance(n, int) and n >= 1 and _positive(sec)):
            raise CalibrationError(f"a chain timing ({n} kernels, {sec} s) is not a positive count and time")
        by_n.setdefault(n, []).append(float(sec))
    lengths = sorted(by_n)
    if len(lengths) < 2:
        raise CalibrationError("a chain fit needs chains of at least two lengths")
    med = {n: statistics.median(v) for n, v in by_n.items()}
    top = lengths[-max(2, device_bound):]
    slopes = [(med[b] - med[a]) / (b - a) for i, a in enumerate(top) for b in top[i + 1:]]
    floor = max(statistics.median(slopes), 1e-9)
    return ChainFit(floor, max(med[lengths[0]] - lengths[0] * floor, 0.0))


@dataclass(frozen=True)
class Calibration:
    """What the xla model knows about one device, measured on it (`jax_backend.calibrate`)."""

    machine: str  # `eqsat.cost._machine_key()`: a cache copied to another machine is not trusted
    device: str  # `jax_backend.measured_cost.device_key()`: platform, device kind, JAX version
    launch_s: float  # a loop kernel's floor: one more tiny elementwise kernel in a chain (`fit_chain`)
    bandwidth: float  # bytes/s a loop fusion streams (read + write)
    loop_flops: float  # FLOP/s of elementwise arithmetic inside a loop fusion
    matmul: Curve
    conv: Curve
    seconds: float = 0.0  # how long the calibration took
    weight_bandwidth: float = 0.0  # bytes/s a dot or conv reads its operands at (matrix-vector products); 0: `bandwidth`
    copy_s: float = 0.0  # floor of a transpose of a dense value (often a layout change: ~0); 0: `launch_s`
    kernel_s: float = 0.0  # floor of any other kernel (a pool, a reduction); 0: `launch_s`
    dot_s: float = 0.0  # floor of a dot; 0: the matmul curve's smallest call
    conv_s: float = 0.0  # floor of a conv; 0: the conv curve's smallest call
    call_s: float = 0.0  # what a call costs beyond its kernels (dispatch, the wait for the result); 0: none
    gconv: Curve | None = None  # grouped convs (more than one channel a group); None: the conv curve
    gemv: Curve | None = None  # seconds of a (1, GEMV_K) x (GEMV_K, n) product against n; None: `weight_bandwidth`
    conv_nhwc: Curve | None = None  # dense NHWC convs (`conv2d_nhwc`); None: the conv curve
    gconv_nhwc: Curve | None = None  # grouped NHWC convs; None: `gconv`
    conv1x1: Surface | None = None  # dense NCHW convs by GEMM rows and weight (1x1 probes); None: the conv curve
    conv1x1_nhwc: Surface | None = None  # dense 1x1 NHWC convs; None: `conv1x1`
    gemv_kn: Surface | None = None  # (1, k) x (k, n) products: `rows` k, `weights` n (`_dot_read_seconds`); None: `gemv`
    transpose_bandwidth: float = 0.0  # bytes/s (read + write) of a layout transpose with no curve below; 0: `bandwidth`
    transpose_2d: Curve | None = None  # seconds of a 2-D transpose (1x1 weights, NCHW <-> NHWC) against its bytes
    transpose_kxk: Curve | None = None  # seconds of a k x k conv weight's OIHW -> HWIO transpose against its bytes
    transpose_act: Curve | None = None  # seconds of an activation's NCHW <-> NHWC transpose; None: `transpose_2d`
    dwconv: Curve | None = None  # depthwise NHWC convs (one channel a group) against flops; None: the conv curve
    # (channels a group, FLOP/s) of each grouped probe: a grouped conv runs at its group width's rate
    # (`_group_rate`, interpolated between widths); empty: the grouped curves by flops
    gconv_rates: tuple[tuple[float, float], ...] = ()
    # (seconds per output element, seconds per output element and tap) of a depthwise conv, fitted to the
    # depthwise probes (`fit_taps`): a 3x3 one runs at about half a 7x7 one's FLOP/s on a CPU, which a
    # curve by flops smooths away; None: the `dwconv` curve
    dwconv_taps: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        defaults = {"weight_bandwidth": self.bandwidth, "copy_s": self.launch_s, "kernel_s": self.launch_s,
                    "dot_s": self.matmul.seconds[0], "conv_s": self.conv.seconds[0],
                    "transpose_bandwidth": self.bandwidth}
        for name, value in defaults.items():
            if not getattr(self, name):
                object.__setattr__(self, name, value)
        if not all(_positive(x) for x in (self.launch_s, self.bandwidth, self.loop_flops, self.weight_bandwidth,
                                          self.transpose_bandwidth, *self.floors.values())):
            raise CalibrationError("a calibration rate or kernel floor is not a finite positive number")
        if not (_positive(self.call_s) or self.call_s == 0):
            raise CalibrationError("a calibration's call time is not a finite number >= 0")
        if not all(_positive(g) and _positive(r) for g, r in self.gconv_rates):
            raise CalibrationError("a grouped conv's width or rate is not a finite positive number")
        if self.dwconv_taps is not None and (len(self.dwconv_taps) != 2 or not all(
                math.isfinite(x) and x >= 0 for x in self.dwconv_taps) or sum(self.dwconv_taps) <= 0):
            raise CalibrationError("a depthwise conv's seconds per output and per tap are not two numbers >= 0")

    @property
    def floors(self) -> dict[str, float]:
        """Seconds a kernel of each kind (`FLOOR_KINDS`) takes at the least."""
        return {"loop": self.launch_s, "copy": self.copy_s, "kernel": self.kernel_s, "dot": self.dot_s,
                "conv": self.conv_s}

    def to_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, **asdict(self)}

    @staticmethod
    def from_json(data: Any) -> Calibration:
        """A calibration from its JSON; anything malformed is a `CalibrationError`."""
        try:
            if data.get("format") != CALIBRATION_FORMAT:
                raise CalibrationError(_format_mismatch(data.get("format")))
            curves = {k: Curve(tuple(data[k]["flops"]), tuple(data[k]["seconds"])) for k in ("matmul", "conv")}
            optional = {k: Curve(tuple(data[k]["flops"]), tuple(data[k]["seconds"])) if data[k] is not None else None
                        for k in ("gconv", "gemv", "conv_nhwc", "gconv_nhwc", "transpose_2d", "transpose_kxk",
                                  "transpose_act", "dwconv")}
            surfaces = {k: Surface(tuple(data[k]["rows"]), tuple(data[k]["weights"]), tuple(data[k]["seconds"]))
                        if data[k] is not None else None for k in ("conv1x1", "conv1x1_nhwc", "gemv_kn")}
            return Calibration(str(data["machine"]), str(data["device"]), data["launch_s"], data["bandwidth"],
                               data["loop_flops"], curves["matmul"], curves["conv"], float(data.get("seconds", 0.0)),
                               data["weight_bandwidth"], data["copy_s"], data["kernel_s"], data["dot_s"],
                               data["conv_s"], data["call_s"], optional["gconv"], optional["gemv"],
                               optional["conv_nhwc"], optional["gconv_nhwc"], surfaces["conv1x1"],
                               surfaces["conv1x1_nhwc"], surfaces["gemv_kn"], data["transpose_bandwidth"],
                               optional["transpose_2d"], optional["transpose_kxk"], optional["transpose_act"],
                               optional["dwconv"], tuple((float(g), float(r)) for g, r in data["gconv_rates"]),
                               None if data["dwconv_taps"] is None else
                               (float(data["dwconv_taps"][0]), float(data["dwconv_taps"][1])))
        except CalibrationError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"malformed calibration ({type(exc).__name__}: {exc})") from None


def _format_mismatch(found: Any) -> str:
    """Why a calibration of another format is refused: from an older or a newer eqsat, or no calibration."""
    prefix = CALIBRATION_FORMAT.rsplit("-", 1)[0] + "-"
    version = found[len(prefix):] if isinstance(found, str) and found.startswith(prefix) else ""
    if not version.isdigit():
        return f"not a {CALIBRATION_FORMAT} file"
    mine = int(CALIBRATION_FORMAT.rsplit("-", 1)[1])
    age = "an older" if int(version) < mine else "a newer"
    return f"{found} is from {age} eqsat (this one reads {CALIBRATION_FORMAT}): run `eqsat calibrate --force`"


def read_calibration(path: Path, machine: str, device: str) -> Calibration:
    """The cached calibration at `path` if it is whole and was measured on this `machine` and
    `device`; otherwise a `CalibrationError` saying why (missing, damaged, foreign)."""
    return read_cached_calibration(path, CalibrationError, Calibration.from_json, lambda cal: (cal.machine, cal.device),
                                   (machine, device), label="calibration cache",
                                   missing=f"no calibration for {device} at {path}: run `eqsat calibrate`",
                                   where="machine or device")


def write_calibration(path: Path, cal: Calibration) -> None:
    atomic_write_text(path, json.dumps(cal.to_json(), indent=1))


# --- the context: which values are loop-fusion outputs ----------------------------------------------

def _ends_in_loop(node: ENode) -> bool | None:
    """Whether the node's value is written by a loop fusion (None: a view, as its input is)."""
    spec = ops.op_spec(node.op)
    kind = spec.fusion
    if kind == "view":
        return None
    if kind == "loop" or spec.joins_loops:
        return True
    return kind == "library" and int(spec.normalize_attrs(node.attrs).get("act", 0)) != 0


def fusion_context(enodes: ENodes) -> EGraphContext:
    """Every e-node kept; a class is `fused_loop` when every e-node of it ends in a loop (a view
    when its input does) and it is not computed from weights alone (those are precomputed)."""
    members: dict[str, list[ENode]] = {}
    for n in enodes.nodes.values():
        members.setdefault(n.eclass, []).append(n)
    constant = ops.weight_derived((n.eclass, n.op, n.children) for n in enodes.nodes.values())
    leaf = {c: ms[0].op for c, ms in members.items() if any(ops.op_spec(m.op).is_leaf for m in ms)}
    ends = {c: [(_ends_in_loop(m), m.children[0] if m.children else "") for m in ms] for c, ms in members.items()
            if c not in constant and c not in leaf}
    fused: set[str] = set()
    changed = True
    while changed:  # least fixpoint: views see their input's fact; a cycle of views stays unfused
        changed = False
        for cls, facts in ends.items():
            if cls not in fused and all(e if e is not None else child in fused for e, child in facts):
                fused.add(cls)
                changed = True
    internal: set[str] = set()
    changed = True
    while changed:  # NHWC inside XLA:CPU: an NCHW conv's output, or carried from one (least fixpoint, as above)
        changed = False
        for cls in ends:
            if cls not in internal and all(_keeps_conv_layout(m, enodes.shapes, internal) for m in members[cls]):
                internal.add(cls)
                changed = True
    strided: set[str] = set()
    changed = True
    while changed:  # a strided slice (in the layout XLA holds it), or a view of one (least fixpoint)
        changed = False
        for cls in ends:
            if cls not in strided and all(_strided_member(m, enodes.shapes, strided, internal) for m in members[cls]):
                strided.add(cls)
                changed = True
    any_layout = {c for c in ends if all(ops.op_spec(m.op).joins_loops for m in members[c])}
    classes = {c: ValueContext(leaf=leaf.get(c), fused_loop=c in fused, strided_view=c in strided,
                               conv_internal=c in internal, any_layout=c in any_layout) for c in enodes.shapes}
    return EGraphContext(frozenset(enodes.nodes), classes)


def _keeps_conv_layout(node: ENode, shapes: Mapping[str, Shape], internal: set[str]) -> bool:
    """Whether the node's value is NHWC inside XLA:CPU: XLA:CPU runs a rank-4 NCHW conv as an NHWC one and
    its layout assignment keeps that layout through the ops that carry it (`OpSpec.carries_layout`)."""
    spec = ops.op_spec(node.op)
    if spec.conv_layout == "NCHW":
        return bool(node.children) and len(shapes.get(node.children[0], ())) == 4
    return spec.carries_layout and any(c in internal for c in node.children)


def _strided_member(node: ENode, shapes: Mapping[str, Shape], strided: set[str], internal: set[str]) -> bool:
    if node.op == "slice" and node.children and node.children[0] in shapes:
        shape, attrs = shapes[node.children[0]], node.attrs
        if node.children[0] in internal and len(shape) == 4:  # held NHWC: a channel slice is strided there
            shape = tuple(shape[p] for p in ops.NHWC_IN)
            attrs = {**attrs, "axis": ops.NHWC_IN.index(int(attrs["axis"]) % 4)}
        return _strided(shape, attrs) or node.children[0] in strided
    return ops.op_spec(node.op).fusion == "view" and bool(node.children) and node.children[0] in strided


def _strided(shape: Shape, attrs: Mapping[str, Any]) -> bool:
    """Whether a slice of `shape` along `attrs["axis"]` is not one contiguous block of row-major
    memory (an axis before it is longer than 1): a library call cannot read it in place."""
    axis = int(attrs["axis"]) % len(shape) if shape else 0
    return math.prod(shape[:axis]) > 1


def graph_enodes(graph: Graph) -> ENodes:
    """A graph as e-nodes, one class per value (a split's outputs as slices of its input), so a
    graph is priced exactly as the e-graph that holds it."""
    nodes: dict[str, ENode] = {}
    shapes: dict[str, Shape] = {}

    def cls(node: int, index: int) -> str:
        return f"v{node}.{index}"

    for i, node in enumerate(graph.nodes):
        kids = tuple(cls(v.node, v.index) for v in node.inputs)
        for k, shape in enumerate(node.shapes):
            shapes[cls(i, k)] = tuple(shape)
            op, attrs = node.op, node.attr
            if node.op == "split":
                start = sum(node.attr["sizes"][:k])
                op, attrs = "slice", {"axis": node.attr["axis"], "start": start, "stop": start + node.attr["sizes"][k]}
            nodes[f"n{i}.{k}"] = ENode(op, attrs, cls(i, k), kids)
    return ENodes(nodes, shapes)


# --- the model -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class XlaModel:
    """Prices what XLA launches (module docstring); an `InContextCostModel` with its own context
    (`context_analysis`), which `eqsat.pipeline.search` and `eqsat.cost.graph_cost` use."""

    calibration: Calibration
    device: str = "cpu"
    free_ops: frozenset[str] = frozenset()
    itemsize: int = 4
    name: str = "xla"
    _cache: dict[Any, float] = field(default_factory=dict, repr=False, compare=False, hash=False)
    prices_conv_layout: ClassVar[bool] = True  # an NCHW conv is priced as XLA runs it (`eqsat.layout_phase`)

    def with_free_ops(self, free: frozenset[str]) -> XlaModel:
        """The same model with `free` ops priced at 0 (`eqsat.cost.Conventions`)."""
        return replace(self, free_ops=self.free_ops | free, _cache={})

    @property
    def context_analysis(self) -> Any:
        return fusion_context

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        """The op alone: no input fused (a kernel of its own)."""
        return self.price(NodeInContext.plain(op, attrs, input_shapes)).seconds

    def price(self, node: NodeInContext) -> NodePrice:
        fused = tuple(v.fused_loop for v in node.inputs)
        strided = tuple(v.strided_view for v in node.inputs)
        internal = tuple(v.conv_internal for v in node.inputs)
        free = tuple(v.any_layout for v in node.inputs)
        key = (node.op, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in node.attrs.items())),
               node.input_shapes, fused, strided, internal, free)
        seconds = self._cache.get(key)
        if seconds is None:
            seconds = self._cache[key] = (self._seconds(node.op, node.attrs, node.input_shapes, fused, strided)
                                          + self._layout_seconds(node.op, node.input_shapes, internal, free))
        return NodePrice(seconds)

    def _layout_seconds(self, op: str, shapes: Sequence[Shape], internal: Sequence[bool],
                        free: Sequence[bool]) -> float:
        """The transposes XLA:CPU adds for NCHW convs at this node: an NCHW conv's weight (an argument of
        the call, transposed to HWIO on every call) and its input when that is not already NHWC inside
        XLA; for an op that does not carry the layout (a pool, a reshape, a dot), each operand that is. A
        concat's output is read in either layout at no cost (`ValueContext.any_layout`)."""
        spec = ops.op_spec(op)
        if op in self.free_ops or spec.is_leaf:
            return 0.0
        if spec.conv_layout == "NCHW" and len(shapes) == 2 and len(shapes[0]) == 4:
            kind: TransposeKind = "kxk" if shapes[1][2] * shapes[1][3] > 1 else "2d"  # (O, I, k*k) -> (k*k, I, O)
            weight = _transpose_seconds(self.calibration, self.itemsize * ops.numel(shapes[1]), kind)
            return weight + (0.0 if internal[0] or free[0] else
                             _transpose_seconds(self.calibration, self.itemsize * ops.numel(shapes[0]), "act"))
        if spec.carries_layout or spec.conv_layout is not None or spec.fusion == "copy":
            # a conv reads it as it is; an explicit transpose is a copy priced as one; a concat's loop writes
            # its NHWC operands into its NCHW output at no more than a concat of NCHW ones takes (XLA:CPU)
            return 0.0
        return sum(_transpose_seconds(self.calibration, self.itemsize * ops.numel(s), "act")
                   for s, inside, either in zip(shapes, internal, free) if inside and not either)

    def _seconds(self, op: str, attrs: Mapping[str, Any], shapes: Sequence[Shape], fused: Sequence[bool],
                 strided: Sequence[bool] = ()) -> float:
        spec = ops.op_spec(op)
        kind = spec.fusion
        if op in self.free_ops or kind in ("leaf", "view"):
            return 0.0
        cal = self.calibration
        shapes = [tuple(s) for s in shapes]
        outs = ops.infer_shapes(op, shapes, attrs)
        out_bytes = self.itemsize * sum(ops.numel(s) for s in outs)
        in_bytes = [self.itemsize * ops.numel(s) for s in shapes]
        work = ops.flops(op, shapes, attrs)
        if kind == "loop":
            if any(fused):  # joins the loop of its first fused input: reads its other operands only
                first = fused.index(True)
                reads = sum(b for i, b in enumerate(in_bytes) if i != first and not fused[i])
                return max(work / cal.loop_flops, reads / cal.bandwidth)
            return max(cal.launch_s, work / cal.loop_flops, (sum(in_bytes) + out_bytes) / cal.bandwidth)
        if kind == "library":
            layout = spec.conv_layout
            act = ops.Activation(int(spec.normalize_attrs(attrs).get("act", 0)))
            # the call: its efficiency at this size, or the time to read its operands (a matrix-vector product)
            dot = max(work - (ops.numel(outs[0]) if act is not ops.Activation.NONE else 0), 1.0)
            moved = sum(in_bytes) + out_bytes
            if layout == "NCHW" and len(shapes[0]) == 4:  # XLA:CPU runs it as its NHWC form (`_layout_seconds`)
                nhwc = [tuple(shapes[0][p] for p in ops.NHWC_IN), tuple(shapes[1][p] for p in ops.HWIO_FROM_OIHW)]
                out = tuple(outs[0][p] for p in ops.NHWC_IN)
                call = max(cal.conv_s, _conv_seconds(cal, "NHWC", nhwc, out, dot), moved / cal.weight_bandwidth)
            elif layout is not None:
                call = max(cal.conv_s, _conv_seconds(cal, layout, shapes, outs[0], dot), moved / cal.weight_bandwidth)
            else:
                call = max(cal.dot_s, cal.matmul.seconds_for(dot),
                           _dot_read_seconds(cal, moved, shapes[1][-1], shapes[1][-2]))
            # an operand sliced out of the middle of a value is first copied by a loop kernel
            call += sum(max(cal.launch_s, 2 * b / cal.bandwidth) for b, s in zip(in_bytes, strided) if s)
            if act is ops.Activation.NONE:
                return call
            # the activation is the head of a loop (what a separate activation op would cost)
            return call + self._seconds(act.op_name, {}, [outs[0]], (False,))
        if kind == "copy":  # a transpose of a dense value may become a layout (`copy_s`); else a loop kernel
            if op == "transpose" and not any(strided):  # a layout transpose (or a layout change)
                return _transpose_seconds(cal, out_bytes, "act")  # a value the program has just written
            if spec.joins_loops and any(fused):  # joins its fused operands' loop: copies the others only
                return sum(2 * b for b, f in zip(in_bytes, fused) if not f) / cal.bandwidth
            return max(cal.launch_s, 2 * out_bytes / cal.bandwidth)
        return max(cal.kernel_s, work / cal.loop_flops, (sum(in_bytes) + out_bytes) / cal.bandwidth)

    def price_graph(self, graph: Graph, fold_weights: bool = True) -> float:
        """The graph's cost as the e-graph holding it prices it (same context, same folding)."""
        live = graph.live()
        enodes = graph_enodes(live)
        facts = fusion_context(enodes)
        skip = {f"n{i}." for i in weight_only_nodes(live)} if fold_weights else set()
        total = 0.0
        for nid in enodes.nodes:
            if ops.op_spec(enodes.nodes[nid].op).is_leaf or nid[:nid.index(".") + 1] in skip:
                continue
            total += self.price(facts.node(enodes, nid)).seconds
        return total

    def program_seconds(self, graph: Graph, fold_weights: bool = True) -> float:
        """Seconds a call of the graph takes, timed to completion: its kernels and the call itself."""
        return self.calibration.call_s + self.price_graph(graph, fold_weights)


def _conv_seconds(cal: Calibration, layout: ops.ConvLayout, shapes: Sequence[Shape], out: Shape,
                  flops: float) -> float:
    """A conv call's seconds: a grouped conv at its group width's rate (`_group_rate`); a conv run as a
    GEMM (`_gemm_shape`) at the seconds per flop of the layout's surface for its GEMM shape, where one was
    measured; any other (a depthwise conv, or one of 2-3 channels a group) on its layout's curve by flops
    (`_conv_curve`)."""
    if cal.gconv_rates and _grouped(layout, shapes):
        return flops / _group_rate(cal.gconv_rates, _channels_a_group(layout, shapes)[1])
    if cal.dwconv_taps is not None and _runs_as_depthwise(layout, shapes):
        per_output, per_tap = cal.dwconv_taps
        w = shapes[1]
        taps = w[1] * w[2] * w[3] if layout == "NCHW" else w[0] * w[1] * w[2]  # a group's inputs x kernel window
        return ops.numel(out) * (per_output + per_tap * taps)
    gemm = _gemm_shape(layout, shapes, out)
    surface = cal.conv1x1_nhwc if layout == "NHWC" and cal.conv1x1_nhwc is not None else cal.conv1x1
    if gemm is not None and surface is not None:
        rows, weights = gemm
        return surface.seconds_for(rows, weights) * flops / (2.0 * rows * weights)
    return _conv_curve(cal, layout, shapes).seconds_for(flops)


def fit_taps(points: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(seconds per output element, seconds per output element and tap) of depthwise convs from
    (output elements, taps, seconds) probes: least squares of seconds per output on taps, neither term
    below 0. A depthwise conv's time is its outputs times a fixed cost (loads, stores, the loop) and a
    cost per multiply-add of its window."""
    if not points:
        raise CalibrationError("no depthwise probes to fit")
    taps = [t for _, t, _ in points]
    each = [s / n for n, _, s in points]
    if len(set(taps)) < 2:
        return statistics.fmean(each), 0.0
    per_tap, per_output = statistics.linear_regression(taps, each)
    if per_tap <= 0:
        return statistics.fmean(each), 0.0
    if per_output < 0:
        return 0.0, sum(t * e for t, e in zip(taps, each)) / sum(t * t for t in taps)
    return per_output, per_tap


def _gemm_shape(layout: ops.ConvLayout, shapes: Sequence[Shape], out: Shape) -> tuple[float, float] | None:
    """(rows, weight elements) of a conv on one image batch as the GEMM XLA:CPU runs it: its output
    pixels by its (cin / groups * kh * kw) x cout weight. For a dense conv, or one of groups wider
    than the grouped curve's probes (`_grouped`): on a CPU their rate falls with fewer rows and a
    larger weight, as a 1x1 conv's does (a 3x3 conv of 512 channels at 14x14 runs at a third of the
    rate of one of 256). None for narrow grouped and depthwise convs (their own curve)."""
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        return None
    (cout, per_group, kh, kw), channels = (w, x[1]) if layout == "NCHW" else ((w[3], w[2], w[0], w[1]), x[3])
    if per_group != channels and per_group <= GROUPED_CURVE_MAX_PER_GROUP:
        return None
    return float(ops.numel(out) // cout), float(cout * per_group * kh * kw)


def _conv_curve(cal: Calibration, layout: ops.ConvLayout, shapes: Sequence[Shape]) -> Curve:
    """The curve a conv is priced on: by layout (an NCHW conv reaches it only when not of rank 4: XLA:CPU
    runs a rank-4 one as NHWC, `XlaModel._layout_seconds`), whether it is depthwise (`_depthwise`: XLA:CPU
    runs one at a small fraction of a dense conv's rate, so the dense curve by flops prices it far too
    low) or grouped (`_grouped`)."""
    nhwc = layout == "NHWC"
    if _runs_as_depthwise(layout, shapes) and cal.dwconv is not None:
        return cal.dwconv
    if _grouped(layout, shapes) and cal.gconv is not None:
        return cal.gconv_nhwc if nhwc and cal.gconv_nhwc is not None else cal.gconv
    return cal.conv_nhwc if nhwc and cal.conv_nhwc is not None else cal.conv


type TransposeKind = Literal["2d", "kxk", "act"]
"""A 1x1 conv weight's OIHW -> HWIO (a 2-D transpose), a k x k conv weight's, and a value's the program
has just written (an activation's NCHW <-> NHWC, an explicit transpose): each on a curve of its own
(`_transpose_seconds`). A weight is read from memory; a value mostly from cache."""


def _transpose_seconds(cal: Calibration, nbytes: float, kind: TransposeKind = "2d") -> float:
    """A layout transpose of `nbytes`, as a program runs it (`jax_backend.calibrate._transpose_curves`:
    a transpose-copy fusion feeding a conv): on its kind's measured curve of seconds against bytes (on
    a CPU a large transpose runs at a fraction of a small one's rate per byte, and a square power-of-two
    weight far below an activation of the same bytes), else read and written at `transpose_bandwidth`;
    at least the copy floor."""
    curve = {"2d": cal.transpose_2d, "kxk": cal.transpose_kxk,
             "act": cal.transpose_act if cal.transpose_act is not None else cal.transpose_2d}[kind]
    if curve is not None:
        return max(cal.copy_s, curve.seconds_for(nbytes))
    return max(cal.copy_s, 2.0 * nbytes / cal.transpose_bandwidth)


# The reduction length of the calibration's matrix-vector probes (`jax_backend.calibrate.GEMV_SHAPES`):
# `Calibration.gemv` is their seconds against their output width.
GEMV_K = 512


def _dot_read_seconds(cal: Calibration, moved: float, width: int, reduction: int = GEMV_K) -> float:
    """Seconds a dot takes to read and write `moved` bytes (a matrix-vector product is bound by
    reading its weight), `width` output columns wide over a `reduction` as long: at the rate the
    probe of that reduction and width streamed its bytes (`Calibration.gemv_kn`, clamped to its
    grid), else the gemv curve's of that width. A CPU splits a mat-vec's columns among its threads,
    so a wide one (merged mat-vecs) streams its weight faster per byte than a narrow one; a longer
    reduction changes the rate too, and not by the same factor at every width (on this 2-core CPU
    widening 512 -> 1024 columns gained 1.1-1.6x at k = 512 and 1.0-1.26x at k = 1024), so the width
    alone cannot say what merging mat-vecs along k, n or both gains."""
    if cal.gemv_kn is not None:
        k, n = max(float(reduction), 1.0), max(float(width), 1.0)
        return cal.gemv_kn.seconds_for(k, n) * moved / (4.0 * (k + k * n + n))
    if cal.gemv is None:
        return moved / cal.weight_bandwidth
    n = max(float(width), 1.0)
    probe = 4.0 * (GEMV_K + GEMV_K * n + n)
    if n < cal.gemv.flops[0]:
        lo = cal.gemv.flops[0]
        return cal.gemv.seconds[0] * moved / (4.0 * (GEMV_K + GEMV_K * lo + lo))
    return cal.gemv.seconds_for(n) * moved / probe


# The widest and the narrowest group the grouped-conv probes measure (`jax_backend.calibrate.GCONV_SHAPES`):
# a curve is not extrapolated past the convs it was measured on.
GROUPED_CURVE_MAX_PER_GROUP = 64
GROUPED_CURVE_MIN_PER_GROUP = 4


def _channels_a_group(layout: ops.ConvLayout, shapes: Sequence[Shape]) -> tuple[int, int]:
    """A rank-4 conv's input channels and its weight's input channels a group ((0, 0) for any other rank)."""
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        return 0, 0
    return (int(x[1]), int(w[1])) if layout == "NCHW" else (int(x[3]), int(w[2]))


def _depthwise(layout: ops.ConvLayout, shapes: Sequence[Shape]) -> bool:
    """A depthwise conv: one input channel a group, more than one group (NasNet-A's separable convs)."""
    channels, per_group = _channels_a_group(layout, shapes)
    return per_group == 1 and channels > 1


def _grouped(layout: ops.ConvLayout, shapes: Sequence[Shape]) -> bool:
    """A grouped conv of `GROUPED_CURVE_MIN_PER_GROUP` to `GROUPED_CURVE_MAX_PER_GROUP` channels a group
    (not a dense conv, not a depthwise one). Wider groups (two merged convs: 2 groups of 1280) run as the
    dense convs they are and are priced on the dense curve; narrower ones as depthwise convs (`_narrow_groups`)."""
    channels, per_group = _channels_a_group(layout, shapes)
    return GROUPED_CURVE_MIN_PER_GROUP <= per_group < channels and per_group <= GROUPED_CURVE_MAX_PER_GROUP


def _runs_as_depthwise(layout: ops.ConvLayout, shapes: Sequence[Shape]) -> bool:
    """A depthwise conv or a merged one of 2-3 channels a group: XLA:CPU runs both alike (`dwconv_taps`)."""
    return _depthwise(layout, shapes) or _narrow_groups(layout, shapes)


def _narrow_groups(layout: ops.ConvLayout, shapes: Sequence[Shape]) -> bool:
    """A grouped conv of 2 to `GROUPED_CURVE_MIN_PER_GROUP` - 1 channels a group: two or three depthwise
    convs merged into one (NasNet-A's `merge_gconv`). XLA:CPU runs these as slowly as depthwise ones; the
    grouped curve, measured on wider groups, priced them several times too low and led the ILP to merge
    NasNet-A's separable convs for a loss (docs/tensat.md)."""
    channels, per_group = _channels_a_group(layout, shapes)
    return 1 < per_group < min(channels, GROUPED_CURVE_MIN_PER_GROUP)


def _group_rate(rates: Sequence[tuple[float, float]], per_group: float) -> float:
    """FLOP/s of a grouped conv of `per_group` channels a group: between two probed group widths, log rate
    linear in log width; outside them, the nearest probe's. Its group width, not its flops, sets a grouped
    conv's rate on a CPU: a curve by flops over probes of different widths gave a narrow group a wide one's
    rate (docs/tensat.md)."""
    widths, logs = _grouped_logs(rates)
    i, t = _cell(widths, per_group)
    return math.exp(logs[i] + t * (logs[i + 1] - logs[i])) if len(widths) > 1 else math.exp(logs[0])

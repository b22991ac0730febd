"""Calibrating the "xla" cost model on the JAX device at hand (`eqsat calibrate`), and its factory.

What is measured, each with the one timing policy (`jax_backend.timing.interleaved_rounds`), in
about a minute on a quiet CPU: per kind of kernel (loop, copy, pool, dot, conv) its floor, the time one more
tiny kernel of that kind adds to a chain of up to 64 (`FLOOR_PROBES`, `chain_fit`), and the time
of a call beyond its kernels (each call timed to completion, as plans are judged), the
bandwidth of a loop fusion streaming a 1 MiB array, the arithmetic rate of a long elementwise
chain, NHWC convs (dense, grouped and depthwise) of representative sizes (seconds against flops:
the efficiency curves; dense 1x1 convs on a grid of rows x channels), each as the marginal cost of
one more call in a chain; no NCHW conv (the model prices a rank-4 one as XLA:CPU runs it, its NHWC
form and transposes); dots (the matmul curve) and matrix-vector products of 1 to 8 MiB weights
(seconds against output width: on a CPU a wide one streams its weight faster per byte than a narrow
one), each as independent products of one input on distinct weights read from memory, as a model's
are (`_independent_dots`); and the transposes XLA:CPU runs around an NCHW conv (weights OIHW -> HWIO,
activations NCHW -> NHWC) as a program runs them (`_transpose_curves`). Each probe's rounds go on until its 95% interval is
within `PROBE_WIDTH` of its median (`medians_precise`), up to a cap: narrow intervals, though a busy
machine still moves the values themselves.
The result is cached per machine, device and JAX version (`eqsat.xla_cost.Calibration`); the
factory never measures inside an optimizer's clock: with no cache it fails with a line saying to
run `eqsat calibrate`, and a damaged or foreign cache is re-measured (with a one-line warning)
before any search starts.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat import ops
from eqsat.cost import _machine_key, register_cost_model
from eqsat.errors import EqsatError
from eqsat.paths import cache_dir
from eqsat.xla_cost import (FLOOR_KINDS, GEMV_K, Calibration, CalibrationError, ChainFit, Curve, Surface, XlaModel,
                             fit_chain, fit_taps, read_calibration, write_calibration)
from jax_backend.measured_cost import check_measuring_device, device_key
from jax_backend.timing import interleaved_rounds, medians_precise

__all__ = ["MATMUL_SHAPES", "GEMV_SHAPES", "GEMV_GRID_K", "CONV_SHAPES", "CONV1X1_SIZES", "CONV1X1_CHANNELS",
           "CHAIN_LENGTHS", "DWCONV_SHAPES", "FLOOR_PROBES", "GCONV_SHAPES", "TRANSPOSE_ACT_SHAPES", "TRANSPOSE_SHAPES",
           "calibration_path", "calibrate",
           "chain_fit", "chain_is_device_bound", "load_calibration", "xla_model"]

MATMUL_SHAPES: tuple[tuple[int, int, int], ...] = (
    (8, 64, 64), (32, 128, 128), (64, 256, 256), (128, 512, 512), (64, 1024, 1024), (64, 1024, 2048),
    (64, 1024, 3072), (64, 1024, 4096))
"""(m, k, n) of the calibration's dots, (m, k) x (k, n): 6.6e4 to 5.4e8 flops (BERT's 64 x 1024 among
them; the widest are what merging two, three or four such dots that share an operand makes: a 3072-wide
one need not cost per column what a curve through the 1024- and 4096-wide ones says). Each is timed as
independent products of one input on distinct weights, `WEIGHT_BYTES` in all (`_independent_dots`)."""

GEMV_SHAPES: tuple[tuple[int, int], ...] = ((GEMV_K, 512), (GEMV_K, 1024), (GEMV_K, 2048), (GEMV_K, 4096))
"""(k, n) of the calibration's matrix-vector products (1, k) x (k, n), 1 to 8 MiB a weight (NasRNN's,
and its merged ones): bound by reading the weight, at a rate that grows with the output width n on a
CPU (its threads split the columns; `eqsat.xla_cost.Calibration.gemv`). Timed as the dots are
(`_independent_dots`)."""

WEIGHT_BYTES = 64 * 2**20  # the weights a dot probe reads: past any last-level cache, as a model's are
MAX_DOT_CALLS = 128  # ...in at most this many products (a small weight stays cached in a model too)
# The dots' ratios decide merges (a wide dot against its parts): timed to a 3% interval, within 3 s a shape,
# where 10% let the wide-to-narrow ratio move by +-7% from one calibration to the next
DOT_PROBE_WIDTH = 0.03
DOT_CAP_S = 3.0

GEMV_GRID_K: tuple[int, ...] = (256, GEMV_K, 1024, 2048)
"""Reduction lengths of the (k, n) mat-vec grid (`Calibration.gemv_kn`): each with every width of
`GEMV_SHAPES`, all in the same interleaved rounds (NasRNN's merges lengthen k, widen n, or both)."""

CONV_SHAPES: tuple[tuple[int, int, int], ...] = (
    (8, 16, 3), (32, 32, 3), (192, 35, 1), (128, 28, 3), (256, 14, 3), (64, 56, 3), (128, 112, 3))
"""(channels, height = width, kernel) of the calibration's convs, (1, C, H, H) * (C, C, K, K), stride 1,
SAME padding: 3e5 to 3.7e9 flops (VGG's largest convs are 3.7e9: the curve is measured, not
extrapolated, up to them)."""

GCONV_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 56, 4), (512, 14, 16), (2048, 7, 64))
"""(channels, height = width, channels a group) of the calibration's grouped 3x3 convs (ResNeXt's
cardinality-32 blocks): 1.4e7 to 1.2e8 flops."""

DWCONV_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 28, 3), (128, 56, 3), (256, 28, 5), (256, 28, 7))
"""(channels, height = width, kernel) of the calibration's depthwise convs (one channel a group: NasNet-A's
separable convs), 9e5 to 2e7 flops: XLA:CPU runs them far below a dense conv's rate, so they need a curve
of their own (`eqsat.xla_cost.Calibration.dwconv`)."""

CONV1X1_SIZES: tuple[int, ...] = (8, 17, 35)
CONV1X1_CHANNELS: tuple[int, ...] = (256, 768, 1280)
"""The grid of the calibration's dense 1x1 convs (`eqsat.xla_cost.Calibration.conv1x1`): (1, C, H, H) *
(C, C, 1, 1) for H in `CONV1X1_SIZES` (64 to 1225 rows: Inception's 8x8, 17x17 and 35x35) and C in
`CONV1X1_CHANNELS` (6.6e4 to 1.6e6 weight elements; merged 1x1 convs reach 2048 x 1152, priced at the
largest: the probe at 35 x 35 rows is already 4e9 flops)."""

CONV1X1_CALLS = 2  # independent convs a 1x1 probe program runs (`_conv1x1_surface`)

TRANSPOSE_SHAPES: tuple[tuple[int, ...], ...] = (
    (64, 64, 1, 1), (256, 192, 1, 1), (768, 384, 1, 1), (2048, 1024, 1, 1),
    (32, 32, 3, 3), (128, 64, 3, 3), (256, 256, 3, 3), (512, 512, 3, 3))
"""OIHW weights the calibration transposes to HWIO (`_transpose_curves`): what XLA:CPU does to an NCHW
conv's weight on every call. 1x1 weights (2-D transposes, as NCHW <-> NHWC activations are) and 3x3
ones, 16 KiB to 9 MiB: the rate per byte falls several times over that range."""

TRANSPOSE_BYTES = 128 * 2**20  # weight bytes transposed per probe call (distinct arrays): past the last-level cache,
# as a model's weights are (on this CPU 16 MiB stayed in cache and ran at twice the rate a model's transposes do)
TRANSPOSE_MAX_COUNT = 256  # ...in at most this many weights (a program of 1024 tiny convs compiles for seconds)
TRANSPOSE_ACT_BYTES = 16 * 2**20  # activation bytes per probe call: a program transposes what it has just written

TRANSPOSE_ACT_SHAPES: tuple[tuple[int, ...], ...] = ((1, 32, 16, 16), (1, 128, 28, 28), (1, 256, 56, 56), (1, 64, 224, 224))
"""NCHW activations the calibration transposes to NHWC (`_transpose_curves`), 32 KiB to 12 MiB (VGG's
first block): a (C, H*W) transpose of few channels and many pixels, which XLA:CPU runs at several
times the rate of a square power-of-two weight of the same bytes."""
ACT_PROBE_OUT = 8  # output channels of the 1x1 conv that reads each transposed activation

CHAIN_LENGTHS: tuple[int, ...] = (1, 16, 32, 64)
"""Kernels in the chains that measure each kind's floor (`eqsat.xla_cost.fit_chain`): the longest
take a few times a call's dispatch (64 kernels of 2-8 us on an H200 against its ~75 us call), so
their slope is the kernels' own time and not the call's jitter."""

LINKS = 3  # a chain of at least this many calls against one call: the marginal cost of a call
MAX_LINKS = 48  # ...doubled up to this while the chain is not clearly slower than one call (dispatch-bound)
DISTINCT_WEIGHTS = 8  # a chain cycles through this many weights (each read from memory, as a model's are)
PROBE_WIDTH = 0.1  # a probe's rounds go on until its 95% interval is at most this fraction of its median...
PROBE_CAP_S = 1.5  # ...or this many seconds a probe (a pair of thunks, or one) are spent
PROBE_ROUNDS = 200
GEMV_CAP_S = 1.0  # seconds a dot or mat-vec shape (`_independent_dots`: all of a set in the same rounds)


def calibration_path() -> Path:
    return cache_dir("xla") / f"{device_key()}.json"


def _arrays(*shapes: tuple[int, ...]) -> list[jax.Array]:
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]


type Variant = tuple[str, dict[str, Any], tuple[int, ...], tuple[int, ...]]
"""An op, its attributes, the chained value's shape and the weight's shape (`_marginals`)."""


def _marginals(variants: Sequence[Variant]) -> list[float]:
    """Seconds one more call of each variant's op adds to a jitted program: a chain of calls against
    a single call, all variants timed in the same rounds (so two layouts of one conv are compared
    under the same machine load; variants of like cost only: a sample repeats each call as often as
    the quickest one needs). What a program pays once (dispatch,
    waking threads) cancels out. A link whose output is larger than its input is cut back to the
    input's shape (a slice, as a merged dot's outputs are sliced). Each call is timed to completion
    (as plans are judged), and a short chain of small ops adds less than a call's own jitter: the
    chains of those variants double (up to `MAX_LINKS`) until each takes at least twice one call
    (`chain_is_device_bound`), and those are timed again."""
    from jax_backend.lower import lower_node

    def chain(op: str, attrs: dict[str, Any], links: int) -> Callable[..., Any]:
        def body(x: jax.Array, *ws: jax.Array) -> jax.Array:
            for i in range(links):
                y = lower_node(op, (x, ws[i % len(ws)]), attrs)[0]
                x = y[tuple(slice(0, d) for d in x.shape)] if y.shape != x.shape else y
            return x
        return jax.jit(body)

    args = [_arrays(x_shape, *[w_shape] * DISTINCT_WEIGHTS) for _, _, x_shape, w_shape in variants]
    result: list[float] = [0.0] * len(variants)
    todo, links = list(range(len(variants))), LINKS
    while todo:
        thunks = []
        for i in todo:
            (op, attrs, _, _), (x, *ws) = variants[i], args[i]
            thunks += [_to_completion(functools.partial(chain(op, attrs, 1), x, ws[0])),
                       _to_completion(functools.partial(chain(op, attrs, links), x, *ws[:links]))]
        times, _ = interleaved_rounds(thunks, PROBE_ROUNDS, budget_s=PROBE_CAP_S * len(todo), min_rounds=5,
                                      enough=medians_precise([(2 * j, 2 * j + 1) for j in range(len(todo))], PROBE_WIDTH))
        left = []
        for j, i in enumerate(todo):
            extra = float(statistics.median(b - a for a, b in zip(times[2 * j], times[2 * j + 1])))
            result[i] = max(extra / (links - 1), 1e-8)
            if not chain_is_device_bound(float(statistics.median(times[2 * j])), extra, links) and links < MAX_LINKS:
                left.append(i)
        todo, links = left, min(2 * links, MAX_LINKS)
    return result


def _independent_dots(shapes: Sequence[tuple[int, int, int]], call_s: float, total_bytes: int = WEIGHT_BYTES,
                      rel_width: float = PROBE_WIDTH, cap_s: float = GEMV_CAP_S) -> list[float]:
    """Seconds of one (m, k) x (k, n) dot per shape, timed as a model runs its dots: a program of
    independent products of one input on distinct weights, `total_bytes` of them (at most
    `MAX_DOT_CALLS`, at least 4), each read from memory; less `call_s`, over their count. All shapes
    are timed in the same interleaved rounds, so a busy machine slows each alike and their ratios
    (what merging dots changes) hold. Chained on a few weights re-read from the cache, as the dots
    were probed before (format 9), they ran faster than a model's and made a wide dot dearer per
    column than its narrow parts (docs/tensat.md)."""
    thunks, counts = [], []
    for m, k, n in shapes:
        count = max(4, min(MAX_DOT_CALLS, -(-total_bytes // (4 * k * n))))
        x, *ws = _arrays((m, k), *[(k, n)] * count)
        many = jax.jit(lambda x, *ws: tuple(x @ w for w in ws))
        thunks.append(_to_completion(functools.partial(many, x, *ws)))
        counts.append(count)
    times, _ = interleaved_rounds(thunks, PROBE_ROUNDS, budget_s=cap_s * len(thunks), min_rounds=7,
                                  enough=medians_precise([(None, i) for i in range(len(thunks))], rel_width))
    return [max((statistics.median(t) - call_s) / count, 1e-8) for t, count in zip(times, counts)]


def chain_is_device_bound(single_s: float, extra_s: float, links: int) -> bool:
    """Whether a chain of `links` calls taking `extra_s` more than one call (`single_s`) shows the
    calls' own time: it must at least double the call. Below that, the difference is within what
    a call's dispatch varies by (and, timed back to back, the chain may hide behind it)."""
    return links >= 2 and extra_s >= single_s


def _to_completion(thunk: Callable[[], Any]) -> Callable[[], Any]:
    """`thunk` waiting for its result: a call timed as `jax_backend.checks` times a plan (each call
    to completion, not queued behind the last), so dispatch and the wait count as they do there."""
    return lambda: jax.block_until_ready(thunk())


def _extra(base: Callable[[], Any], more: Callable[[], Any]) -> tuple[float, float]:
    """Seconds `more` takes beyond `base`, and `base`'s seconds: timed in the same interleaved
    rounds, the median of each round's difference (both samples of a round see the same machine
    state)."""
    times, _ = interleaved_rounds([_to_completion(base), _to_completion(more)], 9, budget_s=1.0, min_rounds=5)
    return float(statistics.median(b - a for a, b in zip(*times))), float(statistics.median(times[0]))


TIMEABLE_S = 50e-6  # an extra time under this is within a GPU's dispatch jitter: measure a larger tensor
PROBE_ELEMENTS = (256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024)  # 1, 16, 256 MiB of float32


def _timeable(extra_s: Callable[[int], float]) -> tuple[int, float]:
    """The first probe size (elements) whose extra seconds `extra_s(n)` reach `TIMEABLE_S`, and
    those seconds (the largest size if none does): a CPU times 1 MiB well, a GPU streams 1 MiB in
    about a microsecond, below what one call's timing resolves."""
    seconds = 0.0
    for n in PROBE_ELEMENTS:
        seconds = extra_s(n)
        if seconds >= TIMEABLE_S:
            return n, seconds
    return PROBE_ELEMENTS[-1], max(seconds, 1e-9)


FLOOR_PROBES: dict[str, tuple[str, dict[str, Any], tuple[tuple[int, ...], ...]]] = {
    "loop": ("tanh", {}, ((1, 512),)),
    "copy": ("transpose", {"perm": (1, 0)}, ((64, 64),)),
    "kernel": ("poolavg", {"kernel_h": 3, "kernel_w": 3, "stride_h": 1, "stride_w": 1, "pad": 0}, ((1, 8, 16, 16),)),
    "dot": ("matmul", {"act": 0}, ((1, 512), (512, 512))),
    "conv": ("conv2d", {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}, ((1, 8, 16, 16), (8, 8, 3, 3))),
}
"""Per kind of kernel (`eqsat.xla_cost.FLOOR_KINDS`): a tiny op of that kind, its attributes and
operand shapes (the first is the chained value; the op maps it to its own shape)."""


def chain_fit(op: str, attrs: dict[str, Any], shapes: Sequence[tuple[int, ...]],
              lengths: Sequence[int] = CHAIN_LENGTHS) -> ChainFit:
    """The floor of one kind of kernel: chains of `lengths` dependent calls of `op`, each behind an
    optimization barrier (XLA can neither fuse nor reorder across it: one kernel per link), timed
    in the same interleaved rounds, fitted by `fit_chain`."""
    from jax_backend.lower import lower_node

    def chain(n: int) -> Callable[..., Any]:
        def body(x: jax.Array, *rest: jax.Array) -> jax.Array:
            for _ in range(n):
                x = jax.lax.optimization_barrier(lower_node(op, (x, *rest), attrs)[0])
            return x
        return jax.jit(body)

    args = _arrays(*shapes)
    thunks = [_to_completion(functools.partial(chain(n), *args)) for n in lengths]
    times, _ = interleaved_rounds(thunks, 7, budget_s=1.0, min_rounds=3)
    return fit_chain([(n, t) for n, ts in zip(lengths, times) for t in ts])


def calibrate(say: Callable[[str], None] = lambda _: None) -> Calibration:
    """Measure this device (seconds: about 20 on a quiet CPU) and return the calibration."""
    start = time.perf_counter()
    (tiny,) = _arrays((1,))
    fits = {kind: chain_fit(*FLOOR_PROBES[kind]) for kind in FLOOR_KINDS}
    for kind, fit in fits.items():
        say(f"{kind} kernel floor: {fit.floor_s * 1e6:.2f} us (chains of {'/'.join(map(str, CHAIN_LENGTHS))}); "
            f"a call beyond its kernels: {fit.call_s * 1e6:.1f} us")
    launch = fits["loop"].floor_s
    call_s = fits["loop"].call_s  # a call beyond its kernels (the loop chain's intercept)
    say(f"a call beyond its kernels (dispatch and the wait): {call_s * 1e6:.1f} us")

    scale = jax.jit(lambda x: x * 2.0 + 1.0)

    def scaled(n: int) -> float:
        (big,) = _arrays((n,))
        return _extra(lambda: scale(tiny), lambda: scale(big))[0]  # less the dispatch

    # 1 MiB first: the size of these models' tensors, not DRAM's (where that is too quick to time, larger)
    n_big, scale_s = _timeable(scaled)
    bandwidth = 2 * 4 * n_big / scale_s
    say(f"loop fusion bandwidth: {bandwidth / 1e9:.1f} GB/s ({4 * n_big / 2**20:.0f} MiB)")

    chain_ops = ("tanh", "ewmul", "sigmoid", "ewadd") * 4

    def loop(n: int) -> Callable[..., Any]:
        def body(x: jax.Array) -> jax.Array:
            y = x
            for op in chain_ops[:n]:
                y = {"tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid}[op](y) if op in ("tanh", "sigmoid") else (
                    y * x if op == "ewmul" else y + x)
            return y
        return jax.jit(body)

    short, long = loop(1), loop(len(chain_ops))

    def looped(n: int) -> float:
        (mid,) = _arrays((n,))
        return _extra(lambda: short(mid), lambda: long(mid))[0]

    n_mid, loop_s = _timeable(looped)
    work = sum(ops.flops(op, [(n_mid,)] * (ops.op_spec(op).arity or 1), {}) for op in chain_ops[1:])
    loop_flops = work / loop_s
    say(f"elementwise arithmetic in a loop: {loop_flops / 1e9:.1f} GFLOP/s ({4 * n_mid / 2**20:.0f} MiB)")

    matmul: list[tuple[float, float]] = []  # (flops, seconds)
    # neighbouring shapes in the same rounds: their ratio (what merging dots gains) under one machine load
    dots = _independent_dots(MATMUL_SHAPES, call_s, rel_width=DOT_PROBE_WIDTH, cap_s=DOT_CAP_S)
    for (m, k, n), t in zip(MATMUL_SHAPES, dots):
        flops = 2.0 * m * k * n
        matmul.append((flops, t))
        say(f"dot {m}x{k}x{n}: {t * 1e6:.0f} us, {flops / t / 1e9:.1f} GFLOP/s")
    gemv: list[tuple[float, float]] = []  # (output width, seconds) at k = GEMV_K
    widths = tuple(n for _, n in GEMV_SHAPES)
    grid = [(k, n) for k in GEMV_GRID_K for n in widths]
    grid_s = _independent_dots([(1, k, n) for k, n in grid], call_s)
    for (k, n), t in zip(grid, grid_s):
        moved = 4.0 * (k + k * n + n)
        if k == GEMV_K:
            gemv.append((n, t))
        say(f"matrix-vector 1x{k}x{n}: {t * 1e6:.0f} us, {moved / t / 1e9:.1f} GB/s")
    gemv_kn = Surface(tuple(float(k) for k in GEMV_GRID_K), tuple(float(n) for n in widths), tuple(grid_s))
    weight_bandwidth = 4.0 * (GEMV_K + GEMV_K * gemv[-1][0] + gemv[-1][0]) / gemv[-1][1]
    # NHWC convs only: the model prices a rank-4 NCHW conv as XLA:CPU runs it, its NHWC form and transposes
    convs: dict[bool, list[tuple[float, float]]] = {}  # grouped: (flops, seconds)
    group_rates: list[tuple[float, float]] = []  # (channels a group, FLOP/s) of each grouped probe
    for grouped, shapes in ((False, CONV_SHAPES), (True, GCONV_SHAPES)):
        attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
        dims = [(c, hw, *((3, kk) if grouped else (kk, c))) for c, hw, kk in shapes]  # channels, size, kernel, width
        for c, hw, kernel, width in dims:
            (t,) = _marginals([("conv2d_nhwc", attrs, (1, hw, hw, c), (kernel, kernel, width, c))])
            f = ops.flops("conv2d", [(1, c, hw, hw), (c, width, kernel, kernel)], attrs)
            convs.setdefault(grouped, []).append((f, t))
            if grouped:
                group_rates.append((float(width), f / t))
            say(f"{'grouped ' if grouped else ''}conv NHWC {c} channels {hw}x{hw} "
                f"({width} a group) {kernel}x{kernel}: {t * 1e6:.0f} us, {f / t / 1e9:.1f} GFLOP/s")
    conv, gconv = Curve.fit(convs[False]), Curve.fit(convs[True])
    falls = rate_falls_with_size()
    dwconv, dwconv_taps = _dwconv_curve(say, falls)
    surface = _conv1x1_surface(say, call_s, falls)
    transpose_2d, transpose_kxk, transpose_act = _transpose_curves(say)
    transpose_bandwidth = 2.0 * transpose_2d.flops[-1] / transpose_2d.seconds[-1]
    return Calibration(_machine_key(), device_key(), launch, bandwidth, loop_flops, Curve.fit(matmul),
                       conv, time.perf_counter() - start, weight_bandwidth,
                       fits["copy"].floor_s, fits["kernel"].floor_s, fits["dot"].floor_s, fits["conv"].floor_s,
                       call_s, gconv, Curve.fit(gemv), conv, gconv, surface, surface, gemv_kn, transpose_bandwidth,
                       transpose_2d, transpose_kxk, transpose_act, dwconv, tuple(group_rates), dwconv_taps)


def rate_falls_with_size() -> bool:
    """Whether this device's library calls are fitted on a rate that never rises with size (`Surface.fit`,
    `Curve.fit_monotone_rate`). A CPU's do (caches: a larger weight streams from further away; the
    pooling keeps probe noise from pricing merges as gains). An accelerator's rate rises while a call
    cannot fill the device, so its probes decide the direction (pooled toward a falling rate, a GPU's
    1x1 convs were all priced at their smallest probe's rate: docs/tensat.md, run 8)."""
    return jax.devices()[0].platform == "cpu"


def _dwconv_curve(say: Callable[[str], None], rate_falls: bool = True) -> tuple[Curve, tuple[float, float]]:
    """Depthwise NHWC convs (`DWCONV_SHAPES`), each the marginal cost of one more call in a chain, as the
    dense and grouped convs are measured (`_marginals`): on a curve whose rate is monotone in size
    (`Curve.fit_monotone_rate`, what older calibrations priced them by), and as seconds per output
    element and per tap (`eqsat.xla_cost.fit_taps`, what they are priced by)."""
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    points, taps = [], []
    for c, hw, k in DWCONV_SHAPES:
        (t,) = _marginals([("conv2d_nhwc", attrs, (1, hw, hw, c), (k, k, 1, c))])
        f = ops.flops("conv2d", [(1, c, hw, hw), (c, 1, k, k)], attrs)
        points.append((f, t))
        taps.append((float(c * hw * hw), float(k * k), t))  # SAME padding, stride 1: an output per input
        say(f"depthwise conv NHWC {c} channels {hw}x{hw} {k}x{k}: {t * 1e6:.0f} us, {f / t / 1e9:.2f} GFLOP/s")
    per_output, per_tap = fit_taps(taps)
    say(f"depthwise conv: {per_output * 1e9:.2f} ns an output + {per_tap * 1e9:.3f} ns a tap")
    return Curve.fit_monotone_rate(points, rate_falls), (per_output, per_tap)  # per-channel work


def _conv1x1_surface(say: Callable[[str], None], call_s: float = 0.0, rate_falls: bool = True) -> Surface:
    """The NHWC 1x1-conv surface. Per row count, every channel count in the same interleaved rounds (a
    busy machine slows each alike, so the ratios along the weight, what merging convs changes, hold),
    each as a program of `CONV1X1_CALLS` independent convs of one input on distinct weights (as a
    plan's parallel branches run), less `call_s`, over their count."""
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    seconds: list[float] = []
    for hw in CONV1X1_SIZES:
        thunks = []
        for c in CONV1X1_CHANNELS:
            x, *ws = _arrays((1, hw, hw, c), *[(1, 1, c, c)] * CONV1X1_CALLS)
            many = jax.jit(functools.partial(_independent_convs, "conv2d_nhwc", attrs))
            thunks.append(_to_completion(functools.partial(many, x, *ws)))
        times, _ = interleaved_rounds(thunks, PROBE_ROUNDS, budget_s=PROBE_CAP_S * len(thunks), min_rounds=5,
                                      enough=medians_precise([(None, i) for i in range(len(thunks))], PROBE_WIDTH))
        for c, t_c in zip(CONV1X1_CHANNELS, times):
            t = max((statistics.median(t_c) - call_s) / CONV1X1_CALLS, 1e-8)
            seconds.append(t)
            say(f"1x1 conv NHWC {c} channels {hw}x{hw}: {t * 1e6:.0f} us, {2 * hw * hw * c * c / t / 1e9:.1f} GFLOP/s")
    rows, weights = tuple(float(hw * hw) for hw in CONV1X1_SIZES), tuple(float(c * c) for c in CONV1X1_CHANNELS)
    return Surface.fit(rows, weights, seconds, rate_falls)


def _transpose_curves(say: Callable[[str], None], weight_bytes: int = TRANSPOSE_BYTES,
                      act_bytes: int = TRANSPOSE_ACT_BYTES,
                      max_count: int = TRANSPOSE_MAX_COUNT) -> tuple[Curve, Curve, Curve]:
    """Seconds against bytes of the transposes XLA:CPU runs around an NCHW conv, as it runs them inside
    a program: a conv weight's OIHW -> HWIO, 2-D (1x1) and k x k (`TRANSPOSE_SHAPES`), and an
    activation's NCHW -> NHWC (`TRANSPOSE_ACT_SHAPES`). Per shape, a program of independent small NHWC
    convs (one output pixel of each weight; 8 output channels of each activation) on distinct operands
    transposed in the program (one transpose-copy fusion feeding each conv, as in a model), against
    the same convs on operands already in that layout; the median per-round difference over their
    count, all shapes in the same interleaved rounds, each until its interval is narrow
    (`medians_precise`). A program that only returns transposed weights is no probe of this: XLA:CPU
    runs each of its transposes as two kernels (a copy, then the transpose), 2-3x the time the same
    transposes add to a conv program."""
    from jax_backend.lower import lower_node

    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}

    def weights(transpose: bool, xs: Sequence[jax.Array], ws: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
        return tuple(lower_node("conv2d_nhwc", (x, jnp.transpose(w, ops.HWIO_FROM_OIHW) if transpose else w), attrs)[0]
                     for x, w in zip(xs, ws))

    def activations(transpose: bool, xs: Sequence[jax.Array], ws: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
        return tuple(lower_node("conv2d_nhwc", (jnp.transpose(x, ops.NHWC_IN) if transpose else x, w), attrs)[0]
                     for x, w in zip(xs, ws))

    probes: list[tuple[str, tuple[int, ...]]] = [("kxk" if s[2] * s[3] > 1 else "2d", s) for s in TRANSPOSE_SHAPES]
    probes += [("act", s) for s in TRANSPOSE_ACT_SHAPES]
    thunks, counts = [], []
    for kind, shape in probes:
        count = max(2, min(max_count, (act_bytes if kind == "act" else weight_bytes) // (4 * int(np.prod(shape)))))
        if kind == "act":
            nchw, ws = _arrays(*[shape] * count), _arrays(*[(1, 1, shape[1], ACT_PROBE_OUT)] * count)
            variants = ((True, nchw, ws), (False, [jnp.transpose(x, ops.NHWC_IN) for x in nchw], ws))
            body = activations
        else:
            o, i, kh, kw = shape
            xs, oihw = _arrays(*[(1, kh, kw, i)] * count), _arrays(*[shape] * count)
            variants = ((True, xs, oihw), (False, xs, [jnp.transpose(w, ops.HWIO_FROM_OIHW) for w in oihw]))
            body = weights
        for transpose, a, b in variants:
            run = jax.jit(functools.partial(body, transpose))
            thunks.append(_to_completion(functools.partial(run, a, b)))
        counts.append(count)
    pairs = [(2 * j + 1, 2 * j) for j in range(len(counts))]
    times, _ = interleaved_rounds(thunks, PROBE_ROUNDS, budget_s=PROBE_CAP_S * len(counts), min_rounds=5,
                                  enough=medians_precise(pairs, PROBE_WIDTH))
    points: dict[str, list[tuple[float, float]]] = {"2d": [], "kxk": [], "act": []}
    for (kind, shape), (base, other), count in zip(probes, pairs, counts):
        extra = statistics.median(a - b for a, b in zip(times[other], times[base]))
        nbytes, sec = 4.0 * float(np.prod(shape)), max(extra / count, 1e-9)
        points[kind].append((nbytes, sec))
        say(f"transpose {shape} ({kind}) in a program: {sec * 1e6:.0f} us, {2 * nbytes / sec / 1e9:.2f} GB/s")
    return Curve.fit(points["2d"]), Curve.fit(points["kxk"]), Curve.fit(points["act"])


def _independent_convs(op: str, attrs: dict[str, Any], x: jax.Array, *ws: jax.Array) -> tuple[jax.Array, ...]:
    from jax_backend.lower import lower_node

    return tuple(lower_node(op, (x, w), attrs)[0] for w in ws)


def load_calibration(force: bool = False, say: Callable[[str], None] = lambda _: None,
                     measure_if_missing: bool = True) -> tuple[Calibration, str]:
    """The cached calibration, or a fresh one (written to the cache), and how it was obtained:
    "cached", "measured" (none cached, or `force`) or "re-measured: WHY" (a damaged or foreign
    cache, never trusted; the warning is one line on stderr). With `measure_if_missing` False a
    missing cache is a `CalibrationError` telling to run `eqsat calibrate`."""
    path = calibration_path()
    status = "measured"
    if not force:
        try:
            return read_calibration(path, _machine_key(), device_key()), "cached"
        except CalibrationError as exc:
            if not path.exists() and not measure_if_missing:
                raise CalibrationError(f"the xla cost model needs a calibration of this device ({device_key()}), "
                                       "and none is cached: run `eqsat calibrate` first") from None
            if path.exists():
                print(f"eqsat: warning: {exc}; re-measuring it (outside any optimizer clock)", file=sys.stderr)
                status = f"re-measured: {exc}"
    cal = calibrate(say)
    try:
        write_calibration(path, cal)
    except OSError as exc:
        say(f"could not write the calibration cache {path}: {exc}")
    return cal, status


def xla_model(device: str = "cpu", **options: Any) -> XlaModel:
    """Factory for eqsat.cost's registry: `cost_model("xla")`, priced from this device's calibration
    (refuses a device name other than the one JAX runs on, as the measured model does)."""
    try:
        check_measuring_device(device)
    except EqsatError as exc:
        raise EqsatError(str(exc).replace("measured/", "xla/").replace("times ops on", "is calibrated on")) from None
    cal, _ = load_calibration(measure_if_missing=False)
    return XlaModel(cal, device=device, **options)


register_cost_model("xla", xla_model)

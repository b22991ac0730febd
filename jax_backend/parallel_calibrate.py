"""`eqsat parallel calibrate`: measure the mesh at hand for the parallel time model, cache it, and
time plans' training steps on it (what the model's predictions are checked against).

Each measurement is the marginal cost of one more operation inside a jitted `shard_map` program
over the whole mesh (a chain of 1 + `EXTRA` against a chain of 1, timed in the same interleaved
rounds of the one timing policy, `jax_backend.timing.interleaved_rounds`), so the dispatch of a
call cancels out and every device is busy, as in a planned step:

- per mesh axis, all-reduces and all-gathers of `SIZES` bytes per device over that axis; alpha and
  beta fitted by least squares (`eqsat.parallel.timemodel.fit_link`, ring latency);
- per mesh axis, a small all-reduce *between compute pieces* (`IN_PROGRAM`): `PIECES` matmuls each
  followed by one against the same matmuls without, so its marginal cost includes waiting for the
  slowest device at the rendezvous (a collective-only chain keeps the devices in step and does not
  see it); its excess over alpha-beta is the axis's `sync` term;
- the drift (`_drift`): the same all-reduce, on the widest axis, after pieces of each `MATMULS` size:
  what it costs beyond its cost after the smallest grows with the piece (the devices drift apart
  while they compute), the `timemodel.DriftCurve` a plan's report prices each collective with;
- compute, on every device at once: matmuls (the flop rate), convolutions forward and backward
  over a design of shapes (`CONVS`: XLA's CPU convolutions take a time of their own, fitted to the
  buffers they move and their flops), an elementwise op on 1 MiB (the
  bandwidth), on a few bytes (the cost of one more kernel) and a transposing copy of a `COPY_SIDE`
  square block (the rate the compiled step's layout copies are priced at), each kept apart from its neighbours
  by `optimization_barrier` so that XLA cannot fuse the chain into one loop;
- fresh bytes (`FRESH_TOTALS`): `FRESH_BUFFERS` elementwise passes whose results all stay live to the
  end (each a buffer of its own in the step's temporaries), at each total of bytes per device, against
  the same passes summed into one reused buffer: the difference per byte is what a step's buffers cost
  beyond the passes that write them (XLA:CPU allocates a step's temporaries per execution, the host
  maps large ones anew and zero-fills them on first touch, and they do not stay in cache); the rate
  jumps with the total, so the model prices a step at the rate of its own (`timemodel.FreshCurve`).

The result is cached per machine, JAX device and mesh shape (`eqsat.parallel.calibration`); a
damaged or foreign cache is measured again with a one-line warning. Importing this module
registers the `parallel-calibrated` cost model, which refuses to run without a cached calibration
(measuring belongs outside an optimizer's clock).
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from eqsat.cost import DeviceSpec, _machine_key, register_cost_model
from eqsat.ir import Graph
from eqsat.parallel.calibration import (
    PRODUCT_KINDS,
    AxisCalibration,
    MeshCalibration,
    MeshCalibrationError,
    calibrated_model,
    calibration_file,
    TimedProduct,
    product_fits,
    read_mesh_calibration,
    write_mesh_calibration,
)
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import Mesh, parse_mesh
from eqsat.parallel.timemodel import LinkSample, fit_link
from jax_backend.measured_cost import device_key
from jax_backend.timing import Decision, bootstrap_median_ci, choose_faster, interleaved_rounds, medians_precise

__all__ = ["CONVS", "COPY_SIDE", "DRIFT_REPEATS", "EXTRA", "FRESH_BUFFERS", "FRESH_REPEATS", "FRESH_TOTALS", "IN_PROGRAM",
           "NOT_TIMED", "PIECES", "PRECISION_CAP", "SIZES", "StepTiming", "calibrate_mesh", "load_mesh_calibration", "parallel_calibrated",
           "probe_products", "step_seconds"]

SIZES: tuple[int, ...] = (16 * 1024, 256 * 1024, 2 * 1024 * 1024)
"""Bytes per device of the timed collectives: latency-bound to bandwidth-bound on a CPU mesh."""
KINDS = ("all-reduce", "all-gather")  # the axis's link is fitted to these
OWN_LINK_KINDS = ("all-to-all",)  # each timed apart and fitted to a link of its own
EXTRA = 4  # more operations in the long chain than in the short one (at least)
MAX_EXTRA = 64
MIN_EXTRA_S = 1e-3  # what the long chain's extra operations should last, at least (up to MAX_EXTRA of them)
MARGINAL_WIDTH = 0.25  # a marginal's 95% interval, at most this fraction of it (within PRECISION_CAP x the budget)
PRECISION_CAP = 4.0  # rounds for precision go on to at most this many times the timing budget...
PRECISION_MIN_ROUNDS = 15  # ...but never fewer rounds than this (a plan's step of a second, 10 plans a round)
MAX_REPEAT = 20  # step calls per sample of the fastest plan, at most
MATMULS: tuple[tuple[int, int], ...] = ((16, 64), (64, 256), (128, 512), (256, 768))  # (m, k): (m, k) @ (k, k) per device
# (batch, channels in, channels out, height = width, stride): a 3x3 SAME convolution per device,
# timed forward and backward as a training step runs it (the project's own conv2d lowering). A half
# fraction of the two-level design over the five (batch 4 / 16, channels 8 / 64, size 8 / 16,
# stride 1 / 2), less its largest shape, so that the fit (`ProductFit`) can tell its terms apart
CONVS: tuple[tuple[int, int, int, int, int], ...] = (
    (4, 8, 8, 8, 1), (4, 8, 8, 16, 2), (4, 8, 64, 8, 2), (4, 8, 64, 16, 1), (4, 64, 8, 8, 2), (4, 64, 8, 16, 1),
    (4, 64, 64, 8, 1), (4, 64, 64, 16, 2), (16, 8, 8, 8, 2), (16, 8, 8, 16, 1), (16, 8, 64, 8, 1), (16, 8, 64, 16, 2),
    (16, 64, 8, 8, 1), (16, 64, 8, 16, 2), (16, 64, 64, 8, 2))
# per device, the square float32 block a transposing copy is timed on (1 MiB: the size of the
# layout copies of the cases' compiled steps, whose largest are 0.1-1 MiB)
COPY_SIDE = 512
# the fresh-bytes probe: this many buffers kept live, at each of these totals of bytes per device (the
# cases' steps allocate 1-335 MB per device, docs/parallel.md). On this 2-core host the rate is flat
# at 0.5-0.66 ns a byte up to 32 MiB and 1.6 from 64 MiB (2026-11-27)
FRESH_BUFFERS = 32
FRESH_TOTALS = tuple(mib * 2**20 for mib in (4, 16, 32, 64, 128))
# each total's rate is the median of this many of its timings: one alone moved 0.59-0.66 ns a byte
# within a minute on a quiet host, and 0.54-0.72 between calibrations
FRESH_REPEATS = 3
PIECES = 8  # compute pieces of the in-program probe, each followed by one collective
# its piece, (m, k) @ (k, k) per device, the smallest matmul probe: what waiting for the slowest
# device costs grows with the compute between collectives (2026-11-26, load 13: 0.1-0.16 ms at
# 0.02 MFLOP pieces, 0.04-0.97 ms at 8, 0.7-3.5 ms at 67), which no per-collective constant
# prices (the drift does, `DRIFT_REPEATS`), so this probe keeps the pieces small; the all-reduce's
# float32 elements
IN_PROGRAM = ((16, 64), 16)
# the drift probe (`_drift`): the in-program all-reduce after pieces of each `MATMULS` size, on the
# largest mesh axis, each the median of this many timings (one alone moved 10-20%)
DRIFT_REPEATS = 3


def _marginal(build: Callable[[int], Callable[[], Any]], budget_s: float) -> float:
    """Seconds one more operation adds: `build(k)` is a thunk running a chain of k of them. The
    long chain has `EXTRA` more, or as many more (to `MAX_EXTRA`) as make the difference last
    `MIN_EXTRA_S` (a 20 us matmul four times over is below the noise of a call on a loaded box);
    past `budget_s` the rounds go on (to `PRECISION_CAP` times it) until the difference's 95%
    interval is at most `MARGINAL_WIDTH` of its median."""
    short, extra = build(1), EXTRA
    long = build(1 + extra)
    pilot, _ = interleaved_rounds([short, long], 3, min_rounds=3, warmup=1)
    rough = float(statistics.median(b - a for a, b in zip(*pilot)))
    if rough < MIN_EXTRA_S:
        extra = min(MAX_EXTRA, max(EXTRA, math.ceil(extra * MIN_EXTRA_S / max(rough, MIN_EXTRA_S / MAX_EXTRA))))
        long = build(1 + extra)
    enough = medians_precise([(0, 1)], MARGINAL_WIDTH, after_s=budget_s)  # the long chain's extra over the short
    times, _ = interleaved_rounds([short, long], 400, budget_s=PRECISION_CAP * budget_s, min_rounds=6, enough=enough)
    return max(float(statistics.median(b - a for a, b in zip(*times))) / extra, 1e-8)


def _mesh_program(jm: Any, body: Callable[[jax.Array], jax.Array], local: tuple[int, ...],
                  dtype: Any = jnp.float32) -> Callable[[], Any]:
    """`body` on every device's own `local` block, as a thunk on a placed argument."""
    names = tuple(jm.axis_names)
    spec = P(names, *([None] * (len(local) - 1)))
    fn = jax.jit(jax.shard_map(body, mesh=jm, in_specs=spec, out_specs=spec, check_vma=False))
    glob = (local[0] * jm.devices.size, *local[1:])
    x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal(glob), dtype), NamedSharding(jm, spec))
    return lambda: fn(x)


def _collective_chain(jm: Any, kind: str, axis: str, n: int, elems: int) -> Callable[[int], Callable[[], Any]]:
    def build(k: int) -> Callable[[], Any]:
        def body(x: jax.Array) -> jax.Array:
            for _ in range(k):  # each waits for the last: XLA can neither merge nor reorder them
                if kind == "all-reduce":
                    x = lax.psum(x, axis) * (1.0 / n)
                elif kind == "all-to-all":  # a layout switch, as a plan's all_to_all is, and back
                    y = lax.all_to_all(x.reshape(n * 8, -1), axis, 1, 0, tiled=True)
                    x = lax.all_to_all(y, axis, 0, 1, tiled=True).reshape(-1)
                else:
                    y = lax.all_gather(x, axis, axis=0, tiled=True)
                    x = lax.dynamic_slice_in_dim(y, lax.axis_index(axis) * x.shape[0], x.shape[0], axis=0)
            return x
        return _mesh_program(jm, body, (elems,))
    return build


def _compute_chain(jm: Any, step: Callable[[jax.Array, int], jax.Array], local: tuple[int, ...]) -> Callable[[int], Callable[[], Any]]:
    def build(k: int) -> Callable[[], Any]:
        def body(x: jax.Array) -> jax.Array:
            for i in range(k):
                x = lax.optimization_barrier(step(x, i))
            return x
        return _mesh_program(jm, body, local)
    return build


def _fresh_curve(jm: Any, budget_s: float) -> tuple[tuple[float, float], ...]:
    """(bytes per device, seconds per byte) of a step's buffers beyond the passes writing them, at
    each of `FRESH_TOTALS`."""
    return tuple((float(total), _fresh_rate(jm, budget_s, total)) for total in FRESH_TOTALS)


def _fresh_rate(jm: Any, budget_s: float, total: int) -> float:
    """Seconds per byte per device of a step's buffers beyond the passes writing them:
    `FRESH_BUFFERS` passes over `total` bytes per device in all, whose results all stay live,
    against the same passes summed into one buffer as they go (the median of `FRESH_REPEATS` timings)."""
    count, nbytes = FRESH_BUFFERS, total // FRESH_BUFFERS

    def kept(x: jax.Array) -> jax.Array:
        ys = [lax.optimization_barrier(x * (0.5 + i) + 1.0) for i in range(count)]
        return functools.reduce(lax.add, ys)

    def reused(x: jax.Array) -> jax.Array:
        acc = x
        for i in range(count):
            acc = lax.optimization_barrier(acc + (x * (0.5 + i) + 1.0))
        return acc

    base, more = _mesh_program(jm, reused, (nbytes // 4,)), _mesh_program(jm, kept, (nbytes // 4,))
    extra = statistics.median(_extra_seconds(base, more, budget_s, 400) for _ in range(FRESH_REPEATS))
    return max(extra, 0.0) / (count * nbytes)


def _in_program(jm: Any, axis: str, budget_s: float, piece: tuple[int, int] = IN_PROGRAM[0]) -> float:
    """Seconds one small all-reduce over `axis` adds between compute pieces: `PIECES` matmuls of
    `piece` (m, k) @ (k, k), each followed by the all-reduce of a few of its elements folded back
    into it (so the next piece waits for it), against the same program with the fold but no
    all-reduce."""
    (m, k), elems = piece, IN_PROGRAM[1]
    step = _matmul_step(k)

    def build(collective: bool) -> Callable[[], Any]:
        def body(x: jax.Array) -> jax.Array:
            for i in range(PIECES):
                x = lax.optimization_barrier(step(x, i))
                head = x.reshape(-1)[:elems]
                x = x + 1e-6 * jnp.sum(lax.psum(head, axis) if collective else head)
            return x
        return _mesh_program(jm, body, (m, k))

    return max(_extra_seconds(build(False), build(True), budget_s, 40) / PIECES, 1e-8)


def _drift(jm: Any, axis: str, pieces: Sequence[float], budget_s: float) -> tuple[tuple[float, float], ...]:
    """(piece seconds, wait seconds) of the `timemodel.DriftCurve`: what the in-program all-reduce
    over `axis` costs after a compute piece of each `MATMULS` size (`pieces`: their timed seconds)
    beyond its cost after the smallest, each the median of `DRIFT_REPEATS` timings."""
    cost = [statistics.median(_in_program(jm, axis, budget_s, piece) for _ in range(DRIFT_REPEATS)) for piece in MATMULS]
    return tuple((t, max(c - cost[0], 0.0)) for t, c in zip(pieces, cost))


def _extra_seconds(base: Callable[[], Any], more: Callable[[], Any], budget_s: float, rounds: int) -> float:
    """The median over interleaved rounds of what `more` takes beyond `base` (one sample of each a round)."""
    times, _ = interleaved_rounds([base, more], rounds, budget_s=budget_s, min_rounds=6)
    return float(statistics.median(b - a for a, b in zip(*times)))


def _matmul_step(k: int) -> Callable[[jax.Array, int], jax.Array]:
    w = jnp.asarray(np.random.default_rng(1).standard_normal((k, k)) / np.sqrt(k), jnp.float32)

    def step(x: jax.Array, i: int) -> jax.Array:
        return jnp.tanh(x @ w)
    return step


def _product_step(product: TimedProduct) -> Callable[[jax.Array, int], jax.Array]:
    """One more forward and backward of `product` (the project's lowering of its op) on an input of
    its first shape: the input's gradient, with the other operands' gradients folded in so that XLA
    keeps them, is the next input."""
    from jax_backend.lower import LOWERINGS

    lower, attrs = LOWERINGS[product.op], dict(product.attrs)
    rng = np.random.default_rng(2)
    rest = [jnp.asarray(rng.standard_normal(s) / np.sqrt(math.prod(s[1:])), jnp.float32) for s in product.shapes[1:]]

    def step(x: jax.Array, i: int) -> jax.Array:
        y, back = jax.vjp(lambda a, *others: lower((a, *others), attrs, None)[0], x, *rest)
        gx, *grads = back(y)
        return jnp.tanh(gx + 1e-3 * sum(jnp.sum(g) for g in grads))
    return step


def probe_products() -> tuple[TimedProduct, ...]:
    """The products `calibrate_mesh` times (seconds 0 until timed): `CONVS`."""
    return tuple(TimedProduct("conv2d", ((b, c_in, hw, hw), (c_out, c_in, 3, 3)),
                              (("stride_h", s), ("stride_w", s), ("pad", 0), ("act", 0)), 0.0)
                 for b, c_in, c_out, hw, s in CONVS)


def calibrate_mesh(mesh: Mesh, budget_s: float = 1.0, say: Callable[[str], None] = lambda _: None) -> MeshCalibration:
    """Measure alpha, beta per axis of `mesh` and the compute rates on JAX's devices (about
    `budget_s` per timed pair: 7 pairs per axis and 6 for compute)."""
    from jax_backend.shard import jax_mesh

    start = time.perf_counter()
    jm = jax_mesh(mesh)
    axes: list[AxisCalibration] = []
    for name, size in zip(mesh.axis_names, mesh.shape):
        samples = []
        for kind in KINDS:
            for nbytes in SIZES:
                elems = nbytes // 4
                if kind == "all-gather":
                    elems //= size  # S is the gathered buffer
                t = _marginal(_collective_chain(jm, kind, name, size, elems), budget_s)
                samples.append(LinkSample(kind, size, float(elems * 4 * (size if kind == "all-gather" else 1)), t))
                say(f"axis {name} ({size}): {kind} of {samples[-1].bytes / 1024:.0f} KiB: {t * 1e6:.1f} us")
        link = fit_link(samples, "ring")
        say(f"axis {name}: alpha {link.alpha * 1e6:.2f} us per ring step, beta {link.beta / 1e9:.2f} GB/s "
            f"(rms error {link.rms_rel_error:.0%})")
        own = []
        for kind in OWN_LINK_KINDS:
            timed = []
            for nbytes in SIZES:  # a chain step is two all-to-alls
                t = _marginal(_collective_chain(jm, kind, name, size, nbytes // 4), budget_s) / 2
                timed.append(LinkSample(kind, size, float(nbytes), t))
                say(f"axis {name} ({size}): {kind} of {nbytes / 1024:.0f} KiB: {t * 1e6:.1f} us")
            own.append((kind, fit_link(timed, "ring")))
            samples.extend(timed)
            say(f"axis {name}: {kind} alpha {own[-1][1].alpha * 1e6:.2f} us per ring step, beta "
                f"{own[-1][1].beta / 1e9:.2f} GB/s")
        inside = _in_program(jm, name, budget_s)
        axes.append(AxisCalibration(size, link, tuple(samples), inside, float(IN_PROGRAM[1] * 4), tuple(own)))
        say(f"axis {name}: a {IN_PROGRAM[1] * 4} B all-reduce between compute pieces: {inside * 1e6:.1f} us "
            f"(beyond alpha-beta: {axes[-1].sync_s * 1e6:.1f} us)")
    rates, matmul = [], []
    for m, k in MATMULS:
        t = _marginal(_compute_chain(jm, _matmul_step(k), (m, k)), budget_s)
        rates.append(2.0 * m * k * k / t)
        matmul.append((2.0 * m * k * k, t))
        say(f"matmul ({m}, {k}) @ ({k}, {k}) per device, all devices busy: {rates[-1] / 1e9:.2f} GFLOP/s")
    widest = mesh.axis_names[max(range(len(mesh.shape)), key=lambda i: mesh.shape[i])]
    drift = _drift(jm, widest, [t for _, t in matmul], budget_s)
    say(f"axis {widest}: an all-reduce waits " + ", ".join(f"{w * 1e6:.0f} us after {p * 1e3:.2f} ms" for p, w in drift)
        + " of compute, beyond its cost between the shortest pieces")
    products = []
    for probe in probe_products():
        t = _marginal(_compute_chain(jm, _product_step(probe), probe.shapes[0]), budget_s)
        products.append(replace(probe, seconds=t))
        say(f"{probe.op} {' * '.join(map(str, probe.shapes))} {dict(probe.attrs)} per device, forward and backward, "
            f"all devices busy: {t * 1e6:.0f} us")
    for fit in product_fits(products):
        names = PRODUCT_KINDS[fit.kind].term_names
        say(f"{fit.kind} fit: " + ", ".join(f"{name} {rate:.3g} s" for name, rate in zip(names, fit.rates)))
    big = 256 * 1024
    t_big = _marginal(_compute_chain(jm, lambda x, i: x * 0.5 + 1.0, (big,)), budget_s)
    bandwidth = 2 * 4 * big / t_big
    launch = _marginal(_compute_chain(jm, lambda x, i: x * 0.5 + 1.0, (8,)), budget_s)
    say(f"elementwise per device: {bandwidth / 1e9:.2f} GB/s; one more kernel: {launch * 1e6:.2f} us")
    # a transposing copy: the block transposed into a new buffer (the + 1.0 keeps XLA from folding
    # two transposes into none; it fuses into the same loop)
    t_copy = _marginal(_compute_chain(jm, lambda x, i: x.T + 1.0, (COPY_SIDE, COPY_SIDE)), budget_s)
    copy_rate = 4 * COPY_SIDE * COPY_SIDE / t_copy
    say(f"transposing copy per device, all devices busy: {copy_rate / 1e9:.2f} GB/s written "
        f"({t_copy * 1e3 / (4 * COPY_SIDE * COPY_SIDE / 1e6):.2f} ms per MB)")
    fresh = _fresh_curve(jm, budget_s)
    say(f"fresh bytes per device, all devices busy ({FRESH_BUFFERS} buffers kept against one reused): "
        + ", ".join(f"{r * 1e9:.2f} ns a byte at {t / 2**20:.0f} MiB" for t, r in fresh))
    peak = max(rates)
    compute = DeviceSpec("cpu-calibrated", peak, peak, bandwidth, launch,
                         f"measured with {mesh.n_devices} devices busy ({device_key()})")
    return MeshCalibration(_machine_key(), device_key(), mesh.shape, tuple(axes), compute, time.perf_counter() - start,
                           tuple(matmul), tuple(products), copy_rate, fresh, drift)


def load_mesh_calibration(mesh: str | Mesh, force: bool = False, measure_if_missing: bool = True,
                          budget_s: float = 1.0, say: Callable[[str], None] = lambda _: None) -> tuple[MeshCalibration, str]:
    """The cached calibration of `mesh`'s shape, or a fresh one (cached), and how it was obtained:
    "cached", "measured" or "re-measured: WHY" (a damaged or foreign cache is never trusted; one
    line on stderr says so)."""
    m = mesh if isinstance(mesh, Mesh) else parse_mesh(mesh)
    path = calibration_file(device_key(), m.shape)
    status = "measured"
    if not force:
        try:
            return read_mesh_calibration(path, _machine_key(), device_key(), m.shape), "cached"
        except MeshCalibrationError as exc:
            if not path.exists() and not measure_if_missing:
                raise MeshCalibrationError(f"no calibration of mesh {'x'.join(map(str, m.shape))} on {device_key()} "
                                           "is cached: run `eqsat parallel calibrate --mesh "
                                           f"{'x'.join(map(str, m.shape))}` first") from None
            if path.exists():
                print(f"eqsat: warning: {exc}; measuring it again", file=sys.stderr)
                status = f"re-measured: {exc}"
    cal = calibrate_mesh(m, budget_s, say)
    try:
        write_mesh_calibration(path, cal)
    except OSError as exc:
        say(f"could not write the mesh calibration cache {path}: {exc}")
    return cal, status


def parallel_calibrated(device: str = "cpu", mesh: str | Mesh = "8", overlap: bool = True, **_: Any) -> ParallelCostModel:
    """Factory registered as `parallel-calibrated`: the training-step model priced from the cached
    calibration of `mesh`'s shape on this machine (`device` is the compute device's label, unused:
    the calibration is of JAX's devices)."""
    cal, _status = load_mesh_calibration(mesh, measure_if_missing=False)
    return calibrated_model(cal, overlap)


register_cost_model("parallel-calibrated", parallel_calibrated)


def _runner(step: Callable[..., Any], args: Sequence[Any]) -> Callable[[], Any]:
    """One training step, waited for."""
    return lambda: jax.block_until_ready(step(*args))


def plan_step(graph: Graph, plan: Graph, mesh: Mesh, values: Mapping[str, np.ndarray]) -> Callable[[], Any]:
    """`plan`'s training step (the jitted gradient program `eqsat parallel` checks,
    `jax_backend.shard.step_program`) on `values` placed as the plan wants, compiled and run once:
    a thunk for the timing policy. TypeError / ValueError: the `shard_map` lowering cannot run it."""
    from jax_backend.shard import shard_plan, step_program

    program = shard_plan(plan, mesh)
    step = step_program(program, [n.attr["name"] for _, n in graph.leaves("weight")])
    args = program.place(values)
    jax.block_until_ready(step(*args))  # compiles it
    return _runner(step, args)


def judge_plan(graph: Graph, plan: Graph, base: Graph, mesh: Mesh, budget_s: float = 8.0) -> Decision:
    """`plan`'s training step against `base`'s, run on JAX's devices in the one keep/discard
    decision (`choose_faster`, as `eqsat.parallel.plan(measure_s=...)` and the decorator decide):
    keep `plan` only when the whole interval of its speedup lies above 1 + the margin."""
    from jax_backend.checks import _scaled_inputs

    values: Mapping[str, np.ndarray] = _scaled_inputs(graph, 0)
    mine, theirs = plan_step(graph, plan, mesh, values), plan_step(graph, base, mesh, values)
    return choose_faster(theirs, [mine], (), budget_s=budget_s).decision


@dataclass(frozen=True)
class StepTiming:
    """One plan's measured training step: the median seconds (each round against its round's
    level, scaled back) and its 95% interval (bootstrap of that median), over `rounds` rounds."""

    seconds: float
    low: float
    high: float
    rounds: int
    # the median of the odd rounds and of the even ones, scaled as `seconds`: two measurements of
    # the same plans in the same run, whose agreement bounds what any model can score against one
    halves: tuple[float, float] = (float("nan"), float("nan"))

    @property
    def rel_width(self) -> float:
        """The interval's width over the median: what a rank between two plans this far apart can trust."""
        return (self.high - self.low) / self.seconds


NOT_TIMED = StepTiming(float("nan"), float("nan"), float("nan"), 0)


def _relative_times(times: Sequence[Sequence[float]], repeat: Sequence[int]) -> tuple[np.ndarray, float]:
    """Each plan's seconds per step over its round's level (the geometric mean of that round's
    plans), plan x round, and the median level: the load of other work drifts between rounds, and
    this cancels it as a paired ratio does (the one policy's reason for interleaving)."""
    rounds = min(len(t) for t in times)
    per_call = np.asarray([t[:rounds] for t in times], dtype=np.float64) / np.asarray(repeat, dtype=np.float64)[:, None]
    level = np.exp(np.log(per_call).mean(axis=0))
    return per_call / level[None, :], float(np.median(level))


def _narrow(repeat: Sequence[int], rel_width: float, after: float) -> Callable[[list[list[float]]], bool]:
    """A stop for `interleaved_rounds`: past the time `after` (perf_counter), every plan's 95%
    interval at most `rel_width` of its median."""
    def enough(times: list[list[float]]) -> bool:
        if time.perf_counter() < after:
            return False
        relative, _ = _relative_times(times, repeat)
        for row in relative:
            low, high = bootstrap_median_ci(row, resamples=1000, seed=len(row))
            if (high - low) / float(np.median(row)) > rel_width:
                return False
        return True
    return enough


def step_seconds(graph: Graph, plans: Sequence[Graph], mesh: Mesh, budget_s: float = 10.0,
                 rounds: int = 40, rel_width: float | None = None) -> list[StepTiming]:
    """Each plan's training step (the jitted gradient program `eqsat parallel` checks,
    `jax_backend.shard.step_program`) timed on JAX's devices, all plans in the same interleaved
    rounds (`interleaved_rounds`: every plan sees the same machine state); `NOT_TIMED` for a plan
    the `shard_map` lowering cannot run (said on stderr). Plans differ by 100x in time and a
    sample's call count is set by the fastest, so each plan's thunk runs its step `repeat` times
    (about as long as the slowest plan's one step, each call waited for: no queue of pending steps
    holds their buffers) and its time is divided by that. `rel_width`: past `budget_s`, rounds go
    on (up to `rounds`, and `PRECISION_CAP` times the budget, but at least `PRECISION_MIN_ROUNDS`)
    until every plan's 95% interval is at most that fraction of its median (a measurement's
    precision, never which plan is ahead)."""
    from jax_backend.checks import _scaled_inputs

    values: Mapping[str, np.ndarray] = _scaled_inputs(graph, 0)
    steps: dict[int, Callable[[], Any]] = {}
    for i, plan in enumerate(plans):
        try:
            steps[i] = plan_step(graph, plan, mesh, values)
        except (TypeError, ValueError) as exc:  # a plan the shard_map lowering cannot run: not timed
            print(f"eqsat: warning: plan {i} does not lower ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                  file=sys.stderr)
    if not steps:
        return [NOT_TIMED] * len(plans)
    single, _ = interleaved_rounds(list(steps.values()), 1, min_rounds=1, warmup=0)  # one sample per plan
    slowest = max(t[0] for t in single)
    repeat = [max(1, min(MAX_REPEAT, round(slowest / max(t[0], 1e-7)))) for t in single]
    thunks = [lambda s=s, r=r: [s() for _ in range(r)][-1] for s, r in zip(steps.values(), repeat)]
    start = time.perf_counter()
    enough = None if rel_width is None else _narrow(repeat, rel_width, start + budget_s)
    times, _ = interleaved_rounds(thunks, rounds, budget_s=budget_s if rel_width is None else PRECISION_CAP * budget_s,
                                  min_rounds=min(5 if rel_width is None else PRECISION_MIN_ROUNDS, rounds), warmup=0,
                                  enough=enough)
    relative, level = _relative_times(times, repeat)
    timed = {i: step_timing(row, level) for i, row in zip(steps, relative)}
    return [timed.get(i, NOT_TIMED) for i in range(len(plans))]


def step_timing(relative: np.ndarray, level: float) -> StepTiming:
    """One plan's rounds (each over its round's level, `_relative_times`) scaled back by the median
    `level`: their median, its 95% interval, and the medians of the odd and of the even rounds."""
    low, high = bootstrap_median_ci(relative.tolist())
    halves = (float(np.median(relative[0::2])) * level, float(np.median(relative[1::2])) * level) \
        if len(relative) > 1 else (float("nan"), float("nan"))
    return StepTiming(float(np.median(relative)) * level, low * level, high * level, len(relative), halves)

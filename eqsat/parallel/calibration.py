"""A mesh calibrated on the devices at hand: alpha and beta per mesh axis and the compute rates of
one device while all of them run, as `eqsat parallel calibrate` measures them
(`jax_backend.parallel_calibrate`), and the cost model built from them.

What is kept: for each axis the fitted link (`timemodel.fit_link` over timed all-reduces and
all-gathers of a few sizes on that axis, ring latency) and the samples it was fitted to; for the
compute a roofline `DeviceSpec` whose peak is the measured matmul rate, bandwidth the measured
elementwise rate and launch the measured cost of one more small kernel, each taken with every
device of the mesh busy (on 8 emulated CPU devices sharing a few cores, one device's share); per
axis also what one small all-reduce costs *inside* a program, between compute pieces (`in_program_s`:
every device waits there for the slowest), whose excess over the link's alpha-beta time is the
axis's `sync` term; after longer pieces the same all-reduce waits longer, as the devices drift apart
while they compute (`drift`: a `timemodel.DriftCurve`, which a plan's report prices each collective with
on the step's order of nodes). A product smaller than the smallest timed matmul is priced at that matmul's
rate (not at its time: a flat floor priced every small product of a case alike). A convolution
has a fit of its own (`ProductFit`) to convs timed forward and backward over a design of shapes
(`products`): XLA's CPU convolutions take a time set by the buffers they move far more than by
their flops (two convs of the same flops, one with 16 output channels and one with 64, can differ
twofold); without a fit, a conv is priced on the matmul curve. An all-to-all has its own
link per axis (`kind_links`), fitted to all-to-alls timed as the plans run them (a layout switch:
split one dimension, concatenate another), as XLA's CPU backend runs it as one chunk per peer.
The cache file is keyed by machine (`eqsat.cost._machine_key`), JAX device and mesh shape; a
damaged one, or one from another machine or device, is refused (`read_mesh_calibration`) and
measured again. This module needs no JAX; the measuring does.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from eqsat import cost as cost_models
from eqsat import ops
from eqsat.atomic_write import atomic_write_text
from eqsat.calibration_cache import read_cached_calibration
from eqsat.errors import EqsatError
from eqsat.parallel.cost import BACKWARD_FACTOR, ParallelCostModel
from eqsat.parallel.mesh import Mesh, MeshAxis
from eqsat.parallel.timemodel import DriftCurve, FreshCurve, LinkFit, LinkSample, TimeModelError, collective_seconds
from eqsat.paths import cache_dir
from eqsat.xla_cost import Curve

__all__ = ["PRODUCT_KINDS", "AxisCalibration", "CalibratedCompute", "MeshCalibration", "MeshCalibrationError", "ProductFit",
           "ProductKind", "TimedProduct", "calibrated_model", "calibration_file", "product_fits",
           "read_mesh_calibration", "write_mesh_calibration"]

# 3: in-program collective cost per axis; a smaller matmul probe. 4: a conv curve, an all-to-all link.
# 5: the transposing-copy rate. 6: the fresh-bytes rate. 7: convs timed by shape (a curve by flops before), the drift.
# 8: the fresh-bytes rate by the bytes a step allocates (one size before)
FORMAT = 8
Shape = tuple[int, ...]


class MeshCalibrationError(EqsatError):
    """No usable mesh calibration: missing, damaged, or measured on another machine, device or mesh."""


@dataclass(frozen=True)
class AxisCalibration:
    """One mesh axis: its size, the fitted link and the timings it was fitted to."""

    size: int
    link: LinkFit
    samples: tuple[LinkSample, ...]
    # one small all-reduce of `in_program_bytes` per device placed between compute pieces: its
    # marginal seconds there (0: not measured)
    in_program_s: float = 0.0
    in_program_bytes: float = 0.0
    # collective kinds timed apart and fitted to a link of their own (all-to-all), from `samples`
    kind_links: tuple[tuple[str, LinkFit], ...] = ()

    @property
    def sync_s(self) -> float:
        """What a collective over this axis costs inside a program beyond the link's alpha-beta time
        (never negative): the wait for the slowest device at the rendezvous."""
        if self.in_program_s <= 0:
            return 0.0
        link = collective_seconds("all-reduce", self.size, self.in_program_bytes, self.link.alpha, self.link.beta, "ring")
        return max(self.in_program_s - link, 0.0)


@dataclass(frozen=True)
class TimedProduct:
    """A product timed as a training step runs it, forward and backward (both operands' gradients),
    with every device busy: its per-device `shapes`, its integer `attrs` (a conv's strides and
    padding), and the seconds of the three."""

    op: str
    shapes: tuple[Shape, ...]
    attrs: tuple[tuple[str, int], ...]
    seconds: float


PROBE_ITEMSIZE = 4  # the probes run in float32
# what a conv's forward and backward is fitted on: the bytes of its input, its output, its patch
# matrix (each output pixel's window of input channels: what the forward and the weight gradient
# multiply, as XLA:CPU's im2col convolutions build it) and its weight, and its forward flops
CONV_TERMS = ("input bytes", "output bytes", "patch bytes", "weight bytes", "flops")


def conv_terms(shapes: Sequence[Shape], attrs: Any, itemsize: int) -> tuple[float, ...]:
    """`CONV_TERMS` of a conv2d on these (per-device) NCHW / OIHW shapes."""
    x, w = tuple(shapes[0]), tuple(shapes[1])
    out = ops.infer_shapes("conv2d", [x, w], attrs)[0]
    patches = x[0] * math.prod(out[2:]) * x[1] * math.prod(w[2:])
    return (float(itemsize * math.prod(x)), float(itemsize * math.prod(out)), float(itemsize * patches),
            float(itemsize * math.prod(w)), ops.flops("conv2d", [x, w], attrs))


@dataclass(frozen=True)
class ProductKind:
    """Products timed apart from the matmul curve because XLA:CPU runs them its own way: which
    they are, and the terms their time is fitted on. Batched matmuls are not among them: timed in a
    chain, attention's per-head products took 3-4 times their price on the matmul curve, but pricing
    them so ranked gpt-block's measured steps worse (docs/parallel.md, stop 45): in a step they cost
    less than in a chain, for a reason not yet found."""

    name: str
    op: str
    min_rank: int  # of the first operand
    terms: Callable[[Sequence[Shape], Any, int], tuple[float, ...]]
    term_names: tuple[str, ...]

    def covers(self, op: str, shapes: Sequence[Shape]) -> bool:
        return op == self.op and len(shapes[0]) >= self.min_rank


PRODUCT_KINDS = {k.name: k for k in (ProductKind("conv", "conv2d", 4, conv_terms, CONV_TERMS),)}


@dataclass(frozen=True)
class ProductFit:
    """Seconds of a product's forward and backward as a sum over its kind's terms, each at a rate of
    its own (seconds per term unit, none negative), fitted to timed products by least squares on
    the relative error."""

    kind: str
    rates: tuple[float, ...]

    def seconds(self, shapes: Sequence[Shape], attrs: Any, itemsize: int) -> float:
        return sum(r * t for r, t in zip(self.rates, PRODUCT_KINDS[self.kind].terms(shapes, attrs, itemsize)))

    @staticmethod
    def fit(kind: str, samples: Sequence[TimedProduct]) -> ProductFit:
        """The non-negative least-squares fit: of the least-squares fits on each subset of the terms,
        the best one with no negative rate (with five terms, trying every subset is exact and quick);
        `ValueError` when the samples are too few, not of this kind, or give every term a negative
        rate."""
        spec = PRODUCT_KINDS[kind]
        n = len(spec.term_names)
        if len(samples) < n or any(s.seconds <= 0 or not spec.covers(s.op, s.shapes) for s in samples):
            raise ValueError(f"a {kind} fit needs {n} or more timed {kind}s, each of positive seconds")
        design = np.array([spec.terms(s.shapes, dict(s.attrs), PROBE_ITEMSIZE) for s in samples])
        design /= np.array([[s.seconds] for s in samples])
        ones = np.ones(len(samples))
        best: tuple[float, tuple[float, ...]] | None = None
        for k in range(1, n + 1):
            for subset in itertools.combinations(range(n), k):
                coef, *_ = np.linalg.lstsq(design[:, subset], ones, rcond=None)
                if np.all(coef >= 0) and np.any(coef > 0):
                    error = float(np.sum((design[:, subset] @ coef - ones) ** 2))
                    rates = [0.0] * n
                    for i, c in zip(subset, coef):
                        rates[i] = float(c)
                    if best is None or error < best[0]:
                        best = (error, tuple(rates))
        if best is None:
            raise ValueError(f"no {kind} fit with non-negative rates")
        return ProductFit(kind, best[1])


@dataclass(frozen=True)
class MeshCalibration:
    machine: str
    device: str  # JAX's device key (`jax_backend.measured_cost.device_key`)
    shape: tuple[int, ...]
    axes: tuple[AxisCalibration, ...]
    compute: cost_models.DeviceSpec  # per device, with every device of the mesh busy
    seconds: float  # how long measuring took
    matmul: tuple[tuple[float, float], ...] = ()  # (flops, seconds) of the timed matmuls: the efficiency curve
    # the products timed apart from the matmul curve (`PRODUCT_KINDS`): convs
    products: tuple[TimedProduct, ...] = ()
    # bytes per second one device writes in a transposing copy with every device busy: what the
    # layout copies of a compiled step (`cost.LAYOUT_COPIES`) are priced at (0: not measured)
    copy_rate: float = 0.0
    # (bytes a step allocates per device, seconds per byte beyond the passes writing them), with every
    # device busy: the `FreshCurve` the buffers of a step (`memory.node_allocated`) are priced at
    # (none: not measured)
    fresh: tuple[tuple[float, float], ...] = ()
    # (seconds of a compute piece, seconds an all-reduce after it waits beyond one after the
    # shortest piece), on the widest axis: the `DriftCurve` a plan's report prices each collective with
    drift: tuple[tuple[float, float], ...] = ()

    def fresh_curve(self) -> FreshCurve | None:
        return FreshCurve(tuple(t for t, _ in self.fresh), tuple(r for _, r in self.fresh)) if self.fresh else None

    def drift_curve(self) -> DriftCurve | None:
        return DriftCurve(tuple(p for p, _ in self.drift), tuple(w for _, w in self.drift)) if self.drift else None

    def mesh(self, sync: bool = True) -> Mesh:
        """The planner's mesh: this shape, each axis with its own fitted link and ring latency, and
        (`sync`) its measured in-program cost per collective beyond the link's."""
        axes = tuple(MeshAxis(f"a{i}", a.size, a.link.beta, a.link.alpha, "ring", a.sync_s if sync else 0.0,
                              tuple((k, fit.alpha, fit.beta) for k, fit in a.kind_links))
                     for i, a in enumerate(self.axes))
        return Mesh(f"calibrated[{'x'.join(map(str, self.shape))}]", axes, self.compute.name)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "machine": self.machine, "device": self.device, "shape": list(self.shape),
                "axes": [{"size": a.size, "link": asdict(a.link), "samples": [asdict(s) for s in a.samples],
                          "in_program": {"seconds": a.in_program_s, "bytes": a.in_program_bytes},
                          "kind_links": {k: asdict(fit) for k, fit in a.kind_links}}
                         for a in self.axes],
                "compute": asdict(self.compute), "seconds": self.seconds, "matmul": [list(p) for p in self.matmul],
                "products": [asdict(p) for p in self.products], "copy_rate": self.copy_rate, "fresh": [list(p) for p in self.fresh],
                "drift": [list(p) for p in self.drift]}

    @staticmethod
    def from_json(data: Any) -> MeshCalibration:
        """The calibration `to_json` wrote; `MeshCalibrationError` for anything else (a cache is only a file)."""
        try:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a mesh calibration of this format")
            shape = tuple(_whole(s) for s in data["shape"])
            axes = tuple(AxisCalibration(_whole(a["size"]), _link(a["link"]),
                                         tuple(LinkSample(str(s["kind"]), _whole(s["n"]), _number(s["bytes"]),
                                                          _number(s["seconds"])) for s in a["samples"]),
                                         _number(a["in_program"]["seconds"]), _number(a["in_program"]["bytes"]),
                                         tuple((str(k), _link(fit)) for k, fit in a["kind_links"].items()))
                         for a in data["axes"])
            spec = data["compute"]
            compute = cost_models.DeviceSpec(str(spec["name"]), _number(spec["peak_flops_fp32"]),
                                             _number(spec["peak_flops_bf16"]), _number(spec["bandwidth"]),
                                             _number(spec["launch_s"]), str(spec.get("source", "")))
            matmul = tuple((_number(f), _number(t)) for f, t in data["matmul"])
            products = tuple(TimedProduct(str(p["op"]), tuple(tuple(_whole(d) for d in s) for s in p["shapes"]),
                                          tuple((str(k), int(v)) for k, v in p["attrs"]), _number(p["seconds"]))
                             for p in data["products"])
            cal = MeshCalibration(str(data["machine"]), str(data["device"]), shape, axes, compute,
                                  _number(data["seconds"]), matmul, products, _number(data["copy_rate"]),
                                  tuple((_number(t), _number(r)) for t, r in data["fresh"]),
                                  tuple((_number(p), _number(w)) for p, w in data["drift"]))
            Curve.fit(matmul)  # at least two points, all positive
            product_fits(products)
            cal.drift_curve()
            cal.fresh_curve()
        except (KeyError, TypeError, ValueError, AttributeError, EqsatError, TimeModelError) as exc:
            raise MeshCalibrationError(f"damaged mesh calibration ({type(exc).__name__}: {exc})") from None
        if tuple(a.size for a in axes) != shape or not shape:
            raise MeshCalibrationError("damaged mesh calibration (its axes do not match its shape)")
        links = [fit for a in axes for fit in (a.link, *(f for _, f in a.kind_links))]
        rates = (compute.peak_flops_fp32, compute.bandwidth, compute.launch_s, *(fit.beta for fit in links))
        negative = (cal.copy_rate, *(x for a in axes for x in (a.in_program_s, a.in_program_bytes)),
                    *(fit.alpha for fit in links))
        if not all(r > 0 for r in rates) or any(x < 0 for x in negative):
            raise MeshCalibrationError("damaged mesh calibration (a rate is not positive)")
        return cal


def _link(data: Any) -> LinkFit:
    return LinkFit(_number(data["alpha"]), _number(data["beta"]), _number(data["rms_rel_error"]), _whole(data["samples"]))


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite number")
    return float(v)


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{v!r} is not a positive whole number")
    return v


def calibration_file(device: str, shape: Sequence[int]) -> Path:
    """The cache file of a mesh shape on a JAX device (its machine is checked inside)."""
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in device)
    return cache_dir("parallel") / f"{safe}-{'x'.join(map(str, shape))}.json"


def read_mesh_calibration(path: Path, machine: str, device: str, shape: Sequence[int]) -> MeshCalibration:
    """The cached calibration at `path` if it is whole and from this machine, device and mesh shape;
    otherwise `MeshCalibrationError` saying why."""
    return read_cached_calibration(path, MeshCalibrationError, MeshCalibration.from_json,
                                   lambda cal: (cal.machine, cal.device, "x".join(map(str, cal.shape))),
                                   (machine, device, "x".join(map(str, shape))), label="mesh calibration cache",
                                   missing=f"no mesh calibration at {path}: run `eqsat parallel calibrate`",
                                   where="machine, device or mesh")


def write_mesh_calibration(path: Path, cal: MeshCalibration) -> None:
    atomic_write_text(path, json.dumps(cal.to_json(), indent=1))


@dataclass(frozen=True)
class CalibratedCompute:
    """Per-device compute as measured with every device busy: a product of a kind timed apart
    (`fits`: convs) takes a third of its fitted forward and backward (the step
    prices a product as 1 + BACKWARD_FACTOR forwards); any other matmul, or one with no fit, the
    time the measured matmul curve gives for its flops (`eqsat.xla_cost.Curve`: a bigger product
    gets a lower rate once the devices share caches; below the smallest timed product, that
    product's rate), or its memory time if longer; every other op is the roofline at the measured
    rates."""

    spec: cost_models.DeviceSpec
    matmul: Curve
    name: str = "calibrated-compute"
    fits: tuple[ProductFit, ...] = ()

    @property
    def device(self) -> str:
        return self.spec.name

    def op_cost(self, op: str, attrs: Any, input_shapes: Sequence[Shape]) -> float:
        roofline = cost_models.RooflineModel(self.spec)
        if not ops.op_spec(op).contraction:
            return roofline.op_cost(op, attrs, input_shapes)
        shapes = [tuple(s) for s in input_shapes]
        for fit in self.fits:
            if PRODUCT_KINDS[fit.kind].covers(op, shapes):
                return fit.seconds(shapes, attrs, roofline.itemsize) / (1 + BACKWARD_FACTOR) + self.spec.launch_s
        memory = ops.bytes_moved(op, shapes, attrs, roofline.itemsize) / self.spec.bandwidth
        return max(_product_seconds(self.matmul, ops.flops(op, shapes, attrs)), memory) + self.spec.launch_s


def product_fits(products: Sequence[TimedProduct]) -> tuple[ProductFit, ...]:
    """A fit for each kind of product timed (`ValueError` for a product of no kind, or too few of one)."""
    kinds = [next((k.name for k in PRODUCT_KINDS.values() if k.covers(p.op, p.shapes)), None) for p in products]
    if None in kinds:
        raise ValueError("a timed product of no kind the calibration fits")
    return tuple(ProductFit.fit(kind, [p for p, k in zip(products, kinds) if k == kind])
                 for kind in PRODUCT_KINDS if kind in kinds)


def _product_seconds(curve: Curve, flops: float) -> float:
    """The curve's seconds, but linear below its smallest point (`Curve` is flat there: a call
    costs at least the smallest one's time, which for a product of a few kFLOP against an 8
    MFLOP probe was a 1 ms floor on every small matmul; the per-kernel cost is `launch_s`)."""
    smallest, its_seconds = curve.flops[0], curve.seconds[0]
    return curve.seconds_for(flops) if flops >= smallest else its_seconds * flops / smallest


def calibrated_model(cal: MeshCalibration, overlap: bool = True, sync: bool = True, copies: bool = True) -> ParallelCostModel:
    """The training-step model priced with the calibration: the fitted links per axis (ring
    latency; with `sync`, plus each axis's measured in-program cost per collective beyond it, and in a
    plan's report what each collective waits after the compute before it, `drift`), the measured
    compute (`CalibratedCompute`), collectives hidden behind independent compute in a plan's
    report (`overlap`), the compiled step's layout copies at the measured transposing-copy rate
    (`copies`; without, none are priced), the buffers a step allocates at the measured fresh-bytes rate
    of their total (`FreshCurve`; the ILP's node-local prices at its lower level)."""
    fresh = cal.fresh_curve()
    model = ParallelCostModel(cal.mesh(sync), CalibratedCompute(cal.compute, Curve.fit(cal.matmul), fits=product_fits(cal.products)),
                              "parallel-calibrated", overlap, copy_rate=cal.copy_rate or None,
                              fresh_rate=fresh.below if fresh else 0.0, fresh_curve=fresh,
                              drift=cal.drift_curve() if sync else None)
    return model if copies else replace(model, layout_copies=False)

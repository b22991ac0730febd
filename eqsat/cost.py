"""Cost models: (op, attrs, input shapes) → seconds on a named device.

The default is a roofline: an op takes max(flops / peak, bytes / bandwidth) plus a fixed launch
cost, so small ops are launch-bound (which is what makes fusing matmuls pay) and big ones are
compute- or memory-bound. Leaves and views cost nothing. Models are looked up by name in
`COST_MODEL_FACTORIES` so a measured model (from the JAX backend) can be added beside it.

Device numbers (`DEVICES`), and where they come from:

- `h100`: NVIDIA H100 SXM5 datasheet: 67 TFLOP/s FP32 (non-tensor-core), 989 TFLOP/s dense
  BF16 tensor core, 3.35 TB/s HBM3. The launch cost (5 µs) is an assumption: the usual
  kernel-launch plus XLA dispatch gap between small fused kernels.
- `h200`: NVIDIA H200 SXM datasheet: same compute as H100 SXM, 4.8 TB/s HBM3e; same launch cost.
- `cpu`: measured on this machine (`calibrate_cpu`: a numpy matmul for flops, a large copy for
  bandwidth, a tiny numpy op for the per-op overhead), cached on disk per machine and never
  measured at import time. `cpu-nominal` gives fixed, machine-independent numbers for tests.

Peak numbers are what the chip can do, not what an op gets; the model is for ranking graphs, not
for predicting wall time.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from eqsat import ops
from eqsat.atomic_write import atomic_write_text
from eqsat.errors import EqsatError
from eqsat.paths import cache_dir
from eqsat.timer import best_of

if TYPE_CHECKING:
    from eqsat.ir import Graph

Shape = tuple[int, ...]

__all__ = [
    "DeviceSpec", "DEVICES", "CostModel", "RooflineModel", "COST_MODEL_FACTORIES", "cost_model", "register_cost_model",
    "graph_cost", "weight_only_nodes", "device_spec", "calibrate_cpu", "UnknownCostModelError",
    "Conventions", "CONVENTIONS", "conventions", "UnknownConventionsError", "ZeroPriced", "typed_op_cost", "OpKey", "op_key",
    "LAUNCH_SENSITIVITY_US", "launch_sensitivity", "predicted_speedup",
]


class UnknownCostModelError(EqsatError):
    """A cost model or device name that no table defines."""


class UnknownConventionsError(EqsatError):
    """A `--conventions` name that `CONVENTIONS` does not define."""


@dataclass(frozen=True)
class DeviceSpec:
    """What a roofline needs to know about a device. Flops in FLOP/s, bandwidth in bytes/s."""

    name: str
    peak_flops_fp32: float
    peak_flops_bf16: float
    bandwidth: float
    launch_s: float
    source: str = ""

    def peak_flops(self, dtype: str) -> float:
        if dtype in ("bfloat16", "bf16", "float16", "fp16"):
            return self.peak_flops_bf16
        return self.peak_flops_fp32


DEVICES: Mapping[str, DeviceSpec] = MappingProxyType({
    "h100": DeviceSpec("h100", 67e12, 989e12, 3.35e12, 5e-6, "NVIDIA H100 SXM5 datasheet; launch cost assumed"),
    "h200": DeviceSpec("h200", 67e12, 989e12, 4.8e12, 5e-6, "NVIDIA H200 SXM datasheet; launch cost assumed"),
    "cpu-nominal": DeviceSpec("cpu-nominal", 100e9, 100e9, 20e9, 2e-6,
                              "fixed, machine-independent CPU numbers (for tests and reproducible costs)"),
})
"""Fixed device specs; `cpu` is not here because it is measured (see `device_spec`)."""


# --- CPU calibration --------------------------------------------------------------------------

def _machine_key() -> str:
    """Identifies this machine and numpy build, so a cache copied elsewhere is not trusted."""
    import numpy as np

    ident = "|".join([platform.node(), platform.machine(), platform.processor(), str(os.cpu_count()),
                      np.__version__])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _measure_cpu() -> DeviceSpec:
    """About half a second: a 512³ fp32 matmul, a 32 MiB copy and a one-element add, best of a few."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 512
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=out)  # warm up BLAS threads
    matmul_s = best_of(lambda: np.matmul(a, b, out=out), 5)
    src = np.ones(8 * 1024 * 1024, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy_s = best_of(lambda: np.copyto(dst, src), 5)
    one = np.ones(1, dtype=np.float32)
    tiny_s = best_of(lambda: [np.add(one, one) for _ in range(100)], 5) / 100
    return DeviceSpec(
        name="cpu",
        peak_flops_fp32=2.0 * n**3 / matmul_s,
        peak_flops_bf16=2.0 * n**3 / matmul_s,
        bandwidth=2.0 * src.nbytes / copy_s,  # a copy reads and writes every byte
        launch_s=tiny_s,
        source=f"measured on this machine ({platform.node()}) with numpy",
    )


def _plausible(spec: DeviceSpec) -> bool:
    """Every rate and the launch cost a finite positive number (a cache is only a file)."""
    numbers = (spec.peak_flops_fp32, spec.peak_flops_bf16, spec.bandwidth, spec.launch_s)
    return isinstance(spec.name, str) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf") for x in numbers)


def calibrate_cpu(force: bool = False) -> DeviceSpec:
    """The CPU's spec from the on-disk cache, measuring (< 2 s) and caching it if absent or `force`."""
    path = cache_dir() / f"cpu-{_machine_key()}.json"
    if not force and path.exists():
        try:
            cached = DeviceSpec(**json.loads(path.read_text(encoding="utf-8")))
            if _plausible(cached):
                return cached
        except (OSError, ValueError, TypeError, RecursionError):
            pass
        # a corrupt cache (unreadable, or valid JSON with zeros, [] or null) is re-measured
    spec = _measure_cpu()
    try:
        atomic_write_text(path, json.dumps(asdict(spec)))
    except OSError:
        pass  # a read-only home still gets a (re-measured) spec
    return spec


def device_spec(device: str) -> DeviceSpec:
    """The spec of a named device; `cpu` is measured once per machine and cached."""
    if device == "cpu":
        return calibrate_cpu()
    try:
        return DEVICES[device]
    except KeyError:
        known = ", ".join(sorted([*DEVICES, "cpu"]))
        raise UnknownCostModelError(f"unknown device '{device}'; known devices: {known}") from None


# --- models -----------------------------------------------------------------------------------

class CostModel(Protocol):
    """Anything that prices one op application in seconds."""

    @property
    def name(self) -> str: ...

    @property
    def device(self) -> str: ...

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float: ...


def typed_op_cost(model: CostModel, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape],
                  input_dtypes: Sequence[str]) -> float:
    """The one way to price an op at its operands' dtypes: a model with `op_cost_typed` (the measured
    model: XLA:CPU multiplies bfloat16 at half float32's speed, so shapes alone misprice a mixed-
    precision plan) prices them; any other prices the shapes (float32 work). All-float32 operands
    always go to `op_cost`, so float32 programs are priced as before."""
    typed = getattr(model, "op_cost_typed", None)
    if typed is None or all(d == ops.DEFAULT_DTYPE for d in input_dtypes):
        return float(model.op_cost(op, attrs, input_shapes))
    return float(typed(op, attrs, input_shapes, input_dtypes))


@dataclass(frozen=True)
class RooflineModel:
    """max(flops / peak, bytes / bandwidth) + launch; leaves and views cost 0."""

    spec: DeviceSpec
    dtype: str = "float32"
    name: str = "roofline"

    @property
    def device(self) -> str:
        return self.spec.name

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype in ("bfloat16", "bf16", "float16", "fp16") else 4

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        shapes = [tuple(s) for s in input_shapes]
        work = ops.flops(op, shapes, attrs)
        traffic = ops.bytes_moved(op, shapes, attrs, self.itemsize)
        return max(work / self.spec.peak_flops(self.dtype), traffic / self.spec.bandwidth) + self.spec.launch_s


def _roofline(device: str, launch_s: float | None = None, **options: Any) -> CostModel:
    """`launch_s`: the per-kernel launch cost instead of the device's (the launch-sensitivity columns)."""
    spec = device_spec(device)
    return RooflineModel(spec if launch_s is None else replace(spec, launch_s=launch_s), **options)


_FACTORIES: dict[str, Callable[..., CostModel]] = {"roofline": _roofline}

COST_MODEL_FACTORIES: Mapping[str, Callable[..., CostModel]] = MappingProxyType(_FACTORIES)
"""Cost model name → factory(device, **options): "roofline" here; other modules add theirs with
`register_cost_model`: importing `eqsat.parallel.cost` adds "parallel" (a training step on a
mesh), `import jax_backend` adds "measured" (timed with JAX)."""


def register_cost_model(name: str, factory: Callable[..., CostModel]) -> None:
    """Make `cost_model(name)` build models with `factory`; the core never imports a backend, so a
    backend registers its cost models itself. Registering one name twice with another factory is
    an error (two models under one name)."""
    known = _FACTORIES.get(name)
    if known is not None and known is not factory:
        raise EqsatError(f"cost model {name!r} is already registered")
    _FACTORIES[name] = factory


def cost_model(name: str = "roofline", device: str = "cpu", **options: Any) -> CostModel:
    """The named cost model for `device`; unknown names raise with the list of known ones."""
    try:
        factory = COST_MODEL_FACTORIES[name]
    except KeyError:
        hints = {"measured": "; 'measured' needs the JAX backend (import jax_backend)",
                 "parallel": "; 'parallel' needs eqsat.parallel.cost (import it)"}
        hint = hints.get(name, "")
        raise UnknownCostModelError(
            f"unknown cost model '{name}'; known cost models: {', '.join(sorted(COST_MODEL_FACTORIES))}{hint}"
        ) from None
    return factory(device, **options)


# --- conventions --------------------------------------------------------------------------------

type OpKey = tuple[str, tuple[tuple[str, Any], ...], tuple[tuple[int, ...], ...]]


def op_key(op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Sequence[int]]) -> OpKey:
    """(op, attributes, input shapes) as one hashable value: what a cost model prices."""
    return (op, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())),
            tuple(tuple(int(d) for d in s) for s in input_shapes))


@dataclass(frozen=True)
class ZeroPriced:
    """`base` with some ops priced at 0 and the rest as `base` prices them (at the operands' dtypes
    too): by name (`free_ops`, a convention such as free transposes, not a measurement) or exactly
    (`free_keys`: the ops every extraction choice shares, `eqsat.pipeline.fixed_op_keys`, so a model
    that times each op times only those a choice depends on)."""

    base: CostModel
    free_ops: frozenset[str] = frozenset()
    free_keys: frozenset[OpKey] = frozenset()

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def device(self) -> str:
        return self.base.device

    def _free(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> bool:
        return op in self.free_ops or (bool(self.free_keys) and op_key(op, attrs, input_shapes) in self.free_keys)

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        return 0.0 if self._free(op, attrs, input_shapes) else self.base.op_cost(op, attrs, input_shapes)

    def op_cost_typed(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape],
                      input_dtypes: Sequence[str]) -> float:
        if self._free(op, attrs, input_shapes):
            return 0.0
        return typed_op_cost(self.base, op, attrs, input_shapes, input_dtypes)


@dataclass(frozen=True)
class Conventions:
    """How extraction counts what a cost model does not measure. `fold_weights`: ops computed from
    weights alone cost nothing (precomputed once, as `measure_pair` runs them); `free_ops`: ops
    priced at 0 whatever the model says."""

    name: str
    fold_weights: bool
    free_ops: frozenset[str] = frozenset()
    description: str = ""

    def apply(self, model: CostModel) -> CostModel:
        """`model` under these conventions (itself when nothing is free); a model that prices in
        context makes its own copy (`with_free_ops`), so its context pricing sees the convention too."""
        if not self.free_ops:
            return model
        own = getattr(model, "with_free_ops", None)
        return own(self.free_ops) if own is not None else ZeroPriced(model, free_ops=self.free_ops)


CONVENTIONS: Mapping[str, Conventions] = MappingProxyType({
    "ours": Conventions("ours", fold_weights=True, description="weight-only ops folded (cost 0), every op priced"),
    "tensat": Conventions("tensat", fold_weights=False, free_ops=frozenset({"transpose"}),
                          description="Tensat's extraction: weight-only ops charged in full (its "
                                      "all_weight_discount is 1.0), transposes free"),
})
"""Named conventions (`eqsat optimize --conventions`); "ours" is the default."""


def conventions(name: str) -> Conventions:
    """The named conventions; an unknown name is one error line listing the known ones."""
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise UnknownConventionsError(
            f"unknown conventions {name!r}; known conventions: {', '.join(CONVENTIONS)}") from None


def weight_only_nodes(graph: Graph) -> frozenset[int]:
    """Nodes computed from weights alone (e.g. the concat of two matmuls' weights): they can be
    computed once when the weights are loaded, so they are no part of a run's cost (as in Tensat).
    The weights themselves are among them (`ops.weight_derived`)."""
    return ops.weight_derived((i, node.op, [v.node for v in node.inputs]) for i, node in enumerate(graph.nodes))


def graph_cost(graph: Graph, model: CostModel, fold_weights: bool = True) -> float:
    """Sum of the op costs of the nodes the outputs depend on (leaves cost nothing).

    With `fold_weights`, nodes computed from weights alone cost 0 too (see `weight_only_nodes`),
    as in `TensorEGraph.serialize`. A model that prices nodes in context (`eqsat.xla_cost`) prices
    the whole graph itself (`price_graph`), the way it prices an e-graph.
    """
    live = graph.live()
    own = getattr(model, "price_graph", None)
    if own is not None:
        return float(own(live, fold_weights))
    skip = weight_only_nodes(live) if fold_weights else frozenset()
    return float(sum(typed_op_cost(model, n.op, n.attr, [live.shape(v) for v in n.inputs],
                                   [live.dtype(v) for v in n.inputs])
                     for i, n in enumerate(live.nodes) if i not in skip and not ops.OPS[n.op].is_leaf))


def predicted_speedup(original: Graph, plan: Graph, model: CostModel) -> float | None:
    """`model`'s predicted speedup of `plan` over `original` (None: the plan costs nothing). A model
    that knows what a whole call costs (`program_seconds`: the xla model's per-call floor) prices
    each program with it; any other sums its ops (`graph_cost`)."""
    whole = getattr(model, "program_seconds", None)
    before, after = (float(whole(g.live())) if whole is not None else graph_cost(g, model) for g in (original, plan))
    return before / after if after > 0 else None


LAUNCH_SENSITIVITY_US: tuple[int, ...] = (0, 1, 5)


def launch_sensitivity(original: Graph, plan: Graph, device: str) -> dict[str, float] | None:
    """`plan`'s predicted speedup (%) under the roofline for `device` with each launch cost of
    `LAUNCH_SENSITIVITY_US` µs per kernel (None: no roofline for this device): how much of a
    predicted gain is the assumed launch cost."""
    out: dict[str, float] = {}
    for us in LAUNCH_SENSITIVITY_US:
        try:
            model = cost_model("roofline", device=device, launch_s=us * 1e-6)
        except EqsatError:
            return None
        after = graph_cost(plan, model)
        out[str(us)] = 100.0 * (graph_cost(original, model) / after - 1.0) if after > 0 else float("nan")
    return out

"""Measured op costs (TASO's approach, on JAX): time each distinct (op, attrs, shapes) alone.

Each op is jitted on its own, warmed up, and timed as the minimum over samples of repeated calls
(each sample at least a millisecond, so microsecond ops are not timer noise), minus the dispatch
cost of an empty jitted call (paid once per program, not per op); results are cached on disk
keyed by device kind, JAX version and timing method, so a machine measures each op once.

Fusion-aware: XLA fuses elementwise ops into the loop of their producer, so an elementwise op in a
real program costs its arithmetic (and any extra operand it reads), not a full pass over memory.
Timing it alone would overstate it by a whole read+write of its input. For those ops we time the
*marginal* cost instead: a fused chain `neg → op` minus the chain `neg` alone, which is what the op
adds once XLA has fused it. Views (reshape, slice, split) move nothing under XLA and cost 0.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from eqsat import ops
from eqsat.atomic_write import atomic_write_text
from eqsat.cost import register_cost_model
from eqsat.errors import EqsatError
from eqsat.paths import cache_dir
from eqsat.timer import sample_seconds
from jax_backend.timing import calls_per_sample

Shape = tuple[int, ...]

__all__ = ["FUSIBLE_OPS", "MeasuredModel", "PerCallModel", "TimedOrEstimated",
           "check_measuring_device", "device_key", "measured_model", "merge_model",
           "time_callable"]

FUSIBLE_OPS: frozenset[str] = frozenset(op for op, spec in ops.OPS.items() if spec.fusible)
"""Ops XLA fuses into their producer's loop (`OpSpec.fusible`): charged their marginal cost inside a
fused chain."""

_FLOOR_S = 1e-8
_METHOD = "v3"  # how ops are timed (batched samples, min, dispatch subtracted): part of the cache key
_MIN_SAMPLE_S = 1e-3  # short ops are repeated within one sample so timer and dispatch noise averages out


def device_key() -> str:
    """Which machine and JAX a measurement belongs to."""
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform).replace(" ", "_").replace("/", "_")
    return f"{dev.platform}-{kind}-jax{jax.__version__}"


def _cached_timings(path: Path) -> dict[str, float]:
    """The usable entries of a timing cache file: a finite positive number of seconds per key.
    Anything else (unreadable, not an object, zeros, null, lists) is dropped and re-measured."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")}


def _default_cache_dir() -> Path:
    return cache_dir("measured")


def time_callable(fn: Callable[..., Any], args: Sequence[Any], repeats: int = 15, warmup: int = 3,
                  statistic: str = "median", min_sample_s: float = 0.0) -> float:
    """Seconds per call of `fn(*args)` (a jitted function) after warm-up, blocking on the result:
    the median (or min) over `repeats` samples, each of enough calls to last `min_sample_s`.

    Runs eagerly even when called while an outer function is being traced (the decorator builds
    its e-graph at trace time): there a jitted call would be staged into the outer trace and the
    "timing" would measure tracing, not execution."""
    with jax.ensure_compile_time_eval():
        return _time_eagerly(fn, args, repeats, warmup, statistic, min_sample_s)


def _time_eagerly(fn: Callable[..., Any], args: Sequence[Any], repeats: int, warmup: int, statistic: str,
                  min_sample_s: float) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    def call() -> Any:
        return fn(*args)

    calls = 1
    if min_sample_s > 0:
        calls = calls_per_sample(sample_seconds(call, 1, jax.block_until_ready), min_sample_s)
    samples = [sample_seconds(call, calls, jax.block_until_ready) for _ in range(repeats)]
    return min(samples) if statistic == "min" else statistics.median(samples)


def dispatch_overhead(n_args: int = 1, repeats: int = 15) -> float:
    """Seconds one call of a jitted function costs beyond its work (dispatch, argument handling,
    blocking): paid once per program, not once per op, so it is subtracted from each op's time."""
    fn = jax.jit(lambda *xs: xs[0])
    args = [jnp.zeros((1,), jnp.float32)] * max(n_args, 1)
    return time_callable(fn, args, repeats, 3, statistic="min", min_sample_s=1e-3)


def _key(op: str, attrs: Mapping[str, Any], shapes: Sequence[Shape]) -> str:
    norm = ops.op_spec(op).normalize_attrs(attrs)
    attr_text = ",".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in sorted(norm.items()))
    return f"{op}|{attr_text}|{';'.join('x'.join(map(str, s)) for s in shapes)}"


def _random_args(op: str, shapes: Sequence[Shape], seed: int, dtypes: Sequence[str] = ()) -> list[jax.Array]:
    """Random operands of `op` (float32, or `dtypes` where given: a bfloat16 matmul is timed in bfloat16)."""
    rng = np.random.default_rng(seed)
    args: list[np.ndarray] = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    spec = ops.OPS[op]
    if "float" not in spec.operand_kinds:  # integer / boolean ops: int32 values (timed as int32, whatever the dtype)
        args = [rng.integers(-4, 4, s).astype(np.int32) for s in shapes]
    if spec.result_dtype == "select" and args:  # the predicate
        args[0] = args[0] > 0
    if spec.positive_domain:
        args = [np.abs(a) + np.float32(0.5) for a in args]
    if op == "batchnorm":
        args[4] = np.abs(args[4]) + np.float32(0.5)
    if dtypes:
        args = [a > 0 if ops.dtype_kind(d) == "bool" else a.astype(ops.numpy_dtype(d)) for a, d in zip(args, dtypes)]
    return [jnp.asarray(a) for a in args]


@dataclass
class MeasuredModel:
    """CostModel whose op costs are measured on the current JAX device (cached in memory and on disk)."""

    device: str = "current"
    repeats: int = 5  # samples per op (min taken; each >= 1 ms): 15 cost a cold first call ~2/3 of its op timing
    warmup: int = 2
    cache_dir: Path = field(default_factory=_default_cache_dir)
    name: str = "measured"
    times_ops: ClassVar[bool] = True  # each op shape costs a compile and a timing: price only where it matters
    _table: dict[str, float] = field(default_factory=dict, repr=False)
    _loaded: bool = field(default=False, repr=False)
    _dirty: int = field(default=0, repr=False)
    _overhead: dict[int, float] = field(default_factory=dict, repr=False)
    _producer: dict[tuple[Shape, str], float] = field(default_factory=dict, repr=False)  # the `neg` chain alone, per shape and dtype

    def __post_init__(self) -> None:
        self.cache_dir = Path(self.cache_dir)  # a str from a user or a config file is fine too

    @property
    def cache_file(self) -> Path:
        return self.cache_dir / f"{device_key()}-{_METHOD}.json"

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        self._table.update(_cached_timings(self.cache_file))

    def save(self) -> None:
        """Write the table to disk (merged with what other processes wrote meanwhile)."""
        if not self._dirty:
            return
        try:
            merged = _cached_timings(self.cache_file)
            merged.update(self._table)
            atomic_write_text(self.cache_file, json.dumps(merged, indent=0, sort_keys=True))
            self._dirty = 0
        except OSError:
            pass  # a cache that cannot be written only costs re-measuring

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        key = _key(op, attrs, shapes)
        self._load()
        if key not in self._table:
            with jax.ensure_compile_time_eval():  # concrete arrays even while an outer function traces
                self._table[key] = self._measure(op, attrs, shapes)
            self._dirty += 1
            self.save()  # at once: a measurement takes far longer than the write, and no caller saves at exit
        return self._table[key]

    def op_cost_typed(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape],
                      input_dtypes: Sequence[str]) -> float:
        """`op_cost` with the operands in `input_dtypes` (`eqsat.cost.typed_op_cost`): XLA:CPU runs a
        bfloat16 matmul about twice as long as a float32 one, and a conversion is an op of its own.
        Keyed apart from the float32 entries, which keep their keys; operands that are float32,
        integer or boolean only (masks, index math) are priced as before (`_random_args`)."""
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        if all(d == ops.DEFAULT_DTYPE or ops.dtype_kind(d) != "float" for d in input_dtypes):
            return self.op_cost(op, attrs, input_shapes)
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        dtypes = tuple(str(d) for d in input_dtypes)
        key = _key(op, attrs, shapes) + "|" + ",".join(dtypes)
        self._load()
        if key not in self._table:
            with jax.ensure_compile_time_eval():
                self._table[key] = self._measure(op, attrs, shapes, dtypes)
            self._dirty += 1
            self.save()
        return self._table[key]

    def timed_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float | None:
        """The op's cost where it was already timed (in memory or on disk), else None: nothing is timed."""
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        self._load()
        return self._table.get(_key(op, attrs, [tuple(int(d) for d in s) for s in input_shapes]))

    def isolated_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        """The op timed alone, without the fusion discount (for comparison)."""
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        key = "alone|" + _key(op, attrs, shapes)
        self._load()
        if key not in self._table:
            self._table[key] = self._time_alone(op, attrs, shapes)
            self._dirty += 1
        return self._table[key]

    # --- measuring ---------------------------------------------------------------------------

    def _time_alone(self, op: str, attrs: Mapping[str, Any], shapes: Sequence[Shape],
                    dtypes: Sequence[str] = ()) -> float:
        from jax_backend.lower import lower_node

        norm = ops.op_spec(op).normalize_attrs(attrs)
        fn = jax.jit(lambda *xs: lower_node(op, xs, norm, precision="default"))
        return self._time(fn, _random_args(op, shapes, 0, dtypes))

    def _time(self, fn: Callable[..., Any], args: Sequence[Any]) -> float:
        """Min over batched samples (noise only ever adds time) minus the per-call dispatch."""
        if len(args) not in self._overhead:
            self._overhead[len(args)] = dispatch_overhead(len(args), self.repeats)
        raw = time_callable(fn, args, self.repeats, self.warmup, statistic="min", min_sample_s=_MIN_SAMPLE_S)
        return max(raw - self._overhead[len(args)], 0.0)

    def _measure(self, op: str, attrs: Mapping[str, Any], shapes: Sequence[Shape], dtypes: Sequence[str] = ()) -> float:
        if not shapes:  # a nullary op (iota): computed inside its consumer's fusion
            return _FLOOR_S
        spec = ops.op_spec(op)
        if (op not in FUSIBLE_OPS or "float" not in spec.operand_kinds or spec.result_dtype == "select"
                or (dtypes and ops.dtype_kind(dtypes[0]) != "float")):
            return max(self._time_alone(op, attrs, shapes, dtypes), _FLOOR_S)
        from jax_backend.lower import lower_node

        norm = ops.op_spec(op).normalize_attrs(attrs)
        with_op = jax.jit(lambda *xs: lower_node(op, [-xs[0], *xs[1:]], norm, precision="default"))
        args = _random_args(op, shapes, 0, dtypes)
        timed = self._time(with_op, args)
        producer = (shapes[0], str(args[0].dtype))
        if producer not in self._producer:  # the same for every fusible op on this shape: timed once
            self._producer[producer] = self._time(jax.jit(lambda *xs: (-xs[0],)), args[:1])
        marginal = timed - self._producer[producer]
        return max(marginal, _FLOOR_S)


@dataclass(frozen=True)
class TimedOrEstimated:
    """A measured model for reports: each op at its timing where one was taken, else at
    `estimate`'s price (the roofline), so a report times no op. The search times only the ops a
    choice depends on (`eqsat.cost.ZeroPriced`); the ops every choice shares are estimated."""

    measured: MeasuredModel
    estimate: Any  # a CostModel
    name: str = "measured"

    @property
    def device(self) -> str:
        return self.measured.device

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        timed = self.measured.timed_cost(op, attrs, input_shapes)
        return float(self.estimate.op_cost(op, attrs, input_shapes)) if timed is None else timed


_CPU_LABELS = frozenset({"current", "cpu", "cpu-nominal"})
_KNOWN_GPUS = ("h100", "h200")  # the GPU names eqsat.cost has specs for


def check_measuring_device(device: str) -> None:
    """Refuse to label timings with a device they were not taken on: a measured model times ops on
    JAX's default device, so `measured/h100` on a CPU host would be CPU timings under an H100 label
    (and H100 timings under an H200 one). A GPU of a kind eqsat has no spec for (an A100) is let
    through: the decorator prices it as the nearest known GPU and the label is its own."""
    if device in _CPU_LABELS:
        return
    dev = jax.devices()[0]
    kind = str(getattr(dev, "device_kind", dev.platform))
    actual = kind.lower().replace(" ", "")
    if dev.platform == "cpu":
        mismatch = True
    else:
        named = [g for g in _KNOWN_GPUS if g in actual]
        mismatch = device.lower() not in actual and bool(named)
    if mismatch:
        here = dev.platform if kind == dev.platform else f"{dev.platform} ({kind})"
        instead = "cpu" if dev.platform == "cpu" else "current"
        raise EqsatError(f"cost model measured/{device} times ops on JAX's default device, which is {here}, not "
                         f"{device}: run it on that device, or use --device {instead} or --cost-model roofline")


def measured_model(device: str = "current", **options: Any) -> MeasuredModel:
    """Factory for eqsat.cost's registry: `cost_model("measured")`; refuses a `device` other than
    the one JAX times on (see `check_measuring_device`)."""
    check_measuring_device(device)
    return MeasuredModel(device=device, **options)




@dataclass(frozen=True)
class PerCallModel:
    """The "merge" model: `base` plus `per_call_s` for every op that XLA cannot fuse into its
    neighbours. On CPU each such call (a matmul, a conv) is its own loop nest, thread-pool dispatch
    and pass over its input, so fewer, larger calls win even where the roofline sees equal work.

    `base` plus `per_call_s` for every op that XLA cannot fuse into its neighbours."""

    base: Any
    per_call_s: float
    name: str = "merge"

    @property
    def device(self) -> str:
        return getattr(self.base, "device", "cpu")

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        return self._plus_call(op, self.base.op_cost(op, attrs, input_shapes))

    def op_cost_typed(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]],
                      input_dtypes: Sequence[str]) -> float:
        from eqsat.cost import typed_op_cost

        return self._plus_call(op, typed_op_cost(self.base, op, attrs, input_shapes, input_dtypes))

    def _plus_call(self, op: str, cost: float) -> float:
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view or op in FUSIBLE_OPS or op in ("concat", "split"):
            return cost
        return cost + self.per_call_s


def merge_model(device: str = "cpu", per_call_s: float = 1e-3, **options: Any) -> PerCallModel:
    """The "merge" cost model: the roofline plus `per_call_s` per matmul / conv call."""
    from eqsat.cost import cost_model

    return PerCallModel(cost_model("roofline", device, **options), per_call_s=per_call_s)


register_cost_model("measured", measured_model)
register_cost_model("merge", merge_model)

"""`@eqsat.optimize`: capture a JAX function, optimize its IR graphs, and run the result only if it
is provably no worse.

Per input signature (tree structure, shapes, dtypes, static arguments) the wrapper captures the
function once, optimizes each IR graph under a time limit, lowers the result to lax ops (or Pallas
kernels on a GPU), checks it against the original on random inputs, and times both (interleaved
rounds, a sequential test that stops once the bootstrap interval clears the threshold) and uses the
optimized version only if it is faster with confidence; the decision is persisted per (program,
signature, device), so another process reuses it (`jax_backend/decisions.py`). If anything fails,
disagrees, or is not faster, it warns (once) and calls the original. The optimized function is
plain traceable JAX, so jit / grad / vmap compose with it; it keeps `jax.jit`'s contract (methods,
static and donated arguments, `.lower` / `.trace` / `.eval_shape` / `.clear_cache`, the function's
metadata, `jax.jit`'s errors). The optimization itself runs on the abstract signature when the
wrapper is first called (often while an outer jit traces), on a worker thread: JAX's trace state is
per thread, so the concrete checks and timings there run compiled code the way a user's calls do.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import numpy as np

from eqsat.candidates import SegmentReport
from jax_backend.decorator_checks import build_signature
from jax_backend.decorator_options import (
    RECOMPILE_STORM,
    EqsatDeviceWarning,
    EqsatFallbackWarning,
    EqsatRecompileWarning,
    Entry,
    Options,
    SignatureReport,
    cost_device,
    make_options,
)
from jax_backend.leaf_names import traced_leaf_names
from jax_backend.shape_reuse import ShapeMemory
from jax_backend.timing import paired_timing

__all__ = ["optimize", "OptimizedFunction", "BoundOptimizedFunction", "SignatureReport", "SegmentReport",
           "EqsatFallbackWarning", "EqsatDeviceWarning", "EqsatRecompileWarning", "paired_timing"]


_T = TypeVar("_T")


def _outside_traces(fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` on a fresh thread, where no outer trace is active: compiled candidates are then
    called through JAX's normal dispatch. (Under `jax.ensure_compile_time_eval` a jitted call takes
    a slower path that passes closed-over constants on every call; it timed conv + batchnorm with
    its folded weights at 0.93x of the original where it runs at 1.00x.)"""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eqsat-optimize") as pool:
        return pool.submit(fn, *args).result()


# --- the wrapper ---------------------------------------------------------------------------------------

class _Unfreezable(Exception):
    """A static value with no content-based key (an unhashable object of a user class)."""


def _frozen(value: Any) -> Hashable:
    """A hashable key equal for equal static values: hashable values as they are (with their type,
    so 1 and 1.0 differ as they would in a trace), lists / tuples / dicts / sets by content, numpy
    arrays by shape, dtype and bytes."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, str(value.dtype), value.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), _frozen(v)) for k, v in value.items()), key=lambda kv: kv[0])))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_frozen(v)) for v in value)))
    try:
        hash(value)
    except TypeError as exc:
        raise _Unfreezable(type(value).__name__) from exc
    return (type(value), value)


_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, int, float, complex)


def _is_array_leaf(x: Any) -> bool:
    """Leaves `jax.jit` traces (arrays, numpy and Python numbers); any other leaf (a string, a
    callable, an enum) is a static value of the call."""
    return isinstance(x, _ARRAY_TYPES) or hasattr(x, "__jax_array__")


@dataclass(frozen=True)
class _Split:
    """One call taken apart: the traced leaves, and everything static (the declared static
    arguments, the non-array leaves, the tree) with a key that is equal exactly for equal statics
    (None when a static value has no such key)."""

    leaves: tuple[Any, ...]
    tree: Any
    static_positions: tuple[int, ...]  # leaf positions holding static values
    static_leaves: tuple[Any, ...]
    declared: tuple[tuple[int | str, Any], ...]  # static_argnums / static_argnames values
    key: Hashable | None
    donated: tuple[int, ...] = ()  # positions in `leaves` of donated arguments' leaves

    def rebuild(self, dynamic: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        """The call's (args, kwargs) with `dynamic` in place of the traced leaves."""
        it = iter(dynamic)
        statics = dict(zip(self.static_positions, self.static_leaves))
        n = len(self.leaves) + len(self.static_positions)
        leaves = [statics[i] if i in statics else next(it) for i in range(n)]
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(self.tree, leaves)
        declared = dict(self.declared)
        args = [declared.get(i, a) for i, a in enumerate(dyn_args)]
        kwargs = {**dyn_kwargs, **{k: v for k, v in self.declared if isinstance(k, str)}}
        return args, kwargs


@dataclass(frozen=True, eq=False)
class _SplitCall:
    """The static part of a call that `jax.jit` cannot take as it is (non-array leaves, unhashable
    static arguments), passed to the inner jit as one static argument compared by `_Split.key`."""

    split: _Split
    key_hash: int = 0

    @staticmethod
    def of(split: _Split) -> _SplitCall:
        return _SplitCall(split, hash(split.key))

    def __hash__(self) -> int:
        return self.key_hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _SplitCall) and self.key_hash == other.key_hash
                                 and self.split.key == other.split.key)


def _argnums_and_argnames(fun: Callable[..., Any], nums: tuple[int, ...], names: tuple[str, ...]
                          ) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """`nums` and `names` completed through `fun`'s signature, as `jax.jit` completes its static
    and donated arguments: given only names, the positions of those positional-or-keyword
    parameters are added (and the reverse), so `f(x, 3)` with `static_argnames="n"` makes the 3
    static as `jax.jit` does; both given (or no signature): as they are."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return nums, names
    either = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if names and not nums:
        nums = tuple(i for i, p in enumerate(params) if p.kind == either and p.name in names)
    elif nums and not names:
        names = tuple(p.name for i, p in enumerate(params)
                      if p.kind == either and (i in nums or i - len(params) in nums))
    return nums, names


def _positions(nums: Sequence[int], n: int) -> frozenset[int]:
    """Argument positions `nums` (negative ones counted from the end) among `n` positional arguments."""
    return frozenset(i + n if i < 0 else i for i in nums)


class OptimizedFunction:
    """A function that runs the eqsat-optimized version of `fun` when it is safe to.

    Every call goes through `jax.jit`: the traced body looks up (or builds) the optimized version
    for the signature and traces either it or the original `fun`, so every path runs compiled and
    a steady-state call costs what a `jax.jit` call costs (its C++ cache hit)."""

    def __init__(self, fun: Callable[..., Any], opts: Options) -> None:
        self.fun = fun
        self.options = opts
        self._cache: OrderedDict[Hashable, Entry] = OrderedDict()  # least recently used first
        self._built = 0  # signatures optimized in this wrapper's life (re-optimized after eviction included)
        self._traces = 0  # bodies entered: tells an argument error of jax.jit from the function's own
        self._split_calls = False  # set once jax.jit refuses this function's arguments as they are
        self._warned: set[str] = set()
        self._static = _argnums_and_argnames(fun, opts.static_argnums, opts.static_argnames)
        self._donate = _argnums_and_argnames(fun, opts.donate_argnums, opts.donate_argnames)
        self._jit_splits: dict[tuple[int, ...], Any] = {}  # per donated leaf positions
        self._shapes = ShapeMemory()  # search results and plans, reused at new input shapes
        self._calling = threading.local()  # per thread: a plain call is in progress; entries whose check it runs
        functools.update_wrapper(self, fun)

        def direct(*args: Any, **kwargs: Any) -> Any:
            self._traces += 1
            return self._traced(list(args), kwargs)

        def split(call: _SplitCall, *dynamic: Any) -> Any:
            self._traces += 1
            args, kwargs = call.split.rebuild(dynamic)
            return self._traced(args, kwargs)

        def plain(*args: Any, **kwargs: Any) -> Any:  # the original, for eval_shape (no optimization needed)
            self._traces += 1
            return fun(*args, **kwargs)

        self._split_fn = split
        # (jax.jit completes names and positions only where one of them is None: given both, completed here)
        self._jit_direct, self._jit_plain = (
            jax.jit(functools.wraps(fun)(body), static_argnums=self._static[0], static_argnames=self._static[1],
                    donate_argnums=self._donate[0], donate_argnames=self._donate[1])
            for body in (direct, plain))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dispatch("", args, kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A method: `obj.method` is this function with `obj` as its first argument (as `jax.jit`
        binds a method), keeping `.lower`, `.trace`, `.eval_shape` and `.report`."""
        return self if instance is None else BoundOptimizedFunction(self, instance)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(f).lower(...)` of what the call runs (the optimized version where it is kept)."""
        return self._dispatch("lower", args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(f).trace(...)` of what the call runs (optimizing the signature if it was not yet)."""
        return self._dispatch("trace", args, kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Output shapes and dtypes, as `jax.jit(f).eval_shape`: those of the original, which the
        optimized version shares (nothing is optimized for this)."""
        return self._dispatch("eval_shape", args, kwargs)

    def clear_cache(self) -> None:
        """As `jax.jit(f).clear_cache()`: compiled code is dropped and the next call traces anew
        (re-reading globals), with this wrapper's per-signature results and the search results it
        kept for other shapes (a persisted keep/discard decision is still reused)."""
        for jitted in (self._jit_direct, self._jit_plain, *self._jit_splits.values()):
            jitted.clear_cache()
        self._cache.clear()
        self._shapes = ShapeMemory()

    def _dispatch(self, stage: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call (`stage` "") or a `jax.jit` stage ("lower", "trace", "eval_shape") of the direct
        jit; where jax.jit refuses the arguments themselves, of the split one."""
        if not self._split_calls:
            jitted = self._jit_plain if stage == "eval_shape" else self._jit_direct
            traces = self._traces
            try:
                if stage:
                    return getattr(jitted, stage)(*args, **kwargs)
                outer = getattr(self._calling, "pending", None)  # (a call from inside the function: its own list)
                pending: list[tuple[Entry, _Split]] = []  # a plain call may leave its new signature's check to `_checked`
                self._calling.pending = pending
                try:
                    out = jitted(*args, **kwargs)
                except BaseException:
                    for entry, _ in pending:  # never checked: never used
                        entry.fn, entry.pending = None, None
                    raise
                finally:
                    self._calling.pending = outer
                return self._checked(pending, out, args, kwargs) if pending else out
            except (TypeError, ValueError):
                if self._traces != traces:  # raised while tracing: the function's own error
                    raise
            self._split_calls = True  # jax.jit refused the arguments themselves (its error is slow to build)
        return self._call_split(stage, args, kwargs)

    def _call_split(self, stage: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Non-array leaves become static values; unhashable static arguments are keyed by content."""
        split = self._split(list(args), kwargs, with_avals=False)
        if split.key is None or stage == "eval_shape":
            if split.key is None:
                self._warn_once("unhashable", "eqsat.optimize: a static argument has no content-based key; the "
                                "original function runs compiled for each call (not optimized)")

            def original(*dynamic: Any) -> Any:
                call_args, call_kwargs = split.rebuild(dynamic)
                return self.fun(*call_args, **call_kwargs)

            jitted: Any = jax.jit(original, donate_argnums=split.donated)
            return getattr(jitted, stage)(*split.leaves) if stage else jitted(*split.leaves)
        donate = tuple(1 + i for i in split.donated)
        if donate not in self._jit_splits:
            self._jit_splits[donate] = jax.jit(self._split_fn, static_argnums=0, donate_argnums=donate)
        jitted = self._jit_splits[donate]
        call = _SplitCall.of(split)
        return getattr(jitted, stage)(call, *split.leaves) if stage else jitted(call, *split.leaves)

    def _checked(self, pending: list[tuple[Entry, _Split]], out: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """Run the checks a plain call left (a plan kept at another shape, traced into this call's
        program unchecked, so that program's compile is the candidate's only one): each calls that
        compiled program on random inputs against the original, outside any trace. All equal: the
        call's outputs stand. One not: that signature runs the original (the compiled code is
        dropped and the call traced again, so neither its outputs nor later calls use the candidate)."""
        failed = False
        for entry, split in pending:
            check, entry.pending = entry.pending, None
            if check is None:
                continue

            def run(*flat: Any, split: _Split = split) -> list[Any]:
                call_args, call_kwargs = split.rebuild(flat)
                return jax.tree_util.tree_leaves(self._jit_direct(*call_args, **call_kwargs))

            try:
                problem = _outside_traces(check, run)
            except Exception as exc:  # noqa: BLE001 - a check that cannot run is a check that failed
                problem = f"checking the optimized version failed: {type(exc).__name__}: {exc}"
            if problem is not None:
                failed = True
                entry.fn = None
                entry.report = dataclasses.replace(entry.report, used="original", reason=problem, numerics_ok=False,
                                                   max_rel_err=None)
                warnings.warn(f"eqsat.optimize: running the original function: {problem}", EqsatFallbackWarning,
                              stacklevel=3)
        if not failed:
            return out
        jitted: Any = self._jit_direct
        jitted.clear_cache()
        return jitted(*args, **kwargs)

    def _warn_once(self, tag: str, message: str, category: type[Warning] = EqsatFallbackWarning) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, category, stacklevel=4)

    def _traced(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Inside the jit trace: the optimized version for this signature, else the original."""
        entry, split = self._entry(args, kwargs)
        if entry.fn is not None:
            try:
                return jax.tree_util.tree_unflatten(entry.out_tree, entry.fn(*split.leaves))
            except Exception as exc:  # noqa: BLE001 - the original is always a valid answer
                entry.fn = None
                entry.report = dataclasses.replace(entry.report, used="original",
                                                   reason=f"tracing the optimized version failed: "
                                                          f"{type(exc).__name__}: {exc}")
                warnings.warn(f"eqsat.optimize: running the original function: {entry.report.reason}",
                              EqsatFallbackWarning, stacklevel=2)
        return self.fun(*args, **kwargs)

    def _split(self, args: list[Any], kwargs: dict[str, Any], with_avals: bool = True) -> _Split:
        """`with_avals`: the key also holds the traced leaves' shapes and dtypes (the signature)."""
        nums, names = _positions(self._static[0], len(args)), self._static[1]
        declared: tuple[tuple[int | str, Any], ...] = ()
        dyn_args: tuple[Any, ...] = tuple(args)
        dyn_kwargs = kwargs
        if nums or names:
            declared = tuple((i, args[i]) for i in sorted(nums) if i < len(args))
            declared += tuple((k, kwargs[k]) for k in names if k in kwargs)
            dyn_args = tuple(None if i in nums else a for i, a in enumerate(args))
            dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        all_leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        positions = tuple(i for i, x in enumerate(all_leaves) if not _is_array_leaf(x))
        static_leaves = tuple(all_leaves[i] for i in positions)
        leaves = tuple(x for i, x in enumerate(all_leaves) if i not in positions) if positions else tuple(all_leaves)
        donated: tuple[int, ...] = ()
        if self._donate[0] or self._donate[1]:
            dnums, dnames = _positions(self._donate[0], len(args)), self._donate[1]
            flags = jax.tree_util.tree_leaves((
                tuple(jax.tree_util.tree_map(lambda _, d=i in dnums: d, a) for i, a in enumerate(dyn_args)),
                {k: jax.tree_util.tree_map(lambda _, d=k in dnames: d, v) for k, v in dyn_kwargs.items()}))
            traced_flags = [f for i, f in enumerate(flags) if i not in positions]
            donated = tuple(j for j, f in enumerate(traced_flags) if f)
        avals = tuple((a.shape, str(a.dtype), a.weak_type) for a in map(jax.typeof, leaves)) if with_avals else ()
        try:
            key: Hashable | None = (tree, avals, positions, _frozen(static_leaves) if static_leaves else (),
                                    tuple((k, _frozen(v)) for k, v in declared) if declared else ())
        except _Unfreezable:
            key = None
        return _Split(leaves, tree, positions, static_leaves, declared, key, donated)

    def _entry(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[Entry, _Split]:
        split = self._split(args, kwargs)
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                 for a in (jax.typeof(x) for x in split.leaves)]
        signature = ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)
        statics = [*(f"{k}={v!r}" for k, v in split.declared), *(repr(v) for v in split.static_leaves)]
        signature += f"; static {', '.join(statics)}" if statics else ""
        if split.key is None:
            return Entry(None, None, SignatureReport(signature, "original", "unhashable static arguments")), split
        entry = self._cache.get(split.key)
        if entry is not None:
            self._cache.move_to_end(split.key)
        else:
            out_trees: list[Any] = []
            user_errors: list[Exception] = []

            def flat_fun(*flat: Any) -> list[Any]:
                full_args, full_kwargs = split.rebuild(flat)
                try:
                    result = self.fun(*full_args, **full_kwargs)
                except Exception as exc:
                    user_errors.append(exc)
                    raise
                leaves_out, out_tree = jax.tree_util.tree_flatten(result)
                out_trees.append(out_tree)
                return leaves_out

            device, note = cost_device()
            if note:
                self._warn_once("device", note, EqsatDeviceWarning)
            try:
                names = traced_leaf_names(self.fun, args, kwargs, {k for k, _ in split.declared}, _is_array_leaf)
                calling = getattr(self._calling, "pending", None)
                defer = calling is not None and not split.donated and not any(a.weak_type for a in avals)
                entry = _outside_traces(build_signature, flat_fun, avals, signature, self.options, device, names,
                                        self._shapes, defer)
                if entry.pending is not None and calling is not None:
                    calling.append((entry, split))
            except Exception as exc:  # noqa: BLE001 - the optimizer's own failure: run the original
                reason = f"optimizing failed: {type(exc).__name__}: {exc}"
                entry = Entry(None, None, SignatureReport(signature, "original", reason),
                               f"eqsat.optimize: running the original function: {reason}")
            if user_errors and not out_trees:  # the function's own error, raised as jax.jit would: no warning, no second trace
                raise user_errors[0]
            entry.out_tree = out_trees[0] if out_trees else None
            self._cache[split.key] = entry
            while len(self._cache) > self.options.max_signatures:
                self._cache.popitem(last=False)
            self._built += 1
            if self._built > RECOMPILE_STORM:
                self._warn_once("recompile", f"eqsat.optimize: {getattr(self.fun, '__name__', 'the function')} has been "
                                f"optimized for {self._built} input signatures, each a full optimization; pad or "
                                "bucket shapes that change per call, or mark such arguments static",
                                EqsatRecompileWarning)
            if entry.warning:
                warnings.warn(entry.warning, EqsatFallbackWarning, stacklevel=4)
        return entry, split

    def report(self, *args: Any, **kwargs: Any) -> SignatureReport:
        """What was done for the signature of these arguments (optimizing now if it was not yet)."""
        return self._entry(list(args), kwargs)[0].report

    @property
    def reports(self) -> list[SignatureReport]:
        """The kept signatures' reports (at most `max_signatures`, least recently used first)."""
        return [e.report for e in self._cache.values()]


class BoundOptimizedFunction:
    """An `OptimizedFunction` read as a method of `instance`: calls, stages and reports get the
    instance as their first argument (the instance is traced, or static where `static_argnums`
    says so or it is not an array pytree, e.g. a plain object)."""

    def __init__(self, function: OptimizedFunction, instance: Any) -> None:
        self.__func__ = function
        self.__self__ = instance
        functools.update_wrapper(self, function.fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__.lower(self.__self__, *args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__.trace(self.__self__, *args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__.eval_shape(self.__self__, *args, **kwargs)

    def report(self, *args: Any, **kwargs: Any) -> SignatureReport:
        return self.__func__.report(self.__self__, *args, **kwargs)

    def clear_cache(self) -> None:
        self.__func__.clear_cache()

    @property
    def reports(self) -> list[SignatureReport]:
        return self.__func__.reports


def optimize(fun: Callable[..., Any] | None = None, *, rules: object = None, extractor: str = "ilp",
             cost_model: str | Sequence[str] | None = None, time_limit: float = 5.0, static_argnums: int | Sequence[int] = (),
             static_argnames: str | Sequence[str] = (), rtol: float = 2e-4, check_speed: bool = True,
             lowering: str = "auto", max_signatures: int = 32, donate_argnums: int | Sequence[int] = (),
             donate_argnames: str | Sequence[str] = (), timing_budget: float = 8.0, decision_cache: bool = True) -> Any:
    """Decorator: `@optimize` or `@optimize(rules=..., extractor=..., cost_model=..., time_limit=...)`.

    `cost_model`: None extracts one candidate under each of "roofline", "measured" and "merge"
    (roofline plus a cost per matmul/conv call) and keeps the fastest as timed; a name or names
    extract under those models only. `rtol`: a candidate is used only if its outputs agree with the
    original's, of the same dtypes, within `rtol` of each output's magnitude (`eqsat.compare`).
    `max_signatures`: how many input signatures' results are kept (the least recently used is
    dropped, and optimized again if it comes back); past `RECOMPILE_STORM` signatures optimized,
    an `EqsatRecompileWarning` says so once. `static_argnums`/`static_argnames` and
    `donate_argnums`/`donate_argnames` are `jax.jit`'s. `timing_budget`: the longest the sequential
    keep/discard test times one signature (it stops as soon as it is decided); `decision_cache`:
    persist decisions per (program, signature, device) and reuse them without timing. A `fun`
    that is not callable is a TypeError, as for `jax.jit`."""
    opts = make_options(rules, extractor, cost_model, time_limit, static_argnums, static_argnames, rtol, check_speed,
                        lowering, max_signatures, donate_argnums, donate_argnames, timing_budget, decision_cache)
    if fun is None:
        return lambda f: OptimizedFunction(_callable(f), opts)
    return OptimizedFunction(_callable(fun), opts)


def _callable(fun: Any) -> Callable[..., Any]:
    if not callable(fun):
        raise TypeError(f"eqsat.optimize: expected a callable, got {fun!r}")
    return fun

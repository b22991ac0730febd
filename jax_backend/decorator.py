"""`@eqsat.optimize`: capture a JAX function, optimize its IR graphs, and run the result only if it
is provably no worse.

Per input signature (tree structure, shapes, dtypes, static arguments) the wrapper captures the
function once, optimizes each IR graph under a time limit, lowers the result to lax ops (or Pallas
kernels on a GPU), checks it against the original on random inputs, and times both (paired,
interleaved, bootstrap interval) and uses the optimized version only if it is faster with
confidence. If anything fails, disagrees, or is not faster, it warns (once) and calls the original.
The optimized function is plain traceable JAX, so jit / grad / vmap compose with it. The
optimization itself runs on the abstract signature when the wrapper is first called (often while an
outer jit traces), on a worker thread: JAX's trace state is per thread, so the concrete checks and
timings there run compiled code the way a user's calls do.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from eqsat import candidates
from eqsat.candidates import SegmentReport
from eqsat.compare import outputs_agree
from eqsat.errors import EqsatError
from eqsat.ir import Graph
from jax_backend.capture import GraphStep, Program, capture, graph_leaf_name, replay
from jax_backend.timing import paired_timing, screen_timings

__all__ = ["optimize", "OptimizedFunction", "SignatureReport", "SegmentReport", "EqsatFallbackWarning", "paired_timing"]


_T = TypeVar("_T")


class EqsatFallbackWarning(UserWarning):
    """The optimized version was not used; the original function runs instead."""


@dataclass(frozen=True)
class SignatureReport:
    """What happened for one input signature."""

    signature: str
    used: str  # "optimized" | "original"
    reason: str
    segments: tuple[SegmentReport, ...] = ()
    opaque: tuple[str, ...] = ()
    numerics_ok: bool | None = None
    max_rel_err: float | None = None
    time_original_s: float | None = None
    time_optimized_s: float | None = None
    optimize_s: float = 0.0
    lowering: str = "xla"
    speedup_ci: tuple[float, float] | None = None  # bootstrap interval of original/optimized time
    distinct_regions: int = 0  # regions optimized; the rest reused a structurally identical result
    reused_regions: int = 0
    opaque_why: tuple[str, ...] = ()  # "primitive: why it was not captured", one per distinct pair


@dataclass(frozen=True)
class _Options:
    rules: Any = None
    extractor: str = "ilp"
    cost_model: str = "roofline"
    time_limit: float = 5.0
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    rtol: float = 2e-4
    atol: float = 1e-5
    check_speed: bool = True
    timing_rounds: int = 40
    timing_budget_s: float = 3.0
    lowering: str = "auto"  # "auto" | "xla" | "pallas"
    iterations: int = 8
    max_enodes: int = 20_000
    candidate_models: tuple[str, ...] = ("roofline", "measured", "merge")  # extract under each, time the distinct


@dataclass
class _Entry:
    fn: Callable[..., Any] | None  # flat optimized function, None: run the original
    out_tree: Any
    report: SignatureReport
    warning: str = ""  # why the original runs, for the caller to warn about (empty: no warning)


# --- optimizing one signature -----------------------------------------------------------------------

def _lowering_mode(opts: _Options) -> str:
    if opts.lowering != "auto":
        return opts.lowering
    return "pallas" if jax.default_backend() == "gpu" else "xla"


def _fold_decision(graph: Graph, node: int) -> bool:
    """Precompute a weight-only value unless it is bigger than what it is computed from (a
    broadcast of a scalar is cheaper to recompute inside a fusion than to read from memory)."""
    n = graph.nodes[node]
    size = lambda shape: int(np.prod(shape, dtype=np.int64))  # noqa: E731
    return sum(size(s) for s in n.shapes) <= sum(size(graph.shape(v)) for v in n.inputs)


def _fold_program(program: Program) -> tuple[Program, dict[int, dict[str, Any]]]:
    """Each graph with its weight-only values precomputed (the concatenated weights a merge built);
    returns the new program and, per new graph (by id), the constants its new leaves read."""
    from jax_backend.lower import fold_weights

    graphs: list[Graph] = []
    consts: dict[int, dict[str, Any]] = {}
    for k, step in enumerate(program.graphs):
        values = {graph_leaf_name(i): np.asarray(program.consts[i]) for i in step.inputs if i in program.consts}
        graph, extra = step.graph, {}
        if values and any(n.op == "weight" for n in graph.nodes):
            placeholders: dict[str, Any] = {n.attr["name"]: None for _, n in graph.leaves("input")}  # read at run time
            graph, folded = fold_weights(graph, {**placeholders, **values}, prefix=f"folded{k}_",
                                         should_fold=_fold_decision)
            extra = {name: np.asarray(v, dtype=np.float32) for name, v in folded.items()
                     if name not in values and name not in placeholders}
        graphs.append(graph)
        consts[id(graph)] = extra
    return program.with_graphs(graphs), consts


def _graph_runner(graphs: Sequence[Graph], mode: str, consts: dict[int, dict[str, Any]] | None = None,
                  ) -> tuple[Callable[[GraphStep, Sequence[Any]], Sequence[Any]], list[tuple[str, ...]]]:
    """Lowered functions for each graph (by identity) and the kernels each one uses; `consts`
    (per graph id) are extra leaf values, e.g. weights folded at optimization time."""
    from jax_backend.lower import to_jax

    lowered: dict[int, Callable[..., Any]] = {}
    kernels: list[tuple[str, ...]] = []
    for g in graphs:
        if mode == "pallas":
            from jax_backend.pallas import to_jax_pallas

            fn, used = to_jax_pallas(g, interpret=jax.default_backend() != "gpu")
        else:
            fn, used = to_jax(g, precision="default"), ("xla",)
        lowered[id(g)] = fn
        kernels.append(tuple(used))
    extra = consts or {}

    def run(step: GraphStep, values: Sequence[Any]) -> Sequence[Any]:
        named = {graph_leaf_name(i): v for i, v in zip(step.inputs, values)}
        named.update(extra.get(id(step.graph), {}))
        return lowered[id(step.graph)](named)

    return run, kernels


def _random_args(avals: Sequence[jax.ShapeDtypeStruct], seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for a in avals:
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            impl = getattr(a.dtype, "_impl", None)
            key = jax.random.key(seed) if impl is None else jax.random.key(seed, impl=impl)
            out.append(jax.random.split(key, a.shape) if a.shape else key)
            continue
        dt = np.dtype(a.dtype)
        if np.issubdtype(dt, np.floating):
            out.append(jnp.asarray(rng.standard_normal(a.shape), dtype=a.dtype))
        elif np.issubdtype(dt, np.integer):
            out.append(jnp.asarray(rng.integers(0, 4, a.shape), dtype=a.dtype))
        elif dt == np.bool_:
            out.append(jnp.asarray(rng.integers(0, 2, a.shape).astype(bool)))
        else:
            out.append(jnp.zeros(a.shape, a.dtype))
    return out


def _compare(ref: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> tuple[bool, float]:
    """`eqsat.compare.outputs_agree` with the same dtypes required (PRNG keys compared as their
    key data): (agrees, largest error relative to an output's magnitude)."""
    def data(v: Any) -> Any:
        return jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) else v

    verdict = outputs_agree([data(r) for r in ref], [data(g) for g in got], rtol, atol, same_dtype=True)
    return verdict.ok, verdict.max_rel_err


@dataclass(frozen=True)
class _Outcome:
    """What every report of one signature shares; builds the entry for each way it can end."""

    signature: str
    out_tree: Any
    start: float
    mode: str
    facts: Mapping[str, Any] = field(default_factory=dict)  # SignatureReport fields known so far

    def with_facts(self, **facts: Any) -> _Outcome:
        return dataclasses.replace(self, facts={**self.facts, **facts})

    def _report(self, used: str, reason: str, segments: Sequence[SegmentReport], fields: Mapping[str, Any]
                ) -> SignatureReport:
        return SignatureReport(self.signature, used, reason, tuple(segments),
                               optimize_s=time.perf_counter() - self.start, lowering=self.mode,
                               **{**self.facts, **fields})

    def original(self, reason: str, segments: Sequence[SegmentReport] = (), warn: bool = True, **fields: Any) -> _Entry:
        """The original runs (`warn`: tell the user, once, why)."""
        return _Entry(None, self.out_tree, self._report("original", reason, segments, fields),
                      f"eqsat.optimize: running the original function: {reason}" if warn else "")

    def optimized(self, fn: Callable[..., Any], reason: str, segments: Sequence[SegmentReport],
                  **fields: Any) -> _Entry:
        return _Entry(fn, self.out_tree, self._report("optimized", reason, segments, fields))


def _variants(steps: Sequence[GraphStep], search: Any, mode: str) -> list[tuple[str, list[Graph]]]:
    """The distinct programs the candidate models chose (each label once per distinct choice)."""
    variants: list[tuple[str, list[Graph]]] = []
    seen: set[tuple[Any, ...]] = set()
    for label in search.models:
        applied = [candidates.apply_label(s.graph, label, search) for s in steps]
        key = tuple(k for _, k in applied)
        if any(key) and key not in seen:
            seen.add(key)
            variants.append((label, [g for g, _ in applied]))
    if mode == "pallas":  # the original graphs through Pallas kernels are a candidate too
        variants.append(("original", [s.graph for s in steps]))
    return variants


def build_signature(flat_fun: Callable[..., list[Any]], avals: Sequence[jax.ShapeDtypeStruct], signature: str,
                    opts: _Options) -> _Entry:
    """Capture, optimize, lower, check and time one signature."""
    from eqsat.structure import canonicalize

    start = time.perf_counter()
    try:
        program, out_tree = capture(flat_fun, *avals)
    except EqsatError as exc:
        return _Outcome(signature, None, start, _lowering_mode(opts)).original(f"capture failed: {exc}")
    outcome = _Outcome(signature, out_tree, start, _lowering_mode(opts)).with_facts(
        opaque=tuple(s.name for s in program.opaque),
        opaque_why=tuple(sorted({f"{s.name}: {s.why}" for s in program.opaque})))
    if any(isinstance(v, jax.core.Tracer) for v in program.consts.values()):
        return outcome.original("the function closes over traced values; not optimized", warn=False)
    if program.effects:  # checks and timings would run the user's callbacks and prints many times
        return outcome.original(f"the function has side effects ({', '.join(program.effects)}); the original runs "
                                "(compiled, once per call), nothing is checked or timed")
    steps = program.graphs
    try:
        kind = str(getattr(jax.devices()[0], "device_kind", "")).lower()  # measured refuses a wrong GPU name
        device = "cpu" if jax.default_backend() == "cpu" else ("h200" if "h200" in kind else "h100")
        search = candidates.make_search(opts.rules, opts.candidate_models or (opts.cost_model,),
                                        [s.graph for s in steps], device, opts.extractor, opts.iterations,
                                        opts.max_enodes)
    except Exception as exc:  # noqa: BLE001 - no rules or no cost model: nothing to optimize with
        return outcome.original(f"setting up failed: {type(exc).__name__}: {exc}")
    distinct = len({canonicalize(s.graph).graph for s in steps})
    per_graph = opts.time_limit / max(distinct, 1)  # identical graphs reuse the first one's regions
    seconds = [candidates.collect_candidates(s.graph, per_graph, search) for s in steps]
    outcome = outcome.with_facts(distinct_regions=len(search.candidates) + len(search.failed),
                                 reused_regions=search.reused)
    variants = _variants(steps, search, outcome.mode)
    unchanged = [candidates.segment_report(s.graph, s.graph, search, t) for s, t in zip(steps, seconds)]
    if not variants:
        return outcome.original("no rewrite changed the program", unchanged, warn=False)
    original_flat = jax.jit(flat_fun)
    try:
        args = _random_args(avals, seed=0)
        built, problems = _build_candidates(program, variants, original_flat(*args), args, opts, outcome.mode,
                                            search, seconds)
        if not built:
            return outcome.original("; ".join(problems), unchanged, numerics_ok=False)
        if not opts.check_speed:
            label, fn, segs, err = built[0]
            return outcome.optimized(fn, f"candidate '{label}' checked equal (speed not checked)", segs,
                                     numerics_ok=True, max_rel_err=err)
        (label, fn, segs, err), timing = _select_fastest(original_flat, built, args, opts)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the original
        return outcome.original(f"checking the optimized version failed: {type(exc).__name__}: {exc}", unchanged)
    ci = timing.speedup_ci
    tried = ", ".join(b[0] for b in built)
    measured = {"numerics_ok": True, "max_rel_err": err, "time_original_s": timing.base_s,
                "time_optimized_s": timing.other_s, "speedup_ci": ci}
    if not timing.faster_with_confidence:
        return outcome.original(f"no candidate ({tried}) faster with {timing.confidence:.0%} confidence; best "
                                f"'{label}': speedup {timing.speedup:.3f}, interval [{ci[0]:.3f}, {ci[1]:.3f}]",
                                segs, warn=False, **measured)
    return outcome.optimized(fn, f"candidate '{label}' (of {tried}) checked equal and faster with confidence", segs,
                             **measured)


def _build_candidates(program: Program, variants: Sequence[tuple[str, list[Graph]]], ref: Sequence[Any],
                      args: Sequence[Any], opts: _Options, mode: str, search: Any, seconds: Sequence[float],
                      ) -> tuple[list[tuple[str, Callable[..., Any], list[SegmentReport], float]], list[str]]:
    """Each variant folded, lowered, compiled and compared with the original's outputs `ref` on
    `args`; returns the ones that agree (label, function, segment reports, error) and why the
    others were dropped."""
    built: list[tuple[str, Callable[..., Any], list[SegmentReport], float]] = []
    problems: list[str] = []
    for label, graphs in variants:
        try:
            optimized, consts = _fold_program(program.with_graphs(graphs))
            runner, kernels = _graph_runner([s.graph for s in optimized.graphs], mode, consts)
            fn = jax.jit(functools.partial(_run_program, optimized, runner))
            ok, err = _compare(ref, fn(*args), opts.rtol, opts.atol)
        except Exception as exc:  # noqa: BLE001 - this candidate is dropped
            problems.append(f"{label}: lowering failed: {type(exc).__name__}: {exc}")
            continue
        if not ok:
            problems.append(f"{label}: outputs differ from the original (max rel. error {err:.3g})")
            continue
        segs = [dataclasses.replace(candidates.segment_report(s.graph, g, search, t, label), kernels=k,
                                    cost_model=label)
                for s, g, t, k in zip(program.graphs, graphs, seconds, kernels)]
        built.append((label, fn, segs, err))
    return built, problems


def _outside_traces(fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` on a fresh thread, where no outer trace is active: compiled candidates are then
    called through JAX's normal dispatch. (Under `jax.ensure_compile_time_eval` a jitted call takes
    a slower path that passes closed-over constants on every call; it timed conv + batchnorm with
    its folded weights at 0.93x of the original where it runs at 1.00x.)"""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eqsat-optimize") as pool:
        return pool.submit(fn, *args).result()


def _select_fastest(original: Callable[..., Any], built: Sequence[tuple[str, Callable[..., Any], Any, float]],
                    args: Sequence[Any], opts: _Options) -> tuple[Any, Any]:
    """The candidate to keep and its timing against the original. With several candidates, all
    are screened in the same interleaved rounds on half the budget, and the fastest is timed again
    on fresh rounds with the other half, so picking the luckiest screen does not bias the interval
    the decision uses."""
    if len(built) == 1:
        return built[0], paired_timing(original, built[0][1], args, opts.timing_rounds, opts.timing_budget_s)
    screens = screen_timings(original, [b[1] for b in built], args, opts.timing_rounds, opts.timing_budget_s / 2,
                             min_rounds=6)
    best = max(range(len(built)), key=lambda k: screens[k].speedup)
    return built[best], paired_timing(original, built[best][1], args, opts.timing_rounds, opts.timing_budget_s / 2)


def _run_program(program: Program, runner: Callable[..., Any], *flat: Any) -> list[Any]:
    return replay(program, runner, flat)


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


class OptimizedFunction:
    """A function that runs the eqsat-optimized version of `fun` when it is safe to.

    Every call goes through `jax.jit`: the traced body looks up (or builds) the optimized version
    for the signature and traces either it or the original `fun`, so every path runs compiled and
    a steady-state call costs what a `jax.jit` call costs (its C++ cache hit)."""

    def __init__(self, fun: Callable[..., Any], opts: _Options) -> None:
        self.fun = fun
        self.options = opts
        self._cache: dict[Hashable, _Entry] = {}
        self._traces = 0  # bodies entered: tells an argument error of jax.jit from the function's own
        self._split_calls = False  # set once jax.jit refuses this function's arguments as they are
        self._warned: set[str] = set()
        functools.update_wrapper(self, fun)

        def direct(*args: Any, **kwargs: Any) -> Any:
            self._traces += 1
            return self._traced(list(args), kwargs)

        def split(call: _SplitCall, *dynamic: Any) -> Any:
            self._traces += 1
            args, kwargs = call.split.rebuild(dynamic)
            return self._traced(args, kwargs)

        # `direct` carries fun's signature, so static_argnames/argnums map to each other as for jax.jit(fun)
        self._jit_direct = jax.jit(functools.wraps(fun)(direct), static_argnums=opts.static_argnums,
                                   static_argnames=opts.static_argnames)
        self._jit_split = jax.jit(split, static_argnums=0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._split_calls:
            return self._call_split(args, kwargs)
        traces = self._traces
        try:
            return self._jit_direct(*args, **kwargs)
        except (TypeError, ValueError):
            if self._traces != traces:  # raised while tracing: the function's own error
                raise
        self._split_calls = True  # jax.jit refused the arguments themselves (its error is slow to build)
        return self._call_split(args, kwargs)

    def _call_split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Non-array leaves become static values; unhashable static arguments are keyed by content."""
        split = self._split(list(args), kwargs, with_avals=False)
        if split.key is None:
            self._warn_once("unhashable", "eqsat.optimize: a static argument has no content-based key; the "
                            "original function runs compiled for each call (not optimized)")
            return jax.jit(lambda *dynamic: self.fun(*split.rebuild(dynamic)[0], **split.rebuild(dynamic)[1]))(
                *split.leaves)
        return self._jit_split(_SplitCall.of(split), *split.leaves)

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, EqsatFallbackWarning, stacklevel=4)

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
        nums, names = self.options.static_argnums, self.options.static_argnames
        declared: tuple[tuple[int | str, Any], ...] = ()
        dyn_args: tuple[Any, ...] = tuple(args)
        dyn_kwargs = kwargs
        if nums or names:
            declared = tuple((i, args[i]) for i in nums if i < len(args))
            declared += tuple((k, kwargs[k]) for k in names if k in kwargs)
            dyn_args = tuple(None if i in nums else a for i, a in enumerate(args))
            dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
        all_leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        positions = tuple(i for i, x in enumerate(all_leaves) if not _is_array_leaf(x))
        static_leaves = tuple(all_leaves[i] for i in positions)
        leaves = tuple(x for i, x in enumerate(all_leaves) if i not in positions) if positions else tuple(all_leaves)
        avals = tuple((a.shape, str(a.dtype), a.weak_type) for a in map(jax.typeof, leaves)) if with_avals else ()
        try:
            key: Hashable | None = (tree, avals, positions, _frozen(static_leaves) if static_leaves else (),
                                    tuple((k, _frozen(v)) for k, v in declared) if declared else ())
        except _Unfreezable:
            key = None
        return _Split(leaves, tree, positions, static_leaves, declared, key)

    def _entry(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[_Entry, _Split]:
        split = self._split(args, kwargs)
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                 for a in (jax.typeof(x) for x in split.leaves)]
        signature = ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)
        statics = [*(f"{k}={v!r}" for k, v in split.declared), *(repr(v) for v in split.static_leaves)]
        signature += f"; static {', '.join(statics)}" if statics else ""
        if split.key is None:
            return _Entry(None, None, SignatureReport(signature, "original", "unhashable static arguments")), split
        entry = self._cache.get(split.key)
        if entry is None:
            out_trees: list[Any] = []

            def flat_fun(*flat: Any) -> list[Any]:
                full_args, full_kwargs = split.rebuild(flat)
                leaves_out, out_tree = jax.tree_util.tree_flatten(self.fun(*full_args, **full_kwargs))
                out_trees.append(out_tree)
                return leaves_out

            try:
                entry = _outside_traces(build_signature, flat_fun, avals, signature, self.options)
            except Exception as exc:  # noqa: BLE001 - the optimizer's own failure: run the original
                reason = f"optimizing failed: {type(exc).__name__}: {exc}"
                entry = _Entry(None, None, SignatureReport(signature, "original", reason),
                               f"eqsat.optimize: running the original function: {reason}")
            entry.out_tree = out_trees[0] if out_trees else None
            self._cache[split.key] = entry
            if entry.warning:
                warnings.warn(entry.warning, EqsatFallbackWarning, stacklevel=4)
        return entry, split

    def report(self, *args: Any, **kwargs: Any) -> SignatureReport:
        """What was done for the signature of these arguments (optimizing now if it was not yet)."""
        return self._entry(list(args), kwargs)[0].report

    @property
    def reports(self) -> list[SignatureReport]:
        return [e.report for e in self._cache.values()]


def optimize(fun: Callable[..., Any] | None = None, *, rules: Any = None, extractor: str = "ilp",
             cost_model: str | Sequence[str] | None = None, time_limit: float = 5.0, static_argnums: int | Sequence[int] = (),
             static_argnames: str | Sequence[str] = (), rtol: float = 2e-4, check_speed: bool = True,
             lowering: str = "auto") -> Any:
    """Decorator: `@optimize` or `@optimize(rules=..., extractor=..., cost_model=..., time_limit=...)`.

    `cost_model`: None extracts one candidate under each of "roofline", "measured" and "merge"
    (roofline plus a cost per matmul/conv call) and keeps the fastest as timed; a name or names
    extract under those models only. `rtol`: a candidate is used only if its outputs agree with the
    original's, of the same dtypes, within `rtol` of each output's magnitude (`eqsat.compare`)."""
    if lowering not in ("auto", "xla", "pallas"):
        raise EqsatError(f"optimize: lowering must be 'auto', 'xla' or 'pallas', got {lowering!r}")
    if time_limit <= 0:
        raise EqsatError(f"optimize: time_limit must be positive, got {time_limit}")
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    models = _Options.candidate_models if cost_model is None else \
        ((cost_model,) if isinstance(cost_model, str) else tuple(cost_model))
    if not models:
        raise EqsatError("optimize: cost_model must name at least one cost model")
    candidates.check_names(extractor, models)
    opts = _Options(candidates.rule_source(rules), extractor, models[0], float(time_limit), nums, names, rtol,
                    check_speed=check_speed, lowering=lowering, candidate_models=models)
    if fun is None:
        return lambda f: OptimizedFunction(f, opts)
    return OptimizedFunction(fun, opts)

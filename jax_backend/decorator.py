"""`@eqsat.optimize`: capture a JAX function, optimize its IR graphs, and run the result only if it
is provably no worse.

Per input signature (tree structure, shapes, dtypes, static arguments) the wrapper captures the
function once, optimizes each IR graph under a time limit, lowers the result to lax ops (or Pallas
kernels on a GPU), checks it against the original on random inputs, and times both (paired,
interleaved, bootstrap interval) and uses the optimized version only if it is faster with
confidence. If anything fails, disagrees, or is not faster, it warns (once) and calls the original. The optimized function is plain traceable JAX, so jit / grad / vmap compose with it; the
optimization itself runs at trace time on the abstract signature, with concrete checks done under
`jax.ensure_compile_time_eval`.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat.errors import EqsatError
from eqsat.ir import Graph
from jax_backend.capture import GraphStep, Program, capture, graph_leaf_name, replay
from jax_backend.timing import paired_timing

__all__ = ["optimize", "OptimizedFunction", "SignatureReport", "SegmentReport", "EqsatFallbackWarning", "paired_timing"]


class EqsatFallbackWarning(UserWarning):
    """The optimized version was not used; the original function runs instead."""


@dataclass(frozen=True)
class SegmentReport:
    """What happened to one IR graph of the program."""

    before: Graph = field(repr=False)
    after: Graph = field(repr=False)
    cost_before: float | None = None
    cost_after: float | None = None
    enodes: int | None = None
    eclasses: int | None = None
    rules_fired: tuple[str, ...] = ()
    stop_reason: str = ""
    seconds: float = 0.0
    kernels: tuple[str, ...] = ()
    error: str = ""


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


@dataclass
class _Entry:
    fn: Callable[..., Any] | None  # flat optimized function, None: run the original
    out_tree: Any
    report: SignatureReport


# --- optimizing one signature -----------------------------------------------------------------------

def _load_rules(rules: Any) -> list[Any]:
    """None: the proved library rules that pay under XLA (Tensat's files if there is no library);
    "tensat": Tensat's rule files; a path (or paths): rule files; else a sequence of Rule values."""
    from eqsat.pipeline import default_rules
    from eqsat.rewrites.parser import load_rules

    from jax_backend.default_rules import library_available, proved_library_rules

    if rules is None:
        return proved_library_rules() if library_available() else default_rules()
    if isinstance(rules, str) and rules == "tensat":
        return default_rules()
    if isinstance(rules, (str, Path)):
        return list(load_rules(Path(rules)))
    rules = list(rules)
    if rules and all(isinstance(r, (str, Path)) for r in rules):
        return [r for path in rules for r in load_rules(Path(path))]
    return rules


@dataclass
class _Search:
    """What one signature's optimization shares across its graphs: rules, cost model, and the
    results of regions already optimized, keyed by structure (leaf names aside)."""

    rules: list[Any]
    model: Any
    memo: dict[Graph, Graph | Exception] = field(default_factory=dict)  # canonical region → result
    results: dict[Graph, Any] = field(default_factory=dict)  # canonical region → OptimizationResult
    reused: int = 0


def _make_search(opts: _Options) -> _Search:
    from eqsat.cost import cost_model

    return _Search(_load_rules(opts.rules), cost_model(opts.cost_model, "cpu" if jax.default_backend() == "cpu" else "h100"))


def _computed_nodes(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if n.op not in ("input", "weight"))


def _no_extra_work(before: Graph, after: Graph, slack: float = 1.01) -> bool:
    """False when the rewritten graph does more arithmetic than the original: merges that overlap
    (the same weight in two concatenations) compute some products twice, and a noisy measured cost
    can still rank them cheaper. Merging without overlap keeps the flop count."""
    return after.live().total_flops() <= slack * before.live().total_flops()


def _optimize_graph(graph: Graph, opts: _Options, time_limit: float, search: _Search | None = None) -> SegmentReport:
    """Run eqsat's pipeline on each region of one graph under `time_limit`; a region structurally
    identical to one already optimized reuses that result. Any failure keeps a region as it was."""
    start = time.perf_counter()
    if _computed_nodes(graph) < 2:
        return SegmentReport(graph, graph, stop_reason="too small to optimize")
    try:
        from eqsat.pipeline import optimize_graph
        from eqsat.saturate import Limits

        from jax_backend.regions import egraph_ops, optimize_regions
        from jax_backend.structure import canonicalize

        search = search or _make_search(opts)
        deadline = start + time_limit
        used: list[Any] = []

        def run_one(region: Graph) -> Graph:
            if _computed_nodes(region) < 2:
                return region
            canon = canonicalize(region)
            known = search.memo.get(canon.graph)
            if known is not None:
                search.reused += 1
            else:
                left = deadline - time.perf_counter()
                if left <= 0.05:
                    return region
                limits = Limits(iterations=opts.iterations, nodes=opts.max_enodes, seconds=left / 2, multi_rounds=2)
                try:
                    result = optimize_graph(canon.graph, search.rules, limits, search.model, opts.extractor,
                                            time_limit=max(left / 2, 0.05))
                    known = result.optimized if result.numerics_ok and _no_extra_work(canon.graph, result.optimized) \
                        else canon.graph
                    search.results[canon.graph] = result
                except Exception as exc:  # noqa: BLE001 - keep this region as it was
                    known = exc
                search.memo[canon.graph] = known
            if canon.graph in search.results:
                used.append(search.results[canon.graph])
            if isinstance(known, Exception):
                used.append(known)
                return region
            return canon.restore(known)

        after, _ = optimize_regions(graph, egraph_ops(), run_one)
        done = [r for r in used if not isinstance(r, Exception)]
        errors = sorted({f"{type(r).__name__}: {r}" for r in used if isinstance(r, Exception)})
        totals: dict[str, int] = {}
        for r in done:
            for k, v in r.saturation.total_matches.items():
                totals[k] = totals.get(k, 0) + v
        fired = tuple(f"{k}×{v}" for k, v in sorted(totals.items()) if v)
        return SegmentReport(
            graph, after if after != graph else graph,
            sum(r.cost_before for r in done) if done else None, sum(r.cost_after for r in done) if done else None,
            sum(r.enodes for r in done) if done else None, sum(r.eclasses for r in done) if done else None, fired,
            "; ".join(sorted({f"{r.stop_reason}/{r.selection_status}" for r in done})) or "no region optimized",
            time.perf_counter() - start, error="; ".join(errors[:3]))
    except Exception as exc:  # noqa: BLE001 - the original graph is always a valid answer
        return SegmentReport(graph, graph, error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - start)


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
            placeholders = {n.attr["name"]: None for _, n in graph.leaves("input")}  # read at run time
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
        dt = np.dtype(a.dtype)
        if np.issubdtype(dt, np.floating):
            out.append(jnp.asarray(rng.standard_normal(a.shape), dtype=a.dtype))
        elif np.issubdtype(dt, np.integer):
            out.append(jnp.asarray(rng.integers(0, 4, a.shape), dtype=a.dtype))
        elif dt == np.bool_:
            out.append(jnp.asarray(rng.integers(0, 2, a.shape).astype(bool)))
        elif jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            out.append(jax.random.key(seed))
        else:
            out.append(jnp.zeros(a.shape, a.dtype))
    return out


def _compare(ref: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> tuple[bool, float]:
    worst = 0.0
    for r, g in zip(ref, got):
        r, g = np.asarray(r), np.asarray(g)
        if r.shape != g.shape or r.dtype != g.dtype:
            return False, float("inf")
        if not np.issubdtype(r.dtype, np.inexact):
            if not np.array_equal(r, g):
                return False, float("inf")
            continue
        r64, g64 = r.astype(np.float64), g.astype(np.float64)
        scale = max(float(np.max(np.abs(r64), initial=0.0)), 1.0)
        err = float(np.max(np.abs(r64 - g64), initial=0.0)) / scale
        worst = max(worst, err)
        if not np.allclose(g64, r64, rtol=rtol, atol=atol * scale, equal_nan=True):
            return False, err
    return True, worst


def build_signature(flat_fun: Callable[..., list[Any]], avals: Sequence[jax.ShapeDtypeStruct], signature: str,
                    opts: _Options) -> _Entry:
    """Capture, optimize, lower, check and time one signature."""
    from jax_backend.structure import canonicalize
    from jax_backend.timing import paired_timing

    start = time.perf_counter()
    mode = _lowering_mode(opts)
    try:
        program, out_tree = capture(flat_fun, *avals)
    except EqsatError as exc:
        return _Entry(None, None, SignatureReport(signature, "original", f"capture failed: {exc}"))
    if any(isinstance(v, jax.core.Tracer) for v in program.consts.values()):
        return _Entry(None, out_tree, SignatureReport(signature, "original",
                                                      "the function closes over traced values; not optimized"))
    steps = program.graphs
    opaque = tuple(s.name for s in program.opaque)
    try:
        search = _make_search(opts)
    except Exception as exc:  # noqa: BLE001 - no rules or no cost model: nothing to optimize with
        return _fallback(signature, out_tree, (), opaque, start, mode, f"setting up failed: {type(exc).__name__}: {exc}")
    distinct = len({canonicalize(s.graph).graph for s in steps})
    per_graph = opts.time_limit / max(distinct, 1)  # identical graphs reuse the first one's regions
    segments = [_optimize_graph(s.graph, opts, per_graph, search) for s in steps]
    extra = {"distinct_regions": len(search.memo), "reused_regions": search.reused}
    optimized, consts = _fold_program(program.with_graphs([s.after for s in segments]))
    try:
        runner, kernels = _graph_runner([s.graph for s in optimized.graphs], mode, consts)
    except Exception as exc:  # noqa: BLE001
        return _fallback(signature, out_tree, segments, opaque, start, mode, f"lowering failed: {type(exc).__name__}: {exc}",
                         **extra)
    segments = [SegmentReport(**{**s.__dict__, "kernels": k}) for s, k in zip(segments, kernels)]
    changed = any(s.after != s.before for s in segments)
    if not changed and mode == "xla":
        return _fallback(signature, out_tree, segments, opaque, start, mode, "no rewrite improved the program",
                         warn=False, **extra)

    optimized_flat = jax.jit(functools.partial(_run_program, optimized, runner))
    original_flat = jax.jit(flat_fun)
    ci = None
    try:
        with jax.ensure_compile_time_eval():
            args = _random_args(avals, seed=0)
            ref = original_flat(*args)
            got = optimized_flat(*args)
            ok, err = _compare(ref, got, opts.rtol, opts.atol)
            if not ok:
                return _fallback(signature, out_tree, segments, opaque, start, mode,
                                 f"optimized outputs differ from the original (max rel. error {err:.3g})", False, err,
                                 **extra)
            t_orig = t_opt = None
            if opts.check_speed:
                timing = paired_timing(original_flat, optimized_flat, args, opts.timing_rounds, opts.timing_budget_s)
                t_orig, t_opt, ci = timing.base_s, timing.other_s, timing.speedup_ci
                if not timing.faster_with_confidence:
                    return _fallback(signature, out_tree, segments, opaque, start, mode,
                                     f"optimized version not faster with {timing.confidence:.0%} confidence "
                                     f"(speedup {timing.speedup:.3f}, interval [{ci[0]:.3f}, {ci[1]:.3f}])",
                                     True, err, t_orig, t_opt, warn=False, speedup_ci=ci, **extra)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the original
        return _fallback(signature, out_tree, segments, opaque, start, mode,
                         f"checking the optimized version failed: {type(exc).__name__}: {exc}", **extra)
    reason = "checked equal and faster with confidence" if opts.check_speed else "checked equal (speed not checked)"
    report = SignatureReport(signature, "optimized", reason, tuple(segments), opaque, True,
                             err, t_orig, t_opt, time.perf_counter() - start, mode, speedup_ci=ci, **extra)
    return _Entry(optimized_flat, out_tree, report)


def _run_program(program: Program, runner: Callable[..., Any], *flat: Any) -> list[Any]:
    return replay(program, runner, flat)


def _fallback(signature: str, out_tree: Any, segments: Sequence[SegmentReport], opaque: tuple[str, ...], start: float,
              mode: str, reason: str, numerics_ok: bool | None = None, err: float | None = None,
              t_orig: float | None = None, t_opt: float | None = None, warn: bool = True, **extra: Any) -> _Entry:
    if warn:
        warnings.warn(f"eqsat.optimize: running the original function: {reason}", EqsatFallbackWarning, stacklevel=4)
    return _Entry(None, out_tree, SignatureReport(signature, "original", reason, tuple(segments), opaque, numerics_ok,
                                                  err, t_orig, t_opt, time.perf_counter() - start, mode, **extra))


# --- the wrapper ---------------------------------------------------------------------------------------

class OptimizedFunction:
    """A function that runs the eqsat-optimized version of `fun` when it is safe to."""

    def __init__(self, fun: Callable[..., Any], opts: _Options) -> None:
        self.fun = fun
        self.options = opts
        self._cache: dict[Hashable, _Entry] = {}
        functools.update_wrapper(self, fun)

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any, tuple[Any, ...]]:
        static = tuple((i, args[i]) for i in self.options.static_argnums if i < len(args))
        static += tuple((k, kwargs[k]) for k in self.options.static_argnames if k in kwargs)
        dyn_args = tuple(None if i in self.options.static_argnums else a for i, a in enumerate(args))
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.options.static_argnames}
        leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        return leaves, tree, static

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Entry, list[Any]]:
        leaves, tree, static = self._split(args, kwargs)
        leaves = [x if hasattr(x, "shape") and hasattr(x, "dtype") else jnp.asarray(x) for x in leaves]
        avals = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
        try:
            key: Hashable = (tree, tuple((a.shape, str(a.dtype)) for a in avals), static)
            hash(key)
        except TypeError:
            key = None
        entry = self._cache.get(key) if key is not None else None
        if entry is None:
            statics = dict(static)
            out_trees: list[Any] = []

            def flat_fun(*flat: Any) -> list[Any]:
                dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, flat)
                full = [statics.get(i, a) for i, a in enumerate(dyn_args)]
                out = self.fun(*full, **dyn_kwargs, **{k: statics[k] for k in self.options.static_argnames
                                                      if k in statics})
                leaves_out, out_tree = jax.tree_util.tree_flatten(out)
                out_trees.append(out_tree)
                return leaves_out

            signature = ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals) + (f"; static {static}" if static else "")
            if key is None:
                entry = _Entry(None, None, SignatureReport(signature, "original", "unhashable static arguments"))
            else:
                entry = build_signature(flat_fun, avals, signature, self.options)
                entry.out_tree = out_trees[0] if out_trees else None
                self._cache[key] = entry
        return entry, leaves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, leaves = self._entry(args, kwargs)
        if entry.fn is None:
            return self.fun(*args, **kwargs)
        return jax.tree_util.tree_unflatten(entry.out_tree, entry.fn(*leaves))

    def report(self, *args: Any, **kwargs: Any) -> SignatureReport:
        """What was done for the signature of these arguments (optimizing now if it was not yet)."""
        return self._entry(args, kwargs)[0].report

    @property
    def reports(self) -> list[SignatureReport]:
        return [e.report for e in self._cache.values()]


def optimize(fun: Callable[..., Any] | None = None, *, rules: Any = None, extractor: str = "ilp",
             cost_model: str = "roofline", time_limit: float = 5.0, static_argnums: int | Sequence[int] = (),
             static_argnames: str | Sequence[str] = (), rtol: float = 2e-4, check_speed: bool = True,
             lowering: str = "auto") -> Any:
    """Decorator: `@optimize` or `@optimize(rules=..., extractor=..., cost_model=..., time_limit=...)`."""
    if lowering not in ("auto", "xla", "pallas"):
        raise EqsatError(f"optimize: lowering must be 'auto', 'xla' or 'pallas', got {lowering!r}")
    if time_limit <= 0:
        raise EqsatError(f"optimize: time_limit must be positive, got {time_limit}")
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    opts = _Options(rules, extractor, cost_model, float(time_limit), nums, names, rtol, check_speed=check_speed,
                    lowering=lowering)
    if fun is None:
        return lambda f: OptimizedFunction(f, opts)
    return OptimizedFunction(fun, opts)

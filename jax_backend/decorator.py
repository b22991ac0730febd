"""`@eqsat.optimize`: capture a JAX function, optimize its IR graphs, and run the result only if it
is provably no worse.

Per input signature (tree structure, shapes, dtypes, static arguments) the wrapper captures the
function once, optimizes each IR graph under a time limit, lowers the result to lax ops (or Pallas
kernels on a GPU), checks it against the original on random inputs, and times both (paired,
interleaved). If anything fails, disagrees, or measures slower, it warns (once) and calls the
original. The optimized function is plain traceable JAX, so jit / grad / vmap compose with it; the
optimization itself runs at trace time on the abstract signature, with concrete checks done under
`jax.ensure_compile_time_eval`.
"""

from __future__ import annotations

import functools
import statistics
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

__all__ = ["optimize", "OptimizedFunction", "SignatureReport", "SegmentReport", "EqsatFallbackWarning"]


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
    timing_rounds: int = 15
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
    """None: eqsat's default rules; a path (or paths): rule files; else a sequence of Rule values."""
    from eqsat.pipeline import default_rules
    from eqsat.rewrites.parser import load_rules

    if rules is None:
        return default_rules()
    if isinstance(rules, (str, Path)):
        return list(load_rules(Path(rules)))
    rules = list(rules)
    if rules and all(isinstance(r, (str, Path)) for r in rules):
        return [r for path in rules for r in load_rules(Path(path))]
    return rules


def _optimize_graph(graph: Graph, opts: _Options, time_limit: float) -> SegmentReport:
    """Run eqsat's pipeline on one graph under `time_limit`; any failure keeps the graph as it was."""
    start = time.perf_counter()
    if sum(1 for n in graph.nodes if n.op not in ("input", "weight")) < 2:
        return SegmentReport(graph, graph, stop_reason="too small to optimize")
    try:
        from eqsat.cost import cost_model
        from eqsat.pipeline import optimize_graph
        from eqsat.saturate import Limits

        from jax_backend.regions import egraph_ops, optimize_regions

        rules = _load_rules(opts.rules)
        model = cost_model(opts.cost_model, "cpu" if jax.default_backend() == "cpu" else "h100")
        results: list[Any] = []
        deadline = start + time_limit

        def run_one(region: Graph) -> Graph:
            left = deadline - time.perf_counter()
            if left <= 0.05 or sum(1 for n in region.nodes if n.op not in ("input", "weight")) < 2:
                return region
            limits = Limits(iterations=opts.iterations, nodes=opts.max_enodes, seconds=left / 2, multi_rounds=1)
            try:
                result = optimize_graph(region, rules, limits, model, opts.extractor, time_limit=max(left / 2, 0.05))
            except Exception as exc:  # noqa: BLE001 - keep this region as it was
                results.append(exc)
                return region
            results.append(result)
            return result.optimized if result.numerics_ok else region

        after, _ = optimize_regions(graph, egraph_ops(), run_one)
        done = [r for r in results if not isinstance(r, Exception)]
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, Exception)]
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


def _graph_runner(graphs: Sequence[Graph], mode: str) -> tuple[Callable[[GraphStep, Sequence[Any]], Sequence[Any]],
                                                                  list[tuple[str, ...]]]:
    """Lowered functions for each graph (by identity) and the kernels each one uses."""
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

    def run(step: GraphStep, values: Sequence[Any]) -> Sequence[Any]:
        return lowered[id(step.graph)]({graph_leaf_name(i): v for i, v in zip(step.inputs, values)})

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


def paired_times(f: Callable[..., Any], g: Callable[..., Any], args: Sequence[Any], rounds: int,
                 budget_s: float = 10.0) -> tuple[float, float]:
    """Median times of f and g, run alternately (so drift and noise hit both alike)."""
    for _ in range(2):
        jax.block_until_ready(f(*args))
        jax.block_until_ready(g(*args))
    tf: list[float] = []
    tg: list[float] = []
    deadline = time.perf_counter() + budget_s
    for k in range(rounds):
        order = (f, g) if k % 2 == 0 else (g, f)
        for fn in order:
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            (tf if fn is f else tg).append(time.perf_counter() - start)
        if time.perf_counter() > deadline and k >= 2:
            break
    return statistics.median(tf), statistics.median(tg)


def build_signature(flat_fun: Callable[..., list[Any]], avals: Sequence[jax.ShapeDtypeStruct], signature: str,
                    opts: _Options) -> _Entry:
    """Capture, optimize, lower, check and time one signature."""
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
    per_graph = opts.time_limit / max(len(steps), 1)
    segments = [_optimize_graph(s.graph, opts, per_graph) for s in steps]
    opaque = tuple(s.name for s in program.opaque)
    optimized = program.with_graphs([s.after for s in segments])
    try:
        runner, kernels = _graph_runner([s.graph for s in optimized.graphs], mode)
    except Exception as exc:  # noqa: BLE001
        return _fallback(signature, out_tree, segments, opaque, start, mode, f"lowering failed: {type(exc).__name__}: {exc}")
    segments = [SegmentReport(**{**s.__dict__, "kernels": k}) for s, k in zip(segments, kernels)]
    changed = any(s.after != s.before for s in segments)
    if not changed and mode == "xla":
        return _fallback(signature, out_tree, segments, opaque, start, mode, "no rewrite improved the program",
                         warn=False)

    optimized_flat = jax.jit(functools.partial(_run_program, optimized, runner))
    original_flat = jax.jit(flat_fun)
    try:
        with jax.ensure_compile_time_eval():
            args = _random_args(avals, seed=0)
            ref = original_flat(*args)
            got = optimized_flat(*args)
            ok, err = _compare(ref, got, opts.rtol, opts.atol)
            if not ok:
                return _fallback(signature, out_tree, segments, opaque, start, mode,
                                 f"optimized outputs differ from the original (max rel. error {err:.3g})", False, err)
            t_orig = t_opt = None
            if opts.check_speed:
                t_orig, t_opt = paired_times(original_flat, optimized_flat, args, opts.timing_rounds)
                if t_opt > t_orig:
                    return _fallback(signature, out_tree, segments, opaque, start, mode,
                                     f"optimized version measured slower ({t_opt * 1e3:.3f} ms vs {t_orig * 1e3:.3f} ms)",
                                     True, err, t_orig, t_opt, warn=False)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the original
        return _fallback(signature, out_tree, segments, opaque, start, mode,
                         f"checking the optimized version failed: {type(exc).__name__}: {exc}")
    report = SignatureReport(signature, "optimized", "checked equal and not slower", tuple(segments), opaque, True,
                             err, t_orig, t_opt, time.perf_counter() - start, mode)
    return _Entry(optimized_flat, out_tree, report)


def _run_program(program: Program, runner: Callable[..., Any], *flat: Any) -> list[Any]:
    return replay(program, runner, flat)


def _fallback(signature: str, out_tree: Any, segments: Sequence[SegmentReport], opaque: tuple[str, ...], start: float,
              mode: str, reason: str, numerics_ok: bool | None = None, err: float | None = None,
              t_orig: float | None = None, t_opt: float | None = None, warn: bool = True) -> _Entry:
    if warn:
        warnings.warn(f"eqsat.optimize: running the original function: {reason}", EqsatFallbackWarning, stacklevel=4)
    return _Entry(None, out_tree, SignatureReport(signature, "original", reason, tuple(segments), opaque, numerics_ok,
                                                  err, t_orig, t_opt, time.perf_counter() - start, mode))


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

"""The work `@eqsat.optimize` does for one signature (`build_signature`): capture, search the
regions, lower each distinct candidate (weights folded), check it against the original on random
inputs, and time it, keeping the original unless a candidate is faster with confidence (the one
decision, `jax_backend.timing.choose_faster`).

Called by the wrapper (`jax_backend/decorator.py`) on a thread outside any trace; options and
report types are in `jax_backend/decorator_options.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from eqsat import candidates, ops
from eqsat.candidates import RegionSearch, SegmentReport
from eqsat.compare import outputs_agree
from eqsat.errors import EqsatError
from eqsat.ir import Graph
from jax_backend import shape_reuse
from jax_backend.capture import GraphStep, Program, capture, graph_leaf_name, replay
from jax_backend.decorator_options import Entry, Options, Outcome, cost_device
from jax_backend.decisions import DecisionKey, device_name, load_decision, program_hash, save_decision
from jax_backend.leaf_names import value_names
from jax_backend.shape_reuse import ShapeMemory
from jax_backend.timing import Decision, choose_faster

__all__ = ["build_signature"]

Built = tuple[str, Callable[..., Any], list[SegmentReport], float]
"""A candidate that agreed with the original: label, compiled function, segment reports, max rel. error."""


def _lowering_mode(opts: Options) -> str:
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
            extra = {name: np.asarray(v, dtype=ops.numpy_dtype(graph.leaf_dtypes()[name])) for name, v in folded.items()
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
        if jnp.issubdtype(dt, jnp.floating):  # bfloat16 too (numpy does not count it a floating type)
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


def _variants(steps: Sequence[GraphStep], search: RegionSearch, mode: str,
              only: str | None = None) -> list[tuple[str, list[Graph]]]:
    """The distinct programs the candidate models chose (each label once per distinct choice);
    `only`: that label's alone (a plan reused from another shape builds only what it kept)."""
    variants: list[tuple[str, list[Graph]]] = []
    seen: set[tuple[Any, ...]] = set()
    for label in search.models if only is None else [m for m in search.models if m == only]:
        applied = [candidates.apply_label(s.graph, label, search) for s in steps]
        key = tuple(k for _, k in applied)
        if any(key) and key not in seen:
            seen.add(key)
            variants.append((label, [g for g, _ in applied]))
    if mode == "pallas" and only in (None, "original"):  # the original graphs through Pallas kernels are a candidate too
        variants.append(("original", [s.graph for s in steps]))
    return variants


def build_signature(flat_fun: Callable[..., list[Any]], avals: Sequence[jax.ShapeDtypeStruct], signature: str,
                    opts: Options, device: str | None = None, leaf_names: Sequence[str] = (),
                    memory: ShapeMemory | None = None, defer_check: bool = False) -> Entry:
    """Capture, optimize, lower, check and time one signature; `device`: the cost-model device to
    extract for (default: `cost_device()`, read from the JAX device); `leaf_names`: the user's name
    of each flat argument, for the report (`jax_backend.leaf_names`); `memory`: the wrapper's
    results at other shapes (`jax_backend.shape_reuse`), reused and added to; `defer_check`: a
    plan kept at another shape is not compiled here but returned with `Entry.pending`, the check
    the wrapper runs on its own compiled program before the call returns (its compile is then the
    candidate's only one)."""
    from eqsat.structure import canonicalize

    start = time.perf_counter()
    try:
        program, out_tree = capture(flat_fun, *avals)
    except EqsatError as exc:
        return Outcome(signature, None, start, _lowering_mode(opts)).original(f"capture failed: {exc}")
    outcome = Outcome(signature, out_tree, start, _lowering_mode(opts)).with_facts(
        opaque=tuple(s.name for s in program.opaque),
        opaque_why=tuple(sorted({f"{s.name}: {s.why}" for s in program.opaque})),
        leaf_names=value_names(program, leaf_names))
    if any(isinstance(v, jax.core.Tracer) for v in program.consts.values()):
        return outcome.original("the function closes over traced values; not optimized", warn=False)
    if program.effects:  # checks and timings would run the user's callbacks and prints many times
        return outcome.original(f"the function has side effects ({', '.join(program.effects)}); the original runs "
                                "(compiled, once per call), nothing is checked or timed")
    steps = program.graphs
    device = cost_device()[0] if device is None else device
    outcome = outcome.with_facts(cost_device=device)
    graphs = [s.graph for s in steps]
    plan_key = shape_reuse.program_key(steps)
    plan = shape_reuse.plan_of(memory, plan_key) if opts.decision_cache else None
    if plan is not None and plan.label is None:  # discarded at another shape: nothing to search, build or time
        return outcome.with_facts(distinct_regions=plan.regions, searched_regions=0,
                                  shape_reused_regions=plan.regions).original(
            f"the plan of signature {plan.where} reused at this shape (not searched, built or timed again): "
            f"{plan.reason}", [SegmentReport(g, g, stop_reason="the plan of another shape reused") for g in graphs],
            warn=False)
    try:
        search = (memory.setup(device, graphs) if memory is not None else None) or candidates.make_search(
            opts.rules, opts.candidate_models or (opts.cost_model,), graphs, device, opts.extractor, opts.iterations,
            opts.max_enodes)
    except Exception as exc:  # noqa: BLE001 - no rules or no cost model: nothing to optimize with
        return outcome.original(f"setting up failed: {type(exc).__name__}: {exc}")
    seeded = shape_reuse.seed_search(search, graphs, memory) if memory is not None else 0
    distinct = len({canonicalize(s.graph).graph for s in steps})
    per_graph = opts.time_limit / max(distinct, 1)  # identical graphs reuse the first one's regions
    seconds = [candidates.collect_candidates(s.graph, per_graph, search) for s in steps]
    searched = (shape_reuse.remember(search, device, graphs, memory, seeded) if memory is not None
                else len(search.candidates) + len(search.failed))
    regions = len(search.candidates) + len(search.failed)
    outcome = outcome.with_facts(distinct_regions=regions, reused_regions=search.reused, searched_regions=searched,
                                 shape_reused_regions=seeded)
    if searched:
        plan = None  # a region not seen at the other shape: decide afresh
    variants = _variants(steps, search, outcome.mode, plan.label if plan is not None else None)
    reporting = _unmeasured(search) if seeded and not searched else _estimated(search, device)  # no op timed for a report

    def unchanged() -> list[SegmentReport]:
        return [candidates.segment_report(s.graph, s.graph, reporting, t) for s, t in zip(steps, seconds)]

    if not variants:
        shape_reuse.record_plan(memory, plan_key, shape_reuse.Plan(signature, None, "no rewrite changed the program",
                                                                   regions=regions))
        return outcome.original("no rewrite changed the program", unchanged(), warn=False)
    carried = plan is not None and plan.decision is not None and opts.check_speed and opts.reuse_timing_budget_s <= 0
    original_flat = jax.jit(flat_fun)
    try:
        defer = carried and defer_check
        args = [] if defer else _random_args(avals, seed=0)  # (a deferred check draws its own)
        # a carried plan is checked with the original compiled in the same program, or by the wrapper (`defer`)
        built, problems = _build_candidates(program, variants, None if carried else original_flat(*args), args, opts,
                                            outcome.mode, reporting, seconds, original_flat, defer)
        if not built:
            shape_reuse.record_plan(memory, plan_key, shape_reuse.Plan(signature, None, "; ".join(problems),
                                                                       regions=regions))
            return outcome.original("; ".join(problems), unchanged(), numerics_ok=False)
        if not opts.check_speed:
            label, fn, segs, err = built[0]
            return outcome.optimized(fn, f"candidate '{label}' checked equal (speed not checked)", segs,
                                     numerics_ok=True, max_rel_err=err)
        if carried and plan is not None and plan.decision is not None:
            (label, fn, segs, err), decision = built[0], plan.decision
        else:
            key = DecisionKey(program_hash(program, variants, (outcome.mode, f"margin={opts.speed_margin}")),
                              signature, device_name()) if opts.decision_cache else None
            (label, fn, segs, err), decision = _decide(original_flat, built, args, opts, key,
                                                       opts.reuse_timing_budget_s if plan is not None else None)
    except Exception as exc:  # noqa: BLE001 - any failure means: run the original
        return outcome.original(f"checking the optimized version failed: {type(exc).__name__}: {exc}", unchanged())
    low, high = decision.speedup_ci
    tried = ", ".join(b[0] for b in built)
    measured = {"numerics_ok": True, "max_rel_err": err, "time_original_s": decision.base_s,
                "time_optimized_s": decision.other_s, "speedup_ci": decision.speedup_ci, "decision": decision}
    how = (f"speedup {decision.speedup:.3f}, {decision.confidence:.0%} interval [{low:.3f}, {high:.3f}] vs threshold "
           f"{decision.threshold:.3f}, {decision.rounds} rounds"
           + (", decision from the cache" if decision.from_cache and not carried else "")
           + (f", timed at signature {plan.where}, checked equal at this shape and not re-timed" if carried and plan
              else f", the plan of signature {plan.where} re-timed briefly" if plan is not None else ""))
    if not carried:
        shape_reuse.record_plan(memory, plan_key, shape_reuse.Plan(signature, label if decision.keep else None,
                                                                   f"not faster with confidence ({how})", decision,
                                                                   regions))
    if not decision.keep:
        why = ("slower or not faster enough" if decision.verdict == "slower" else
               "inconclusive within the timing budget")
        return outcome.original(f"no candidate ({tried}) faster with confidence ({why}); best '{label}': {how}",
                                segs, warn=False, **measured)
    entry = outcome.optimized(fn, f"candidate '{label}' (of {tried}) checked equal and faster with confidence: {how}",
                              segs, **measured)
    if carried and defer_check:
        entry.pending = functools.partial(_deferred_check, original_flat, avals, opts, memory, plan_key,
                                          signature, label, regions)
    return entry


def _deferred_check(original: Callable[..., Any], avals: Sequence[jax.ShapeDtypeStruct], opts: Options,
                    memory: ShapeMemory | None, plan_key: Any, signature: str, label: str, regions: int,
                    run: Callable[..., Sequence[Any]]) -> str | None:
    """A carried plan's check, run by the wrapper once its program for this signature is compiled:
    `run` (that program, flat in and out) against the original on random inputs. None: equal;
    else why not (the plan becomes a discard)."""
    args = _random_args(avals, seed=0)
    ok, err = _compare(original(*args), run(*args), opts.rtol, opts.atol)
    if ok:
        return None
    problem = f"{label}: outputs differ from the original at this shape (max rel. error {err:.3g})"
    shape_reuse.record_plan(memory, plan_key, shape_reuse.Plan(signature, None, problem, regions=regions))
    return problem


def _unmeasured(search: RegionSearch) -> RegionSearch:
    """`search` without its measured cost models, for the reports of a signature whose search came
    from another shape: there their predicted costs would time every op at the new shapes (seconds
    of a first call, for a report only), so they are left unknown."""
    from jax_backend.measured_cost import MeasuredModel

    return dataclasses.replace(search, models={k: m for k, m in search.models.items()
                                               if not isinstance(m, MeasuredModel)})


def _estimated(search: RegionSearch, device: str) -> RegionSearch:
    """`search` with its measured cost models reading only the op timings taken (the search timed
    the ops its choices depend on) and the roofline's price for the others, for the reports: the
    ops every choice shares were not timed, and timing them for a report would cost the first call
    seconds."""
    from eqsat.cost import cost_model
    from jax_backend.measured_cost import MeasuredModel, TimedOrEstimated

    if not any(isinstance(m, MeasuredModel) for m in search.models.values()):
        return search
    estimate = cost_model("roofline", device)
    return dataclasses.replace(search, models={k: TimedOrEstimated(m, estimate) if isinstance(m, MeasuredModel) else m
                                               for k, m in search.models.items()})


def _build_candidates(program: Program, variants: Sequence[tuple[str, list[Graph]]], ref: Sequence[Any] | None,
                      args: Sequence[Any], opts: Options, mode: str, search: RegionSearch, seconds: Sequence[float],
                      original: Callable[..., Any] | None = None, defer: bool = False) -> tuple[list[Built], list[str]]:
    """Each variant folded, lowered, compiled and compared with the original's outputs `ref` on
    `args` (`ref` None: `original` and the variant compiled as one program and run once, so a
    candidate that is not timed costs one compile, not two; `defer`: not compiled nor compared here,
    the caller checks it, error 0); returns the ones that agree (label, function, segment reports,
    error) and why the others were dropped."""
    built: list[Built] = []
    problems: list[str] = []
    for label, graphs in variants:
        # a Pallas kernel the backend cannot compile (Triton's shared-memory limit, scalar operands)
        # costs the candidate its kernels, not the candidate: it is lowered through XLA instead
        modes = (mode, "xla") if mode == "pallas" and label != "original" else (mode,)
        for how in modes:
            try:
                optimized, consts = _fold_program(program.with_graphs(graphs))
                runner, kernels = _graph_runner([s.graph for s in optimized.graphs], how, consts)
                fn = jax.jit(functools.partial(_run_program, optimized, runner))
                if defer:
                    ok, err = True, 0.0
                elif ref is None and original is not None:
                    want, got = jax.jit(lambda *a, fn=fn: (original(*a), fn(*a)))(*args)
                    ok, err = _compare(want, got, opts.rtol, opts.atol)
                elif ref is None:
                    raise ValueError("no reference outputs and no original to compute them")
                else:
                    ok, err = _compare(ref, fn(*args), opts.rtol, opts.atol)
                break
            except Exception as exc:  # noqa: BLE001 - this lowering of the candidate is dropped
                problems.append(f"{label}: {how} lowering failed: {type(exc).__name__}: {exc}")
        else:
            continue
        if not ok:
            problems.append(f"{label}: outputs differ from the original (max rel. error {err:.3g})")
            continue
        segs = [dataclasses.replace(candidates.segment_report(s.graph, g, search, t, label), kernels=k,
                                    cost_model=label)
                for s, g, t, k in zip(program.graphs, graphs, seconds, kernels)]
        built.append((label, fn, segs, err))
    return built, problems


def _decide(original: Callable[..., Any], built: Sequence[Built], args: Sequence[Any], opts: Options,
            key: DecisionKey | None, budget_s: float | None = None) -> tuple[Built, Decision]:
    """The candidate to keep or not, and the decision (`budget_s`: timing budget other than the
    options'). A decision persisted for `key` (this
    program, its candidates, signature and device) is reused without timing. Otherwise, with
    several candidates, all are screened in the same interleaved rounds and the fastest goes
    through the sequential test on fresh rounds (so the luckiest screen does not bias it)."""
    stored = load_decision(key) if key is not None else None
    if stored is not None:
        label, decision = stored
        chosen = [b for b in built if b[0] == label]
        if chosen or not decision.keep:
            return (chosen or list(built))[0], decision
    choice = choose_faster(original, [b[1] for b in built], args, opts.timing_rounds,
                           opts.timing_budget_s if budget_s is None else budget_s,
                           screen_budget_s=opts.screen_budget_s, margin=opts.speed_margin)
    if key is not None:
        save_decision(key, built[choice.best][0], choice.decision)
    return built[choice.best], choice.decision


def _run_program(program: Program, runner: Callable[..., Any], *flat: Any) -> list[Any]:
    return replay(program, runner, flat)

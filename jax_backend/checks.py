"""The JAX-side checks the commands run: candidate plans of a graph lowered, compared and judged by
running them (`judge_plans`, for `eqsat optimize` and `eqsat bench tensat`), and a parallel plan run on
the devices against the single-device program (`check_on_devices`, for `eqsat parallel`).

They live beside the lowering (`jax_backend.lower`, `jax_backend.shard`) because they need JAX;
the core (`eqsat/`) stays free of it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eqsat.ir import Graph
from eqsat.parallel.mesh import Mesh
from jax_backend.timing import Decision, PairedTiming

__all__ = ["Judgement", "Measurement", "PlanCheck", "check_on_devices", "compare_outputs", "judge_plans",
           "measure_pair", "reference_gradients", "time_interleaved"]


# --- a graph against its optimized version (eqsat optimize) ---------------------------------------

def time_interleaved(fns: Sequence[Callable[[], Any]], repeats: int, warmup: int = 3) -> list[float]:
    """Median seconds per call of each thunk over `repeats` interleaved rounds: the one timing
    policy, `jax_backend.timing.interleaved_rounds` (each thunk's results are blocked on)."""
    from jax_backend.timing import interleaved_rounds

    times, _ = interleaved_rounds(fns, max(repeats, 1), min_rounds=max(repeats, 1), warmup=warmup)
    return [statistics.median(t) for t in times]


def compare_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float, atol: float) -> bool:
    """Same number of outputs, same shapes, within tolerance relative to each output's magnitude
    (NaN only where the reference has NaN): `eqsat.compare.outputs_agree`."""
    from eqsat.compare import outputs_agree

    return outputs_agree(expected, got, rtol, atol).ok


@dataclass(frozen=True)
class Measurement:
    """JAX numerics and timings of an original and an optimized graph."""

    numerics_ok: bool
    max_abs_diff: float
    before_s: float
    after_s: float
    reason: str = ""  # why the numerics are not ok
    original_abs_err: float = 0.0  # the original's own error in JAX against the float64 reference


def _lowered(graph: Graph, inputs: Mapping[str, np.ndarray]) -> Callable[[], Any]:
    """`graph` with its weight-only values computed once (as a model does when it loads its
    weights; the cost models price them the same way, `eqsat.cost.weight_only_nodes`), jitted,
    as a thunk on device-resident arguments."""
    import jax

    from jax_backend.lower import fold_weights, to_jax

    folded, values = fold_weights(graph, inputs)
    fn = jax.jit(to_jax(folded))
    args = {k: jax.device_put(v) for k, v in values.items()}
    return lambda: jax.block_until_ready(fn(args))


@dataclass(frozen=True)
class _Reference:
    """The float64 numpy outputs and the original's own float32 error against them."""

    outputs: list[np.ndarray]
    own_err: list[float]
    own_max_abs: float
    own_bad: str  # why the original itself is too far off its reference ("" if not)


def _reference(original: Graph, inputs: Mapping[str, np.ndarray], run: Callable[[], Any], rtol: float,
               atol: float) -> _Reference:
    from eqsat.compare import outputs_agree

    with np.errstate(all="ignore"):
        reference = original.evaluate({k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()})
    own = outputs_agree(reference, [np.asarray(x) for x in run()], rtol, atol)
    bad = f"the original itself is off its float64 reference ({own.reason})" if own.max_rel_err > 1e-2 else ""
    return _Reference(reference, [e if math.isfinite(e) else 0.0 for e in own.abs_diffs], own.max_abs_diff, bad)


def _agrees(ref: _Reference, run: Callable[[], Any], rtol: float, atol: float) -> tuple[bool, float, str]:
    """The check: a plan's error against the float64 reference, relative to each output's
    magnitude, within rtol, or within 4x the original's own error where that is larger (an
    ill-conditioned graph in float32); never when the original itself is far off."""
    from eqsat.compare import outputs_agree

    verdict = outputs_agree(ref.outputs, [np.asarray(x) for x in run()], rtol, atol,
                            allowed_abs=[4 * e for e in ref.own_err])
    if ref.own_bad:
        return False, verdict.max_abs_diff, ref.own_bad
    return verdict.ok, verdict.max_abs_diff, verdict.reason


def measure_pair(original: Graph, optimized: Graph, inputs: Mapping[str, np.ndarray], repeats: int,
                 rtol: float, atol: float) -> Measurement:
    """Lower both graphs, check the optimized one against the float64 numpy reference (`_agrees`),
    and time both (medians of interleaved rounds; no decision: see `judge_plans`)."""
    before = _lowered(original, inputs)
    after = _lowered(optimized, inputs)
    ref = _reference(original, inputs, before, rtol, atol)
    ok, diff, reason = _agrees(ref, after, rtol, atol)
    before_s, after_s = time_interleaved([before, after], repeats)
    return Measurement(ok, diff, before_s, after_s, reason, ref.own_max_abs)


# --- candidate plans judged by running them (eqsat optimize, eqsat bench tensat) ------------------

@dataclass(frozen=True)
class PlanCheck:
    """One candidate plan: whether it agreed with the original through JAX, and its screen timing
    against the original (None: not timed, because it disagreed or is the original's structure)."""

    name: str
    numerics_ok: bool
    max_abs_diff: float
    reason: str = ""
    same_as_original: bool = False
    timing: PairedTiming | None = None


@dataclass(frozen=True)
class Judgement:
    """The plans run end to end, and the one decision (`jax_backend.timing.choose_faster`): `plan`
    is the candidate timed against the original on fresh rounds (the fastest of the screen), `kept`
    says whether it replaces the original ("optimized") or not ("original")."""

    checks: tuple[PlanCheck, ...]
    plan: str | None  # None: no candidate differs from the original and agrees with it
    timing: Decision | None  # `plan` against the original: the sequential test the decision rests on
    kept: str  # "optimized" | "original"
    original_s: float  # median seconds per call of the original
    original_abs_err: float  # the original's own error in JAX against the float64 reference

    @property
    def speedup(self) -> float:
        """The plan's measured speedup over the original (1.0 when there is no plan)."""
        return self.timing.speedup if self.timing is not None else 1.0

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return self.timing.speedup_ci if self.timing is not None else (1.0, 1.0)

    @property
    def passes(self) -> int:
        """Paired rounds (original and plan, each once per round) behind the decision's interval."""
        return self.timing.rounds if self.timing is not None else 0


def judge_plans(original: Graph, plans: Sequence[tuple[str, Graph]], inputs: Mapping[str, np.ndarray],
                rtol: float, atol: float, rounds: int = 30, budget_s: float = 20.0, min_rounds: int = 5,
                ) -> Judgement:
    """Run `original` and each named plan end to end through JAX (weights folded, jitted), check
    each plan against the float64 reference (`_agrees`, i.e. `eqsat.compare.outputs_agree`), and
    decide with `choose_faster`: a plan replaces the original only if faster with confidence. Plans
    that lower to the original's program (`eqsat.candidates.program_key`: the same structure, fused
    activations aside) are not timed (nothing to gain: timing them would measure noise, and could keep
    it); plans of one program are lowered and timed once. At least `min_rounds` rounds each."""
    from eqsat.candidates import program_key
    from jax_backend.timing import choose_faster

    base = _lowered(original, inputs)
    ref = _reference(original, inputs, base, rtol, atol)
    key_original = program_key(original)
    by_key: dict[tuple[Any, ...], int] = {}  # structure -> index into `timed`
    diffs: dict[tuple[Any, ...], float] = {}
    timed: list[tuple[str, Callable[[], Any]]] = []
    pending: list[tuple[str, tuple[Any, ...] | None, bool, float, str]] = []
    for name, graph in plans:
        key = program_key(graph)
        if key == key_original:
            pending.append((name, None, True, 0.0, ""))
            continue
        if key not in by_key:
            run = _lowered(graph, inputs)
            ok, diff, reason = _agrees(ref, run, rtol, atol)
            if not ok:
                pending.append((name, None, False, diff, reason))
                continue
            by_key[key], diffs[key] = len(timed), diff
            timed.append((name, run))
        pending.append((name, key, True, diffs[key], ""))
    if not timed:
        (original_s,) = time_interleaved([base], max(rounds, min_rounds))
        checks = tuple(PlanCheck(n, ok, diff, why, same_as_original=ok) for n, _, ok, diff, why in pending)
        return Judgement(checks, None, None, "original", original_s, ref.own_max_abs)
    choice = choose_faster(base, [run for _, run in timed], (), max(rounds, min_rounds), budget_s, min_rounds)
    checks = tuple(PlanCheck(n, True, diff, "", False, choice.screens[by_key[k]]) if k is not None
                   else PlanCheck(n, ok, diff, why, same_as_original=ok) for n, k, ok, diff, why in pending)
    return Judgement(checks, timed[choice.best][0], choice.timing,
                     "original" if choice.kept is None else "optimized", choice.timing.base_s, ref.own_max_abs)


# --- a parallel plan on the devices (eqsat parallel) ----------------------------------------------

def _close(a: np.ndarray, b: np.ndarray, rtol: float = 2e-4) -> bool:
    """`eqsat.compare.outputs_agree` of `a` against the reference `b`, within `rtol` of its
    magnitude (at least 1)."""
    from eqsat.compare import outputs_agree

    return outputs_agree([b], [a], rtol, atol=rtol).ok


def reference_gradients(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """The single-device program's gradients of sum(out**2)/2 per weight name (computed once per
    case when many plans are checked against it)."""
    import jax
    import jax.numpy as jnp

    from jax_backend.lower import to_jax_positional

    values = _scaled_inputs(graph, seed)
    weights = [n.attr["name"] for _, n in graph.leaves("weight")]
    names, ref_fn = to_jax_positional(graph)

    def ref_loss(*arrays: Any) -> Any:
        return sum(jnp.sum(o ** 2) / 2 for o in ref_fn(*arrays))

    ref_step = jax.jit(jax.grad(ref_loss, argnums=tuple(i for i, n in enumerate(names) if n in weights)))
    ref_grads = ref_step(*[jnp.asarray(values[n]) for n in names])
    return {n: np.asarray(g, np.float64) for n, g in zip([n for n in names if n in weights], ref_grads)}


def check_on_devices(graph: Graph, plan: Graph, mesh: Mesh, seed: int = 0, gradients: bool = True,
                     reference: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Run `plan` on JAX devices: outputs (and gradients of sum(out**2)/2) against the single-device
    program (`reference`: its gradients, if already known), and what the compiled forward and step
    programs communicate and allocate."""
    from jax_backend.shard import compiled_report, shard_plan, step_program

    program = shard_plan(plan, mesh)
    values = _scaled_inputs(graph, seed)
    args = program.place(values)
    outs = program.fn(*args)
    ref = graph.evaluate({k: v.astype(np.float64) for k, v in values.items()})
    ok = all(_close(np.asarray(o), r) for o, r in zip(outs, ref))
    fwd = compiled_report(program, args)
    result: dict[str, Any] = {"outputs_ok": ok, "measured_comm_bytes": fwd.comm_bytes,
                              "measured_collectives": fwd.kinds(), "measured_fwd_mem_bytes": fwd.mem_bytes}
    if gradients:
        weights = [n.attr["name"] for _, n in graph.leaves("weight")]
        step = step_program(program, weights)
        grads = step(*args)
        by_name = reference if reference is not None else reference_gradients(graph, seed)
        grads_ok = all(_close(np.asarray(g), by_name[n], 1e-3)
                       for n, g in zip([n for n in program.names if n in weights], grads))
        compiled = step.lower(*args).compile()
        from jax_backend.shard import compiled_collectives, compiled_contractions

        text = compiled.as_text()
        step_colls = compiled_collectives(text)
        mem = compiled.memory_analysis()
        step_mem = float(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                         - mem.alias_size_in_bytes)
        result.update(gradients_ok=grads_ok, measured_step_comm_bytes=float(sum(c.bytes for c in step_colls)),
                      measured_step_collectives=sorted(c.kind for c in step_colls), measured_mem_bytes=step_mem,
                      measured_step_contractions=compiled_contractions(text))
    result["numerics_ok"] = bool(result["outputs_ok"] and result.get("gradients_ok", True))
    return result


def _scaled_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random inputs with weights scaled by 1/sqrt(fan-in), so deep stacks stay O(1) in float32."""
    values = graph.random_inputs(seed)
    weights = {n.attr["name"] for _, n in graph.leaves("weight")}
    return {k: (v / np.sqrt(v.shape[-2]) if k in weights and v.ndim >= 2 and v.dtype.kind not in "biu" else v
                ).astype(v.dtype)  # each leaf in its own dtype (float32 unless the graph says otherwise)
            for k, v in values.items()}

"""The JAX-side checks the commands run: a graph and its optimized version lowered, compared and
timed (`measure_pair`, for `eqsat optimize` and `eqsat bench tensat`), and a parallel plan run on
the devices against the single-device program (`check_on_devices`, for `eqsat parallel`).

They live beside the lowering (`jax_backend.lower`, `jax_backend.shard`) because they need JAX;
the core (`eqsat/`) stays free of it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eqsat.ir import Graph
from eqsat.parallel.mesh import Mesh

__all__ = ["Measurement", "check_on_devices", "compare_outputs", "measure_pair", "reference_gradients",
           "time_interleaved"]


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


def measure_pair(original: Graph, optimized: Graph, inputs: Mapping[str, np.ndarray], repeats: int,
                 rtol: float, atol: float) -> Measurement:
    """Lower both graphs, check them against the float64 numpy reference, and time both.

    The check is `outputs_agree`: the optimized graph's error against the float64 reference,
    relative to each output's magnitude, must be within rtol, or within 4x the original's own
    error where that is larger (an ill-conditioned graph in float32).
    Values computed from weights alone (the concatenated weights of merged matmuls) are computed
    once before timing, as a model does when it loads its weights; the cost model prices them
    the same way (`eqsat.cost.weight_only_nodes`).
    """
    import jax

    from eqsat.compare import outputs_agree
    from jax_backend.lower import fold_weights, to_jax

    runs = []
    for graph in (original, optimized):
        folded, values = fold_weights(graph, inputs)
        runs.append((jax.jit(to_jax(folded)), {k: jax.device_put(v) for k, v in values.items()}))
    (before, args_before), (after, args_after) = runs
    with np.errstate(all="ignore"):
        reference = original.evaluate({k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()})
    out_before = [np.asarray(x) for x in jax.block_until_ready(before(args_before))]
    out_after = [np.asarray(x) for x in jax.block_until_ready(after(args_after))]
    own = outputs_agree(reference, out_before, rtol, atol)
    own_err = [e if math.isfinite(e) else 0.0 for e in own.abs_diffs]
    verdict = outputs_agree(reference, out_after, rtol, atol, allowed_abs=[4 * e for e in own_err])
    if own.max_rel_err > 1e-2:  # the original's own error is no excuse once it is this large
        verdict = replace(verdict, ok=False, reason=f"the original itself is off its float64 reference ({own.reason})")
    before_s, after_s = time_interleaved(
        [lambda: jax.block_until_ready(before(args_before)), lambda: jax.block_until_ready(after(args_after))],
        repeats)
    return Measurement(verdict.ok, verdict.max_abs_diff, before_s, after_s, verdict.reason, own.max_abs_diff)


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

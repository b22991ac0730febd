"""`eqsat parallel MODEL --mesh 8 | 2x4`: plan a model on a device mesh and check the plan on JAX.

The plan (algebra and sharding from one ILP over the saturated e-graph, `eqsat.parallel.plan`) is
compared with the best pure data-parallel plan, the best Megatron-style plan (column / row / head
splits: what one would write by hand, found by the same search restricted to those rules) and
algebra-first (the program's algebra as given, fused activations kept, then sharded), run as a `shard_map` program on the emulated devices (outputs and gradients against
the single-device program), and its predicted communication and memory are compared with what
the compiled programs do (`compile().as_text()`, `memory_analysis()`). Communication bytes are per
device: `*_comm_bytes` of the forward program, `*_step_comm_bytes` of a training step.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from eqsat.errors import EqsatError
from eqsat.ir import Graph
from eqsat.parallel.mesh import PRESETS, Mesh, parse_mesh
from eqsat.parallel.plan import (
    PlanResult,
    PricedEGraph,
    plan_graph,
    plan_report,
    random_plans,
    saturate_and_price,
)
from experiments.parallel_models import PARALLEL_MODELS, build_parallel_model

__all__ = ["BASELINES", "add_arguments", "check_on_devices", "reference_gradients", "run", "run_case"]

BASELINES = ("data-parallel", "megatron", "algebra-first")


def _close(a: np.ndarray, b: np.ndarray, rtol: float = 2e-4) -> bool:
    scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
    return bool(np.max(np.abs(np.asarray(a, np.float64) - b)) <= rtol * scale) if b.size else True


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
        from jax_backend.shard import compiled_collectives

        step_colls = compiled_collectives(compiled.as_text())
        mem = compiled.memory_analysis()
        step_mem = float(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                         - mem.alias_size_in_bytes)
        result.update(gradients_ok=grads_ok, measured_step_comm_bytes=float(sum(c.bytes for c in step_colls)),
                      measured_step_collectives=sorted(c.kind for c in step_colls), measured_mem_bytes=step_mem)
    result["numerics_ok"] = bool(result["outputs_ok"] and result.get("gradients_ok", True))
    return result


def _scaled_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random inputs with weights scaled by 1/sqrt(fan-in), so deep stacks stay O(1) in float32."""
    values = graph.random_inputs(seed)
    weights = {n.attr["name"] for _, n in graph.leaves("weight")}
    return {k: (v / np.sqrt(v.shape[-2]) if k in weights and v.ndim >= 2 else v).astype(np.float32)
            for k, v in values.items()}


def _within(pred: float, measured: float, tol: float) -> bool:
    return abs(pred - measured) <= tol * max(measured, 1.0)


def run_case(model: str, mesh_spec: str, time_limit: float = 20.0, budget_fraction: float | None = None,
             random: int = 0, measure: bool = True, base: str = "cpu8") -> dict[str, Any]:
    """One row: the joint plan, the baselines, and (with `measure`) the device check."""
    graph = build_parallel_model(model)
    mesh = parse_mesh(mesh_spec, base)
    budget = None
    if budget_fraction is not None:
        budget = budget_fraction * plan_report(graph, _replicated_model(mesh)).mem_bytes
    priced = saturate_and_price(graph, mesh, "joint")  # the joint plan's e-graph, also the random plans'
    joint = plan_graph(graph, mesh, "joint", time_limit=time_limit, mem_budget=budget, priced=priced)
    baselines = {s: plan_graph(graph, mesh, s, time_limit=time_limit) for s in BASELINES}
    row: dict[str, Any] = {"model": model, **joint.to_json()}
    row.update(_baseline_fields(joint, baselines))
    if budget is not None:
        row.update(mem_budget_bytes=budget, fits_budget=joint.report.mem_bytes <= budget)
    if measure:
        row.update(check_on_devices(graph, joint.plan, mesh))
        pred_kinds = sorted(c.kind for _, c in joint.report.collectives if c.phase == "forward")
        row.update(comm_within_5pct=_within(row["predicted_comm_bytes"], row["measured_comm_bytes"], 0.05),
                   same_collectives=pred_kinds == row["measured_collectives"],
                   step_comm_within_5pct=_within(row["predicted_step_comm_bytes"], row.get("measured_step_comm_bytes", 0.0), 0.05),
                   mem_within_15pct=_within(row["predicted_mem_bytes"], row.get("measured_mem_bytes", 0.0), 0.15))
        if random:
            row.update(_random_checks(graph, mesh, random, priced))
    return row


def _replicated_model(mesh: Mesh) -> Any:
    from eqsat.cost import cost_model
    from eqsat.parallel.cost import ParallelCostModel

    return ParallelCostModel(mesh, cost_model("roofline", mesh.device))


def _baseline_fields(joint: PlanResult, baselines: Mapping[str, PlanResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, res in baselines.items():
        key = name.replace("-", "_")
        out[f"{key}_comm_bytes"] = res.report.comm_bytes("forward")
        out[f"{key}_step_comm_bytes"] = res.report.comm_bytes(None)
        out[f"{key}_s"] = res.report.step_s
        out[f"{key}_numerics_ok"] = res.numerics_ok
    best_baseline = min(r.report.step_s for r in baselines.values())
    out["joint_vs_best_baseline"] = best_baseline / joint.report.step_s if joint.report.step_s else None
    return out


def _random_checks(graph: Graph, mesh: Mesh, count: int, pe: PricedEGraph | None = None) -> dict[str, Any]:
    """`count` random plans from the joint e-graph, each run on the devices against the program
    (outputs and gradients), with their predicted communication and memory against the compiled."""
    pe = pe if pe is not None else saturate_and_price(graph, mesh, "joint")
    reference = reference_gradients(graph)
    failures, comm_ok, kinds_ok, mem_ok, mem_ratios = 0, 0, 0, 0, []
    for plan in random_plans(pe, count, seed=1):
        report = plan_report(plan, pe.model)
        res = check_on_devices(graph, plan, mesh, gradients=True, reference=reference)
        failures += 0 if res["numerics_ok"] else 1
        comm_ok += _within(report.comm_bytes("forward"), res["measured_comm_bytes"], 0.05)
        kinds_ok += sorted(c.kind for _, c in report.collectives if c.phase == "forward") == res["measured_collectives"]
        mem_ok += _within(report.mem_bytes, res["measured_mem_bytes"], 0.15)
        mem_ratios.append(report.mem_bytes / max(res["measured_mem_bytes"], 1.0))
    return {"random_plans": count, "random_numerics_failures": failures, "random_comm_within_5pct": comm_ok,
            "random_same_collectives": kinds_ok, "random_mem_within_15pct": mem_ok,
            "random_mem_ratio_range": [min(mem_ratios, default=1.0), max(mem_ratios, default=1.0)]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=f"model: {', '.join(PARALLEL_MODELS)}")
    parser.add_argument("--mesh", default="8", help=f"mesh shape (8, 2x4, 4x2) or preset ({', '.join(PRESETS)})")
    parser.add_argument("--base", default="cpu8", help="preset whose devices and links a shape uses")
    parser.add_argument("--time-limit", type=float, default=20.0, help="ILP time limit per plan, seconds")
    parser.add_argument("--budget", type=float, default=None,
                        help="per-device memory budget as a fraction of the unparallelized footprint (e.g. 0.4)")
    parser.add_argument("--random-plans", type=int, default=0, help="also check this many random plans on the devices")
    parser.add_argument("--no-measure", action="store_true", help="plan only: no JAX run or compile")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if args.model not in PARALLEL_MODELS:
        raise EqsatError(f"unknown model '{args.model}'; known: {', '.join(PARALLEL_MODELS)}")
    t = time.perf_counter()
    row = run_case(args.model, args.mesh, args.time_limit, args.budget, args.random_plans, not args.no_measure, args.base)
    row["total_s"] = time.perf_counter() - t
    yield row

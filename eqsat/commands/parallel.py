"""`eqsat parallel MODEL --mesh 8 | 2x4`: plan a model on a device mesh and check the plan on JAX.

The plan (algebra and sharding from one ILP over the saturated e-graph, `eqsat.parallel.planner`) is
compared with the baselines, each the best plan of its kind: pure data parallelism (the search
restricted to the data-parallel rule), FSDP, DP x TP (on two mesh axes or more: data parallel over
all but the last, Megatron's rules over the last), Megatron by hand (`eqsat.models.parallel_hand`: one split per
weight, written as a practitioner would), the Megatron-style search (column / row / head rules
only) and algebra first (the program's algebra as a single-device optimizer leaves it, fused
activations kept, then every sharding rule). Each plan runs as a `shard_map` program on the emulated
devices (outputs and gradients against the single-device program) and its predicted communication
and memory are compared with what the compiled programs do (`compile().as_text()`,
`memory_analysis()`). Communication bytes are per device: `*_comm_bytes` of the forward program,
`*_step_comm_bytes` of a training step. `unity_*` fields restate Unity's MLP figure (two devices:
a ring all-reduce moves 2(n-1)/n S = S per device, so bytes are counted as buffer sizes S).

The joint plan is the fastest; a baseline may move fewer bytes at a slower step (Megatron by hand
replicates what it does not split; the data-parallel search may find that splitting nothing, which
moves no bytes, is its fastest plan, as on moe). For
such a baseline the joint search is asked again with the baseline's step bytes as a budget (a
knapsack row of the same ILP, started from the baseline's plan where the joint e-graph holds it):
`*_at_bytes` is that plan, and `joint_dominates_*` says whether the joint search has a plan no
slower (predicted) and moving no more (compiled) than the baseline. The device checks are
`jax_backend.checks.check_on_devices`; the cases are `eqsat.models`' "parallel" family.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


from eqsat.errors import EqsatError
from eqsat.ir import Graph
from eqsat.models import PARALLEL_MODELS, build_parallel_model, lookup
from eqsat.models.parallel_hand import megatron_by_hand
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import PRESETS, Mesh, parse_mesh
from eqsat.parallel.planner import (
    PlanResult,
    PricedEGraph,
    plan_graph,
    plan_report,
    random_plans,
    saturate_and_price,
    with_weights,
)
from jax_backend.checks import check_on_devices, reference_gradients

__all__ = ["BASELINES", "add_arguments", "hand_plan", "run", "run_case"]

BASELINES = ("data-parallel", "fsdp", "megatron", "dp-x-tp", "megatron-search", "algebra-first")
SEARCHED = {"data-parallel": "data-parallel", "fsdp": "fsdp", "dp-x-tp": "dp-x-tp", "megatron-search": "megatron",
            "algebra-first": "algebra-first"}
UNITY_BYTES = {"algebra_first_dp": 813_056, "joint": 131_072}  # Unity OSDI'22, 2-layer MLP on 2 GPUs, times d


def _within(pred: float, measured: float, tol: float) -> bool:
    return abs(pred - measured) <= tol * max(measured, 1.0)


def run_case(model: str, mesh_spec: str, time_limit: float = 20.0, budget_fraction: float | None = None,
             random: int = 0, measure: bool = True, base: str = "cpu8", comm_budget: float | None = None,
             graph: Graph | None = None, cost: ParallelCostModel | None = None,
             trust_tested: bool = False, measure_s: float = 8.0) -> dict[str, Any]:
    """One row: the joint plan (within the memory and communication budgets if given), the
    baselines, the joint plan at each baseline's bytes, and (with `measure`) the device checks and
    the joint plan's step run against data parallel's (`measure_s` seconds of timing at most).
    `graph`: a program of the user's (`--graph`), named `model`; it has no Megatron by hand.
    `cost`: the training-step model every plan is priced with (default: the mesh's nominal links)."""
    graph = graph if graph is not None else build_parallel_model(model)
    mesh = parse_mesh(mesh_spec, base)
    budget = None
    if budget_fraction is not None:
        budget = budget_fraction * plan_report(graph, _replicated_model(mesh)).mem_bytes
    priced = saturate_and_price(graph, mesh, "joint", model=cost, trust_tested=trust_tested)  # also the random plans'
    baselines = {name: plan_graph(graph, mesh, s, time_limit=time_limit, model=cost,
                                  priced=saturate_and_price(graph, mesh, s, model=cost, trust_tested=trust_tested))
                 for name, s in SEARCHED.items() if s != "dp-x-tp" or len(mesh.axes) > 1}  # DP x TP needs two axes
    if model in PARALLEL_MODELS:
        baselines["megatron"] = hand_plan(model, graph, mesh, cost)
    # the joint ILP starts from every baseline's plan its e-graph holds: never predicted slower than those
    joint = plan_graph(graph, mesh, "joint", time_limit=time_limit, mem_budget=budget, priced=priced,
                       comm_budget=comm_budget, starts=[b.plan for b in baselines.values()])
    row: dict[str, Any] = {"model": model, **joint.to_json()}
    row.update(_baseline_fields(joint, baselines))
    if model == "unity-mlp":
        row.update(_unity_fields(joint, baselines["data-parallel"]))
    if budget is not None:
        row.update(mem_budget_bytes=budget, fits_budget=joint.report.mem_bytes <= budget)
    if comm_budget is not None:
        row.update(comm_budget_bytes=comm_budget)
    if measure:
        row.update(check_on_devices(graph, joint.plan, mesh))
        pred_kinds = sorted(c.kind for _, c in joint.report.collectives if c.phase == "forward")
        step_kinds = sorted(c.kind for _, c in joint.report.collectives)
        row.update(comm_within_5pct=_within(row["predicted_comm_bytes"], row["measured_comm_bytes"], 0.05),
                   same_collectives=pred_kinds == row["measured_collectives"],
                   same_step_collectives=step_kinds == row.get("measured_step_collectives"),
                   step_comm_within_5pct=_within(row["predicted_step_comm_bytes"], row.get("measured_step_comm_bytes", 0.0), 0.05),
                   mem_within_15pct=_within(row["predicted_mem_bytes"], row.get("measured_mem_bytes", 0.0), 0.15),
                   no_recomputation=row.get("measured_step_contractions") == joint.report.contractions)
        row.update(_measure_baselines(graph, mesh, baselines, row))
        row.update(_judged_by_running(graph, mesh, joint, baselines["data-parallel"], measure_s))
    if budget is None and comm_budget is None:
        row.update(_dominance(graph, mesh, priced, joint, baselines, row, min(time_limit, 10.0), measure))
    if measure and random:
        row.update(_random_checks(graph, mesh, random, priced))
    return row


def hand_plan(model: str, graph: Graph, mesh: Mesh, cost: ParallelCostModel | None = None) -> PlanResult:
    """Megatron by hand as a `PlanResult`: priced by the same model, checked in numpy like a search's."""
    from eqsat.pipeline import numerics_match

    t = time.perf_counter()
    plan = megatron_by_hand(model, graph, mesh)
    report = plan_report(plan, cost or _replicated_model(mesh))
    ok, diff = numerics_match(graph, plan)
    return PlanResult("megatron-by-hand", mesh, plan, report, ok, diff, 0.0, 0.0, 0.0, 0, 0, "hand-written", None, 0,
                      "hand-written", {"build_s": time.perf_counter() - t})


def _unity_fields(joint: PlanResult, dp: PlanResult) -> dict[str, Any]:
    """Unity's figure counts the bytes a step moves in units of d (bytes per element): data
    parallelism after the algebra moves the weights' gradients, 813,056 d."""
    ours_dp = dp.report.comm_bytes(None)
    ours_joint = joint.report.comm_bytes(None)
    return {"unity_dp_bytes_per_d": UNITY_BYTES["algebra_first_dp"], "unity_joint_bytes_per_d": UNITY_BYTES["joint"],
            "unity_ratio": UNITY_BYTES["algebra_first_dp"] / UNITY_BYTES["joint"],
            "our_dp_grad_sync_bytes_per_d": dp.report.comm_bytes("grad-sync") / 4,
            "our_dp_step_bytes_per_d": ours_dp / 4, "our_joint_step_bytes_per_d": ours_joint / 4,
            "our_ratio": ours_dp / ours_joint if ours_joint else float("inf")}


def _judged_by_running(graph: Graph, mesh: Mesh, joint: PlanResult, dp: PlanResult, budget_s: float) -> dict[str, Any]:
    """The joint plan's training step against data parallel's, run on the devices at hand in the
    one keep/discard decision: `kept` is "joint" only when it is faster with confidence, else
    "data-parallel" (a plan is judged by running it; the prediction stays in `predicted_s`)."""
    from jax_backend.parallel_calibrate import judge_plan

    if joint.plan.to_json() == dp.plan.to_json():
        return {"kept": "joint", "measured": None, "measured_note": "the joint plan is data parallel's"}
    decision = judge_plan(graph, joint.plan, dp.plan, mesh, budget_s)
    return {"kept": "joint" if decision.keep else "data-parallel", "measured": decision.to_json(),
            "measured_speedup_vs_data_parallel": decision.speedup,
            "measured_speedup_ci": [decision.speedup_low, decision.speedup_high]}


def _measure_baselines(graph: Graph, mesh: Mesh, baselines: Mapping[str, PlanResult], row: Mapping[str, Any]) -> dict[str, Any]:
    """Each baseline compiled and run like the joint plan: numerics, compiled step bytes, and whether
    the joint plan moves no more (compiled) and costs no more (predicted)."""
    out: dict[str, Any] = {}
    for name, res in baselines.items():
        key = name.replace("-", "_")
        measured = check_on_devices(graph, res.plan, mesh)
        out[f"{key}_device_numerics_ok"] = measured["numerics_ok"]
        out[f"{key}_measured_step_comm_bytes"] = measured.get("measured_step_comm_bytes")
        out[f"{key}_step_comm_within_5pct"] = _within(res.report.comm_bytes(None), measured.get("measured_step_comm_bytes", 0.0), 0.05)
        out[f"{key}_same_step_collectives"] = (sorted(c.kind for _, c in res.report.collectives)
                                               == measured.get("measured_step_collectives"))
        out[f"{key}_no_recomputation"] = measured.get("measured_step_contractions") == res.report.contractions
    return out


def _dominance(graph: Graph, mesh: Mesh, priced: PricedEGraph, joint: PlanResult, baselines: Mapping[str, PlanResult],
               row: Mapping[str, Any], time_limit: float, measured: bool) -> dict[str, Any]:
    """For each baseline: a joint-search plan no slower and moving no more bytes in a step (the
    compiled program's bytes when `measured`), if there is one. The time-optimal joint plan when
    it qualifies; else the fastest plan of the joint e-graph within the baseline's bytes."""
    def step_bytes(prefix: str, res: PlanResult) -> float:
        found = row.get(f"{prefix}measured_step_comm_bytes") if measured else None
        return float(found) if found is not None else res.report.comm_bytes(None)

    out: dict[str, Any] = {}
    ours = step_bytes("", joint)
    for name, res in baselines.items():
        key = name.replace("-", "_")
        theirs = step_bytes(f"{key}_", res)
        no_slower = joint.report.step_s <= res.report.step_s * (1 + 1e-9)
        if ours <= theirs * (1 + 1e-9):
            out[f"joint_dominates_{key}"] = no_slower
            continue
        try:
            alt = plan_graph(graph, mesh, "joint", time_limit=time_limit, priced=priced,
                             comm_budget=res.report.comm_bytes(None), starts=[res.plan])
        except EqsatError as e:
            out[f"joint_at_{key}_bytes"] = {"error": str(e)}
            out[f"joint_dominates_{key}"] = False
            continue
        alt_bytes = alt.report.comm_bytes(None)
        info: dict[str, Any] = {"predicted_s": alt.report.step_s, "predicted_step_comm_bytes": alt_bytes,
                                "numerics_ok": alt.numerics_ok, "ilp_status": alt.ilp_status, "extract_s": alt.extract_s,
                                "started_from_baseline": alt.info["starts_carried"] == 1}
        if measured:
            checked = check_on_devices(graph, alt.plan, mesh)
            alt_bytes = float(checked["measured_step_comm_bytes"])
            info.update(measured_step_comm_bytes=alt_bytes, device_numerics_ok=checked["numerics_ok"])
        out[f"joint_at_{key}_bytes"] = info
        out[f"joint_dominates_{key}"] = (alt.report.step_s <= res.report.step_s * (1 + 1e-9)
                                         and alt_bytes <= theirs * (1 + 1e-9) and alt.numerics_ok)
    out["joint_dominates_all"] = all(out[f"joint_dominates_{n.replace('-', '_')}"] for n in baselines)
    return out


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
    out["joint_never_worse"] = all(joint.report.step_s <= r.report.step_s * (1 + 1e-9) for r in baselines.values())
    out["joint_strictly_better"] = all(joint.report.step_s < r.report.step_s * (1 - 1e-6) for r in baselines.values())
    return out


def _random_checks(graph: Graph, mesh: Mesh, count: int, pe: PricedEGraph | None = None) -> dict[str, Any]:
    """`count` random plans from the joint e-graph, each run on the devices against the program
    (outputs and gradients), with their predicted communication and memory against the compiled."""
    pe = pe if pe is not None else saturate_and_price(graph, mesh, "joint")
    reference = reference_gradients(graph)
    failures, comm_ok, kinds_ok, step_ok, step_kinds_ok, mem_ok, no_recompute = 0, 0, 0, 0, 0, 0, 0
    mem_ratios: list[float] = []
    for plan in random_plans(pe, count, seed=1):
        report = plan_report(plan, pe.model)
        res = check_on_devices(graph, plan, mesh, gradients=True, reference=reference)
        failures += 0 if res["numerics_ok"] else 1
        comm_ok += _within(report.comm_bytes("forward"), res["measured_comm_bytes"], 0.05)
        kinds_ok += sorted(c.kind for _, c in report.collectives if c.phase == "forward") == res["measured_collectives"]
        step_ok += _within(report.comm_bytes(None), res["measured_step_comm_bytes"], 0.05)
        step_kinds_ok += sorted(c.kind for _, c in report.collectives) == res["measured_step_collectives"]
        mem_ok += _within(report.mem_bytes, res["measured_mem_bytes"], 0.15)
        no_recompute += res["measured_step_contractions"] == report.contractions
        mem_ratios.append(report.mem_bytes / max(res["measured_mem_bytes"], 1.0))
    return {"random_plans": count, "random_numerics_failures": failures, "random_comm_within_5pct": comm_ok,
            "random_same_collectives": kinds_ok, "random_step_comm_within_5pct": step_ok,
            "random_same_step_collectives": step_kinds_ok, "random_mem_within_15pct": mem_ok,
            "random_no_recomputation": no_recompute,
            "random_mem_ratio_range": [min(mem_ratios, default=1.0), max(mem_ratios, default=1.0)]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help=f"model: {', '.join(PARALLEL_MODELS)} (or --graph FILE); "
                        "`calibrate`: measure the mesh's links and compute for --calibrated (cached)")
    parser.add_argument("--graph", default=None, help="plan this Graph JSON file instead of a built-in model")
    parser.add_argument("--weights", default=None,
                        help="with --graph: the leaves that are weights (NAME,...); the others are data")
    parser.add_argument("--mesh", default="8", help=f"mesh shape (8, 2x4, 4x2) or preset ({', '.join(PRESETS)})")
    parser.add_argument("--base", default="cpu8", help="preset whose devices and links a shape uses")
    parser.add_argument("--time-limit", type=float, default=20.0, help="ILP time limit per plan, seconds")
    parser.add_argument("--budget", type=float, default=None,
                        help="per-device memory budget as a fraction of the unparallelized footprint (e.g. 0.4)")
    parser.add_argument("--comm-budget", type=float, default=None,
                        help="bytes per device a training step may move (all collectives, forward, backward, sync)")
    parser.add_argument("--random-plans", type=int, default=0, help="also check this many random plans on the devices")
    parser.add_argument("--no-measure", action="store_true", help="plan only: no JAX run or compile")
    parser.add_argument("--measure-s", type=float, default=8.0,
                        help="seconds of timing at most for the joint plan's step against data parallel's (`kept`)")
    parser.add_argument("--calibrated", action="store_true",
                        help="price with the links and compute measured on these devices (cost model "
                             "parallel-calibrated; measured first if not cached)")
    parser.add_argument("--force", action="store_true", help="calibrate: measure again even if cached")
    parser.add_argument("--trust-tested", action="store_true",
                        help="also use parallel rules proved only on the tested shapes, not for all shapes (warns naming them)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if args.model == "calibrate":
        yield _calibrate(args)
        return
    if args.force:
        raise EqsatError("--force belongs to `eqsat parallel calibrate`")
    graph = None
    if args.graph is not None:
        if args.model is not None:
            raise EqsatError("give a model name or --graph FILE, not both")
        graph = Graph.load(args.graph)
        if args.weights is not None:
            graph = with_weights(graph, [w.strip() for w in args.weights.split(",") if w.strip()])
        args.model = Path(args.graph).stem
    elif args.weights is not None:
        raise EqsatError("--weights names leaves of a --graph file")
    elif args.model is None:
        raise EqsatError(f"name a model ({', '.join(PARALLEL_MODELS)}) or give --graph FILE")
    else:
        lookup(args.model, "parallel")  # an unknown name fails here, before any work
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        raise EqsatError(f"--budget is a fraction of the unparallelized footprint (> 0), not {args.budget}")
    if args.comm_budget is not None and not (math.isfinite(args.comm_budget) and args.comm_budget >= 0):
        raise EqsatError(f"--comm-budget is a number of bytes (>= 0), not {args.comm_budget}")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise EqsatError(f"--time-limit must be a number of seconds > 0, not {args.time_limit}")
    if not (math.isfinite(args.measure_s) and args.measure_s > 0):
        raise EqsatError(f"--measure-s must be a number of seconds > 0, not {args.measure_s}")
    if args.random_plans < 0:
        raise EqsatError(f"--random-plans is a count of plans (>= 0), not {args.random_plans}")
    parse_mesh(args.mesh, args.base)  # a bad mesh fails here, before any work
    cost = _calibrated_cost(args.mesh, args.base) if args.calibrated else None
    t = time.perf_counter()
    row = run_case(args.model, args.mesh, args.time_limit, args.budget, args.random_plans, not args.no_measure, args.base,
                   args.comm_budget, graph, cost, args.trust_tested, args.measure_s)
    row["total_s"] = time.perf_counter() - t
    yield row


def _calibrated_cost(mesh_spec: str, base: str) -> ParallelCostModel:
    """The `parallel-calibrated` model of the mesh (through the one cost-model registry), measuring
    the mesh first when no calibration of it is cached."""
    from eqsat.cost import cost_model
    from jax_backend.parallel_calibrate import load_mesh_calibration

    mesh = parse_mesh(mesh_spec, base)
    load_mesh_calibration(mesh, say=lambda line: print(line, file=sys.stderr))
    model = cost_model("parallel-calibrated", "cpu", mesh=mesh)
    assert isinstance(model, ParallelCostModel)
    return model


def _calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """`eqsat parallel calibrate --mesh SHAPE [--force]`: alpha, beta per axis and compute rates."""
    from jax_backend.parallel_calibrate import load_mesh_calibration

    if args.graph is not None or args.weights is not None:
        raise EqsatError("eqsat parallel calibrate measures a mesh; it takes no --graph or --weights")
    mesh = parse_mesh(args.mesh, args.base)
    if mesh.name in PRESETS and mesh.device != "cpu-nominal":
        raise EqsatError(f"mesh {args.mesh} is an on-paper preset ({mesh.device}); calibrate a shape of the devices "
                         "at hand (e.g. --mesh 8 or 2x4)")
    cal, status = load_mesh_calibration(mesh, force=args.force, say=lambda line: print(line, file=sys.stderr))
    row: dict[str, Any] = {"mesh": "x".join(map(str, cal.shape)), "device": cal.device, "status": status,
                           "seconds": cal.seconds}
    for i, a in enumerate(cal.axes):
        row[f"a{i}_alpha_us"] = a.link.alpha * 1e6
        row[f"a{i}_beta_gbs"] = a.link.beta / 1e9
        row[f"a{i}_fit_rms_error"] = a.link.rms_rel_error
        row[f"a{i}_in_program_us"], row[f"a{i}_sync_us"] = a.in_program_s * 1e6, a.sync_s * 1e6
    row.update(matmul_gflops=cal.compute.peak_flops_fp32 / 1e9, elementwise_gbs=cal.compute.bandwidth / 1e9,
               kernel_us=cal.compute.launch_s * 1e6, transposing_copy_gbs=cal.copy_rate / 1e9)
    return row

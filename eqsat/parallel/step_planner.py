"""The planner's part of a user's step (`eqsat.parallel.api.plan`): its forward captured into graphs,
each graph with a product planned through the one door (`eqsat.parallel.planner.plan_graph`, by way
of `eqsat.parallel.blocks.plan_repeated`), on the mesh as it is and on its joined view; the plans'
splits read back as `PartitionSpec`s per argument leaf and as constraints inside the step.
Scans: a body's slice of a stacked layer weight is planned as that weight (`loop_origins`), and a
body's figures count once per trip (`loop_trips`)."""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from eqsat import ops
from eqsat.cost import cost_model
from eqsat.errors import EqsatError
from eqsat.ir import Graph, Node
from eqsat.parallel.blocks import plan_repeated
from eqsat.parallel.constraints import boundary_constraints, inner_constraints
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import Mesh
from eqsat.parallel.planner import CONTRACTIONS, DEFAULT_LIMITS, PlanError, PlanResult, RuleBook, with_weights
from eqsat.parallel.remat import Remat, find_remat, recomputed_products
from eqsat.parallel.specs import Spec, batch_held, choose_split, finest_split, leaf_splits, partition_spec
from eqsat.parallel.step_args import Leaves, forward_jaxpr
from jax_backend.capture import GraphStep, LoopStep, Program, Step, capture_jaxpr, graph_leaf_name, scan_counts

__all__ = ["Planned", "collective_rows", "loop_origins", "loop_trips", "optimizer_state_copies", "plan_forward",
           "plan_views", "renamed"]


@dataclass(frozen=True)
class Planned:
    specs: list[Spec | None]
    results: tuple[PlanResult, ...]
    program: Program | None
    opaque: int
    why_not: str  # why nothing was planned ("" when something was)
    dp_predicted_s: float | None
    batch: tuple[tuple[int, Any], ...] = ()  # (leading dim, its split) of planned leaves no argument is
    constraints: tuple[tuple[Any, Spec], ...] = ()  # (step jaxpr variable, spec): `boundary_constraints`
    fsdp_predicted_s: float | None = None
    # per baseline with a prediction: (step s, bytes per step, memory, wire bytes per step) summed over the planned graphs
    predicted: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)
    within: str = ""  # how the plan relates to the `within` baseline (`PlanSummary.within`)
    remat: Remat | None = None  # the plan's recomputed products in the step (`eqsat.parallel.remat`)
    inner: tuple[str, ...] = ()  # per constraint inside a captured graph: the op of the value it holds
    unheld: int = 0  # planned inner values with no variable to constrain (`inner_constraints`)
    trips: tuple[int, ...] = ()  # per result: the times a step runs its graph (`loop_trips`)
    axis_names: tuple[str, ...] = ()  # the planner's axes as the report names them (a joined view's: one)
    view: str = ""  # which view of the mesh the plan was searched on (`plan_views`)


def plan_views(closed: Any, leaves: Leaves, pmesh: Mesh, names: Sequence[str], sizes: Mapping[str, int],
                memory_budget: float | None, comm_budget: float | None, time_limit: float,
                predict_dp: bool = False, not_loss: Collection[int] = (), within: str | None = None,
                constrain: str = "products") -> Planned:
    """The plan searched on the mesh as it is and, for a mesh of several axes, on its joined view
    (`Mesh.joined`: every axis as one axis of all the devices, as Alpa plans a mesh under several
    logical shapes; a value split over it is split over the tuple of the axes): the one predicted
    faster. A 2-D search splits a value over one axis or the other; the joined one splits it over all
    the devices at once, which is what data parallel and FSDP do (`baseline_specs`: their splits span
    every axis), so the baselines' predictions are the joined view's. Each view gets half the time."""
    if len(names) < 2:
        return plan_forward(closed, leaves, pmesh, names, sizes, memory_budget, comm_budget, time_limit,
                             predict_dp, not_loss, within, constrain)
    t0 = time.perf_counter()
    joined = "+".join(names)
    failed: list[PlanError] = []
    try:
        flat = renamed(plan_forward(closed, leaves, pmesh.joined(joined), (joined,), {joined: math.prod(sizes.values())},
                                      memory_budget, comm_budget, time_limit / 2, predict_dp, not_loss, within,
                                      constrain), joined, tuple(names))
    except PlanError as exc:  # e.g. no plan within a budget on this view: the other view may have one
        failed.append(exc)
        flat = None
    try:
        grid = plan_forward(closed, leaves, pmesh, names, sizes, memory_budget, comm_budget,
                             max(time_limit - (time.perf_counter() - t0), 1.0), predict_dp and flat is None, not_loss,
                             within, constrain)
    except PlanError as exc:
        if flat is None:
            raise failed[0] from exc
        return flat
    if flat is None:
        return grid

    def step_s(p: Planned) -> float:
        return sum(k * r.report.step_s for r, k in zip(p.results, p.trips or (1,) * len(p.results))) \
            if p.results else math.inf

    best = flat if step_s(flat) < step_s(grid) else grid
    shape = " x ".join(str(sizes[n]) for n in names)
    view = (f"joined: the {shape} mesh as one axis of {math.prod(sizes.values())} devices ({joined}), "
            f"predicted {step_s(flat) * 1e3:.3f} ms against {step_s(grid) * 1e3:.3f} ms on the {shape} mesh"
            if best is flat else
            f"the {shape} mesh, predicted {step_s(grid) * 1e3:.3f} ms against {step_s(flat) * 1e3:.3f} ms on it "
            f"joined into one axis of {math.prod(sizes.values())} devices")
    return replace(best, dp_predicted_s=flat.dp_predicted_s, fsdp_predicted_s=flat.fsdp_predicted_s,
                   predicted=flat.predicted, view=view if best.results else "")


def renamed(planned: Planned, joined: str, names: tuple[str, ...]) -> Planned:
    """A joined view's plan on the mesh itself: its one axis (`joined`) is the tuple of the mesh's axes."""
    def entry(e: Any) -> Any:
        return names if e == joined else e

    def spec(s: Spec | None) -> Spec | None:
        return None if s is None else tuple(entry(e) for e in s)

    return replace(planned, specs=[spec(s) for s in planned.specs],
                   batch=tuple((lead, entry(e)) for lead, e in planned.batch),
                   constraints=tuple((var, spec(s) or ()) for var, s in planned.constraints),
                   axis_names=(joined,))


def plan_forward(closed: Any, leaves: Leaves, pmesh: Mesh, names: Sequence[str], sizes: Mapping[str, int],
                  memory_budget: float | None, comm_budget: float | None, time_limit: float,
                  predict_dp: bool = False, not_loss: Collection[int] = (), within: str | None = None,
                  constrain: str = "products") -> Planned:
    state_vars = {v for v, s in zip(closed.jaxpr.invars, leaves.state) if s}
    found = forward_jaxpr(closed, state_vars, not_loss)
    empty: list[Spec | None] = [None] * len(leaves.paths)
    if found is None:
        return Planned(empty, (), None, 0, "the step returns no float scalar (loss) computed from the model state", None)
    program = capture_jaxpr(found[0])
    graphs = sorted(program.graphs, key=lambda s: -_flops(s.graph))
    graphs = [s for s in graphs if any(n.op in ("matmul", "conv2d") for n in s.graph.nodes)]
    if not graphs:
        return Planned(empty, (), program, len(program.opaque),
                        "the loss captures to no matmul or convolution (nothing to split)", None)
    # a scan body's slice of a stacked layer weight (or a const it closes over) is model state too
    origins = loop_origins(program)
    state_names = {graph_leaf_name(i) for i in range(len(leaves.paths)) if leaves.state[i]} | {
        graph_leaf_name(v) for v, (o, _) in origins.items() if o < len(leaves.paths) and leaves.state[o]}
    trips = loop_trips(program)
    model = ParallelCostModel(pmesh, cost_model("roofline", pmesh.device),
                              state_copies=optimizer_state_copies(program, leaves))
    specs: list[Spec | None] = list(empty)
    results: list[PlanResult] = []
    batch: list[tuple[int, Any]] = []
    boundary: dict[int, Spec] = {}
    lead: dict[int, int] = {}  # a boundary value's leading size
    # per baseline and graph: predicted (seconds, buffer bytes, memory, wire bytes) of a step
    figures: dict[str, list[tuple[float, float, float, float]]] = {"data-parallel": [], "fsdp": []}
    answers: list[str] = []
    book = RuleBook.of(pmesh)  # the rules parsed and verified once, for every graph and search below
    inner: list[tuple[Any, Spec, str]] = []  # the plan's layouts held inside the captured graphs
    unheld = 0
    runs: list[int] = []  # per result: `loop_trips` (its figures count once per run)
    t0 = time.perf_counter()
    for step in graphs:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 1.0:
            break
        graph = with_weights(step.graph, [str(n.attr["name"]) for _, n in step.graph.leaves() if n.attr["name"] in state_names])
        # saturation, pricing, the ILP and the numpy check of one graph take about twice the
        # saturation and ILP limits: a third and a sixth of what is left keep the step near time_limit
        limits = replace(DEFAULT_LIMITS, seconds=min(DEFAULT_LIMITS.seconds, left / 3))
        # a chain of identical blocks (transformer layers) is planned once and its plan repeated
        # within a baseline (data parallel by default): no more predicted bytes and memory than its plan
        res = plan_repeated(graph, pmesh, "joint", limits=limits, time_limit=max(left / 6, 1.0),
                            mem_budget=memory_budget, comm_budget=comm_budget, model=model, book=book, within=within,
                            open_outputs=True)
        if not res.numerics_ok:
            raise PlanError(f"the plan of a captured graph differs from it in numpy (max |diff| {res.max_abs_diff:.3g})")
        results.append(res)
        runs.append(trips.get(id(step), 1))
        if constrain != "boundaries":
            try:
                held, missed = inner_constraints(program, step, res, names, sizes,
                                                  None if constrain == "all" else CONTRACTIONS)
            except EqsatError:  # a plan the numpy read-back cannot run: its inner layouts are left to GSPMD
                held, missed = [], 0
            inner += held
            unheld += missed
        if res.baseline is not None:
            answers.append(str(res.info.get("within", {}).get("answer", "search")))
        # the data-parallel and FSDP baselines' predictions: the same search with their rules only;
        # their plans are priced, never run or lowered, so they get no numpy check
        for strategy, acc in figures.items():
            try:
                if res.baseline is not None and res.baseline.strategy == strategy:
                    base = res.baseline  # the `within` search's, already made
                elif predict_dp:
                    base = plan_repeated(graph, pmesh, strategy, limits=limits, time_limit=max(left / 8, 1.0),
                                         model=model, check=False, book=book, open_outputs=True)
                else:
                    continue
                acc.append((runs[-1] * base.report.step_s, runs[-1] * base.report.comm_bytes(None),
                            runs[-1] * base.report.mem_bytes, runs[-1] * base.report.wire_bytes()))
            except EqsatError:
                pass
        shapes = {str(n.attr["name"]): n.shapes[0] for _, n in res.plan.leaves()}
        for name, splits in leaf_splits(res.plan).items():
            vid, stacked = origins.get(int(name[1:]), (int(name[1:]), 0))
            # a value opaque equations make (an embedding gather's output) is data: held at its finest
            # batch split, the one the tokens take (`mirror`), so GSPMD need not gather it back
            spec = partition_spec(choose_split(splits) if vid < len(leaves.paths) else finest_split(splits), shapes[name], names, sizes)
            if stacked and spec:  # a scan's slice: the stacked value keeps its leading (layer) dims whole
                spec = (None,) * stacked + spec
            if vid < len(leaves.paths):
                if specs[vid] is None:
                    specs[vid] = spec
            elif spec:  # a value made by opaque equations (an embedding gather's output): constrained to the plan's split
                boundary.setdefault(vid, spec)
                lead[vid] = shapes[name][0]
                if spec[0] is not None and not stacked:
                    batch.append((shapes[name][0], spec[0]))
    boundary = {vid: batch_held(spec, lead[vid], batch) for vid, spec in boundary.items()}
    predicted = {k: (sum(f[0] for f in v), sum(f[1] for f in v), sum(f[2] for f in v), sum(f[3] for f in v))
                 for k, v in figures.items() if v and len(v) == len(results)}
    how = ""
    if within is not None and answers:
        kept = sum(a == "baseline" for a in answers)
        how = (f"searched within {within}'s predicted bytes and memory (the planner's {within} plan, which the ILP "
               f"starts from); " + (f"{kept} of {len(answers)} graph(s) kept {within}'s plan: nothing within them "
                                    "was predicted faster" if kept else "the search's plan is within them"))
    return Planned(specs, tuple(results), program, len(program.opaque), "",
                    predicted["data-parallel"][0] if "data-parallel" in predicted else None,
                    tuple(batch), (*boundary_constraints(program, boundary, closed), *((w, sp) for w, sp, _ in inner)),
                    predicted["fsdp"][0] if "fsdp" in predicted else None, predicted, how,
                    find_remat(closed, found[0], recomputed_products([(r.plan, r.report.recompute) for r in results]),
                               state_names), tuple(op for _, _, op in inner), unheld, tuple(runs))


def loop_origins(program: Program) -> dict[int, tuple[int, int]]:
    """Per value id a `lax.scan` body reads (its consts, carry and one slice of each scanned input):
    (the outermost value it stands for, the leading dims that value has more: one per enclosing scan
    that slices it). A body graph's plan of a layer's weight slice is then the plan of the stacked
    weight (`nn.scan` / `lax.scan` over layer params), its leading layer dim(s) whole. A graph's
    dtype cast of a value it reads (bf16 compute on f32 master weights) stands for that value too."""
    out: dict[int, tuple[int, int]] = {}

    def walk(steps: Sequence[Step]) -> None:
        for s in steps:
            if isinstance(s, GraphStep):
                for vid, node, _ in s.sources:
                    n = s.graph.nodes[node]
                    if n.op == "convert_element_type" and ops.OPS[s.graph.nodes[n.inputs[0].node].op].is_leaf:
                        read = int(str(s.graph.nodes[n.inputs[0].node].attr["name"])[1:])
                        out[vid] = out.get(read, (read, 0))
            if not isinstance(s, LoopStep):
                continue
            n_consts, n_carry = scan_counts(s.eqn.params, len(s.inputs))
            for k, (inner, outer) in enumerate(zip(s.body_inputs, s.inputs)):
                origin, stacked = out.get(outer, (outer, 0))
                out[inner] = (origin, stacked + (k >= n_consts + n_carry))
            walk(s.body)

    walk(program.steps)
    return out


def loop_trips(program: Program) -> dict[int, int]:
    """Per graph of `program.graphs` (by `id` of its step) the times one step runs it: the product of
    the lengths of the scans around it (a layer body under `nn.scan` runs once per layer)."""
    out: dict[int, int] = {}

    def walk(steps: Sequence[Step], trips: int) -> None:
        for s in steps:
            if isinstance(s, LoopStep):
                walk(s.body, trips * int(s.eqn.params.get("length", 1)))
            elif isinstance(s, GraphStep):
                out[id(s)] = trips

    walk(program.steps, 1)
    return out


def optimizer_state_copies(program: Program, leaves: Leaves) -> float:
    """The optimizer state per parameter, in copies of it: the bytes of the model-state leaves the
    forward does not read (Adam's mu and nu, its step count) over those of the ones it reads (the
    parameters). What the planner's memory row and update time charge per weight (ZeRO / FSDP
    shards both with the weight)."""
    read = {str(n.attr["name"]) for s in program.graphs for _, n in s.graph.leaves()}
    read |= {graph_leaf_name(o) for v, (o, _) in loop_origins(program).items() if graph_leaf_name(v) in read}
    params = other = 0.0
    for i, shape in enumerate(leaves.shapes):
        if leaves.state[i]:
            if graph_leaf_name(i) in read:
                params += math.prod(shape)
            else:
                other += math.prod(shape)
    return other / params if params else 0.0


def _flops(graph: Graph) -> float:
    """Multiply-adds of a graph's products: the biggest graphs are planned first."""
    total = 0.0
    for n in graph.nodes:
        if n.op in ("matmul", "conv2d"):
            total += float(np.prod(n.shapes[0])) * float(graph.shape(n.inputs[0])[-1])
    return total


def collective_rows(results: Sequence[PlanResult], names: Sequence[str],
                     runs: Sequence[int] = ()) -> tuple[Mapping[str, Any], ...]:
    """The planned collectives with the mesh's axis names, for the report; `runs`: how many times a
    step runs each, its graph's `loop_trips` (a scan body's once per layer, as compiled)."""
    rows = []
    for k, res in enumerate(results):
        g = res.plan.live()
        for i, c in res.report.collectives:
            node: Node = g.nodes[i]
            rows.append({"enode": f"g{k}:{i}:{node.op}", "kind": c.kind, "axis": names[c.axis], "bytes": c.bytes,
                         "phase": c.phase, "why": c.why, "runs": runs[k] if k < len(runs) else 1})
    return tuple(rows)


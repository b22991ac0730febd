"""Parallel plans for the user's own JAX training step: `plan(train_step, *args, mesh=..., params_argnums=...)`.

Design (docs/parallel.md, "Parallelize your training step"):

1. The step is traced to a jaxpr. Its *forward* is the part the loss depends on: the equations the
   first float scalar output that depends on the model state (the loss, as `jax.value_and_grad`
   returns it) reaches, cut out of the step's jaxpr (dead-code elimination towards that output).
   The forward is captured into IR graphs by the project's capture (`jax_backend.capture`); its
   leaves that are model state (`params_argnums`) become `weight`s, so the planner prices their
   gradients and gradient sync, the others stay data.
2. Each captured graph with a product in it (matmul / conv) is planned by the e-graph planner
   through its one door (`eqsat.parallel.planner.plan_graph`: one e-graph, one ILP with the memory
   and bytes rows); a chain of identical blocks in a graph (transformer layers) is planned once and
   its plan repeated (`eqsat.parallel.blocks.plan_repeated`). Equations the capture leaves opaque
   (integer label gathers, the optimizer update, ...) are not planned: they are the boundaries where GSPMD propagates.
3. The plan's choices for its leaves (which dim of which argument is split over which mesh axis:
   the `partition`s a leaf goes through, read back through `broadcast` and `transpose`) become a
   `PartitionSpec` per pytree leaf. Optimizer state that mirrors a parameter (same shape, the
   parameter's key path a suffix of its own: Adam's mu / nu) takes the parameter's; data leaves
   the plan does not reach but that share a planned data leaf's leading dim (labels) take its
   batch split.
4. Lowering is JAX's own: `jax.jit(step, in_shardings, out_shardings)` with new model state
   placed as the old (so the step iterates with donation) on the same devices in `Auto` axis
   mode (a `jax.make_mesh` mesh has `Explicit` axes in current JAX; code not written for
   explicit sharding fails there), and GSPMD propagates through everything else. The exact
   `shard_map` lowering of a plan graph stays in `jax_backend.shard`.

When nothing can be planned (no product captured, or the planner fails) the plan is data
parallel, with a one-line warning that says why: never a guessed sharding. Baselines (data
parallel, FSDP, Megatron TP, DP x TP) are the same API's shardings, compiled beside the plan.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import Mesh as JaxMesh
from jax.sharding import PartitionSpec as P

from eqsat.errors import EqsatError
from eqsat.parallel.blocks import depth_reuse_summary
from eqsat.parallel.mesh import CPU_LINK, INFINIBAND, NVLINK, Mesh, MeshAxis
from eqsat.parallel.constraints import constrained_step, where_str
from eqsat.parallel.planner import PlanError, PlanResult
from eqsat.parallel.specs import Spec
from eqsat.parallel.remat import checkpointed_step
from eqsat.parallel.step_args import Leaves, baseline_specs, flat_leaves, mirror, out_shardings, state_outputs, unwrap_jit
from eqsat.parallel.step_planner import Planned, collective_rows, plan_views
from jax_backend.leaf_names import argument_names
from jax_backend.shard import compiled_collectives
from jax_backend.timing import Decision, choose_faster

__all__ = ["ApiError", "Plan", "PlanSummary", "parallelize", "plan"]

BASELINE_NAMES = ("data-parallel", "fsdp", "megatron", "dp-x-tp")
WITHIN = ("data-parallel", "fsdp", "megatron")  # the planner's baseline strategies a plan may be bounded by
# which planned values `Plan.jit` holds with `with_sharding_constraint`: those opaque equations make
# (the boundaries) and, inside the captured graphs, the products' ("products") or every value's ("all")
CONSTRAIN = ("products", "all", "boundaries")


class ApiError(EqsatError):
    """Bad input to `eqsat.parallel.plan`: a mesh, argument or budget the plan cannot use."""


# --- figures --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compiled:
    """What a compiled step does per device: its collectives (kind, bytes, replica groups, from
    `compile().as_text()`, counted as `jax_backend.shard.compiled_collectives` counts) and memory.
    `comm_bytes` sums the collectives' buffers; `wire_bytes` what each device sends for them on
    ring algorithms (`CompiledCollective.wire_bytes`), the bytes `judge_compiled` compares."""

    comm_bytes: float
    collectives: tuple[tuple[str, float], ...]  # (kind, bytes per device)
    mem_bytes: float  # arguments + outputs + temporaries - aliased (donation)
    memory: Mapping[str, float]
    flops: float | None
    wire_bytes: float = 0.0

    def to_json(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for k, _ in self.collectives:
            kinds[k] = kinds.get(k, 0) + 1
        return {"compiled_comm_bytes": self.comm_bytes, "compiled_wire_bytes": self.wire_bytes,
                "compiled_collectives": kinds,
                "compiled_mem_bytes": self.mem_bytes, "compiled_memory": dict(self.memory), "compiled_flops": self.flops}


def compile_figures(jitted: Any, args: Sequence[Any]) -> Compiled:
    """Compile `jitted` on `args` (shapes) and read back what the program does (`Compiled`)."""
    compiled = jitted.lower(*args).compile()
    found = compiled_collectives(compiled.as_text())
    mem = compiled.memory_analysis()
    fields = {k: float(getattr(mem, k, 0) or 0) for k in
              ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes")}
    total = (fields["argument_size_in_bytes"] + fields["output_size_in_bytes"] + fields["temp_size_in_bytes"]
             - fields["alias_size_in_bytes"])
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = float(cost.get("flops", 0.0)) if isinstance(cost, Mapping) else None
    return Compiled(float(sum(c.bytes for c in found)), tuple((c.kind, c.bytes) for c in found), total, fields, flops,
                    float(sum(c.wire_bytes for c in found)))


@dataclass(frozen=True)
class Baseline:
    name: str
    specs: str  # a short description of its shardings
    compiled: Compiled | None
    predicted_s: float | None = None
    note: str = ""
    predicted_comm_bytes: float | None = None  # its plan's bytes a step, priced as the planner's plan is
    predicted_wire_bytes: float | None = None  # what each device sends for them

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "specs": self.specs, "predicted_s": self.predicted_s, "note": self.note,
                "predicted_comm_bytes": self.predicted_comm_bytes, "predicted_wire_bytes": self.predicted_wire_bytes,
                **(self.compiled.to_json() if self.compiled is not None else {})}


@dataclass(frozen=True)
class PlanSummary:
    """`Plan.report`: what the planner predicted, what the compiled step does, and the baselines.
    Times are predictions of the `parallel` cost model for the planned (captured) part of the step."""

    strategy: str  # "eqsat" or "data-parallel (fallback)"
    mesh: str
    mesh_note: str
    predicted_step_s: float | None
    predicted_comm_bytes: float | None
    predicted_mem_bytes: float | None
    collectives: tuple[Mapping[str, Any], ...]
    plan_s: float
    graphs_planned: int
    opaque_equations: int
    warnings: tuple[str, ...]
    leaf_specs: tuple[tuple[str, str], ...]  # (key path, PartitionSpec)
    compiled: Compiled | None
    baselines: tuple[Baseline, ...] = ()
    constraints: tuple[tuple[str, str], ...] = ()  # (jaxpr value, PartitionSpec) held by with_sharding_constraint
    blocks: tuple[str, ...] = ()  # per graph with repeated blocks: how the search reused them, whatever is returned
    within: str = ""  # the plan against the baseline that bounds its bytes and memory (`plan(within=...)`)
    recomputed: int = 0  # products the lowered backward recomputes (activation checkpointing, `eqsat.parallel.remat`)
    # the op of each of the last `len(inner_constraints)` constraints: values inside the captured
    # graphs held at the plan's layout (the others are values opaque equations make)
    inner_constraints: tuple[str, ...] = ()
    unheld: int = 0  # planned values inside the graphs with no variable to hold (left to GSPMD)
    view: str = ""  # the view of the mesh the plan was searched on (`plan_views`)
    measured: Decision | None = None  # the plan run against the `within` baseline (`plan(measure_s=...)`)

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "mesh": self.mesh, "mesh_note": self.mesh_note,
                "predicted_step_s": self.predicted_step_s, "predicted_comm_bytes": self.predicted_comm_bytes,
                "predicted_mem_bytes": self.predicted_mem_bytes, "collectives": [dict(c) for c in self.collectives],
                "plan_s": self.plan_s, "graphs_planned": self.graphs_planned,
                "opaque_equations": self.opaque_equations, "warnings": list(self.warnings),
                "leaf_specs": dict(self.leaf_specs), "constraints": [list(c) for c in self.constraints],
                "blocks": list(self.blocks), "within": self.within, "recomputed_products": self.recomputed,
                "inner_constraints": len(self.inner_constraints), "unheld_inner_values": self.unheld, "view": self.view,
                **(self.compiled.to_json() if self.compiled is not None else {}),
                "measured": self.measured.to_json() if self.measured is not None else None,
                "baselines": [b.to_json() for b in self.baselines]}


# --- the plan -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A sharded training step: `in_shardings` / `out_shardings` (pytrees of NamedSharding shaped as
    the arguments / outputs) on `mesh` (the user's devices, Auto axes), `jit()` the step."""

    fn: Callable[..., Any]
    mesh: JaxMesh
    in_shardings: tuple[Any, ...]
    out_shardings: Any
    report: PlanSummary
    results: tuple[PlanResult, ...] = field(default=(), repr=False)

    def jit(self, donate_argnums: int | Sequence[int] = ()) -> Callable[..., Any]:
        """`jax.jit` of the step with the plan's shardings; arguments are placed on the plan's
        shardings first (a no-op for arrays already there, so donation still reuses them)."""
        jitted = jax.jit(self.fn, in_shardings=self.in_shardings, out_shardings=self.out_shardings,
                         donate_argnums=donate_argnums)

        def step(*args: Any) -> Any:
            return jitted(*self.place(*args))

        step.lower = jitted.lower  # type: ignore[attr-defined]
        return step

    def place(self, *args: Any) -> tuple[Any, ...]:
        """The arguments put on the plan's `in_shardings`."""
        return tuple(jax.device_put(a, s) for a, s in zip(args, self.in_shardings))

    def explain(self) -> str:
        """A table of the shardings, the planned collectives and the baselines."""
        r = self.report
        lines = [f"eqsat parallel plan ({r.strategy}) on mesh {r.mesh} — {r.mesh_note}"]
        if r.predicted_step_s is not None:
            lines.append(f"predicted step (planned part): {r.predicted_step_s * 1e3:.3f} ms, "
                         f"{_fmt_bytes(r.predicted_comm_bytes)} moved, {_fmt_bytes(r.predicted_mem_bytes)} per device; "
                         f"planned {r.graphs_planned} graph(s) in {r.plan_s:.1f} s; {r.opaque_equations} opaque equations "
                         "left to GSPMD")
        lines += [f"warning: {w}" for w in r.warnings]
        lines += [f"mesh view: {r.view}"] if r.view else []
        lines += [f"deep model: {b}" for b in r.blocks]
        lines += [f"bound: {r.within}"] if r.within else []
        lines += [f"activation checkpointing: {r.recomputed} product(s) recomputed in the backward"] if r.recomputed else []
        if r.measured is not None:
            m = r.measured
            lines.append(f"measured on the mesh's devices: the plan's step {m.other_s * 1e3:.3f} ms against the baseline's "
                         f"{m.base_s * 1e3:.3f} ms, speedup {m.speedup:.2f}x [{m.speedup_low:.2f}, {m.speedup_high:.2f}] "
                         f"({m.confidence:.0%}, {m.rounds} rounds): {'kept' if m.keep else 'the baseline returned'}")
        lines.append("")
        lines.append(f"{'argument leaf':<48} PartitionSpec")
        lines += [f"{path:<48} {spec}" for path, spec in r.leaf_specs]
        edge = len(r.constraints) - len(r.inner_constraints)
        lines += [f"with_sharding_constraint on {var} (made by an opaque equation): {spec}"
                  for var, spec in r.constraints[:edge]]
        lines += [f"with_sharding_constraint on {var} ({op} inside a captured graph): {spec}"
                  for (var, spec), op in zip(r.constraints[edge:], r.inner_constraints)]
        lines += [f"{r.unheld} planned value(s) inside the captured graphs have no variable of the step to hold "
                  "(left to GSPMD)"] if r.unheld else []
        if r.collectives:
            lines.append("")
            lines.append(f"{'e-node':<20} {'kind':<15} {'axis':<8} {'bytes':>12} {'runs':>4} {'phase':<10} why")
            lines += [f"{c['enode']:<20} {c['kind']:<15} {c['axis']:<8} {c['bytes']:>12,.0f} {c.get('runs', 1):>4} "
                      f"{c['phase']:<10} {c['why']}" for c in r.collectives]
        rows = [("eqsat plan", r.predicted_step_s, r.compiled)] + [(b.name, b.predicted_s, b.compiled) for b in r.baselines]
        lines.append("")
        lines.append(f"{'step':<16} {'predicted ms':>13} {'compiled bytes':>15} {'wire bytes':>12} {'memory':>12} "
                     "collectives")
        for name, pred, comp in rows:
            p = f"{pred * 1e3:.3f}" if pred is not None else "-"
            if comp is None:
                lines.append(f"{name:<16} {p:>13} {'-':>15} {'-':>12} {'-':>12}")
            else:
                kinds = comp.to_json()["compiled_collectives"]
                lines.append(f"{name:<16} {p:>13} {comp.comm_bytes:>15,.0f} {comp.wire_bytes:>12,.0f} "
                             f"{_fmt_bytes(comp.mem_bytes):>12} "
                             + ", ".join(f"{n}x {k}" for k, n in sorted(kinds.items())))
        return "\n".join(lines)


def _fmt_bytes(b: float | None) -> str:
    """Bytes for a person (explain()'s table)."""
    if b is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


# --- inputs ---------------------------------------------------------------------------------------

def auto_mesh(mesh: Any) -> JaxMesh:
    """The user's mesh on the same devices with every axis in Auto mode (GSPMD propagates)."""
    if not isinstance(mesh, JaxMesh):
        raise ApiError(f"mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh((2, 4), ('data', 'model'))), "
                       f"not {type(mesh).__name__}")
    devices = np.asarray(mesh.devices)
    have = len(jax.devices())
    if devices.size != have:
        raise ApiError(f"the mesh has {devices.size} devices but JAX has {have} "
                       f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={devices.size})")
    return JaxMesh(devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def planner_mesh(mesh: JaxMesh) -> tuple[Mesh, tuple[str, ...]]:
    """The planner's mesh for `mesh`: its axes of size > 1 (a size-1 axis splits nothing), links
    from the presets of the device kind (`eqsat.parallel.mesh`). Also the JAX names of its axes."""
    platform = np.asarray(mesh.devices).flat[0].platform
    link, device = (NVLINK, "h100") if platform == "gpu" else (CPU_LINK, "cpu-nominal")
    kept = [(str(n), int(s)) for n, s in mesh.shape.items() if s > 1]
    axes = tuple(MeshAxis(n, s, *link) for n, s in kept)
    if platform == "gpu" and len(axes) > 1:  # the outer axis across nodes (h100x32's layout)
        axes = (MeshAxis(axes[0].name, axes[0].size, *INFINIBAND), *axes[1:])
    shape = "x".join(str(s) for _, s in kept) or "1"
    return Mesh(f"user[{shape}]", axes, device), tuple(n for n, _ in kept)


def _check_argnums(args: Sequence[Any], params_argnums: Sequence[int]) -> tuple[int, ...]:
    nums = tuple(int(i) for i in params_argnums)
    for i in nums:
        if not -len(args) <= i < len(args):
            raise ApiError(f"params_argnums names argument {i}, but the step takes {len(args)} arguments")
    nums = tuple(i % len(args) for i in nums)
    for i in nums:
        leaves = jax.tree_util.tree_leaves(args[i])
        bad = [type(x).__name__ for x in leaves if not hasattr(x, "shape") or not hasattr(x, "dtype")]
        if not leaves or bad:
            raise ApiError(f"params_argnums names argument {i}, which is not a pytree of arrays"
                           + (f" (it holds {', '.join(sorted(set(bad)))}; pass its arrays alone, e.g. Equinox's "
                              "`params, static = eqx.partition(model, eqx.is_array)`, the step closing over `static`)"
                              if bad else " (it has no leaves)"))
    return nums


# --- the public functions -------------------------------------------------------------------------

def plan(train_step: Callable[..., Any], *args: Any, mesh: Any, params_argnums: Sequence[int] = (0,),
         memory_budget: float | None = None, comm_budget: float | None = None, time_limit: float = 60.0,
         baselines: bool = True, within: str | None = "data-parallel", constrain: str = "products",
         measure_s: float | None = None) -> Plan:
    """Plan `train_step(*args)` on `mesh` (see the module docstring). `params_argnums`: the
    arguments that are model state (parameters, optimizer state). `memory_budget` (bytes per
    device) and `comm_budget` (bytes a step moves per device) bound the planned part of the step;
    so does `within`, a baseline strategy ("data-parallel", "fsdp", "megatron"; None: time
    alone): each planned graph moves no more predicted bytes (`planner.bound_bytes`) and holds no more predicted memory
    than the planner's plan of that baseline, and is no slower. `baselines` also compiles data
    parallel, FSDP, Megatron and DP x TP for the report. A plan that a predicted baseline beats in
    all three of step time, bytes and memory is never returned: that baseline's shardings are, and
    the report's strategy says so. Nor is a plan whose compiled step moves more bytes or holds more
    memory per device than the `within` baseline's compiled step (`judge_compiled`; that baseline
    is compiled for it even with `baselines=False`). `constrain` (`CONSTRAIN`): the values the
    lowered step holds at the plan's layout with `with_sharding_constraint`, besides those opaque
    equations make: the products' inside the captured graphs (default), every planned value's, or
    none ("boundaries"). `measure_s` (seconds): judge the plan by running it. The plan's step and
    the `within` baseline's (data parallel's when `within` is None) run on the mesh's devices in
    the one timing policy (`jax_backend.timing.choose_faster`, the decorator's), and the plan is
    returned only when it is faster with confidence; otherwise that baseline's shardings are, and
    the report's strategy says so. `report.measured` holds the decision either way. This needs
    the arguments as arrays (not shapes), and is off by default: a plan from shapes alone is
    judged by prediction and by compiling it."""
    t0 = time.perf_counter()
    if constrain not in CONSTRAIN:
        raise ApiError(f"constrain must be one of {', '.join(CONSTRAIN)}, not {constrain!r}")
    if within is not None and within not in WITHIN:
        raise ApiError(f"within must be one of {', '.join(WITHIN)} or None, not {within!r}")
    amesh = auto_mesh(mesh)
    state_argnums = _check_argnums(args, params_argnums)
    for label, value in (("memory_budget", memory_budget), ("comm_budget", comm_budget)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ApiError(f"{label} must be a number of bytes per device >= 0, not {value!r}")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise ApiError(f"time_limit must be a number of seconds > 0, not {time_limit!r}")
    if measure_s is not None:
        if isinstance(measure_s, bool) or not (isinstance(measure_s, (int, float)) and math.isfinite(measure_s)
                                               and measure_s > 0):
            raise ApiError(f"measure_s must be a number of seconds > 0 (or None: not run), not {measure_s!r}")
        shapes_only = [type(x).__name__ for x in jax.tree_util.tree_leaves(args) if isinstance(x, jax.ShapeDtypeStruct)]
        if shapes_only:
            raise ApiError(f"measure_s runs the step, so it needs arrays, not {shapes_only[0]} (pass the real "
                           "arguments, or measure_s=None to plan from shapes)")
    leaves, treedef = flat_leaves(args, state_argnums)
    # traced and compiled on shapes only: arrays committed to another mesh (an Explicit one) carry
    # shardings into the jaxpr and clash with the plan's when lowered
    abstract = tuple(jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jax.numpy.result_type(a)), args))
    flat = jax.tree_util.tree_leaves(abstract)
    sizes = {str(n): int(s) for n, s in amesh.shape.items()}
    all_names = tuple(str(n) for n in amesh.axis_names)
    note = ("planned and lowered in Auto axis mode on the mesh's devices (GSPMD propagates through the parts "
            "the planner leaves opaque)")
    if any(t != AxisType.Auto for t in getattr(mesh, "axis_types", ())):
        note += "; the given mesh's axes are Explicit, so an Auto copy of it is used"
    warns: list[str] = []

    def flat_fn(*xs: Any) -> Any:
        return train_step(*jax.tree_util.tree_unflatten(treedef, xs))

    try:
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*flat)
        closed = unwrap_jit(closed)
    except EqsatError:
        raise
    except Exception as exc:
        raise ApiError(f"cannot trace {getattr(train_step, '__name__', 'the step')}: {type(exc).__name__}: {exc}") from exc
    planned: Planned | None = None
    if math.prod(sizes.values()) > 1:
        pmesh, names = planner_mesh(amesh)
        try:
            planned = plan_views(closed, leaves, pmesh, names, sizes, memory_budget, comm_budget, time_limit,
                                  baselines, state_outputs(out_shape, args, state_argnums), within, constrain)
        except PlanError as exc:
            if memory_budget is not None or comm_budget is not None:
                raise ApiError(f"no plan of the step's planned part meets the budget ({exc}); "
                               "raise memory_budget / comm_budget to at least the best found") from exc
            planned = Planned([None] * len(leaves.paths), (), None, 0, f"the planner failed: {exc}", None)
    else:
        names = ()
        warns.append("the mesh has one device: nothing to plan")
    program = planned.program if planned else None
    # how the search reused identical blocks: the search's fact, reported whichever shardings are returned
    searched_blocks = tuple(depth_reuse_summary(r) for r in planned.results if r.info.get("blocks")) if planned else ()
    better = dominating_baseline(planned)
    if planned is not None and better is not None:
        # a predicted baseline beats the plan in time, bytes and memory: its shardings are the answer
        specs = baseline_specs(better, leaves, all_names, sizes, program)
        strategy = f"{better} (baseline: predicted faster than the plan, with fewer bytes and less memory)"
        planned = replace(planned, results=(), constraints=(), remat=None)
    elif planned is not None and planned.results:
        specs = mirror(leaves, planned.specs, planned.batch)
        strategy = "eqsat"
    else:
        why = planned.why_not if planned is not None else "one device"
        if math.prod(sizes.values()) > 1:
            warnings.warn(f"eqsat parallel plan: data parallel because {why}", stacklevel=2)
            warns.append(f"data parallel because {why}")
        specs = baseline_specs("data-parallel", leaves, all_names, sizes, program) if names else [() for _ in leaves.paths]
        strategy = "data-parallel (fallback)"
    plan_s = time.perf_counter() - t0
    results = planned.results if planned is not None else ()
    axis_names = (planned.axis_names if planned is not None else ()) or names  # the report's names for planned axes
    arg_names = argument_names(train_step, len(args))
    remat_planned = planned.remat if planned is not None and results else None
    missing = sum(len(r.report.recompute) for r in results) - (remat_planned.products if remat_planned else 0)
    if missing > 0:
        warns.append(f"{missing} product(s) the plan recomputes were not found in the step by their weight; "
                     "the compiled step keeps them (its memory is over the prediction)")

    def made(specs: Sequence[Spec], strategy: str, results: tuple[PlanResult, ...], better: str | None) -> Plan:
        """The plan of `specs` (the planner's when `results`, else a baseline's or data parallel's)."""
        in_shardings = _shardings(amesh, treedef, specs)
        out_sh = out_shardings(out_shape, args, in_shardings, state_argnums, amesh)
        constraints = planned.constraints if planned is not None and results else ()
        inner = planned.inner if planned is not None and results else ()
        remat = remat_planned if results else None
        if remat:  # the checkpointed step holds the step's own variables only (the boundaries)
            constraints, inner = tuple(c for c in constraints[:len(constraints) - len(inner)]
                                       if not isinstance(c[0], tuple)), ()
        out_tree = jax.tree_util.tree_structure(out_shape)
        runs = planned.trips if planned is not None and len(planned.trips) == len(results) else (1,) * len(results)
        fn = (checkpointed_step(closed, out_tree, remat, constraints, amesh) if remat
              else constrained_step(closed, out_tree, constraints, amesh) if constraints
              else train_step)
        figures: tuple[float | None, float | None, float | None] = (
            (sum(k * r.report.step_s for r, k in zip(results, runs)),
             sum(k * r.report.comm_bytes(None) for r, k in zip(results, runs)),
             sum(k * r.report.mem_bytes for r, k in zip(results, runs))) if results else
            (planned.predicted[better][0], planned.predicted[better][1], planned.predicted[better][2])
            if planned is not None and better is not None and better in planned.predicted
            else (None, None, None))
        return Plan(fn, amesh, in_shardings, out_sh, PlanSummary(
            strategy, " x ".join(f"{n}={s}" for n, s in sizes.items()), note, figures[0], figures[1], figures[2],
            collective_rows(results, axis_names, runs), plan_s, len(results), planned.opaque if planned else 0, tuple(warns),
            tuple((_path_str(p, arg_names), str(P(*s))) for p, s in zip(leaves.paths, specs)), None,
            constraints=tuple((where_str(var), str(P(*spec))) for var, spec in constraints),
            inner_constraints=inner, unheld=planned.unheld if planned is not None and results and not remat else 0,
            blocks=searched_blocks,
            within=planned.within if planned is not None else "", recomputed=remat.products if remat else 0,
            view=planned.view if planned is not None and results else ""), results)

    step = made(specs, strategy, results, better)
    compiled = compile_figures(jax.jit(step.fn, in_shardings=step.in_shardings, out_shardings=step.out_shardings),
                               abstract)
    rows: list[Baseline] = []
    if len(all_names) and math.prod(sizes.values()) > 1:
        # every baseline for the report; without them, the `within` baseline alone when a plan is judged by it
        wanted = BASELINE_NAMES if baselines else (within,) if within is not None and results else ()
        for name in wanted:
            if name == "dp-x-tp" and len([n for n in all_names if sizes[n] > 1]) < 2:
                continue
            bspecs = baseline_specs(name, leaves, all_names, sizes, program)
            b_in = _shardings(amesh, treedef, bspecs)
            b_out = out_shardings(out_shape, args, b_in, state_argnums, amesh)
            fig = compile_figures(jax.jit(train_step, in_shardings=b_in, out_shardings=b_out), abstract)
            pred = None if planned is None else {"data-parallel": planned.dp_predicted_s,
                                                 "fsdp": planned.fsdp_predicted_s}.get(name)
            known = planned.predicted.get(name) if planned is not None else None
            rows.append(Baseline(name, _describe(bspecs, leaves), fig, pred, predicted_comm_bytes=known[1] if known else None,
                                 predicted_wire_bytes=known[3] if known else None))
    judged = judge_compiled(compiled, rows, within, step.report.predicted_step_s) if results else None
    if judged is not None:
        # judged by compiling it: the plan compiles to more bytes or memory than the `within`
        # baseline does (the best baseline within that baseline's compiled figures is returned),
        # or a baseline beats it in predicted time, compiled bytes and memory (that one is)
        name, why = judged
        specs = baseline_specs(name, leaves, all_names, sizes, program)
        step = made(specs, f"{name} (compiled: {why})", (), name)
        compiled = next(b.compiled for b in rows if b.name == name and b.compiled is not None)
    measured = None
    if measure_s is not None and step.report.strategy == "eqsat":
        name = within or "data-parallel"
        base = made(baseline_specs(name, leaves, all_names, sizes, program), name, (), name)
        try:
            measured = measure_against(step, base, args, measure_s)
        except Exception as exc:  # the user's step failing on the devices (out of memory, a runtime check)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ApiError(f"measure_s: running the step on the mesh failed ({type(exc).__name__}: {first}); "
                           "measure_s=None plans without running it") from exc
        if not measured.keep:
            verdict = "slower" if measured.verdict == "slower" else "not faster with confidence"
            step = replace(base, report=replace(base.report, strategy=(
                f"{name} (measured: the plan's step ran {measured.speedup:.2f}x as fast [{measured.speedup_low:.2f}, "
                f"{measured.speedup_high:.2f}], {verdict})")))
            compiled = next((b.compiled for b in rows if b.name == name and b.compiled is not None), None) or \
                compile_figures(jax.jit(base.fn, in_shardings=base.in_shardings, out_shardings=base.out_shardings),
                                abstract)
    summary = replace(step.report, compiled=compiled, baselines=tuple(rows) if baselines else (), measured=measured)
    if memory_budget is not None and compiled.mem_bytes > memory_budget:
        summary = replace(summary, warnings=(*summary.warnings,
                                             f"the compiled step needs {compiled.mem_bytes:,.0f} bytes per device, "
                                             f"over the budget of {memory_budget:,.0f} (the budget bounds the planned part)"))
    return replace(step, report=summary)


def measure_against(candidate: Plan, base: Plan, args: Sequence[Any], budget_s: float) -> Decision:
    """`candidate`'s step against `base`'s, each on its own shardings, run on the mesh's devices in
    the one keep/discard decision (`choose_faster`: faster only when the whole interval of the
    speedup lies above 1 + its margin). Each runs as the user would run it: `Plan.jit`."""
    def runner(p: Plan) -> Callable[[], Any]:
        step, placed = p.jit(), p.place(*args)
        return lambda: step(*placed)

    return choose_faster(runner(base), [runner(candidate)], (), budget_s=budget_s).decision


def judge_compiled(compiled: Compiled, rows: Sequence[Baseline], within: str | None,
                   predicted_s: float | None = None) -> tuple[str, str] | None:
    """The plan against the `within` baseline's compiled step: None when the plan's compiled wire
    bytes and memory per device are both within that baseline's and no compiled baseline beats the
    plan in all three of predicted step time (`predicted_s`, the plan's), compiled wire bytes and
    memory; else (baseline to return instead, why). Bytes are wire bytes (`Compiled.wire_bytes`),
    for plan and baselines alike: a weight all-gathered before use and its gradient
    reduce-scattered sends what one all-reduce of the gradient sends, though its buffers sum to
    twice the all-reduce's. A baseline better in all three is returned as is (the fastest such):
    the planner's search may miss it within its limits, the user should not.
    The one returned is, of the compiled baselines within the `within` baseline's bytes and memory
    (that baseline among them), the one predicted fastest; the `within` baseline where none of them
    has a prediction. The planner bounds a plan by the baseline's *predicted* bytes and memory;
    GSPMD may compile the plan's leaf shardings to other inner layouts (the MoE on 8 devices:
    its expert weights all-gathered where the plan moved tokens), so the compiled figures decide."""
    base = next((b.compiled for b in rows if b.name == within and b.compiled is not None), None)
    if within is None or base is None:
        return None
    slack = 1 + 1e-9
    if compiled.wire_bytes <= base.wire_bytes * slack and compiled.mem_bytes <= base.mem_bytes * slack:
        better = [b for b in rows if b.compiled is not None and b.predicted_s is not None and predicted_s is not None
                  and b.predicted_s < predicted_s and b.compiled.wire_bytes < compiled.wire_bytes
                  and b.compiled.mem_bytes < compiled.mem_bytes]
        if not better or predicted_s is None:
            return None
        best = min(better, key=lambda b: float(b.predicted_s or 0.0))
        assert best.compiled is not None and best.predicted_s is not None
        return best.name, (f"{best.name} is predicted faster ({best.predicted_s * 1e3:.2f} ms against the plan's "
                           f"{predicted_s * 1e3:.2f}) and compiles to fewer wire bytes ({best.compiled.wire_bytes:,.0f} "
                           f"against {compiled.wire_bytes:,.0f}) and less memory ({best.compiled.mem_bytes:,.0f} against "
                           f"{compiled.mem_bytes:,.0f}) per device")
    fits = [b for b in rows if b.compiled is not None and b.compiled.wire_bytes <= base.wire_bytes * slack
            and b.compiled.mem_bytes <= base.mem_bytes * slack and (b.predicted_s is not None or b.name == within)]
    timed = [b for b in fits if b.predicted_s is not None]
    name = min(timed, key=lambda b: float(b.predicted_s or 0.0)).name if timed else str(within)
    why = (f"the plan's step compiled to {compiled.wire_bytes:,.0f} wire bytes and {compiled.mem_bytes:,.0f} bytes of "
           f"memory per device, over {within}'s {base.wire_bytes:,.0f} / {base.mem_bytes:,.0f}; "
           f"{name}'s shardings instead")
    return name, why


def dominating_baseline(planned: Planned | None) -> str | None:
    """The predicted baseline that is better than the plan in all three of step time, wire bytes
    and memory (the best such in time), or None."""
    if planned is None or not planned.results:
        return None
    mine = (sum(r.report.step_s for r in planned.results), sum(r.report.wire_bytes() for r in planned.results),
            sum(r.report.mem_bytes for r in planned.results))
    better = [(f[0], name) for name, f in planned.predicted.items() if all(g < m for g, m in zip((f[0], f[3], f[2]), mine))]
    return min(better)[1] if better else None


def _describe(specs: Sequence[Spec], leaves: Leaves) -> str:
    """A baseline's shardings in one phrase for the report."""
    split = sum(1 for s in specs if any(e is not None for e in s))
    return f"{split} of {len(specs)} leaves split"


def _path_str(path: tuple[Any, ...], arg_names: Sequence[str]) -> str:
    """`opt_state[0].mu['w1']`: which argument (by the step's parameter name), then the key path inside it."""
    return arg_names[path[0]] + jax.tree_util.keystr(tuple(path[1:]))


def _shardings(mesh: JaxMesh, treedef: Any, specs: Sequence[Spec]) -> tuple[Any, ...]:
    """Per-leaf specs as pytrees of NamedSharding shaped as the arguments."""
    return tuple(jax.tree_util.tree_unflatten(treedef, [NamedSharding(mesh, P(*s)) for s in specs]))


def parallelize(fn: Callable[..., Any] | None = None, *, mesh: Any, params_argnums: Sequence[int] = (0,),
                donate_argnums: int | Sequence[int] = (), measure_s: float | None = 8.0, **options: Any) -> Any:
    """Decorator form of `plan`: plans on the first call per signature (shapes, dtypes, tree
    structure) and runs the jitted step; `.plans` holds the plans made. It has the arguments, so
    the plan is judged by running it (`measure_s`, as `@eqsat.optimize` judges its versions): the
    plan is kept only when its step is faster with confidence than the `within` baseline's."""
    def wrap(f: Callable[..., Any]) -> Any:
        plans: dict[Any, Plan] = {}
        steps: dict[Any, Callable[..., Any]] = {}

        def run(*args: Any) -> Any:
            flat, treedef = jax.tree_util.tree_flatten(tuple(args))
            key = (treedef, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__))) for x in flat))
            if key not in steps:
                plans[key] = plan(f, *args, mesh=mesh, params_argnums=params_argnums, measure_s=measure_s, **options)
                steps[key] = plans[key].jit(donate_argnums=donate_argnums)
            return steps[key](*args)

        run.plans = plans  # type: ignore[attr-defined]
        run.__wrapped__ = f  # type: ignore[attr-defined]
        run.__name__ = getattr(f, "__name__", "step")
        return run

    return wrap if fn is None else wrap(fn)

"""Where the lowered step holds the plan's layouts: `with_sharding_constraint` on values opaque
equations make (`boundary_constraints`) and on values inside the captured graphs
(`inner_constraints`, read back from the plan by `eqsat.parallel.layouts`), and the traced step
replayed with them (`constrained_step`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core as jcore
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from eqsat import ops
from eqsat.ir import Graph
from eqsat.parallel.layouts import value_layouts
from eqsat.parallel.planner import PlanResult
from eqsat.parallel.specs import Spec, partition_spec
from jax_backend.capture import GraphStep, Program, bind_eqn, scan_counts

__all__ = ["boundary_constraints", "constrained_step", "inner_constraints", "where_str"]


def boundary_constraints(program: Program, boundary: Mapping[int, Spec], closed: Any) -> tuple[tuple[Any, Spec], ...]:
    """(jaxpr variable of the step, spec) for the planned values that opaque equations of the step's
    own jaxpr make (not those inside an inlined call): where the lowered step needs a
    `with_sharding_constraint` to hold the plan's split at a boundary GSPMD would otherwise choose."""
    top = {id(e) for e in closed.jaxpr.eqns}
    out: list[tuple[Any, Spec]] = []
    for step in program.opaque:
        if id(step.eqn) not in top:
            continue
        for var, vid in zip(step.eqn.outvars, step.outputs):
            if vid in boundary and isinstance(var, jcore.Var):
                out.append((var, boundary[vid]))
    return tuple(out)


def inner_constraints(program: Program, step: GraphStep, res: PlanResult, names: Sequence[str],
                       sizes: Mapping[str, int], wanted: Collection[str] | None) -> tuple[list[tuple[Any, Spec, str]], int]:
    """(where in the step, spec, op) holding the plan's layout of each value of `step`'s graph whose
    op is in `wanted` (None: every op) inside the traced step (`eqsat.parallel.layouts`: the layout
    read back from the plan; `Program.where`: the variable, possibly inside inlined calls, that
    holds the value, or one of its views); and how many of those ops' values have no variable to
    hold (made inside a loop body, or by one of several IR instructions an equation captures to
    with no view of it the step names), left to GSPMD. Only split layouts are held: a value the
    plan computes whole on every device is left to GSPMD, which keeps it split where its inputs are
    (held whole, the MoE step on 8 devices compiled to 4.6 MB moved instead of 2.1; docs/parallel.md)."""
    graph = step.graph
    roots = _made_by(graph, wanted) if wanted is not None else {
        i: i for i, n in enumerate(graph.nodes) if not ops.OPS[n.op].is_leaf}
    # outputs the plan leaves split (`planner.with_open_outputs`) are held split too, so the next
    # piece reads them as planned and GSPMD does not gather them at the graph's edge
    opened = set(res.report.open)
    roots.update({g.node: g.node for g, v in zip(graph.outputs, res.plan.outputs)
                  if v.node in opened and not ops.OPS[graph.nodes[g.node].op].is_leaf})
    held = {node for vid, node, index in step.sources
            if node in roots and vid in program.where
            and tuple(getattr(program.where[vid][-1].aval, "shape", ())) == graph.nodes[node].shapes[index]}
    layouts = value_layouts(graph, res.plan, held)
    out: list[tuple[Any, Spec, str]] = []
    for vid, node, index in step.sources:
        layout = layouts.get((node, index))
        if layout is None or node not in held:
            continue
        where = program.where[vid]
        spec = partition_spec(dict(layout.split), graph.nodes[node].shapes[index], names, sizes)
        if not spec:  # held whole: left to GSPMD (replicating it would gather what it keeps split; see docs)
            continue
        out.append((where if len(where) > 1 else where[0], spec, graph.nodes[roots[node]].op))
    return out, len(set(roots.values()) - {roots[n] for n in held})


def _made_by(graph: Graph, wanted: Collection[str]) -> dict[int, int]:
    """Nodes of an op in `wanted`, and the views of them (reshape, transpose, a dtype conversion,
    following one input back), each with the node of that op it views: an einsum captures to a
    product between transposes and reshapes, and its variable holds the last view."""
    views = ("reshape", "transpose", "convert_element_type")
    out: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        if n.op in wanted:
            out[i] = i
        elif n.op in views and n.inputs and n.inputs[0].node in out:
            out[i] = out[n.inputs[0].node]
    return out


def constrained_step(closed: Any, out_tree: Any, constraints: Sequence[tuple[Any, Spec]], mesh: JaxMesh) -> Callable[..., Any]:
    """The traced step, equation by equation (`bind_eqn`, as `jax.core.eval_jaxpr` runs them), with
    `with_sharding_constraint` on the values in `constraints`: the same computation as the user's
    step, holding the plan's splits where it crosses the parts it leaves opaque and inside the
    captured graphs. A constraint names a variable of the step's jaxpr, or a path (`Program.where`:
    the call equations it is inside, then the variable); a call on such a path is run inlined,
    equation by equation, so the constraint lands on the value inside it (the same computation:
    XLA inlines the call anyway); a scan on such a path is run again as `lax.scan` with the
    constraints in its body."""
    wanted = {_path_ids(key): NamedSharding(mesh, P(*spec)) for key, spec in constraints}
    opened = {path[:k] for path in wanted for k in range(1, len(path))}

    def run_jaxpr(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], prefix: tuple[Any, ...]) -> list[Any]:
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))

        def read(atom: Any) -> Any:
            return atom.val if isinstance(atom, jcore.Literal) else env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            inner = (*prefix, id(eqn))
            if inner in opened and str(eqn.primitive) == "scan":
                outs = _opened_scan(eqn, ins, functools.partial(run_jaxpr, prefix=inner))
            elif inner in opened:
                call = eqn.params["jaxpr"]
                outs = run_jaxpr(call.jaxpr, call.consts, ins, inner)
            else:
                outs = bind_eqn(eqn, ins)
            for var, value in zip(eqn.outvars, outs):
                if isinstance(var, jcore.Var):
                    held = wanted.get((*prefix, var))
                    env[var] = jax.lax.with_sharding_constraint(value, held) if held is not None else value
        return [read(v) for v in jaxpr.outvars]

    def run(*args: Any) -> Any:
        outs = run_jaxpr(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args), ())
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return run


def _opened_scan(eqn: Any, ins: Sequence[Any], run_body: Callable[[Any, Sequence[Any], Sequence[Any]], list[Any]]) -> list[Any]:
    """A scan equation again as `lax.scan` with its parameters, its body run by `run_body` (which
    holds the constraints inside it): a layer stack under `nn.scan` keeps the plan's layouts."""
    p = eqn.params
    body = p["jaxpr"]
    n_consts, n_carry = scan_counts(p, len(ins))
    fixed, init, xs = list(ins[:n_consts]), list(ins[n_consts:n_consts + n_carry]), list(ins[n_consts + n_carry:])

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        outs = run_body(body.jaxpr, body.consts, [*fixed, *carry, *x])
        return outs[:n_carry], outs[n_carry:]

    carry, ys = jax.lax.scan(step, init, xs, length=int(p["length"]), reverse=bool(p["reverse"]),
                             unroll=p.get("unroll", 1))
    return [*carry, *ys]


def _path_ids(key: Any) -> tuple[Any, ...]:
    """A constraint's key as (id of each call equation, variable): a bare variable is one of the step's own."""
    path = key if isinstance(key, tuple) else (key,)
    return (*(id(e) for e in path[:-1]), path[-1])


def where_str(key: Any) -> str:
    """A constraint's place for the report: `var`, or `_einsum/var` inside an inlined call."""
    path = key if isinstance(key, tuple) else (key,)
    return "/".join([*(str(e.params.get("name", e.primitive)) for e in path[:-1]), str(path[-1])])

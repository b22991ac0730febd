"""Activation checkpointing in the user's lowered step: the plan's recomputed products, made again
in the backward of the traced step.

The planner chooses which products (matmul, conv) the backward recomputes instead of keeping
(`eqsat.parallel.planner.with_recompute`: twin e-nodes priced by memory and recompute time). The
user's step is already differentiated when it is traced (`jax.value_and_grad` inside it), so
`jax.checkpoint` cannot be wrapped around its loss from outside; the step's jaxpr holds the
forward and, after it, the backward that reads the forward's values (the residuals). So the
lowering rewrites the residuals' reads, as `jax.checkpoint`'s own partial evaluation does:

- each recomputed product is found in the step's forward by the weight it reads (the plan's
  product reads a `weight` leaf through distribution ops only, `memory.recompute_bytes`; the
  step's `dot_general` / `conv_general_dilated`, or a call with one inside such as `jnp.einsum`,
  reads that argument through moves such as `transpose`); several products of one weight are
  matched in order;
- what is recomputed is that product and the forward values computed from it without passing
  another product (its bias add, activation, relu mask): the product's elementwise tail;
- a backward equation that reads such a value reads a copy made again from the saved values it
  depends on, taken through `jax.lax.optimization_barrier` together with a value of the backward
  (the equation's own cotangent input, else the last backward value), so XLA neither merges the
  copy with the forward's (CSE) nor hoists it into the forward. The forward's own value then dies
  after its last forward use, which is the memory the plan counts on (`memory_analysis()` shows it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend.core as jcore
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from eqsat import ops
from eqsat.ir import Graph
from jax_backend.capture import bind_eqn, graph_leaf_name

PRODUCTS = ("dot_general", "conv_general_dilated")
# primitives that only move or relabel a value: a product reads a weight through them
MOVES = frozenset({"transpose", "reshape", "convert_element_type", "broadcast_in_dim", "squeeze", "expand_dims", "copy",
                   "copy_p"})

Spec = tuple[Any, ...]
CALLS = ("pjit", "jit")  # a call whose body has a product is one (`jnp.einsum` is jitted)


def is_product(eqn: Any) -> bool:
    """A product of the step: a dot_general / convolution, or a call with one in its body."""
    name = str(eqn.primitive)
    if name in PRODUCTS:
        return True
    body = eqn.params.get("jaxpr") if name in CALLS else None
    return body is not None and any(is_product(e) for e in getattr(body, "jaxpr", body).eqns)


def plan_weight_key(plan: Graph, i: int) -> tuple[str, ...]:
    """The weights (leaf names) plan node i reads through distribution ops only, sorted."""
    names: list[str] = []
    for v in plan.nodes[i].inputs:
        j = v.node
        while ops.op_spec(plan.nodes[j].op).weight_derivation == "moves" and plan.nodes[j].inputs:
            j = plan.nodes[j].inputs[0].node
        if plan.nodes[j].op == "weight":
            names.append(str(plan.nodes[j].attr["name"]))
    return tuple(sorted(names))


def recomputed_products(plans: Sequence[tuple[Graph, Sequence[int]]]) -> list[tuple[tuple[str, ...], int]]:
    """(weight key, ordinal among the plan's products of that key) of each recomputed product."""
    out: list[tuple[tuple[str, ...], int]] = []
    for plan, marks in plans:
        g = plan.live()
        seen: dict[tuple[str, ...], int] = {}
        chosen = set(marks)
        for i, n in enumerate(g.nodes):
            if not ops.OPS[n.op].contraction:
                continue
            key = plan_weight_key(g, i)
            k = seen.get(key, 0)
            seen[key] = k + 1
            if i in chosen and key:
                out.append((key, k))
    return out


@dataclass(frozen=True)
class Remat:
    """The step's recompute: `values` (jaxpr variables of the forward) the backward makes again,
    their equations (`producer`: variable -> index into the step's equations) and where the
    forward ends (`end`: the equations before it are the forward)."""

    values: frozenset[Any]
    producer: Mapping[Any, int]
    end: int
    products: int  # the recomputed products found in the step


def find_remat(closed: Any, forward: Any, wanted: Sequence[tuple[tuple[str, ...], int]],
               state_names: Collection[str]) -> Remat | None:
    """The recompute of the products `wanted` ((weight key, ordinal)) in the step `closed` whose
    forward (the loss's equations, `step_args.forward_jaxpr`) is `forward`; None when none is found."""
    if not wanted:
        return None
    eqns = list(closed.jaxpr.eqns)
    in_forward = {id(e) for e in forward.jaxpr.eqns}
    end = max((k + 1 for k, e in enumerate(eqns) if id(e) in in_forward), default=0)
    arg_name = {v: graph_leaf_name(p) for p, v in enumerate(closed.jaxpr.invars)}
    producer: dict[Any, int] = {}
    for k, e in enumerate(eqns[:end]):
        for v in e.outvars:
            if isinstance(v, jcore.Var):
                producer[v] = k

    def source(atom: Any) -> str | None:
        while isinstance(atom, jcore.Var) and atom in producer and str(eqns[producer[atom]].primitive) in MOVES:
            atom = eqns[producer[atom]].invars[0]
        name = arg_name.get(atom) if isinstance(atom, jcore.Var) else None
        return name if name in state_names else None

    seen: dict[tuple[str, ...], int] = {}
    chosen: set[int] = set()
    want = set(wanted)
    for k, e in enumerate(eqns[:end]):
        if is_product(e):
            key = tuple(sorted(n for n in map(source, e.invars) if n is not None))
            j = seen.get(key, 0)
            seen[key] = j + 1
            if (key, j) in want:
                chosen.add(k)
    if not chosen:
        return None
    values: set[Any] = set()
    for k, e in enumerate(eqns[:end]):
        saved_product = is_product(e) and k not in chosen
        if k in chosen or (not saved_product and any(isinstance(v, jcore.Var) and v in values for v in e.invars)):
            values.update(v for v in e.outvars if isinstance(v, jcore.Var))
    return Remat(frozenset(values), producer, end, len(chosen))


def checkpointed_step(closed: Any, out_tree: Any, remat: Remat, constraints: Sequence[tuple[Any, Spec]],
                      mesh: JaxMesh) -> Callable[..., Any]:
    """The traced step, equation by equation (as `constraints.constrained_step`, with its sharding
    constraints), whose backward reads the values of `remat` made again (see the module docstring)."""
    jaxpr, consts = closed.jaxpr, closed.consts
    eqns = list(jaxpr.eqns)
    wanted = {var: NamedSharding(mesh, P(*spec)) for var, spec in constraints}
    backward = {v for e in eqns[remat.end:] for v in e.outvars if isinstance(v, jcore.Var)}

    def run(*args: Any) -> Any:
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, jax.tree_util.tree_leaves(args)))
        again: dict[Any, Any] = {}
        last: list[Any] = []  # the latest backward value

        def read(atom: Any) -> Any:
            return atom.val if isinstance(atom, jcore.Literal) else env[atom]

        def store(target: dict[Any, Any], eqn: Any, outs: Sequence[Any]) -> None:
            for var, value in zip(eqn.outvars, outs):
                if isinstance(var, jcore.Var):
                    target[var] = jax.lax.with_sharding_constraint(value, wanted[var]) if var in wanted else value

        def saved_inputs(var: Any, found: dict[Any, None]) -> None:
            """The saved (not recomputed) variables `var`'s recompute reads, in order."""
            for a in eqns[remat.producer[var]].invars:
                if isinstance(a, jcore.Var):
                    if a in remat.values:
                        if a not in again:
                            saved_inputs(a, found)
                    else:
                        found.setdefault(a, None)

        def remake(var: Any, fresh: Mapping[Any, Any]) -> Any:
            if var not in again:
                eqn = eqns[remat.producer[var]]
                ins = [a.val if isinstance(a, jcore.Literal) else remake(a, fresh) if a in remat.values else fresh[a]
                       for a in eqn.invars]
                store(again, eqn, bind_eqn(eqn, ins))
            return again[var]

        for k, eqn in enumerate(eqns):
            if k < remat.end or not any(isinstance(a, jcore.Var) and a in remat.values for a in eqn.invars):
                ins = [read(a) for a in eqn.invars]
            else:
                need = [a for a in eqn.invars if isinstance(a, jcore.Var) and a in remat.values and a not in again]
                found: dict[Any, None] = {}
                for a in need:
                    saved_inputs(a, found)
                dep = [read(a) for a in eqn.invars if isinstance(a, jcore.Var) and a in backward] or last
                held, _ = jax.lax.optimization_barrier(([env[a] for a in found], dep))
                fresh = dict(zip(found, held))
                ins = [remake(a, fresh) if isinstance(a, jcore.Var) and a in remat.values else read(a)
                       for a in eqn.invars]
            outs = bind_eqn(eqn, ins)
            store(env, eqn, outs)
            if k >= remat.end and outs:
                last = [outs[0]]
        return jax.tree_util.tree_unflatten(out_tree, [read(v) for v in jaxpr.outvars])

    return run


__all__ = ["Remat", "checkpointed_step", "find_remat", "is_product", "plan_weight_key", "recomputed_products"]

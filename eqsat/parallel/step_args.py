"""The user's training step as the planner sees it: its forward (the equations its loss is computed
from, cut out of the step's jaxpr), its arguments as flat leaves (key paths, shapes, which are model
state), the `PartitionSpec`s that leaves the plan does not reach take from those it does, the new state's
shardings, and the hand-written baselines' specs (data parallel, FSDP, Megatron, DP x TP).
`eqsat.parallel.api` plans with them (`eqsat.parallel.step_planner`) and lowers through JAX."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.extend.core as jcore
import numpy as np
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from eqsat import ops
from eqsat.parallel.specs import Spec
from jax_backend.capture import Program

__all__ = ["Leaves", "baseline_specs", "flat_leaves", "forward_jaxpr", "mirror", "out_shardings", "state_elements",
           "state_outputs", "unwrap_jit"]


# --- the forward of the step ----------------------------------------------------------------------

def unwrap_jit(closed: Any) -> Any:
    """The step's own jaxpr when the whole step is one `jax.jit` / `eqx.filter_jit` call (a decorated
    `train_step` traces to a single call equation over all its arguments, which would hide the loss
    from `forward_jaxpr`); else `closed` itself."""
    jaxpr = closed.jaxpr
    if len(jaxpr.eqns) != 1 or str(jaxpr.eqns[0].primitive) not in ("jit", "pjit"):
        return closed
    eqn = jaxpr.eqns[0]
    inner = eqn.params.get("jaxpr")
    body, consts = (inner.jaxpr, list(inner.consts)) if hasattr(inner, "consts") else (inner, [])
    if (not isinstance(body, jcore.Jaxpr) or len(body.constvars) != len(consts)
            or list(eqn.invars) != list(jaxpr.invars) or len(body.outvars) != len(eqn.outvars)):
        return closed
    inside = dict(zip(eqn.outvars, body.outvars)) | dict(zip(jaxpr.invars, body.invars))
    outs = [inside.get(v, v) if isinstance(v, jcore.Var) else v for v in jaxpr.outvars]
    if not all(isinstance(v, jcore.Literal) or v in set(body.invars) or any(v in e.outvars for e in body.eqns)
               for v in outs):
        return closed
    return jcore.ClosedJaxpr(jcore.Jaxpr(body.constvars, body.invars, outs, body.eqns, body.effects,
                                         debug_info=jaxpr.debug_info), consts)


def forward_jaxpr(closed: Any, state_vars: set[Any], not_loss: Collection[int] = ()) -> tuple[Any, int] | None:
    """The step's forward: the equations its loss (the first float scalar output that depends on
    the model state and is no new state, `not_loss`) is computed from, as a closed jaxpr over all
    the step's arguments; and that output's index. None when no output is such a loss."""
    jaxpr = closed.jaxpr
    depends: set[Any] = set(state_vars)
    for eqn in jaxpr.eqns:
        if any(isinstance(v, jcore.Var) and v in depends for v in eqn.invars):
            depends.update(eqn.outvars)
    for k, out in enumerate(jaxpr.outvars):
        aval = getattr(out, "aval", None)
        if (k not in not_loss and isinstance(out, jcore.Var) and out in depends and aval is not None and aval.shape == ()
                and jax.numpy.issubdtype(aval.dtype, jax.numpy.floating)):
            needed: set[Any] = {out}
            kept = []
            for eqn in reversed(jaxpr.eqns):
                if any(v in needed for v in eqn.outvars if isinstance(v, jcore.Var)):
                    kept.append(eqn)
                    needed.update(v for v in eqn.invars if isinstance(v, jcore.Var))
            info = jaxpr.debug_info
            if info is not None and isinstance(info.result_paths, tuple) and len(info.result_paths) > k:
                info = info._replace(result_paths=(info.result_paths[k],))
            forward = jcore.Jaxpr(jaxpr.constvars, jaxpr.invars, [out], list(reversed(kept)), debug_info=info)
            return jcore.ClosedJaxpr(forward, closed.consts), k
    return None


# --- specs per argument leaf ----------------------------------------------------------------------

@dataclass(frozen=True)
class Leaves:
    """The step's flat arguments: key paths, shapes, which argument each is from, and which are state."""

    paths: tuple[tuple[Any, ...], ...]
    shapes: tuple[tuple[int, ...], ...]
    arg_of: tuple[int, ...]
    state: tuple[bool, ...]


def flat_leaves(args: Sequence[Any], state_argnums: Sequence[int]) -> tuple[Leaves, Any]:
    """The arguments' leaves in `jax.tree_util` order (the traced jaxpr's invars), with their treedef."""
    paths, shapes, arg_of, state = [], [], [], []
    for k, a in enumerate(args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            paths.append((k, *path))
            shapes.append(tuple(int(d) for d in np.shape(leaf)))
            arg_of.append(k)
            state.append(k in state_argnums)
    return Leaves(tuple(paths), tuple(shapes), tuple(arg_of), tuple(state)), jax.tree_util.tree_structure(tuple(args))


def mirror(leaves: Leaves, specs: list[Spec | None], batch: Sequence[tuple[int, Any]] = ()) -> list[Spec]:
    """Fill the leaves the plan did not reach: state that mirrors a planned state leaf (same shape,
    that leaf's key path minus its argument a suffix of this one's: Adam's mu, nu) takes its spec;
    data sharing a planned data leaf's leading dim takes its batch split, else that of a planned
    value made by opaque equations (`batch`: the tokens of an embedding gather whose output the plan
    splits); the rest is replicated."""
    out: list[Spec] = []
    for i, spec in enumerate(specs):
        if spec is not None:
            out.append(spec)
            continue
        found: Spec = ()
        if leaves.state[i]:
            tail = leaves.paths[i][1:]
            for j, other in enumerate(specs):
                if other and leaves.state[j] and leaves.shapes[j] == leaves.shapes[i]:
                    key = leaves.paths[j][1:]
                    if key and tail[len(tail) - len(key):] == key:
                        found = other
                        break
        elif leaves.shapes[i]:
            for j, other in enumerate(specs):
                if (other and not leaves.state[j] and other[0] is not None and leaves.shapes[j]
                        and leaves.shapes[j][0] == leaves.shapes[i][0]):
                    found = (other[0],)
                    break
            else:
                # the finest batch split of the planned values with this leading dim (a value split
                # over `model` only, before a reshape splits it over `data` too, must not halve the batch split)
                fits = [split for size, split in batch if size == leaves.shapes[i][0]]
                found = (max(fits, key=lambda s: len(s) if isinstance(s, tuple) else 1),) if fits else ()
        out.append(found)
    return out


def state_elements(out_shape: Any, args: Sequence[Any], state_argnums: Sequence[int]) -> list[int | None]:
    """Per top-level element of the step's output (a tuple or list), the state argument it is the
    new value of (same tree, shapes and dtypes; each argument matched once, in order), or None."""
    if not isinstance(out_shape, (tuple, list)):
        return []

    def signature(tree: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, tuple((tuple(np.shape(x)), str(jax.numpy.result_type(x))) for x in leaves)

    wanted = {k: signature(args[k]) for k in state_argnums}
    used: set[int] = set()
    found: list[int | None] = []
    for elem in out_shape:
        sig = signature(elem)
        match = next((k for k in state_argnums if k not in used and wanted[k] == sig), None)
        if match is not None:
            used.add(match)
        found.append(match)
    return found


def state_outputs(out_shape: Any, args: Sequence[Any], state_argnums: Sequence[int]) -> set[int]:
    """Flat output indices that are new model state (not a loss, whatever their shape)."""
    out: set[int] = set()
    start = 0
    if not isinstance(out_shape, (tuple, list)):
        return out
    for elem, match in zip(out_shape, state_elements(out_shape, args, state_argnums)):
        n = len(jax.tree_util.tree_leaves(elem))
        if match is not None:
            out.update(range(start, start + n))
        start += n
    return out


def out_shardings(out_shape: Any, args: Sequence[Any], in_shardings: tuple[Any, ...], state_argnums: Sequence[int],
                   mesh: JaxMesh) -> Any:
    """New model state placed as the old (`state_elements`); everything else is replicated."""
    replicated = NamedSharding(mesh, P())
    matches = state_elements(out_shape, args, state_argnums)
    if not matches:
        return jax.tree_util.tree_map(lambda _: replicated, out_shape)
    parts = [in_shardings[m] if m is not None else jax.tree_util.tree_map(lambda _: replicated, elem)
             for elem, m in zip(out_shape, matches)]
    if isinstance(out_shape, list):
        return parts
    return type(out_shape)(*parts) if hasattr(out_shape, "_fields") else tuple(parts)


# --- baselines ------------------------------------------------------------------------------------

def _megatron_order(program: Program | None, leaves: Leaves) -> list[int]:
    """State leaves that are matrices, in the order the captured forward's products read them."""
    order: list[int] = []
    if program is not None:
        for step in program.graphs:
            g = step.graph
            for n in g.nodes:
                if n.op == "matmul" and len(n.inputs) == 2:
                    src = g.nodes[n.inputs[1].node]
                    if ops.OPS[src.op].is_leaf:
                        vid = int(str(src.attr["name"])[1:])
                        if vid < len(leaves.paths) and vid not in order and leaves.state[vid]:
                            order.append(vid)
    order += [i for i, s in enumerate(leaves.shapes) if leaves.state[i] and len(s) == 2 and i not in order]
    return [i for i in order if len(leaves.shapes[i]) == 2]


def baseline_specs(name: str, leaves: Leaves, names: Sequence[str], sizes: Mapping[str, int],
                   program: Program | None) -> list[Spec]:
    """Hand-written shardings of each kind: data parallel (batch over every axis), FSDP (that, and
    state sharded over every axis on its largest divisible dim), Megatron (matrices alternately
    column / row split over the last axis, in forward order; the rest replicated), DP x TP (batch
    over the other axes, Megatron over the last)."""
    everything = tuple(names)
    total = math.prod(sizes[n] for n in everything)

    def batch(axes: tuple[str, ...]) -> list[Spec]:
        n = math.prod(sizes[a] for a in axes) if axes else 1
        return [(axes if len(axes) > 1 else axes[0],) if (not leaves.state[i] and axes and leaves.shapes[i]
                                                          and leaves.shapes[i][0] % n == 0) else ()
                for i in range(len(leaves.paths))]

    if name == "data-parallel":
        return batch(everything)
    if name == "fsdp":
        specs = batch(everything)
        for i, shape in enumerate(leaves.shapes):
            if leaves.state[i] and shape:
                dims = sorted((d for d in range(len(shape)) if shape[d] % total == 0), key=lambda d: -shape[d])
                if dims:
                    e: list[Any] = [None] * len(shape)
                    e[dims[0]] = everything if len(everything) > 1 else everything[0]
                    specs[i] = tuple(e)
        return specs
    tp = names[-1]
    specs = batch(tuple(names[:-1])) if name == "dp-x-tp" else [() for _ in leaves.paths]
    for k, i in enumerate(_megatron_order(program, leaves)):
        d = 1 if k % 2 == 0 else 0
        if leaves.shapes[i][d] % sizes[tp] == 0:
            specs[i] = (None, tp) if d == 1 else (tp,)
    return mirror(leaves, [s if s or not leaves.state[i] else None for i, s in enumerate(specs)])

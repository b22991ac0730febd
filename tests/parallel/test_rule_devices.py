"""Each parallelization rule on devices: both sides, built as programs from well-typed shapes the
verifier samples, run as `shard_map` on a 2-device mesh and agree with the left side in numpy.

A rule's variables may stand for distributed values (`?y` of `(reduce A ?y)`): each is tried
replicated (a plain input) or split across the axis (the partition of an input), and a distributed
result is combined back, so that both sides are whole SPMD programs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import pytest

jax = pytest.importorskip("jax")

if jax.device_count() < 2:
    pytest.skip("needs 2 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)", allow_module_level=True)

from eqsat.errors import EqsatError
from eqsat.ir import Graph, GraphBuilder, Tensor
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import graph_axes
from eqsat.parallel.rules import instantiate
from eqsat.rewrites.rule import Pattern, Rule, Var, variables
from eqsat.rewrites.semantics import bind_attrs
from eqsat.rewrites.shapes import sample_assignments
from jax_backend.shard import shard_plan

PARTS = 2


def _build(p: Pattern, env: Mapping[str, object], b: GraphBuilder, leaves: Mapping[str, Tensor]) -> Tensor:
    if isinstance(p, Var):
        return leaves[p.name]
    t = bind_attrs(p, env)
    return b.apply(t.op, [_build(a, env, b, leaves) for a in t.args], t.attr)[0]


def _program(side: Pattern, env: Mapping[str, object], split: frozenset[str]) -> Graph | None:
    """`side` with its variables bound to inputs (split ones partitioned), as a depth-0 program."""
    b = GraphBuilder()
    leaves = {}
    for v in dict.fromkeys(variables(side)):
        shape = tuple(env[v])  # type: ignore[arg-type]
        if v in split:
            whole = (*shape[1:-1], shape[-1] * PARTS)
            leaves[v] = b.apply("partition", [b.input(v, whole)], {"dim": -1, "axis": 0, "parts": PARTS})[0]
        else:
            leaves[v] = b.input(v, shape)
    try:
        out = _build(side, env, b, leaves)
        graph = b.build([out])
        if graph_axes(graph)[-1]:
            out = b.apply("combine", [out], {"dim": -1, "axis": 0})[0]
            graph = b.build([out])
        return graph if not graph_axes(graph)[-1] else None
    except EqsatError:
        return None


def _pair(rule: Rule) -> tuple[Graph, Graph] | None:
    names = list(dict.fromkeys(variables(rule.lhs[0])))
    for env in sample_assignments(rule, 12, seed=1, guarded=True):
        for chosen in itertools.product((False, True), repeat=len(names)):
            split = frozenset(n for n, c in zip(names, chosen) if c)
            if any(len(env[n]) < 2 or env[n][0] != PARTS for n in split):  # type: ignore[arg-type]
                continue
            lhs, rhs = _program(rule.lhs[0], env, split), _program(rule.rhs[0], env, split)
            if lhs is not None and rhs is not None and lhs.leaf_shapes() == rhs.leaf_shapes():
                return lhs, rhs
    return None


def _one_per_rule() -> list[Rule]:
    seen: dict[str, Rule] = {}
    for r in instantiate(0, PARTS):
        seen.setdefault(r.name.split("[")[0].split("@")[0], r)
    return list(seen.values())


RULES = _one_per_rule()


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_on_devices(rule: Rule) -> None:
    pair = _pair(rule)
    if pair is None:
        pytest.skip(f"{rule.name}: no sampled shapes give two whole SPMD programs")
    lhs, rhs = pair
    mesh = parse_mesh(str(PARTS))
    values = {k: v.astype(np.float32) for k, v in lhs.random_inputs(0).items()}
    want = lhs.evaluate({k: v.astype(np.float64) for k, v in values.items()})[0]
    for side in (lhs, rhs):
        program = shard_plan(side, mesh)
        got = np.asarray(program.fn(*program.place(values))[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{rule.name}: {side.op_counts()}")

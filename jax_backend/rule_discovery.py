"""Which rewrites pay on this device, found by measurement (`eqsat rules discover`).

A cost model predicts; this measures. Every place a rule's left side matches a program's graph (a
captured JAX program or a model) is an instance: the matched subgraph with its concrete shapes. The
left side and the right side of each instance are jitted alone, checked equal (`eqsat.compare`),
and timed against each other by the one timing policy (`jax_backend.timing.paired_timing`:
interleaved rounds, a bootstrap interval of the median speedup). A rule "paid" at an instance when
the whole interval of left/right lies above 1, and "lost" where it lies below. Probe instances give
rules whose left side has one tensor variable (pools, layout changes) typical NCHW feature maps, so
a rule can be measured before any program contains it.

The instance is timed in isolation, as the measured cost model times an op: what XLA fuses across
the instance's boundary in a whole program is not seen here (an end-to-end check is the
decorator's keep/discard decision). The measured model's own prediction for both sides
(`jax_backend.measured_cost`, summed op costs) is reported beside the measurement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat import ops
from eqsat.compare import outputs_agree
from eqsat.errors import EqsatError, ShapeError
from eqsat.ir import Graph, Value
from eqsat.rewrites.rule import CLASS_CONDITIONS, DTYPE_CONDITION, AttrVar, Pattern, Rule, Term, Var, subterms, variables
from eqsat.rewrites.semantics import SplitSizes, bind_attrs, instantiate, pattern_shape, rule_split_sizes
from eqsat.rewrites.shapes import condition_holds
from eqsat.rulesets import dtype_scope
from jax_backend.timing import paired_timing

__all__ = ["PROBE_SHAPES", "Instance", "InstanceTiming", "discover", "graph_instances", "probe_instances",
           "rule_summaries", "time_instance"]

Shape = tuple[int, ...]

PROBE_SHAPES: tuple[Shape, ...] = ((4, 64, 56, 56), (4, 192, 28, 28), (8, 512, 14, 14), (8, 1024, 7, 7))
"""NCHW feature maps of ResNet / GoogLeNet stages: where a one-variable rule is probed."""

AGREE_RTOL = 1e-4  # both sides in float32, summed in different orders: a few ulps of the output's magnitude


class DiscoveryError(EqsatError):
    """Bad input to `eqsat rules discover` (no rules, an unknown program, a budget that is not positive)."""


@dataclass(frozen=True)
class Instance:
    """One place a rule applies: tensor variables' shapes, attribute variables' values, and where."""

    rule: Rule
    shapes: tuple[tuple[str, Shape], ...]
    attrs: tuple[tuple[str, Any], ...]
    where: str  # "inception" (a program's graph) or "probe"
    dtypes: tuple[tuple[str, str], ...] = ()  # tensor variables' dtypes where not float32

    @property
    def env(self) -> dict[str, Any]:
        return {**dict(self.shapes), **dict(self.attrs)}

    def describe(self) -> str:
        dtypes = dict(self.dtypes)
        return " ".join(f"{v}={'x'.join(map(str, s))}{':' + dtypes[v] if v in dtypes else ''}" for v, s in self.shapes)


@dataclass(frozen=True)
class InstanceTiming:
    """One instance measured: left side against right side (speedup > 1: the right side is faster)."""

    instance: Instance
    lhs_ms: float
    rhs_ms: float
    speedup: float  # median over rounds of left / right
    speedup_low: float
    speedup_high: float
    rounds: int
    agree: bool  # the two sides computed the same values (within AGREE_RTOL)
    model_speedup: float | None  # the measured cost model's prediction (left cost / right cost), None if not asked

    @property
    def verdict(self) -> str:
        """"paid" (interval above 1), "lost" (below 1) or "even" (it contains 1); "wrong" if the sides disagree."""
        if not self.agree:
            return "wrong"
        if self.speedup_low > 1.0:
            return "paid"
        return "lost" if self.speedup_high < 1.0 else "even"

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.instance.rule.name, "where": self.instance.where, "shapes": self.instance.describe(),
                "verdict": self.verdict, "speedup": self.speedup, "speedup_ci_low": self.speedup_low,
                "speedup_ci_high": self.speedup_high, "lhs_ms": self.lhs_ms, "rhs_ms": self.rhs_ms,
                "rounds": self.rounds, "agree": self.agree, "model_speedup": self.model_speedup}


# --- instances ---------------------------------------------------------------------------------------

def _match(p: Pattern, graph: Graph, value: Value, env: dict[str, Any]) -> bool:
    """Bind `p` to the subgraph computing `value` (extending `env`: variable → Value, attribute
    variable → value); False, with `env` possibly half-extended, where it does not match."""
    if isinstance(p, Var):
        if p.name in env:
            return bool(env[p.name] == value)
        env[p.name] = value
        return True
    node = graph.nodes[value.node]
    if p.op != node.op or p.op not in ops.OPS or len(p.args) != len(node.inputs):
        return False
    have = ops.op_spec(node.op).normalize_attrs(node.attr)
    for key, want in p.attrs:
        got = have.get(key)
        if isinstance(want, AttrVar):
            name = f"attr:{want.name}"
            if name in env and env[name] != got:
                return False
            env[name] = got
        elif isinstance(want, (int, float, str, tuple)) and not _refs(want) and want != got:
            return False
        # a computed attribute ((shape P), (dim P i)) on a left side: checked by the shapes below
    for kind, size in p.guards:
        if kind == "ndim" and len(graph.shape(value)) != size:
            return False
    return all(_match(a, graph, v, env) for a, v in zip(p.args, node.inputs))


def _refs(value: Any) -> bool:
    return not isinstance(value, (int, float, str)) and any(not isinstance(v, (int, float, str)) for v in value)


def _instance(rule: Rule, graph: Graph, env: Mapping[str, Any], where: str) -> Instance | None:
    """The instance `env` binds, or None where the rule's conditions or its right side's shapes fail."""
    shapes = {k: graph.shape(v) for k, v in env.items() if not k.startswith("attr:")}
    attrs = {k[5:]: v for k, v in env.items() if k.startswith("attr:")}
    dtypes = {k: graph.dtype(v) for k, v in env.items() if not k.startswith("attr:")}
    if dtype_scope(rule) != "any" and any(ops.dtype_kind(d) != "float" for d in dtypes.values()):
        return None  # a rule that computes rewrites float values only (`eqsat.rulesets.dtype_scope`)
    inst = Instance(rule, tuple(sorted(shapes.items())), tuple(sorted(attrs.items())), where,
                    tuple(sorted((k, d) for k, d in dtypes.items() if d != ops.DEFAULT_DTYPE)))
    return inst if _applies(inst) else None


def _applies(inst: Instance) -> bool:
    env = inst.env
    dtypes = dict(inst.dtypes)
    for c in inst.rule.conditions:  # `(dtype ?a bfloat16)`: the instance's values (probes: float32)
        if c.op == DTYPE_CONDITION and any(dtypes.get(v, ops.DEFAULT_DTYPE) != c.attr["dtype"] for v in variables(c)):
            return False
    try:
        if not all(c.op in CLASS_CONDITIONS or condition_holds(c, env) for c in inst.rule.conditions):
            return False
        bound, tensors = instantiate(inst.rule, env)
        sizes = rule_split_sizes(bound, tensors)
        left = [pattern_shape(p, tensors, sizes) for p in bound.lhs]
        right = [pattern_shape(p, tensors, sizes) for p in bound.rhs]
    except (ShapeError, EqsatError, KeyError, IndexError, TypeError):
        return False
    return left == right


def graph_instances(rules: Sequence[Rule], graph: Graph, where: str, limit: int = 64) -> list[Instance]:
    """Every distinct instance (by shapes) of `rules` in `graph`: single-output rules at each node,
    two-output rules at each pair of nodes (at most `limit` matches tried per rule)."""
    found: dict[tuple[Any, ...], Instance] = {}
    values = [Value(i, k) for i, n in enumerate(graph.nodes) for k in range(len(n.shapes))
              if not ops.OPS[n.op].is_leaf]
    for rule in rules:
        starts = [[v for v in values if _match(p, graph, v, {})] for p in rule.lhs]
        tried = 0
        for combo in itertools.product(*starts):
            if len(set(combo)) < len(combo):
                continue
            env: dict[str, Any] = {}
            if not all(_match(p, graph, v, env) for p, v in zip(rule.lhs, combo)):
                continue
            tried += 1
            inst = _instance(rule, graph, env, where)
            if inst is not None:
                found.setdefault((rule.name, inst.shapes, inst.attrs, inst.dtypes), inst)
            if tried >= limit:
                break
    return list(found.values())


def probe_instances(rules: Sequence[Rule], shapes: Sequence[Shape] = PROBE_SHAPES) -> list[Instance]:
    """Instances of the one-tensor-variable rules (no attribute variables) on each probe shape."""
    out: list[Instance] = []
    for rule in rules:
        names = sorted({v for p in rule.lhs for v in variables(p)})
        attr_vars = any(isinstance(v, AttrVar) for p in rule.lhs for t in subterms(p) for _, v in t.attrs)
        if len(names) != 1 or attr_vars or rule.is_multi:
            continue
        for shape in shapes:
            inst = Instance(rule, ((names[0], shape),), (), "probe")
            if _applies(inst):
                out.append(inst)
    return out


# --- running both sides ---------------------------------------------------------------------------------

def _evaluate(p: Pattern, env: Mapping[str, jax.Array], memo: dict[Pattern, jax.Array],
              split_sizes: SplitSizes | None) -> jax.Array:
    """A bound pattern computed in JAX, op by op through the backend's lowering (a two-output
    rule's `split_part` as the slice Tensat's convention gives it)."""
    from jax_backend.lower import lower_node

    if isinstance(p, Var):
        return env[p.name]
    if p in memo:
        return memo[p]
    args = [_evaluate(a, env, memo, split_sizes) for a in p.args]
    if p.op == "split_part":
        if split_sizes is None:
            raise DiscoveryError("split_0/split_1 outside a two-output rule")
        axis, index = p.attr["axis"], p.attr["index"]
        first, second = split_sizes(axis)
        out = lax.slice_in_dim(args[0], 0 if index == 0 else first, first if index == 0 else first + second, axis=axis)
    else:
        out = lower_node(p.op, args, p.attr, precision="default")[0]
    memo[p] = out
    return out


def side_function(patterns: Sequence[Pattern], names: Sequence[str],
                  split_sizes: SplitSizes | None = None) -> Callable[..., tuple[jax.Array, ...]]:
    """The jitted function of the tensor variables `names` that computes `patterns` (bound)."""
    def run(*xs: jax.Array) -> tuple[jax.Array, ...]:
        env = dict(zip(names, xs))
        memo: dict[Pattern, jax.Array] = {}
        return tuple(_evaluate(p, env, memo, split_sizes) for p in patterns)

    return jax.jit(run)


def _bind(p: Pattern, env: Mapping[str, Any]) -> Pattern:
    if isinstance(p, Var):
        return p
    t = bind_attrs(p, env)
    return Term(t.op, t.attrs, tuple(_bind(a, env) for a in t.args), t.guards)


def _model_cost(patterns: Sequence[Pattern], shapes: Mapping[str, Shape], model: Any,
                split_sizes: SplitSizes | None) -> float:
    """The measured cost model's price of a bound side: each distinct op application once (a split
    piece is a view: free)."""
    seen: dict[Pattern, float] = {}
    for p in patterns:
        for t in subterms(p):
            if t not in seen and t.op in ops.OPS:
                arg_shapes = [pattern_shape(a, shapes, split_sizes) for a in t.args]
                seen[t] = float(model.op_cost(t.op, t.attr, arg_shapes))
    return sum(seen.values())


def _random(rng: np.random.Generator, shape: Shape, dtype: str) -> jax.Array:
    """Positive floats (every op in its domain: a batchnorm's variance, a log), small integers, bits."""
    kind = ops.dtype_kind(dtype)
    if kind == "bool":
        return jnp.asarray(rng.random(shape) > 0.5)
    if kind == "int":
        return jnp.asarray(rng.integers(0, 8, shape).astype(ops.numpy_dtype(dtype)))
    return jnp.asarray((np.abs(rng.standard_normal(shape)) + 0.5).astype(ops.numpy_dtype(dtype)))


def time_instance(inst: Instance, budget_s: float = 2.0, rounds: int = 40, model: Any = None,
                  seed: int = 0) -> InstanceTiming:
    """Jit both sides of `inst`, check they agree on random inputs, and time them (paired rounds)."""
    bound, tensors = instantiate(inst.rule, inst.env)
    sizes = rule_split_sizes(bound, tensors)
    lhs = [_bind(p, inst.env) for p in bound.lhs]
    rhs = [_bind(p, inst.env) for p in bound.rhs]
    names = sorted(tensors)
    rng = np.random.default_rng(seed)
    dtypes = dict(inst.dtypes)
    args = [_random(rng, tensors[n], dtypes.get(n, ops.DEFAULT_DTYPE)) for n in names]
    left, right = side_function(lhs, names, sizes), side_function(rhs, names, sizes)
    agree = bool(outputs_agree([np.asarray(a) for a in left(*args)], [np.asarray(b) for b in right(*args)],
                               rtol=AGREE_RTOL))
    timing = paired_timing(left, right, args, rounds=rounds, budget_s=budget_s)
    low, high = timing.speedup_ci
    predicted = None
    if model is not None:
        cost_right = _model_cost(rhs, tensors, model, sizes)
        predicted = _model_cost(lhs, tensors, model, sizes) / cost_right if cost_right > 0 else None  # a free right side
    return InstanceTiming(inst, timing.base_s * 1e3, timing.other_s * 1e3, timing.speedup, low, high,
                          timing.rounds, agree, predicted)


def discover(rules: Sequence[Rule], graphs: Mapping[str, Graph], probe: bool = True, budget_s: float = 2.0,
             max_instances: int = 8, model: Any = None,
             progress: Callable[[str], None] | None = None) -> list[InstanceTiming]:
    """Time every instance of `rules` in `graphs` (and on the probe shapes), at most
    `max_instances` per rule (the largest first: where a rewrite has the most to gain)."""
    if not rules:
        raise DiscoveryError("no rules to measure")
    if not budget_s > 0 or max_instances < 1:
        raise DiscoveryError("the budget must be positive and max-instances at least 1")
    timeable = [r for r in rules if not any(t.op == "split_part" for p in r.lhs for t in subterms(p))]
    found: list[Instance] = []
    for where, graph in graphs.items():
        found.extend(graph_instances(timeable, graph, where))
    if probe:
        found.extend(probe_instances(timeable))
    results: list[InstanceTiming] = []
    for rule in timeable:
        mine = sorted((i for i in found if i.rule.name == rule.name), key=_size, reverse=True)[:max_instances]
        for inst in mine:
            if progress is not None:
                progress(f"{rule.name} at {inst.where} {inst.describe()}")
            results.append(time_instance(inst, budget_s, model=model))
    return results


def _size(inst: Instance) -> int:
    return sum(math.prod(s) for _, s in inst.shapes)


def _geomean(xs: Iterable[float]) -> float:
    logs = [math.log(x) for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def rule_summaries(timings: Sequence[InstanceTiming]) -> Iterator[dict[str, Any]]:
    """Per rule: instances timed, where it paid / lost, the geomean and the best instance with its interval."""
    by_rule: dict[str, list[InstanceTiming]] = {}
    for t in timings:
        by_rule.setdefault(t.instance.rule.name, []).append(t)
    for name, mine in by_rule.items():
        best = max(mine, key=lambda t: t.speedup)
        yield {"rule": name, "instances": len(mine), "paid": sum(t.verdict == "paid" for t in mine),
               "lost": sum(t.verdict == "lost" for t in mine), "wrong": sum(t.verdict == "wrong" for t in mine),
               "geomean_speedup": _geomean(t.speedup for t in mine), "best_speedup": best.speedup,
               "best_ci_low": best.speedup_low, "best_ci_high": best.speedup_high,
               "best_at": f"{best.instance.where} {best.instance.describe()}",
               "paid_at": [f"{t.instance.where} {t.instance.describe()}" for t in mine if t.verdict == "paid"],
               "instances_timed": [t.to_json() for t in mine]}

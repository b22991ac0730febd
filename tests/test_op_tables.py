"""Every registry op has an entry in every per-stage table, or a stated reason why not.

A new op in `eqsat/ops.py` that a stage does not know fails here with the table named, instead of
failing deep inside saturation, verification, lowering or capture on the first graph that uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from eqsat import ops
from eqsat.egglog_schema import ELEMENTWISE, ENCODED_AS, SHAPE_RULES
from eqsat.rewrites.semantics import OP_IMPLS
from jax_backend import capture
from jax_backend.lower import LOWERINGS
from jax_backend.measured_cost import FUSIBLE_OPS
from jax_backend.pallas import UNARY_CHAIN_OPS

_DISTRIBUTION = {op: "a distribution op (eqsat.distribution): made by parallelization rules, lowered by jax_backend.shard"
                 for op in ops.DISTRIBUTION_OPS}
_LEAVES = {op: "a leaf: an argument of every stage, not an operation" for op, s in ops.OPS.items() if s.is_leaf}


_X = np.ones((2, 3, 4, 4), np.float32)
_Y = np.ones((2, 3, 4, 4), np.float32)
_M = np.ones((4, 5), np.float32)
_K = np.ones((5, 3, 3, 3), np.float32)
_V = np.ones((4,), np.float32)
_I = np.arange(12, dtype=np.int32).reshape(3, 4)
Sample = tuple[Callable[..., Any], tuple[np.ndarray, ...]]

# One or more small programs per primitive of the capture table (`capture.CAPTURE_RULES`) that
# exercise its rule; a primitive with no sample says why in `_UNSAMPLED`.
CAPTURE_SAMPLES: Mapping[str, tuple[Sample, ...]] = {
    "add": ((lambda a, b: a + b, (_X, _Y)), (lambda a, b: a + b, (_I, _I))),
    "sub": ((lambda a, b: a - b, (_X, _Y)), (lambda a, b: a - b, (_I, _I))),
    "mul": ((lambda a, b: a * b, (_X, _Y)), (lambda a, b: a * b, (_I, _I))), "div": ((lambda a, b: a / b, (_X, _Y)),),
    "max": ((jnp.maximum, (_X, _Y)), (lambda a: jnp.maximum(a, 0.0), (_X,)), (jnp.maximum, (_I, _I))),
    "tanh": ((jnp.tanh, (_X,)),), "logistic": ((jax.nn.sigmoid, (_X,)),), "exp": ((jnp.exp, (_X,)),),
    "log": ((jnp.log, (_X,)),), "neg": ((jnp.negative, (_X,)),), "sqrt": ((jnp.sqrt, (_X,)),),
    "rsqrt": ((lax.rsqrt, (_X,)),), "integer_pow": ((lambda a: a ** 3, (_X,)),), "square": ((jnp.square, (_X,)),),
    "reduce_sum": ((lambda a: jnp.sum(a, axis=1), (_X,)),), "reduce_max": ((lambda a: jnp.max(a, axis=1), (_X,)),),
    "reshape": ((lambda a: a.reshape(6, 16), (_X,)),), "squeeze": ((lambda a: lax.squeeze(a, (0,)), (_X[:1],)),),
    "transpose": ((lambda a: jnp.transpose(a, (0, 2, 1, 3)), (_X,)),),
    "broadcast_in_dim": ((lambda a: jnp.broadcast_to(a, (3, 4)), (_V,)),),
    "concatenate": ((lambda a, b: jnp.concatenate([a, b], axis=1), (_X, _Y)),),
    "stack": ((lambda a, b: jnp.stack([a, b], axis=1), (_X, _Y)),),
    "slice": ((lambda a: lax.slice_in_dim(a, 1, 3, axis=1), (_X,)),),
    "split": ((lambda a: jnp.split(a, [1], axis=1), (_X,)),),
    "copy": ((lambda a: jnp.array(a, copy=True), (_X,)),),
    "dot_general": ((lambda a, b: a @ b, (_X, _M)),),
    "conv_general_dilated": ((lambda a, b: lax.conv(a, b, (1, 1), "SAME"), (_X, _K)),),
    "custom_jvp_call": ((jax.nn.relu, (_X,)),),
    "min": ((lambda a, b: jnp.minimum(a, b), (_I, _I)), (lambda a, b: jnp.minimum(a, b), (_X, _Y))),
    "abs": ((jnp.abs, (_X,)),), "sin": ((jnp.sin, (_X,)),), "cos": ((jnp.cos, (_X,)),),
    "erf": ((lax.erf, (_X,)),), "erfc": ((lambda a: jax.nn.gelu(a, approximate=False), (_X,)),),
    "one_minus_square": ((jax.grad(lambda a: jnp.sum(jnp.tanh(a))), (_X,)),),
    "pow": ((lambda a, b: a ** b, (_X, _Y)), (lambda a, b: a ** b[0, 0], (_X, _I))),
    "lt": ((lambda a, b: a < b, (_X, _Y)),), "le": ((lambda a, b: a <= b, (_X, _Y)),),
    "gt": ((lambda a, b: a > b, (_X, _Y)),), "ge": ((lambda a, b: a >= b, (_X, _Y)),),
    "eq": ((lambda a, b: a == b, (_I, _I)),), "ne": ((lambda a, b: a != b, (_X, _Y)),),
    "and": ((lambda a, b: (a > 0) & (b > 0), (_X, _Y)),), "or": ((lambda a, b: a | b, (_I, _I)),),
    "not": ((lambda a: ~(a > 0), (_X,)),),
    "select_n": ((lambda a, b: jnp.where(a > b, a, b), (_X, _Y)),),
    "iota": ((lambda a: a + lax.broadcasted_iota(jnp.int32, a.shape, 1), (_I,)),),
    "stop_gradient": ((lax.stop_gradient, (_X,)),),
    "convert_element_type": ((lambda a: a.astype(jnp.bfloat16), (_X,)),),
    "reduce_window_max": ((lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
                           (_X,)),),
    "reduce_window_sum": ((lambda a: lax.reduce_window(a, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4,
                           (_X,)),),
}
_UNSAMPLED = {
    "copy_p": "passes its input through, emits no op",
    "expand_dims": "lax.expand_dims binds broadcast_in_dim in this JAX; the rule emits reshape (sampled: squeeze)",
}


def _primitives(jaxpr: Any) -> set[str]:
    """Primitive names in a jaxpr and the jaxprs its equations call."""
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        found.add(str(eqn.primitive))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found |= _primitives(inner)
    return found


def _captured_ops() -> set[str]:
    """Registry ops (not leaves) the capture table emits: its rules run on `CAPTURE_SAMPLES`."""
    assert not set(CAPTURE_SAMPLES) & set(_UNSAMPLED)
    assert set(CAPTURE_SAMPLES) | set(_UNSAMPLED) == set(capture.CAPTURE_RULES), \
        "every capture rule needs a sample program in tests/test_op_tables.py (or a reason in _UNSAMPLED)"
    emitted: set[str] = set()
    for primitive, samples in CAPTURE_SAMPLES.items():
        for fn, args in samples:
            closed = jax.make_jaxpr(fn)(*args)
            assert primitive in _primitives(closed.jaxpr), f"the sample for {primitive} does not bind it"
            program = capture.capture_jaxpr(closed)
            assert not program.opaque, f"{primitive}: {[(s.name, s.why) for s in program.opaque]}"
            emitted |= {n.op for step in program.graphs for n in step.graph.nodes if not ops.OPS[n.op].is_leaf}
    return emitted


_MASK_OPS = {op: "mask and index math (integer / boolean values): the verifier reasons over the reals, and the rule "
                 "policy never trusts a rule that names one (eqsat.rulesets.dtype_scope)"
             for op in ("iota", "lt", "le", "gt", "ge", "eq", "ne", "select_n", "convert_element_type", "iadd", "isub",
                        "imul", "imax", "imin", "and", "or", "not", "stop_gradient")}

STAGES: Mapping[str, tuple[Callable[[], set[str]], Mapping[str, str]]] = {
    "SHAPE_RULES (egglog shape facts)": (lambda: set(SHAPE_RULES) | set(ENCODED_AS), {}),
    "OP_IMPLS (verifier semantics)": (lambda: set(OP_IMPLS), {
        **_LEAVES, **{op: why for op, why in _MASK_OPS.items() if op not in ("select_n", "stop_gradient", "convert_element_type")},
        "pow": "no rule uses a power; the verifier's algebra has none (a rule naming it: unknown)",
        "split": "rules write a split's pieces as split_0 / split_1, evaluated from the rule's sizes"}),
    "LOWERINGS (JAX lowering)": (lambda: set(LOWERINGS), _LEAVES),
    "CAPTURE_RULES (JAX capture)": (_captured_ops, {
        **_LEAVES, **_DISTRIBUTION,
        "smul": "JAX scales by a one-element tensor with mul: captured as ewmul",
        "batchnorm": "JAX programs write a batchnorm as its elementwise parts; rules fold them",
        "enlarge": "Tensat's kernel padding for conv merges: made by rules, never written in JAX",
        "merge_gconv": "TASO's grouped-conv kernel merge: made by rules, never written in JAX",
        "conv2d_nhwc": "made by the layout rules; capture writes every lax conv as conv2d between transposes"}),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_op_has_an_entry_or_a_stated_exclusion(stage: str) -> None:
    entries, excluded = STAGES[stage]
    have = entries()
    missing = sorted(op for op in ops.OPS if op not in have and op not in excluded)
    assert not missing, f"{stage}: no entry for {missing} (add one, or state why not in tests/test_op_tables.py)"
    stale = sorted(op for op in excluded if op in have or op not in ops.OPS)
    assert not stale, f"{stage}: exclusions {stale} are stale (the op has an entry now, or is gone)"


def test_op_facts_and_the_tables_built_from_them_agree() -> None:
    assert {op for op, s in ops.OPS.items() if s.elementwise} == ELEMENTWISE
    assert {op for op, s in ops.OPS.items() if s.fusible} == FUSIBLE_OPS
    assert set(UNARY_CHAIN_OPS) == {op for op, s in ops.OPS.items() if s.is_unary_elementwise}
    for name, spec in ops.OPS.items():
        assert not spec.elementwise or spec.fusible, f"{name}: elementwise ops fuse"
        assert not (spec.is_leaf and (spec.elementwise or spec.fusible)), name
        assert not spec.positive_domain or spec.is_unary_elementwise, name
        distributes = spec.distribution != "none"
        assert (spec.collectives is not None) == distributes, f"{name}: a distribution op names its collectives"
        assert not spec.aliases or distributes, name
        assert not (distributes and spec.on_devices), f"{name}: distribution ops set device axes, they run on none"
        assert not spec.grad_reads or spec.is_unary_elementwise, name
        assert not spec.contraction or spec.on_devices is not None, f"{name}: contractions run on pieces"


def test_parallel_name_sets_keep_their_membership() -> None:
    """The parallel tables derived from the registry hold what the hand-written sets held."""
    from eqsat.parallel import cost, memory
    from eqsat.parallel import planner as plan
    from jax_backend import shard

    distribution = {"partition", "replicate", "combine", "reduce", "all_reduce", "all_gather", "reduce_scatter",
                    "all_to_all"}
    expected: dict[str, object] = {
        "plan.ENTER": {"partition", "replicate"},
        "plan.LEAVE": {"combine", "reduce"},
        "plan.KEEP": {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"},
        "plan.CONTRACTIONS": {"matmul", "conv2d"},
        "plan.DISTRIBUTABLE": {"matmul", "conv2d", "relu", "tanh", "sigmoid", "exp", "ewadd", "ewmul", "ewsub", "ewdiv",
                               "transpose", "broadcast", "reduce_sum", "reduce_max",
                               # every float elementwise op (`ops._unary`, `ops._binary`)
                               "abs", "cos", "erf", "erfc", "ewmax", "ewmin", "log", "neg", "pow", "rsqrt", "sin",
                               "sqrt",
                               # a batch split through reshape (leading dims kept), the causal mask, softmax
                               "reshape", "select_n", "stop_gradient",
                               "slice", "concat",  # a split of another dim through split / concat
                               "poolavg", "poolmax"},  # pools run on device stacks, as conv2d does
        "ops.DISTRIBUTION_OPS": distribution,  # memory.MOVERS
        "memory.ELEMENTWISE_SAVE_OUTPUT": {"tanh", "sigmoid", "exp"},
        "memory.ELEMENTWISE_SAVE_INPUT": {"relu"},
        "memory.GRADIENT_SYNC": {"replicate", "partition"},
        "memory.ALIASES": {"replicate", "reduce"},
        "memory.KEPT_OUTPUTS": {"matmul", "conv2d", "combine", "all_gather", "all_reduce", "reduce_scatter", "all_to_all"},
        "shard.DISTRIBUTION_OPS": distribution,
        "cost.COLLECTIVES": {
            "partition": (None, "all-reduce", "in"),
            "replicate": (None, "all-reduce", "in"),
            "combine": ("all-gather", None, "out"),
            "all_gather": ("all-gather", "reduce-scatter", "out"),
            "reduce": ("all-reduce", None, "out"),
            "all_reduce": ("all-reduce", "all-reduce", "out"),
            "reduce_scatter": ("reduce-scatter", "all-gather", "in"),
            "all_to_all": ("all-to-all", "all-to-all", "in"),
        },
    }
    derived: dict[str, object] = {
        "plan.ENTER": set(plan.ENTER), "plan.LEAVE": set(plan.LEAVE), "plan.KEEP": set(plan.KEEP),
        "plan.CONTRACTIONS": set(plan.CONTRACTIONS), "plan.DISTRIBUTABLE": set(plan.DISTRIBUTABLE),
        "ops.DISTRIBUTION_OPS": set(ops.DISTRIBUTION_OPS),
        "memory.ELEMENTWISE_SAVE_OUTPUT": set(memory.ELEMENTWISE_SAVE_OUTPUT),
        "memory.ELEMENTWISE_SAVE_INPUT": set(memory.ELEMENTWISE_SAVE_INPUT),
        "memory.GRADIENT_SYNC": set(memory.GRADIENT_SYNC), "memory.ALIASES": set(memory.ALIASES),
        "memory.KEPT_OUTPUTS": set(memory.KEPT_OUTPUTS), "shard.DISTRIBUTION_OPS": set(shard.DISTRIBUTION_OPS),
        "cost.COLLECTIVES": dict(cost.COLLECTIVES),
    }
    for name, want in expected.items():
        assert derived[name] == want, name


@pytest.mark.parametrize(("op", "attrs", "k", "runs"), [
    ("matmul", {"act": 0}, 2, True),
    ("ewadd", {}, 1, True),
    ("transpose", {"perm": (0, 2, 1)}, 1, True),
    ("transpose", {"perm": (1, 0, 2)}, 1, False),
    ("broadcast", {"shape": (2, 3, 4), "dims": (0, 1)}, 1, True),
    ("broadcast", {"shape": (2, 3, 4), "dims": (1, 2)}, 1, False),
    ("reduce_sum", {"axes": (1,)}, 1, True),
    ("reduce_sum", {"axes": (0,)}, 1, False),
    ("reduce_max", {"axes": ()}, 1, True),
    ("reduce_max", {"axes": (2, 3)}, 2, True),
    ("reduce_max", {"axes": (1, 2)}, 2, False),
    ("reshape", {"shape": (4, 8, 16)}, 1, True),  # the device axis kept in front (the rules build it so)
    ("reshape", {"shape": (4,)}, 1, False),  # no dim left for the piece
    ("slice", {"axis": 3, "start": 0, "stop": 2}, 1, True),
    ("slice", {"axis": 0, "start": 0, "stop": 2}, 1, False),  # a slice of the device axis
    ("concat", {"axis": 2}, 2, True),
    ("concat", {"axis": 1}, 2, False),
])
def test_distributable_predicates(op: str, attrs: dict[str, object], k: int, runs: bool) -> None:
    from eqsat.parallel import planner as plan

    assert plan.DISTRIBUTABLE[op](attrs, k) is runs

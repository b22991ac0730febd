"""`@eqsat.optimize` on bfloat16 matmuls: the precision rule fires on the captured program, a
dtype-aware cost model extracts the float32 product, and the decorator uses it with outputs that
agree with `jax.jit`'s in the same dtype (issue 25: bf16 MLP captured, rules fire, numerics equal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
import eqsat.cost
from eqsat import ops
from eqsat.compare import outputs_agree


@dataclass(frozen=True)
class _SlowLowPrecision:
    """Flops, a bfloat16 matmul three times dearer than a float32 one (as XLA:CPU runs them),
    conversions nearly free (fused into their neighbours)."""

    device: str = "cpu"
    name: str = "slow-low-precision"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        return 1e-9 + ops.flops(op, [tuple(s) for s in input_shapes], attrs) * 1e-11

    def op_cost_typed(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]],
                      input_dtypes: Sequence[str]) -> float:
        if op == "convert_element_type":
            return 1e-12
        base = self.op_cost(op, attrs, input_shapes)
        return 3 * base if op == "matmul" and input_dtypes[0] == "bfloat16" else base


def _mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def _args(dtype: Any) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), dtype) for s in ((32, 64), (64, 64), (64, 16)))


@pytest.fixture
def slow_bf16_model(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(eqsat.cost._FACTORIES, "slow-low-precision", lambda device, **_: _SlowLowPrecision(device))
    return "slow-low-precision"


def test_a_bf16_mlp_runs_its_products_in_float32_and_agrees(slow_bf16_model: str) -> None:
    args = _args(jnp.bfloat16)
    f = eqsat.optimize(_mlp, cost_model=slow_bf16_model, check_speed=False)
    got, report = f(*args), f.report(*args)
    assert not report.opaque
    assert any(r.startswith("matmul-bf16-via-f32×2") for s in report.segments for r in s.rules_fired), report.segments
    assert report.used == "optimized", report.reason
    after = report.segments[0].after
    assert after.op_counts().get("convert_element_type", 0) >= 4  # operands up, products back
    assert sorted(after.dtype(v) for n in after.nodes if n.op == "matmul" for v in n.inputs) == ["float32"] * 4
    want = jax.jit(_mlp)(*args)
    assert got.dtype == jnp.bfloat16
    assert outputs_agree([np.asarray(want)], [np.asarray(got)], rtol=2e-4, same_dtype=True).ok


def test_float32_programs_are_left_alone(slow_bf16_model: str) -> None:
    args = _args(jnp.float32)
    report = eqsat.optimize(_mlp, cost_model=slow_bf16_model, check_speed=False).report(*args)
    assert not any("bf16" in r for s in report.segments for r in s.rules_fired)
    assert "convert_element_type" not in report.segments[0].after.op_counts()


def test_rule_discovery_times_the_bf16_rule_on_bf16_values_only() -> None:
    from eqsat.ir import GraphBuilder
    from eqsat.rewrites import library_rules
    from jax_backend.rule_discovery import graph_instances, probe_instances, time_instance

    rule = [r for r in library_rules(["precision"]) if r.name == "matmul-bf16-via-f32"]

    def graph(dtype: str) -> Any:
        b = GraphBuilder()
        return b.build([b.matmul(b.input("x", (32, 64), dtype), b.weight("w", (64, 48), dtype))])

    assert graph_instances(rule, graph("float32"), "f32") == [] and probe_instances(rule) == []
    (inst,) = graph_instances(rule, graph("bfloat16"), "bf16")
    timed = time_instance(inst, budget_s=0.2, rounds=8)
    assert timed.agree and timed.rounds >= 1


def test_the_measured_model_times_low_precision_operands_apart(tmp_path: Any) -> None:
    from jax_backend.measured_cost import MeasuredModel

    model = MeasuredModel(cache_dir=tmp_path, repeats=1, warmup=1)
    assert model.op_cost_typed("ewadd", {}, [(4, 4), (4, 4)], ["bfloat16", "bfloat16"]) > 0
    model.op_cost_typed("select_n", {}, [(4, 4)] * 3, ["bool", "float32", "float32"])  # a mask: priced as before
    keys = set(model._table)
    assert "ewadd||4x4;4x4|bfloat16,bfloat16" in keys
    assert [k for k in keys if k.startswith("select_n|")] == ["select_n||4x4;4x4;4x4"]

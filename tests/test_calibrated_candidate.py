"""`eqsat optimize`'s "calibrated" candidate: the ILP under the xla model of the device at hand,
timed beside the other plans where a calibration is cached, skipped (no error, nothing measured)
where none is or where the run prices another device."""

from __future__ import annotations

from dataclasses import replace

from eqsat.commands.optimize import CALIBRATED, DEFAULT_CANDIDATES, OptimizeOptions, calibrated_model, optimize_and_judge
from eqsat.cost import _machine_key, cost_model
from eqsat.ir import Graph, GraphBuilder
from eqsat.rulesets import XLA_GROUPS
from eqsat.rewrites import library_rules
from eqsat.saturate import Limits
from eqsat.xla_cost import Calibration, Curve, write_calibration
from jax_backend.calibrate import calibration_path
from jax_backend.measured_cost import device_key

LIMITS = Limits(nodes=1_000, seconds=10)


def _two_products() -> Graph:
    b = GraphBuilder()
    v = b.input("v", (64, 64))
    return b.build([b.matmul(v, b.weight("u1", (64, 64))), b.matmul(v, b.weight("u2", (64, 64)))])


def _cache_a_calibration() -> None:
    cal = Calibration("m", "d", launch_s=5e-6, bandwidth=10e9, loop_flops=5e9,
                      matmul=Curve((1e3, 1e6, 1e9), (1e-5, 5e-5, 2e-2)), conv=Curve((1e3, 1e9), (2e-5, 3e-2)))
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_calibration(path, replace(cal, machine=_machine_key(), device=device_key()))


def test_calibrated_is_a_default_candidate() -> None:
    assert CALIBRATED in DEFAULT_CANDIDATES and OptimizeOptions().candidates == DEFAULT_CANDIDATES


def test_without_a_cached_calibration_the_candidate_is_skipped(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    roofline = cost_model("roofline", device="cpu")
    assert calibrated_model(roofline) is None
    judged = optimize_and_judge(_two_products(), [], LIMITS, roofline, candidates=(CALIBRATED,), rounds=5, budget_s=0.0)
    assert [name for name, _ in judged.plans] == ["ilp/roofline"]
    assert not (tmp_path / "xla").exists()  # nothing was measured inside the optimizer


def test_with_a_cached_calibration_the_xla_plan_is_judged(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    _cache_a_calibration()
    roofline = cost_model("roofline", device="cpu")
    model = calibrated_model(roofline)
    assert model is not None and model.name == "xla"
    assert calibrated_model(model) is None  # the run's own model already
    assert calibrated_model(cost_model("roofline", device="h100")) is None  # not the device JAX runs on
    rules = [r for r in library_rules(XLA_GROUPS) if r.name == "matmul-merge-right"]
    judged = optimize_and_judge(_two_products(), rules, LIMITS, roofline, candidates=(CALIBRATED,), rounds=5,
                                budget_s=0.0)
    assert [name for name, _ in judged.plans] == ["ilp/roofline", "ilp/xla"]
    assert all(check.numerics_ok for check in judged.judgement.checks)  # run through JAX against the original

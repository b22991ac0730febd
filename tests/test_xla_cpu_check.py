"""`experiments.xla_cpu_check`: plans counted by the program they lower to, and Spearman undefined
below three distinct plans (never a number made up from noise between identical programs)."""

from __future__ import annotations

import math
from pathlib import Path

from eqsat.ir import Graph, GraphBuilder
from eqsat.xla_cost import Calibration, Curve
from experiments.xla_cpu_check import model_rows

CAL = Calibration("machine-a", "cpu-test", launch_s=5e-6, bandwidth=10e9, loop_flops=5e9,
                  matmul=Curve((1e3, 1e6, 1e9), (1e-5, 5e-5, 2e-2)), conv=Curve((1e3, 1e9), (2e-5, 3e-2)))


def _plan(fused: bool = False, cout: int = 16) -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (1, 8, 12, 12)), b.weight("w", (cout, 8, 3, 3))
    y = b.conv2d(x, w, act=2) if fused else b.relu(b.conv2d(x, w))
    return b.build([b.tanh(y)])


def _row(names: list[tuple[str, float]]) -> dict[str, object]:
    return {"model": "m", "candidates": [{"name": n, "measured_speedup": s, "measured_speedup_ci": [s - 0.1, s + 0.1]}
                                          for n, s in names]}


def test_plans_of_one_program_are_one_plan_and_spearman_needs_three(tmp_path: Path) -> None:
    _plan().save(tmp_path / "m.before.json")
    _plan(fused=True).save(tmp_path / "m.candidate.ilp-xla.json")  # the original program
    _plan(cout=24).save(tmp_path / "m.candidate.greedy-dag.json")
    (row,) = model_rows(CAL, tmp_path, [_row([("ilp/xla", 1.07), ("greedy-dag", 0.9)])])
    assert row["plans"] == 2 and math.isnan(row["spearman"])
    assert row["ilp"]["original_program"] and row["ilp"]["measured"] == 1.0 and row["ilp"]["points_off"] == 0.0
    _plan(cout=32).save(tmp_path / "m.candidate.ilp-merge.json")
    (row,) = model_rows(CAL, tmp_path, [_row([("ilp/xla", 1.07), ("greedy-dag", 0.9), ("ilp/merge", 0.8)])])
    assert row["plans"] == 3 and row["spearman"] == 1.0  # more work predicted and measured slower

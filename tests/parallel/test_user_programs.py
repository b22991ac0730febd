"""The MoE user program (experiments/parallel_user_programs.py: top-k token dispatch into stacked
experts, optax Adam) builds, captures to plannable graphs, and planned on a mesh gives the
single-device step's losses; `eqsat bench parallel --user-programs` refuses a bad name in one line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

pytest.importorskip("optax")
needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")


def small_moe() -> tuple[Any, tuple[Any, ...]]:
    from experiments.parallel_user_programs import moe_problem

    return moe_problem(batch=8, seq=8, d=16, hidden=32, experts=4, classes=8)


def test_moe_program_builds_routes_and_captures() -> None:
    """Its pieces: params stacked (E, d, h), a finite loss that Adam lowers, top-k in the jaxpr,
    and the whole step captures to graphs with outputs (top_k an opaque boundary)."""
    from jax_backend.capture import capture

    step, (params, opt_state, batch) = small_moe()
    assert params["w_in"].shape == (4, 16, 32) and params["w_out"].shape == (4, 32, 16)
    assert "top_k" in str(jax.make_jaxpr(step)(params, opt_state, batch))
    jitted = jax.jit(step)
    p, s, loss = jitted(params, opt_state, batch)
    _, _, loss2 = jitted(p, s, batch)
    assert np.isfinite(float(loss)) and float(loss2) < float(loss)
    flat, treedef = jax.tree_util.tree_flatten((params, opt_state, batch))
    program, _ = capture(lambda *xs: step(*jax.tree_util.tree_unflatten(treedef, xs)), *flat)
    assert program.graphs and all(g.graph.outputs for g in program.graphs)


def test_bench_user_programs_flag_parses_and_refuses_bad_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from eqsat import cli
    from eqsat.commands import bench
    from experiments.benchmarks import BENCHMARKS

    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)
    parser = argparse.ArgumentParser(prog="eqsat bench")
    bench.add_arguments(parser)
    args = parser.parse_args(["parallel", "--user-programs", "mlp", "gpt", "moe", "--meshes", "8", "2x4"])
    assert args.user_programs == ["mlp", "gpt", "moe"] and args.meshes == ["8", "2x4"]
    for bad, said in ((["--user-programs", "moe", "resnet"], "unknown user program(s) resnet"),
                      (["--user-programs", "moe", "--meshes", "2y4"], "mesh '2y4' is not a shape")):
        assert cli.main(["bench", "parallel", "--out", str(tmp_path / "out"), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err


def test_bench_user_programs_writes_the_summary_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from experiments import bench_parallel, parallel_user_programs

    def fake_run(program: str, mesh: str, time_limit: float = 60.0) -> dict[str, Any]:
        return {"program": program, "mesh": mesh, "plan_ms": 1.0, "dp_ms": 2.0, "same_as_single_device": True}

    monkeypatch.setattr(parallel_user_programs, "run", fake_run)
    rows = bench_parallel.run_user_programs(tmp_path, ["moe", "mlp"], ["8", "2x4"])
    assert [(r["program"], r["mesh"]) for r in rows] == [("moe", "8"), ("moe", "2x4"), ("mlp", "8"), ("mlp", "2x4")]
    assert set(rows[0]) == set(parallel_user_programs.SUMMARY_COLUMNS)
    assert len((tmp_path / "parallel_user.md").read_text().splitlines()) == 2 + 4
    assert len((tmp_path / "parallel_user.jsonl").read_text().splitlines()) == 4


@needs8
@pytest.mark.slow
def test_moe_step_planned_on_2x4_equals_single_device() -> None:
    import eqsat.parallel as ep
    from experiments.parallel_user_programs import same_as_single_device

    step, args = small_moe()
    plan = ep.plan(step, *args, mesh=jax.make_mesh((2, 4), ("data", "model")), params_argnums=(0, 1),
                   time_limit=20, baselines=False, within=None)  # the planner's own plan, not judged against DP's
    assert plan.report.strategy == "eqsat", plan.report.warnings
    found = same_as_single_device(plan, step, args)
    assert found["same_as_single_device"] and found["loss_rel_diff"] <= 1e-4, found

"""`eqsat bench parallel` writes its table and plots (the planning itself is tested elsewhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from experiments import bench_parallel


def test_bench_writes_table_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_case(model: str, mesh: str, time_limit: float, random: int = 0) -> dict[str, Any]:
        return {"model": model, "mesh": mesh, "predicted_s": 1e-3, "data_parallel_s": 2e-3, "megatron_s": 1e-3,
                "algebra_first_s": 1.5e-3, "predicted_comm_bytes": 100.0, "measured_comm_bytes": 100.0,
                "predicted_step_comm_bytes": 300.0, "measured_step_comm_bytes": 290.0, "numerics_ok": True,
                "megatron_measured_step_comm_bytes": 100.0, "joint_dominates_all": True,
                "joint_at_megatron_bytes": {"predicted_s": 1e-3, "predicted_step_comm_bytes": 100.0,
                                            "measured_step_comm_bytes": 100.0}}

    monkeypatch.setattr(bench_parallel, "run_case", fake_case)
    rows = bench_parallel.run_bench(tmp_path, models=["unity-mlp", "dlrm"], meshes=["8", "2x4"])
    assert [(r["model"], r["mesh"]) for r in rows] == [("unity-mlp", "8"), ("unity-mlp", "2x4"), ("dlrm", "8"), ("dlrm", "2x4")]
    for name in ("parallel.jsonl", "parallel.md", "parallel_step.png", "parallel_comm.png", "parallel_pareto.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert len((tmp_path / "parallel.md").read_text().splitlines()) == 2 + 4


def test_unknown_case_is_refused(tmp_path: Path) -> None:
    """`--models` with a case that does not exist fails at once with one clear error."""
    from eqsat.errors import EqsatError

    with pytest.raises(EqsatError, match="unknown case"):
        bench_parallel.run_bench(tmp_path / "out", models=["unity-mlp", "resnet"])
    assert not (tmp_path / "out").exists()


def test_every_case_is_a_model() -> None:
    from eqsat.models.parallel_cases import PARALLEL_MODELS

    assert set(bench_parallel.CASES) == set(PARALLEL_MODELS)

"""`eqsat optimize` end to end on a small model, its timing and numerics helpers, and the `bench`
dispatcher's handling of names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eqsat import cli
from eqsat.ir import Graph
from eqsat.saturate import STOP_REASONS
from eqsat.models import build_model
from jax_backend.checks import compare_outputs, measure_pair, time_interleaved

FIELDS = ("model", "enodes", "eclasses", "saturate_s", "extract_s", "cost_before", "cost_after",
          "measured_before_s", "measured_after_s", "numerics_ok", "stop_reason", "measured_speedup",
          "measured_speedup_ci", "predicted_speedup", "kept", "candidates", "passes")


def test_time_interleaved_runs_round_robin_and_returns_medians() -> None:
    from jax_backend.timing import MAX_CALLS_PER_SAMPLE

    calls: list[str] = []
    medians = time_interleaved([lambda: calls.append("a"), lambda: calls.append("b")], repeats=4, warmup=1)
    # warm-up and one sizing call each, then 4 rounds (ab, ba, ba, ab) of samples of `per` calls
    per = (len(calls) - 4) // 8
    assert 1 <= per <= MAX_CALLS_PER_SAMPLE
    rounds = ["a", "b", "b", "a", "b", "a", "a", "b"]
    assert calls == ["a", "b"] * 2 + [name for name in rounds for _ in range(per)]
    assert len(medians) == 2 and all(m >= 0 for m in medians)


def test_compare_outputs_rejects_shape_changes_and_nans() -> None:
    a = [np.ones((2, 3), np.float32)]
    assert compare_outputs(a, [a[0] + 1e-7], 1e-5, 1e-6)
    assert not compare_outputs(a, [np.ones((3, 2), np.float32)], 1e-5, 1e-6)
    assert not compare_outputs(a, [np.full((2, 3), np.nan, np.float32)], 1e-5, 1e-6)
    assert not compare_outputs(a, a + a, 1e-5, 1e-6)


def test_measure_pair_catches_a_wrong_graph() -> None:
    from eqsat.ir import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", (4, 4))
    right, wrong = b.build([b.relu(x)]), b.build([b.tanh(x)])
    inputs = right.random_inputs(0)
    assert measure_pair(right, right, inputs, repeats=1, rtol=1e-5, atol=1e-6).numerics_ok
    assert not measure_pair(right, wrong, inputs, repeats=1, rtol=1e-5, atol=1e-6).numerics_ok


def _run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_optimize_small_nasrnn_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _run_cli(["optimize", "nasrnn-small", "--json", "--repeats", "5", "--iterations", "5",
                                "--time-limit", "20", "--timing-budget", "2", "--device", "cpu-nominal", "--save-graphs",
                                str(tmp_path)], capsys)
    assert code == 0, err
    (row,) = rows
    assert all(field in row for field in FIELDS)
    assert row["model"] == "nasrnn-small" and row["numerics_ok"] is True
    assert row["stop_reason"] in STOP_REASONS
    assert 0 < row["enodes"] <= 50_000 and row["eclasses"] <= row["enodes"]
    assert row["cost_after"] <= row["cost_before"]
    assert row["measured_before_s"] > 0 and row["measured_after_s"] > 0
    low, high = row["measured_speedup_ci"]
    assert low <= row["measured_speedup"] <= high and row["kept"] in ("optimized", "original")
    before, after = Graph.load(tmp_path / "nasrnn-small.before.json"), Graph.load(tmp_path / "nasrnn-small.after.json")
    assert before == build_model("nasrnn-small")
    inputs = before.random_inputs(5)
    np.testing.assert_allclose(after.evaluate(inputs)[0], before.evaluate(inputs)[0], rtol=1e-4, atol=1e-5)


def test_optimize_unknown_model_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _run_cli(["optimize", "no-such-model", "--json"], capsys)
    assert code == 2 and rows == []
    assert "unknown model 'no-such-model'; known models: nasrnn" in err


def test_bench_unknown_name_is_a_clear_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.commands import bench
    from experiments.benchmarks import BENCHMARKS

    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)  # whatever the installed metadata says
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "nope", "--json"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in err and "extraction" in err


def test_bench_without_registered_benchmarks_says_so_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.commands import bench

    monkeypatch.setattr(bench, "registered", lambda: {})  # metadata older than the entry points
    code, _, err = _run_cli(["bench", "lns", "--json"], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and "reinstall" in err

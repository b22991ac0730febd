"""`eqsat bench jax --groups heldout`: the held-out programs build and equal `jax.jit` as written,
each row and the group's summary carry the fields the issue asks for, and the flag parses."""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqsat.commands import bench
from experiments.bench_jax import _cache_dir, _heldout_summary, bench_heldout, heldout_control
from experiments.benchmarks import BENCHMARKS
from experiments.jax_heldout import HELDOUT_NAMES, HeldOut, heldout_program, heldout_programs

ROW_FIELDS = {"program", "used", "kept", "speedup", "speedup_ci_low", "speedup_ci_high", "first_call_cold_s",
              "jit_first_call_s", "new_shape_warm_s", "jit_new_shape_s", "new_shape_search_reused", "outputs_ok", "grads_ok"}
SUMMARY_FIELDS = {"speedup", "speedup_ci_low", "speedup_ci_high", "kept", "kept_with_interval_above_1",
                  "first_call_cold_median_s", "new_shape_warm_median_s", "targets_met"}


def test_heldout_group_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)
    parser = argparse.ArgumentParser(prog="eqsat bench")
    bench.add_arguments(parser)
    assert parser.parse_args(["jax", "--groups", "heldout"]).groups == ["heldout"]


@pytest.mark.slow  # imports Flax, Equinox and optax and initializes nine models
def test_heldout_programs_are_distinct_and_run_at_both_shapes() -> None:
    progs = heldout_programs()
    assert len({p.name for p in progs}) == len(progs) >= 9
    assert [p.name for p in progs] == list(HELDOUT_NAMES)  # the names known without building
    shapes = {p.name: jax.eval_shape(p.fn, *p.make_args(0, p.new_batch)) for p in progs}
    assert all(jax.tree_util.tree_leaves(s) for s in shapes.values())


def _row(name: str, speedup: float, kept: bool, cold: float, warm: float) -> dict[str, Any]:
    return {"program": name, "speedup": speedup, "speedup_ci_low": speedup - 0.02, "speedup_ci_high": speedup + 0.02,
            "kept": kept, "first_call_cold_s": cold, "new_shape_warm_s": warm, "jit_first_call_s": 1.0,
            "jit_new_shape_s": 0.5, "outputs_ok": True, "grads_ok": None}


def test_heldout_summary_has_geomean_kept_count_and_first_call_medians() -> None:
    summary = _heldout_summary([_row("a", 1.10, True, 2.0, 0.5), _row("b", 1.0, False, 8.0, 3.0),
                                _row("c", 0.99, False, 4.0, 0.7)])
    assert summary is not None and set(summary) >= SUMMARY_FIELDS
    assert summary["speedup"] == pytest.approx((1.10 * 1.0 * 0.99) ** (1 / 3))
    assert summary["kept"] == 1 and summary["kept_with_interval_above_1"] == 1
    assert summary["first_call_cold_median_s"] == 4.0 and summary["new_shape_warm_median_s"] == 0.7
    assert summary["targets_met"]["cold_median<=5s"] and summary["targets_met"]["new_shape_warm<=1s"]
    assert not summary["targets_met"]["kept>=3"] and _heldout_summary([]) is None


@pytest.mark.slow
def test_a_heldout_row_has_every_field_and_equal_numerics() -> None:
    w = jnp.asarray(np.random.default_rng(0).standard_normal((32, 32)) / 6, jnp.float32)
    tiny = HeldOut("tiny_mlp", lambda w, x: jnp.tanh(x @ w) @ w,
                   lambda s, b: (w, jnp.asarray(np.random.default_rng(s).standard_normal((b, 32)), jnp.float32)), 8, 12)
    row = bench_heldout(tiny, rounds=6, options={"time_limit": 1.0, "timing_budget": 0.5}, budget_s=0.5)
    assert set(row) >= ROW_FIELDS and row["outputs_ok"] and row["grads_ok"]
    assert row["new_shape_search_reused"] or row["new_shape_reason"]


def test_a_fresh_bench_cache_shares_the_calibration_across_programs(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Any) -> None:
    """Each held-out program's fresh cache starts from the bench's calibrations (the roofline's CPU
    spec, the xla model's) and hands back what it measured: one calibration for the run."""
    from eqsat.paths import cache_dir

    home, fresh1, fresh2 = tmp_path / "home", tmp_path / "one", tmp_path / "two"
    (home / "xla").mkdir(parents=True)
    (home / "xla" / "cpu-x.json").write_text("{}")
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(home))
    with _cache_dir(str(fresh1)):
        assert cache_dir() == fresh1 and (fresh1 / "xla" / "cpu-x.json").is_file()
        (fresh1 / "cpu-abc.json").write_text('{"measured": 1}')  # the first program calibrates
        (fresh1 / "decisions").mkdir()
    assert cache_dir() == home and (home / "cpu-abc.json").read_text() == '{"measured": 1}'
    assert not (home / "decisions").exists()  # decisions stay per program (cold)
    with _cache_dir(str(fresh2)):
        assert (fresh2 / "cpu-abc.json").is_file()  # the next program reads it, measures nothing


@pytest.mark.slow
def test_the_heldout_control_times_identical_code_until_its_interval_is_narrow() -> None:
    w = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)) / 8, jnp.float32)
    tiny = HeldOut("tiny_mlp", lambda w, x: jnp.tanh(x @ w) @ w,
                   lambda s, b: (w, jnp.asarray(np.random.default_rng(s).standard_normal((b, 64)), jnp.float32)), 64, 96)
    row = heldout_control(tiny, rounds=400, budget_s=60.0, ci_width=0.05)  # 400 rounds: ~4 s, far within the budget
    assert row["group"] == "heldout_control" and row["program"] == "control_identical_tiny_mlp"
    assert row["speedup_ci_low"] <= row["speedup_ci_high"] and row["rounds"] >= 20
    assert row["ci_width"] <= 0.05 or row["rounds"] == 400  # stopped once narrow, else ran to the rounds cap


def test_a_heldout_program_builds_alone_under_its_name() -> None:
    """`heldout_fresh` knows the names without building the nine programs (the slow test above checks
    every name against its built program); one program builds alone under its own name."""
    assert len(HELDOUT_NAMES) >= 9 and heldout_program("bf16_mlp").name == "bf16_mlp"


def test_heldout_fresh_refuses_an_unknown_program(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.heldout_fresh import main

    assert main(["no_such_program"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("heldout_fresh: error: unknown program") and "\n" not in err

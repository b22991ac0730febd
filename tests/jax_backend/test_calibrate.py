"""The xla cost model's JAX half (jax_backend/calibrate.py, `eqsat calibrate`): the factory never
measures inside an optimizer's clock, a damaged or foreign cache is re-measured, a GPU name on a CPU
host is refused, and the commands refuse bad flags in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from engine_free import BLOCK_SEARCH_ENGINES

from eqsat import cli
from eqsat.cost import cost_model
from eqsat.errors import EqsatError
from eqsat.xla_cost import (CALIBRATION_FORMAT, Calibration, CalibrationError, Curve, Surface, XlaModel,
                             write_calibration)
from jax_backend import calibrate as cal_mod
from jax_backend.calibration_check import spearman


def _fake(machine: str | None = None) -> Calibration:
    from eqsat.cost import _machine_key
    from jax_backend.measured_cost import device_key

    return Calibration(machine or _machine_key(), device_key(), 2e-6, 2e10, 2e9, Curve((1e3, 1e9), (1e-5, 2e-2)),
                       Curve((1e3, 1e9), (2e-5, 3e-2)), 0.5)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    measured: list[int] = []
    monkeypatch.setattr(cal_mod, "calibrate", lambda say=None: measured.append(1) or _fake())
    return tmp_path


def test_without_a_calibration_the_model_says_to_run_eqsat_calibrate(cache: Path) -> None:
    with pytest.raises(CalibrationError, match="run `eqsat calibrate`"):
        cost_model("xla", "cpu")
    assert not cal_mod.calibration_path().exists()  # nothing measured behind the caller's back


def test_a_cached_calibration_is_used(cache: Path) -> None:
    write_calibration(cal_mod.calibration_path(), _fake())
    model = cost_model("xla", "cpu")
    assert isinstance(model, XlaModel) and model.calibration == _fake()


@pytest.mark.parametrize("content", ["{broken", None])
def test_a_damaged_or_foreign_cache_is_measured_again_with_a_warning(
        cache: Path, content: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    path = cal_mod.calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if content is not None else json.dumps(_fake("another-machine").to_json()))
    cal, status = cal_mod.load_calibration()
    assert status.startswith("re-measured") and cal == _fake()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0]
    assert cal_mod.load_calibration()[1] == "cached"  # the fresh one replaced it


def test_a_gpu_name_on_a_cpu_host_is_refused(cache: Path) -> None:
    write_calibration(cal_mod.calibration_path(), _fake())
    with pytest.raises(EqsatError, match="xla/h100"):
        cost_model("xla", "h100")
    with pytest.raises(EqsatError, match="measured/h100"):
        cost_model("measured", "h100")


@pytest.mark.parametrize("argv", [
    ["optimize", "nasrnn", "--conventions", "taso", "--json"],
    ["optimize", "nasrnn", "--rules", "everything", "--json"],
    ["calibrate", "--device", "h100", "--json"],
    ["calibrate", "--check", "no-such-model", "--json"],
])
def test_bad_flags_are_one_error_line(argv: list[str], cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "error" in err


def test_calibrate_reports_what_it_fitted(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["calibrate", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["status"] == "measured" and row["launch_us"] == pytest.approx(2.0)
    assert set(row["matmul_gflops"]) == {"1e+03", "1e+09"} and row["conv1x1_gflops"] is None


def _reported(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, **fields: Any) -> dict[str, Any]:
    """The `calibrate --json` row of a fake calibration with `fields` replaced."""
    monkeypatch.setattr(cal_mod, "calibrate", lambda say=None: replace(_fake(), **fields))
    assert cli.main(["calibrate", "--json"]) == 0
    row: dict[str, Any] = json.loads(capsys.readouterr().out)
    return row


def test_calibrate_reports_the_1x1_surface(cache: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    surface = Surface((64.0, 1225.0), (6.5e4, 1.6e6), (1e-3, 2e-2, 1e-2, 4e-1))
    rates = _reported(capsys, monkeypatch, conv1x1=surface)["conv1x1_gflops"]
    assert rates["64 rows x 6.5e+04"] == pytest.approx(2 * 64 * 6.5e4 / 1e-3 / 1e9)
    assert len(rates) == 4


def test_calibrate_reports_the_matrix_vector_grid(cache: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    grid = Surface((512.0, 1024.0), (512.0, 1024.0), (3e-4, 4e-4, 5e-4, 9e-4))
    rates = _reported(capsys, monkeypatch, gemv_kn=grid)["gemv_gbs"]
    assert rates["1x512x1024"] == pytest.approx(4 * (512 + 512 * 1024 + 1024) / 4e-4 / 1e9) and len(rates) == 4


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 2], [1, 2]) != spearman([1, 2], [1, 2])  # NaN: too few points


@pytest.mark.slow
def test_calibration_measures_this_cpu_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    cal = cal_mod.calibrate()
    # precision-stopped probes (format 8 on): 84-97 s on a quiet 2-core box, docs/tensat.md; the
    # budget the docs give it is about 2 minutes, with room for a loaded one
    assert cal.seconds < 240 and cal.matmul.rate(1e8) > 1e8


@pytest.mark.slow  # ~30 s of CPU: saturation, extraction and JAX timing of NasRNN-small
def test_optimize_under_the_xla_model_with_tensat_conventions_and_rules(
        cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_calibration(cal_mod.calibration_path(), _fake())
    code = cli.main(["optimize", "nasrnn-small", "--json", "--repeats", "5", "--iterations", "5", "--time-limit", "20",
                     "--cost-model", "xla", "--conventions", "tensat", "--rules", "tensat-only"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)
    assert row["cost_model"] == "xla/cpu" and row["conventions"] == "tensat" and row["rules"] == "tensat-only"
    assert row["numerics_ok"] is True and 0 < row["cost_after"] <= row["cost_before"]


@pytest.mark.slow  # saturates and times NasRNN-small's plans under four cost models
def test_check_sets_predicted_beside_measured(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_calibration(cal_mod.calibration_path(), _fake())
    assert cli.main(["calibrate", "--check", "nasrnn-small", "--repeats", "8", "--time-limit", "10", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["model"] == "nasrnn-small" and row["calibration"]["status"] == "cached"
    assert row["candidates"][0]["models"] == ["original"] and row["plans"] == len(row["candidates"])
    for plan in row["candidates"]:
        low, high = plan["measured_speedup_ci"]
        assert plan["predicted_speedup"] > 0 and low <= plan["measured_speedup"] <= high


def test_an_older_format_cache_is_measured_again_cleanly(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = cal_mod.calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    old = {k: v for k, v in _fake().to_json().items() if k not in ("copy_s", "kernel_s", "dot_s", "conv_s", "call_s")}
    path.write_text(json.dumps({**old, "format": "eqsat-xla-calibration-2"}))
    cal, status = cal_mod.load_calibration()
    assert status.startswith("re-measured") and "older eqsat" in status and cal == _fake()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert json.loads(path.read_text())["format"] == CALIBRATION_FORMAT


def test_a_floor_probe_chains_one_kernel_per_link() -> None:
    import jax

    from jax_backend.lower import lower_node

    op, attrs, shapes = cal_mod.FLOOR_PROBES["loop"]
    x = jax.numpy.ones(shapes[0])

    def body(y: jax.Array) -> jax.Array:
        for _ in range(5):
            y = jax.lax.optimization_barrier(lower_node(op, (y,), attrs)[0])
        return y

    assert jax.jit(body).lower(x).compile().as_text().count("fusion(") >= 5  # XLA fused nothing across a barrier
    fit = cal_mod.chain_fit(op, attrs, shapes, lengths=(1, 8, 16))
    assert fit.floor_s > 0 and fit.call_s > 0
    assert cal_mod.chain_is_device_bound(10e-6, 12e-6, 3) and not cal_mod.chain_is_device_bound(50e-6, 5e-6, 3)


def test_calibrate_and_xla_predictions_run_without_the_search_engines(tmp_path: Path) -> None:
    """What a GPU machine without egglog, z3 or highspy runs (scripts/gpu_issue24.sh): `eqsat
    calibrate` (its measuring stubbed: the command around it) and the xla factory never import them."""
    import subprocess
    import sys

    code = (
        BLOCK_SEARCH_ENGINES +
        "from jax_backend import calibrate as c\n"
        "from eqsat.xla_cost import Calibration, Curve\n"
        "from eqsat.cost import _machine_key, cost_model\n"
        "fake = Calibration(_machine_key(), c.device_key(), 2e-6, 2e10, 2e9, Curve((1e3, 1e9), (1e-5, 2e-2)),\n"
        "                   Curve((1e3, 1e9), (2e-5, 3e-2)), call_s=5e-5)\n"
        "c.calibrate = lambda say=None: fake\n"
        "from eqsat.cli import main\n"
        "assert main(['calibrate', '--json', '--force']) == 0\n"
        "assert cost_model('xla', device='cpu').calibration == fake\n"
    )
    env = {**__import__("os").environ, "EQSAT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["call_us"] == pytest.approx(50.0)


def test_probes_time_wide_dots_and_nhwc_convs_in_one_set_of_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide dot's chain is cut back to its input's shape each link; the dot and mat-vec probes read
    distinct weights past any last-level cache, as independent products of one input."""
    monkeypatch.setattr(cal_mod, "PROBE_CAP_S", 0.2)
    monkeypatch.setattr(cal_mod, "GEMV_CAP_S", 0.2)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    seconds = cal_mod._marginals([("matmul", {"act": 0}, (2, 8), (8, 32)),
                                  ("conv2d_nhwc", attrs, (1, 6, 6, 4), (3, 3, 4, 4))])
    assert len(seconds) == 2 and all(0 < s < 1 for s in seconds)
    assert all(n > k for _, k, n in cal_mod.MATMUL_SHAPES[-1:])  # the largest dot is a wide (merged) one
    for _, k, n in (*cal_mod.MATMUL_SHAPES[-2:], *((1, k, n) for k, n in cal_mod.GEMV_SHAPES)):
        assert 4 * k * n * 4 <= cal_mod.WEIGHT_BYTES  # 4 or more distinct weights a probe, past the caches
    assert [s > 0 for s in cal_mod._independent_dots(((1, 8, 16), (4, 8, 32)), 0.0, total_bytes=4096)] == [True, True]


def test_the_1x1_conv_grid_is_timed_nhwc_in_grid_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every (rows, channels) point of the grid gives one NHWC time, in grid order (no NCHW probe: the
    model prices a rank-4 NCHW conv as its NHWC form and transposes)."""
    monkeypatch.setattr(cal_mod, "CONV1X1_SIZES", (2, 3))
    monkeypatch.setattr(cal_mod, "CONV1X1_CHANNELS", (4, 8))
    monkeypatch.setattr(cal_mod, "PROBE_CAP_S", 0.2)
    nhwc = cal_mod._conv1x1_surface(lambda _: None)
    assert nhwc.rows == (4.0, 9.0) and nhwc.weights == (16.0, 64.0)
    assert len(nhwc.seconds) == 4 and all(0 < s < 1 for s in nhwc.seconds)


def test_a_stop_for_precision_waits_for_every_interval_to_narrow() -> None:
    """`medians_precise` stops the rounds only when each pair's per-round difference (or a thunk's own
    times) has a 95% interval above 0 and within the relative width of its median."""
    from jax_backend.timing import medians_precise

    steady = [[1.0 + 0.001 * (i % 3) for i in range(12)], [2.0 + 0.001 * (i % 5) for i in range(12)]]
    noisy = [steady[0], [1.0 + (0.9 if i % 2 else -0.5) for i in range(12)]]
    assert medians_precise([(0, 1)], 0.1)(steady) and medians_precise([(None, 0), (None, 1)], 0.1)(steady)
    assert not medians_precise([(0, 1)], 0.1)(noisy)  # differences straddle 0
    assert not medians_precise([(0, 1)], 0.1, after_s=60.0)(steady)  # not before its time


def test_the_transpose_probe_moves_conv_weights_to_hwio_and_is_reported(
        cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe transposes OIHW weights (what XLA:CPU does before each NCHW conv) inside a program that
    feeds each to a conv, and gives a rate; `calibrate --json` reports it."""
    monkeypatch.setattr(cal_mod, "TRANSPOSE_SHAPES", ((8, 4, 1, 1), (16, 8, 1, 1), (8, 4, 3, 3), (16, 8, 3, 3)))
    monkeypatch.setattr(cal_mod, "TRANSPOSE_ACT_SHAPES", ((1, 4, 4, 4), (1, 8, 8, 8)))
    monkeypatch.setattr(cal_mod, "PROBE_CAP_S", 0.2)
    flat, window, act = cal_mod._transpose_curves(lambda _: None, weight_bytes=4096, act_bytes=4096, max_count=4)
    assert flat.flops == (4.0 * 32, 4.0 * 128) and window.flops == (4.0 * 288, 4.0 * 1152)  # bytes, by kind
    assert act.flops == (4.0 * 64, 4.0 * 512)
    assert all(0 < s < 1 for s in (*flat.seconds, *window.seconds, *act.seconds))
    assert _reported(capsys, monkeypatch, transpose_bandwidth=3e9)["transpose_bandwidth_gbs"] == pytest.approx(3.0)
    assert _fake().transpose_bandwidth == _fake().bandwidth  # unmeasured: the loop fusion's bandwidth

"""The roofline cost model: the right regime for big and small ops, zero for leaves and views, a
registry with clear errors, and a CPU calibration that is cached and never run at import time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eqsat import cost
from eqsat.cost import DEVICES, RooflineModel, UnknownCostModelError, cost_model, graph_cost
from eqsat.ir import GraphBuilder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_big_matmul_is_compute_bound_and_small_one_launch_bound() -> None:
    h100 = cost_model("roofline", device="h100")
    big = h100.op_cost("matmul", {"act": 0}, [(8192, 8192), (8192, 8192)])
    assert big == pytest.approx(2 * 8192**3 / 67e12 + 5e-6)
    tiny = h100.op_cost("matmul", {"act": 0}, [(1, 8), (8, 8)])
    assert tiny == pytest.approx(5e-6, rel=1e-3)


def test_elementwise_is_memory_bound_and_h200_is_faster() -> None:
    shapes = [(4096, 4096), (4096, 4096)]
    h100 = cost_model(device="h100").op_cost("ewadd", {}, shapes)
    h200 = cost_model(device="h200").op_cost("ewadd", {}, shapes)
    assert h100 == pytest.approx(3 * 4096 * 4096 * 4 / 3.35e12 + 5e-6)
    assert h200 < h100


def test_bf16_uses_tensor_core_peak_and_half_the_bytes() -> None:
    fp32 = cost_model(device="h100").op_cost("matmul", {}, [(8192, 8192), (8192, 8192)])
    bf16 = cost_model(device="h100", dtype="bfloat16").op_cost("matmul", {}, [(8192, 8192), (8192, 8192)])
    assert bf16 < fp32 / 10


def test_leaves_and_views_cost_nothing() -> None:
    m = cost_model(device="h100")
    assert m.op_cost("input", {"name": "x", "shape": (4, 4)}, []) == 0.0
    assert m.op_cost("reshape", {"shape": (16,)}, [(4, 4)]) == 0.0
    assert m.op_cost("slice", {"axis": 0, "start": 0, "stop": 2}, [(4, 4)]) == 0.0


def test_graph_cost_is_the_sum_over_live_nodes() -> None:
    b = GraphBuilder()
    x, w = b.input("x", (64, 64)), b.weight("w", (64, 64))
    y = b.relu(b.matmul(x, w))
    b.tanh(x)  # dead: no output reads it
    g = b.build([y])
    m = cost_model(device="h100")
    want = m.op_cost("matmul", {"act": 0}, [(64, 64), (64, 64)]) + m.op_cost("relu", {}, [(64, 64)])
    assert graph_cost(g, m) == pytest.approx(want)


def test_fusing_two_matmuls_is_cheaper_on_every_device() -> None:
    """The saving Tensat's rules look for: one launch instead of two (weights concatenated once)."""
    for device in ("h100", "h200", "cpu-nominal"):
        m = cost_model(device=device)
        two = 2 * m.op_cost("matmul", {}, [(1, 512), (512, 512)])
        one = m.op_cost("matmul", {}, [(1, 512), (512, 1024)])  # the weights' concat is folded
        assert one < two, device


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(UnknownCostModelError, match="unknown cost model 'magic'; known cost models: .*roofline"):
        cost_model("magic")
    with pytest.raises(UnknownCostModelError, match="unknown device 'tpu'.*h100"):
        cost_model(device="tpu")


def test_device_specs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEVICES["h100"].bandwidth = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        DEVICES["x"] = DEVICES["h100"]  # type: ignore[index]


def test_cpu_calibration_is_measured_once_and_cached(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = cost_model(device="cpu")
    assert isinstance(first, RooflineModel)
    files = list(cache.glob("cpu-*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored["peak_flops_fp32"] > 1e8 and stored["bandwidth"] > 1e8 and 0 < stored["launch_s"] < 1e-3

    def no_measuring() -> None:
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(cost, "_measure_cpu", no_measuring)
    assert cost_model(device="cpu").spec == first.spec  # type: ignore[attr-defined]


def test_a_corrupt_cache_is_remeasured(cache: Path) -> None:
    spec = cost.calibrate_cpu()
    path = next(cache.glob("cpu-*.json"))
    path.write_text("{not json")
    again = cost.calibrate_cpu()
    assert again.name == spec.name == "cpu" and again.peak_flops_fp32 > 0


def test_importing_measures_nothing(cache: Path) -> None:
    subprocess.run([sys.executable, "-c", "import eqsat.cost, eqsat.commands.optimize"], check=True,
                   env={**os.environ, "EQSAT_CACHE_DIR": str(cache)})
    assert list(cache.iterdir()) == []

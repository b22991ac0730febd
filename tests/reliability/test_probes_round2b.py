"""Regression tests for the rest of the second round of hostile probes (issue 27, part 2): bench
output targets, size-1 and non-positive mesh axes, numeric flags refused as the command line is
read, and the decorator's arguments, user exceptions and per-signature cache."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from eqsat import cli
from eqsat.errors import EqsatError
from eqsat.models import build_parallel_model
from eqsat.models.parallel_hand import megatron_by_hand
from eqsat.parallel.cost import ParallelCostModel
from eqsat.parallel.mesh import CPU_LINK, Mesh, MeshAxis, MeshError, parse_mesh
from eqsat.parallel.plan import plan_report

# --- bench --out ------------------------------------------------------------------------------------


def _bad_targets(tmp_path: Path) -> list[Path]:
    afile = tmp_path / "afile"
    afile.write_text("x")
    return [afile, afile / "under", Path("/proc/eqsat-out")]


@pytest.mark.parametrize("bench", ["parallel", "extraction", "scaling", "jax", "ceiling", "tensat"])
def test_bench_out_at_a_file_under_a_file_or_in_proc_is_one_line_exit_2(
        bench: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target in _bad_targets(tmp_path):
        assert cli.main(["bench", bench, "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"eqsat bench: error: --out {target}") and "\n" not in err, err


def test_bench_rules_out_at_a_directory_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "rules", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# --- meshes -----------------------------------------------------------------------------------------


def test_size_one_axes_are_dropped() -> None:
    assert parse_mesh("8x1").shape == (8,)
    assert parse_mesh("1x2x1x4").shape == (2, 4)
    assert parse_mesh("8x1").n_devices == 8


@pytest.mark.parametrize("spec", ["1", "1x1"])
def test_a_one_device_mesh_is_refused_with_a_reason(spec: str) -> None:
    with pytest.raises(MeshError, match="one device"):
        parse_mesh(spec)


@pytest.mark.parametrize("spec", ["0", "-2", "2x0", "4x-2"])
def test_a_non_positive_axis_says_positive(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(MeshError, match="positive"):
        parse_mesh(spec)
    assert cli.main(["parallel", "mlp16", f"--mesh={spec}", "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert "positive" in err and "more than" not in err


def test_too_many_devices_says_how_many() -> None:
    with pytest.raises(MeshError, match="needs 16 devices, more than the 8"):
        parse_mesh("4x4")


def test_the_device_count_hint_names_the_devices_needed() -> None:
    from jax_backend.shard import ShardError, jax_mesh

    with pytest.raises(ShardError, match="device_count=32"):
        jax_mesh(parse_mesh("h100x32"), devices=list(range(8)))


def _mesh(*shape: int) -> Mesh:
    return Mesh("test", tuple(MeshAxis(f"a{i}", s, *CPU_LINK) for i, s in enumerate(shape)))


def test_megatron_by_hand_shards_over_a_real_axis_and_moves_nothing_on_one_device() -> None:
    graph = build_parallel_model("mlp16")
    on_8x1 = megatron_by_hand("mlp16", graph, _mesh(8, 1))
    axes = {n.attr.get("axis") for n in on_8x1.nodes if n.op in ("partition", "reduce", "combine", "replicate")}
    assert axes == {0}
    one = _mesh(1)
    from eqsat.cost import cost_model

    report = plan_report(megatron_by_hand("mlp16", graph, one), ParallelCostModel(one, cost_model("roofline", "cpu")))
    assert report.comm_bytes(None) == 0.0


# --- numeric flags ----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["bench", "tensat", "--models"],
    ["bench", "tensat", "--k-multi", "-1"],
    ["bench", "tensat", "--taso-seconds", "nan"],
    ["bench", "tensat", "--taso-seconds", "0"],
    ["bench", "tensat", "--taso-long-seconds", "inf"],
    ["bench", "tensat", "--time-limit", "-1"],
    ["bench", "scaling", "--memory-gib", "nan"],
    ["bench", "scaling", "--max-classes", "0"],
    ["bench", "jax", "--rounds", "-3"],
    ["bench", "jax", "--budget", "inf"],
    ["bench", "jax", "--programs"],
    ["bench", "schedules", "mlp", "--node-limit", "0"],
    ["bench", "lns", "--seeds", "-1"],
    ["parallel", "mlp16", "--random-plans", "-3"],
    ["parallel", "mlp16", "--time-limit", "nan"],
    ["parallel", "mlp16", "--budget", "-0.5"],
    ["parallel", "mlp16", "--comm-budget", "inf"],
])
def test_numeric_and_list_flags_are_checked_as_the_command_line_is_read(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_number_type_messages() -> None:
    import argparse

    from eqsat.arg_types import NON_NEGATIVE_INT, POSITIVE

    assert POSITIVE("2.5") == 2.5 and NON_NEGATIVE_INT("0") == 0
    for bad in ("nan", "inf", "-inf", "0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a number > 0"):
            POSITIVE(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="whole number >= 0"):
        NON_NEGATIVE_INT("1.5")

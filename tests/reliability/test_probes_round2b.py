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
from eqsat.parallel.planner import plan_report

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
])
def test_numeric_and_list_flags_are_checked_as_the_command_line_is_read(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "error: argument" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--random-plans", "-3"), ("--time-limit", "nan"), ("--budget", "-0.5"),
                                         ("--comm-budget", "inf")])
def test_parallel_numeric_flags_fail_before_any_work(flag: str, value: str, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.commands import parallel

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("planning started")

    monkeypatch.setattr(parallel, "run_case", no_work)
    assert cli.main(["parallel", "mlp16", flag, value, "--no-measure"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"eqsat parallel: error: {flag}") and "\n" not in err, err


def test_number_type_messages() -> None:
    import argparse

    from eqsat.arg_types import NON_NEGATIVE_INT, POSITIVE

    assert POSITIVE("2.5") == 2.5 and NON_NEGATIVE_INT("0") == 0
    for bad in ("nan", "inf", "-inf", "0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a number > 0"):
            POSITIVE(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="whole number >= 0"):
        NON_NEGATIVE_INT("1.5")


# --- the decorator ----------------------------------------------------------------------------------


def test_optimize_refuses_a_non_callable_as_jax_jit_does() -> None:
    import eqsat

    with pytest.raises(TypeError):
        jax.jit(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a callable, got 42"):
        eqsat.optimize(42)
    with pytest.raises(TypeError, match="expected a callable"):
        eqsat.optimize(time_limit=1.0)("not a function")


@pytest.mark.parametrize("kwargs", [{"rtol": math.nan}, {"rtol": -1.0}, {"rtol": math.inf}, {"time_limit": math.nan},
                                    {"time_limit": math.inf}, {"max_signatures": 0}, {"max_signatures": 2.5}])
def test_optimize_refuses_bad_tolerances_and_limits_at_decoration(kwargs: dict[str, Any]) -> None:
    import eqsat

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning on the way to the error
        with pytest.raises(EqsatError, match=next(iter(kwargs))):
            eqsat.optimize(lambda x: x, **kwargs)


def test_a_user_exception_propagates_once_traced_with_no_eqsat_warning() -> None:
    import eqsat

    calls: list[int] = []

    def broken(x: jax.Array) -> jax.Array:
        calls.append(1)
        raise ValueError("the user's own bug")

    fn = eqsat.optimize(broken, time_limit=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="the user's own bug"):
            fn(jnp.ones(3))
    assert len(calls) == 1
    assert not [w for w in caught if "eqsat" in str(w.message)], [str(w.message) for w in caught]


def _stub_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the optimization of a signature by a trace of the function and an "original" entry."""
    from jax_backend import decorator
    from jax_backend.decorator_options import Entry, SignatureReport

    built: list[str] = []

    def fake_build(flat_fun: Any, avals: Any, signature: str, opts: Any, device: Any = None, *_: Any, **__: Any) -> Entry:
        jax.make_jaxpr(flat_fun)(*avals)
        built.append(signature)
        return Entry(None, None, SignatureReport(signature, "original", "stub"))

    monkeypatch.setattr(decorator, "build_signature", fake_build)
    return built


def test_the_signature_cache_is_bounded_lru_and_an_evicted_signature_is_optimized_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import eqsat

    built = _stub_builds(monkeypatch)
    fn = eqsat.optimize(lambda x: x * 2.0, max_signatures=2)
    for n in (1, 2, 1, 3):  # 1 is used again before 3 arrives: 2 is the least recently used
        fn.report(jnp.ones(n))
    assert [r.signature for r in fn.reports] == ["float32[1]", "float32[3]"]
    fn.report(jnp.ones(2))  # evicted: optimized again
    assert built == ["float32[1]", "float32[2]", "float32[3]", "float32[2]"]
    assert len(fn.reports) == 2
    assert float(fn(jnp.ones(4))[0]) == 2.0


def test_a_recompile_storm_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import eqsat
    from jax_backend.decorator_options import RECOMPILE_STORM, EqsatRecompileWarning

    _stub_builds(monkeypatch)
    fn = eqsat.optimize(lambda x: x + 1.0, max_signatures=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, RECOMPILE_STORM + 4):
            fn.report(jnp.ones(n))
    storms = [w for w in caught if issubclass(w.category, EqsatRecompileWarning)]
    assert len(storms) == 1 and f"{RECOMPILE_STORM + 1} input signatures" in str(storms[0].message)
    assert len(fn.reports) == 4

"""`eqsat bench`: pyproject.toml declares exactly the benchmarks experiments/benchmarks.py defines, and
each one's flags parse (the dispatcher reads them from the installed entry points)."""

from __future__ import annotations

import argparse
import importlib
import tomllib
from pathlib import Path

import pytest

from eqsat.commands import bench
from experiments.benchmarks import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_every_benchmark() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][bench.GROUP]
    assert set(declared) == set(BENCHMARKS)
    for name, target in declared.items():
        module, _, attribute = target.partition(":")
        assert getattr(importlib.import_module(module), attribute) is BENCHMARKS[name]


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_parses_its_flags_and_names_an_importable_module(name: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)
    parser = argparse.ArgumentParser(prog="eqsat bench")
    parser.add_argument("--json", action="store_true")
    bench.add_arguments(parser)
    positional = ["nasrnn"] if name in ("schedules", "multiprocess") else []
    args = parser.parse_args([name, *positional, "--json"])
    assert args.json is True and args._bench is BENCHMARKS[name]
    assert importlib.util.find_spec(BENCHMARKS[name].module) is not None


def test_a_benchmark_that_does_not_load_fails_in_one_line() -> None:
    broken = bench._Broken("gone", "ModuleNotFoundError: No module named 'experiments.gone'")
    with pytest.raises(bench.EqsatError, match="benchmark 'gone' cannot be loaded .* reinstall"):
        broken.run(argparse.Namespace())


def test_bench_extraction_refuses_bad_names_and_files_before_any_work(tmp_path: Path) -> None:
    from eqsat.errors import EqsatError
    from experiments.bench_extraction import run_bench

    with pytest.raises(EqsatError, match="unknown extractor 'nope'"):
        run_bench(tmp_path / "out", extractors=["nope"])
    with pytest.raises(EqsatError, match="no such file"):
        run_bench(tmp_path / "out", files=[tmp_path / "missing.json"], extractors=["greedy-dag"])
    assert not (tmp_path / "out").exists()


def test_bench_jax_refuses_an_unknown_program() -> None:
    from eqsat.errors import EqsatError
    from experiments.bench_jax import run_bench

    with pytest.raises(EqsatError, match="unknown program"):
        run_bench(None, programs=["no-such-program"], groups=["targets"])

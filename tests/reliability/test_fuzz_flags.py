"""Fuzzing the command-line flags of `eqsat parallel` and `eqsat bench tensat|parallel|jax|extraction`
and the `--mesh` language: any text either becomes a valid value or is refused as bad input
(argparse's usage error, exit 2, or one `EqsatError` line), never another exception, never a hang.

The parsers are the ones `eqsat.cli.build_parser` builds; the checks are the commands' own, run up to
the point where work would start (the planner and the benchmarks themselves are stubbed out).
Bounded and derandomized like tests/reliability/test_fuzz_inputs.py: EQSAT_FUZZ_EXAMPLES (default
40) sets the examples per property, e.g.

    EQSAT_FUZZ_EXAMPLES=400 python -m pytest -q tests/reliability/test_fuzz_flags.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from eqsat.cli import build_parser
from eqsat.commands import parallel as parallel_command
from eqsat.errors import EqsatError
from eqsat.models import PARALLEL_MODELS
from eqsat.parallel.mesh import PRESETS, Mesh, MeshError, parse_mesh

EXAMPLES = int(os.environ.get("EQSAT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NASTY = ("nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "1e309", "-1e309", "1e-320", "0", "-0", "0.0",
         "-1", "-0.5", "1", "5", "4.999", "3.5", "1e3", "1_000", "0x10", "", " ", " 7 ", "\u0663", "\uff11\uff12",
         "9" * 5000, "1" + "0" * 40, "x", "8x", "x8", "--", "-", "\x00", "\u00e9", "\U0001f600")
number_texts = st.one_of(st.sampled_from(NASTY), st.integers(-10**30, 10**30).map(str),
                         st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8))
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options


def _list_item(text: str) -> bool:
    """A token of a list flag: anything argparse does not read as an option (a leading '-' makes
    it one, '-h' a help request, which is neither a value nor an error)."""
    return not text.startswith("-") or bool(NEGATIVE_NUMBER.match(text))


list_items = (number_texts | st.text(max_size=10)).filter(_list_item)


def _one_line(exc: BaseException) -> None:
    event(f"refused: {type(exc).__name__}")
    message = str(exc)
    assert message and "\n" not in message, repr(message)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    """The namespace, or None for argparse's usage error (exit 2, one 'error:' line on stderr)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2, (argv, exc.code, err.getvalue())
        assert "error:" in err.getvalue().splitlines()[-1], err.getvalue()
        event("usage error (exit 2)")
        return None


def _finite(value: Any, low: float, strict: bool = True) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > low if strict else value >= low))


@st.composite
def flag_args(draw: st.DrawFn, flags: dict[str, str]) -> list[str]:
    """Some of `flags` (name -> "one" or "list"), each given fuzzed text: a single value as
    `--flag=TEXT` (so any text is the value), a list as separate tokens."""
    argv: list[str] = []
    for flag, kind in flags.items():
        if not draw(st.booleans()):
            continue
        if kind == "one":
            argv.append(f"{flag}={draw(number_texts)}")
        else:
            argv += [flag, *draw(st.lists(list_items, max_size=3))]
    return argv


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


# --- --mesh ------------------------------------------------------------------------------------------

shape_specs = st.lists(st.integers(-3, 10**12) | st.integers(0, 9), min_size=1, max_size=4).flatmap(
    lambda sizes: st.sampled_from(["x", "X", " x ", "x "]).map(lambda sep: sep.join(map(str, sizes))))
mesh_specs = st.one_of(shape_specs, st.sampled_from([*PRESETS, *NASTY, "1x1", "2x4", "4x2", "8x1", "1x8", "2x2x2",
                                                     "16", "x", "2xx4", "2x-4", "H100X8"]), st.text(max_size=12))
bases = st.sampled_from([*PRESETS, "", "nope", "CPU8"]) | st.text(max_size=6)


def _check_mesh(mesh: Mesh, spec: str, base: str) -> None:
    assert mesh.axes and all(isinstance(s, int) and s >= 2 for s in mesh.shape), mesh
    assert mesh.n_devices == math.prod(mesh.shape)
    if spec not in PRESETS:
        assert mesh.n_devices <= PRESETS[base].n_devices


@FUZZ
@given(spec=mesh_specs, base=bases)
def test_mesh_text_is_a_mesh_or_one_mesh_error(spec: str, base: str) -> None:
    """`parse_mesh`: a mesh of positive whole-number axes within the base preset's devices, or one
    `MeshError` line (a size under 1, one device, too many devices, not a shape, unknown preset)."""
    try:
        mesh = parse_mesh(spec, base)
    except MeshError as exc:
        _one_line(exc)
        return
    event("accepted")
    _check_mesh(mesh, spec, base)


# --- eqsat parallel -----------------------------------------------------------------------------------

PARALLEL_FLAGS = {"--time-limit": "one", "--budget": "one", "--comm-budget": "one", "--random-plans": "one",
                  "--mesh": "one", "--base": "one"}


@FUZZ
@given(model=st.sampled_from(sorted(PARALLEL_MODELS)), flags=flag_args(PARALLEL_FLAGS),
       mesh=mesh_specs, base=bases)
def test_parallel_flags_are_valid_or_refused(parser: argparse.ArgumentParser, model: str, flags: list[str],
                                             mesh: str, base: str) -> None:
    """`eqsat parallel`'s numbers and mesh: valid when the planner would start, else exit 2 or one
    EqsatError line before any work."""
    argv = ["parallel", model, f"--mesh={mesh}", f"--base={base}", *flags]  # later flags win
    args = _parse(parser, argv)
    if args is None:
        return
    seen: list[tuple[Any, ...]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel_command, "run_case", lambda *a: seen.append(a) or {})
        try:
            list(args._module.run(args))
        except EqsatError as exc:
            _one_line(exc)
            return
    event("accepted")
    assert len(seen) == 1
    assert _finite(args.time_limit, 0.0)
    assert args.budget is None or _finite(args.budget, 0.0)
    assert args.comm_budget is None or _finite(args.comm_budget, 0.0, strict=False)
    assert isinstance(args.random_plans, int) and args.random_plans >= 0
    _check_mesh(parse_mesh(args.mesh, args.base), args.mesh, args.base)


# --- eqsat bench ------------------------------------------------------------------------------------

BENCH_FLAGS: dict[str, dict[str, str]] = {
    "tensat": {"--time-limit": "one", "--k-multi": "list", "--taso-budget": "one", "--taso-seconds": "one",
               "--taso-long-seconds": "one", "--passes": "one", "--repeats": "one", "--timing-budget": "one",
               "--models": "list", "--candidates": "list", "--cost-models": "list"},
    "parallel": {"--time-limit": "one", "--models": "list"},
    "jax": {"--time-limit": "one", "--rounds": "one", "--budget": "one", "--programs": "list", "--groups": "list"},
    "extraction": {"--time-limit": "one", "--files": "list", "--extractors": "list"},
}


def _stub_call(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    """What runs in place of a benchmark: the tensat options (their own checks), nothing else."""
    if hasattr(module, "options_from_args"):
        return [{"options": module.options_from_args(args)}]
    return []


def _check_bench(name: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    assert _finite(args.time_limit, 0.0)
    if name == "tensat":
        o = rows[0]["options"]
        assert _finite(o.extract_time_limit, 0.0) and _finite(o.taso_seconds, 0.0)
        assert _finite(o.taso_long_seconds, 0.0, strict=False) and _finite(o.timing_budget, 0.0)
        assert isinstance(o.passes, int) and o.passes >= 1 and isinstance(o.repeats, int) and o.repeats >= 5
        assert isinstance(o.taso_budget, int) and o.taso_budget >= 1
        assert o.k_multi and all(isinstance(k, int) and k >= 0 for k in o.k_multi)
        assert all(m and d for m, d in o.cost_models)
    if name == "jax":
        assert isinstance(args.rounds, int) and args.rounds >= 1 and _finite(args.budget, 0.0)
        assert set(args.groups) <= {"targets", "models", "overhead"}


@st.composite
def bench_argv(draw: st.DrawFn) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(sorted(BENCH_FLAGS)))
    return name, draw(flag_args(BENCH_FLAGS[name]))


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-out")


@FUZZ
@given(case=bench_argv())
def test_bench_flags_are_valid_or_refused(parser: argparse.ArgumentParser, out_dir: Path,
                                          case: tuple[str, list[str]]) -> None:
    """`eqsat bench NAME`'s numbers and lists: valid when the benchmark would start (tensat: its
    `BenchOptions` built), else exit 2 or one EqsatError line; the benchmark itself never runs."""
    name, flags = case
    args = _parse(parser, ["bench", name, f"--out={out_dir}", *flags])
    if args is None:
        return
    bench = getattr(args, "_bench", None)
    if bench is None or not hasattr(bench, "call"):
        pytest.skip(f"benchmark {name!r} is not registered in the installed metadata")
    module = bench.module if name == "tensat" else "experiments.benchmarks"  # only tensat's options are built
    try:
        rows = list(replace(bench, module=module, call=_stub_call).run(args))
    except EqsatError as exc:
        _one_line(exc)
        return
    event(f"accepted: {name}")
    _check_bench(name, args, rows)

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
from hypothesis import HealthCheck, event, example, given, settings
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


NUMBER = st.integers(5, 64).map(str) | st.floats(5.0, 100.0).map(repr)  # valid for every numeric flag here


@st.composite
def flag_args(draw: st.DrawFn, flags: dict[str, tuple[str, st.SearchStrategy[str]]]) -> list[str]:
    """Some of `flags` (name -> ("one" or "list", its valid values)), each given a valid value or,
    one time in four, fuzzed text: a single value as `--flag=TEXT` (so any text is the value), a
    list as separate tokens (sometimes none)."""
    argv: list[str] = []
    for flag, (kind, valid) in flags.items():
        if not draw(st.booleans()):
            continue
        if kind == "one":
            argv.append(f"{flag}={draw(st.sampled_from([valid, valid, valid, number_texts]).flatmap(lambda s: s))}")
        else:
            items = st.sampled_from([valid, valid, valid, list_items]).flatmap(lambda s: s)
            argv += [flag, *draw(st.lists(items, min_size=draw(st.sampled_from([1, 1, 1, 0])), max_size=3))]
    return argv


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


# --- --mesh ------------------------------------------------------------------------------------------

sizes = st.sampled_from([1, 2, 4, 8]) | st.integers(-3, 10**12) | st.integers(0, 9)
shape_specs = st.lists(sizes, min_size=1, max_size=4).flatmap(
    lambda sizes: st.sampled_from(["x", "X", " x ", "x "]).map(lambda sep: sep.join(map(str, sizes))))
valid_meshes = st.sampled_from([*PRESETS, "8", "2x4", "4x2", "2", "2x2", "4", "1x8", "8x1", "2x2x2", " 4 "])
mesh_specs = st.one_of(shape_specs, valid_meshes,
                       st.sampled_from([*NASTY, "1x1", "16", "x", "2xx4", "2x-4", "H100X8"]), st.text(max_size=12))
bases = st.sampled_from([*PRESETS, *PRESETS, "", "nope", "CPU8"]) | st.text(max_size=6)


def _check_mesh(mesh: Mesh, spec: str, base: str) -> None:
    assert mesh.axes and all(isinstance(s, int) and s >= 2 for s in mesh.shape), mesh
    assert mesh.n_devices == math.prod(mesh.shape)
    if spec not in PRESETS:
        assert mesh.n_devices <= PRESETS[base].n_devices


@FUZZ
@given(spec=mesh_specs, base=bases)
@example(spec="\n", base="cpu8").via("a newline: still one line")
@example(spec="0x8", base="cpu8").via("a zero axis")
@example(spec="1x1", base="cpu8").via("one device")
@example(spec="99x99", base="h100x8").via("more devices than the base")
@example(spec="2x4", base="no\npreset").via("an unknown base")
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

PARALLEL_FLAGS = {"--time-limit": ("one", NUMBER), "--budget": ("one", st.sampled_from(["0.4", "1", "2.5"])),
                  "--comm-budget": ("one", NUMBER | st.just("0")), "--random-plans": ("one", st.integers(0, 9).map(str)),
                  "--mesh": ("one", mesh_specs), "--base": ("one", bases)}


@FUZZ
@given(model=st.sampled_from([*sorted(PARALLEL_MODELS), "", "nope", "\n"]), flags=flag_args(PARALLEL_FLAGS),
       mesh=valid_meshes, base=st.sampled_from(sorted(PRESETS)))
@example(model="mlp16", flags=["--time-limit=nan"], mesh="8", base="cpu8").via("NaN seconds")
@example(model="mlp16", flags=["--budget=-1"], mesh="8", base="cpu8").via("a negative fraction")
@example(model="mlp16", flags=["--comm-budget=inf"], mesh="8", base="cpu8").via("infinite bytes")
@example(model="mlp16", flags=["--random-plans=-3"], mesh="8", base="cpu8").via("a negative count")
@example(model="\n", flags=[], mesh="8", base="cpu8").via("a newline as the model")
def test_parallel_flags_are_valid_or_refused(parser: argparse.ArgumentParser, model: str, flags: list[str],
                                             mesh: str, base: str) -> None:
    """`eqsat parallel`'s numbers and mesh: valid when the planner would start, else exit 2 or one
    EqsatError line before any work."""
    argv = ["parallel", model, f"--mesh={mesh}", f"--base={base}", *flags]  # later flags win
    args = _parse(parser, argv)
    if args is None:
        return
    seen: list[tuple[Any, ...]] = []

    def planned(*a: Any) -> dict[str, Any]:  # the planner, not run: only what it was asked
        seen.append(a)
        return {}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel_command, "run_case", planned)
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

NAMES = st.sampled_from(["nasrnn", "bert", "mlp16", "greedy", "ilp"])
BENCH_FLAGS: dict[str, dict[str, tuple[str, st.SearchStrategy[str]]]] = {
    "tensat": {"--time-limit": ("one", NUMBER), "--k-multi": ("list", st.integers(0, 3).map(str)),
               "--taso-budget": ("one", st.integers(1, 10**6).map(str)), "--taso-seconds": ("one", NUMBER),
               "--taso-long-seconds": ("one", NUMBER | st.just("0")), "--passes": ("one", st.sampled_from(["1", "3"])),
               "--repeats": ("one", st.sampled_from(["5", "30"])), "--timing-budget": ("one", NUMBER),
               "--models": ("list", NAMES), "--candidates": ("list", st.sampled_from(["greedy", "roofline-launch0"])),
               "--cost-models": ("list", st.sampled_from(["roofline/h100", "roofline/cpu", "measured/cpu", "nope/h100"]))},
    "parallel": {"--time-limit": ("one", NUMBER), "--models": ("list", NAMES)},
    "jax": {"--time-limit": ("one", NUMBER), "--rounds": ("one", st.integers(1, 50).map(str)), "--budget": ("one", NUMBER),
            "--programs": ("list", NAMES), "--groups": ("list", st.sampled_from(["targets", "models", "overhead"]))},
    "extraction": {"--time-limit": ("one", NUMBER), "--files": ("list", NAMES), "--extractors": ("list", NAMES)},
}


def _stub_call(module: Any, args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    """What runs in place of a benchmark: tensat's options and cost models checked, nothing else."""
    if hasattr(module, "options_from_args"):
        options = module.options_from_args(args)
        module.check_cost_models(options)
        return [{"options": options}]
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
        assert set(args.groups) <= {"targets", "models", "overhead", "heldout"}


@st.composite
def bench_argv(draw: st.DrawFn) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(sorted(BENCH_FLAGS)))
    return name, draw(flag_args(BENCH_FLAGS[name]))


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-out")


@FUZZ
@given(case=bench_argv())
@example(case=("tensat", ["--repeats=4"])).via("fewer than 5 rounds")
@example(case=("tensat", ["--candidates", "nope"])).via("an unknown candidate")
@example(case=("tensat", ["--cost-models", "roofline/h100", "nope/cpu"])).via("an unknown cost model")
@example(case=("tensat", ["--passes=0", "--taso-seconds=nan"])).via("no passes, NaN seconds")
@example(case=("jax", ["--budget=inf"])).via("an infinite budget")
@example(case=("extraction", ["--time-limit=-0"])).via("a zero time limit")
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

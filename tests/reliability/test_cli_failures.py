"""The command line under hostile use: bad targets and limits fail before the work, in one line;
a closed pipe, memory exhaustion and Ctrl-C end quietly."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eqsat import cli
from eqsat.errors import EqsatError
from eqsat.commands.optimize import OptimizeOptions


def _one_error_line(code: int, err: str, command: str) -> None:
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"eqsat {command}: error:")
    assert "Traceback" not in err


def test_save_graphs_onto_a_file_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import eqsat.commands.optimize

    def no_work(name: str) -> None:
        raise AssertionError("the model was built before the target was checked")

    monkeypatch.setattr(eqsat.commands.optimize, "build_model", no_work)
    target = tmp_path / "a-file"
    target.write_text("")
    code = cli.main(["optimize", "nasrnn-small", "--save-graphs", str(target)])
    _one_error_line(code, capsys.readouterr().err, "optimize")


@pytest.mark.parametrize("field, value", [("time_limit", math.nan), ("time_limit", -1.0), ("repeats", 0),
                                          ("saturate_seconds", math.nan), ("node_limit", 0)])
def test_optimize_rejects_impossible_limits(field: str, value: float) -> None:
    with pytest.raises(EqsatError, match="must be at least"):
        OptimizeOptions(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", ["nan", "-1"])
def test_extract_rejects_impossible_time_limits(limit: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["extract", "/nonexistent.json", "--time-limit", limit])
    _one_error_line(code, capsys.readouterr().err, "extract")


def test_synth_out_onto_a_directory_fails_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["rules", "synth", "--out", str(tmp_path), "--max-ops", "1", "--time-limit", "1"])
    _one_error_line(code, capsys.readouterr().err, "rules")


def test_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    egraph = tmp_path / "e.json"
    egraph.write_text('{"nodes": {"a": {"op": "x", "cost": 1, "eclass": "c", "children": []}}, "root_eclasses": ["c"]}')
    script = ("import sys; from eqsat import cli; sys.exit(cli.main(['extract', '--json', '--extractor', 'bottom-up'] "
              f"+ [{str(egraph)!r}] * 3000))")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141)
    assert "Traceback" not in err


def test_memory_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                  tmp_path: Path) -> None:
    from eqsat.extract import command

    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(command, "load_egraph", exhausted)
    code = cli.main(["extract", str(tmp_path / "x.json")])
    _one_error_line(code, capsys.readouterr().err, "extract")


def test_ctrl_c_during_a_native_call_ends_the_command_at_once() -> None:
    # A long egglog call holds the interpreter: the Python handler would only run after it.
    # Simulated by sleeping in C with SIGINT sent first; the process must die at once.
    script = """
import os, signal, time, sys
from eqsat.interrupt import ending_handler, native_call_interruptible
signal.signal(signal.SIGINT, ending_handler("optimize"))
with native_call_interruptible():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
sys.exit(0)
"""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, timeout=60)
    assert time.perf_counter() - start < 20
    assert proc.returncode == -signal.SIGINT


def test_library_callers_keep_keyboard_interrupt() -> None:
    from eqsat.interrupt import native_call_interruptible

    before = signal.getsignal(signal.SIGINT)
    with native_call_interruptible():
        assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("flag, value", [("--comm-budget", "nan"), ("--comm-budget", "-1"), ("--budget", "0"),
                                         ("--budget", "inf"), ("--time-limit", "nan")])
def test_parallel_rejects_impossible_budgets(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["parallel", "moe", "--mesh", "8", flag, value, "--no-measure"])
    _one_error_line(code, capsys.readouterr().err, "parallel")


def test_parallel_comm_budget_zero_gives_a_plan_moving_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A budget of 0 bytes: a plan with no collective at all (on moe the fastest such plan runs the
    whole step on every device, as the data-parallel search's plan does)."""
    import json

    code = cli.main(["parallel", "moe", "--mesh", "8", "--comm-budget", "0", "--no-measure", "--json"])
    assert code == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["predicted_step_comm_bytes"] == 0.0 and row["numerics_ok"] and row["comm_budget_bytes"] == 0.0

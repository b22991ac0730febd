"""`eqsat judge`: plans saved by `eqsat optimize --save-graphs` judged on the device at hand, with
only JAX and the IR (the search's engines need not be installed there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_free import BLOCK_SEARCH_ENGINES

from eqsat import cli
from eqsat.commands.judge import find_plans
from eqsat.ir import Graph, GraphBuilder


def _pair() -> tuple[Graph, Graph, Graph]:
    """relu(x @ w); the same through a matmul with 8x the columns, then sliced (equal, ~8x the work);
    and tanh(x @ w) (cheaper than the wide one, but a different function)."""
    graphs = []
    for kind in ("fast", "slow", "wrong"):
        b = GraphBuilder()
        x, w = b.input("x", (128, 256)), b.weight("w", (256, 256))
        others = [b.weight(f"w{i}", (256, 256)) for i in range(7)]
        y = b.slice(b.matmul(x, b.concat(1, w, *others)), 1, 0, 256) if kind == "slow" else b.matmul(x, w)
        graphs.append(b.build([b.tanh(y) if kind == "wrong" else b.relu(y)]))
    return graphs[0], graphs[1], graphs[2]


def _save(folder: Path, model: str, original: Graph, **candidates: Graph) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    original.save(folder / f"{model}.before.json")
    for name, graph in candidates.items():
        graph.save(folder / f"{model}.candidate.{name}.json")


def test_a_faster_saved_plan_is_kept_and_a_wrong_one_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow, wrong = _pair()
    _save(tmp_path / "a", "m", slow, fast=fast, wrong=wrong)
    assert cli.main(["judge", str(tmp_path / "a"), "--timing-budget", "2", "--repeats", "8", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["model"] == "m" and row["kept"] == "optimized" and row["plan"] == "fast"
    assert row["measured_speedup_ci"][0] > 1.0 and row["device"].startswith("cpu")
    by_name = {c["name"]: c for c in row["candidates"]}
    assert not by_name["wrong"]["numerics_ok"] and by_name["wrong"]["measured_speedup"] is None
    assert set(by_name["fast"]["predicted_pct_by_launch_us"]) == {"0", "1", "5"}


def test_folders_merge_by_model_with_prefixed_names(tmp_path: Path) -> None:
    fast, slow, _ = _pair()
    _save(tmp_path / "one", "m", slow, ilp=fast)
    _save(tmp_path / "two", "m", fast, ilp=slow)  # its original is ignored: the first folder's wins
    _save(tmp_path / "two", "n", fast)
    plans = find_plans([tmp_path / "one", tmp_path / "two"])
    assert [p.model for p in plans] == ["m", "n"]
    assert plans[0].original == tmp_path / "one" / "m.before.json"
    assert [name for name, _ in plans[0].candidates] == ["one/ilp", "two/ilp"]
    assert [p.model for p in find_plans([tmp_path / "two"], ["n"])] == ["n"]


@pytest.mark.parametrize("args", [["judge", "/nonexistent-folder"], ["judge", "{tmp}", "--models", "absent"],
                                  ["judge", "{tmp}", "--repeats", "2"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow, _ = _pair()
    _save(tmp_path, "m", slow, fast=fast)
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsat judge: error:") and "\n" not in err


def test_judge_runs_without_the_search_engines(tmp_path: Path) -> None:
    """What a GPU machine without egglog, z3 or highspy can run: the command never imports them."""
    fast, slow, _ = _pair()
    _save(tmp_path, "m", slow, fast=fast)
    blocker = (
        BLOCK_SEARCH_ENGINES +
        "from eqsat.cli import main\n"
        f"sys.exit(main(['judge', {str(tmp_path)!r}, '--timing-budget', '0', '--repeats', '5', '--json']))\n"
    )
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "m"


def test_xla_predictions_need_a_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow, _ = _pair()
    _save(tmp_path / "plans", "m", slow, fast=fast)
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path / "empty-cache"))
    assert cli.main(["judge", str(tmp_path / "plans"), "--xla-device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "eqsat calibrate" in err and "\n" not in err

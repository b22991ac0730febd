"""Plans judged by running them: `judge_plans` keeps a plan only if it is faster with confidence
(the decision `@eqsat.optimize` makes too), `eqsat optimize` reports measured and predicted
speedups with the kept label, and the Tensat bench's rows and table put measured numbers first."""

from __future__ import annotations

import dataclasses

import json
import math
from typing import Any

import pytest

from eqsat import cli
from eqsat.cost import cost_model, graph_cost
from eqsat.ir import Graph, GraphBuilder
from jax_backend.checks import judge_plans
from jax_backend.timing import choose_faster


def _pair() -> tuple[Graph, Graph]:
    """relu(x @ w), and the same computed through a matmul with 8x the columns, then sliced: equal
    outputs, ~8x the work (the wide weight is folded at load, so XLA cannot slice it away)."""
    graphs = []
    for wide in (False, True):
        b = GraphBuilder()
        x, w = b.input("x", (128, 256)), b.weight("w", (256, 256))
        others = [b.weight(f"w{i}", (256, 256)) for i in range(7)]
        y = b.slice(b.matmul(x, b.concat(1, w, *others)), 1, 0, 256) if wide else b.matmul(x, w)
        graphs.append(b.build([b.relu(y)]))
    return graphs[0], graphs[1]


def _in_ci(point: float, ci: Any) -> bool:
    return ci[0] <= point <= ci[1]


def test_the_same_graph_or_a_slower_one_keeps_the_original() -> None:
    fast, slow = _pair()
    judged = judge_plans(fast, [("same", fast), ("slow", slow)], fast.random_inputs(0), 1e-4, 1e-5, rounds=8,
                         budget_s=2.0)
    assert judged.kept == "original"
    same, slower = judged.checks
    assert same.same_as_original and same.timing is None
    assert slower.numerics_ok and not slower.same_as_original and slower.timing is not None
    assert judged.plan == "slow" and judged.speedup < 1.0 and _in_ci(judged.speedup, judged.speedup_ci)
    assert judged.passes >= 5
    only_same = judge_plans(fast, [("same", fast)], fast.random_inputs(0), 1e-4, 1e-5, rounds=5, budget_s=1.0)
    assert only_same.kept == "original" and only_same.plan is None and only_same.speedup == 1.0


def test_a_clearly_faster_plan_is_kept_and_a_wrong_one_never() -> None:
    fast, slow = _pair()
    b = GraphBuilder()
    x, w = b.input("x", (128, 256)), b.weight("w", (256, 256))
    for i in range(7):
        b.weight(f"w{i}", (256, 256))
    wrong = b.build([b.tanh(b.matmul(x, w))])  # cheaper, but not the same function
    judged = judge_plans(slow, [("fast", fast), ("wrong", wrong)], slow.random_inputs(0), 1e-4, 1e-5, rounds=8,
                         budget_s=2.0)
    assert judged.kept == "optimized" and judged.plan == "fast"
    assert judged.speedup > 1.0 and judged.speedup_ci[0] > 1.0 and _in_ci(judged.speedup, judged.speedup_ci)
    bad = judged.checks[1]
    assert not bad.numerics_ok and bad.timing is None and "differ" in bad.reason


def test_choose_faster_keeps_only_a_confident_winner() -> None:
    import time

    def base() -> None:
        time.sleep(0.002)

    def slower() -> None:
        time.sleep(0.006)

    def faster() -> None:
        time.sleep(0.0002)

    assert choose_faster(base, [slower], (), rounds=6, budget_s=0.5, min_rounds=5).kept is None
    choice = choose_faster(base, [slower, faster], (), rounds=6, budget_s=0.5, min_rounds=5)
    assert choice.best == 1 and choice.kept == 1 and len(choice.screens) == 2
    assert choice.timing.rounds >= 5


def test_kernel_and_flop_counts_fold_weights_and_skip_views() -> None:
    b = GraphBuilder()
    x, w1, w2 = b.input("x", (4, 8)), b.weight("w1", (8, 8)), b.weight("w2", (8, 8))
    w = b.concat(1, w1, w2)  # weights only: folded at load, no kernel
    y = b.matmul(x, w)
    z = b.reshape(b.relu(y), (8, 8))  # a view: no kernel
    g = b.build([z])
    assert g.runtime_kernels() == 2  # the matmul and the relu
    assert g.runtime_flops() == pytest.approx(g.total_flops() - 0.0 - _flops_of_concat(g))


def _flops_of_concat(g: Graph) -> float:
    from eqsat import ops

    return sum(ops.flops(n.op, [g.shape(v) for v in n.inputs], n.attr) for n in g.nodes if n.op == "concat")


def test_roofline_launch_cost_override() -> None:
    fast, _ = _pair()
    kernels = fast.runtime_kernels()
    default = graph_cost(fast, cost_model("roofline", "h100"))
    none = graph_cost(fast, cost_model("roofline", "h100", launch_s=0.0))
    assert default - none == pytest.approx(kernels * 5e-6)


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]], str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


@pytest.mark.slow  # ~15 s; tests/test_optimize.py runs the command in the default suite
def test_optimize_reports_measured_and_predicted_with_the_kept_label(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _cli(["optimize", "nasrnn-small", "--json", "--repeats", "5", "--iterations", "3",
                            "--time-limit", "10", "--timing-budget", "2", "--device", "cpu-nominal"], capsys)
    assert code == 0, err
    (row,) = rows
    assert row["kept"] in ("optimized", "original")
    assert isinstance(row["measured_speedup"], float) and _in_ci(row["measured_speedup"], row["measured_speedup_ci"])
    assert isinstance(row["predicted_speedup"], float) and row["passes"] >= 5
    if row["kept"] == "original":
        assert row["answer_speedup"] == 1.0
    else:
        assert row["measured_speedup_ci"][0] > 1.0
    names = [c["name"] for c in row["candidates"]]
    assert names[0] == "ilp/roofline" and "greedy-dag" in names and "ilp/roofline-launch0" in names
    for c in row["candidates"]:
        if c["measured_speedup"] is not None:
            assert _in_ci(c["measured_speedup"], c["measured_speedup_ci"])
    assert set(row["launch_sensitivity"]) == {"0", "1", "5"}
    assert isinstance(row["kernels_original"], int) and row["flops_original"] > 0


@pytest.mark.parametrize("args", [["optimize", "nasrnn-small", "--repeats", "0"],
                                  ["optimize", "nasrnn-small", "--candidates", "nope"],
                                  ["bench", "tensat", "--passes", "0"],
                                  ["bench", "tensat", "--repeats", "2"]])
def test_bad_counts_are_one_error_line(args: list[str], capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.commands import bench
    from experiments.benchmarks import BENCHMARKS

    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)
    try:
        code = cli.main([*args, "--json"])
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    # one error line (argparse's own type checks print the usage above it, as for every flag)
    assert [line for line in err.splitlines() if "error:" in line] == [err.strip().splitlines()[-1]], err


def _row(model: str, kept: str = "optimized", speedup: float = 1.2) -> dict[str, Any]:
    from experiments.bench_tensat import pass_summary

    passes = [{"plan": "ilp/roofline", "kept": kept, "measured_speedup": speedup + d,
               "measured_speedup_ci": [speedup + d - 0.05, speedup + d + 0.05], "answer_speedup":
               speedup + d if kept == "optimized" else 1.0, "predicted_speedup": 1.5, "optimizer_s": 0.5 + d,
               "passes": 8, "candidates": [], "launch_sensitivity": {"0": 1.0, "1": 10.0, "5": 50.0},
               "kernels_original": 10, "kernels_eqsat": 7, "flops_original": 2e9, "flops_eqsat": 2.1e9}
              for d in (0.0, 0.01, -0.01)]
    return {"model": model, "k_multi": 1, "cost_model": "roofline/h100", "enodes": 10, "eclasses": 5,
            "saturate_s": 0.5, "extract_s": 0.1, "taso_s": 10.0, "taso_seconds_to_best": 4.0, "cost_original": 1.0,
            "cost_taso": 0.95, "cost_eqsat": 0.9, "cost_taso_long": None, "cost_greedy": 0.95,
            "speedup_eqsat": 1 / 0.9 - 1, "speedup_taso": 1 / 0.95 - 1, "reduction_eqsat": 0.1,
            "measured_original_s": 1e-3, "measured_eqsat_s": 9e-4, "numerics_ok": True, "device": "cpu:cpu",
            "taso_trace": [[0.0, 1.0]], "taso_long_trace": None, **pass_summary(passes)}


def test_rows_carry_measured_fields_with_mean_and_standard_error() -> None:
    row = _row("vgg")
    assert row["passes"] == 3 and row["kept"] == "optimized" and row["kept_passes"] == 3
    assert row["measured_speedup"] == pytest.approx(1.2)
    assert row["measured_speedup_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert _in_ci(row["measured_speedup"], row["measured_speedup_ci"])
    assert row["optimizer_s"] == pytest.approx(0.5) and row["optimizer_s_se"] > 0
    for key, kind in (("predicted_speedup", float), ("kernels_original", int), ("kernels_eqsat", int),
                      ("flops_original", float), ("flops_eqsat", float), ("launch_sensitivity", dict),
                      ("measured_speedup_ci", list)):
        assert isinstance(row[key], kind), key
    assert _row("vgg", kept="original")["answer_speedup"] == 1.0


def test_table_puts_measured_first_and_cites_the_paper(tmp_path: Any) -> None:
    from experiments.bench_tensat import PAPER, render_table, write_plots

    rows = [_row("vgg"), _row("squeezenet", kept="original", speedup=0.97)]
    text = render_table(rows, 1.0)
    header = next(line for line in text.splitlines() if line.startswith("| model |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[1].startswith("measured speedup") and columns[2] == "kept"
    assert all("predicted" in c for c in columns[2:] if "%" in c and "paper" not in c)
    assert "Tensat paper (Yang et al., MLSys 2021), Table 2" in text
    vgg = next(line for line in text.splitlines() if line.startswith("| vgg |"))
    cells = [c.strip() for c in vgg.strip("|").split("|")]
    assert cells[columns.index("Tensat % (paper)")] == str(PAPER["vgg"].tensat_speedup)
    assert cells[2] == "optimized (3/3)" and cells[1].startswith("1.200 ±")
    assert "| squeezenet |" in text and "original (0/3)" in text
    write_plots(rows, tmp_path)
    assert (tmp_path / "speedup.roofline-h100.png").stat().st_size > 1000


def test_the_commands_and_the_decorator_share_one_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """`judge_plans` decides through `jax_backend.timing.choose_faster`, the function the decorator
    calls: a stub that never keeps makes even a much faster plan lose."""
    from jax_backend import decorator_checks, timing

    assert decorator_checks.choose_faster is timing.choose_faster
    real = timing.choose_faster

    def never(*args: Any, **kwargs: Any) -> timing.Choice:
        choice = real(*args, **kwargs)
        worse = dataclasses.replace(choice.decision, verdict="inconclusive")
        return timing.Choice(choice.best, worse, choice.screens)

    monkeypatch.setattr(timing, "choose_faster", never)
    fast, slow = _pair()
    judged = judge_plans(slow, [("fast", fast)], slow.random_inputs(0), 1e-4, 1e-5, rounds=5, budget_s=1.0)
    assert judged.kept == "original"


def _relu_after(fused: bool, cout: int = 16) -> Graph:
    """relu(conv(x, w)) with the relu as its own op or folded into the conv's `act`."""
    b = GraphBuilder()
    x, w = b.input("x", (1, 8, 12, 12)), b.weight("w", (cout, 8, 3, 3))
    y = b.conv2d(x, w, act=2) if fused else b.relu(b.conv2d(x, w))
    return b.build([b.tanh(y)])


def test_a_plan_that_only_folds_activations_is_the_original_program() -> None:
    from eqsat.candidates import program_key, structure_key

    separate, fused = _relu_after(False), _relu_after(True)
    assert structure_key(separate) != structure_key(fused)  # different graphs ...
    assert program_key(separate) == program_key(fused)  # ... that lower to one program
    assert program_key(_relu_after(False, cout=24)) != program_key(separate)
    b = GraphBuilder()  # a fused tanh is not a relu
    x, w = b.input("x", (1, 8, 12, 12)), b.weight("w", (16, 8, 3, 3))
    assert program_key(b.build([b.tanh(b.conv2d(x, w, act=3))])) != program_key(separate)


def test_the_original_program_under_another_graph_is_not_timed() -> None:
    separate, fused = _relu_after(False), _relu_after(True)
    judged = judge_plans(separate, [("fused", fused)], separate.random_inputs(0), 1e-4, 1e-5, rounds=5, budget_s=0.5)
    (check,) = judged.checks
    assert check.same_as_original and check.timing is None
    assert judged.kept == "original" and judged.plan is None and judged.speedup == 1.0

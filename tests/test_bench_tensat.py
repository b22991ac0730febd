"""`eqsat bench tensat`: rows carry the contract's fields, the table puts the paper's numbers beside ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench_tensat import (
    PAPER,
    TENSAT_MODELS,
    BenchOptions,
    render_table,
    run_bench,
    write_plots,
)

CONTRACT = ("model", "k_multi", "enodes", "eclasses", "saturate_s", "extract_s", "taso_s", "cost_original",
            "cost_taso", "cost_eqsat", "cost_model", "measured_original_s", "measured_eqsat_s", "numerics_ok",
            "device", "rules_fired", "measured_speedup", "measured_speedup_ci", "predicted_speedup", "kept",
            "launch_sensitivity", "kernels_original", "kernels_eqsat", "flops_original", "flops_eqsat", "passes")


def _row(model: str, k: int, label: str, eqsat: float, taso: float) -> dict:  # type: ignore[type-arg]
    return {"model": model, "k_multi": k, "cost_model": label, "enodes": 10, "eclasses": 5, "saturate_s": 0.5,
            "extract_s": 0.1, "taso_s": 10.0, "taso_seconds_to_best": 4.0, "cost_original": 1.0,
            "cost_taso": taso, "cost_eqsat": eqsat, "cost_taso_long": taso, "cost_greedy": 0.95,
            "speedup_eqsat": 1 / eqsat - 1, "speedup_taso": 1 / taso - 1, "reduction_eqsat": 1 - eqsat,
            "measured_original_s": 1e-3, "measured_eqsat_s": 9e-4, "numerics_ok": True,
            "taso_trace": [[0.0, 1.0], [4.0, taso], [10.0, taso]], "taso_long_trace": None}


def test_paper_numbers_cover_the_seven_models() -> None:
    """Every Tensat model's row shows the paper's numbers under the paper's column headings."""
    assert set(PAPER) == set(TENSAT_MODELS)
    lines = render_table([_row(m, 1, "roofline/h100", 0.9, 0.95) for m in TENSAT_MODELS], 1.0).splitlines()
    header = [c.strip() for c in next(line for line in lines if line.startswith("| model |")).split("|")]
    for model in TENSAT_MODELS:
        cells = [c.strip() for c in next(line for line in lines if line.startswith(f"| {model} |")).split("|")]
        paper = PAPER[model]
        assert [cells[header.index(h)] for h in ("TASO s (paper)", "Tensat s (paper)", "TASO % (paper)",
                                                  "Tensat % (paper)")] == \
            [str(paper.taso_s), str(paper.tensat_s), str(paper.taso_speedup), str(paper.tensat_speedup)]


def test_table_and_plots(tmp_path: Path) -> None:
    rows = [_row(m, k, "roofline/h100", 0.9 - 0.01 * k, 0.95) for m in ("vgg", "squeezenet") for k in (0, 1, 2)]
    text = render_table(rows, 12.0)
    assert "| 8.9 | 8.9 | 0.4 | 8.9 |" in text and "| 24.5 | 6.7 | 0.3 | 16.4 |" in text  # the paper's, cited
    assert "Ours ≤ TASO-style (predicted cost) on 2/2 models, strictly lower on 2" in text
    write_plots(rows, tmp_path)
    for stem in ("speedup", "time", "extraction", "search_over_time", "k_multi"):
        assert (tmp_path / f"{stem}.roofline-h100.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_small_run_writes_rows_table_and_egraphs(tmp_path: Path) -> None:
    options = BenchOptions(models=("nasrnn-small",), cost_models=(("roofline", "h100"),), taso_seconds=30,
                           taso_budget=20, taso_long_seconds=0, repeats=5, passes=2, timing_budget=2.0)
    rows = list(run_bench(tmp_path, options))
    assert len(rows) == 1
    row = rows[0]
    assert set(CONTRACT) <= set(row)
    assert row["passes"] == 2 and row["kept"] in ("optimized", "original") and len(row["pass_results"]) == 2
    low, high = row["measured_speedup_ci"]
    assert low <= row["measured_speedup"] <= high
    assert row["numerics_ok"] and row["cost_eqsat"] < row["cost_original"]
    assert row["cost_eqsat"] <= row["cost_taso"]
    assert row["taso_popped"] == 20 and row["taso_stop"] == "budget" and row["taso_graphs_per_s"] > 0
    seconds = row["taso_seconds_to_our_cost"]
    assert seconds is None or 0 <= seconds <= row["taso_s"]
    assert any(v > 0 for v in row["rules_fired"].values())
    assert json.loads(Path(row["egraph_file"]).read_text())["nodes"]
    assert (tmp_path / "table.md").exists() and (tmp_path / "rows.jsonl").exists()


def test_cost_models_option_picks_the_columns() -> None:
    import argparse

    from eqsat.errors import EqsatError
    from experiments.bench_tensat import options_from_args

    args = argparse.Namespace(models=None, k_multi=[0, 1, 2], time_limit=5.0, taso_seconds=1.0, taso_long_seconds=0.0,
                              cost_models=["roofline/h100"])
    assert options_from_args(args).cost_models == (("roofline", "h100"),)
    assert options_from_args(args).k_multi == (0, 1, 2)
    with pytest.raises(EqsatError):
        options_from_args(argparse.Namespace(**{**vars(args), "cost_models": ["roofline"]}))


@pytest.mark.parametrize("pair", [("nope", "cpu"), ("roofline", "nope")])
def test_a_bad_cost_model_fails_before_any_work(tmp_path: Path, pair: tuple[str, str]) -> None:
    from eqsat.errors import EqsatError

    options = BenchOptions(models=("nasrnn",), cost_models=(("roofline", "h100"), pair))
    with pytest.raises(EqsatError, match="unknown"):
        next(iter(run_bench(tmp_path / "out", options)))
    assert not (tmp_path / "out").exists()


def test_taso_budget_flag_reaches_the_options(tmp_path: Path) -> None:
    import argparse

    from experiments.bench_tensat import options_from_args
    from experiments.benchmarks import _tensat_flags

    parser = argparse.ArgumentParser()
    _tensat_flags(parser)
    args = parser.parse_args(["--out", str(tmp_path), "--taso-budget", "37"])
    assert options_from_args(args).taso_budget == 37
    assert options_from_args(parser.parse_args(["--out", str(tmp_path)])).taso_budget == 1000
    assert options_from_args(args).taso_seconds == 600.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", str(tmp_path), "--taso-budget", "0"])


def test_conventions_and_rules_flags_reach_the_options(tmp_path: Path) -> None:
    """Both flags take one or several names from eqsat optimize's registries; one row set each."""
    import argparse

    from experiments.bench_tensat import options_from_args
    from experiments.benchmarks import _tensat_flags

    parser = argparse.ArgumentParser()
    _tensat_flags(parser)
    both = options_from_args(parser.parse_args(["--out", str(tmp_path), "--conventions", "ours", "tensat",
                                                "--rules", "default", "tensat-only"]))
    assert both.conventions == ("ours", "tensat") and both.rules == ("default", "tensat-only")
    plain = options_from_args(parser.parse_args(["--out", str(tmp_path)]))
    assert plain.conventions == ("ours",) and plain.rules == ("default",)


@pytest.mark.parametrize("flag,value,message", [("--conventions", "taso", "unknown conventions 'taso'"),
                                                ("--rules", "mine", "unknown rule set 'mine'")])
def test_an_unknown_convention_or_rule_set_is_one_line_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    from eqsat.cli import main

    out = tmp_path / "out"
    code = main(["bench", "tensat", "--models", "nasrnn", "--out", str(out), flag, "ours" if flag == "--conventions"
                 else "default", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err
    assert not out.exists() or not list(out.iterdir())  # --out checked writable, nothing run


def _variant_row(model: str, conv: str, rules: str, eqsat: float) -> dict:  # type: ignore[type-arg]
    return {**_row(model, 1, "roofline/cpu", eqsat, 0.95), "conventions": conv, "rules": rules,
            "predicted_speedup_as_run": 1 / eqsat - 1, "measured_speedup": 1.1, "measured_speedup_ci": [1.0, 1.2],
            "kept": "optimized", "kernels_original": 10, "kernels_eqsat": 8, "flops_original": 2e9, "flops_eqsat": 1e9}


def test_the_table_groups_by_conventions_and_rules_and_attributes_the_gains() -> None:
    variants = [(c, r) for r in ("default", "tensat-only") for c in ("ours", "tensat")]
    rows = [_variant_row(m, c, r, 0.8 + 0.05 * i) for m in ("bert", "inceptionv3") for i, (c, r) in enumerate(variants)]
    text = render_table(rows, 3.0)
    assert "## cost model roofline/cpu\n" in text  # ours + default: the heading it always had
    for c, r in variants[1:]:
        assert f"## cost model roofline/cpu, conventions {c}, rules {r}\n" in text
    assert "## Where the gains come from" in text
    attribution = text.split("## Where the gains come from")[1]
    assert "| roofline/cpu | bert | tensat | tensat-only | 5.3 | 5.3 |" in attribution  # 1 / 0.95 - 1
    assert sum(line.startswith("| roofline/cpu | ") for line in attribution.splitlines()) == 8
    assert "Where the gains come from" not in render_table(rows[:1], 1.0)  # one row set: no attribution


@pytest.mark.slow
def test_a_small_run_carries_conventions_and_rules(tmp_path: Path) -> None:
    options = BenchOptions(models=("nasrnn-small",), cost_models=(("roofline", "h100"),), taso_seconds=10,
                           taso_budget=2, taso_long_seconds=0, repeats=5, passes=1, timing_budget=0.5,
                           conventions=("ours", "tensat"), rules=("default", "tensat-only"))
    rows = list(run_bench(tmp_path, options))
    assert [(r["conventions"], r["rules"]) for r in rows] == [
        ("ours", "default"), ("tensat", "default"), ("ours", "tensat-only"), ("tensat", "tensat-only")]
    assert all(set(CONTRACT) <= set(r) and r["numerics_ok"] for r in rows)
    assert rows[2]["rules_used"] <= rows[0]["rules_used"]  # Tensat's rules alone are a subset
    assert "Where the gains come from" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "speedup.roofline-h100.png").exists()  # one row set per plot

"""The rest of Tensat's paper (`eqsat bench tensat --ablations`): the cycle filters find the same
pairs, real and integer order variables give the same optimum, bad option values are one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from eqsat.cost import cost_model
from eqsat.cycle_guard import CYCLE_FILTERS, ClassGraph, related_pairs, related_pairs_each
from eqsat.errors import EqsatError, ExtractionError, LimitError
from eqsat.extract import Status, check_selection, extract
from eqsat.extract.tensat_ilp import ORDER_VARS, tensat_ilp
from eqsat.ir import Graph, GraphBuilder
from eqsat.pipeline import optimize_graph
from eqsat.saturate import Limits

from .helpers import brute_force, egraph


def test_vanilla_and_efficient_filters_find_the_same_related_pairs() -> None:
    rng = random.Random(1)
    for _ in range(150):
        n = rng.randint(1, 20)
        children = [sorted({rng.randrange(n) for _ in range(rng.randint(0, 3))}) for _ in range(n)]
        uid_class = {u: rng.randrange(n) for u in range(rng.randint(1, 12))}
        uids = list(uid_class) + [99]  # 99: a uid with no class (always related: skipped)
        pairs = [(rng.choice(uids), rng.choice(uids), rng.choice((0, 0, 1))) for _ in range(rng.randint(0, 15))]
        graph = ClassGraph(children, uid_class, pairs)
        fast, each = related_pairs(graph), related_pairs_each(graph)
        assert (fast.recorded, fast.marked, fast.found) == (each.recorded, each.marked, each.found)


MERGE = ("(matmul 0 ?input_1 ?input_4)=>(split_0 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))",
         "(matmul 0 ?input_1 ?input_5)=>(split_1 (split 1 (matmul 0 ?input_1 (concat 1 2 ?input_4 ?input_5))))")


def _chain() -> Graph:
    """matmul(x, W) and matmul(x, tanh(matmul(x, W))) share x, but merging them would make a
    cycle; a third matmul of x is independent (see tests/test_saturate.py)."""
    b = GraphBuilder()
    x, w, v = b.input("x", (4, 4)), b.weight("w", (4, 4)), b.weight("v", (4, 4))
    second = b.matmul(x, b.tanh(b.matmul(x, w)))
    return b.build([second, b.matmul(x, v)])


def test_each_cycle_filter_gives_a_checked_graph_and_vanilla_equals_efficient() -> None:
    from eqsat.rewrites.parser import parse_rules

    graph, rules = _chain(), parse_rules(MERGE, "m", multi=True)
    costs = cost_model("roofline", device="cpu")
    results = {cf: optimize_graph(graph, rules, Limits(multi_rounds=1, cycle_filter=cf), costs, time_limit=10)
               for cf in CYCLE_FILTERS}
    eff, van, off = results["efficient"], results["vanilla"], results["off"]
    assert all(r.numerics_ok for r in results.values())
    assert (van.enodes, van.eclasses, van.cost_after) == (eff.enodes, eff.eclasses, eff.cost_after)
    assert [(it.pairs, it.cyclic_pairs) for it in eff.saturation.iterations if it.multi] == [(3, 1)]
    assert [(it.pairs, it.cyclic_pairs) for it in van.saturation.iterations if it.multi] == [(3, 1)]
    assert off.saturation.total_matches == {"m:1-2": 3} and eff.saturation.total_matches == {"m:1-2": 2}
    assert off.enodes > eff.enodes  # the cyclic merge was made
    assert off.cost_after == pytest.approx(eff.cost_after)  # and the extractor avoided its cycle
    assert eff.saturation.to_json()["limits"]["cycle_filter"] == "efficient"


def test_an_unknown_cycle_filter_or_order_variable_is_refused() -> None:
    with pytest.raises(LimitError, match="unknown cycle filter 'fast'; choose from efficient, vanilla, off"):
        Limits(cycle_filter="fast")
    eg = egraph({"A": [(1, [])]}, ["A"])
    with pytest.raises(ExtractionError, match="unknown order variables 'bool'"):
        tensat_ilp(eg, 5, order_vars="bool")


def test_real_and_integer_order_variables_give_the_same_optimum() -> None:
    rng = random.Random(3)
    for _ in range(8):
        names = [f"C{i}" for i in range(6)]
        spec = {c: [(float(rng.randint(1, 9)), rng.sample(names, rng.randint(0, 2))) for _ in range(rng.randint(1, 3))]
                for c in names}
        spec[names[-1]].append((5.0, []))  # a leaf somewhere, and every class can end in one
        for c in names:
            spec[c].append((20.0, []))
        eg = egraph(spec, names[:2])
        want = brute_force(eg)
        sels = {ov: extract(eg, "tensat-ilp" if ov == "real" else "tensat-ilp-int", 10) for ov in ORDER_VARS}
        for ov, sel in sels.items():
            assert check_selection(eg, sel) == [] and sel.status == Status.OPTIMAL
            assert sel.info["order_vars"] == ov
            assert sel.dag_cost == pytest.approx(want)


def test_bad_ablation_options_are_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from eqsat import cli
    from eqsat.commands import bench
    from experiments.benchmarks import BENCHMARKS

    monkeypatch.setattr(bench, "registered", lambda: BENCHMARKS)
    for bad in (["--cycle-filters", "fast"], ["--order-vars", "bool"], ["--models", "nope"],
                ["--cost-models", "roofline/h100", "xla/cpu"]):
        assert cli.main(["bench", "tensat", "--ablations", "--out", str(tmp_path / "o"), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "ablations" in err, err


def test_table_and_plot_from_rows(tmp_path: Path) -> None:
    from experiments.tensat_ablations import render_table, write_plot

    sat = {"kind": "saturation", "model": "m", "enodes": 10, "eclasses": 5, "saturate_s": 0.5, "filter_s": 0.1,
           "pairs": 4, "related_pairs": 2, "extract_s": 0.2, "stop_reason": "saturated", "cost_original": 2.0,
           "cost_ilp": 1.0, "predicted_gain_pct": 100.0, "cost_model": "roofline/cpu (FALLBACK)"}
    rows = [{**sat, "k_multi": k, "cycle_filter": cf} for k in (1, 2) for cf in CYCLE_FILTERS]
    rows += [{"kind": "ilp", "model": "m", "k_multi": 1, "cycle_filter": "off", "order_vars": ov, "status": "optimal",
              "solve_s": 0.3, "dag_cost": 1.0, "lower_bound": None, "ilp_dag_cost": 1.0, "order_rows": 7}
             for ov in ORDER_VARS]
    text = render_table(rows, 3.0, "roofline/cpu (FALLBACK)")
    assert "FALLBACK" in text and text.count("| m | 1 | vanilla |") == 1 and "| m | 1 | off | int | optimal |" in text
    write_plot(rows, tmp_path / "a.png", "roofline/cpu (FALLBACK)")
    assert (tmp_path / "a.png").stat().st_size > 0


def test_without_a_calibration_the_fallback_is_labelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.tensat_ablations import pick_cost_model

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))  # an empty cache: no calibration
    _, label = pick_cost_model(None)
    assert label.startswith("roofline/cpu (FALLBACK") and "eqsat calibrate" in capsys.readouterr().err
    with pytest.raises(EqsatError, match="calibrat"):
        pick_cost_model(("xla", "cpu"))


@pytest.mark.slow
def test_a_small_ablation_run_writes_rows_table_and_plot(tmp_path: Path) -> None:
    from experiments.tensat_ablations import AblationOptions, run_bench

    rows = list(run_bench(tmp_path, AblationOptions(models=("squeezenet",), k_multi=(1,), time_limit=10,
                                                    cost_model=("roofline", "cpu"))))
    sat = {r["cycle_filter"]: r for r in rows if r["kind"] == "saturation"}
    assert set(sat) == set(CYCLE_FILTERS) and sat["vanilla"]["enodes"] == sat["efficient"]["enodes"]
    ilp = [r for r in rows if r["kind"] == "ilp" and r["cycle_filter"] == "efficient"]
    assert {r["order_vars"] for r in ilp} == set(ORDER_VARS)
    assert ilp[0]["dag_cost"] == pytest.approx(ilp[1]["dag_cost"])
    assert len((tmp_path / "ablations.jsonl").read_text().splitlines()) == len(rows)
    assert json.loads((tmp_path / "ablations.jsonl").read_text().splitlines()[0])["kind"] == "saturation"
    assert (tmp_path / "ablations.png").exists() and "efficient" in (tmp_path / "ablations.md").read_text()

"""`eqsat bench tensat --ablations`: the rest of Tensat's evaluation (Yang et al., MLSys 2021) here.

- **Cycle filtering, efficient vs vanilla** (the paper's comparison; Tensat's `--filter_before`
  selects vanilla): the same saturation (`Limits.cycle_filter`) with the two-output rounds'
  related pairs found by one pass over the class graph ("efficient") or by a fresh search per pair
  ("vanilla", as Tensat's per-application check), and "off" (no filtering: the merges may make
  cycles, which the extractor avoids). Per model and k_multi: saturation time, time spent finding
  the related pairs, e-graph size, the ILP's cost.
- **ILP ordering variables, real vs integer** (`tensat-ilp` vs `tensat-ilp-int`, Tensat's
  `--order_var_int`): both on the same saturated e-graphs (with cycles allowed, as the paper's runs,
  and with the default filter): status, solve time, cost, lower bound.
- **E-graph sizes and the k_multi sweep**: e-nodes, e-classes, saturation and extraction time and
  the predicted gain per (model, k_multi).

Everything goes through the one search (`eqsat.pipeline.optimize_graph`) and the extractor registry,
with the rules `eqsat optimize` uses, under the calibrated "xla" cost model where a calibration is
cached (`eqsat calibrate`); without one it falls back to roofline/cpu and every row, the table and
the plot say so. Writes `DIR/ablations.jsonl`, `DIR/ablations.md` and `DIR/ablations.png`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqsat.cost import CostModel, cost_model
from eqsat.cycle_guard import CYCLE_FILTERS
from eqsat.errors import EqsatError

__all__ = ["AblationOptions", "DEFAULT_MODELS", "pick_cost_model", "render_table", "run_bench", "write_plot"]

DEFAULT_MODELS: tuple[str, ...] = ("squeezenet", "nasrnn", "bert")
ILP_NAMES: Mapping[str, str] = {"real": "tensat-ilp", "int": "tensat-ilp-int"}  # registry names, by order variables
ORDER_VARS: tuple[str, ...] = tuple(ILP_NAMES)
FALLBACK = ("roofline", "cpu")


@dataclass(frozen=True)
class AblationOptions:
    """What to run. `cost_model` None: the calibrated xla/cpu model, or roofline/cpu (labelled a
    fallback) where no calibration is cached. `ilp_on`: the e-graphs (by cycle filter) that the two
    tensat-ilp variants extract."""

    models: tuple[str, ...] = DEFAULT_MODELS
    k_multi: tuple[int, ...] = (1, 2)
    cycle_filters: tuple[str, ...] = CYCLE_FILTERS
    order_vars: tuple[str, ...] = ORDER_VARS
    ilp_on: tuple[str, ...] = ("off", "efficient")
    cost_model: tuple[str, str] | None = None
    time_limit: float = 60.0
    node_limit: int = 50_000
    saturate_seconds: float = 120.0

    def __post_init__(self) -> None:
        """Bad names are one error line (exit 2), before any work."""
        for flag, given, known in (("--cycle-filters", self.cycle_filters, CYCLE_FILTERS),
                                   ("--order-vars", self.order_vars, ORDER_VARS),
                                   ("--cycle-filters", self.ilp_on, CYCLE_FILTERS)):
            bad = [g for g in given if g not in known]
            if bad or not given:
                raise EqsatError(f"bench tensat --ablations: {flag} takes {', '.join(known)}, not "
                                 f"{', '.join(bad) or 'nothing'}")
        from eqsat.models import MODELS

        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise EqsatError(f"bench tensat --ablations: unknown model(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(MODELS)}")


def pick_cost_model(chosen: tuple[str, str] | None) -> tuple[CostModel, str]:
    """The cost model and its label: `chosen` as given (errors are one line), else xla/cpu where a
    calibration is cached, else roofline/cpu labelled as a fallback (and said on stderr)."""
    import jax_backend  # noqa: F401 - registers "xla" and "measured"
    from eqsat.xla_cost import CalibrationError

    if chosen is not None:
        return cost_model(chosen[0], device=chosen[1]), "/".join(chosen)
    try:
        return cost_model("xla", device="cpu"), "xla/cpu (calibrated)"
    except CalibrationError as exc:
        label = f"{'/'.join(FALLBACK)} (FALLBACK: no xla calibration cached; run `eqsat calibrate`)"
        print(f"eqsat: warning: {exc}; the ablations use {label}", file=sys.stderr)
        return cost_model(FALLBACK[0], device=FALLBACK[1]), label


def _gain(before: float, after: float) -> float:
    return 100 * (before / after - 1) if after > 0 else float("nan")


def _model_rows(name: str, options: AblationOptions, costs: CostModel, label: str) -> Iterator[dict[str, Any]]:
    from eqsat.extract.egraph_data import load_egraph
    from eqsat.extract.registry import extract
    from eqsat.models import build_model
    from eqsat.pipeline import optimize_graph
    from eqsat.saturate import Limits
    from experiments.bench_tensat import bench_rules

    graph = build_model(name)
    rules = bench_rules(graph)
    for k in options.k_multi:
        for cf in options.cycle_filters:
            limits = Limits(nodes=options.node_limit, seconds=options.saturate_seconds, multi_rounds=k, cycle_filter=cf)
            r = optimize_graph(graph, rules, limits, costs, extractor="ilp", time_limit=options.time_limit)
            its = r.saturation.iterations
            yield {"kind": "saturation", "model": name, "k_multi": k, "cycle_filter": cf, "cost_model": label,
                   "enodes": r.enodes, "eclasses": r.eclasses, "saturate_s": r.saturate_s,
                   "filter_s": sum(x.guard_seconds for x in its), "pairs": sum(x.pairs for x in its),
                   "related_pairs": sum(x.cyclic_pairs for x in its), "extract_s": r.extract_s,
                   "stop_reason": r.stop_reason, "cost_original": r.cost_before, "cost_ilp": r.cost_after,
                   "selection_status": r.selection_status, "predicted_gain_pct": _gain(r.cost_before, r.cost_after),
                   "numerics_ok": r.numerics_ok}
            if cf not in options.ilp_on or r.egraph_json is None:
                continue
            data = load_egraph(r.egraph_json)
            for ov in options.order_vars:
                sel = extract(data, ILP_NAMES[ov], options.time_limit)
                yield {"kind": "ilp", "model": name, "k_multi": k, "cycle_filter": cf, "cost_model": label,
                       "order_vars": ov, "extractor": ILP_NAMES[ov], "status": str(sel.status),
                       "solve_s": sel.seconds, "dag_cost": float(sel.dag_cost),
                       "lower_bound": sel.lower_bound, "ilp_dag_cost": r.extracted_cost,
                       "order_rows": sel.info.get("order_rows"), "enodes": r.enodes, "eclasses": r.eclasses}


def run_bench(out_dir: Path, options: AblationOptions = AblationOptions()) -> Iterator[dict[str, Any]]:
    """One row per (model, k_multi, cycle filter) and per (…, order variables); then the table and plot."""
    costs, label = pick_cost_model(options.cost_model)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for name in options.models:
        for row in _model_rows(name, options, costs, label):
            rows.append(row)
            yield row
    seconds = time.perf_counter() - start
    with (out_dir / "ablations.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (out_dir / "ablations.md").write_text(render_table(rows, seconds, label))
    write_plot(rows, out_dir / "ablations.png", label)


def _f(x: Any, digits: int = 2) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _g(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def render_table(rows: Sequence[Mapping[str, Any]], seconds: float, label: str) -> str:
    """Markdown: the cycle-filter comparison (with e-graph sizes and the k_multi sweep) and the ILP's
    real vs integer ordering variables."""
    sat = [r for r in rows if r["kind"] == "saturation"]
    ilp = [r for r in rows if r["kind"] == "ilp"]
    lines = [f"# The rest of Tensat's paper here (cost model {label}; whole run {seconds:.0f} s)", "",
             "Times are wall seconds on a shared machine (noisy). Cost = the cost model's DAG cost (predicted, "
             "not measured); gain % = cost_original ÷ cost − 1. Filter s = time finding the related pairs "
             "(included in saturate s). efficient: one pass over the class graph per two-output round; vanilla: "
             "a fresh search per pair (Tensat's `--filter_before`); off: no filtering (cycles left to the "
             "extractor).", "",
             "## Cycle filtering, e-graph sizes, k_multi sweep", "",
             "| model | k_multi | filter | saturate s | filter s | pairs | related | e-nodes | e-classes | "
             "extract s | cost | gain % | stop |", "|" + "---|" * 13]
    for r in sat:
        lines.append(f"| {r['model']} | {r['k_multi']} | {r['cycle_filter']} | {_f(r['saturate_s'])} | "
                     f"{_f(r['filter_s'], 3)} | {r['pairs']} | {r['related_pairs']} | {r['enodes']} | {r['eclasses']} | "
                     f"{_f(r['extract_s'])} | {r['cost_ilp']:.6g} | {_f(r['predicted_gain_pct'], 1)} | "
                     f"{r['stop_reason']} |")
    lines += ["", "## ILP ordering variables: real vs integer (tensat-ilp)", "",
              "| model | k_multi | e-graph (filter) | order vars | status | solve s | cost | lower bound | "
              "default ilp cost | order rows |", "|" + "---|" * 10]
    for r in ilp:
        lines.append(f"| {r['model']} | {r['k_multi']} | {r['cycle_filter']} | {r['order_vars']} | {r['status']} | "
                     f"{_f(r['solve_s'])} | {r['dag_cost']:.6g} | {_g(r['lower_bound'])} | "
                     f"{r['ilp_dag_cost']:.6g} | {r['order_rows']} |")
    return "\n".join(lines) + "\n"


def write_plot(rows: Sequence[Mapping[str, Any]], path: Path, label: str) -> None:
    """Three panels: saturation time per cycle filter, ILP solve time real vs int, e-nodes vs k_multi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sat = [r for r in rows if r["kind"] == "saturation"]
    ilp = [r for r in rows if r["kind"] == "ilp"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4.5))
    cases = list(dict.fromkeys((r["model"], r["k_multi"]) for r in sat))
    filters = list(dict.fromkeys(r["cycle_filter"] for r in sat))
    width = 0.8 / max(len(filters), 1)
    for i, cf in enumerate(filters):
        by = {(r["model"], r["k_multi"]): r["saturate_s"] for r in sat if r["cycle_filter"] == cf}
        xs = [j + width * (i - (len(filters) - 1) / 2) for j in range(len(cases))]
        a1.bar(xs, [by.get(c, 0.0) for c in cases], width=width, label=cf)
        guard = {(r["model"], r["k_multi"]): r["filter_s"] for r in sat if r["cycle_filter"] == cf}
        a1.bar(xs, [guard.get(c, 0.0) for c in cases], width=width / 2, color="black", alpha=0.5,
               label="of which filtering" if i == 0 else None)
    a1.set_xticks(list(range(len(cases))), [f"{m}\nk={k}" for m, k in cases], fontsize=7)
    a1.set_ylabel("saturation time, s")
    a1.set_yscale("log")
    a1.set_title("cycle filtering: saturation time (black: finding related pairs)", fontsize=9)
    a1.legend(fontsize="small")
    icases = list(dict.fromkeys((r["model"], r["k_multi"], r["cycle_filter"]) for r in ilp))
    kinds = list(dict.fromkeys(r["order_vars"] for r in ilp))
    width = 0.8 / max(len(kinds), 1)
    for i, ov in enumerate(kinds):
        iby = {(r["model"], r["k_multi"], r["cycle_filter"]): r["solve_s"] for r in ilp if r["order_vars"] == ov}
        a2.bar([j + width * (i - (len(kinds) - 1) / 2) for j in range(len(icases))],
               [iby.get(c, 0.0) for c in icases], width=width, label=f"{ov} t")
    a2.set_xticks(list(range(len(icases))), [f"{m} k={k} {cf}" for m, k, cf in icases], fontsize=7, rotation=45,
                  ha="right")
    a2.set_ylabel("tensat-ilp solve time, s")
    a2.set_yscale("log")
    a2.set_title("ILP ordering variables: real vs integer", fontsize=9)
    a2.legend(fontsize="small")
    main = "efficient" if "efficient" in filters else (filters[0] if filters else "")
    for n, model in enumerate(dict.fromkeys(r["model"] for r in sat)):
        for cf, style in ((main, "-"), ("off", "--")):
            rs = sorted((r for r in sat if r["model"] == model and r["cycle_filter"] == cf), key=lambda r: r["k_multi"])
            if rs and (cf == main or main != "off"):
                a3.plot([r["k_multi"] for r in rs], [r["enodes"] for r in rs], style, marker="o", color=f"C{n}",
                        label=f"{model} ({cf})")
    a3.set_xlabel("k_multi")
    a3.set_ylabel("e-nodes")
    a3.set_yscale("log")
    a3.set_title(f"e-graph size vs k_multi ({main} filter; dashed: off)", fontsize=9)
    a3.set_xticks(sorted({r["k_multi"] for r in sat}))
    a3.legend(fontsize="small")
    fig.suptitle(f"The rest of Tensat's paper, cost model {label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

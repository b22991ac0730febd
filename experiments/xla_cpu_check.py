"""Re-price saved CPU plans under xla calibrations, offline, beside their measured speedups (issue 24).

`eqsat optimize MODEL --cost-model xla --save-graphs DIR --json` rows hold per candidate plan its
measured speedup over the original (end to end, the one timing policy); `eqsat judge DIR --json`
rows do too. This script prices the saved plans (`DIR/MODEL.candidate.NAME.json`) under each
calibration file given, so two calibrations (before / after a model change) are compared on the
same measurements. Per model:

- the plans are deduplicated by the program they lower to (`eqsat.candidates.program_key`): a plan
  that only folds activations into their producers is the original program, and two candidates of
  one program are one plan (the measured spread between them is noise, not a ranking); the count of
  distinct plans, the original included, is reported;
- the xla ILP plan (`ilp-xla`) and the late layout phase's plan (`layout`, `eqsat.layout_phase`):
  predicted and measured speedup, the points between them (a plan that is the original program is
  predicted and measured 1 by definition, and says so);
- the plan the model ranks first among the distinct plans, with its measured speedup;
- Spearman's rank correlation over the distinct plans, the original included: undefined (not a
  number) with fewer than 3 distinct plans or a constant side.

    python -m experiments.xla_cpu_check --calibrations old.json new.json \
        --runs /tmp/judge-nasrnn.json ... --plans /tmp/plans

`--add-layout-plans MODEL...` first writes, for each saved plan of those models (and the original),
its late-layout form (`eqsat.layout_phase.nhwc_plan`, as `eqsat optimize` runs it on the ILP's
answer) as `MODEL.candidate.layout-BASE.json` (`layout` for the xla ILP plan's), skipping a form
whose program is already there; then judge the folder (`eqsat judge DIR --json`) and price it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eqsat.candidates import program_key
from eqsat.cost import predicted_speedup
from eqsat.ir import Graph
from eqsat.xla_cost import CALIBRATION_FORMAT, Calibration, XlaModel
from jax_backend.calibration_check import spearman

ILP = "ilp-xla"  # the xla ILP plan's file name (`ilp/xla` in optimize rows)
LAYOUT = "layout"  # the late layout phase's plan (the ILP plan with its convs NHWC)
WITHIN = 0.05  # the target: predicted within ±5 points of measured
ORIGINAL = "original"


@dataclass(frozen=True)
class Plan:
    """One distinct program of a model: the candidate names that lower to it, predicted and measured."""

    names: tuple[str, ...]
    predicted: float
    measured: float
    ci: tuple[float, float] | None  # None: the original program (not timed against itself)


def distinct_plans(cal: Calibration, plans: Path, row: dict[str, Any]) -> list[Plan]:
    """The model's distinct programs (the original first), each priced under `cal` and given the
    measured speedup of the first of its candidates in `row` that was timed (ILP, layout, then the
    rest in the row's order)."""
    xla = XlaModel(cal)
    name = row["model"]
    original = Graph.load(plans / f"{name}.before.json")
    found: dict[Any, Plan] = {program_key(original): Plan((ORIGINAL,), 1.0, 1.0, None)}
    order = {ILP: 0, LAYOUT: 1}
    for cand in sorted(row["candidates"], key=lambda c: order.get(c["name"].replace("/", "-"), 2)):
        label = cand["name"].replace("/", "-")
        path = plans / f"{name}.candidate.{label}.json"
        if not path.exists() or not cand.get("numerics_ok", True):
            continue
        graph = Graph.load(path)
        key = program_key(graph)
        if key in found:
            found[key] = replace(found[key], names=(*found[key].names, label))
        elif cand.get("measured_speedup") is not None:
            ci = cand.get("measured_speedup_ci")
            found[key] = Plan((label,), predicted_speedup(original, graph, xla) or math.nan, cand["measured_speedup"],
                              tuple(ci) if ci else None)
    return list(found.values())


def _named(plans: Sequence[Plan], label: str) -> dict[str, Any]:
    plan = next((p for p in plans if label in p.names), None)
    if plan is None:
        return {}
    return {"predicted": plan.predicted, "measured": plan.measured, "ci": plan.ci,
            "points_off": 100 * (plan.predicted - plan.measured), "original_program": ORIGINAL in plan.names}


def model_rows(cal: Calibration, plans: Path, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model row: the ILP and layout plans' predicted / measured speedups, the model's first
    choice, the distinct plan count and Spearman over them (NaN: undefined)."""
    out = []
    for row in rows:
        found = distinct_plans(cal, plans, row)
        best = max(found, key=lambda p: p.predicted)
        rho = spearman([p.predicted for p in found], [p.measured for p in found]) if len(found) >= 3 else math.nan
        out.append({"model": row["model"], "ilp": _named(found, ILP), "layout": _named(found, LAYOUT),
                    "first_choice": {"names": best.names, "predicted": best.predicted, "measured": best.measured,
                                     "ci": best.ci, "points_off": 100 * (best.predicted - best.measured)},
                    "plans": len(found), "spearman": rho, "pairs": found})
    return out


def add_layout_plans(plans: Path, model: str) -> list[str]:
    """Write the late-layout form of each of `model`'s saved plans (see the module docstring); the
    names written."""
    from eqsat.layout_phase import nhwc_plan

    bases = {"before": plans / f"{model}.before.json"}
    bases |= {p.name.split(".candidate.")[1][: -len(".json")]: p
              for p in sorted(plans.glob(f"{model}.candidate.*.json")) if ".candidate.layout" not in p.name}
    seen = {program_key(Graph.load(p)) for p in plans.glob(f"{model}.candidate.*.json")}
    seen.add(program_key(Graph.load(bases["before"])))
    written = []
    for base in sorted(bases, key=lambda b: b != ILP):  # the ILP plan's first: it is `eqsat optimize`'s `layout`
        found, _ = nhwc_plan(Graph.load(bases[base]), "cpu")
        if found is None or program_key(found) in seen:
            continue
        seen.add(program_key(found))
        name = LAYOUT if base == ILP else f"layout-{base}"
        found.save(plans / f"{model}.candidate.{name}.json")
        written.append(name)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrations", type=Path, nargs="+", default=[])
    parser.add_argument("--plans", type=Path, required=True, help="the --save-graphs folder")
    parser.add_argument("--runs", type=Path, nargs="+", default=[], help="optimize or judge --json rows")
    parser.add_argument("--add-layout-plans", nargs="+", default=[], metavar="MODEL",
                        help="only write the late-layout form of each saved plan of these models")
    parser.add_argument("--variants", action="store_true",
                        help="also price each calibration without its later curves (the format-4 and -3 models)")
    args = parser.parse_args(argv)
    if args.add_layout_plans:
        for model in args.add_layout_plans:
            print(model, "wrote:", ", ".join(add_layout_plans(args.plans, model)) or "nothing new")
        return
    if not args.calibrations or not args.runs:
        parser.error("--calibrations and --runs are needed to price plans")
    rows = [json.loads(line) for run in args.runs for line in run.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("{")]
    for path in args.calibrations:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == "eqsat-xla-calibration-4":  # measured before the conv surfaces
            data = {**data, "format": "eqsat-xla-calibration-5", "conv1x1": None, "conv1x1_nhwc": None}
        if data.get("format") == "eqsat-xla-calibration-5":  # measured before the (k, n) mat-vec grid
            data = {**data, "format": "eqsat-xla-calibration-6", "gemv_kn": None}
        if data.get("format") == "eqsat-xla-calibration-6":  # measured before the transpose probe: loop bandwidth
            data = {**data, "format": "eqsat-xla-calibration-7", "transpose_bandwidth": 0.0}
        if data.get("format") == "eqsat-xla-calibration-7":  # transposes probed alone (as returned): the old prices
            data = {**data, "format": "eqsat-xla-calibration-8", "transpose_act": None}
        if data.get("format") == "eqsat-xla-calibration-8":  # measured before the depthwise curve: dense rates
            data = {**data, "format": "eqsat-xla-calibration-9", "dwconv": None}
        if data.get("format") == "eqsat-xla-calibration-9":  # dots chained on cached weights: the same fields
            data = {**data, "format": "eqsat-xla-calibration-10"}
        if data.get("format") == "eqsat-xla-calibration-10" and "gconv_rates" not in data:  # before group widths
            data = {**data, "gconv_rates": []}
        if data.get("format") == "eqsat-xla-calibration-10":  # before the 2048- and 3072-wide dots: the same fields
            data = {**data, "format": "eqsat-xla-calibration-11"}
        if data.get("format") == "eqsat-xla-calibration-11":  # weight transposes probed in cache: the same fields
            data = {**data, "format": "eqsat-xla-calibration-12"}
        if data.get("format") == "eqsat-xla-calibration-12":  # depthwise convs by flops on their curve
            data = {**data, "format": CALIBRATION_FORMAT, "dwconv_taps": None}
        measured = Calibration.from_json(data)
        report(f"{path}: as measured", measured, args.plans, rows)
        if args.variants and measured.transpose_2d is not None and measured.transpose_kxk is not None:
            curves = (measured.transpose_2d, measured.transpose_kxk)
            pooled = 2.0 * sum(sum(c.flops) for c in curves) / sum(sum(c.seconds) for c in curves)
            report(f"{path}: transposes at one bandwidth ({pooled / 1e9:.2f} GB/s, all the probes pooled)",
                   replace(measured, transpose_2d=None, transpose_kxk=None, transpose_act=None,
                           transpose_bandwidth=pooled), args.plans, rows)
        if args.variants and measured.gemv_kn is not None:
            report(f"{path}: mat-vecs by width alone (the format-5 model)", replace(measured, gemv_kn=None), args.plans,
                   rows)
        if args.variants:
            report(f"{path}: without the conv surfaces (the format-4 model: convs by flops)",
                   replace(measured, conv1x1=None, conv1x1_nhwc=None, gemv_kn=None), args.plans, rows)
            report(f"{path}: without the gemv, NHWC and 1x1 curves (the format-3 model)",
                   replace(measured, gemv=None, conv_nhwc=None, gconv_nhwc=None, conv1x1=None, conv1x1_nhwc=None,
                           gemv_kn=None),
                   args.plans, rows)


def _cell(r: dict[str, Any]) -> str:
    if not r:
        return "— | — | —"
    if r.get("original_program"):
        return "the original program | 1 (not timed) | 0"
    ci = r.get("ci") or (math.nan, math.nan)
    return f"{r['predicted']:.3f} | {r['measured']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {r['points_off']:+.1f}"


def report(title: str, cal: Calibration, plans: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Print one calibration's table (markdown) and each model's distinct plans."""
    print(f"\n## {title}")
    print("| model | ILP plan predicted | measured [95% CI] | points off | layout plan predicted | measured [95% CI] "
          "| points off | model's first choice: predicted / measured | distinct plans | Spearman |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in model_rows(cal, plans, rows):
        rho = "undefined" if math.isnan(r["spearman"]) else f"{r['spearman']:.2f}"
        first = r["first_choice"]
        print(f"| {r['model']} | {_cell(r['ilp'])} | {_cell(r['layout'])} | {'/'.join(first['names'])}: "
              f"{first['predicted']:.3f} / {first['measured']:.3f} | {r['plans']} | {rho} |")
        print("  plans (names: predicted, measured): " + "; ".join(
            f"{'='.join(p.names)}: {p.predicted:.3f}, {p.measured:.3f}" for p in r["pairs"]))


if __name__ == "__main__":
    main()

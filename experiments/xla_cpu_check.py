"""Re-price saved CPU plans under xla calibrations, offline, beside their measured speedups (issue 24).

`eqsat optimize MODEL --cost-model xla --save-graphs DIR --json` rows hold per candidate plan its
measured speedup over the original (end to end, the one timing policy); `eqsat judge DIR --json`
rows do too. This script prices the saved plans (`DIR/MODEL.candidate.NAME.json`) under each
calibration file given, so two calibrations (before / after a model change) are compared on the
same measurements: per model the xla ILP plan's predicted and measured speedup, the points
between them, and Spearman's rank correlation over the model's distinct plans, the original
included (as `eqsat calibrate --check` reports it).

    python -m experiments.xla_cpu_check --calibrations old.json new.json \
        --runs /tmp/opt-nasrnn.json ... --plans /tmp/plans-def
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eqsat.candidates import structure_key
from eqsat.cost import predicted_speedup
from eqsat.ir import Graph
from eqsat.xla_cost import CALIBRATION_FORMAT, Calibration, XlaModel
from jax_backend.calibration_check import spearman

ILP = "ilp-xla"  # the xla ILP plan's file name (`ilp/xla` in optimize rows)
WITHIN = 0.05  # the issue's target: predicted within ±5 points of measured


def model_rows(cal: Calibration, plans: Path, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model row: the ILP plan's predicted / measured speedup and Spearman over distinct plans."""
    xla = XlaModel(cal)
    out = []
    for row in rows:
        name = row["model"]
        original = Graph.load(plans / f"{name}.before.json")
        seen: dict[Any, tuple[float, float]] = {structure_key(original): (1.0, 1.0)}
        ilp: dict[str, Any] = {}
        for cand in row["candidates"]:
            if cand.get("measured_speedup") is None:
                continue
            label = cand["name"].replace("/", "-")
            graph = Graph.load(plans / f"{name}.candidate.{label}.json")
            pred = predicted_speedup(original, graph, xla) or math.nan
            seen.setdefault(structure_key(graph), (pred, cand["measured_speedup"]))
            if label == ILP:
                ilp = {"predicted": pred, "measured": cand["measured_speedup"],
                       "ci": cand.get("measured_speedup_ci")}
        pairs = list(seen.values())
        out.append({"model": name, **ilp, "points_off": 100 * (ilp["predicted"] - ilp["measured"]) if ilp else None,
                    "plans": len(pairs), "spearman": spearman(*zip(*pairs)) if len(pairs) > 2 else math.nan,
                    "pairs": pairs})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrations", type=Path, nargs="+", required=True)
    parser.add_argument("--plans", type=Path, required=True, help="the --save-graphs folder")
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="optimize or judge --json rows")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for run in args.runs for line in run.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("{")]
    for path in args.calibrations:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == "eqsat-xla-calibration-4":  # measured before the conv surfaces
            data = {**data, "format": CALIBRATION_FORMAT, "conv1x1": None, "conv1x1_nhwc": None}
        measured = Calibration.from_json(data)
        for label, cal in (("as measured", measured),
                           ("without the conv surfaces (the format-4 model: convs by flops)",
                            replace(measured, conv1x1=None, conv1x1_nhwc=None)),
                           ("without the gemv, NHWC and 1x1 curves (the format-3 model)",
                            replace(measured, gemv=None, conv_nhwc=None, gconv_nhwc=None, conv1x1=None,
                                    conv1x1_nhwc=None))):
            report(f"{path}: {label}", cal, args.plans, rows)


def report(title: str, cal: Calibration, plans: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Print one calibration's table (markdown) and each model's (predicted, measured) pairs."""
    print(f"\n## {title}")
    print("| model | ILP plan predicted | measured [95% CI] | points off | Spearman (plans) |")
    print("|---|---|---|---|---|")
    for r in model_rows(cal, plans, rows):
        ci = r.get("ci") or [math.nan, math.nan]
        print(f"| {r['model']} | {r.get('predicted', math.nan):.3f} | {r.get('measured', math.nan):.3f} "
              f"[{ci[0]:.3f}, {ci[1]:.3f}] | {r['points_off'] or math.nan:+.1f} | {r['spearman']:.2f} "
              f"({r['plans']}) |")
        print("  plans (predicted, measured): " + ", ".join(f"({p:.3f}, {m:.3f})" for p, m in r["pairs"]))


if __name__ == "__main__":
    main()

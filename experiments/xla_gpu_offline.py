"""Re-price stored GPU judge rows with the xla model, offline (issue 24).

`eqsat judge --xla-device DEV --json` rows hold, per model, the original's measured time and per
candidate plan its measured speedup. This script prices the same saved plans (the folders given
to that judge) under a calibration file and sets predicted beside measured: per model the
original's absolute time (ms), the ILP plan's predicted and measured speedup, and the rank
correlation over all candidates.

The calibration may be a format-2 file (before kernel floors); then the floors it lacks are the
`--floor-us` PLACEHOLDER (loop, copy and pool kernels), the dot and conv floors are its curves'
smallest measured calls, and the per-call time is `--call-us` (a PLACEHOLDER too, unless it
was measured). A format-3 or -4 file (what `eqsat calibrate` writes) is used as it is.

    python -m experiments.xla_gpu_offline docs/data/tensat_h200/calibration_h200.json PLANS \
        docs/data/tensat_h200/judge_run1.jsonl docs/data/tensat_h200/judge_run2.jsonl --floor-us 0.63 2 3
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from eqsat.cost import predicted_speedup
from eqsat.ir import Graph
from eqsat.xla_cost import CALIBRATION_FORMAT, Calibration, Curve, XlaModel, fit_chain
from jax_backend.calibration_check import spearman

ILP = "default/ilp-roofline"
WITHIN = 0.05  # the target: predicted within ±5 points of measured


def calibration(path: Path, floor_us: float | None, call_us: float) -> tuple[Calibration, str]:
    """The calibration at `path`, and how its floors were obtained (measured or PLACEHOLDER)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") == "eqsat-xla-calibration-3":  # measured before the gemv and NHWC curves
        data = {**data, "format": "eqsat-xla-calibration-4", "gemv": None, "conv_nhwc": None, "gconv_nhwc": None}
    if data.get("format") == "eqsat-xla-calibration-4":  # measured before the conv surfaces
        data = {**data, "format": "eqsat-xla-calibration-5", "conv1x1": None, "conv1x1_nhwc": None}
    if data.get("format") == "eqsat-xla-calibration-5":  # measured before the (k, n) mat-vec grid
        data = {**data, "format": CALIBRATION_FORMAT, "gemv_kn": None}
    if data.get("format") == CALIBRATION_FORMAT and floor_us is None:
        return Calibration.from_json(data), "measured (format 3, 4, 5 or 6)"
    fields = {k: data[k] for k in ("launch_s", "bandwidth", "loop_flops", "weight_bandwidth")}
    cal = Calibration.from_json({**data, "format": CALIBRATION_FORMAT, **fields, "copy_s": 0, "kernel_s": 0,
                                 "dot_s": 0, "conv_s": 0, "call_s": call_us * 1e-6, "gconv": None, "gemv": None,
                                 "conv_nhwc": None, "gconv_nhwc": None, "conv1x1": None, "conv1x1_nhwc": None,
                                 "gemv_kn": None})
    if floor_us is not None:
        f = floor_us * 1e-6
        cal = replace(cal, launch_s=f, copy_s=f, kernel_s=f)
    return cal, (f"PLACEHOLDER loop/copy/pool floor {floor_us} us, call {call_us} us; dot/conv floors = the "
                 "curves' smallest calls")


CHAIN_KINDS = {"loop": "launch_s", "copy": "copy_s", "kernel": "kernel_s", "dot": "dot_s", "conv": "conv_s"}


GROUPED = {"g32x512": ((1, 512, 14, 14), (512, 16, 3, 3)), "g32x128": ((1, 128, 56, 56), (128, 4, 3, 3))}
"""The grouped convs of `hlo_and_probes2_h200.json` (ResNeXt-50's two kinds)."""


def from_probes(path: Path, probes: Sequence[Path]) -> tuple[Calibration, str]:
    """A format-3 calibration from the format-2 file at `path` (bandwidths, loop rate) and the raw
    chain timings `probes` measured on the same device (`docs/data/tensat_h200/probes_h200.json`):
    per kind {kernels: seconds} of barrier-separated chains, and per dot or conv shape {links:
    seconds} of a chain of calls. The floors are `fit_chain`'s; the curves take each shape's
    marginal call from its two longest chains (where the device, not dispatch, is the bottleneck).
    A second file (`hlo_and_probes2_h200.json`) adds the loop chain timed to completion
    (`loop_blocking`: the floor and call time as `eqsat calibrate` now measures them) and grouped
    convs (one flop count: the curve is that point, flat below it and at its rate above)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    raw: dict[str, Any] = {}
    for probe in probes:
        raw.update(json.loads(probe.read_text(encoding="utf-8")))
    fits = {kind: fit_chain([(int(n), t) for n, t in raw[kind].items()]) for kind in CHAIN_KINDS}
    curves: dict[str, list[tuple[float, float]]] = {"matmul": [], "conv": [], "gconv": []}
    for key, chain in raw.items():
        if key in CHAIN_KINDS or not isinstance(chain, dict) or "hlo" in chain:
            continue
        (n1, t1), (n2, t2) = sorted((int(n), t) for n, t in chain.items())[-2:]
        marginal = max((t2 - t1) / (n2 - n1), 1e-9)
        dims = [] if key in GROUPED else [int(x) for x in key.lstrip("abcdgmvw").split("x")]
        if key.startswith("mm"):
            m, k = dims
            curves["matmul"].append((2.0 * m * k * k, marginal))
        elif key.startswith("bmm"):
            b, n = dims
            curves["matmul"].append((2.0 * b * n * n * n, marginal))
        elif key in GROUPED:
            shapes = GROUPED[key]
            x, w = shapes
            curves["gconv"].append((2.0 * x[1] * w[1] * 9 * x[2] * x[3], marginal))
        elif key.startswith("gc"):
            c, h, width = dims
            curves["gconv"].append((2.0 * c * width * 9 * h * h, marginal))
        elif key.startswith("cv"):
            c, h, q = dims
            curves["conv"].append((2.0 * c * c * q * q * h * h, marginal))
    floors = {field: fits[kind].floor_s for kind, field in CHAIN_KINDS.items()}
    call = fits["loop"].call_s
    how = "loop chain's intercept"
    if "loop_blocking" in raw:  # (1, 64, 256) kernels, each call to completion
        blocking = fit_chain(list(zip((1, 64, 256), raw["loop_blocking"])), device_bound=2)
        floors["launch_s"], call, how = blocking.floor_s, blocking.call_s, "loop chain timed to completion"
    gconv: Curve | None = None
    if len({fl for fl, _ in curves["gconv"]}) > 1:
        gconv = Curve.fit(curves["gconv"])
    elif curves["gconv"]:
        fl, t = (math.exp(sum(math.log(pt[i]) for pt in curves["gconv"]) / len(curves["gconv"])) for i in (0, 1))
        gconv = Curve((fl, 2 * fl), (t, 2 * t))
    cal = Calibration(str(data["machine"]), str(data["device"]), floors["launch_s"], data["bandwidth"],
                      data["loop_flops"], Curve.fit(curves["matmul"]), Curve.fit(curves["conv"]), 0.0,
                      data["weight_bandwidth"], floors["copy_s"], floors["kernel_s"], floors["dot_s"], floors["conv_s"],
                      call, gconv)
    return cal, f"measured on the H200 (chain probes; loop floor and call time from the {how}) + the format-2 file's bandwidths"


def plan_path(folder: Path, model: str, name: str) -> Path:
    sub, _, cand = name.rpartition("/")  # "default/greedy-dag", or "greedy-dag" when one folder was judged
    return folder / (sub or "default") / f"{model}.candidate.{cand}.json"


def report(cal: Calibration, plans: Path, runs: Sequence[Path]) -> dict[str, Any]:
    model = XlaModel(cal)
    rows = [json.loads(line) for run in runs for line in run.read_text(encoding="utf-8").splitlines() if line.strip()]
    pooled: list[tuple[float, float]] = []
    out: dict[str, Any] = {"models": {}}
    for row in rows:
        name = row["model"]
        original = Graph.load(plans / "default" / f"{name}.before.json")
        entry = out["models"].setdefault(name, {"measured_ms": [], "predicted_ms": model.program_seconds(original) * 1e3,
                                                "ilp": [], "pairs": []})
        entry["measured_ms"].append(row["measured_before_s"] * 1e3)
        for cand in row["candidates"]:
            if cand["measured_speedup"] is None:
                continue
            p = predicted_speedup(original, Graph.load(plan_path(plans, name, cand["name"])), model) or math.nan
            entry["pairs"].append((p, cand["measured_speedup"]))
            pooled.append((p, cand["measured_speedup"]))
            if cand["name"].rpartition("/")[2] == ILP.rpartition("/")[2] and not cand["name"].startswith("tensatonly/"):
                entry["ilp"].append((p, cand["measured_speedup"]))
    within = 0
    for entry in out["models"].values():
        ok = abs(entry["ilp"][0][0] - sum(m for _, m in entry["ilp"]) / len(entry["ilp"])) <= WITHIN
        entry["within"] = ok
        within += ok
        entry["spearman"] = spearman(*zip(*entry["pairs"]))
    out["within"] = within
    out["pooled_spearman"] = spearman(*zip(*pooled))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("calibration", type=Path)
    parser.add_argument("plans", type=Path, help="the folder holding default/ and tensatonly/ (the judged plans)")
    parser.add_argument("runs", type=Path, nargs="+", help="judge --json rows")
    parser.add_argument("--floor-us", type=float, nargs="*", default=[],
                        help="PLACEHOLDER loop/copy/pool floors to try (a format-2 calibration has none)")
    parser.add_argument("--probes", type=Path, nargs="*", default=None,
                        help="raw chain timings measured on the device (with a format-2 calibration): no placeholders")
    parser.add_argument("--call-us", type=float, default=52.6,
                        help="per-call time for a format-2 calibration (default: the H200 log's dispatch line)")
    args = parser.parse_args(argv)
    for floor in args.floor_us or [None]:
        cal, how = (from_probes(args.calibration, args.probes) if args.probes
                    else calibration(args.calibration, floor, args.call_us))
        print(f"\n{how}: floors (us) " + ", ".join(f"{k} {v * 1e6:.2f}" for k, v in cal.floors.items())
              + f"; call {cal.call_s * 1e6:.1f} us; matmul curve (us) "
              + ", ".join(f"{f:.3g}:{t * 1e6:.1f}" for f, t in zip(cal.matmul.flops, cal.matmul.seconds))
              + "; conv curve (us) " + ", ".join(f"{f:.3g}:{t * 1e6:.1f}" for f, t in zip(cal.conv.flops, cal.conv.seconds)))
        res = report(cal, args.plans, args.runs)
        print(f"\n## {how}: {res['within']}/{len(res['models'])} within ±5 pts (ILP plan, mean of the runs); pooled Spearman "
              f"{res['pooled_spearman']:.3f}")
        print("| model | original ms measured | predicted | ILP plan predicted / measured (per run) | within | Spearman |")
        print("|---|---|---|---|---|---|")
        for name, e in res["models"].items():
            ilp = ", ".join(f"{p:.3f} / {m:.3f}" for p, m in e["ilp"])
            print(f"| {name} | {' / '.join(f'{x:.3f}' for x in e['measured_ms'])} | {e['predicted_ms']:.3f} | {ilp} | "
                  f"{'yes' if e['within'] else 'no'} | {e['spearman']:.2f} |")


if __name__ == "__main__":
    main()

"""A program written anew for stop 47 (not a built-in case): a gated residual MLP over 4096 tokens, four blocks of
relu(h @ Wu) * (h @ Wg) @ Wd added back to h. Its random plans allocate from about 30 to several hundred MB per
device, so they lie on both sides of the fresh-bytes curve's cut. Each plan's step is timed on the 2x4 mesh's 8 CPU
devices and priced by the calibrated model with the curve and with one flat rate (the curve's lower level, the model
before stop 47). Run from the repository root after `eqsat parallel calibrate --mesh 2x4`:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/data/parallel_spearman/s20/gated_mlp_check.py OUT.json
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from eqsat.ir import GraphBuilder
from eqsat.parallel.calibration import calibrated_model
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import plan_report
from experiments.bench_parallel import distinct_random_plans
from jax_backend.calibration_check import spearman
from jax_backend.parallel_calibrate import load_mesh_calibration, step_seconds


def gated_mlp(tokens: int = 4096, d: int = 256, hidden: int = 1024, blocks: int = 4) -> object:
    b = GraphBuilder()
    h = b.input("x", (tokens, d))
    for k in range(blocks):
        up = b.matmul(h, b.weight(f"up{k}", (d, hidden)), act=2)
        gate = b.matmul(h, b.weight(f"gate{k}", (d, hidden)))
        h = b.ewadd(h, b.matmul(b.ewmul(up, gate), b.weight(f"down{k}", (hidden, d))))
    return b.build([h])


def main(out: str, count: int = 10) -> None:
    mesh = parse_mesh("2x4")
    cal, _ = load_mesh_calibration(mesh, measure_if_missing=False)
    graph = gated_mlp()
    _, chosen = distinct_random_plans(graph, mesh, count)  # drawn as the spearman bench draws a case's plans
    curve = calibrated_model(cal, overlap=False)
    flat = replace(curve, fresh_curve=None)  # every step at the lower level: the model before the curve
    reports = [plan_report(p, curve) for p in chosen]
    timings = step_seconds(graph, chosen, mesh, budget_s=6.0, rounds=40, rel_width=0.05)
    measured = [t.seconds for t in timings]
    row = {
        "program": "gated-mlp",
        "plans": len(chosen),
        "cut_bytes": curve.fresh_curve.cut if curve.fresh_curve else None,
        "fresh_bytes": [r.fresh_bytes for r in reports],
        "measured_ms": [m * 1e3 for m in measured],
        "measured_low_ms": [t.low * 1e3 for t in timings],
        "measured_high_ms": [t.high * 1e3 for t in timings],
        "predicted_curve_ms": [r.step_s * 1e3 for r in reports],
        "predicted_flat_ms": [plan_report(p, flat).step_s * 1e3 for p in chosen],
        "spearman_curve": spearman([r.step_s for r in reports], measured),
        "spearman_flat": spearman([plan_report(p, flat).step_s for p in chosen], measured),
        "spearman_measured_halves": spearman([t.halves[0] for t in timings], [t.halves[1] for t in timings]),
    }
    Path(out).write_text(json.dumps(row))
    print({k: row[k] for k in ("plans", "cut_bytes", "spearman_curve", "spearman_flat", "spearman_measured_halves")})
    print("fresh MB", [round(x / 1e6) for x in row["fresh_bytes"]])
    print("measured ms", [round(x, 1) for x in row["measured_ms"]])


if __name__ == "__main__":
    main(sys.argv[1])

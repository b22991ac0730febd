"""Reprice a stored `eqsat bench parallel --spearman` run under the current time model.

The jsonl keeps each plan's measured step but not the plan; `bench_parallel.spearman_plans` draws
the same plans again (same seed, same saturation), checked against the stored run by each plan's
collective count and nominal wire bytes (model-independent here). Each plan is then priced by the
calibrated model built from the stored calibration file, and Spearman(predicted, measured) is
printed beside the stored one; `--ops` adds, per plan, the model's seconds by plan op (compute,
copies, collectives) and the measured/predicted ratio, the residual to read.

    PYTHONPATH=$PWD XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/spearman_reprice.py \
        --calibration docs/data/parallel_spearman/cal_quiet_2x4.json docs/data/parallel_spearman/quiet_A/*.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_parallel import spearman, spearman_plans


@dataclass
class _Recorder:
    """A cost model that delegates to `model` and keeps each node's cost by op (what `plan_report` asks)."""

    model: Any
    by_op: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))

    def node_cost(self, node: Any) -> Any:
        c = self.model.node_cost(node)
        row = self.by_op[node.op]
        row[0] += c.compute_s
        row[1] += c.copy_s
        row[2] += c.comm_s
        return c

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def reprice(path: Path, cal_path: Path, show_ops: bool) -> list[dict[str, Any]]:
    from eqsat.cost import cost_model
    from eqsat.ir import Graph
    from eqsat.parallel.cost import ParallelCostModel
    from eqsat.parallel.calibration import MeshCalibration, calibrated_model
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_report

    cal = MeshCalibration.from_json(json.loads(cal_path.read_text()))
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        mesh = parse_mesh(row["mesh"])
        stored = path.parent / f"parallel_spearman_plans_{row['model']}.json"
        if stored.exists():  # the run kept its plans
            chosen = [Graph.from_json(g) for g in json.loads(stored.read_text())]
            nominal = ParallelCostModel(mesh, cost_model("roofline", mesh.device))  # as `saturate_and_price` prices
        else:
            _, pe, chosen = spearman_plans(row["model"], mesh, len(row["measured_ms"]))
            nominal = pe.model
        wire = [float(sum(c.wire_bytes for _, c in plan_report(p, nominal).collectives)) for p in chosen]
        model = calibrated_model(cal, overlap=False)
        counts = [len(plan_report(p, model).collectives) for p in chosen]
        same = (len(chosen) == len(row["measured_ms"]) and counts == row["collectives"]
                and all(abs(a - b) <= 1e-6 * max(1.0, b) for a, b in zip(wire, row["step_wire_bytes"])))
        measured = row["measured_ms"]
        recs = [_Recorder(model) for _ in chosen]
        predicted = [plan_report(p, r).step_s * 1e3 for p, r in zip(chosen, recs)]  # type: ignore[arg-type]
        rho = spearman(predicted, measured)
        out.append({"file": str(path), "model": row["model"], "same_plans": same,
                    "stored": row["spearman_calibrated"], "repriced": rho})
        print(f"{path} {row['model']}: same plans {same}; Spearman stored {row['spearman_calibrated']:.2f}, repriced {rho:.2f}")
        if show_ops:
            ops = sorted({op for r in recs for op in r.by_op}, key=lambda o: -max(sum(r.by_op[o]) for r in recs))
            print("  plan  measured  predicted  ratio  " + "  ".join(f"{o[:9]:>9}" for o in ops) + "   (ms: compute+copy+comm)")
            for i in sorted(range(len(chosen)), key=lambda i: measured[i]):
                cells = "  ".join(f"{sum(recs[i].by_op[o]) * 1e3:9.2f}" if o in recs[i].by_op else f"{'':9}" for o in ops)
                print(f"  {i:4d}  {measured[i]:8.2f}  {predicted[i]:9.2f}  {measured[i] / predicted[i]:5.2f}  {cells}")
            # the residual against the plan's predicted product (matmul, conv) seconds: a negative
            # slope -s says a fraction s of the product time a split saves (on paper) is not saved
            products = np.array([sum(r.by_op[o][0] for o in ("matmul", "conv2d") if o in r.by_op) * 1e3 for r in recs])
            residual = np.array(measured) - np.array(predicted)
            slope = float(np.polyfit(products, residual, 1)[0]) if np.ptp(products) > 0 else float("nan")
            print(f"  residual vs predicted product ms: Pearson r {np.corrcoef(products, residual)[0, 1]:.2f}, slope {slope:.2f}; "
                  f"Spearman(measured, products) {spearman(list(products), measured):.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="parallel_spearman.jsonl files")
    parser.add_argument("--calibration", type=Path, required=True, help="the mesh calibration the run used")
    parser.add_argument("--ops", action="store_true", help="per plan: the model's seconds by plan op")
    args = parser.parse_args()
    for path in args.runs:
        reprice(path, args.calibration, args.ops)


if __name__ == "__main__":
    main()

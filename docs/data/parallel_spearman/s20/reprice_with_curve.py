"""The stored spearman timings A-P priced again under the calibrated model, once with one fresh-bytes rate (each
timing's own probe: the model before stop 47) and once with the fresh-bytes curve of a format-8 calibration,
scaled so that its lower level is that timing's own probe rate (stop 47). Run from the repository root:

    python docs/data/parallel_spearman/s20/reprice_with_curve.py docs/data/parallel_spearman/s20/cal_Q.json
"""

import json
import sys
from pathlib import Path

from scipy.stats import spearmanr

from eqsat.ir import Graph
from eqsat.parallel.calibration import MeshCalibration, calibrated_model
from eqsat.parallel.planner import plan_report

ROOT = Path("docs/data/parallel_spearman")
TIMINGS = [(n, ROOT / "fresh_s17" / r, None) for n, r in zip("ABCDE", ("run1", "run2", "run3", "run4", "run5"))]
TIMINGS += [(n, ROOT / "s18" / n, ROOT / "s18" / f"cal_{n}.json") for n in "FGHIJKLM"]
TIMINGS += [(n, ROOT / "s19" / n, ROOT / "s19" / "cal_N.json") for n in "NOP"]
FALLBACK = ROOT / "s18" / "cal_I.json"  # for timings whose calibration lacks the drift (as stop 45 priced them)
CASES = ("unity-mlp", "moe", "dlrm", "cnn", "gpt-block", "gpt12")


def calibration(path: Path | None, curve: list[list[float]], below: float, flat: bool) -> MeshCalibration:
    data = json.loads((path if path is not None and path.exists() else FALLBACK).read_text())
    if "drift" not in data:
        data = json.loads(FALLBACK.read_text())
    own = data.pop("fresh_rate")
    data["format"] = 8
    data["fresh"] = [[total, own if flat else rate * own / below] for total, rate in curve]
    return MeshCalibration.from_json(data)


def main(curve_calibration: str) -> None:
    data = json.loads(Path(curve_calibration).read_text())
    below = MeshCalibration.from_json(data).fresh_curve().below
    for case in CASES:
        cells = []
        for name, folder, cal in TIMINGS:
            if not (folder / case).exists():
                continue
            row = json.loads((folder / case / "parallel_spearman.jsonl").read_text().splitlines()[0])
            plans = [Graph.from_json(p) for p in json.loads((folder / case / f"parallel_spearman_plans_{case}.json").read_text())]
            scores = []
            for flat in (True, False):
                model = calibrated_model(calibration(cal, data["fresh"], below, flat), overlap=False)
                scores.append(spearmanr([plan_report(p, model).step_s for p in plans], row["measured_ms"])[0])
            cells.append(f"{name}: {scores[0]:.2f} -> {scores[1]:.2f}")
        print(case, " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])

"""Spearman of a timing's plans with the compiled copies of some node kinds in place of the predicted ones, at the
calibrated copy rate times 0.5, 1 and 2 (an upper bound for a copy model by consumer; stop 47):

    python docs/data/parallel_spearman/s20/copies_whatif.py COPIES.json "combine minor,transpose" TIMING_DIR...
(COPIES.json from copies_by_node.py; kinds: an op name, `combine minor`, or `noname`)."""

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr


def non_major(node: dict, nodes: dict) -> bool:
    src = nodes[node["inputs"][0]]
    rank = len(src["shape"]) - len(src["axes"])
    d = node["attr"].get("dim", 0)
    return (rank + d if d < 0 else d) != 0


def main(copies: str, kinds: str, timings: list[str]) -> None:
    wanted = kinds.split(",")
    data = json.loads(Path(copies).read_text())
    delta = []
    for p in data:
        nodes = {n["i"]: n for n in p["nodes"]}
        s = 0.0
        for n in p["nodes"]:
            kind = n["op"] + (" minor" if n["op"] == "combine" and non_major(n, nodes) else "")
            if kind in wanted:
                s += n["comp"] - n["pred"]
        delta.append(s + (p["noname"] if "noname" in wanted else 0.0))
    for timing in timings:
        case = Path(copies).stem.split("_")[0]
        r = json.loads(Path(f"{timing}/{case}/parallel_spearman.jsonl").read_text().splitlines()[0])
        meas, pred = np.array(r["measured_ms"]), np.array(r["predicted_calibrated_ms"])
        rate = np.mean(np.array(r["calibrated_copy_ms"]) / np.array(r["predicted_copy_bytes"]))
        scores = [f"x{m}: {spearmanr(pred + m * np.array(delta) * rate, meas)[0]:.2f}" for m in (0.5, 1, 2)]
        print(timing, f"as priced: {spearmanr(pred, meas)[0]:.2f}", *scores)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

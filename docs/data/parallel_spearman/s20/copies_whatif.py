import json, sys
from collections import defaultdict
import numpy as np
from scipy.stats import spearmanr
case = sys.argv[1]; classes = sys.argv[2].split(",")
S = "/work/main/docs/data/parallel_spearman/s19"
data = json.load(open(f"/work/wt/s20/diag/{case}_N.json"))
def minor(n, nodes):
    src = nodes[n["inputs"][0]]; rank = len(src["shape"]) - len(src["axes"]); d = n["attr"].get("dim", 0)
    return (rank + d if d < 0 else d) != 0
delta = []
for p in data:
    nodes = {n["i"]: n for n in p["nodes"]}
    s = 0.0
    for n in p["nodes"]:
        k = n["op"] + (" minor" if n["op"] in ("combine",) and minor(n, nodes) else "")
        if k in classes: s += n["comp"] - n["pred"]
    if "noname" in classes: s += p["noname"]
    delta.append(s)
delta = np.array(delta)
for t in "NOP":
    try: r = json.loads(open(f"{S}/{t}/{case}/parallel_spearman.jsonl").readline())
    except FileNotFoundError: continue
    meas = np.array(r["measured_ms"]); pred = np.array(r["predicted_calibrated_ms"])
    rate = np.mean(np.array(r["calibrated_copy_ms"]) / np.array(r["predicted_copy_bytes"]))
    out = [f"{spearmanr(pred, meas)[0]:.2f}"]
    for mult in (0.5, 1, 2):
        out.append(f"x{mult}:{spearmanr(pred + mult*delta*rate, meas)[0]:.2f}")
    print(case, t, " ".join(out))

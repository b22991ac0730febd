"""Cost against time of the ILP's large-neighbourhood phase (eqsat/extract/lns.py), per seed.

Per (file, seed): final cost and bound of `ilp` under the time limit (load included), and the
seconds (load included) at which the answer first got within 0.1% of the best known cost.

    eqsat bench lns [--files tensat/nasrnn.json] [--seeds 0 1 2] [--time-limit 60]
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from eqsat.extract import ExtractRequest, check_selection, extract, load_egraph
from eqsat.paths import egraphs_dir
from experiments.bench_extraction import best_known


def run_one(path: Path, seed: int, time_limit: float, best: float | None) -> dict[str, Any]:
    start = time.perf_counter()
    egraph = load_egraph(path)
    load_s = time.perf_counter() - start
    sel = extract(egraph, "ilp", time_limit - load_s, request=ExtractRequest(seed=seed))
    total = time.perf_counter() - start
    lns = sel.info.get("lns", {})
    offset = load_s + float(lns.get("started_s", 0.0))
    trace = [(round(offset + t, 2), size, cost) for t, size, cost in lns.get("trace", [])]
    hit = next((t for t, _, c in trace if best is not None and c <= best * 1.001), None)
    return {
        "file": f"{path.parent.name}/{path.name}",
        "seed": seed,
        "cost": sel.dag_cost,
        "best_known": best,
        "lower_bound": sel.lower_bound,
        "status": str(sel.status),
        "seconds": round(total, 2),
        "seconds_to_best_known_0.1pct": hit,
        "valid": not check_selection(egraph, sel),
        "trace_s_size_cost": trace,
    }


def run_bench(files: Sequence[str] = ("tensat/nasrnn.json",), seeds: Sequence[int] = (0, 1, 2),
              time_limit: float = 60.0) -> Iterator[dict[str, Any]]:
    """One row per (file, seed); files relative to the e-graph data folder."""
    known = best_known()
    for f in files:
        for seed in seeds:
            yield run_one(egraphs_dir() / f, seed, time_limit, known.get(f))

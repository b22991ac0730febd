"""Scaling benchmark: peak memory and time of every extractor on chain e-graphs of growing size.

A chain e-graph has one leaf class and n-1 classes above it, each with two alternatives over the
class below (cost 1 and 2), so every class's term contains every class below it: the worst case
for any extractor that keeps a set of classes per class. Each (extractor, size) runs in its own
subprocess under an address-space limit (RLIMIT_AS, default 8 GiB) and a wall-clock limit, and
reports its peak resident memory (`resource.getrusage`), seconds and status; an extractor stops
growing at its first failure (memory, time or error). The answer the issue asks for, the largest
chain each extractor handles within the memory limit and its time limit, is in summary.json and
table.md; scaling_memory.png and scaling_time.png plot the curves.

    eqsat bench scaling --out results/scaling [--time-limit 60] [--memory-gib 8] [--extractors ...]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SIZES: tuple[int, ...] = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)


def chain_egraph(n_classes: int) -> dict[str, Any]:
    """E-graph JSON (as a dict) of a chain of `n_classes` classes, root at the top."""
    nodes: dict[str, Any] = {"x": {"op": "x", "cost": 1.0, "eclass": "c0", "children": []}}
    for i in range(1, n_classes):
        below = "x" if i == 1 else f"f{i - 1}"
        nodes[f"f{i}"] = {"op": "f", "cost": 1.0, "eclass": f"c{i}", "children": [below]}
        nodes[f"g{i}"] = {"op": "g", "cost": 2.0, "eclass": f"c{i}", "children": [below]}
    return {"nodes": nodes, "root_eclasses": [f"c{n_classes - 1}"]}


def measure_one(extractor: str, n_classes: int, time_limit: float, memory_bytes: int) -> dict[str, Any]:
    """Run one extraction in this process under the memory limit; the row the parent records."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from eqsat.errors import EqsatError
    from eqsat.extract import extract, load_egraph

    row: dict[str, Any] = {"extractor": extractor, "classes": n_classes}
    start = time.perf_counter()
    try:
        egraph = load_egraph(chain_egraph(n_classes))
        sel = extract(egraph, extractor, time_limit, memory_limit=memory_bytes)
        row.update(status=str(sel.status), cost=sel.dag_cost, optimal_cost=float(n_classes))
    except MemoryError:
        row.update(status="out-of-memory")
    except EqsatError as exc:
        row.update(status="error", error=str(exc))
    row["seconds"] = time.perf_counter() - start
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _run_child(extractor: str, n_classes: int, time_limit: float, memory_bytes: int) -> dict[str, Any]:
    wall = 2 * time_limit + 60 + n_classes / 5_000
    cmd = [sys.executable, "-m", "experiments.bench_scaling", extractor, str(n_classes), str(time_limit), str(memory_bytes)]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=wall)
    except subprocess.TimeoutExpired:
        return {"extractor": extractor, "classes": n_classes, "status": "killed-wall-clock", "seconds": wall}
    if done.returncode != 0 or not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        status = "out-of-memory" if "MemoryError" in done.stderr or done.returncode < 0 else "crashed"
        return {"extractor": extractor, "classes": n_classes, "status": status, "error": tail,
                "seconds": time.perf_counter() - start}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def handled(row: dict[str, Any], time_limit: float) -> bool:
    """A valid answer within the memory limit and the time limit (10% slack for the load)."""
    return row.get("status") in ("optimal", "feasible", "timed-out-with-best") and row["seconds"] <= 1.1 * time_limit + 5


def run_bench(out_dir: Path, time_limit: float = 60.0, extractors: Sequence[str] | None = None,
              memory_gib: float = 8.0, sizes: Sequence[int] = SIZES) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from eqsat.extract import EXTRACTORS

    names = list(extractors or EXTRACTORS)
    memory_bytes = int(memory_gib * 2**30)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    largest: dict[str, int] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as progress:
        task = progress.add_task("scaling", total=len(names) * len(sizes))
        for name in names:
            for n in sizes:
                progress.update(task, description=f"{name} {n} classes")
                row = _run_child(name, n, time_limit, memory_bytes)
                row["handled"] = handled(row, time_limit)
                rows.append(row)
                progress.advance(task)
                if not row["handled"]:
                    progress.advance(task, len(sizes) - 1 - sizes.index(n))
                    break
                largest[name] = n
    summary = {"memory_gib": memory_gib, "time_limit_s": time_limit,
               "largest_chain_handled": {name: largest.get(name, 0) for name in names}}
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _table(out_dir / "table.md", rows, summary)
    _plot(out_dir, rows, names)
    return rows


def _table(path: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    lines = [f"Chain e-graphs, memory limit {summary['memory_gib']:g} GiB, time limit {summary['time_limit_s']:g} s",
             "", "| extractor | classes | status | seconds | peak RSS (MiB) | cost |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['extractor']} | {r['classes']} | {r['status']} | {r.get('seconds', 0):.2f} | "
                     f"{r.get('peak_rss_mib', float('nan')):.0f} | {r.get('cost', '')} |")
    lines += ["", "| extractor | largest chain handled (classes) |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary["largest_chain_handled"].items()]
    path.write_text("\n".join(lines) + "\n")


def _plot(out_dir: Path, rows: list[dict[str, Any]], names: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, label, fname in (("peak_rss_mib", "peak RSS (MiB)", "scaling_memory.png"),
                              ("seconds", "seconds", "scaling_time.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in names:
            pts = [(r["classes"], r[key]) for r in rows if r["extractor"] == name and key in r and r["handled"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("classes in the chain")
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    extractor_name, classes, limit, memory = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(measure_one(extractor_name, classes, limit, memory)))

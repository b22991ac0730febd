"""Extraction benchmark: every strategy on every E-graph JSON file of the shared data set.

Per (file, strategy): DAG cost, ratio to the best known cost (where the data README gives one)
and to greedy, solver lower bound and gap, seconds (load included) and status; per suite the
geometric mean of the ratios; a PNG of cost ratio against time. Writes results.jsonl, table.md
and extraction_cost_vs_time.png under --out.

    eqsat bench extraction --out results/extraction [--time-limit 60]
        [--files F...] [--extractors ilp greedy-dag ...]
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eqsat.errors import EqsatError
from eqsat.extract import EXTRACTORS, check_selection, extract, load_egraph
from eqsat.paths import data_dir, egraphs_dir



def best_known(readme: Path | None = None) -> dict[str, float]:
    """'suite/file.json' → best known DAG cost, read from the data README's table."""
    out: dict[str, float] = {}
    readme = readme or data_dir() / "README.md"
    if not readme.exists():
        return out
    for line in readme.read_text().splitlines():
        m = re.match(r"\|\s*([\w\-./]+\.json)\s*\|[^|]*\|[^|]*\|\s*([0-9.]+)\s*\|", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def default_files() -> list[Path]:
    return sorted(egraphs_dir().glob("*/*.json"))


def _key(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else None
    return a / b


def _geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def run_bench(
    out_dir: Path,
    time_limit: float = 60.0,
    files: list[Path] | None = None,
    extractors: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Run the comparison; returns one row per (file, extractor) and one geomean row per
    (suite, extractor); also writes the files described in the module docstring."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    paths = [Path(f) for f in files] if files else default_files()
    names = list(extractors) if extractors else list(EXTRACTORS)
    for n in names:  # bad input is one EqsatError line (exit 2) before any work, not after the first files
        if n not in EXTRACTORS:
            raise EqsatError(f"unknown extractor {n!r}; choose from {', '.join(EXTRACTORS)}")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise EqsatError(f"--files: no such file(s): {', '.join(map(repr, missing))}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    known = best_known()
    rows: list[dict[str, Any]] = []
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console,
    ) as progress:
        task = progress.add_task("extraction", total=len(paths) * len(names))
        for path in paths:
            start = time.perf_counter()
            egraph = load_egraph(path)
            load_s = time.perf_counter() - start
            negative = egraph.has_negative_costs  # maxsat: only the exact ILPs take it (no greedy ratio)
            greedy = None if negative else extract(egraph, "greedy-dag", time_limit).dag_cost
            for name in names:
                progress.update(task, description=f"{_key(path)} {name}")
                if negative and not EXTRACTORS[name].accepts_negative_costs:
                    progress.advance(task)
                    continue
                t = time.perf_counter()
                sel = extract(egraph, name, max(0.1, time_limit - load_s))
                seconds = load_s + time.perf_counter() - t
                best = known.get(_key(path))
                rows.append(
                    {
                        "suite": path.parent.name,
                        "file": _key(path),
                        "extractor": name,
                        "cost": sel.dag_cost,
                        "best_known": best,
                        "ratio_best": _ratio(sel.dag_cost, best),
                        "ratio_greedy": _ratio(sel.dag_cost, greedy),
                        "lower_bound": sel.lower_bound,
                        "gap": sel.gap,
                        "seconds": seconds,
                        "status": str(sel.status),
                        "valid": not check_selection(egraph, sel),
                        "nodes": egraph.n_nodes,
                        "classes": egraph.n_classes,
                    }
                )
                progress.advance(task)
    summary = _summaries(rows)
    _write(out_dir, rows, summary)
    return rows + summary


def _summaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    suites = sorted({r["suite"] for r in rows})
    names = list(dict.fromkeys(r["extractor"] for r in rows))
    for suite in suites:
        for name in names:
            rs = [r for r in rows if r["suite"] == suite and r["extractor"] == name]
            if not rs:
                continue
            out.append(
                {
                    "suite": suite,
                    "file": f"geomean({suite})",
                    "extractor": name,
                    "ratio_best": _geomean([r["ratio_best"] for r in rs]),
                    "ratio_greedy": _geomean([r["ratio_greedy"] for r in rs]),
                    "seconds": _geomean([r["seconds"] for r in rs]),
                    "valid": all(r["valid"] for r in rs),
                    "files": len(rs),
                }
            )
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _write(out_dir: Path, rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    with (out_dir / "results.jsonl").open("w") as f:
        for r in rows + summary:
            f.write(json.dumps(r) + "\n")
    cols = ["file", "extractor", "cost", "best_known", "ratio_best", "ratio_greedy", "lower_bound", "gap", "seconds", "status", "valid"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    scols = ["file", "extractor", "ratio_best", "ratio_greedy", "seconds", "valid", "files"]
    lines += ["", "| " + " | ".join(scols) + " |", "|" + "---|" * len(scols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in scols) + " |" for r in summary]
    (out_dir / "table.md").write_text("\n".join(lines) + "\n")
    _plot(out_dir / "extraction_cost_vs_time.png", rows)


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "os^vDPX*"
    for i, name in enumerate(dict.fromkeys(r["extractor"] for r in rows)):
        pts = [
            (r["seconds"], r["ratio_best"] if r["ratio_best"] is not None else r["ratio_greedy"])
            for r in rows
            if r["extractor"] == name and (r["ratio_best"] or r["ratio_greedy"]) is not None
        ]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=name, marker=markers[i % len(markers)], alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("seconds (load included, log scale)")
    ax.set_ylabel("DAG cost / best known (or / greedy)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_title("E-graph extraction: cost ratio against time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

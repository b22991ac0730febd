"""`eqsat bench tensat`: Tensat's experiment (Yang et al., MLSys'21, Table 2 and its figures) here.

For each of Tensat's seven models and each cost model (the measured per-op model on the device at
hand, and the H100 roofline) it runs
- equality saturation (Tensat's 133 rules as the verifier accepts them, plus the `conv_merges`
  library group: the grouped-conv merges guarded to where they hold and the `enlarge` merges), for
  each `k_multi`, extracted with the ILP (and with greedy-dag on the same e-graph, for the plot);
- the TASO-style search (`experiments/taso_search.py`) with the same rules and the same cost model,
  at TASO's default budget (1000 graphs) and, under the roofline, a longer one;
then lowers the original and the optimized graph through JAX, checks numerics and times both.

Writes one JSON row per (model, k_multi, cost model), `DIR/table.md` (the paper's numbers beside
ours), PNG plots, and each model's saturated e-graph as E-graph JSON under `DIR/egraphs/`.
Speedup means cost_original / cost_optimized - 1, as in the paper; the reduction is given beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.cost import CostModel, cost_model, graph_cost
from eqsat.ir import Graph
from eqsat.rewrites.rule import Rule

__all__ = ["PAPER", "TENSAT_MODELS", "BenchOptions", "bench_rules", "options_from_args", "render_table", "run_bench", "write_plots"]

TENSAT_MODELS: tuple[str, ...] = ("bert", "resnext50", "nasneta", "nasrnn", "inceptionv3", "squeezenet", "vgg")


@dataclass(frozen=True)
class PaperRow:
    """Tensat's Table 2: optimizer seconds and speedup (%) on a V100, TASO and Tensat."""

    taso_s: float
    tensat_s: float
    taso_speedup: float
    tensat_speedup: float


PAPER: Mapping[str, PaperRow] = {
    "bert": PaperRow(13.6, 1.4, 8.5, 9.2),
    "resnext50": PaperRow(25.3, 0.7, 5.5, 8.8),
    "nasneta": PaperRow(1226.0, 10.6, 1.9, 7.3),
    "nasrnn": PaperRow(177.3, 0.5, 45.4, 68.9),
    "inceptionv3": PaperRow(68.6, 5.1, 6.3, 10.0),
    "squeezenet": PaperRow(16.4, 0.3, 6.7, 24.5),
    "vgg": PaperRow(8.9, 0.4, 8.9, 8.9),
}

COST_MODELS: tuple[tuple[str, str], ...] = (("measured", "cpu"), ("roofline", "h100"))


@dataclass(frozen=True)
class BenchOptions:
    models: tuple[str, ...] = TENSAT_MODELS
    k_multi: tuple[int, ...] = (1,)
    cost_models: tuple[tuple[str, str], ...] = COST_MODELS
    extract_time_limit: float = 60.0
    node_limit: int = 50_000
    saturate_seconds: float = 60.0
    taso_budget: int = 1000
    taso_seconds: float = 600.0  # a safety cap only: the search is meant to end at its budget
    taso_long_budget: int = 10_000
    taso_long_seconds: float = 60.0
    repeats: int = 10
    seed: int = 0


def _cost_model_arg(text: str) -> tuple[str, str]:
    name, sep, device = text.partition("/")
    if not sep or not name or not device:
        from eqsat.errors import EqsatError

        raise EqsatError(f"bench tensat: --cost-models takes MODEL/DEVICE (e.g. roofline/h100), not {text!r}")
    return name, device


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    d = BenchOptions()
    chosen = getattr(args, "cost_models", None)
    return BenchOptions(models=tuple(args.models or d.models), k_multi=tuple(args.k_multi or d.k_multi),
                        cost_models=tuple(map(_cost_model_arg, chosen)) if chosen else d.cost_models,
                        extract_time_limit=args.time_limit, taso_seconds=args.taso_seconds,
                        taso_budget=getattr(args, "taso_budget", None) or d.taso_budget,
                        taso_long_seconds=args.taso_long_seconds)


def bench_rules(graph: Graph) -> list[Rule]:
    """The rules `eqsat optimize` uses (Tensat's and `conv_merges`) that can match `graph`, as the
    verifier accepts them."""
    from eqsat.egraph import encoded_signatures
    from eqsat.rulesets import select_rules
    from eqsat.rulesets import candidate_rules

    return list(select_rules(candidate_rules(), encoded_signatures(graph)).trusted)


def _speedup(before: float, after: float) -> float:
    return before / after - 1.0 if after > 0 else float("nan")


def _model_rows(name: str, options: BenchOptions, out_dir: Path, progress: Any) -> Iterable[dict[str, Any]]:
    from eqsat.egraph import decode, flatten_concats
    from eqsat.extract import extract, load_egraph
    from eqsat.extract.selection import Status, make_selection
    from eqsat.gc_pause import gc_paused
    from eqsat.pipeline import numerics_match, optimize_graph
    from eqsat.saturate import Limits
    from eqsat.models import build_model
    from jax_backend.checks import measure_pair
    from experiments.taso_search import TasoOptions, taso_search

    graph = build_model(name)
    rules = bench_rules(graph)
    steps = len(options.cost_models) * (1 + len(options.k_multi)) + 1
    task = progress.add_task(f"{name}: rules", total=steps)
    inputs = graph.random_inputs(options.seed)
    # float32 through JAX against the numpy reference: outputs of BERT (no softmax) reach ~10^2, so
    # the absolute tolerance scales with the largest output (reassociated products differ by ~1e-6 of it)
    scale = max(1.0, max(float(np.max(np.abs(o))) for o in graph.evaluate(inputs)))
    for cm_name, device in options.cost_models:
        costs: CostModel = cost_model(cm_name, device=device)
        label = f"{cm_name}/{device}"
        graph_cost(graph, costs)  # a measured model times the original's ops here, outside both searches' clocks
        progress.update(task, description=f"{name} [{label}]: TASO-style search")
        taso = taso_search(graph, rules, costs, TasoOptions(budget=options.taso_budget, seconds=options.taso_seconds))
        taso_long = None
        if cm_name == "roofline" and options.taso_long_seconds > 0:
            progress.update(task, description=f"{name} [{label}]: TASO-style search, longer budget")
            taso_long = taso_search(graph, rules, costs, TasoOptions(budget=options.taso_long_budget,
                                                                     seconds=options.taso_long_seconds))
        taso_ok, _ = numerics_match(graph, taso.best, options.seed)
        # our decoder writes nested concats as one n-ary concat (eqsat.egraph.flatten_concats); the
        # TASO-style result is costed the same way, and so is the input for the rewrite-only speedup
        cost_taso = min(taso.cost_best, graph_cost(flatten_concats(taso.best), costs))
        cost_taso_long = (min(taso_long.cost_best, graph_cost(flatten_concats(taso_long.best), costs))
                          if taso_long else None)
        cost_original_flat = graph_cost(flatten_concats(graph), costs)
        progress.advance(task)
        for k in options.k_multi:
            progress.update(task, description=f"{name} [{label}]: saturate + extract, k_multi {k}")
            limits = Limits(nodes=options.node_limit, seconds=options.saturate_seconds, multi_rounds=k)
            result = optimize_graph(graph, rules, limits, costs, extractor="ilp",
                                    time_limit=options.extract_time_limit, seed=options.seed)
            egraph_json = result.egraph_json or {}
            egraph_file = out_dir / "egraphs" / f"{name}.k{k}.{cm_name}-{device}.json"
            egraph_file.parent.mkdir(parents=True, exist_ok=True)
            egraph_file.write_text(json.dumps(egraph_json))
            data = load_egraph(egraph_json)
            t0 = time.perf_counter()
            with gc_paused():  # as in the search: see eqsat.gc_pause
                if result.greedy_choice is not None:  # the ILP started from greedy-dag's answer: not computed twice
                    greedy = make_selection(data, result.greedy_choice, status=Status.FEASIBLE, extractor="greedy-dag",
                                            seconds=0.0)
                else:
                    greedy = extract(data, "greedy-dag", time_limit=options.extract_time_limit)
            greedy_s = time.perf_counter() - t0
            greedy_graph = decode(egraph_json, greedy.as_ids(data)).live()
            greedy_cost = graph_cost(greedy_graph, costs)
            # ours = what `eqsat optimize` returns (greedy-dag's answer is for the plot only)
            optimized, cost_eqsat, extractor_used = result.optimized, result.cost_after, "ilp"
            extract_s = result.extract_s
            progress.update(task, description=f"{name} [{label}]: JAX numerics and timing, k_multi {k}")
            measured = measure_pair(graph, optimized, inputs, options.repeats, rtol=1e-4, atol=1e-5 * scale)
            row = {
                "model": name, "k_multi": k, "enodes": result.enodes, "eclasses": result.eclasses,
                "saturate_s": result.saturate_s, "extract_s": extract_s, "taso_s": taso.seconds,
                "cost_original": result.cost_before, "cost_taso": cost_taso, "cost_eqsat": cost_eqsat,
                "cost_model": label, "measured_original_s": measured.before_s, "measured_eqsat_s": measured.after_s,
                "numerics_ok": bool(result.numerics_ok and measured.numerics_ok and taso_ok),
                "numerics_numpy_ok": result.numerics_ok, "numerics_jax_ok": measured.numerics_ok,
                "numerics_taso_ok": taso_ok,
                "device": _device_name(), "rules_fired": dict(result.saturation.total_matches),
                "speedup_eqsat": _speedup(result.cost_before, cost_eqsat),
                "speedup_taso": _speedup(taso.cost_original, cost_taso),
                "cost_original_flat": cost_original_flat,
                "speedup_eqsat_vs_flat_original": _speedup(cost_original_flat, cost_eqsat),
                "reduction_eqsat": 1 - cost_eqsat / result.cost_before,
                "reduction_taso": 1 - cost_taso / taso.cost_original,
                "taso_seconds_to_best": taso.seconds_to_best, "taso_popped": taso.popped,
                "taso_generated": taso.generated, "taso_stop": taso.stop_reason, "taso_rules_fired": dict(taso.rules_fired),
                "taso_trace": [list(p) for p in taso.trace],
                "taso_graphs_per_s": taso.graphs_per_s, "taso_cost_full_budget": cost_taso,
                "taso_seconds_to_our_cost": _seconds_to_cost(taso, cost_taso, cost_eqsat),
                "cost_taso_long": cost_taso_long,
                "taso_long_s": taso_long.seconds if taso_long else None,
                "taso_long_popped": taso_long.popped if taso_long else None,
                "taso_long_stop": taso_long.stop_reason if taso_long else None,
                "taso_long_trace": [list(p) for p in taso_long.trace] if taso_long else None,
                "cost_greedy": greedy_cost, "greedy_s": greedy_s, "stop_reason": result.stop_reason,
                "selection_status": result.selection_status, "extractor_used": extractor_used, "rules": len(rules),
                "measured_speedup_eqsat": _speedup(measured.before_s, measured.after_s),
                "nodes_original": len(graph.live().nodes), "nodes_eqsat": len(optimized.nodes),
                "egraph_file": str(egraph_file),
            }
            progress.advance(task)
            yield row
    progress.update(task, description=f"{name}: done", completed=steps)


def _seconds_to_cost(taso: Any, cost_taso: float, ours: float) -> float | None:
    """When the TASO-style search first reached our cost (as measured, no floor); None if it never did
    (its final graph, costed flattened, counts at the end of the run)."""
    from experiments.taso_search import seconds_to_cost

    reached = seconds_to_cost(taso, ours)
    if reached is None and cost_taso <= ours * (1 + 1e-9):
        reached = taso.seconds
    return reached


def _device_name() -> str:
    import jax

    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')}"


def run_bench(out_dir: Path, options: BenchOptions = BenchOptions()) -> Iterable[dict[str, Any]]:
    """Yield the rows (as each finishes), then write table.md, the plots and rows.jsonl under `out_dir`."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from eqsat.models import MODELS, UnknownModelError

    unknown = [m for m in options.models if m not in MODELS]
    if unknown:
        raise UnknownModelError(f"unknown model(s) {', '.join(unknown)}; known models: {', '.join(MODELS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        for name in options.models:
            for row in _model_rows(name, options, out_dir, progress):
                rows.append(row)
                yield row
    with (out_dir / "rows.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (out_dir / "table.md").write_text(render_table(rows, time.perf_counter() - start))
    write_plots(rows, out_dir)


# --- table ---------------------------------------------------------------------------------------

def _main_k(rows: Sequence[Mapping[str, Any]]) -> int:
    ks = sorted({r["k_multi"] for r in rows})
    return 1 if 1 in ks else ks[-1]


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def render_table(rows: Sequence[Mapping[str, Any]], seconds: float) -> str:
    """Markdown: per cost model, Tensat's Table 2 with the paper's numbers beside ours."""
    k = _main_k(rows)
    lines = [f"# Tensat's experiment here (k_multi {k}; whole run {seconds:.0f} s)", "",
             ("Speedup = cost_original / cost_optimized - 1 under the cost model (the paper: V100 runtime); "
              "'vs flat input': against the input with its nested concats written as n-ary ones, as our decoder "
              "writes them (the TASO-style result is costed that way too). "
              "Optimizer time: TASO-style search (its whole run, capped; in brackets the time it found its best), "
              "ours = saturate + extract."), ""]
    for label in dict.fromkeys(r["cost_model"] for r in rows):
        sel = [r for r in rows if r["cost_model"] == label and r["k_multi"] == k]
        lines += [f"## cost model {label}", "",
                  ("| model | TASO s (paper) | Tensat s (paper) | TASO-style s (ours) | eqsat s (ours) | "
                   "TASO % (paper) | Tensat % (paper) | TASO-style % (ours) | longer TASO-style % | eqsat % (ours) | "
                   "eqsat % vs flat input | reduction | e-nodes | measured JAX orig → ours (ms) | numerics |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sel:
            p = PAPER.get(r["model"])
            ours_s = r["saturate_s"] + r["extract_s"]
            flat = "" if r.get("speedup_eqsat_vs_flat_original") is None else f"{100 * r['speedup_eqsat_vs_flat_original']:.1f}"
            longer = "" if r["cost_taso_long"] is None else f"{100 * _speedup(r['cost_original'], r['cost_taso_long']):.1f}"
            lines.append(
                f"| {r['model']} | {p.taso_s if p else ''} | {p.tensat_s if p else ''} | "
                f"{r['taso_s']:.1f} ({r['taso_seconds_to_best']:.1f}) | {ours_s:.2f} | "
                f"{p.taso_speedup if p else ''} | {p.tensat_speedup if p else ''} | {100 * r['speedup_taso']:.1f} | "
                f"{longer} | {100 * r['speedup_eqsat']:.1f} | {flat} | {100 * r['reduction_eqsat']:.1f}% | {r['enodes']} | "
                f"{1e3 * r['measured_original_s']:.2f} → {1e3 * r['measured_eqsat_s']:.2f} | {r['numerics_ok']} |")
        ratio = _geomean([r["taso_s"] / (r["saturate_s"] + r["extract_s"]) for r in sel])
        to_best = _geomean([max(r["taso_seconds_to_best"], 1e-3) / (r["saturate_s"] + r["extract_s"]) for r in sel])
        le = sum(r["cost_eqsat"] <= r["cost_taso"] * (1 + 1e-9) for r in sel)
        lt = sum(r["cost_eqsat"] < r["cost_taso"] * (1 - 1e-9) for r in sel)
        longer_le = sum(r["cost_eqsat"] <= r["cost_taso_long"] * (1 + 1e-9) for r in sel if r["cost_taso_long"] is not None)
        longer_n = sum(r["cost_taso_long"] is not None for r in sel)
        lines += ["", (f"Optimizer time, TASO-style ÷ ours, geomean: {ratio:.1f}x (paper: 48x); TASO-style's time to "
                       f"its best ÷ ours: {to_best:.1f}x. Ours ≤ TASO-style on {le}/{len(sel)} models, strictly lower "
                       f"on {lt}" + (f"; ≤ the longer TASO-style search on {longer_le}/{longer_n}." if longer_n else ".")),
                  ""]
    return "\n".join(lines) + "\n"


# --- plots ---------------------------------------------------------------------------------------

def _grouped_bars(plt: Any, path: Path, names: Sequence[str], series: Sequence[tuple[str, Sequence[float]]],
                  ylabel: str, title: str, log: bool = False) -> None:
    """One bar group per model, one bar per series (up to four), saved to `path`."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, ys) in enumerate(series):
        ax.bar([j + 0.2 * i - 0.3 for j in range(len(names))], ys, width=0.2, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(list(range(len(names))), names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(series), fontsize="small")  # below: never over a bar
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = _main_k(rows)
    labels = list(dict.fromkeys(r["cost_model"] for r in rows))
    for label in labels:
        sel = [r for r in rows if r["cost_model"] == label and r["k_multi"] == k]
        if not sel:
            continue
        tag = label.replace("/", "-")
        names = [r["model"] for r in sel]
        x = range(len(sel))
        speedups = [("eqsat (ours)", [100 * r["speedup_eqsat"] for r in sel]),
                    ("TASO-style (ours)", [100 * r["speedup_taso"] for r in sel]),
                    ("Tensat (paper)", [PAPER[n].tensat_speedup if n in PAPER else 0 for n in names]),
                    ("TASO (paper)", [PAPER[n].taso_speedup if n in PAPER else 0 for n in names])]
        _grouped_bars(plt, out_dir / f"speedup.{tag}.png", names, speedups, "speedup %",
                      f"Speedup per model ({label}; paper: V100 runtime)")
        times = [("eqsat (ours)", [r["saturate_s"] + r["extract_s"] for r in sel]),
                 ("TASO-style (ours)", [r["taso_s"] for r in sel]),
                 ("Tensat (paper)", [PAPER[n].tensat_s if n in PAPER else 0 for n in names]),
                 ("TASO (paper)", [PAPER[n].taso_s if n in PAPER else 0 for n in names])]
        _grouped_bars(plt, out_dir / f"time.{tag}.png", names, times, "optimizer time, s (log)",
                      f"Optimizer time ({label})", log=True)

        fig, ax = plt.subplots(figsize=(9, 4))
        ax.bar([j - 0.2 for j in x], [100 * r["reduction_eqsat"] for r in sel], width=0.4, label="ILP")
        ax.bar([j + 0.2 for j in x], [100 * (1 - r["cost_greedy"] / r["cost_original"]) for r in sel], width=0.4,
               label="greedy-dag")
        ax.set_xticks(list(x), names)
        ax.set_ylabel("cost reduction %")
        ax.set_title(f"Greedy vs ILP extraction on the same e-graphs ({label})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"extraction.{tag}.png", dpi=120)
        plt.close(fig)

        cols = min(4, len(sel))
        fig, axes = plt.subplots(math.ceil(len(sel) / cols), cols, figsize=(4 * cols, 3 * math.ceil(len(sel) / cols)),
                                 squeeze=False)
        for ax, r in zip(axes.flat, sel):
            for key, name in (("taso_trace", "TASO-style"), ("taso_long_trace", "TASO-style, longer")):
                if r.get(key):
                    ts, cs = zip(*r[key])
                    ax.step([max(t, 1e-3) for t in ts], [c / r["cost_original"] for c in cs], where="post", label=name)
            ax.scatter([r["saturate_s"] + r["extract_s"]], [r["cost_eqsat"] / r["cost_original"]], color="red",
                       zorder=3, label="eqsat")
            ax.set_xscale("log")
            ax.set_title(r["model"])
            ax.set_xlabel("s")
            ax.set_ylabel("cost / original")
        for ax in list(axes.flat)[len(sel):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(f"Best cost over time ({label})")
        fig.tight_layout()
        fig.savefig(out_dir / f"search_over_time.{tag}.png", dpi=120)
        plt.close(fig)

        ks = sorted({r["k_multi"] for r in rows})
        if len(ks) > 1:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
            for name in names:
                rs = sorted((r for r in rows if r["cost_model"] == label and r["model"] == name), key=lambda r: r["k_multi"])
                a1.plot([r["k_multi"] for r in rs], [100 * r["speedup_eqsat"] for r in rs], marker="o", label=name)
                a2.plot([r["k_multi"] for r in rs], [r["saturate_s"] + r["extract_s"] for r in rs], marker="o", label=name)
            a1.set_xlabel("k_multi")
            a1.set_ylabel("speedup %")
            a2.set_xlabel("k_multi")
            a2.set_ylabel("optimizer time, s")
            a2.set_yscale("log")
            a1.legend(fontsize=7)
            fig.suptitle(f"k_multi sweep ({label})")
            fig.tight_layout()
            fig.savefig(out_dir / f"k_multi.{tag}.png", dpi=120)
            plt.close(fig)

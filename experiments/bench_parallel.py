"""`eqsat bench parallel --out DIR`: `eqsat parallel` over the cases and meshes.

Every case and mesh also runs `RANDOM_PLANS` random plans of its e-graph on the devices (outputs and
gradients against the single-device program; their failures and how many have their predicted memory
within 15% of `memory_analysis()` are columns). Writes `parallel.jsonl` (one row per case and mesh,
the fields of `eqsat parallel --random-plans`), `parallel.md`
(the table), `parallel_step.png` (each baseline's predicted training-step time over the joint
plan's, log scale), `parallel_comm.png` (predicted against compiled bytes per device, forward and
training step) and `parallel_pareto.png` (per case: step time against compiled step bytes of
the baselines, the joint plan and the joint search's plans within each baseline's bytes). Step
times are predicted (the 8 emulated devices share this machine's cores, so wall-clock speedups
mean nothing here); bytes are the compiled programs'.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eqsat.errors import EqsatError
from eqsat.commands.parallel import BASELINES, run_case

CASES: tuple[str, ...] = ("unity-mlp", "mlp16", "gpt-block", "gpt12", "dlrm", "mlp-bottleneck", "cnn", "moe")
MESHES: tuple[str, ...] = ("8", "2x4", "4x2")
UNITY_CASE = ("unity-mlp", "2")  # Unity's figure is on two devices
COLUMNS = ("model", "mesh", "predicted_s", "data_parallel_s", "fsdp_s", "megatron_s", "dp_x_tp_s", "megatron_search_s",
           "algebra_first_s", "joint_vs_best_baseline", "joint_never_worse", "joint_strictly_better", "joint_dominates_all",
           "predicted_step_comm_bytes", "measured_step_comm_bytes",
           "data_parallel_measured_step_comm_bytes", "megatron_measured_step_comm_bytes",
           "megatron_search_measured_step_comm_bytes", "algebra_first_measured_step_comm_bytes",
           "kept", "measured_speedup_vs_data_parallel", "measured_speedup_ci",
           "predicted_comm_bytes", "measured_comm_bytes", "predicted_mem_bytes", "measured_mem_bytes", "numerics_ok",
           "same_step_collectives", "no_recomputation", "search_s", "ilp_status", "ilp_gap",
           "random_plans", "random_numerics_failures", "random_mem_within_15pct",
           "random_no_recomputation")
RANDOM_PLANS = 20  # per case and mesh, each run on the devices against the single-device program


def _time_limit(model: str, time_limit: float) -> float:
    return max(time_limit, 60.0) if model == "gpt12" else time_limit


def run_bench(out_dir: Path, time_limit: float = 20.0, models: Sequence[str] | None = None,
              meshes: Sequence[str] | None = None, random_plans: int = RANDOM_PLANS) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    unknown = sorted(set(models or ()) - set(CASES))
    if unknown:
        raise EqsatError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [(m, mesh) for m in (models or CASES) for mesh in (meshes or MESHES)]
    if meshes is None and UNITY_CASE[0] in (models or CASES):
        cases.insert(0, UNITY_CASE)
    rows: list[dict[str, Any]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task("parallel", total=len(cases))
        with open(out_dir / "parallel.jsonl", "w") as log:
            for model, mesh in cases:
                progress.update(task, description=f"{model} on {mesh}")
                row = run_case(model, mesh, _time_limit(model, time_limit), random=random_plans)
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                progress.advance(task)
    _table(rows, out_dir / "parallel.md")
    _plots(rows, out_dir)
    _pareto(rows, out_dir / "parallel_pareto.png")
    return [{k: r.get(k) for k in COLUMNS} for r in rows]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _table(rows: Sequence[dict[str, Any]], path: Path) -> None:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k in COLUMNS) + " |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def _plots(rows: Sequence[dict[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [f"{r['model']}\n{r['mesh']}" for r in rows]
    series = [("joint", "predicted_s")] + [(b, b.replace("-", "_") + "_s") for b in BASELINES]
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    for i, (name, key) in enumerate(series):  # relative to the joint plan: cases differ by 1000x in time
        ax.bar(x + i * width, [float(r.get(key) or 0) / float(r["predicted_s"]) for r in rows], width, label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(x + 0.4 - width / 2, labels, fontsize=7)
    ax.set_ylabel("predicted training step / joint plan's")
    ax.set_title("joint algebra + sharding plan against baselines (above 1: the baseline is slower)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "parallel_step.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for pred, meas, name in (("predicted_comm_bytes", "measured_comm_bytes", "forward"),
                             ("predicted_step_comm_bytes", "measured_step_comm_bytes", "training step")):
        pts = [(r[pred], r[meas]) for r in rows if r.get(meas) is not None]
        if pts:
            ax.scatter([p for p, _ in pts], [m for _, m in pts], label=name)
    seen = [float(r[k]) for r in rows for k in ("predicted_comm_bytes", "measured_comm_bytes",
                                                 "predicted_step_comm_bytes", "measured_step_comm_bytes") if r.get(k)]
    low, high = (min(seen) / 2, max(seen) * 2) if seen else (1.0, 10.0)
    ax.plot([low, high], [low, high], color="gray", lw=0.8)
    ax.set_xscale("symlog")
    ax.set_yscale("symlog")
    ax.set_xlabel("predicted bytes per device")
    ax.set_ylabel("compiled program's bytes per device")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "parallel_comm.png", dpi=120)
    plt.close(fig)


def _pareto(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per case and mesh: predicted step time against compiled step bytes. A baseline
    whose bytes are below the joint plan's is joined by an arrow to the joint search's plan within
    its bytes: no baseline lies below and left of a joint-search point."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 5
    fig, axes = plt.subplots(math.ceil(len(rows) / cols), cols, figsize=(3.2 * cols, 2.6 * math.ceil(len(rows) / cols)),
                             squeeze=False)
    def point(r: dict[str, Any], key: str, s_key: str) -> tuple[float, float]:
        """(compiled step bytes, or predicted where not measured; predicted step in ms)."""
        found = r.get(f"{key}measured_step_comm_bytes")
        return float(found if found is not None else r.get(f"{key}step_comm_bytes", 0.0)), float(r[s_key]) * 1e3

    for ax, r in zip(axes.flat, rows):
        x, y = point(r, "", "predicted_s")
        ax.scatter([x], [y], marker="*", s=120, color="black", zorder=3, label="joint")
        for i, b in enumerate(BASELINES):
            key = b.replace("-", "_")
            if r.get(f"{key}_s") is None:
                continue
            bx, by = point(r, f"{key}_", f"{key}_s")
            ax.scatter([bx], [by], color=f"C{i}", label=b)
            alt = r.get(f"joint_at_{key}_bytes")
            if isinstance(alt, dict) and "predicted_s" in alt:
                ax_ = float(alt.get("measured_step_comm_bytes") or alt["predicted_step_comm_bytes"])
                ay = float(alt["predicted_s"]) * 1e3
                ax.annotate("", (ax_, ay), (bx, by), arrowprops={"arrowstyle": "->", "color": f"C{i}"})
                ax.scatter([ax_], [ay], marker="*", s=60, color=f"C{i}", edgecolor="black", zorder=3)
        ax.set_xscale("symlog", linthresh=1e3)
        ax.set_title(f"{r['model']} {r['mesh']}", fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=5)
    fig.supxlabel("compiled bytes per device in a training step")
    fig.supylabel("predicted training step, ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- user programs through `eqsat.parallel.plan` (`eqsat bench parallel --user-programs ...`) ----

USER_MESHES: tuple[str, ...] = ("8", "2x4", "4x2")


def run_user_programs(out_dir: Path, programs: Sequence[str], meshes: Sequence[str] | None = None,
                      time_limit: float = 60.0) -> list[dict[str, Any]]:
    """`experiments.parallel_user_programs.run` per program and mesh: `parallel_user.jsonl` (its whole
    rows) and `parallel_user.md` (`SUMMARY_COLUMNS`: predicted ms, compiled bytes and memory of the
    plan, data parallel and FSDP, plan seconds, dominance, the plan's step against data parallel's
    as run, loss match)."""
    from experiments import parallel_user_programs as upp

    unknown = sorted(set(programs) - set(upp.PROGRAMS))
    if unknown:
        raise EqsatError(f"unknown user program(s) {', '.join(unknown)}; known: {', '.join(upp.PROGRAMS)}")
    bad = [m for m in meshes or USER_MESHES if not all(p.isdigit() and int(p) > 0 for p in m.lower().split("x"))]
    if bad:  # before any plan
        raise EqsatError(f"mesh {bad[0]!r} is not a shape like 8 or 2x4")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out_dir / "parallel_user.jsonl", "w") as log:
        for program in programs:
            for mesh in meshes or USER_MESHES:
                row = upp.run(program, mesh, time_limit)
                rows.append(row)
                log.write(json.dumps(row, default=str) + "\n")
                log.flush()
    cols = upp.SUMMARY_COLUMNS
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k in cols) + " |" for r in rows]
    (out_dir / "parallel_user.md").write_text("\n".join(lines) + "\n")
    return [{k: r.get(k) for k in cols} for r in rows]


# --- the time model against measured steps (`eqsat bench parallel --spearman`) ------------------

SPEARMAN_PLANS = 10  # random plans per case: distinct plans, each compiled and timed
SPEARMAN_MESH = "2x4"  # two axes: each with its own fitted link
SPEARMAN_PRECISION = 0.05  # past the budget, time until each plan's 95% interval is at most this of its median
SPEARMAN_MAX_ROUNDS = 400  # rounds at most (the time cap, `PRECISION_CAP` x the budget, usually ends it first)
SPEARMAN_NOTE = ("measured on 8 XLA host-CPU 'devices' in one process sharing this machine's cores (and, on a shared "
                 "box, other users' work): a collective is a memcpy between threads and 'parallel' compute is time-"
                 "sliced, so a rank correlation says whether the model orders plans as these devices run them, "
                 "not how a GPU cluster would, and absolute times are not wall-clock predictions for any accelerator")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their average rank); NaN when either side is constant."""
    import numpy as np

    def ranks(v: Sequence[float]) -> Any:
        a = np.asarray(v, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=np.float64)
        for value in np.unique(a):  # average rank of ties
            tied = a == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if len(rx) < 2 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_plans(model: str, mesh: Any, plans: int = SPEARMAN_PLANS) -> tuple[Any, Any, list[Any]]:
    """A case's graph, its priced joint e-graph and its distinct random plans, drawn as
    `spearman_case` times them (`experiments/spearman_reprice.py` draws them again to reprice a
    stored run)."""
    from eqsat.models import build_parallel_model

    graph = build_parallel_model(model)
    return (graph, *distinct_random_plans(graph, mesh, plans))


def distinct_random_plans(graph: Any, mesh: Any, plans: int = SPEARMAN_PLANS) -> tuple[Any, list[Any]]:
    """`graph`'s priced joint e-graph (briefly saturated) and up to `plans` distinct random plans of it."""
    import numpy as np

    from eqsat.parallel.planner import saturate_and_price
    from eqsat.saturate import Limits

    pe = saturate_and_price(graph, mesh, "joint", Limits(iterations=12, nodes=50_000, seconds=15.0))
    # random plans as `random_plans` draws them, but node costs log-uniform over six decades: with
    # uniform costs a plan with fewer nodes nearly always wins (the unsplit program), so few differ
    rng = np.random.default_rng(1)
    distinct: dict[str, Any] = {}
    for _ in range(4 * plans):
        if len(distinct) >= plans:
            break
        p = pe.priced.with_costs(10 ** rng.uniform(-3, 3, size=pe.data.n_nodes)).extract("greedy-dag", 10.0)[1]
        distinct.setdefault(repr(p.live().nodes), p)
    return pe, list(distinct.values())


def spearman_case(model: str, mesh_spec: str = SPEARMAN_MESH, plans: int = SPEARMAN_PLANS,
                  budget_s: float = 6.0, rel_width: float | None = SPEARMAN_PRECISION) -> dict[str, Any]:
    """One case's distinct random plans (from a briefly saturated joint e-graph), each priced by the
    nominal model (the mesh preset's links, roofline at the preset's peak), the calibrated one
    (`eqsat parallel calibrate`'s links, in-program cost per collective, compute and layout copies,
    without and with overlap; `calibrated_no_sync` without the in-program term and the drift,
    `calibrated_no_copies` without the layout copies), and timed as a
    training step on the devices (`jax_backend.parallel_calibrate.step_seconds`: past `budget_s`,
    until each plan's 95% interval is at most `rel_width` of its median, within a cap); each plan's
    interval and its calibrated compute and communication seconds are kept beside its times.
    `spearman_measured_halves` ranks the plans' odd rounds against their even rounds: the run's
    measurement against itself, which no model can be expected to beat."""
    import math
    import time

    from eqsat.parallel.calibration import calibrated_model
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_report
    from jax_backend.parallel_calibrate import load_mesh_calibration, step_seconds

    t0 = time.perf_counter()
    mesh = parse_mesh(mesh_spec)
    cal, _ = load_mesh_calibration(mesh)
    graph, pe, chosen = spearman_plans(model, mesh, plans)
    models = {"nominal": pe.model, "calibrated": calibrated_model(cal, overlap=False),
              "calibrated_overlap": calibrated_model(cal, overlap=True),
              "calibrated_no_sync": calibrated_model(cal, overlap=False, sync=False),  # without the in-program term, the drift
              "calibrated_no_copies": calibrated_model(cal, overlap=False, copies=False)}  # without the layout copies
    predicted = {k: [plan_report(p, m).step_s for p in chosen] for k, m in models.items()}
    wire = [float(sum(c.wire_bytes for _, c in plan_report(p, pe.model).collectives)) for p in chosen]
    reports = [plan_report(p, models["calibrated"]) for p in chosen]
    compiled = [_compiled_step_facts(graph, p, mesh) for p in chosen]
    timings = step_seconds(graph, chosen, mesh, budget_s=budget_s, rounds=SPEARMAN_MAX_ROUNDS, rel_width=rel_width)
    measured = [t.seconds for t in timings]
    ran = [i for i, m in enumerate(measured) if math.isfinite(m)]  # a plan that does not lower is left out
    row: dict[str, Any] = {"model": model, "mesh": mesh_spec, "plans": len(ran), "plans_not_lowered": len(chosen) - len(ran)}
    row.update({f"spearman_{k}": spearman([v[i] for i in ran], [measured[i] for i in ran]) for k, v in predicted.items()})
    # the measurement against itself: odd rounds against even ones (what a perfect model could score)
    row["spearman_measured_halves"] = spearman([timings[i].halves[0] for i in ran], [timings[i].halves[1] for i in ran])
    row.update(measured_ms=[m * 1e3 for m in measured], measured_low_ms=[t.low * 1e3 for t in timings],
               measured_high_ms=[t.high * 1e3 for t in timings], rounds=max(t.rounds for t in timings),
               measured_halves_ms=[[h * 1e3 for h in t.halves] for t in timings],
               measured_max_rel_width=max((timings[i].rel_width for i in ran), default=float("nan")),
               **{f"predicted_{k}_ms": [s * 1e3 for s in v] for k, v in predicted.items()},
               calibrated_compute_ms=[r.compute_s * 1e3 for r in reports], calibrated_comm_ms=[r.comm_s * 1e3 for r in reports],
               collectives=[len(r.collectives) for r in reports], step_wire_bytes=wire,
               predicted_copy_bytes=[r.copy_bytes for r in reports], calibrated_copy_ms=[r.copy_s * 1e3 for r in reports],
               compiled_rendezvous=[c[0] for c in compiled], compiled_copy_bytes=[c[1] for c in compiled],
               seconds=time.perf_counter() - t0, plan_graphs=[p.to_json() for p in chosen])
    return row


def _compiled_step_facts(graph: Any, plan: Any, mesh: Any) -> tuple[float, float]:
    """What the compiled training step of `plan` runs beyond the plan's own terms: its collective
    operations (`compiled_rendezvous`) and the bytes its `copy` instructions write
    (`compiled_copy_bytes`); NaN for a plan that does not lower. Kept beside each plan's times so a
    run's residuals can be read against the compiled program without drawing its plans again."""
    from jax_backend.checks import _scaled_inputs
    from jax_backend.shard import compiled_copy_bytes, compiled_rendezvous, shard_plan, step_program

    weights = [n.attr["name"] for _, n in graph.leaves("weight")]
    program = shard_plan(plan, mesh)
    try:
        text = step_program(program, weights).lower(*program.place(_scaled_inputs(graph, 0))).compile().as_text()
    except (TypeError, ValueError):
        return float("nan"), float("nan")
    return float(compiled_rendezvous(text)), compiled_copy_bytes(text)


def run_spearman(out_dir: Path, models: Sequence[str] | None = None, mesh: str = SPEARMAN_MESH,
                 plans: int = SPEARMAN_PLANS, budget_s: float = 6.0,
                 rel_width: float | None = SPEARMAN_PRECISION) -> list[dict[str, Any]]:
    """`spearman_case` over the cases: `parallel_spearman.jsonl` (every plan's times) and
    `parallel_spearman.md` (Spearman per case and model, and what such figures mean)."""
    unknown = sorted(set(models or ()) - set(CASES))
    if unknown:
        raise EqsatError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if plans < 3:
        raise EqsatError(f"--random-plans: a rank correlation needs at least 3 plans, not {plans}")
    from eqsat.parallel.mesh import parse_mesh
    from jax_backend.parallel_calibrate import load_mesh_calibration

    load_mesh_calibration(parse_mesh(mesh))  # a bad mesh fails before any case; calibrated once
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out_dir / "parallel_spearman.jsonl", "w") as log:
        for model in models or CASES:
            row = spearman_case(model, mesh, plans, budget_s, rel_width)
            # the plans themselves, so a stored run can be priced again (`experiments/spearman_reprice.py`)
            (out_dir / f"parallel_spearman_plans_{model}.json").write_text(json.dumps(row.pop("plan_graphs")))
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
    keys = ("model", "mesh", "plans", "plans_not_lowered", "spearman_nominal", "spearman_calibrated", "spearman_calibrated_overlap",
            "spearman_calibrated_no_sync", "spearman_calibrated_no_copies", "spearman_measured_halves", "rounds",
            "measured_max_rel_width")
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    (out_dir / "parallel_spearman.md").write_text("\n".join(lines) + f"\n\nTimes {SPEARMAN_NOTE}.\n")
    return [{**{k: r[k] for k in keys}, "note": SPEARMAN_NOTE} for r in rows]

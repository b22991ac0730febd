"""`eqsat bench jax` / `python -m experiments.bench_jax`: @eqsat.optimize on the target programs.

Per program: speedup over `jax.jit` of the original (paired, interleaved medians), first-call
seconds (optimization included), outputs / gradients / vmap equal (rtol 2e-4), and what was used.
Then: first-call overhead on a 12-layer transformer, and whether the cost models rank whole graphs
as measured (Spearman rank correlation over the captured graphs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.jax_programs import PROGRAMS, JaxProgram, transformer_stack

__all__ = ["run_bench", "bench_program", "rank_check"]

RTOL = 2e-4


def _close(a: Any, b: Any) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=RTOL * max(1.0, float(np.max(np.abs(np.asarray(y))))))
        for x, y in zip(la, lb))


def bench_program(prog: JaxProgram, rounds: int, options: dict[str, Any]) -> dict[str, Any]:
    from jax_backend.decorator import optimize, paired_times

    args = prog.make_args(0)
    opt = optimize(prog.fn, **options)
    fast = jax.jit(opt)
    ref = jax.jit(prog.fn)
    start = time.perf_counter()
    out = jax.block_until_ready(fast(*args))
    first_call_s = time.perf_counter() - start
    report = opt.report(*args)
    outputs_ok = _close(out, ref(*args))
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
    grads_ok = _close(jax.jit(jax.grad(loss(opt), argnums=tuple(range(len(args)))))(*args),
                      jax.jit(jax.grad(loss(prog.fn), argnums=tuple(range(len(args)))))(*args))
    batched = list(args)
    batched[prog.batch_arg] = jnp.stack([args[prog.batch_arg], prog.make_args(1)[prog.batch_arg]])
    axes = tuple(0 if i == prog.batch_arg else None for i in range(len(args)))
    vmap_ok = _close(jax.vmap(opt, in_axes=axes)(*batched), jax.vmap(prog.fn, in_axes=axes)(*batched))
    t_ref, t_opt = paired_times(ref, fast, args, rounds, budget_s=30.0)
    return {"program": prog.name, "used": report.used, "speedup": t_ref / t_opt, "jit_ms": t_ref * 1e3,
            "optimized_ms": t_opt * 1e3, "first_call_s": first_call_s, "optimize_s": report.optimize_s,
            "outputs_ok": outputs_ok, "grads_ok": grads_ok, "vmap_ok": vmap_ok,
            "opaque": ",".join(sorted(set(report.opaque))), "reason": report.reason,
            "rules_fired": sum(len(s.rules_fired) for s in report.segments)}


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


def rank_check(rounds: int) -> list[dict[str, Any]]:
    """Predicted vs measured whole-graph time over every captured graph of the target programs."""
    from eqsat.cost import cost_model
    from jax_backend.capture import capture, graph_leaf_name
    from jax_backend.lower import to_jax
    from jax_backend.measured_cost import time_callable

    measured, roofline = cost_model("measured"), cost_model("roofline", "cpu")
    rows: list[dict[str, Any]] = []
    for prog in PROGRAMS:
        program, _ = capture(prog.fn, *prog.make_args(0))
        for k, step in enumerate(program.graphs):
            g = step.graph.live()
            if sum(1 for n in g.nodes if n.op not in ("input", "weight")) < 3:
                continue
            inputs = {graph_leaf_name(i): jnp.asarray(np.abs(np.random.default_rng(0).standard_normal(program.avals[i][0]))
                                                      + 0.5, jnp.float32) for i in step.inputs}
            fn = jax.jit(to_jax(g, precision="default"))
            t = time_callable(fn, [inputs], repeats=rounds)
            live_nodes = [n for n in g.nodes if n.op not in ("input", "weight")]
            shapes = lambda n: [g.shape(v) for v in n.inputs]  # noqa: E731
            rows.append({"graph": f"{prog.name}/{k}", "measured_ms": t * 1e3,
                         "pred_fused_ms": 1e3 * sum(measured.op_cost(n.op, n.attr, shapes(n)) for n in live_nodes),
                         "pred_isolated_ms": 1e3 * sum(measured.isolated_cost(n.op, n.attr, shapes(n))
                                                       for n in live_nodes if n.op not in ("reshape", "slice", "split")),
                         "pred_roofline_ms": 1e3 * sum(roofline.op_cost(n.op, n.attr, shapes(n)) for n in live_nodes)})
    measured.save()
    truth = [r["measured_ms"] for r in rows]
    summary = {"graph": "SPEARMAN(rank vs measured)", "measured_ms": 1.0,
               "pred_fused_ms": _spearman([r["pred_fused_ms"] for r in rows], truth),
               "pred_isolated_ms": _spearman([r["pred_isolated_ms"] for r in rows], truth),
               "pred_roofline_ms": _spearman([r["pred_roofline_ms"] for r in rows], truth)}
    return rows + [summary]


def run_bench(out_dir: Path | None = None, rounds: int = 30, cost_model: str = "measured", time_limit: float = 10.0,
              programs: Sequence[str] | None = None, with_ranking: bool = True) -> Iterable[dict[str, Any]]:
    from rich.progress import Progress

    warnings.simplefilter("ignore")
    options = {"cost_model": cost_model, "time_limit": time_limit}
    chosen = [p for p in PROGRAMS if programs is None or p.name in programs]
    rows: list[dict[str, Any]] = []
    with Progress(transient=True, console=__import__("rich.console").console.Console(stderr=True)) as bar:
        task = bar.add_task("bench jax", total=len(chosen) + 1)
        for prog in chosen:
            bar.update(task, description=prog.name)
            rows.append(bench_program(prog, rounds, options))
            bar.advance(task)
        from jax_backend.decorator import optimize

        fn, args = transformer_stack(12)
        start = time.perf_counter()
        jax.block_until_ready(jax.jit(optimize(fn, **options))(*args))
        rows.append({"program": "transformer12_first_call", "first_call_s": time.perf_counter() - start})
        bar.advance(task)
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    rows.append({"program": "GEOMEAN", "speedup": math.exp(sum(map(math.log, speedups)) / len(speedups))})
    if with_ranking:
        rows += rank_check(rounds)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench_jax.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cost-model", default="measured")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--programs", nargs="*", default=None)
    parser.add_argument("--no-ranking", action="store_true")
    args = parser.parse_args(argv)
    for row in run_bench(args.out, args.rounds, args.cost_model, args.time_limit, args.programs, not args.no_ranking):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

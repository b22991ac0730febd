"""Activation checkpointing under a memory budget, on the MLP classifier (or the GPT decoder,
`--program gpt`, at its default sizes) of `experiments.parallel_user_programs` (optax Adam). Plans the step without a budget, then with
`memory_budget` = FRAC x the unbudgeted plan's predicted memory; for each plan one JSON row: the
predicted memory and step, the products recomputed, the compiled step's memory and flops, the same
shardings compiled without the recompute, and 3 steps against the single-device `jax.jit(step)`.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.parallel_checkpointing \
        [--program mlp|gpt] [--batch 8192] [--sizes 256,512,512,64] [--mesh 2x4] [--fracs 0.9]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax
import numpy as np

import eqsat.parallel as ep
from eqsat.parallel.api import compile_figures
from experiments.parallel_user_programs import LR, gpt_problem, mlp_problem


def _against_single_device(step: Any, args: tuple[Any, ...], plan: Any, steps: int = 3) -> dict[str, float]:
    """Worst relative loss difference and worst absolute parameter difference over `steps` steps."""
    ref, run = jax.jit(step), plan.jit()
    a, b = args, plan.place(*args)
    loss = params = 0.0
    for _ in range(steps):
        oa, ob = ref(*a), run(*b)
        loss = max(loss, abs(float(oa[2]) - float(ob[2])) / abs(float(oa[2])))
        params = max(params, max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                                 for x, y in zip(jax.tree_util.tree_leaves(oa[0]), jax.tree_util.tree_leaves(ob[0]))))
        a, b = (oa[0], oa[1], args[2]), (ob[0], ob[1], b[2])
    return {"loss_rel_diff": loss, "params_abs_diff": params, "params_bound": 2 * LR * steps}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--program", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--sizes", default="256,512,512,64")
    ap.add_argument("--mesh", default="2x4")
    ap.add_argument("--fracs", default="0.9")
    ap.add_argument("--time-limit", type=float, default=60.0)
    opts = ap.parse_args(argv)
    step, args = (gpt_problem() if opts.program == "gpt" else
                  mlp_problem(batch=opts.batch, sizes=tuple(int(s) for s in opts.sizes.split(","))))
    shape = tuple(int(s) for s in opts.mesh.split("x"))
    mesh = jax.make_mesh(shape, ("data", "model")[:len(shape)])
    abstract = tuple(jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args))
    free: float | None = None
    for frac in (None, *(float(f) for f in opts.fracs.split(","))):
        budget = None if frac is None or free is None else frac * free
        t0 = time.perf_counter()
        mlp = opts.program == "mlp"
        row: dict[str, Any] = {"program": opts.program, "batch": opts.batch if mlp else None,
                               "sizes": opts.sizes if mlp else None, "mesh": opts.mesh, "budget_frac": frac,
                               "memory_budget": budget}
        try:
            plan = ep.plan(step, *args, mesh=mesh, params_argnums=(0, 1), memory_budget=budget, baselines=False,
                           time_limit=opts.time_limit, within=None)
        except ep.ApiError as exc:
            print(json.dumps({**row, "error": str(exc)}), flush=True)
            continue
        r = plan.report
        if frac is None:
            free = r.predicted_mem_bytes
        plain = compile_figures(jax.jit(step, in_shardings=plan.in_shardings, out_shardings=plan.out_shardings), abstract)
        assert r.compiled is not None
        row.update({"plan_s": time.perf_counter() - t0, "recomputed_products": r.recomputed,
                    "predicted_mem_bytes": r.predicted_mem_bytes, "predicted_step_s": r.predicted_step_s,
                    "compiled_mem_bytes": r.compiled.mem_bytes, "compiled_flops": r.compiled.flops,
                    "same_shardings_no_recompute_mem_bytes": plain.mem_bytes,
                    "same_shardings_no_recompute_flops": plain.flops, **_against_single_device(step, args, plan)})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""A parallel plan as 2 processes x 4 CPU devices on this machine (`jax.distributed` on 127.0.0.1,
gloo collectives), checked against the single-device program.

    eqsat bench multiprocess mlp --mesh 2x4         # a user program's training step (loss, grad, Adam)
    eqsat bench multiprocess gpt-block --mesh 8     # a built-in case's plan, forward

A user program (`experiments.parallel_user_programs`: mlp, gpt) runs its full training step:
one process with 8 CPU devices plans it (`eqsat.parallel.plan`) and runs it 3 steps, planned
and on a single device (`jax.jit(train_step)`), the references; then 2 processes x 4 devices
build the same 8-device mesh, place the same arguments on the plan's in_shardings (PartitionSpecs,
as JSON) and run `jax.jit(train_step, in_shardings, out_shardings)` 3 steps; process 0 writes the
losses and the new parameters (gathered from both processes). The row: losses equal the
single-device run's (rtol 1e-4) and the one-process planned run's, and the parameters within
2 lr steps of either (Adam turns noise-level gradient differences into full steps). The children
use the plan's in / out shardings only: `with_sharding_constraint`s the plan places inside the
step (`report.constraints`, at opaque boundaries) are left to GSPMD there, and the row says how many.

A built-in case:

The parent plans once and writes the plan (Graph JSON); each child process initializes
`jax.distributed` with 4 local CPU devices, builds the global 8-device mesh, runs the plan's
`shard_map` program on inputs made from the same seed, and process 0 writes the outputs, which
the parent compares with the program evaluated in numpy (float64). One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

PROCESSES = 2
LOCAL_DEVICES = 4
TRAIN_STEPS = 3
TRAIN_PROGRAMS = ("mlp", "gpt")  # experiments.parallel_user_programs.PROGRAMS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(plan_path: Path, model: str, mesh_spec: str, port: int, pid: int, out: Path) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=pid,
                               local_device_ids=list(range(LOCAL_DEVICES)))
    from eqsat.ir import Graph
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.models import build_parallel_model
    from jax_backend.shard import shard_plan

    graph = build_parallel_model(model)
    plan = Graph.load(plan_path)
    program = shard_plan(plan, parse_mesh(mesh_spec))
    values = graph.random_inputs(0)
    def piece(value: np.ndarray) -> Any:
        return lambda index: value[index]

    args = [jax.make_array_from_callback(values[n].shape, s, piece(values[n]))
            for n, s in zip(program.names, program.in_shardings)]
    outs = program.fn(*args)
    if pid == 0:
        np.savez(out, *[np.asarray(o.addressable_data(0)) for o in outs])
    jax.distributed.shutdown()


def run(model: str, mesh_spec: str, timeout: float = 600.0) -> dict[str, Any]:
    """A user program's training step (`run_training`), or a built-in case's plan, forward."""
    if model in TRAIN_PROGRAMS:
        return run_training(model, mesh_spec, timeout)
    from eqsat.compare import outputs_agree
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_graph
    from eqsat.models import build_parallel_model

    graph = build_parallel_model(model)
    result = plan_graph(graph, parse_mesh(mesh_spec))
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out = Path(tmp) / "plan.json", Path(tmp) / "out.npz"
        result.plan.save(plan_path)
        port = _free_port()
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
               "JAX_PLATFORMS": "cpu"}
        errors = _run_children(lambda pid: [sys.executable, "-m", "experiments.parallel_multiprocess", model,
                                            "--mesh", mesh_spec, "--child", str(pid), "--port", str(port),
                                            "--plan", str(plan_path), "--out", str(out)], env, timeout)
        if errors:
            return {"model": model, "mesh": mesh_spec, "processes": PROCESSES, "numerics_ok": False, "error": errors[0]}
        got = [v for _, v in sorted(np.load(out).items(), key=lambda kv: int(kv[0].split("_")[1]))]
    ref = graph.evaluate({k: v.astype(np.float64) for k, v in graph.random_inputs(0).items()})
    verdict = outputs_agree(ref, got, 2e-4, atol=2e-4)
    return {"model": model, "mesh": mesh_spec, "processes": PROCESSES, "local_devices": LOCAL_DEVICES,
            "numerics_ok": verdict.ok, "max_rel_diff": verdict.max_rel_err,
            "forward_collectives": sorted(c.kind for _, c in result.report.collectives if c.phase == "forward")}


# --- a user program's training step ----------------------------------------------------------------

def _mesh_shape(mesh_spec: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    shape = tuple(int(s) for s in mesh_spec.split("x"))
    return shape, ("data", "model")[:len(shape)]


def _spec_json(spec: Any) -> list[Any]:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def plan_child(program: str, mesh_spec: str, out: Path) -> None:
    """One process, 8 CPU devices: plan the step, run it planned and on one device (the references),
    and write the plan's PartitionSpecs, the losses and the new parameters."""
    import jax

    import eqsat.parallel as ep
    from experiments.parallel_user_programs import PROGRAMS

    step, args = PROGRAMS[program]()
    shape, names = _mesh_shape(mesh_spec)
    plan = ep.plan(step, *args, mesh=jax.make_mesh(shape, names), params_argnums=(0, 1), baselines=False)
    runs: dict[str, Any] = {}
    for name, fn in (("planned", plan.jit()), ("single", jax.jit(step))):
        params, opt_state, batch = args
        losses = []
        for _ in range(TRAIN_STEPS):
            params, opt_state, loss = fn(params, opt_state, batch)
            losses.append(float(loss))
        runs[name] = (losses, [np.asarray(p) for p in jax.tree_util.tree_leaves(params)])
    specs = {"in": [_spec_json(s.spec) for s in jax.tree_util.tree_leaves(plan.in_shardings)],
             "out": [_spec_json(s.spec) for s in jax.tree_util.tree_leaves(plan.out_shardings)],
             "losses": {k: v[0] for k, v in runs.items()}, "strategy": plan.report.strategy,
             "constraints": len(plan.report.constraints), "plan_s": plan.report.plan_s,
             "leaf_specs": dict(plan.report.leaf_specs)}
    (out / "plan.json").write_text(json.dumps(specs))
    for k, (_, params) in runs.items():
        np.savez(out / f"{k}.npz", *params)


def train_child(program: str, mesh_spec: str, plan_dir: Path, port: int, pid: int) -> None:
    """One of the 2 processes: the plan's shardings on the global 8-device mesh, 3 steps."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=pid,
                               local_device_ids=list(range(LOCAL_DEVICES)))
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    from experiments.parallel_user_programs import PROGRAMS

    specs = json.loads((plan_dir / "plan.json").read_text())
    step, args = PROGRAMS[program]()  # the same seeds: the same values in every process
    shape, names = _mesh_shape(mesh_spec)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(shape), names,
                             axis_types=(AxisType.Auto,) * len(names))

    def sharding(spec: list[Any]) -> Any:
        return NamedSharding(mesh, PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in spec]))

    flat, treedef = jax.tree_util.tree_flatten(tuple(args))
    in_sh = [sharding(s) for s in specs["in"]]
    placed = [jax.make_array_from_callback(np.shape(x), sh, (lambda v: lambda index: v[index])(np.asarray(x)))
              for x, sh in zip(flat, in_sh)]
    _, out_tree = jax.tree_util.tree_flatten(jax.eval_shape(step, *args))
    jitted = jax.jit(step, in_shardings=tuple(jax.tree_util.tree_unflatten(treedef, in_sh)),
                     out_shardings=jax.tree_util.tree_unflatten(out_tree, [sharding(s) for s in specs["out"]]))
    params, opt_state, batch = jax.tree_util.tree_unflatten(treedef, placed)
    losses = []
    for _ in range(TRAIN_STEPS):
        params, opt_state, loss = jitted(params, opt_state, batch)
        losses.append(float(np.asarray(loss.addressable_data(0))))
    gathered = multihost_utils.process_allgather(params, tiled=True)
    if pid == 0:
        (plan_dir / "losses.json").write_text(json.dumps(losses))
        np.savez(plan_dir / "processes.npz", *[np.asarray(p) for p in jax.tree_util.tree_leaves(gathered)])
    jax.distributed.shutdown()


def _npz(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [v for _, v in sorted(f.items(), key=lambda kv: int(kv[0].split("_")[1]))]


def _run_children(argv_of: Callable[[int], list[str]], env: Mapping[str, str], timeout: float) -> list[str]:
    """Start the `PROCESSES` child processes together (they meet in `jax.distributed`), wait for
    each within `timeout`, and return the last error line of each that failed."""
    procs = [subprocess.Popen(argv_of(pid), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for pid in range(PROCESSES)]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append(_last_error(err, p.returncode))
    return errors


def _last_error(err: str, code: int) -> str:
    return err.strip().splitlines()[-1] if err.strip() else f"exit {code}"


def run_training(program: str, mesh_spec: str, timeout: float = 600.0) -> dict[str, Any]:
    """The training step of `program` on 2 processes x 4 devices against one process (module doc)."""
    from experiments.parallel_user_programs import LR

    row: dict[str, Any] = {"program": program, "mesh": mesh_spec, "processes": PROCESSES,
                           "local_devices": LOCAL_DEVICES, "steps": TRAIN_STEPS}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        me = [sys.executable, "-m", "experiments.parallel_multiprocess", program, "--mesh", mesh_spec, "--plan", str(d)]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        one = subprocess.run([*me, "--plan-child"], env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
                             capture_output=True, text=True, timeout=timeout)
        if one.returncode != 0:
            return {**row, "same_as_one_process": False, "error": _last_error(one.stderr, one.returncode)}
        port = _free_port()
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"
        errors = _run_children(lambda pid: [*me, "--child", str(pid), "--port", str(port)], env, timeout)
        if errors:
            return {**row, "same_as_one_process": False, "error": errors[0]}
        plan = json.loads((d / "plan.json").read_text())
        losses = json.loads((d / "losses.json").read_text())
        got = _npz(d / "processes.npz")
        refs = {k: _npz(d / f"{k}.npz") for k in ("planned", "single")}
    bound = 2 * LR * TRAIN_STEPS
    for k, ref in refs.items():
        rl = plan["losses"][k]
        row[f"loss_rel_diff_vs_{k}"] = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, rl))
        row[f"param_max_diff_vs_{k}"] = max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref))
    row.update({"losses": losses, "losses_single_device": plan["losses"]["single"], "strategy": plan["strategy"],
                "constraints_left_to_gspmd": plan["constraints"], "plan_s": plan["plan_s"],
                "leaf_specs": plan["leaf_specs"]})
    row["same_as_one_process"] = all(row[f"loss_rel_diff_vs_{k}"] <= 1e-4 and row[f"param_max_diff_vs_{k}"] <= bound
                                     for k in refs)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mesh", default="8")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plan-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model in TRAIN_PROGRAMS and args.plan_child:
        plan_child(args.model, args.mesh, args.plan)
        return 0
    if args.model in TRAIN_PROGRAMS and args.child is not None:
        train_child(args.model, args.mesh, args.plan, args.port, args.child)
        return 0
    if args.child is None:
        parser.error("this entry is the child processes'; run it as: eqsat bench multiprocess MODEL --mesh 8")
    child(args.plan, args.model, args.mesh, args.port, args.child, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

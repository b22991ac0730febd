"""A parallel plan as 2 processes x 4 CPU devices on this machine (`jax.distributed` on 127.0.0.1,
gloo collectives), checked against the single-device program.

    eqsat bench multiprocess gpt-block --mesh 8

The parent plans once and writes the plan (Graph JSON); each child process initializes
`jax.distributed` with 4 local CPU devices, builds the global 8-device mesh, runs the plan's
`shard_map` program on inputs made from the same seed, and process 0 writes the outputs, which
the parent compares with the program evaluated in numpy (float64). One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

PROCESSES = 2
LOCAL_DEVICES = 4


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
        procs = [subprocess.Popen([sys.executable, "-m", "experiments.parallel_multiprocess", model, "--mesh", mesh_spec,
                                   "--child", str(pid), "--port", str(port), "--plan", str(plan_path), "--out", str(out)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for pid in range(PROCESSES)]
        errors = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if p.returncode != 0:
                errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
        if errors:
            return {"model": model, "mesh": mesh_spec, "processes": PROCESSES, "numerics_ok": False, "error": errors[0]}
        got = [v for _, v in sorted(np.load(out).items(), key=lambda kv: int(kv[0].split("_")[1]))]
    ref = graph.evaluate({k: v.astype(np.float64) for k, v in graph.random_inputs(0).items()})
    verdict = outputs_agree(ref, got, 2e-4, atol=2e-4)
    return {"model": model, "mesh": mesh_spec, "processes": PROCESSES, "local_devices": LOCAL_DEVICES,
            "numerics_ok": verdict.ok, "max_rel_diff": verdict.max_rel_err,
            "forward_collectives": sorted(c.kind for _, c in result.report.collectives if c.phase == "forward")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mesh", default="8")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        parser.error("this entry is the child processes'; run it as: eqsat bench multiprocess MODEL --mesh 8")
    child(args.plan, args.model, args.mesh, args.port, args.child, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-kernel times of saved plans as XLA:CPU runs them, beside the xla model's price of each conv (issue 24).

`jax.profiler` traces a jitted plan with one event per XLA:CPU thunk (`ynn_fusion`: a conv through
YNNPACK; `transpose_copy_fusion`, `dot`, ...), named as in the compiled HLO, so each conv thunk maps to
its output shape, window and groups. Per plan: thread-seconds per kind of thunk (summed over threads:
thunks of independent branches run concurrently), and per conv signature the median thunk time against
the model's price of a conv of that output shape and kernel (`XlaModel`'s library branch, no transposes).
Times under load are inflated: read ratios within one plan, not levels, unless the box is quiet.

    python -m experiments.xla_cpu_profile --calibration cal.json --plans DIR --runs 10 \\
        nasneta:candidate.layout-original vgg:before
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eqsat import ops
from eqsat.ir import Graph
from eqsat.xla_cost import Calibration, XlaModel


def _program(graph: Graph) -> tuple[Callable[[], Any], str]:
    """The plan jitted as `jax_backend.checks` runs it (weight-only values folded), and its compiled HLO."""
    import jax
    import numpy as np

    from jax_backend.lower import fold_weights, to_jax

    live = graph.live()
    rng = np.random.default_rng(0)
    inputs = {n.attr["name"]: rng.standard_normal(n.shapes[0]).astype(np.float32) for _, n in live.leaves()}
    folded, values = fold_weights(live, inputs)
    args = {k: jax.device_put(v) for k, v in values.items()}
    compiled = jax.jit(to_jax(folded)).lower(args).compile()
    return (lambda: jax.block_until_ready(compiled(args))), compiled.as_text() or ""


def thunk_times(run: Callable[[], Any], runs: int) -> dict[str, list[float]]:
    """Seconds of each XLA:CPU thunk per call, over `runs` traced calls (after two untraced)."""
    import jax
    from jax._src.lib import _profile_data

    run(), run()
    folder = tempfile.mkdtemp()
    try:
        jax.profiler.start_trace(folder)
        for _ in range(runs):
            run()
        jax.profiler.stop_trace()
        data = _profile_data.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):
                continue
            for event in line.events:
                if not event.name.startswith(("ThreadpoolListener", "end:", "ThunkExecutor", "Slinky")):
                    times[event.name].append(event.duration_ns * 1e-9)
    return times


def conv_signatures(hlo: str) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """Conv fusion name -> (output shape, window, feature groups), from the compiled HLO text."""
    comps: dict[str, tuple[str, int]] = {}
    current = ""
    for line in hlo.splitlines():
        head = re.match(r"%(\S+) \(.*\{$", line)
        if head:
            current = head.group(1)
        if current and " convolution(" in line:
            window = re.search(r"window=\{([^}]*)\}", line)
            groups = re.search(r"feature_group_count=(\d+)", line)
            comps[current] = (window.group(1) if window else "", int(groups.group(1)) if groups else 1)
    found = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = f32\[([\d,]*)\]\S* fusion\(.*calls=%([\w.]+)", line)
        if m and m.group(3) in comps:
            found[m.group(1)] = (tuple(int(d) for d in m.group(2).split(",")), *comps[m.group(3)])
    return found


def conv_prices(graph: Graph, cal: Calibration) -> dict[tuple[tuple[int, ...], int], list[float]]:
    """(NHWC output shape, kernel height) -> the model's seconds for each conv of the plan (no transposes)."""
    model = XlaModel(cal)
    live = graph.live()
    prices: dict[tuple[tuple[int, ...], int], list[float]] = collections.defaultdict(list)
    for node in live.nodes:
        layout = ops.op_spec(node.op).conv_layout
        if layout is None:
            continue
        shapes = [tuple(live.nodes[v.node].shapes[v.index]) for v in node.inputs]
        out = tuple(node.shapes[0])
        kernel = shapes[1][2] if layout == "NCHW" else shapes[1][0]
        if layout == "NCHW":
            out = tuple(out[p] for p in ops.NHWC_IN)
        prices[(out, kernel)].append(model._seconds(node.op, node.attr, shapes, (False,) * len(shapes)))
    return prices


def report(cal: Calibration, plans: Path, target: str, runs: int) -> None:
    """Print one plan's thread-seconds per kind of thunk and its convs against their prices."""
    model, name = target.split(":")
    graph = Graph.load(plans / f"{model}.{name}.json")
    run, hlo = _program(graph)
    times = thunk_times(run, runs)
    kinds: dict[str, float] = collections.defaultdict(float)
    for thunk, ts in times.items():
        kinds[re.sub(r"[._]\d+$", "", thunk)] += sum(ts) / runs
    print(f"## {model} {name}: thread-ms per call " + ", ".join(
        f"{k} {v * 1e3:.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6]))
    prices = conv_prices(graph, cal)
    groups: dict[tuple[tuple[int, ...], str, int], list[float]] = collections.defaultdict(list)
    for thunk, (out, window, feature_groups) in conv_signatures(hlo).items():
        if thunk in times:
            groups[(out, window, feature_groups)].append(statistics.median(times[thunk]))
    print("| output (NHWC) | window | groups | convs | in program, median us | priced us | priced / in program |")
    print("|---|---|---|---|---|---|---|")
    for (out, window, feature_groups), ts in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        size = re.search(r"size=(\d+)", window)
        priced = prices.get((out, int(size.group(1)) if size else 1), [])
        measured = statistics.median(ts)
        price = statistics.median(priced) if priced else float("nan")
        print(f"| {out} | {window} | {feature_groups} | {len(ts)} | {measured * 1e6:.0f} | {price * 1e6:.0f} "
              f"| {price / measured:.2f} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--plans", type=Path, required=True, help="the --save-graphs folder")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("targets", nargs="+", metavar="MODEL:NAME", help="e.g. vgg:before, vgg:candidate.layout")
    args = parser.parse_args(argv)
    cal = Calibration.from_json(json.loads(args.calibration.read_text(encoding="utf-8")))
    for target in args.targets:
        report(cal, args.plans, target, args.runs)


if __name__ == "__main__":
    main()

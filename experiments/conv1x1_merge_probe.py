"""Merged 1x1 convs against their parts on this device: measured, and predicted by the xla model (issue 24).

Each case is one input read by dense 1x1 convs of the given output channels ("separate") against one
conv of their summed channels ("merged"): the parts' outputs against the merged output, no concat
(a plan's consumers read the merged conv's channel slices as views). Both are timed end to end
with the one timing policy (`jax_backend.timing.screen_timings`: paired interleaved rounds, 95%
interval), and priced by the xla model under the cached calibration (`eqsat calibrate`), as
measured and without its 1x1 surfaces (the format-4 model: convs by flops alone).

    python -m experiments.conv1x1_merge_probe [--budget 6] [--nhwc]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np

from eqsat.cost import predicted_speedup
from eqsat.ir import Graph, GraphBuilder
from eqsat.xla_cost import XlaModel
from jax_backend.calibrate import load_calibration
from jax_backend.lower import to_jax_positional
from jax_backend.timing import screen_timings

CASES: tuple[tuple[tuple[int, int, int, int], tuple[int, ...]], ...] = (
    ((1, 768, 17, 17), (192, 192, 192, 192)), ((1, 768, 17, 17), (192, 160, 160)), ((1, 768, 17, 17), (192, 192)),
    ((1, 2048, 8, 8), (320, 384, 448)), ((1, 1280, 8, 8), (320, 384, 448)), ((1, 288, 35, 35), (64, 48, 64)),
    ((1, 256, 56, 56), (64, 64)))
"""(NCHW input, output channels of each part): Inception-v3's merged 1x1 convs and two small ones."""


def convs(x_shape: tuple[int, int, int, int], parts: Sequence[int], nhwc: bool) -> Graph:
    """The input read by one dense 1x1 conv per part (NCHW, or NHWC with the input transposed)."""
    b = GraphBuilder()
    n, cin, h, w = x_shape
    x = b.input("x", (n, h, w, cin) if nhwc else x_shape)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    outs = []
    for i, cout in enumerate(parts):
        weight = b.weight(f"w{i}", (1, 1, cin, cout) if nhwc else (cout, cin, 1, 1))
        outs.append(b.apply("conv2d_nhwc" if nhwc else "conv2d", [x, weight], attrs)[0])
    return b.build(outs)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=6.0, help="seconds of timing rounds per case")
    parser.add_argument("--nhwc", action="store_true", help="NHWC convs (conv2d_nhwc) instead of NCHW")
    args = parser.parse_args(argv)
    cal, _ = load_calibration(measure_if_missing=False)
    models = {"predicted": XlaModel(cal), "predicted_format4": XlaModel(replace(cal, conv1x1=None, conv1x1_nhwc=None))}
    rng = np.random.default_rng(0)
    for x_shape, parts in CASES:
        separate, merged = convs(x_shape, parts, args.nhwc), convs(x_shape, (sum(parts),), args.nhwc)
        runs = []
        for graph in (separate, merged):
            _, fn = to_jax_positional(graph)
            arrays = [jax.numpy.asarray(rng.standard_normal(node.shapes[0]).astype(np.float32) * 0.05)
                      for _, node in graph.leaves()]
            runs.append(_bound(jax.jit(fn), arrays))
        (timing,) = screen_timings(runs[0], [runs[1]], (), rounds=40, budget_s=args.budget, min_rounds=8)
        low, high = timing.speedup_ci
        row = {"x": x_shape, "parts": parts, "measured": round(timing.speedup, 3), "ci": [round(low, 3), round(high, 3)],
               **{k: round(predicted_speedup(separate, merged, m) or float("nan"), 3) for k, m in models.items()},
               "separate_ms": round(timing.base_s * 1e3, 3), "merged_ms": round(timing.other_s * 1e3, 3),
               "load": round(os.getloadavg()[0], 1)}
        print(json.dumps(row), flush=True)


def _bound(fn: Callable[..., Any], arrays: list[jax.Array]) -> Callable[[], Any]:
    """A thunk running `fn` on `arrays` to completion."""
    return lambda: jax.block_until_ready(fn(*arrays))


if __name__ == "__main__":
    main()

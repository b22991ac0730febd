"""`eqsat calibrate`: measure this device for the "xla" cost model and cache the result.

Prints what was fitted (kernel floors per kind, call time, bandwidth, elementwise rate, dot, NHWC conv and grouped conv
efficiency against flops, transposes by kind and size) and where it is cached; `--force` measures again. A damaged cache or one from another
machine is never trusted: it is measured again with a one-line warning. `--check MODEL...` then
sets the xla model's predicted speedup beside the measured one for each model
(`jax_backend.calibration_check`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from eqsat.errors import EqsatError

__all__ = ["DEFAULT_CHECK_MODELS", "add_arguments", "run"]

DEFAULT_CHECK_MODELS = ("nasrnn", "squeezenet", "bert")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="measure again even if a valid calibration is cached")
    parser.add_argument("--device", default="cpu",
                        help="the device the calibration is for; it must be the one JAX runs on (default: cpu)")
    parser.add_argument("--check", nargs="*", metavar="MODEL", default=None,
                        help="then compare predicted and measured speedups on these models "
                             f"(no names: {' '.join(DEFAULT_CHECK_MODELS)})")
    parser.add_argument("--repeats", type=int, default=30, help="--check: interleaved timing rounds (the original and every plan)")
    parser.add_argument("--time-limit", type=float, default=15.0, help="--check: extraction seconds per cost model")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    from eqsat.models import MODELS, UnknownModelError
    from jax_backend.calibrate import calibration_path, load_calibration
    from jax_backend.measured_cost import check_measuring_device

    names = tuple(args.check or DEFAULT_CHECK_MODELS) if args.check is not None else ()
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise UnknownModelError(f"unknown model(s) {', '.join(unknown)}; known models: {', '.join(MODELS)}")
    if not args.repeats >= 1 or not args.time_limit > 0:
        raise EqsatError("--repeats must be at least 1 and --time-limit positive")
    try:
        check_measuring_device(args.device)
    except EqsatError:
        raise EqsatError(f"eqsat calibrate measures JAX's default device, which is not {args.device}: run it on a "
                         "machine with that device (or use --device cpu)") from None
    cal, status = load_calibration(force=args.force, say=lambda line: print(line, file=sys.stderr))
    fitted = {
        "device": cal.device, "status": status, "cache": str(calibration_path()), "seconds": cal.seconds,
        "launch_us": cal.launch_s * 1e6, "bandwidth_gbs": cal.bandwidth / 1e9, "loop_gflops": cal.loop_flops / 1e9,
        "weight_bandwidth_gbs": cal.weight_bandwidth / 1e9,
        "transpose_bandwidth_gbs": cal.transpose_bandwidth / 1e9,
        "transpose_gbs": {f"{kind} {b / 2**20:.2g} MiB": 2 * b / s / 1e9 for kind, curve in
                          (("2-D", cal.transpose_2d), ("kxk", cal.transpose_kxk), ("act", cal.transpose_act))
                          if curve is not None
                          for b, s in zip(curve.flops, curve.seconds)},
        "floor_us": {kind: sec * 1e6 for kind, sec in cal.floors.items()}, "call_us": cal.call_s * 1e6,
        "matmul_gflops": {f"{f:.3g}": f / s / 1e9 for f, s in zip(cal.matmul.flops, cal.matmul.seconds)},
        "conv_gflops": {f"{f:.3g}": f / s / 1e9 for f, s in zip(cal.conv.flops, cal.conv.seconds)},
        "gconv_gflops": {f"{f:.3g}": f / s / 1e9 for f, s in zip(cal.gconv.flops, cal.gconv.seconds)}
        if cal.gconv is not None else None,
        "conv1x1_gflops": {f"{r:.0f} rows x {w:.3g}": 2 * r * w / cal.conv1x1.seconds_for(r, w) / 1e9
                           for r in cal.conv1x1.rows for w in cal.conv1x1.weights} if cal.conv1x1 is not None else None,
        "gemv_gbs": {f"1x{k:.0f}x{n:.0f}": 4 * (k + k * n + n) / cal.gemv_kn.seconds_for(k, n) / 1e9
                     for k in cal.gemv_kn.rows for n in cal.gemv_kn.weights} if cal.gemv_kn is not None else None,
    }
    if not names:
        yield fitted
        return
    from jax_backend.calibration_check import CheckOptions, check_models

    print(f"calibration ({status}): loop kernel floor {fitted['launch_us']:.2f} us, loop bandwidth {fitted['bandwidth_gbs']:.1f} "
          f"GB/s, weight bandwidth {fitted['weight_bandwidth_gbs']:.1f} GB/s", file=sys.stderr)
    for row in check_models(names, CheckOptions(repeats=args.repeats, time_limit=args.time_limit)):
        yield {**row, "calibration": fitted}

"""Why an NCHW conv's weight transposes cost a program less than they cost alone (issue 24).

Times, in the same interleaved rounds (`jax_backend.timing.interleaved_rounds`), a chain of convs
NCHW (XLA:CPU transposes each OIHW weight to HWIO on every call), the same chain NHWC on HWIO
weights (no weight transposes), the weight transposes alone, the NCHW chain with each weight's
transpose forced after the previous conv (an optimization barrier: no overlap with the chain), and
the NHWC chain that also returns the transposed weights (independent work beside the chain).
`python -m experiments.transpose_overlap [--channels C] [--size H] [--kernel K] [--convs N] [--hlo]`;
`--model DIR MODEL PLAN`: a stored model's programs beside its weights' transposes in both probe forms;
`--convert OLD NEW`: a format-7 calibration's transpose curves scaled by the in-program / old ratios.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend.timing import interleaved_rounds

OIHW_TO_HWIO = (2, 3, 1, 0)


def _conv(x: jax.Array, w: jax.Array, nchw: bool) -> jax.Array:
    dims = ("NCHW", "OIHW", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")
    return jnp.tanh(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims))


def programs(n: int) -> dict[str, Callable[..., Any]]:
    def nchw(x: jax.Array, *ws: jax.Array) -> jax.Array:
        for w in ws[:n]:
            x = _conv(x, w, True)
        return x

    def nhwc(x: jax.Array, *ws: jax.Array) -> jax.Array:
        for w in ws[:n]:
            x = _conv(x, w, False)
        return x

    def alone(x: jax.Array, *ws: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(jnp.transpose(w, OIHW_TO_HWIO) for w in ws[:n])

    def onepass(x: jax.Array, *ws: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(jnp.transpose(w, OIHW_TO_HWIO) + 1.0 for w in ws[:n])

    def serial(x: jax.Array, *ws: jax.Array) -> jax.Array:
        for w in ws[:n]:
            x, w = jax.lax.optimization_barrier((x, w))
            x = _conv(x, w, True)
        return x

    def beside(x: jax.Array, *ws: jax.Array) -> tuple[jax.Array, ...]:
        y = jnp.transpose(x, (0, 2, 3, 1))
        hwio = tuple(jnp.transpose(w, OIHW_TO_HWIO) for w in ws[:n])
        for w in ws[n:]:
            y = _conv(y, w, False)
        return (y, *hwio)

    return {"nchw": nchw, "nhwc": nhwc, "alone": alone, "onepass": onepass, "serial": serial, "beside": beside}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--channels", type=int, default=512)
    p.add_argument("--size", type=int, default=14)
    p.add_argument("--kernel", type=int, default=3)
    p.add_argument("--convs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--hlo", action="store_true")
    p.add_argument("--model", nargs=3, metavar=("DIR", "MODEL", "PLAN"), help="time a stored model's original, "
                   "its layout plan and its weights' transposes in both probe forms (`model_gain`)")
    p.add_argument("--convert", nargs=2, metavar=("OLD", "NEW"), help="write OLD (format 7) with its transpose "
                   "curves scaled by the in-program / old probe ratios measured now (`probe_ratios`), in the current format")
    a = p.parse_args()
    if a.model:
        model_gain(Path(a.model[0]), a.model[1], a.model[2], a.rounds)
        return
    if a.convert:
        convert(Path(a.convert[0]), Path(a.convert[1]), probe_ratios(a.rounds))
        return
    c, h, k, n = a.channels, a.size, a.kernel, a.convs
    rng = np.random.default_rng(0)
    arr = lambda s: jnp.asarray(np.asarray(rng.standard_normal(s), np.float32) * 0.05)  # noqa: E731
    x_nchw, x_nhwc = arr((1, c, h, h)), arr((1, h, h, c))
    oihw = [arr((c, c, k, k)) for _ in range(n)]
    hwio = [arr((k, k, c, c)) for _ in range(n)]
    progs = {name: jax.jit(f) for name, f in programs(n).items()}
    args = {"nchw": (x_nchw, *oihw), "nhwc": (x_nhwc, *hwio), "alone": (x_nchw, *oihw), "onepass": (x_nchw, *oihw),
            "serial": (x_nchw, *oihw), "beside": (x_nchw, *oihw, *hwio)}
    if a.hlo:
        for name in ("nchw", "alone", "onepass"):
            txt = progs[name].lower(*args[name]).compile().as_text() or ""
            print(name, "fusions:", sorted({ln.split("=")[0].strip() for ln in txt.splitlines() if "fusion" in ln and "=" in ln})[:40])
    names = list(progs)
    thunks = [functools.partial(lambda f, xs: jax.block_until_ready(f(*xs)), progs[m], args[m]) for m in names]
    times, calls = interleaved_rounds(thunks, a.rounds, min_rounds=a.rounds)
    med = {m: statistics.median(t) * 1e3 for m, t in zip(names, times)}
    print(f"{n} convs {c} ch {h}x{h} {k}x{k}, weights {n * c * c * k * k * 4 / 2**20:.1f} MiB; ms per call:",
          {m: round(v, 2) for m, v in med.items()})
    d = lambda a, b: statistics.median(x - y for x, y in zip(times[names.index(a)], times[names.index(b)])) * 1e3  # noqa: E731
    print(f"  nchw-nhwc {d('nchw', 'nhwc'):.2f}  serial-nhwc {d('serial', 'nhwc'):.2f}  "
          f"beside-nhwc {d('beside', 'nhwc'):.2f}  alone {med['alone']:.2f}  onepass {med['onepass']:.2f}")


def convert(old: Path, new: Path, ratios: dict[tuple[int, ...], float]) -> None:
    from eqsat.xla_cost import CALIBRATION_FORMAT
    from jax_backend.calibrate import TRANSPOSE_SHAPES

    data = json.loads(old.read_text(encoding="utf-8"))
    for key, window in (("transpose_2d", False), ("transpose_kxk", True)):
        scale = [ratios[s] for s in TRANSPOSE_SHAPES if (s[2] * s[3] > 1) == window]
        data[key]["seconds"] = [t * r for t, r in zip(data[key]["seconds"], scale)]
    data["format"] = CALIBRATION_FORMAT
    data.setdefault("transpose_act", None)  # curves the old format did not measure: the model's fallbacks
    data.setdefault("dwconv", None)
    new.write_text(json.dumps(data, indent=1), encoding="utf-8")


def probe_ratios(rounds: int = 15) -> dict[tuple[int, ...], float]:
    """Per shape of `TRANSPOSE_SHAPES`, the in-program transpose probe (`_transpose_curves`' form: tiny
    NHWC convs on transposed OIHW weights less the same on HWIO weights) over the old one (a program
    returning the transposed weights), both in the same interleaved rounds: what converts a format-7
    calibration's transpose curves into in-program ones (`--convert`)."""
    from eqsat import ops
    from jax_backend.calibrate import TRANSPOSE_BYTES, TRANSPOSE_MAX_COUNT, TRANSPOSE_SHAPES, _arrays

    def tiny(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    thunks = []
    for o, i, kh, kw in TRANSPOSE_SHAPES:
        count = max(2, min(TRANSPOSE_MAX_COUNT, TRANSPOSE_BYTES // (4 * o * i * kh * kw)))
        xs, oihw = _arrays(*[(1, kh, kw, i)] * count), _arrays(*[(o, i, kh, kw)] * count)
        hwio = [jnp.transpose(w, ops.HWIO_FROM_OIHW) for w in oihw]
        old = jax.jit(lambda *ws: tuple(jnp.transpose(w, ops.HWIO_FROM_OIHW) for w in ws))
        new_t = jax.jit(lambda xs, ws: tuple(tiny(x, jnp.transpose(w, ops.HWIO_FROM_OIHW)) for x, w in zip(xs, ws)))
        new_n = jax.jit(lambda xs, ws: tuple(tiny(x, w) for x, w in zip(xs, ws)))
        thunks += [functools.partial(lambda f, a: jax.block_until_ready(f(*a)), old, oihw),
                   functools.partial(lambda f, a, b: jax.block_until_ready(f(a, b)), new_t, xs, oihw),
                   functools.partial(lambda f, a, b: jax.block_until_ready(f(a, b)), new_n, xs, hwio)]
    times, _ = interleaved_rounds(thunks, rounds, min_rounds=rounds)
    out = {}
    for j, shape in enumerate(TRANSPOSE_SHAPES):
        old_s = statistics.median(times[3 * j])
        new_s = statistics.median(a - b for a, b in zip(times[3 * j + 1], times[3 * j + 2]))
        out[shape] = new_s / old_s
        print(f"{shape}: old probe {old_s * 1e3:.2f} ms, in-program {new_s * 1e3:.2f} ms, ratio {new_s / old_s:.2f}")
    return out


def model_gain(plans: Path, model: str, plan: str, rounds: int = 9) -> None:
    """A stored model's original and its layout plan (`DIR/MODEL.before.json`,
    `DIR/MODEL.candidate.PLAN.json`), and its conv weights' transposes as the old probe timed them (a
    program returning them) and as the new one does (each feeding a one-pixel NHWC conv, less the same
    convs on HWIO weights), all in the same interleaved rounds; prints ms per call and the load."""
    from eqsat import ops
    from eqsat.ir import Graph
    from jax_backend.lower import fold_weights, to_jax_positional

    def program(graph: Graph) -> Callable[[], Any]:
        graph = graph.live()
        rng = np.random.default_rng(0)
        inputs = {n.attr["name"]: rng.standard_normal(n.shapes[0]).astype(np.float32) for _, n in graph.leaves()}
        graph, values = fold_weights(graph, inputs)
        names, fn = to_jax_positional(graph)
        args = [jnp.asarray(values[n]) for n in names]
        return functools.partial(lambda f, a: jax.block_until_ready(f(*a)), jax.jit(fn), args)

    original = Graph.load(plans / f"{model}.before.json")
    layout = Graph.load(plans / f"{model}.candidate.{plan}.json")
    live = original.live()
    shapes = [tuple(live.nodes[n.inputs[1].node].shapes[n.inputs[1].index]) for n in live.nodes if n.op == "conv2d"]
    rng = np.random.default_rng(1)
    ws = [jnp.asarray(np.asarray(rng.standard_normal(s), np.float32)) for s in shapes]
    xs = [jnp.ones((1, s[2], s[3], s[1]), jnp.float32) for s in shapes]
    hwio = [jnp.transpose(w, ops.HWIO_FROM_OIHW) for w in ws]

    def tiny(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    old = jax.jit(lambda *ws: tuple(jnp.transpose(w, ops.HWIO_FROM_OIHW) for w in ws))
    new_t = jax.jit(lambda xs, ws: tuple(tiny(x, jnp.transpose(w, ops.HWIO_FROM_OIHW)) for x, w in zip(xs, ws)))
    new_n = jax.jit(lambda xs, ws: tuple(tiny(x, w) for x, w in zip(xs, ws)))
    thunks: list[Callable[[], Any]] = [program(original), program(layout), lambda: jax.block_until_ready(old(*ws)),
              lambda: jax.block_until_ready(new_t(xs, ws)),
              lambda: jax.block_until_ready(new_n(xs, hwio))]
    times, _ = interleaved_rounds(thunks, rounds, budget_s=60, min_rounds=5)
    med = [statistics.median(t) * 1e3 for t in times]
    print(f"{model}: original {med[0]:.1f} layout {med[1]:.1f} gain {med[0] - med[1]:.1f} | weights, old probe's form "
          f"{med[2]:.1f}, in a program {med[3] - med[4]:.1f} ms ({len(ws)} weights, "
          f"{sum(4 * np.prod(s) for s in shapes) / 1e6:.1f} MB) | load {os.getloadavg()}")


if __name__ == "__main__":
    main()

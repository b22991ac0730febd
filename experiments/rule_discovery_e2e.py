"""End to end: does a rule `eqsat rules discover` found paying alone also pay in a program?

A pyramid-pooling block written as users write it (Flax / Keras style `avg_pool` with SAME padding
counted as zeros, a 5x5 and a 7x7 window at stride 1, each followed by a 1x1 conv, concatenated with
the input's own 1x1 branch) through `@eqsat.optimize` with the default rules. The 5x5 and 7x7 pools
match the separable average-pool rules (`decompositions.rules`); the decorator's sequential test
keeps the optimized version only when its speedup interval lies above 1.01.

Run: PYTHONPATH=. python experiments/rule_discovery_e2e.py [--runs 3]. Timings on a shared machine
are noisy: the report prints each run's interval.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import eqsat


def avg_pool(x: jax.Array, k: int) -> jax.Array:
    """`flax.linen.avg_pool(..., padding="SAME", count_include_pad=True)` on NCHW."""
    total = lax.reduce_window(x, 0.0, lax.add, (1, 1, k, k), (1, 1, 1, 1), "SAME")
    return total / (k * k)


def conv1x1(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


def pyramid_pool(x: jax.Array, w0: jax.Array, w5: jax.Array, w7: jax.Array) -> jax.Array:
    branches = [conv1x1(x, w0), conv1x1(avg_pool(x, 5), w5), conv1x1(avg_pool(x, 7), w7)]
    return jax.nn.relu(jnp.concatenate(branches, axis=1))


def arguments(seed: int = 0) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 64, 56, 56)).astype(np.float32)
    ws = [rng.standard_normal((32, 64, 1, 1)).astype(np.float32) * 0.125 for _ in range(3)]
    return tuple(jnp.asarray(a) for a in (x, *ws))


def run_once(seed: int) -> dict[str, Any]:
    args = arguments(seed)
    fast = eqsat.optimize(pyramid_pool, decision_cache=False)
    out = fast(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(pyramid_pool)(*args)), rtol=2e-4, atol=2e-4)
    report = fast.report(*args)
    fired = sorted({name for seg in report.segments for name in seg.rules_fired})
    low, high = report.speedup_ci or (float("nan"), float("nan"))
    return {"used": report.used, "reason": report.reason, "speedup_ci_low": low, "speedup_ci_high": high,
            "time_original_ms": (report.time_original_s or 0.0) * 1e3,
            "time_optimized_ms": (report.time_optimized_s or 0.0) * 1e3,
            "separable_rules_fired": [n for n in fired if "separable" in n]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for k in range(args.runs):
        print(json.dumps(run_once(k)), flush=True)


if __name__ == "__main__":
    main()

"""Does a held-out program's decision hold? `python -m experiments.heldout_fresh PROGRAM --processes 5`.

Runs `@eqsat.optimize` on one held-out program (`experiments/jax_heldout.py`) in N fresh processes,
each starting from an empty cache (no proofs, decisions or measured op costs), and then once more
in a fresh process on the last one's cache, where the decision must be reused without timing.
Prints one JSON row per process (used, the decision's speedup and interval, rounds, whether it came
from the cache, wall seconds of the first call) and a summary row: how many kept the optimized
version, and the lowest speedup among them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["main", "run_child"]


def run_child(program: str) -> dict[str, Any]:
    """In this process: decorate `program`, call it once at its batch, and report the decision."""
    import warnings

    import jax

    import eqsat
    from experiments.jax_heldout import heldout_program

    warnings.simplefilter("ignore")
    held = heldout_program(program)
    args = held.make_args(0, held.batch)
    wrapped = eqsat.optimize(held.fn)
    start = time.perf_counter()
    jax.block_until_ready(wrapped(*args))
    first_call_s = time.perf_counter() - start
    report = wrapped.report(*args)
    d = report.decision
    return {"program": program, "used": report.used, "first_call_s": first_call_s,
            "speedup": d.speedup if d is not None else None,
            "interval": [d.speedup_low, d.speedup_high] if d is not None else None,
            "rounds": d.rounds if d is not None else None,
            "from_cache": bool(d is not None and d.from_cache), "reason": report.reason}


def _child(program: str, cache: str) -> dict[str, Any]:
    env = {**os.environ, "EQSAT_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-m", "experiments.heldout_fresh", program, "--child"], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"program": program, "error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.heldout_fresh", description=__doc__.splitlines()[0])
    parser.add_argument("program", help="a held-out program's name (experiments/jax_heldout.py)")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes from an empty cache")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.program)))
        return 0
    from experiments.jax_heldout import HELDOUT_NAMES

    names = list(HELDOUT_NAMES)  # known without building them
    if args.program not in names or args.processes < 1:
        print(f"heldout_fresh: error: unknown program {args.program!r} (known: {', '.join(names)}) "
              "or --processes below 1", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="eqsat-fresh-") as root:
        for i in range(args.processes):
            cache = os.path.join(root, f"cache{i}")
            os.makedirs(cache)
            row = {**_child(args.program, cache), "process": i + 1, "cache": "empty"}
            rows.append(row)
            print(json.dumps(row), flush=True)
        warm = {**_child(args.program, cache), "process": args.processes + 1, "cache": "warm (the last one's)"}
        print(json.dumps(warm), flush=True)
    kept = [r for r in rows if r.get("used") == "optimized"]
    print(json.dumps({"program": args.program, "kept": f"{len(kept)}/{len(rows)}",
                      "lowest_kept_speedup": min((r["speedup"] for r in kept), default=None),
                      "warm_reused_without_timing": bool(warm.get("from_cache")) and warm.get("used") == "optimized"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

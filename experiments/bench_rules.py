"""Benchmark: verify Tensat's 133 rules, and synthesize rules with up to 3 operators.

Reproduces the figures in the report; equivalent to
    eqsat rules verify ../shared/data/tensat/rules/converted.txt ../shared/data/tensat/rules/converted_multi.txt --json
    eqsat rules synth --max-ops 3 --time-limit 300 --out results/synth.rules --json
Run: .venv/bin/python -m experiments.bench_rules [--skip-synth]

The verify step reads/writes the verification cache ($EQSAT_CACHE_DIR or ~/.cache/eqsat): set
EQSAT_CACHE_DIR to an empty folder for a cold run; a second run is the warm figure.
"""

from __future__ import annotations

import argparse
import sys

from eqsat.cli import main as eqsat_main
from eqsat.paths import tensat_rule_files



def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-synth", action="store_true")
    parser.add_argument("--out", default="results/synth.rules")
    args = parser.parse_args()
    code = eqsat_main(["rules", "verify", *map(str, tensat_rule_files()), "--json"])
    if code or args.skip_synth:
        return code
    return eqsat_main(["rules", "synth", "--max-ops", "3", "--time-limit", "300", "--out", args.out, "--json"])


if __name__ == "__main__":
    sys.exit(run())

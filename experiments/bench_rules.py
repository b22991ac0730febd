"""Benchmark: verify Tensat's 133 rules, and synthesize rules with up to 3 operators.

Reproduces the figures in the report; equivalent to
    eqsat rules verify ../shared/data/tensat/rules/converted.txt ../shared/data/tensat/rules/converted_multi.txt --json
    eqsat rules synth --max-ops 3 --time-limit 300 --out results/synth.rules --json
Run: eqsat bench rules [--skip-synth] [--out results/synth.rules]

The verify step reads/writes the verification cache ($EQSAT_CACHE_DIR or ~/.cache/eqsat): set
EQSAT_CACHE_DIR to an empty folder for a cold run; a second run is the warm figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eqsat.paths import tensat_rule_files
from eqsat.rewrites import command


def _rules(argv: list[str]) -> Iterator[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="eqsat rules")
    command.add_arguments(parser)
    yield from command.run(parser.parse_args(argv))


def run_bench(out: Path = Path("results/synth.rules"), skip_synth: bool = False) -> Iterator[dict[str, Any]]:
    """The rows of `eqsat rules verify` on Tensat's files, then (unless `skip_synth`) of `eqsat rules synth`."""
    yield from _rules(["verify", *map(str, tensat_rule_files())])
    if not skip_synth:
        yield from _rules(["synth", "--max-ops", "3", "--time-limit", "300", "--out", str(out)])

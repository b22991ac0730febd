"""`eqsat rules ...`: `verify` and `synth` (`eqsat.rewrites.command`) plus `discover`, which times
each rule's left and right side on this device (`jax_backend.rule_discovery`). It sits with the
commands because it runs JAX; the core's rules command does not."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from eqsat.errors import EqsatError
from eqsat.rewrites import command as core

DEFAULT_PROGRAMS = ("inception",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    core.add_arguments(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("discover", help="time each rule's left and right side alone on this device: where does it pay?")
    p.add_argument("files", nargs="*", help="rule files (default: the library's decompositions and XLA groups)")
    p.add_argument("--groups", default="", help="library groups, comma-separated (instead of files)")
    p.add_argument("--program", action="append", default=None,
                   help=f"a JAX program (eqsat bench jax's names) or a model name / graph file whose matches are "
                        f"timed; repeatable (default: {', '.join(DEFAULT_PROGRAMS)})")
    p.add_argument("--no-probe", action="store_true", help="skip the probe feature maps for one-variable rules")
    p.add_argument("--budget", type=float, default=2.0, help="seconds of timing per instance")
    p.add_argument("--max-instances", type=int, default=6, help="instances timed per rule (largest first)")
    p.add_argument("--trusted-only", action="store_true", help="time only rules the verifier trusts")
    p.add_argument("--no-model", action="store_true", help="skip the measured cost model's prediction")
    p.add_argument("--out", default="", help="also write the full report (every instance) as JSON here")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if args.rules_command != "discover":
        return core.run(args)
    return _discover(args)


def _rules(args: argparse.Namespace) -> list[Any]:
    from eqsat.rewrites import library_rules
    from eqsat.rulesets import XLA_GROUPS, given_rules, trusted_rules

    if args.files and args.groups:
        raise EqsatError("rules discover: give rule files or --groups, not both")
    groups = [g for g in args.groups.split(",") if g]
    rules = given_rules(args.files) if args.files else library_rules(groups or XLA_GROUPS)
    return trusted_rules(rules) if args.trusted_only else rules


def _graphs(names: list[str]) -> dict[str, Any]:
    from eqsat.models import MODELS, build_model, lookup

    from jax_backend.capture import capture

    graphs: dict[str, Any] = {}
    for name in names:
        if name in MODELS or name.endswith((".json", ".model")):
            graphs[name] = build_model(name)
            continue
        program = lookup(name, "jax").build()
        captured, _ = capture(program.fn, *program.make_args(0))
        for k, step in enumerate(captured.graphs):
            graphs[name if k == 0 else f"{name}#{k}"] = step.graph
    return graphs


def _discover(args: argparse.Namespace) -> list[dict[str, Any]]:
    from eqsat.output_targets import writable_file
    from jax_backend.rule_discovery import discover, rule_summaries

    if not args.budget > 0 or args.max_instances < 1:
        raise EqsatError("rules discover: --budget must be positive and --max-instances at least 1")
    if args.out:
        writable_file(args.out, "--out")
    rules = _rules(args)
    graphs = _graphs(args.program or list(DEFAULT_PROGRAMS))
    model = None
    if not args.no_model:
        from jax_backend.measured_cost import measured_model

        model = measured_model()
    timings = discover(rules, graphs, probe=not args.no_probe, budget_s=args.budget,
                       max_instances=args.max_instances, model=model,
                       progress=lambda line: print(f"timing {line}", file=sys.stderr, flush=True))
    rows = list(rule_summaries(timings))
    if args.out:
        from pathlib import Path

        from eqsat.atomic_write import atomic_write_text

        report = {"note": "each instance timed alone (paired interleaved rounds, 95% bootstrap interval); "
                          "timings on a shared machine are noisy", "rules": rows}
        atomic_write_text(Path(args.out), json.dumps(report, indent=1, default=str))
    return rows

"""`eqsat rules verify [RULEFILE...]` and `eqsat rules synth`: the rule verifier and synthesizer on
the command line. Without rule files, `verify` checks the shipped library."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from typing import Any

from eqsat.errors import EqsatError
from eqsat.rewrites.rule import Rule


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rules_command", required=True)
    verify = sub.add_parser("verify", help="prove or refute rules")
    verify.add_argument("files", nargs="*", help="rule files (default: the shipped library); files named "
                        "*multi* are read as Tensat two-output files")
    verify.add_argument("--samples", type=int, default=24, help="shape assignments tested per rule")
    verify.add_argument("--proof-shapes", type=int, default=3, help="shape assignments proved exactly per rule")
    verify.add_argument("--seed", type=int, default=0)
    verify.add_argument("--no-all-shapes", action="store_true", help="skip the e-graph derivation from axioms")
    verify.add_argument("--trust-tested", action="store_true", help="count rules proved only on the tested shapes "
                        "as trusted (a test, not a proof for every shape; they are named in a warning)")
    verify.add_argument("--no-cache", action="store_true", help="verify every rule again, ignoring (and not "
                        "writing) the on-disk verification cache (see README: $EQSAT_CACHE_DIR)")
    verify.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    synth = sub.add_parser("synth", help="enumerate small graphs and keep the new, verified equalities")
    synth.add_argument("--max-ops", type=int, default=2, help="operators per graph")
    synth.add_argument("--time-limit", type=float, default=300.0, help="seconds in total")
    synth.add_argument("--out", default="synth.rules", help="rule file to write")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _load(files: list[str]) -> list[Rule]:
    from eqsat.rewrites import library_rules
    from eqsat.rulesets import given_rules

    return given_rules(files) if files else library_rules()


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if args.rules_command == "verify":
        return [_verify(args)]
    if args.rules_command == "synth":
        from eqsat.rewrites.synth import SynthOptions, synthesize

        from eqsat.output_targets import writable_file

        if args.max_ops < 1 or not args.time_limit > 0:
            raise EqsatError("rules synth: --max-ops must be at least 1 and --time-limit positive")
        writable_file(args.out, "--out")
        report = synthesize(SynthOptions(max_ops=args.max_ops, time_limit=args.time_limit, seed=args.seed),
                            out=args.out, progress=True)
        return [report]
    raise EqsatError(f"rules: unknown subcommand {args.rules_command!r}")


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from eqsat.rewrites.verify import VerifyOptions, verify_rules
    from eqsat.rulesets import is_trusted, scope, warn_tested

    start = time.perf_counter()
    rules = _load(args.files)
    options = VerifyOptions(samples=args.samples, proof_shapes=args.proof_shapes, seed=args.seed)
    results = verify_rules(rules, options, all_shapes=not args.no_all_shapes, progress=True,
                           cache=not args.no_cache)
    if args.trust_tested:
        warn_tested([r.name for r in results if is_trusted(r, trust_tested=True) and not is_trusted(r)])
    count = {s: sum(r.status == s for r in results) for s in ("proved", "refuted", "unknown")}
    refuted = [r for r in results if r.status == "refuted"]
    guarded = {f"refuted_guarded_{s}": sum(r.guarded_status == s for r in refuted) for s in ("proved", "refuted", "unknown")}
    return {"total": len(results), **count,
            "proved_all_shapes": sum(r.scope == "all shapes" for r in results),
            "refuted_on_shapes": sum(r.method == "shapes" for r in refuted), **guarded,
            "guarded_proved": sum(r.guarded_status == "proved" for r in results),
            "guarded_proved_all_shapes": sum(r.guarded_status == "proved" and r.guarded_scope == "all shapes"
                                             for r in results),
            "tested": sum(scope(r).startswith("tested") for r in results),
            "trusted": sum(is_trusted(r, trust_tested=args.trust_tested) for r in results),
            "trusted_all_shapes": sum(map(is_trusted, results)),
            "seconds": round(time.perf_counter() - start, 3),
            "rules": [{**r.to_json(), "verdict": r.verdict, "guarded_verdict": r.guarded_verdict,
                       "policy_scope": scope(r), "trusted": is_trusted(r, trust_tested=args.trust_tested),
                       **({"resists": _resists(rule, r)} if scope(r).startswith("tested") else {})}
                      for rule, r in zip(rules, results)]}


def _resists(rule: Rule, result: Any) -> str:
    """Why a tested rule has no proof for all shapes."""
    from eqsat.rewrites.symbolic import resists

    return resists(rule, guarded=result.status == "refuted")

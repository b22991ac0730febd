"""`eqsat judge DIR...`: run plans made elsewhere on the device at hand and keep the faster.

`eqsat optimize MODEL --save-graphs DIR` writes the original (`MODEL.before.json`) and every
candidate plan (`MODEL.candidate.NAME.json`). This command takes such folders to another machine (a
GPU, say, where the search itself need not run) and judges each model's plans there exactly as
`eqsat optimize` does: the original and each candidate lowered through JAX, checked against the
float64 reference, timed in interleaved rounds, and a plan kept only if faster with confidence
(`jax_backend.checks.judge_plans`). It needs JAX and the IR only (no egglog, z3 or ILP solver).

One row per model: the device JAX ran on, the decision with its interval, and per candidate its
measured speedup beside its predicted ones (the roofline of `--predict-device` at 0, 1 and 5 µs
per kernel, and with `--xla-device` the xla cost model calibrated on this device: predictions,
labelled so).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eqsat.cost import CostModel, cost_model, launch_sensitivity, predicted_speedup
from eqsat.errors import EqsatError
from eqsat.ir import Graph

if TYPE_CHECKING:
    from jax_backend.checks import PlanCheck

__all__ = ["ModelPlans", "add_arguments", "find_plans", "judge_model", "run"]

BEFORE = ".before.json"
CANDIDATE = ".candidate."


@dataclass(frozen=True)
class ModelPlans:
    """One model's original graph file and its candidate plan files, by candidate name."""

    model: str
    original: Path
    candidates: tuple[tuple[str, Path], ...]


def find_plans(folders: Sequence[Path], models: Sequence[str] = ()) -> list[ModelPlans]:
    """Group `MODEL.before.json` and `MODEL.candidate.NAME.json` files by model over `folders` (the
    first folder holding a model's original gives it; with several folders a candidate's name is
    prefixed by its folder's name). `models` keeps only those, in that order (all when empty)."""
    originals: dict[str, Path] = {}
    candidates: dict[str, list[tuple[str, Path]]] = {}
    for folder in folders:
        if not folder.is_dir():
            raise EqsatError(f"{folder}: not a folder (give folders written by `eqsat optimize --save-graphs`)")
        for path in sorted(folder.glob(f"*{BEFORE}")):
            originals.setdefault(path.name[: -len(BEFORE)], path)
        for path in sorted(folder.glob(f"*{CANDIDATE}*.json")):
            model, _, rest = path.name.partition(CANDIDATE)
            name = rest[: -len(".json")]
            candidates.setdefault(model, []).append((f"{folder.name}/{name}" if len(folders) > 1 else name, path))
    unknown = sorted(set(models) - set(originals))
    if unknown:
        raise EqsatError(f"no {unknown[0]}{BEFORE} in {', '.join(map(str, folders))}")
    found = [ModelPlans(m, originals[m], tuple(candidates.get(m, ()))) for m in (models or originals)]
    if not found:
        raise EqsatError(f"no *{BEFORE} files in {', '.join(map(str, folders))}")
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", nargs="+", type=Path, metavar="DIR",
                        help="folders written by `eqsat optimize MODEL --save-graphs DIR`")
    parser.add_argument("--models", nargs="*", default=[], metavar="MODEL", help="only these models, in this order (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--repeats", type=int, default=30, help="timing rounds at most (at least 5 run)")
    parser.add_argument("--timing-budget", type=float, default=20.0, help="seconds of timing rounds per model")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance against the float64 reference")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance against the float64 reference")
    parser.add_argument("--predict-device", default="h100",
                        help="roofline device whose predicted speedups are reported beside the measured ones")
    parser.add_argument("--xla-device", default=None, metavar="DEVICE",
                        help="also report the xla cost model's predictions, calibrated on this device (the one "
                             "JAX runs on: cpu, h100, h200; run `eqsat calibrate --device DEVICE` first)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    if not args.repeats >= 5:
        raise EqsatError(f"--repeats must be at least 5, not {args.repeats}")
    if not args.timing_budget >= 0:
        raise EqsatError(f"--timing-budget must be at least 0, not {args.timing_budget}")
    found = find_plans(args.folders, args.models)
    xla = None
    if args.xla_device is not None:
        import jax_backend  # noqa: F401 - registers the "xla" cost model

        xla = cost_model("xla", device=args.xla_device)
    for plans in found:
        yield judge_model(plans, seed=args.seed, rounds=args.repeats, budget_s=args.timing_budget,
                          rtol=args.rtol, atol=args.atol, predict_device=args.predict_device, xla=xla)


def judge_model(plans: ModelPlans, *, seed: int = 0, rounds: int = 30, budget_s: float = 20.0, rtol: float = 1e-4,
                atol: float = 1e-5, predict_device: str = "h100", xla: CostModel | None = None) -> dict[str, Any]:
    """The report row of one model's plans judged on the device at hand (see the module docstring);
    with `xla`, each candidate's speedup predicted by that calibrated model too."""
    import jax
    from rich.console import Console

    from jax_backend.checks import judge_plans

    original = Graph.load(plans.original)
    candidates = [(name, Graph.load(path)) for name, path in plans.candidates]
    with Console(stderr=True).status(f"{plans.model}: judging {len(candidates)} plans on {jax.devices()[0]}"):
        j = judge_plans(original, candidates, original.random_inputs(seed), rtol, atol, rounds, budget_s)
    device = jax.devices()[0]
    graphs = dict(candidates)
    low, high = j.speedup_ci
    return {
        "model": plans.model, "device": f"{device.platform}:{device.device_kind}", "jax": jax.__version__,
        "kept": j.kept, "plan": j.plan, "measured_speedup": j.speedup, "measured_speedup_ci": [low, high],
        "passes": j.passes, "measured_before_s": j.original_s,
        "measured_after_s": j.timing.other_s if j.timing is not None else j.original_s,
        "kernels_original": original.runtime_kernels(), "flops_original": original.runtime_flops(),
        "candidates": [_candidate_row(original, graphs[c.name], c, predict_device, xla) for c in j.checks],
        "predict_device": predict_device,
    }


def _candidate_row(original: Graph, plan: Graph, check: PlanCheck, predict_device: str,
                   xla: CostModel | None) -> dict[str, Any]:
    t = check.timing
    sensitivity: Mapping[str, float] | None = launch_sensitivity(original, plan, predict_device)
    xla_speedup = predicted_speedup(original, plan, xla) if xla is not None else None
    return {
        "name": check.name, "numerics_ok": check.numerics_ok, "same_as_original": check.same_as_original,
        "reason": check.reason, "max_abs_diff": check.max_abs_diff,
        "measured_speedup": t.speedup if t is not None else (1.0 if check.same_as_original else None),
        "measured_speedup_ci": list(t.speedup_ci) if t is not None else None,
        "predicted_pct_by_launch_us": sensitivity,
        "predicted_speedup_xla": xla_speedup, "kernels": plan.runtime_kernels(), "flops": plan.runtime_flops(),
    }

"""`eqsat optimize MODEL`: the whole path on one model.

Build the model, saturate it with Tensat's rules, extract the cheapest graph under the cost model
(and a few cheap alternatives on the same e-graph: greedy-dag, the ILP under the roofline without
launch cost; and the chosen plan with its convs NHWC, `eqsat.layout_phase`), then judge every
plan by running it: the original and each candidate lowered through JAX, checked against the
float64 reference, timed in interleaved rounds (median, 95% bootstrap interval), and a plan kept
only if faster with confidence (`jax_backend.checks.judge_plans`, the decision `@eqsat.optimize`
makes too); otherwise the answer is the original, `kept: "original"`.
The rules are `eqsat.rulesets.candidate_rules`, the models `eqsat.models`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax_backend  # noqa: F401 - registers the "measured" cost model for --cost-model
from eqsat.cost import (CONVENTIONS, COST_MODEL_FACTORIES, CostModel, conventions, cost_model, graph_cost,
                        launch_sensitivity)
from eqsat.errors import EqsatError, NumericsError
from eqsat.ir import Graph
from eqsat.models import MODELS, build_model
from eqsat.output_targets import writable_dir
from eqsat.rulesets import RULE_SETS, named_rules
from eqsat.saturate import Limits
from jax_backend.checks import Judgement, PlanCheck, judge_plans

if TYPE_CHECKING:
    from eqsat.pipeline import OptimizationResult
    from eqsat.rewrites.rule import Rule

__all__ = ["DEFAULT_CANDIDATES", "Judged", "OptimizeOptions", "add_arguments", "calibrated_model", "candidate_file_name",
           "check_candidates", "launch_sensitivity", "optimize_and_judge", "optimize_model", "run"]


GREEDY = "greedy"
LAUNCH0 = "roofline-launch0"
LAYOUT = "layout"  # eqsat.layout_phase: the extractor's answer with its convs NHWC where transposes cancel
LAYOUT_ORIGINAL = "layout-original"  # with LAYOUT: the original with its convs NHWC (when another program)
CALIBRATED = "calibrated"  # the ILP under "xla" where the device at hand has a cached calibration (skipped where not)
DEFAULT_CANDIDATES: tuple[str, ...] = (GREEDY, LAUNCH0, LAYOUT, CALIBRATED)


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything `optimize_model` needs besides the model name (the CLI flags, typed)."""

    extractor: str = "ilp"
    time_limit: float = 60.0
    node_limit: int = 50_000
    iterations: int = 30
    saturate_seconds: float = 120.0
    k_multi: int = 1
    cost_model: str = "roofline"
    device: str = "cpu"
    seed: int = 0
    repeats: int = 30
    timing_budget: float = 30.0
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    save_graphs: Path | None = None
    rtol: float = 1e-4
    atol: float = 1e-5
    conventions: str = "ours"  # eqsat.cost.CONVENTIONS: "tensat" charges weight-only ops, prices transposes 0
    rules: str = "default"  # eqsat.rulesets.RULE_SETS: "tensat-only" for Tensat's rule files alone

    def __post_init__(self) -> None:
        """Reject limits no run can honour (NaN, negative, zero repeats) and unknown names before any work."""
        conventions(self.conventions)
        if self.rules not in RULE_SETS:
            named_rules(self.rules)  # the one error line
        checks = [("--time-limit", self.time_limit, 0.0), ("--saturate-seconds", self.saturate_seconds, 0.0),
                  ("--node-limit", self.node_limit, 1), ("--iterations", self.iterations, 0),
                  ("--k-multi", self.k_multi, 0), ("--repeats", self.repeats, 5),
                  ("--timing-budget", self.timing_budget, 0.0)]
        for flag, value, least in checks:
            if not value >= least:  # also NaN
                raise EqsatError(f"{flag} must be at least {least:g}, not {value}")
        check_candidates(self.candidates)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = OptimizeOptions()
    parser.add_argument("model", help=f"model name ({', '.join(MODELS)}) or a .model / Graph .json path")
    parser.add_argument("--extractor", default=d.extractor, help="extraction strategy (default: %(default)s)")
    parser.add_argument("--time-limit", type=float, default=d.time_limit, help="extraction time limit, seconds")
    parser.add_argument("--node-limit", type=int, default=d.node_limit, help="saturation e-node limit")
    parser.add_argument("--iterations", type=int, default=d.iterations, help="saturation iteration limit")
    parser.add_argument("--saturate-seconds", type=float, default=d.saturate_seconds, help="saturation time limit")
    parser.add_argument("--k-multi", type=int, default=d.k_multi, help="rounds of multi-pattern rules")
    parser.add_argument("--cost-model", default=d.cost_model, choices=sorted(COST_MODEL_FACTORIES))
    parser.add_argument("--device", default=d.device, help="device the cost model prices for (cpu, h100, h200, ...)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the random inputs")
    parser.add_argument("--repeats", type=int, default=d.repeats,
                        help="timing rounds (passes) of the original against each plan, at most (at least 5 run)")
    parser.add_argument("--timing-budget", type=float, default=d.timing_budget,
                        help="seconds of timing rounds (past the 5 that always run)")
    parser.add_argument("--candidates", nargs="*", default=list(d.candidates), metavar="NAME",
                        help="plans timed beside the extractor's answer: greedy, roofline-launch0, layout (its convs "
                             "NHWC, and the original's), calibrated (the ILP under the xla model where this device "
                             "has a calibration cached; skipped where none is), or a cost model (the ILP under it) "
                             "(default: %(default)s)")
    parser.add_argument("--save-graphs", type=Path, default=None, metavar="DIR",
                        help="write MODEL.before.json, MODEL.after.json and each MODEL.candidate.NAME.json "
                             "(Graph JSON) here: `eqsat judge` runs them on another device")
    parser.add_argument("--conventions", default=d.conventions,
                        help=f"extraction conventions ({', '.join(CONVENTIONS)}; default: %(default)s)")
    parser.add_argument("--rules", default=d.rules, help=f"rule set ({', '.join(RULE_SETS)}; default: %(default)s)")


def run(args: argparse.Namespace) -> Iterable[dict[str, Any]]:
    options = OptimizeOptions(
        extractor=args.extractor, time_limit=args.time_limit, node_limit=args.node_limit,
        iterations=args.iterations, saturate_seconds=args.saturate_seconds, k_multi=args.k_multi,
        cost_model=args.cost_model, device=args.device, seed=args.seed, repeats=args.repeats,
        timing_budget=args.timing_budget, candidates=tuple(args.candidates), save_graphs=args.save_graphs,
        conventions=args.conventions, rules=args.rules,
    )
    yield optimize_model(args.model, options)


# --- the path -----------------------------------------------------------------------------------



def candidate_file_name(name: str) -> str:
    """A candidate's name as a file-name part (`ilp/roofline` -> `ilp-roofline`)."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


def check_candidates(names: Sequence[str]) -> tuple[str, ...]:
    """The extra candidate names, checked: "greedy" (the registry's greedy-dag on the same
    e-graph), "roofline-launch0" (the ILP under the roofline with no launch cost), "layout" (the
    extractor's answer with its convs NHWC: `eqsat.layout_phase`), or a registered cost model (the
    ILP under it). "calibrated" is the ILP under the xla model where this device has a calibration
    cached: on an H200 that model's plan was the only one to gain on ResNeXt-50 (docs/tensat.md), and
    where no calibration is cached it is skipped, since nothing is measured inside the optimizer."""
    known = sorted({GREEDY, LAUNCH0, LAYOUT, CALIBRATED, *COST_MODEL_FACTORIES})
    for name in names:
        if name not in known:
            raise EqsatError(f"--candidates: unknown candidate {name!r}; choose from {', '.join(known)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Judged:
    """One optimization and its candidate plans judged by running them (`judge_plans`): what
    `eqsat optimize` reports and each pass of `eqsat bench tensat` records."""

    result: OptimizationResult
    plans: tuple[tuple[str, Graph], ...]  # (candidate name, graph); the first is the extractor's answer
    predicted: Mapping[str, float]  # candidate name -> cost_original / cost_plan under the chosen model
    judgement: Judgement
    candidates_s: float  # the extra candidates' extraction seconds (greedy, the alternatives, the layout phase)
    layout_s: float = 0.0  # of which the layout phase's (`eqsat.layout_phase.nhwc_plan`)

    @property
    def optimizer_s(self) -> float:
        """Saturation and the extractor's own extraction (what Tensat's optimizer time counts);
        the alternatives' extractions, which `extract_s` includes, left out (they are `candidates_s`)."""
        alt = sum(found.seconds for found in self.result.alternatives.values())
        return self.result.saturate_s + self.result.extract_s - alt

    @property
    def numerics_ok(self) -> bool:
        """The extractor's own answer agreed with the original through JAX."""
        return self.judgement.checks[0].numerics_ok

    @property
    def plan_graph(self) -> Graph:
        """The plan the decision timed (the extractor's answer when no candidate differed)."""
        return dict(self.plans).get(self.judgement.plan or "", self.result.optimized)

    @property
    def answer(self) -> Graph:
        """What `eqsat optimize` returns: the plan if kept, else the original."""
        return self.plan_graph if self.judgement.kept == "optimized" else self.result.original

    def fields(self, costs: CostModel) -> dict[str, Any]:
        """The measured, predicted and structural report fields (see docs/tensat.md)."""
        j, original, plan = self.judgement, self.result.original, self.plan_graph
        by_name = {c.name: c for c in j.checks}
        low, high = j.speedup_ci
        return {
            "measured_speedup": j.speedup, "measured_speedup_ci": [low, high],
            "predicted_speedup": self.predicted.get(j.plan or "", 1.0), "kept": j.kept, "plan": j.plan,
            "answer_speedup": j.speedup if j.kept == "optimized" else 1.0, "passes": j.passes,
            "measured_before_s": j.original_s,
            "measured_after_s": j.timing.other_s if j.timing is not None else j.original_s,
            "candidates": [_candidate_json(name, self.predicted.get(name), by_name[name]) for name, _ in self.plans],
            "launch_sensitivity": launch_sensitivity(original, plan, costs.device),
            "kernels_original": original.runtime_kernels(), "kernels_eqsat": plan.runtime_kernels(),
            "flops_original": original.runtime_flops(), "flops_eqsat": plan.runtime_flops(),
            "optimizer_s": self.optimizer_s, "candidates_s": self.candidates_s, "layout_s": self.layout_s,
            "original_abs_err_jax": j.original_abs_err,
        }


def _candidate_json(name: str, predicted: float | None, check: PlanCheck) -> dict[str, Any]:
    t = check.timing
    ci = list(t.speedup_ci) if t is not None else ([1.0, 1.0] if check.same_as_original else None)
    return {"name": name, "predicted_speedup": predicted, "numerics_ok": check.numerics_ok,
            "same_as_original": check.same_as_original, "reason": check.reason,
            "measured_speedup": t.speedup if t is not None else (1.0 if check.same_as_original else None),
            "measured_speedup_ci": ci}


def _greedy(result: OptimizationResult, time_limit: float) -> tuple[Graph | None, float]:
    """The registry's greedy-dag answer on the same saturated e-graph (already computed when the
    ILP started from it) and the seconds it took."""
    import time

    from eqsat.egraph import decode
    from eqsat.extract import extract, load_egraph
    from eqsat.extract.selection import Status, make_selection
    from eqsat.gc_pause import gc_paused

    if not result.egraph_json:
        return None, 0.0
    t0 = time.perf_counter()
    with gc_paused():  # as in the search: see eqsat.gc_pause
        data = load_egraph(result.egraph_json)
        if result.greedy_choice is not None:
            greedy = make_selection(data, result.greedy_choice, status=Status.FEASIBLE, extractor="greedy-dag",
                                    seconds=0.0)
        else:
            greedy = extract(data, "greedy-dag", time_limit=time_limit)
        graph = decode(result.egraph_json, greedy.as_ids(data)).live()
    return graph, time.perf_counter() - t0


def calibrated_model(costs: CostModel) -> CostModel | None:
    """The xla model of the device `costs` prices for, if that is the device at hand and a
    calibration of it is cached; None otherwise (and when `costs` is that model already)."""
    if costs.name == "xla":
        return None
    try:
        return cost_model("xla", device=costs.device)
    except EqsatError:  # none cached (`eqsat calibrate` measures one, outside any optimizer clock), or another device
        return None


def optimize_and_judge(graph: Graph, rules: Sequence[Rule], limits: Limits, costs: CostModel, *,
                       extractor: str = "ilp", time_limit: float = 60.0, seed: int = 0,
                       candidates: Sequence[str] = DEFAULT_CANDIDATES, rounds: int = 30, budget_s: float = 30.0,
                       rtol: float = 1e-4, atol: float = 1e-5, progress: bool = False, strict: bool = True,
                       fold_weights: bool = True) -> Judged:
    """THE path of `eqsat optimize` (and of each pass of `eqsat bench tensat`): saturate once,
    extract under `costs` (and under each alternative of `candidates` on the same e-graph), then run
    the original and every candidate end to end through JAX and keep a plan only if it is faster
    with confidence (`jax_backend.checks.judge_plans`). The extractor's own answer disagreeing with
    the original through JAX is an error (NumericsError) when `strict` (else `Judged.numerics_ok`
    says so, for a bench that records it and goes on); another candidate that disagrees is dropped."""
    from eqsat.pipeline import optimize_graph

    alternatives = {name: (cost_model("roofline", device=costs.device, launch_s=0.0) if name == LAUNCH0
                           else cost_model(name, device=costs.device))
                    for name in candidates if name not in (GREEDY, LAYOUT, CALIBRATED)}
    calibrated = calibrated_model(costs) if CALIBRATED in candidates and "xla" not in alternatives else None
    if calibrated is not None:
        alternatives["xla"] = calibrated
    result = optimize_graph(graph, rules, limits, costs, extractor=extractor, time_limit=time_limit, seed=seed,
                            progress=progress, alternatives=alternatives, fold_weights=fold_weights)
    main = f"{extractor}/{costs.name}"
    plans: list[tuple[str, Graph]] = [(main, result.optimized)]
    greedy_s = 0.0
    if GREEDY in candidates:
        greedy, greedy_s = _greedy(result, time_limit)
        if greedy is not None:
            plans.append(("greedy-dag", greedy))
    plans += [(f"{extractor}/{name}", found.graph) for name, found in result.alternatives.items()
              if found.numerics_ok and f"{extractor}/{name}" != main]  # one name per plan
    layout_s = 0.0
    if LAYOUT in candidates:  # late: the layout rules in the main saturation make the ILP run to its limit
        from eqsat.candidates import program_key
        from eqsat.layout_phase import nhwc_plan

        # the original's NHWC form too: on this CPU the layout's gain outweighed the extractor's in
        # some models (ResNeXt-50 1.67x against 1.32x, docs/tensat.md), for one more small phase
        seen = {program_key(result.optimized)}
        for name, base in ((LAYOUT, result.optimized), (LAYOUT_ORIGINAL, graph)):
            if name == LAYOUT_ORIGINAL and program_key(graph) in seen:
                continue
            nhwc, seconds = nhwc_plan(base, costs.device, costs=costs, fold_weights=fold_weights)
            layout_s += seconds
            if nhwc is not None and program_key(nhwc) not in seen:
                seen.add(program_key(nhwc))
                plans.append((name, nhwc))
    before = graph_cost(graph, costs)
    predicted = {name: (before / after if after > 0 else float("nan"))
                 for name, after in ((n, graph_cost(g, costs)) for n, g in plans)}
    judgement = judge_plans(graph, plans, graph.random_inputs(seed), rtol, atol, rounds, budget_s)
    main_check = judgement.checks[0]
    if strict and not main_check.numerics_ok:
        raise NumericsError(f"the optimized graph disagrees with the original through JAX: "
                            f"{main_check.reason or 'float64 check failed'}; no result is reported")
    return Judged(result, tuple(plans), predicted, judgement,
                  greedy_s + layout_s + sum(found.seconds for found in result.alternatives.values()), layout_s)


def optimize_model(model: str, options: OptimizeOptions = OptimizeOptions()) -> dict[str, Any]:
    """Run the whole path on `model` and return the report row (the CLI's JSON fields and a few more)."""
    from rich.console import Console

    from eqsat.egraph import encoded_signatures
    from eqsat.rulesets import select_rules

    console = Console(stderr=True)
    if options.save_graphs is not None:
        writable_dir(options.save_graphs, "--save-graphs")
    graph = build_model(model)
    convention = conventions(options.conventions)
    costs = convention.apply(cost_model(options.cost_model, device=options.device))
    limits = Limits(iterations=options.iterations, nodes=options.node_limit, seconds=options.saturate_seconds,
                    multi_rounds=options.k_multi)
    console.print(f"[bold]{model}[/]: {len(graph.nodes)} nodes; saturating (limits: {limits.iterations} iterations, "
                  f"{limits.nodes} e-nodes, {limits.seconds:g} s) and extracting with {options.extractor}")
    with console.status("verifying the rules (Tensat's and conv_merges) that can match the graph (cached after the first run)"):
        rule_set = select_rules(named_rules(options.rules), encoded_signatures(graph))
    try:
        judged = optimize_and_judge(graph, rule_set.trusted, limits, costs, extractor=options.extractor,
                                    time_limit=options.time_limit, seed=options.seed, candidates=options.candidates,
                                    rounds=options.repeats, budget_s=options.timing_budget, rtol=options.rtol,
                                    atol=options.atol, progress=True, fold_weights=convention.fold_weights)
    except NumericsError as exc:
        raise NumericsError(f"{model}: {exc}") from None
    result = judged.result
    if options.save_graphs is not None:
        stem = model if model in MODELS else Path(model).stem
        graph.save(options.save_graphs / f"{stem}.before.json")
        judged.answer.save(options.save_graphs / f"{stem}.after.json")
        for name, plan in judged.plans:  # every candidate, for `eqsat judge` on another device
            plan.save(options.save_graphs / f"{stem}.candidate.{candidate_file_name(name)}.json")
    fields = judged.fields(costs)
    j = judged.judgement
    console.print(f"[bold]{model}[/]: kept {j.kept}; plan {j.plan or '(none differs)'}: measured "
                  f"{fields['measured_speedup']:.3f}x [{fields['measured_speedup_ci'][0]:.3f}, "
                  f"{fields['measured_speedup_ci'][1]:.3f}] over {j.passes} passes, predicted "
                  f"{fields['predicted_speedup']:.3f}x")
    return {
        "model": model,
        "enodes": result.enodes,
        "eclasses": result.eclasses,
        "saturate_s": result.saturate_s,
        "extract_s": result.extract_s,
        "cost_before": result.cost_before,
        "cost_after": result.cost_after,
        **fields,
        "numerics_ok": True,
        "stop_reason": result.stop_reason,
        "iterations": len(result.saturation.iterations),
        **rule_set.counts(),
        "extractor": options.extractor,
        "selection_status": result.selection_status,
        "cost_model": f"{options.cost_model}/{costs.device}",
        "conventions": options.conventions,
        "rules": options.rules,
        "nodes_before": len(graph.live().nodes),
        "nodes_after": len(judged.answer.live().nodes),
        "op_counts_after": judged.answer.live().op_counts(),
        "max_abs_diff_jax": max((c.max_abs_diff for c in j.checks if c.numerics_ok), default=0.0),
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: eqsat optimize MODEL")

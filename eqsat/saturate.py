"""Run rewrite rules on a `TensorEGraph` one iteration at a time, within limits, with a report.

egglog cannot be interrupted inside a run, so limits are enforced between iterations and no
single iteration may run away:
- each rule's matches per iteration are capped by egglog's back-off scheduler (a rule with more
  matches than its cap is skipped and banned for a while, its cap doubling), which bounds the
  growth of one iteration;
- before an iteration, its growth and duration are predicted from the previous one; if the
  prediction would pass the node or time limit the run stops there, saying which limit stopped it.
Two-output rules run in their own ruleset during the first `multi_rounds` iterations only
(Tensat's k_multi). A shape conflict (a rule that gives one e-class two shapes) raises RuleError
naming the rule, found by replaying the run up to the failing iteration and trying rules one by one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings

from eqsat.egglog_schema import SHAPE_RULESET
from eqsat.egraph import TensorEGraph
from eqsat.errors import LimitError, RuleError
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.to_egglog import EgglogRule, supported, translate_all

STOP_REASONS = ("saturated", "iterations", "nodes", "time")


@dataclass(frozen=True)
class Limits:
    """When to stop. `match_limit` is the back-off scheduler's per-rule cap on matches applied in
    one iteration (it doubles for a rule each time the rule is banned)."""

    iterations: int = 30
    nodes: int = 50_000
    seconds: float = 120.0
    multi_rounds: int = 1
    match_limit: int = 1_000

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.nodes < 1 or self.seconds < 0 or self.multi_rounds < 0 or self.match_limit < 1:
            raise LimitError(f"invalid limits {self}: iterations, multi_rounds, seconds must be >= 0, "
                             "nodes and match_limit >= 1")


@dataclass(frozen=True)
class IterationRow:
    """One iteration: sizes after it, its wall time, and the matches of each rule that matched."""

    iteration: int
    enodes: int
    eclasses: int
    seconds: float
    matches: Mapping[str, int]
    multi: bool

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "enodes": self.enodes, "eclasses": self.eclasses,
                "seconds": self.seconds, "multi": self.multi, "matches": dict(self.matches)}


@dataclass(frozen=True)
class SaturationReport:
    """What a saturation run did and why it stopped (`stop_reason` in STOP_REASONS)."""

    iterations: tuple[IterationRow, ...]
    stop_reason: str
    enodes_before: int
    enodes: int
    eclasses: int
    seconds: float
    limits: Limits
    rules: int
    detail: str = ""
    total_matches: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "stop_reason": self.stop_reason, "detail": self.detail, "enodes_before": self.enodes_before,
            "enodes": self.enodes, "eclasses": self.eclasses, "seconds": self.seconds, "rules": self.rules,
            "limits": {"iterations": self.limits.iterations, "nodes": self.limits.nodes,
                       "seconds": self.limits.seconds, "multi_rounds": self.limits.multi_rounds,
                       "match_limit": self.limits.match_limit},
            "iterations": [row.to_json() for row in self.iterations],
            "total_matches": dict(self.total_matches),
        }


@dataclass(frozen=True)
class _Installed:
    single: str | None  # combined ruleset names (None: no rules of that kind)
    multi: str | None
    rules: tuple[tuple[str, EgglogRule], ...]


def install(egraph: TensorEGraph, rules: Sequence[Rule], limits: Limits) -> _Installed:
    """Declare the rules (each in its own ruleset, grouped in a single and a multi ruleset)."""
    bad = [r.name for r in rules if not supported(r)]
    if bad:
        raise RuleError(f"rule(s) {', '.join(bad[:5])} use ops that cannot be put in the e-graph")
    prefix = f"rw{len(egraph.installed_rulesets)}_"
    translated = tuple(translate_all(rules, prefix))
    lines = []
    for rs, er in translated:
        lines += [f"(ruleset {rs})", er.text]
    groups: dict[str, str | None] = {}
    for kind, multi in (("single", False), ("multi", True)):
        members = [rs for rs, er in translated if er.multi == multi]
        name = f"{prefix}{kind}" if members else None
        if name:
            lines.append(f"(unstable-combined-ruleset {name} {' '.join(members)})")
            lines.append(f"(let-scheduler {name}_sched (back-off :match-limit {limits.match_limit} :ban-length 2))")
        groups[kind] = name
    try:
        egraph.run("\n".join(lines), record=True)
    except bindings.EggSmolError as exc:
        raise RuleError(f"egglog rejected the translated rules: {exc}") from None
    egraph.installed_rulesets[prefix] = tuple(rs for rs, _ in translated)
    return _Installed(groups["single"], groups["multi"], translated)


def _step_text(ruleset: str) -> str:
    return f"(run-schedule (run-with {ruleset}_sched {ruleset}))\n(run-schedule (saturate {SHAPE_RULESET}))"


def _report_of(outputs: Sequence[Any]) -> tuple[dict[str, int], bool, bool]:
    """(matches per rule, changed, can_stop) from a step's outputs."""
    matches: dict[str, int] = {}
    changed, can_stop = False, True
    for out in outputs:
        if not isinstance(out, bindings.RunScheduleOutput):
            continue
        report = out.report
        if set(report.search_and_apply_time_per_ruleset) <= {SHAPE_RULESET}:
            continue  # the shape analysis: its matches are not rewrites
        for name, n in report.num_matches_per_rule.items():
            matches[name] = matches.get(name, 0) + int(n)
        changed = changed or bool(report.updated)
        can_stop = can_stop and bool(report.can_stop)
    return matches, changed, can_stop


def saturate(egraph: TensorEGraph, rules: Sequence[Rule], limits: Limits, progress: bool = False) -> SaturationReport:
    """Grow `egraph` with `rules` until saturated or a limit stops it; see the module docstring."""
    start = time.perf_counter()
    installed = install(egraph, rules, limits)
    n0 = egraph.num_enodes()
    rows: list[IterationRow] = []
    totals: dict[str, int] = {}
    reason, detail = "iterations", f"ran the {limits.iterations} iteration(s) allowed"
    n_prev, last_growth, last_seconds = n0, 0, 0.0
    bar = _progress(progress, limits.iterations)
    for it in range(limits.iterations):
        elapsed = time.perf_counter() - start
        ratio = 1.0 if not rows or n_prev == 0 else max(1.0, (n_prev + last_growth) / max(n_prev, 1))
        if elapsed >= limits.seconds or (rows and elapsed + last_seconds * ratio > limits.seconds):
            reason, detail = "time", f"{elapsed:.2f}s used; the next iteration was predicted to pass {limits.seconds}s"
            break
        n_now = egraph.num_enodes()
        if rows and n_now + 2 * last_growth > limits.nodes:
            reason, detail = "nodes", f"{n_now} e-nodes; the next iteration was predicted to add ~{2 * last_growth}, past {limits.nodes}"
            break
        multi = it < limits.multi_rounds and installed.multi is not None
        groups = [g for g in ((installed.multi if multi else None), installed.single) if g]
        t0 = time.perf_counter()
        matches: dict[str, int] = {}
        changed, can_stop = False, True
        for group in groups:
            text = _step_text(group)
            try:
                outputs = egraph.run(text, record=True)
            except bindings.EggSmolError as exc:
                raise _explain_failure(egraph, installed, group, str(exc)) from None
            m, ch, cs = _report_of(outputs)
            for k, v in m.items():
                matches[k] = matches.get(k, 0) + v
            changed, can_stop = changed or ch, can_stop and cs
        seconds = time.perf_counter() - t0
        n_new, classes = egraph.num_enodes(), egraph.num_eclasses()
        rows.append(IterationRow(it, n_new, classes, seconds, {k: v for k, v in matches.items() if v}, multi))
        for k, v in matches.items():
            totals[k] = totals.get(k, 0) + v
        last_growth, last_seconds, n_prev = n_new - n_now, seconds, n_now
        bar(it + 1, n_new)
        if n_new >= limits.nodes:
            reason, detail = "nodes", f"{n_new} e-nodes reached the limit {limits.nodes}"
            break
        more_multi = it + 1 < limits.multi_rounds and installed.multi is not None
        if not changed and can_stop and not more_multi:
            reason, detail = "saturated", "no rule changed the e-graph"
            break
        if time.perf_counter() - start >= limits.seconds:
            reason, detail = "time", f"{time.perf_counter() - start:.2f}s used, limit {limits.seconds}s"
            break
    bar(None, 0)
    return SaturationReport(tuple(rows), reason, n0, egraph.num_enodes(), egraph.num_eclasses(),
                            time.perf_counter() - start, limits, len(installed.rules), detail, totals)


def _progress(enabled: bool, total: int) -> Any:
    """A rich progress bar on stderr (or a no-op): call with (done, enodes), then (None, 0) to close."""
    if not enabled:
        return lambda done, nodes: None
    from rich.console import Console
    from rich.progress import Progress

    prog = Progress(console=Console(stderr=True), transient=True)
    task = prog.add_task("saturating", total=total)
    prog.start()

    def update(done: int | None, nodes: int) -> None:
        if done is None:
            prog.stop()
        else:
            prog.update(task, completed=done, description=f"saturating ({nodes} e-nodes)")

    return update


def _explain_failure(egraph: TensorEGraph, installed: _Installed, group: str, message: str) -> RuleError:
    """Replay the run up to the failing step on a fresh e-graph, then try each rule of the group alone.

    The failing step is not in `egraph.program` (only steps that succeeded are recorded). A rule that
    fails leaves egglog's state unusable (a panic is not undone by `pop`), so the replay is rebuilt
    after each culprit; rules that pass cost one push/pop each.
    """
    if "Illegal merge" not in message and "shape" not in message:
        return RuleError(f"egglog failed while running rules: {message}")

    def fresh_replay() -> bindings.EGraph | str:
        replay = bindings.EGraph()
        try:
            replay.run_program(*replay.parse_program("\n".join(egraph.program)))
        except bindings.EggSmolError as exc:
            return str(exc)
        return replay

    replay = fresh_replay()
    if isinstance(replay, str):
        return RuleError(f"a rule gave an e-class two shapes ({message}); replaying to find it failed: {replay}")
    culprits = []
    for rs, er in installed.rules:
        if er.multi != (group == installed.multi):
            continue
        try:
            replay.run_program(*replay.parse_program("(push)"))
            replay.run_program(*replay.parse_program(f"(run-schedule (run {rs}))\n(run-schedule (saturate {SHAPE_RULESET}))"))
            replay.run_program(*replay.parse_program("(pop)"))
        except bindings.EggSmolError as exc:
            if "Illegal merge" not in str(exc) and "shape" not in str(exc):
                return RuleError(f"replaying rule {er.name} to find a shape conflict failed: {exc}")
            culprits.append(er)
            rebuilt = fresh_replay()
            if isinstance(rebuilt, str):
                break
            replay = rebuilt
    if culprits:
        names = ", ".join(f"{er.name} [{er.rule.text()}]" for er in culprits[:3])
        return RuleError(f"rule {names} gives one e-class two different shapes (egglog: {message})")
    return RuleError(f"rules of {group} together give one e-class two shapes; no single rule does (egglog: {message})")

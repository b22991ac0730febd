"""Run rewrite rules on a `TensorEGraph` one iteration at a time, within limits, with a report.

egglog cannot be interrupted inside a run, so limits are enforced between iterations and no
single iteration may run away:
- single rules run under egglog's back-off scheduler (a rule with more matches than its cap is
  skipped and banned for a while, its cap doubling), which bounds the growth of one iteration;
- an iteration runs all rules at once if `GROWTH_MARGIN` x the largest growth so far keeps it
  within the node limit and no banned rule is about to return; it runs rule by rule (a group's
  rules in one egglog call, the size read after each), undoing (by replay) and skipping any rule
  that would pass the limit, for two-output rounds (no cap bounds them) and for a step predicted
  to pass the limit, so `enodes <= nodes` and the stop reason is then "nodes"; a single-rule step
  whose growth cannot be predicted (the first, the one after a two-output round, banned rules
  returning) runs all at once and, only if it passed the limit, is undone and run rule by rule;
  the time limit is checked between such calls, not between rules;
- an iteration predicted (from the last one) to pass the time limit is not started.

Two-output rules (`multi_rounds`, Tensat's k_multi). Schedule "after-saturation" (the default):
single rules run until they change nothing, then one round of two-output rules alone, then single
rules again, and so on for each round. "interleaved" (Tensat's): two-output rules run alongside
single ones in each of the first k iterations. The default was chosen on NasRNN (experiments/
saturation_schedules.py): run at iteration 0, the two-output rules see only the input graph's
matmuls; after the single rules have saturated they also pair the matmuls that rules like
`ewadd(matmul x W, matmul h U) -> matmul(concat x h, concat W U)` created, which gives a larger
e-graph (k=1: 2.2k vs 1.6k e-nodes; k=2: 34k vs 24k) and a lower or equal extracted cost, for
about the same saturation time; see the report for the numbers. Two-output rules apply every
match of their round (no back-off scheduler: it would ban them outright at NasRNN's ~8k pairs).

Merge rounds (`merge_rounds`): a two-output rule with a concat on a left side extends an earlier
merge by one operand (`nary_merges.rules`: `(matmul a (concat b c)) ; (matmul a d)`). Those rules
run alone, right after each two-output round, for up to `merge_rounds` rounds (each merges one
more operand: 2 rounds give 4-way merges), before the single rules resume. So k_multi 1 merges all
of q, k, v and a layer's linear map, or Inception's three 1x1 convs, without a second round of
every two-output rule (which on BERT fills the node limit with products of products); the rules'
`(next ...)` condition builds runs of sibling operands in input order only (n - k + 1 k-way merges of
n siblings, not all C(n, k) subsets: NasRNN's eight gates per input made its e-graph 7.2k e-nodes
instead of 2.6k, for no gain).

Cycle guard: before a two-output round (or a merge round), every class pair those rules match is recorded, the
class graph is read from egglog's tables (`eqsat.cycle_guard`), and pairs where one class descends
from the other (merging them would create a cycle the extractor must then avoid) are marked in
egglog so the rules skip them. Exact. `Limits.cycle_filter` (`eqsat.cycle_guard.CYCLE_FILTERS`):
"efficient" (one pass, the default), "vanilla" (Tensat's: a fresh search per pair, same pairs,
slower) or "off" (no pair marked: merges may make cycles, which the extractors avoid).

A shape conflict (a rule that gives one e-class two shapes) raises RuleError naming the rule,
found by replaying the run up to the failing iteration and trying rules one by one.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings

from eqsat.cycle_guard import (CYCLE_FILTERS, class_graph_of_serialized, class_graph_of_tables, related_pairs,
                               related_pairs_each)
from eqsat.egglog_schema import SHAPE_RULESET
from eqsat.egraph import TensorEGraph, congruence_closed, tensor_enodes
from eqsat.errors import LimitError, RuleError
from eqsat.interrupt import native_call_interruptible
from eqsat.rewrites.rule import Rule, subterms
from eqsat.egglog_schema import PAIR_FUNCTION
from eqsat.rewrites.to_egglog import CANDIDATE_RULESET, EgglogRule, rule_ops, supported, translate_all

STOP_REASONS = ("saturated", "iterations", "nodes", "time")
MULTI_SCHEDULES = ("after-saturation", "interleaved")
GROWTH_MARGIN = 4  # a plain step runs only if 4x the last step's growth stays within the node limit


@dataclass(frozen=True)
class Limits:
    """When to stop. `match_limit` is the back-off scheduler's per-rule cap on matches applied in
    one iteration (it doubles for a rule each time the rule is banned)."""

    iterations: int = 30
    nodes: int = 50_000
    seconds: float = 120.0
    multi_rounds: int = 1
    match_limit: int = 1_000
    multi_schedule: str = "after-saturation"
    merge_rounds: int = 2
    cycle_filter: str = "efficient"  # eqsat.cycle_guard.CYCLE_FILTERS

    def __post_init__(self) -> None:
        if self.multi_schedule not in MULTI_SCHEDULES:
            raise LimitError(f"unknown multi_schedule {self.multi_schedule!r}; choose from {', '.join(MULTI_SCHEDULES)}")
        if self.cycle_filter not in CYCLE_FILTERS:
            raise LimitError(f"unknown cycle filter {self.cycle_filter!r}; choose from {', '.join(CYCLE_FILTERS)}")
        counts = (self.iterations, self.multi_rounds, self.merge_rounds)
        if min(counts) < 0 or self.nodes < 1 or self.seconds < 0 or self.match_limit < 1:
            raise LimitError(f"invalid limits {self}: iterations, multi_rounds, merge_rounds, seconds must be >= 0, "
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
    pairs: int = 0  # class pairs the two-output rules matched (multi steps only)
    cyclic_pairs: int = 0  # of those, pairs skipped because one class descends from the other
    guard_seconds: float = 0.0  # time spent finding them (included in `seconds`)

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "enodes": self.enodes, "eclasses": self.eclasses,
                "seconds": self.seconds, "multi": self.multi, "matches": dict(self.matches),
                "pairs": self.pairs, "cyclic_pairs": self.cyclic_pairs, "guard_seconds": self.guard_seconds}


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
                       "merge_rounds": self.limits.merge_rounds,
                       "match_limit": self.limits.match_limit, "multi_schedule": self.limits.multi_schedule,
                       "cycle_filter": self.limits.cycle_filter},
            "iterations": [row.to_json() for row in self.iterations],
            "total_matches": dict(self.total_matches),
        }


@dataclass(frozen=True)
class _Installed:
    single: str | None  # combined ruleset names (None: no rules of that kind)
    multi: str | None
    extend: str | None  # two-output rules that extend an earlier merge (run in merge rounds)
    rules: tuple[tuple[str, EgglogRule], ...]
    members: Mapping[str, tuple[str, ...]]  # combined ruleset → its rules' own rulesets
    names: Mapping[str, str]  # a rule's own ruleset → the rule's name
    pairs: Mapping[str, str]  # multi / extend group → the ruleset recording the class pairs its joined rules match


def install(egraph: TensorEGraph, rules: Sequence[Rule], limits: Limits) -> _Installed:
    """Declare the rules (each in its own ruleset, grouped in a single and a multi ruleset)."""
    bad = [r.name for r in rules if not supported(r)]
    if bad:
        raise RuleError(f"rule(s) {', '.join(bad[:5])} use ops that cannot be put in the e-graph")
    egraph.declare_ops(rule_ops(rules))
    prefix = f"rw{len(egraph.installed_rulesets)}_"
    translated = tuple(translate_all(rules, prefix))
    lines = []
    for rs, er in translated:
        lines += [f"(ruleset {rs})", er.text]
    groups: dict[str, str | None] = {}
    kinds: dict[str, list[str]] = {"single": [], "multi": [], "extend": []}
    for rs, er in translated:
        kinds[_kind(er)].append(rs)
    pairs: dict[str, str] = {}
    for kind in ("multi", "extend"):  # each group records only its own pairs (a merge round's are few)
        candidates = [er.candidate for _, er in translated if er.candidate and _kind(er) == kind]
        if candidates:
            shared, own = f":ruleset {prefix}{CANDIDATE_RULESET} ", f":ruleset {prefix}{CANDIDATE_RULESET}_{kind} "
            pairs[f"{prefix}{kind}"] = f"{prefix}{CANDIDATE_RULESET}_{kind}"
            lines += [f"(ruleset {prefix}{CANDIDATE_RULESET}_{kind})", *(c.replace(shared, own) for c in candidates)]
    for kind, kind_members in kinds.items():
        name = f"{prefix}{kind}" if kind_members else None
        if name:
            lines.append(f"(unstable-combined-ruleset {name} {' '.join(kind_members)})")
            if kind == "single":
                lines.append(f"(let-scheduler {name}_sched (back-off :match-limit {limits.match_limit} :ban-length 2))")
        groups[kind] = name
    try:
        egraph.run("\n".join(lines), record=True)
    except bindings.EggSmolError as exc:
        raise RuleError(f"egglog rejected the translated rules: {exc}") from None
    egraph.installed_rulesets[prefix] = tuple(rs for rs, _ in translated)
    members = {g: tuple(kinds[kind]) for kind, g in groups.items() if g}
    return _Installed(groups["single"], groups["multi"], groups["extend"], translated, members, {rs: er.name for rs, er in translated},
                      pairs)


def is_merge_extension(rule: Rule) -> bool:
    """A two-output rule with a concat on a left side: it adds one operand to an earlier merge."""
    return rule.is_multi and any(t.op == "concat" for side in rule.lhs for t in subterms(side))


def _kind(er: EgglogRule) -> str:
    if not er.multi:
        return "single"
    return "extend" if is_merge_extension(er.rule) else "multi"


def _step_text(ruleset: str, scheduler: str | None) -> str:
    """One run of `ruleset` (under the group's back-off scheduler, if any), then the shape analysis."""
    run = f"(run-with {scheduler}_sched {ruleset})" if scheduler else f"(run {ruleset})"
    return f"(run-schedule {run})\n(run-schedule (saturate {SHAPE_RULESET}))"


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


@dataclass
class _StepResult:
    """What one iteration did (mutable while the step accumulates it)."""

    matches: dict[str, int] = field(default_factory=dict)
    changed: bool = False
    can_stop: bool = True
    skipped: list[str] = field(default_factory=list)  # rules rolled back to stay within the node limit
    out_of_time: bool = False

    def add(self, outputs: Sequence[Any]) -> None:
        m, ch, cs = _report_of(outputs)
        for k, v in m.items():
            self.matches[k] = self.matches.get(k, 0) + v
        self.changed, self.can_stop = self.changed or ch, self.can_stop and cs


class _Stepper:
    """Runs one iteration of some rule groups on the e-graph, plainly or within a node budget."""

    def __init__(self, egraph: TensorEGraph, installed: _Installed, limits: Limits, start: float) -> None:
        self.egraph, self.installed, self.limits, self.start = egraph, installed, limits, start

    def _run(self, text: str, group: str) -> list[Any]:
        try:
            with native_call_interruptible():
                return self.egraph.run(text, record=True)
        except bindings.EggSmolError as exc:
            raise _explain_failure(self.egraph, self.installed, group, str(exc)) from None

    def guard_cycles(self, group: str) -> tuple[int, int]:
        """Record every pair of classes the joined two-output rules of `group` match, then mark the pairs where
        one class descends from the other (merging them would make a cycle): those rules fire
        only on unmarked pairs. Exact, computed in Python on egglog's tables between steps, by
        `Limits.cycle_filter`'s method ("off": the pairs are recorded, none marked).
        Returns (pairs, related pairs)."""
        if group not in self.installed.pairs:
            return 0, 0
        self._run(f"(run-schedule (run {self.installed.pairs[group]}))", self.installed.pairs[group])
        if self.limits.cycle_filter == "off":
            return 0, 0
        graph = class_graph_of_tables(self.egraph.egglog)
        if graph is None:  # some id in egglog's tables may be stale: read the canonical serialized e-graph
            roots = [bindings.Var(bindings.PanicSpan(), g) for g in self.egraph.output_globals]
            graph = class_graph_of_serialized(congruence_closed(json.loads(self.egglog_serialized(roots))))
        scan = (related_pairs_each if self.limits.cycle_filter == "vanilla" else related_pairs)(graph)
        if scan.found:
            facts = "\n".join(f"(set ({PAIR_FUNCTION} {a} {b}) 1)" for a, b in sorted(scan.found))
            self.egraph.run(facts, record=True)
        return scan.recorded, len(scan.marked) + len(scan.found)

    def egglog_serialized(self, roots: list[Any]) -> str:
        return str(self.egraph.egglog.serialize(roots).to_json())

    def _scheduler(self, group: str) -> str | None:
        """Two-output rules apply every match of their round (as Tensat's); single rules run under
        the back-off scheduler, whose bans bound one iteration's growth."""
        return group if group == self.installed.single else None

    def plain(self, groups: Sequence[str]) -> _StepResult:
        """Every rule of each group at once (egglog matches all, then applies all)."""
        result = _StepResult()
        for group in groups:
            result.add(self._run(_step_text(group, self._scheduler(group)), group))
        return result

    def optimistic(self, groups: Sequence[str]) -> _StepResult:
        """All rules at once (as `plain`); if that passed the node limit, undone (by replay) and
        run again rule by rule (`within_budget`). For single rules only: their back-off caps bound
        how far one plain step can overshoot, and most steps do not reach the limit, so the rule-by-
        rule overhead (a shape pass and a size read per rule: ~2x the step on NasRNN) is paid only
        by the step that does."""
        start = len(self.egraph.program)
        result = self.plain(groups)
        if self.egraph.num_enodes() <= self.limits.nodes:
            return result
        self.egraph.rewind(start)
        return self.within_budget(groups)

    def within_budget(self, groups: Sequence[str]) -> _StepResult:
        """Rule by rule, never past the node limit: each rule runs after the ones before it (so a
        rule sees what they built), the e-graph is measured after each, and a rule that takes it
        past the limit is undone (`TensorEGraph.rewind` to the step's start, the rules kept so far
        run again: egglog is deterministic) and skipped. A group's rules run in one egglog call, a
        size report after each; saving a copy (egglog `push`) before every step and a call per
        rule cost more than the steps themselves on small e-graphs (a push copies egglog's whole
        state: ~20 ms on SqueezeNet's 200 e-nodes)."""
        start = len(self.egraph.program)
        result = _StepResult()
        kept: list[tuple[str, str]] = []
        for group in groups:
            pending = list(self.installed.members[group])
            while pending:
                if time.perf_counter() - self.start >= self.limits.seconds:
                    result.out_of_time = True
                    return result
                text = "\n".join(f"{_step_text(rs, self._scheduler(group))}\n(print-size)" for rs in pending)
                per_rule = _split_at_sizes(self._run(text, group))
                over = next((k for k, (_, n) in enumerate(per_rule) if n > self.limits.nodes), len(pending))
                for rs, (outputs, _) in zip(pending[:over], per_rule):
                    kept.append((rs, group))
                    result.add(outputs)
                if over == len(pending):
                    break
                result.skipped.append(self.installed.names[pending[over]])
                self.egraph.rewind(start)
                result = _StepResult(skipped=result.skipped)
                for g, rules_of_g in itertools.groupby(kept, key=lambda pair: pair[1]):
                    text = "\n".join(_step_text(rs, self._scheduler(g)) for rs, _ in rules_of_g)
                    result.add(self._run(text, g))
                pending = pending[over + 1:]
        return result


def _split_at_sizes(outputs: Sequence[Any]) -> list[tuple[list[Any], int]]:
    """A batch of (rule run, shape analysis, print-size) → per rule: its outputs and the tensor
    e-nodes after it."""
    out: list[tuple[list[Any], int]] = []
    current: list[Any] = []
    for o in outputs:
        if isinstance(o, bindings.PrintAllFunctionsSize):
            out.append((current, tensor_enodes({str(name): int(n) for name, n in o.sizes})))
            current = []
        else:
            current.append(o)
    return out


def saturate(egraph: TensorEGraph, rules: Sequence[Rule], limits: Limits, progress: bool = False) -> SaturationReport:
    """Grow `egraph` with `rules` until saturated or a limit stops it; see the module docstring."""
    start = time.perf_counter()
    installed = install(egraph, rules, limits)
    stepper = _Stepper(egraph, installed, limits, start)
    n0 = egraph.num_enodes()
    rows: list[IterationRow] = []
    totals: dict[str, int] = {}
    reason, detail = "iterations", f"ran the {limits.iterations} iteration(s) allowed"
    last_growth: int | None = None  # growth of the last single-rule step that followed one
    last_seconds, ratio = 0.0, 1.0
    max_growth, banned = 0, False
    multi_done, single_quiet, previous_multi = 0, installed.single is None, True
    merges_left = 0  # merge rounds still to run after the last two-output round
    interleaved = limits.multi_schedule == "interleaved"
    bar = _progress(progress, limits.iterations)
    for it in range(limits.iterations):
        elapsed = time.perf_counter() - start
        if elapsed >= limits.seconds or (rows and elapsed + last_seconds * ratio > limits.seconds):
            reason, detail = "time", f"{elapsed:.2f}s used; the next iteration was predicted to pass {limits.seconds}s"
            break
        n_now = egraph.num_enodes()
        if n_now >= limits.nodes:
            reason, detail = "nodes", f"{n_now} e-nodes reached the limit {limits.nodes}"
            break
        more_multi = installed.multi is not None and multi_done < limits.multi_rounds
        extending = merges_left > 0 and installed.extend is not None
        multi = not extending and more_multi and (interleaved or single_quiet)
        groups = [installed.extend] if extending and installed.extend else [
            g for g in ((installed.multi if multi else None), (installed.single if not multi or interleaved else None)) if g]
        if not groups:
            reason, detail = "saturated", "no rules to run"
            break
        # Unknown after a two-output round or while banned rules wait to return with doubled caps.
        predicted = None if (multi or extending or previous_multi or last_growth is None or banned) else GROWTH_MARGIN * max_growth
        t0 = time.perf_counter()
        pairs = stepper.guard_cycles(groups[0]) if multi or extending else (0, 0)
        guard_s = time.perf_counter() - t0
        if multi or extending or (predicted is not None and n_now + predicted > limits.nodes):
            step = stepper.within_budget(groups)  # uncapped rounds, or a step expected to reach the limit
        elif predicted is None:
            step = stepper.optimistic(groups)
        else:
            step = stepper.plain(groups)
        seconds = time.perf_counter() - t0
        n_new, classes = egraph.num_enodes(), egraph.num_eclasses()
        rows.append(IterationRow(it, n_new, classes, seconds, {k: v for k, v in step.matches.items() if v}, multi or extending,
                                 pairs[0], pairs[1], guard_s))
        for k, v in step.matches.items():
            totals[k] = totals.get(k, 0) + v
        growth = n_new - n_now
        ratio = max(1.0, n_new / max(n_now, 1))
        last_growth = None if multi or extending else growth
        max_growth = max(max_growth, growth)
        banned = not step.can_stop
        last_seconds, previous_multi = seconds, multi or extending
        multi_done += int(multi)
        bar(it + 1, n_new)
        quiet = not step.changed and step.can_stop
        if step.skipped:
            reason, detail = "nodes", (f"{n_new} e-nodes; rule(s) {', '.join(step.skipped[:3])} would have passed "
                                       f"the limit {limits.nodes} and were undone")
            break
        if step.out_of_time or time.perf_counter() - start >= limits.seconds:
            reason, detail = "time", f"{time.perf_counter() - start:.2f}s used, limit {limits.seconds}s"
            break
        if extending:
            merges_left = merges_left - 1 if step.changed else 0
            single_quiet = single_quiet and not step.changed
        elif not multi:
            single_quiet = quiet
        else:
            merges_left = limits.merge_rounds if step.changed else 0
            single_quiet = single_quiet and not step.changed
        more_multi = installed.multi is not None and multi_done < limits.multi_rounds
        if quiet and not extending and (multi or not more_multi):  # running the same rules again would change nothing
            rounds = f" ({multi_done} two-output round(s) run)" if installed.multi is not None else ""
            reason, detail = "saturated", "no rule changed the e-graph" + rounds
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
        if er.multi != (group != installed.single):
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

"""Decide rules: proved (for all shapes), tested (proved on the tested concrete shapes only: a test,
not a proof), refuted (with a counterexample), or unknown (with the reason), and pick the rules safe
to optimize with (proved for all shapes, unless a caller opts in to tested ones).

The concrete decision is `concrete.py`; a rule it proves that an e-graph derives from a base of
axioms (each proved the same way) is proved for all shapes, see `derive.py`, as is one that z3
proves over symbolic dims and indices (`symbolic.py`: index expressions of every op it models). Results are cached on
disk (`verify_cache.py`). Imports run one way: concrete <- verify_cache <- derive <- verify.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from eqsat.rewrites.concrete import (ALL_SHAPES, PROVED, REFUTED, TESTED, UNKNOWN, VERIFIER_VERSION, VerificationResult,
                                     VerifyOptions, verify_concrete)
from eqsat.rewrites.derive import axiom_base, derivable, derivable_guarded
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.symbolic import prove_symbolic_outcome
from eqsat.rewrites.verify_cache import VerificationCache, prove_missing

def verify_rule(rule: Rule, options: VerifyOptions = VerifyOptions(), axioms: Sequence[Rule] | None = None) -> VerificationResult:
    """Concrete verification, then (when proved) an attempt to prove it for all shapes from `axioms`.

    `axioms=None` uses the library's verified axiom base; `()` skips the all-shapes attempt.
    """
    result = verify_concrete(rule, options)
    if PROVED not in (result.status, result.guarded_status):
        return result
    base = axiom_base() if axioms is None else axioms
    if not base:
        return result
    start = time.perf_counter()
    if result.status == PROVED and result.scope != ALL_SHAPES:
        used = derivable(rule, base)
        if used is not None:
            how = f"all shapes: e-graph derivation from {len(used)} verified axiom(s) ({', '.join(sorted(used))})"
            result = replace(result, method=f"{how}; {result.method}", scope=ALL_SHAPES,
                             guarded_method="implied: holds without the guard", guarded_scope=ALL_SHAPES)
    if result.guarded_status == PROVED and result.guarded_scope != ALL_SHAPES:
        found = derivable_guarded(rule, base)
        if found is not None:
            how, used = found
            result = replace(result, guarded_scope=ALL_SHAPES,
                             guarded_method=f"all shapes under the guard: {how} from {len(used)} verified axiom(s) "
                                            f"({', '.join(sorted(used))}); {result.guarded_method}")
    if result.status == PROVED and result.scope != ALL_SHAPES:
        symbolic, capped = prove_symbolic_outcome(rule)
        result = replace(result, capped=result.capped or capped)
        if symbolic is not None:
            result = replace(result, method=f"all shapes: {symbolic}; {result.method}", scope=ALL_SHAPES,
                             guarded_method="implied: holds without the guard", guarded_scope=ALL_SHAPES)
    if result.guarded_status == PROVED and result.guarded_scope != ALL_SHAPES:
        symbolic, capped = prove_symbolic_outcome(rule, guarded=True)
        result = replace(result, capped=result.capped or capped)
        if symbolic is not None:
            result = replace(result, guarded_scope=ALL_SHAPES,
                             guarded_method=f"all shapes under the guard: {symbolic}; {result.guarded_method}")
    return replace(result, seconds=result.seconds + time.perf_counter() - start)


def _stderr_progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def verify_rules(rules: Iterable[Rule], options: VerifyOptions = VerifyOptions(), all_shapes: bool = True,
                 progress: bool = False, cache: bool = True) -> list[VerificationResult]:
    """Verify rules in order. With `cache`, results come from / go to the on-disk verification cache
    (see `verify_cache`), so an unchanged rule set verifies in milliseconds; the axiom base is built
    only when some rule misses the cache."""
    rules = list(rules)
    store = VerificationCache.default() if cache else None
    out: list[VerificationResult | None] = [
        (store.get(r, options, all_shapes) or (None if all_shapes else store.get(r, options, True))) if store else None
        for r in rules]
    todo = [i for i, res in enumerate(out) if res is None]
    if todo:
        base = axiom_base(cache=cache) if all_shapes else ()

        def one(rule: Rule) -> VerificationResult:
            return verify_rule(rule, options, base)

        # other processes verifying the same rules into the same cache take their share (`prove_missing`)
        if progress:
            with _stderr_progress() as bar:
                task = bar.add_task(f"verifying {len(todo)} rule(s)", total=len(todo))
                prove_missing(store, rules, options, all_shapes, out, one, lambda: bar.advance(task))
        else:
            prove_missing(store, rules, options, all_shapes, out, one)
    return [r for r in out if r is not None]


def verified_rules(rules: Iterable[Rule], allow_unproved: bool = False, allow_guarded: bool = False,
                   options: VerifyOptions = VerifyOptions(), cache: bool = True, all_shapes: bool = True,
                   allow_tested: bool = False) -> list[Rule]:
    """The rules safe to optimize with: those proved for all shapes by default.

    `allow_tested=True` also admits rules proved only on the tested shapes (a test, not a proof:
    a rule wrong at a stride, padding or size the sampler missed would pass).
    `allow_guarded=True` also admits rules that are refuted only on shapes but proved under the guard
    (`guarded_status == "proved"`: equal wherever the right side is well-typed with the left side's
    shape). Only a caller whose applier checks that guard may opt in: eqsat's egglog translation
    (`eqsat.rewrites.to_egglog`) builds a right side only when its shape facts hold, and stops on a
    shape conflict, which is why the pipeline opts in for Tensat's rule files. `allow_unproved=True`
    also admits rules that are unknown (neither proved nor refuted) or tested, strictly or under the
    guard when `allow_guarded` is set; refuted-on-values rules are never admitted. Without the
    all-shapes attempt (`all_shapes=False`) no rule is proved for all shapes unless the cache says
    so, so only a caller that admits tested rules should skip it.
    """
    rules = list(rules)
    results = verify_rules(rules, options, all_shapes=all_shapes, cache=cache)
    return [r for r, res in zip(rules, results) if res.admits(allow_unproved, allow_guarded, allow_tested)]


__all__ = ["VerificationResult", "VerifyOptions", "verify_rule", "verify_rules", "verified_rules", "verify_concrete",
           "PROVED", "REFUTED", "UNKNOWN", "TESTED", "ALL_SHAPES", "VERIFIER_VERSION"]

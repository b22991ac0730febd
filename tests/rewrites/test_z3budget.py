"""A rule's proof does not depend on machine load: z3 answers under an rlimit (its count of internal
work, `z3budget`), the wall clock is only a hang guard, and a verdict that guard cut off is never
cached (a cache would keep a rule untrusted that a quiet run proves)."""

from __future__ import annotations

from pathlib import Path

import pytest
import z3

from eqsat.rewrites import concrete, parse_rule_text, symbolic
from eqsat.rewrites.concrete import VerifyOptions
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.verify import verify_rules
from eqsat.rewrites.verify_cache import VerificationCache
from eqsat.rewrites.z3budget import Budget, WallClockCapped, check

# the true rule a loaded machine once left unproved under the old 1 s wall-clock timeout
ENLARGE = parse_rule_text("enlarge: (conv2d 1 1 0 0 ?x (enlarge ?w ?v)) => (conv2d 1 1 0 0 ?x ?w)")[0]
RELU_DOUBLE = parse_rule_text("relu-double: (ewadd (relu ?x) (relu ?x)) => (relu (ewadd ?x ?x))")[0]  # concrete: z3


def _cubes() -> z3.Solver:
    x, y = z3.Ints("x y")
    solver = z3.Solver()
    solver.add(x * x * x + y * y * y == 1729, x > 0, y > 0)  # sat, but z3 needs ~10^5 units and tens of ms
    return solver


def _used() -> int:
    """z3's cumulative rlimit count of the main context (a trivial check adds a handful)."""
    probe = z3.Solver()
    probe.check()
    return int(probe.statistics().get_key_value("rlimit count"))


def test_a_spent_rlimit_is_an_answer_and_the_wall_cap_is_not() -> None:
    assert check(_cubes(), Budget(rlimit=50, wall_ms=60_000)) == z3.unknown  # reproducible: kept
    with pytest.raises(WallClockCapped):
        check(_cubes(), Budget(rlimit=10**12, wall_ms=1))  # load-dependent: the caller must not keep it
    assert check(_cubes(), Budget(rlimit=10**9, wall_ms=60_000)) == z3.sat


def test_the_proof_is_decided_by_the_rlimit_not_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check of the proof ends by its answer or its rlimit, never by its wall-clock cap (so a
    slower clock cannot change the answer), run after run; a tiny rlimit declines, and that is final."""
    checks: list[tuple[int, int]] = []

    def counted(solver: z3.Solver, budget: Budget) -> z3.CheckSatResult:
        before = _used()
        answer = check(solver, budget)
        checks.append((_used() - before, budget.rlimit))
        return answer

    monkeypatch.setattr(symbolic, "check", counted)
    for _ in range(3):
        how, capped = symbolic.prove_symbolic_outcome(ENLARGE)
        assert how is not None and not capped
    assert checks  # (a check may spend its rlimit: a grouped query is then retried with the groups factored)
    monkeypatch.setattr(symbolic, "WINDOW_BUDGET", Budget(rlimit=1_000, wall_ms=60_000))
    monkeypatch.setattr(symbolic, "GROUPED_BUDGET", Budget(rlimit=1_000, wall_ms=60_000))
    assert symbolic.prove_symbolic_outcome(ENLARGE) == (None, False)  # declined by the rlimit: a final answer


def _fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> VerificationCache:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    return VerificationCache.default()


def test_a_symbolic_verdict_cut_off_by_the_wall_clock_is_not_cached(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    cache = _fresh_cache(monkeypatch, tmp_path)
    options = VerifyOptions()
    with monkeypatch.context() as m:
        for budget in ("WINDOW_BUDGET", "GROUPED_BUDGET"):
            m.setattr(symbolic, budget, Budget(rlimit=10**12, wall_ms=1))  # the cap, not the rlimit, ends it
        (capped,) = verify_rules([ENLARGE], options)
    assert capped.capped and capped.verdict == "tested"
    assert cache.get(ENLARGE, options, True) is None  # the next run decides again
    (proved,) = verify_rules([ENLARGE], options)
    assert not proved.capped and proved.verdict == "proved"
    cached = cache.get(ENLARGE, options, True)
    assert cached is not None and cached.verdict == "proved"


def test_a_concrete_verdict_cut_off_by_the_wall_clock_is_not_cached(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    cache = _fresh_cache(monkeypatch, tmp_path)
    rules: list[Rule] = [RELU_DOUBLE]
    capped_options = VerifyOptions(seed=1)  # (its own cache key)

    def capped_check(solver: z3.Solver, budget: Budget) -> z3.CheckSatResult:
        raise WallClockCapped("the wall clock ended it")  # as `check` does (a real 1 ms cap: this rule's
        # largest query takes ~10 ms here, perhaps under 1 ms on a fast machine)

    with monkeypatch.context() as m:
        m.setattr(concrete, "check", capped_check)
        (capped,) = verify_rules(rules, capped_options, all_shapes=False)
    assert capped.capped and capped.status == "unknown", capped
    assert cache.get(RELU_DOUBLE, capped_options, False) is None
    spent = VerifyOptions(z3_rlimit=1)  # an rlimit too small: reproducible, so it is cached
    (unknown,) = verify_rules(rules, spent, all_shapes=False)
    assert not unknown.capped and unknown.status == "unknown", unknown
    assert cache.get(RELU_DOUBLE, spent, False) is not None

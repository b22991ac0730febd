"""Keep/discard decisions that hold: the sequential test stops as soon as the interval clears the
threshold (and keeps timing a close call until its budget), and `@eqsat.optimize` persists each
decision per (program, signature, device) so a fresh wrapper reuses it without timing."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_backend.timing as timing
from jax_backend.decisions import DecisionKey, EqsatCacheWarning, load_decision, save_decision
from jax_backend.decorator import optimize
from jax_backend.explain import explain
from jax_backend.timing import Decision, sequential_decision


def _sleeper(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


@pytest.mark.parametrize(("base_s", "other_s", "verdict"), [(0.004, 0.001, "faster"), (0.001, 0.004, "slower")])
def test_sequential_test_stops_early_on_a_clear_pair(base_s: float, other_s: float, verdict: str) -> None:
    decision = sequential_decision(_sleeper(base_s), _sleeper(other_s), budget_s=20.0)
    assert decision.verdict == verdict and decision.keep == (verdict == "faster")
    assert decision.rounds < 40 and decision.elapsed_s < 5.0  # far from the 20 s budget
    low, high = decision.speedup_ci
    assert low <= decision.speedup <= high
    assert (low > decision.threshold) if verdict == "faster" else (high < decision.threshold)


def _scripted(monkeypatch: pytest.MonkeyPatch, base: Callable[[], Any], times: dict[int, Iterator[float]]) -> None:
    """`timing._sample` answers from a script per thunk (base: key 0, other: key 1), no clock."""
    monkeypatch.setattr(timing, "_sample", lambda thunk, calls: next(times[0 if thunk is base else 1]))


def test_a_close_call_times_until_the_budget_and_is_inconclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    base, other = (lambda: None), (lambda: None)
    rounds = [0]

    def other_times() -> Iterator[float]:
        while True:  # half the rounds twice as fast, half twice as slow: the interval straddles 1
            rounds[0] += 1
            yield 0.5 if rounds[0] % 2 else 2.0

    def base_times() -> Iterator[float]:
        while True:
            yield 1.0

    _scripted(monkeypatch, base, {0: base_times(), 1: other_times()})
    decision = sequential_decision(base, other, budget_s=0.5, max_rounds=300)
    assert decision.verdict == "inconclusive" and not decision.keep
    assert decision.rounds > 8  # it kept looking


def test_a_pair_not_faster_at_its_median_stops_before_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Futility: the interval straddles the threshold but the median shows no speedup, so the test
    stops after `FUTILE_AFTER` of the budget, inconclusive (discarded), not at its end."""
    base, other = (lambda: None), (lambda: None)
    flip = [0]

    def other_times() -> Iterator[float]:
        while True:
            flip[0] += 1
            time.sleep(0.002)  # the clock moves, as timing would
            yield 0.9 if flip[0] % 2 else 1.3

    _scripted(monkeypatch, base, {0: iter(lambda: 1.0, None), 1: other_times()})
    decision = sequential_decision(base, other, budget_s=4.0)
    low, high = decision.speedup_ci
    assert decision.verdict == "inconclusive" and not decision.keep and low < decision.threshold < high
    assert decision.speedup < 1.0 and decision.elapsed_s < 0.6 * 4.0


def test_a_faster_median_is_not_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair faster at its median but not yet decided keeps timing to the end of the budget."""
    base, other = (lambda: None), (lambda: None)
    flip = [0]

    def other_times() -> Iterator[float]:
        while True:
            flip[0] += 1
            time.sleep(0.002)
            yield 0.7 if flip[0] % 3 else 1.4  # median 0.7 of base, but a heavy tail keeps the interval wide

    _scripted(monkeypatch, base, {0: iter(lambda: 1.0, None), 1: other_times()})
    decision = sequential_decision(base, other, budget_s=0.4)
    assert decision.speedup > 1.0 and (decision.verdict == "faster" or decision.elapsed_s >= 0.4)


def test_an_equal_pair_is_discarded_against_a_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal speed is not "faster by more than the margin": the upper bound falls below 1 + margin."""
    base, other = (lambda: None), (lambda: None)
    ones = iter(lambda: 1.0, None)
    _scripted(monkeypatch, base, {0: ones, 1: ones})
    decision = sequential_decision(base, other, margin=0.2, budget_s=10.0)
    assert decision.verdict == "slower" and decision.rounds == 8 and decision.threshold == pytest.approx(1.2)


def _decision(verdict: str = "faster") -> Decision:
    return Decision(verdict, 1.3, 1.2, 1.4, 1.01, 16, 2e-3, 1.5e-3, 0.99, 0.4, 3)


def test_decisions_round_trip_and_damaged_entries_are_ignored(tmp_path: Path) -> None:
    key = DecisionKey("abc", "float32[4]", "cpu:cpu:1")
    assert load_decision(key, tmp_path) is None  # nothing stored: a quiet miss
    save_decision(key, "merge", _decision(), tmp_path)
    label, back = load_decision(key, tmp_path) or ("", None)
    assert label == "merge" and back is not None and back.from_cache
    assert back == _decision().__class__(**{**_decision().__dict__, "from_cache": True})
    assert load_decision(DecisionKey("abc", "float32[5]", "cpu:cpu:1"), tmp_path) is None  # another signature
    path = key.path(tmp_path)
    good = json.loads(path.read_text())
    for damage in ["{not json", json.dumps({**good, "format": 99}), json.dumps({**good, "decision": {"verdict": "x"}}),
                   json.dumps({**good, "key": {**good["key"], "device": "gpu"}}),
                   json.dumps({**good, "decision": {**good["decision"], "speedup": "fast"}})]:
        path.write_text(damage)
        with pytest.warns(EqsatCacheWarning, match="damaged"):
            assert load_decision(key, tmp_path) is None


def two_heads(x: jax.Array, w1: jax.Array, w2: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.nn.relu(x @ w1), jax.nn.relu(x @ w2)  # two products of x: the merge model merges them


ARGS = tuple(jnp.asarray(np.random.default_rng(i).standard_normal(s), jnp.float32)
             for i, s in enumerate([(16, 32), (32, 32), (32, 32)]))


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the decorator's sequential tests; each answers "faster" at once (no real timing)."""
    calls: list[int] = []

    def fake(base: Callable[[], Any], other: Callable[[], Any], **_: Any) -> Decision:
        calls.append(1)
        return _decision()

    monkeypatch.setattr(timing, "sequential_decision", fake)  # what choose_faster confirms with
    return calls


def test_a_fresh_wrapper_reuses_the_persisted_decision_without_timing(timed: list[int],
                                                                     _private_decision_cache: Path) -> None:
    first = optimize(two_heads, cost_model="merge", time_limit=2.0)
    np.testing.assert_allclose(first(*ARGS), two_heads(*ARGS), rtol=2e-4, atol=1e-5)
    report = first.report(*ARGS)
    assert report.used == "optimized", report.reason
    assert timed == [1] and report.decision is not None and not report.decision.from_cache
    assert len(list(_private_decision_cache.glob("*.json"))) == 1

    second = optimize(two_heads, cost_model="merge", time_limit=2.0)  # a fresh wrapper: empty in-memory state
    np.testing.assert_allclose(second(*ARGS), two_heads(*ARGS), rtol=2e-4, atol=1e-5)
    again = second.report(*ARGS)
    assert timed == [1], "the second wrapper timed again"
    assert again.used == "optimized" and again.decision is not None and again.decision.from_cache
    assert again.speedup_ci == (1.2, 1.4) and "decision from the cache" in again.reason
    text = str(explain(second, *ARGS))
    assert "decision: faster" in text and "16 rounds" in text and "from the cache" in text

    other = tuple(a[:8] if i == 0 else a for i, a in enumerate(ARGS))  # another signature: timed anew
    optimize(two_heads, cost_model="merge", time_limit=2.0)(*other)
    assert timed == [1, 1]
    optimize(two_heads, cost_model="merge", time_limit=2.0, decision_cache=False)(*ARGS)  # opted out
    assert timed == [1, 1, 1]


def test_a_damaged_decision_is_timed_again_with_a_warning(timed: list[int], _private_decision_cache: Path) -> None:
    optimize(two_heads, cost_model="merge", time_limit=2.0)(*ARGS)
    (entry,) = _private_decision_cache.glob("*.json")
    entry.write_text("{truncated")
    with pytest.warns(EqsatCacheWarning, match="damaged"):
        optimize(two_heads, cost_model="merge", time_limit=2.0)(*ARGS)
    assert timed == [1, 1]
    json.loads(entry.read_text())  # rewritten whole
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatCacheWarning)
        optimize(two_heads, cost_model="merge", time_limit=2.0)(*ARGS)
    assert timed == [1, 1]


def test_a_persisted_discard_runs_the_original_without_timing(monkeypatch: pytest.MonkeyPatch,
                                                              timed: list[int]) -> None:
    monkeypatch.setattr(timing, "sequential_decision", lambda *a, **k: timed.append(1) or _decision("slower"))
    for _ in range(2):
        opt = optimize(two_heads, cost_model="merge", time_limit=2.0)
        np.testing.assert_allclose(opt(*ARGS), two_heads(*ARGS), rtol=2e-4, atol=1e-5)
        assert opt.report(*ARGS).used == "original"
    assert timed == [1]


_PROCESS = """
import json, jax, jax.numpy as jnp, numpy as np
from jax_backend.decorator import optimize
def two_heads(x, w1, w2):
    return jax.nn.relu(x @ w1), jax.nn.relu(x @ w2)
args = [jnp.asarray(np.random.default_rng(i).standard_normal(s), jnp.float32)
        for i, s in enumerate([(16, 32), (32, 32), (32, 32)])]
opt = optimize(two_heads, cost_model="merge", time_limit=2.0, timing_budget=2.0)
opt(*args)
d = opt.report(*args).decision
print(json.dumps([d.verdict, d.rounds, d.from_cache]))
"""


@pytest.mark.slow
def test_a_second_process_reuses_the_decision(tmp_path: Path) -> None:
    """Two processes, one cache folder: the second reads the first one's decision (~25 s)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "EQSAT_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _PROCESS], env=env, check=True, capture_output=True,
                                      text=True, timeout=300).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0][2] is False and runs[1] == [runs[0][0], runs[0][1], True]
    assert len(list((tmp_path / "decisions").glob("*.json"))) == 1

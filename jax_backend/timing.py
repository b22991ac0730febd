"""The one timing policy: paired, interleaved rounds with a bootstrap confidence interval.

Machine noise (other processes, frequency changes) drifts over seconds, so the functions are timed
in many short rounds, every function once per round in a rotating order (each runs first, last and
in between equally often), and each round gives one ratio optimized/original. The median of those
ratios is the estimate; a percentile bootstrap of the median gives the (95%) interval. A version
counts as faster only when the whole interval is below 1. A sample repeats a call until it lasts
`MIN_SAMPLE_S` (timer and dispatch noise average out), at most `MAX_CALLS_PER_SAMPLE` calls: the
decorator, `eqsat optimize`, the measured cost model and the benches all sample this way.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from eqsat.timer import sample_seconds

__all__ = ["MAX_CALLS_PER_SAMPLE", "MIN_SAMPLE_S", "Choice", "Decision", "PairedTiming", "bootstrap_median_ci",
           "calls_per_sample", "choose_faster", "interleaved_rounds", "medians_precise", "narrow_enough", "paired_timing",
           "rotation", "screen_timings",
           "sequential_decision", "FUTILE_AFTER"]

MIN_SAMPLE_S = 5e-3  # a sample shorter than this is mostly timer and dispatch noise: repeat calls
MAX_CALLS_PER_SAMPLE = 1000  # ...but a sample of a ~free call stays bounded (and the warm-up short)


@dataclass(frozen=True)
class PairedTiming:
    """Times of `base` and `other`, and the ratio other/base with a confidence interval."""

    base_s: float  # median seconds per call
    other_s: float
    ratio: float  # median over rounds of other/base (< 1: other is faster)
    ratio_low: float
    ratio_high: float
    rounds: int
    calls_per_sample: int
    confidence: float

    @property
    def speedup(self) -> float:
        """base / other: > 1 means `other` is faster."""
        return 1.0 / self.ratio

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return 1.0 / self.ratio_high, 1.0 / self.ratio_low

    @property
    def faster_with_confidence(self) -> bool:
        return self.ratio_high < 1.0

    @property
    def ci_width(self) -> float:
        """Width of the speedup interval (in speedup units)."""
        low, high = self.speedup_ci
        return high - low

    def to_json(self) -> dict[str, Any]:
        low, high = self.speedup_ci
        return {"speedup": self.speedup, "speedup_ci_low": low, "speedup_ci_high": high, "ci_width": high - low,
                "base_ms": self.base_s * 1e3, "other_ms": self.other_s * 1e3, "rounds": self.rounds,
                "calls_per_sample": self.calls_per_sample, "confidence": self.confidence}


def bootstrap_median_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of `values`."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, data.size, (resamples, data.size))], axis=1)
    alpha = (1.0 - confidence) / 2
    return float(np.quantile(medians, alpha)), float(np.quantile(medians, 1 - alpha))


def calls_per_sample(single_s: float, min_sample_s: float = MIN_SAMPLE_S) -> int:
    """Calls one sample makes so that it lasts about `min_sample_s`, given one call's seconds."""
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(min_sample_s / max(single_s, 1e-7))))


def _sample(thunk: Callable[[], Any], calls: int) -> float:
    return sample_seconds(thunk, calls, jax.block_until_ready)


def rotation(k: int, n: int) -> list[int]:
    """Round `k`'s order of `n` functions: rotated by k, reversed every other n rounds, so over
    2n rounds each function runs in each position equally often (with two: AB, BA, BA, AB)."""
    order = list(range(n))
    shift = k % n
    order = order[shift:] + order[:shift]
    return order[::-1] if (k // n) % 2 else order


def interleaved_rounds(thunks: Sequence[Callable[[], Any]], rounds: int, budget_s: float = math.inf,
                       min_rounds: int = 8, warmup: int = 2,
                       enough: Callable[[list[list[float]]], bool] | None = None) -> tuple[list[list[float]], int]:
    """THE timing loop: seconds per call of each thunk, one sample each per round in `rotation`
    order, and the calls per sample (from the fastest thunk's single call, after `warmup` calls of
    each). Stops after `rounds` rounds or when `budget_s` is spent (never before `min_rounds`), or
    when `enough(times)` says so (asked after `min_rounds` and then every ~25% more rounds: a
    sequential stop on what the rounds so far show, e.g. an interval narrow enough)."""
    for _ in range(warmup):  # (and compilation)
        for thunk in thunks:
            jax.block_until_ready(thunk())
    calls = calls_per_sample(min(_sample(thunk, 1) for thunk in thunks))
    times: list[list[float]] = [[] for _ in thunks]
    deadline = time.perf_counter() + budget_s
    next_look = min_rounds
    for k in range(rounds):
        for i in rotation(k, len(thunks)):
            times[i].append(_sample(thunks[i], calls))
        if k + 1 >= min_rounds and time.perf_counter() > deadline:
            break
        if enough is not None and k + 1 >= next_look:
            if enough(times):
                break
            next_look = max(k + 3, math.ceil((k + 1) * 1.25))
    return times, calls


def _summary(tb: Sequence[float], to: Sequence[float], calls: int, confidence: float) -> PairedTiming:
    ratios = [o / b for o, b in zip(to, tb)]
    low, high = bootstrap_median_ci(ratios, confidence)
    return PairedTiming(float(np.median(tb)), float(np.median(to)), float(np.median(ratios)), low, high,
                        len(ratios), calls, confidence)


def paired_timing(base: Callable[..., Any], other: Callable[..., Any], args: Sequence[Any], rounds: int = 40,
                  budget_s: float = 5.0, confidence: float = 0.95, min_rounds: int = 8,
                  ci_width: float | None = None) -> PairedTiming:
    """Time `base` and `other` (both already compiled or cheap to compile) on `args`.

    Stops after `rounds` rounds or when `budget_s` is spent (but never before `min_rounds`);
    `ci_width`: also once the speedup interval is at most this wide (a measurement, not a
    decision: the stop looks at the width only, never at which side of 1 the estimate lies).
    """
    return screen_timings(base, [other], args, rounds, budget_s, confidence, min_rounds, ci_width)[0]


def narrow_enough(ci_width: float, confidence: float = 0.95) -> Callable[[list[list[float]]], bool]:
    """A stop for `interleaved_rounds`: every later thunk's speedup interval against the first
    (paired by round) at most `ci_width` wide."""
    def enough(times: list[list[float]]) -> bool:
        for other in times[1:]:
            low, high = bootstrap_median_ci([o / b for o, b in zip(other, times[0])], confidence, resamples=1000,
                                            seed=len(other))
            if 1.0 / low - 1.0 / high > ci_width:
                return False
        return True
    return enough


def medians_precise(pairs: Sequence[tuple[int | None, int]], rel_width: float, after_s: float = 0.0,
                    confidence: float = 0.95) -> Callable[[list[list[float]]], bool]:
    """A stop for `interleaved_rounds` that measures rather than decides: for each (base, other) pair
    of thunk indices, the interval of the median of `other - base` per round (base None: of `other`'s
    times) is above 0 and at most `rel_width` of that median; never before `after_s` seconds from now
    (a probe's first rounds on a busy machine can agree by chance)."""
    after = time.perf_counter() + after_s

    def enough(times: list[list[float]]) -> bool:
        if time.perf_counter() < after:
            return False
        for base, other in pairs:
            values = times[other] if base is None else [o - b for o, b in zip(times[other], times[base])]
            low, high = bootstrap_median_ci(values, confidence, resamples=1000, seed=len(values))
            if low <= 0 or high - low > rel_width * float(np.median(values)):
                return False
        return True
    return enough


def screen_timings(base: Callable[..., Any], others: Sequence[Callable[..., Any]], args: Sequence[Any],
                   rounds: int = 40, budget_s: float = 5.0, confidence: float = 0.95,
                   min_rounds: int = 8, ci_width: float | None = None) -> list[PairedTiming]:
    """`paired_timing` of each of `others` against `base`, all in the same rounds: every round
    times `base` and each candidate once, in a rotating order, so all candidates see the same
    machine state and each ratio pairs a candidate with the `base` sample of its own round."""
    times, calls = interleaved_rounds([functools.partial(fn, *args) for fn in (base, *others)], rounds, budget_s,
                                      min_rounds, enough=None if ci_width is None else narrow_enough(ci_width, confidence))
    return [_summary(times[0], times[i], calls, confidence) for i in range(1, len(times))]


# --- the keep/discard decision: a sequential test -------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """Whether `other` beats `base` by more than `threshold` (a speedup, base/other), decided by
    `sequential_decision`: "faster" (keep), "slower" (discard) or "inconclusive" (the budget ended
    first; treat as discard). `from_cache`: read back from a persisted decision, not timed now."""

    verdict: str  # "faster" | "slower" | "inconclusive"
    speedup: float  # median over rounds of base/other
    speedup_low: float
    speedup_high: float
    threshold: float
    rounds: int
    base_s: float  # median seconds per call
    other_s: float
    confidence: float
    elapsed_s: float
    calls_per_sample: int
    from_cache: bool = False

    @property
    def keep(self) -> bool:
        return self.verdict == "faster"

    @property
    def speedup_ci(self) -> tuple[float, float]:
        return self.speedup_low, self.speedup_high

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "from_cache"}

    def as_paired(self) -> PairedTiming:
        """The decision's rounds as a `PairedTiming` (ratios other/base)."""
        return PairedTiming(self.base_s, self.other_s, 1.0 / self.speedup, 1.0 / self.speedup_high,
                            1.0 / self.speedup_low if self.speedup_low > 0 else math.inf, self.rounds,
                            self.calls_per_sample, self.confidence)

    @staticmethod
    def from_json(data: Any) -> Decision:
        """The decision `to_json` wrote (`from_cache` set); ValueError for anything else."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        names = [f.name for f in dataclasses.fields(Decision) if f.name != "from_cache"]
        if sorted(data) != sorted(names) or data["verdict"] not in ("faster", "slower", "inconclusive"):
            raise ValueError(f"expected the fields {', '.join(names)}")
        numbers = {k: data[k] for k in names if k != "verdict"}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in numbers.values()):
            raise ValueError("a field is not a finite number")
        return Decision(data["verdict"], **{k: float(v) for k, v in numbers.items() if k not in ("rounds", "calls_per_sample")},
                        rounds=int(data["rounds"]), calls_per_sample=int(data["calls_per_sample"]), from_cache=True)


FUTILE_AFTER = 0.25
"""The share of a sequential test's budget after which a pair not faster at its median stops."""


def sequential_decision(base: Callable[[], Any], other: Callable[[], Any], *, margin: float = 0.01,
                        budget_s: float = 8.0, confidence: float = 0.99, min_rounds: int = 8,
                        max_rounds: int = 5000, warmup: int = 2) -> Decision:
    """Time the thunks `base` and `other` in interleaved rounds (`rotation` order, samples sized as
    in `interleaved_rounds`) until the bootstrap interval of the median speedup base/other lies
    wholly above `1 + margin` ("faster") or wholly below it ("slower"), or `budget_s` of timing is
    spent ("inconclusive"). A fixed window either wastes time on a clear case or decides a close
    one on noise; looking again as rounds come in stops early on the first and keeps measuring the
    second. The interval is looked at after `min_rounds` and then every ~25% more rounds (a few
    dozen looks at most), each at `confidence` (99%: repeated looks would otherwise let noise
    cross the threshold by chance). Past `FUTILE_AFTER` of the budget, a pair whose median shows
    no speedup at all stops "inconclusive" (discarded, as the full budget would almost surely end):
    most of a cold first call's timing went to such pairs."""
    thunks = (base, other)
    for _ in range(warmup):  # (and compilation)
        for thunk in thunks:
            jax.block_until_ready(thunk())
    calls = calls_per_sample(min(_sample(thunk, 1) for thunk in thunks))
    start = time.perf_counter()
    times: tuple[list[float], list[float]] = ([], [])
    threshold = 1.0 + margin
    verdict, low, high = "inconclusive", 0.0, math.inf
    next_look = min_rounds
    for k in range(max_rounds):
        for i in rotation(k, 2):
            times[i].append(_sample(thunks[i], calls))
        n = k + 1
        out_of_time = time.perf_counter() - start > budget_s
        if n >= next_look or out_of_time or n == max_rounds:
            ratios = [o / b for o, b in zip(times[1], times[0])]  # other/base: < 1 is faster
            ratio_low, ratio_high = bootstrap_median_ci(ratios, confidence, resamples=1000, seed=n)
            low, high = 1.0 / ratio_high, 1.0 / ratio_low
            if n >= min_rounds and low > threshold:
                verdict = "faster"
                break
            if n >= min_rounds and high < threshold:
                verdict = "slower"
                break
            if out_of_time and n >= min_rounds:
                break
            if n >= min_rounds and time.perf_counter() - start > FUTILE_AFTER * budget_s and \
                    float(np.median(ratios)) >= 1.0:  # futile: not faster at all so far; the rest would discard too
                break
            next_look = max(n + 2, math.ceil(n * 1.25))
    ratio = float(np.median(np.asarray(times[1]) / np.asarray(times[0])))
    return Decision(verdict, 1.0 / ratio, low, high, threshold, len(times[0]), float(np.median(times[0])),
                    float(np.median(times[1])), confidence, time.perf_counter() - start, calls)


@dataclass(frozen=True)
class Choice:
    """The one keep/discard decision: which candidate went through the sequential test against the
    base (`best`, the fastest in the shared screen), that test's `decision`, and every candidate's
    screen (one candidate: the decision's own rounds)."""

    best: int  # index into the candidates
    decision: Decision  # `best` against the base: what the keep/discard rests on
    screens: tuple[PairedTiming, ...]

    @property
    def timing(self) -> Decision:
        """The decision's timing (speedup, interval, rounds, medians)."""
        return self.decision

    @property
    def kept(self) -> int | None:
        """The candidate to run instead of the base, or None: keep the base (not faster with confidence)."""
        return self.best if self.decision.keep else None


def choose_faster(base: Callable[..., Any], candidates: Sequence[Callable[..., Any]], args: Sequence[Any],
                  rounds: int = 40, budget_s: float = 8.0, min_rounds: int = 8, *, screen_budget_s: float | None = None,
                  margin: float = 0.01) -> Choice:
    """Decide between `base` and `candidates`: the decorator, `eqsat optimize`, `bench tensat` and
    `bench ceiling` all decide here. Several candidates are first screened together in the same
    interleaved rounds (`screen_budget_s`, by default half of `budget_s`); the fastest then goes
    through `sequential_decision` on fresh rounds with the rest of the budget, so picking the
    luckiest screen does not bias the interval the decision uses. A candidate is kept only when its
    interval lies wholly above `1 + margin` (`Choice.kept`)."""
    if not candidates:
        raise ValueError("choose_faster: no candidates")
    best, screens = 0, ()  # type: tuple[int, tuple[PairedTiming, ...]]
    confirm_s = budget_s
    if len(candidates) > 1:
        screen_s = budget_s / 2 if screen_budget_s is None else screen_budget_s
        screens = tuple(screen_timings(base, candidates, args, rounds, screen_s, min_rounds=max(min_rounds - 2, 5)))
        best = max(range(len(candidates)), key=lambda k: screens[k].speedup)
        confirm_s = max(budget_s - screen_s, 0.0) if screen_budget_s is None else budget_s
    decision = sequential_decision(functools.partial(base, *args), functools.partial(candidates[best], *args),
                                   margin=margin, budget_s=confirm_s, min_rounds=min_rounds)
    return Choice(best, decision, screens or (decision.as_paired(),))

"""`jax_backend.timing`, the one timing policy: rotation order, calls per sample from one constant."""

from __future__ import annotations

import time
from collections.abc import Callable

from jax_backend.timing import MAX_CALLS_PER_SAMPLE, MIN_SAMPLE_S, calls_per_sample, interleaved_rounds, rotation


def test_rotation_puts_every_function_in_every_position_equally_often() -> None:
    for n in (1, 2, 3, 4):
        orders = [rotation(k, n) for k in range(2 * n)]
        assert all(sorted(o) == list(range(n)) for o in orders)
        for position in range(n):
            counts = [sum(o[position] == i for o in orders) for i in range(n)]
            assert counts == [2] * n, (n, orders)
    assert [rotation(k, 2) for k in range(4)] == [[0, 1], [1, 0], [1, 0], [0, 1]]


def test_calls_per_sample_fill_the_minimum_sample_up_to_the_one_cap() -> None:
    assert calls_per_sample(1.0) == 1
    assert calls_per_sample(MIN_SAMPLE_S / 10) == 10
    assert calls_per_sample(1e-9) == MAX_CALLS_PER_SAMPLE
    assert calls_per_sample(1e-4, min_sample_s=1e-3) == 10


def test_interleaved_rounds_samples_each_thunk_once_per_round_in_rotation() -> None:
    calls: list[str] = []

    def thunk(name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            time.sleep(MIN_SAMPLE_S / 2)  # two calls a sample
        return run

    times, per_sample = interleaved_rounds([thunk("a"), thunk("b")], rounds=4, warmup=1)
    assert per_sample == 2
    assert [len(t) for t in times] == [4, 4] and all(s >= MIN_SAMPLE_S / 2 for t in times for s in t)
    # warm-up (a, b), one single call each to size the samples, then 4 rounds of 2-call samples
    assert calls[:4] == ["a", "b", "a", "b"]
    samples = ["".join(sorted(set(calls[i:i + 2]))) for i in range(4, len(calls), 2)]
    assert samples == ["a", "b", "b", "a", "b", "a", "a", "b"]  # rounds ab, ba, ba, ab


def test_a_width_stop_ends_the_rounds_once_the_interval_is_narrow() -> None:
    """`paired_timing(ci_width=)`: the rounds stop as soon as the speedup interval is that narrow,
    and run to the cap while it is not (the stop looks only at the width)."""
    from jax_backend.timing import narrow_enough, paired_timing

    def sleeper(seconds: float) -> Callable[[], None]:
        return lambda: time.sleep(seconds)

    same = narrow_enough(0.02)
    assert same([[1.0] * 10, [1.0] * 10]) and same([[1.0] * 10, [1.2] * 10])  # a constant ratio: width 0
    assert not same([[1.0] * 10, [0.5, 2.0] * 5])  # ratios all over: wide
    looks: list[int] = []
    times, _ = interleaved_rounds([sleeper(MIN_SAMPLE_S)] * 2, rounds=50, min_rounds=6, warmup=0,
                                  enough=lambda t: looks.append(len(t[0])) is None and len(t[0]) >= 7)
    assert len(times[0]) == 8 and looks == [6, 8]  # looked at 6 rounds, then again at 8 (>= 25% more)
    noisy = iter([1e-3, 8e-3] * 100)
    wide = paired_timing(lambda: time.sleep(next(noisy)), lambda: time.sleep(next(noisy)), [], rounds=12,
                         min_rounds=4, ci_width=1e-6)
    assert wide.rounds == 12  # never narrow enough: the cap ends it

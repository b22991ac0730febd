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

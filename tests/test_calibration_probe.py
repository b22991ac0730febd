"""The calibration's probe sizes: a device too quick to time at 1 MiB (a GPU) is measured on a
larger tensor instead of being reported as infinitely fast."""

from __future__ import annotations

from jax_backend.calibrate import PROBE_ELEMENTS, TIMEABLE_S, _timeable


def test_the_first_size_that_times_is_used() -> None:
    seen: list[int] = []

    def gpu_like(n: int) -> float:  # 4 TB/s, read and written: 1 MiB takes 0.5 us
        seen.append(n)
        return 8.0 * n / 4e12

    n, seconds = _timeable(gpu_like)
    assert seconds >= TIMEABLE_S and n == seen[-1] and seen == list(PROBE_ELEMENTS[: len(seen)]) and len(seen) > 1


def test_a_slow_device_keeps_the_model_sized_probe() -> None:
    n, seconds = _timeable(lambda n: 8.0 * n / 5e9)  # a CPU at 5 GB/s: 1 MiB takes 400 us
    assert n == PROBE_ELEMENTS[0] and seconds > TIMEABLE_S


def test_never_zero_seconds() -> None:
    n, seconds = _timeable(lambda n: 0.0)
    assert n == PROBE_ELEMENTS[-1] and seconds > 0

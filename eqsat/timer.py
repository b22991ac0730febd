"""The one wall-clock timer: seconds per call of a function, measured over back-to-back calls.

JAX-free: asynchronous work (a jitted JAX call) passes `wait`, applied to the last result before the
clock stops, so the calls pipeline as they would in a program and the sample ends when the work does.
Every timing in eqsat (the CPU calibration, measured op costs, paired and interleaved benchmarks)
takes its samples here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _no_wait(out: Any) -> Any:
    return out


def sample_seconds(call: Callable[[], T], calls: int = 1, wait: Callable[[T], Any] = _no_wait) -> float:
    """Seconds per call of `call()`, over `calls` calls in a row, `wait` applied to the last result."""
    start = time.perf_counter()
    out = call()
    for _ in range(calls - 1):
        out = call()
    wait(out)
    return (time.perf_counter() - start) / calls


def best_of(call: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` single-call samples (for a calibration, where noise only adds)."""
    return min(sample_seconds(call) for _ in range(max(repeats, 1)))


__all__ = ["sample_seconds", "best_of"]

"""One way to ask z3 a proof question: under a resource budget, not a wall-clock timeout.

z3's `rlimit` counts its internal work, so the same query on the same z3 version ends the same way on
a quiet or a loaded machine; a wall-clock timeout does not (a true rule once went unproved at load 8
on 2 cores), and a cached verdict taken at a loaded moment would keep a rule untrusted. Each query
also gets a wall-clock cap far above the time its budget takes, only so that a pathological query
still ends; an answer cut off by that cap depends on load, so it raises `WallClockCapped` and the
caller must not keep it (the verification cache does not store it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3


@dataclass(frozen=True)
class Budget:
    """z3's resource limit for one check (`rlimit`, counted from the check's start) and the
    wall-clock cap in milliseconds (a hang guard only: set well above what the rlimit takes)."""
    rlimit: int
    wall_ms: int


class WallClockCapped(Exception):
    """A z3 check hit its wall-clock cap before its rlimit: no verdict that may be cached."""


def check(solver: z3.Solver, budget: Budget) -> z3.CheckSatResult:
    """`solver.check()` within `budget`; raises `WallClockCapped` when the wall clock ended it
    (`unknown` from the rlimit, or for any other reason, is returned: it is reproducible)."""
    solver.set("rlimit", budget.rlimit)
    solver.set("timeout", budget.wall_ms)
    start = time.perf_counter()
    answer = solver.check()
    # (z3 may report a spent rlimit as "canceled" too: only the time taken tells the cap apart)
    if answer == z3.unknown and time.perf_counter() - start >= 0.9 * budget.wall_ms / 1000 \
            and solver.reason_unknown() != "max. resource limit exceeded":
        raise WallClockCapped(f"z3 hit its wall-clock cap of {budget.wall_ms} ms before its rlimit of "
                              f"{budget.rlimit}")
    return answer


__all__ = ["Budget", "WallClockCapped", "check"]

"""Argparse `type=` checks for numeric flags: a NaN, an infinity or a value out of range is refused
as the command line is read (one line, exit 2), not after minutes of work or never."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

__all__ = ["Number", "POSITIVE", "NON_NEGATIVE", "POSITIVE_INT", "NON_NEGATIVE_INT"]


@dataclass(frozen=True)
class Number:
    """A finite number >= `low` (> `low` when `strict`); whole numbers only when `integer`."""

    low: float = 0.0
    strict: bool = True
    integer: bool = False

    def __call__(self, text: str) -> float | int:
        kind = "a whole number" if self.integer else "a number"
        bound = f"{'>' if self.strict else '>='} {self.low:g}"
        try:
            value: float | int = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind} {bound}, not {text!r}") from None
        if not math.isfinite(value) or value < self.low or (self.strict and value == self.low):
            raise argparse.ArgumentTypeError(f"must be {kind} {bound}, not {text!r}")
        return value


POSITIVE = Number()
NON_NEGATIVE = Number(strict=False)
POSITIVE_INT = Number(integer=True)
NON_NEGATIVE_INT = Number(strict=False, integer=True)

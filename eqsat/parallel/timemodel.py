"""The time model of a collective and of a training step, in formulas a measurement can check.

A collective of `kind` over a mesh axis of n devices, S bytes per device (the buffer, as
`eqsat.parallel.cost` counts it), on a link of latency alpha (seconds per algorithm step) and
bandwidth beta (bytes/s per device per direction) takes

    seconds = steps(kind, n) * alpha + wire(kind, n, S) / beta  (+ sync, see below)

- bytes on the wire, what each device sends (the bandwidth-optimal ring / pairwise algorithms):
  all-reduce 2(n-1)/n S (a reduce-scatter then an all-gather), all-gather, reduce-scatter and
  all-to-all (n-1)/n S. A buffer size S is what a compiled program shows; the wire bytes are what
  the link carries, and the two differ by up to 2x.
- latency steps by algorithm: `ring` (n-1) per phase, so 2(n-1) for an all-reduce; `tree`
  (recursive doubling / halving, Bruck's all-to-all) ceil(log2 n) per phase; `once` a single alpha
  per collective whatever n (the nominal presets' convention, kept so their prices do not move).

A collective inside a program also makes every device wait for the slowest to reach it: `sync`,
seconds per collective beyond alpha-beta (0 unless measured; `eqsat parallel calibrate` measures
it per axis as a small all-reduce between compute pieces against the same pieces without it).

`fit_link` recovers alpha and beta of one axis from timed collectives (least squares, both >= 0);
`overlapped_step` lets a collective hide behind compute that neither feeds it nor waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from eqsat.errors import EqsatError

__all__ = ["LATENCY_ALGORITHMS", "WIRE_FACTORS", "DriftCurve", "FreshCurve", "LinkFit", "LinkSample", "TimeModelError",
           "collective_seconds", "fit_link", "latency_steps", "overlapped_step", "scheduled_waits", "wire_bytes",
           "wire_factor"]

LATENCY_ALGORITHMS = ("ring", "tree", "once")

# kind -> (multiple of (n-1)/n S each device sends, phases of the algorithm); a collective-permute
# sends its whole buffer to one peer, so it is counted over a pair (n = 2): 2 x (2-1)/2 S = S
WIRE_FACTORS: Mapping[str, tuple[float, int]] = MappingProxyType({
    "all-reduce": (2.0, 2), "all-gather": (1.0, 1), "reduce-scatter": (1.0, 1), "all-to-all": (1.0, 1),
    "collective-permute": (2.0, 1),
})


class TimeModelError(EqsatError):
    """A collective kind, latency algorithm or set of timings the time model cannot use."""


def _phases(kind: str) -> tuple[float, int]:
    try:
        return WIRE_FACTORS[kind]
    except KeyError:
        raise TimeModelError(f"unknown collective kind {kind!r}; known: {', '.join(WIRE_FACTORS)}") from None


def wire_factor(kind: str, n: int) -> float:
    """Bytes each device sends per byte of its buffer: 2(n-1)/n for an all-reduce, (n-1)/n otherwise."""
    factor, _ = _phases(kind)
    return 0.0 if n <= 1 else factor * (n - 1) / n


def wire_bytes(kind: str, n: int, size: float) -> float:
    """Bytes one device puts on the wire for a collective of buffer `size` over `n` devices."""
    return wire_factor(kind, n) * size


def latency_steps(kind: str, n: int, algorithm: str = "ring") -> float:
    """How many alphas a collective pays: ring (n-1) per phase, tree ceil(log2 n) per phase, once 1."""
    _, phases = _phases(kind)
    if n <= 1:
        return 0.0
    if algorithm == "ring":
        return float(phases * (n - 1))
    if algorithm == "tree":
        return float(phases * math.ceil(math.log2(n)))
    if algorithm == "once":
        return 1.0
    raise TimeModelError(f"unknown latency algorithm {algorithm!r}; known: {', '.join(LATENCY_ALGORITHMS)}")


def collective_seconds(kind: str, n: int, size: float, alpha: float, beta: float, algorithm: str = "ring",
                       sync: float = 0.0) -> float:
    """steps * alpha + wire bytes / beta, plus `sync` (what one collective costs inside a program
    beyond that: every device waits for the last to arrive); nothing for one device or an empty buffer."""
    if n <= 1 or size == 0:
        return 0.0
    return latency_steps(kind, n, algorithm) * alpha + wire_bytes(kind, n, size) / beta + sync


# --- fitting a link from timings ------------------------------------------------------------------

@dataclass(frozen=True)
class LinkSample:
    """One timed collective: its kind, the axis size, the buffer bytes per device and seconds."""

    kind: str
    n: int
    bytes: float
    seconds: float


@dataclass(frozen=True)
class LinkFit:
    """alpha (s per step) and beta (bytes/s) of one axis, and how well they explain the timings."""

    alpha: float
    beta: float
    rms_rel_error: float  # root mean square of (predicted - measured) / measured over the samples
    samples: int


def fit_link(samples: Sequence[LinkSample], algorithm: str = "ring") -> LinkFit:
    """Least squares of seconds = steps * alpha + wire / beta over `samples`, weighted by 1/seconds
    (relative error: a 4 KiB and a 4 MiB collective count alike), alpha and 1/beta kept >= 0 (a
    negative fit is refitted with that term dropped). Needs two samples of different wire bytes."""
    if len(samples) < 2:
        raise TimeModelError("fitting a link needs at least two timed collectives")
    if any(not (math.isfinite(s.seconds) and s.seconds > 0) for s in samples):
        raise TimeModelError("a timed collective has a non-positive or non-finite time")
    steps = np.array([latency_steps(s.kind, s.n, algorithm) for s in samples])
    wire = np.array([wire_bytes(s.kind, s.n, s.bytes) for s in samples])
    secs = np.array([s.seconds for s in samples])
    if np.ptp(wire) <= 0:
        raise TimeModelError("fitting a link needs collectives of at least two sizes")
    w = 1.0 / secs
    design = np.stack([steps, wire], axis=1)
    coef, *_ = np.linalg.lstsq(design * w[:, None], secs * w, rcond=None)
    alpha, inv_beta = float(coef[0]), float(coef[1])
    if inv_beta <= 0:  # no measurable bandwidth term: all latency
        alpha, inv_beta = float(np.sum(steps * secs * w * w) / np.sum((steps * w) ** 2)), 1e-15
    elif alpha < 0:  # no measurable latency: all bandwidth
        alpha, inv_beta = 0.0, float(np.sum(wire * secs * w * w) / np.sum((wire * w) ** 2))
    predicted = steps * alpha + wire * inv_beta
    rms = float(np.sqrt(np.mean(((predicted - secs) / secs) ** 2)))
    return LinkFit(alpha, 1.0 / inv_beta, rms, len(samples))


# --- overlap of collectives with independent compute ----------------------------------------------

def overlapped_step(compute_s: Sequence[float], comm_s: Sequence[float], inputs: Sequence[Sequence[int]]) -> float:
    """The step's seconds when a node's collectives may run while compute that is independent of
    the node (neither an ancestor nor a descendant of it in the plan) runs: each node's
    communication is hidden up to the independent compute, and the hidden total is at most the
    smaller of all compute and all communication (one link and one compute stream: the step takes
    at least the longer of the two). A weight's gradient sync hides behind the backward of the
    layers before it this way, as those are not related to the weight's `replicate`. Nodes in
    topological order, `inputs[i]` the nodes node i reads."""
    n = len(compute_s)
    ancestors = [0] * n
    for i in range(n):
        bits = 0
        for j in inputs[i]:
            bits |= ancestors[j] | (1 << j)
        ancestors[i] = bits
    descendants = [0] * n
    for i in range(n - 1, -1, -1):
        for j in inputs[i]:
            descendants[j] |= descendants[i] | (1 << i)
    compute = np.asarray(compute_s, dtype=np.float64)
    total_compute, total_comm = float(compute.sum()), float(sum(comm_s))
    hidden = 0.0
    for i in range(n):
        if comm_s[i] <= 0:
            continue
        related = ancestors[i] | descendants[i] | (1 << i)
        free = sum(float(compute[j]) for j in range(n) if not related >> j & 1)
        hidden += min(comm_s[i], free)
    hidden = min(hidden, total_compute, total_comm)
    return total_compute + total_comm - hidden


def _check_curve(xs: Sequence[float], ys: Sequence[float], message: str) -> None:
    """A measured curve: two or more points, `xs` positive and strictly ascending, `ys` not negative."""
    if (len(xs) < 2 or len(xs) != len(ys) or any(x <= 0 for x in xs) or any(b <= a for a, b in zip(xs, xs[1:]))
            or any(y < 0 for y in ys)):
        raise TimeModelError(message)


@dataclass(frozen=True)
class DriftCurve:
    """Seconds a collective inside a step waits, beyond its cost between the shortest compute
    pieces, after a piece of compute of a given length: the devices drift apart while they compute
    (eight emulated devices share a few cores and each gets its turn at a different time), and a
    collective waits for the last of them. Measured at a few piece lengths (`pieces`, ascending);
    between them interpolated on the log of the piece, below the first in proportion to the piece
    (none after no compute), above the last that one's wait."""

    pieces: tuple[float, ...]
    waits: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_curve(self.pieces, self.waits, "a drift curve needs two or more ascending positive pieces and waits >= 0")

    def wait(self, piece_s: float) -> float:
        if piece_s <= self.pieces[0]:
            return self.waits[0] * max(piece_s, 0.0) / self.pieces[0]
        return float(np.interp(math.log(piece_s), [math.log(p) for p in self.pieces], self.waits))


@dataclass(frozen=True)
class FreshCurve:
    """Seconds per byte a step pays for the buffers it allocates, by how many bytes it allocates per
    device (`totals`, ascending, each timed at its `rates`). On a host the rate is flat up to some
    size, jumps (above it the host maps a step's memory anew on every call and zero-fills each page
    on first touch), and is flat again above. So the points are split at their largest rise: each
    side is priced at its median and the cut lies halfway, on a log scale, between the two points
    around the rise. Interpolating instead would turn the probe's noise below the jump (a tenth of
    a ns a byte between calibrations) into a slope that orders a case's plans by their size. With
    no rise, one level: the median of all."""

    totals: tuple[float, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_curve(self.totals, self.rates, "a fresh-bytes curve needs two or more ascending positive totals and rates >= 0")

    @property
    def _split(self) -> int:
        """The index of the first point above the largest rise (0: no rise, one level)."""
        rises = [b - a for a, b in zip(self.rates, self.rates[1:])]
        top = max(range(len(rises)), key=lambda i: rises[i])
        return top + 1 if rises[top] > 0 else 0

    @property
    def cut(self) -> float:
        """Bytes per device from which a step pays the upper level (infinite with one level)."""
        k = self._split
        return math.sqrt(self.totals[k - 1] * self.totals[k]) if k else math.inf

    @property
    def below(self) -> float:
        """The rate of a step allocating less than `cut`: the level the ILP's node-local prices use."""
        k = self._split
        return float(np.median(self.rates[:k] if k else self.rates))

    def rate(self, allocated: float) -> float:
        k = self._split
        return float(np.median(self.rates[k:])) if k and allocated >= self.cut else self.below


def scheduled_waits(nodes: Sequence[tuple[float, float, Sequence[str]]], drift: DriftCurve) -> float:
    """What a step's collectives wait in all (`DriftCurve`): the forward runs the nodes in order and
    the backward in reverse, and each collective waits for the compute since the collective before
    it. `nodes`: in topological order, (forward seconds, backward seconds, the phases of the node's
    collectives: `forward`, or `backward` / `grad-sync`, which run in the backward)."""
    total = since = 0.0
    for forward_s, _, phases in nodes:
        since += forward_s
        for _ in (p for p in phases if p == "forward"):
            total += drift.wait(since)
            since = 0.0
    for _, backward_s, phases in reversed(nodes):
        since += backward_s
        for _ in (p for p in phases if p != "forward"):
            total += drift.wait(since)
            since = 0.0
    return total

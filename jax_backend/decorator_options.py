"""What `@eqsat.optimize` is asked (`Options`, checked at decoration) and what it answers per
signature (`SignatureReport`), and the device its cost models predict for (`cost_device`).

Kept apart from the wrapper (`jax_backend/decorator.py`) and the per-signature work
(`jax_backend/decorator_checks.py`) so both read one definition of each.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from eqsat import candidates
from eqsat.candidates import RuleSource, SegmentReport
from eqsat.errors import EqsatError
from jax_backend.timing import Decision

__all__ = ["Options", "SignatureReport", "EqsatFallbackWarning", "EqsatDeviceWarning", "EqsatRecompileWarning",
           "RECOMPILE_STORM", "make_options", "cost_device", "cost_device_for"]

RECOMPILE_STORM = 8
"""Distinct signatures one wrapper may optimize before it warns (once) of a recompile storm:
torch.compile's default recompile limit, the point past which a shape that changes every call
(a sequence length, a batch remainder) is the likelier cause than a handful of real variants."""


class EqsatFallbackWarning(UserWarning):
    """The optimized version was not used; the original function runs instead."""


class EqsatDeviceWarning(UserWarning):
    """The JAX device has no cost-model device of its own; costs are predicted for a stand-in."""


class EqsatRecompileWarning(UserWarning):
    """More than `RECOMPILE_STORM` input signatures: each new one costs a full optimization."""


@dataclass(frozen=True)
class SignatureReport:
    """What happened for one input signature."""

    signature: str
    used: str  # "optimized" | "original"
    reason: str
    segments: tuple[SegmentReport, ...] = ()
    opaque: tuple[str, ...] = ()
    numerics_ok: bool | None = None
    max_rel_err: float | None = None
    time_original_s: float | None = None
    time_optimized_s: float | None = None
    optimize_s: float = 0.0
    lowering: str = "xla"
    speedup_ci: tuple[float, float] | None = None  # bootstrap interval of original/optimized time
    distinct_regions: int = 0  # regions optimized; the rest reused a structurally identical result
    reused_regions: int = 0
    opaque_why: tuple[str, ...] = ()  # "primitive: why it was not captured", one per distinct pair
    cost_device: str = ""  # the cost-model device the candidates were extracted for (`cost_device`)
    decision: Decision | None = None  # the sequential keep/discard test: interval, rounds, from the cache or not
    leaf_names: tuple[tuple[str, str], ...] = ()  # (IR leaf name "v3", the user's name "params['w']"), for reading
    searched_regions: int = 0  # regions the e-graph searched for this signature
    shape_reused_regions: int = 0  # regions whose search result came from another input shape (not searched)


@dataclass(frozen=True)
class Options:
    """The decorator's options, validated (`make_options`)."""

    rules: RuleSource = None
    extractor: str = "ilp"
    cost_model: str = "roofline"
    time_limit: float = 5.0
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    donate_argnames: tuple[str, ...] = ()
    rtol: float = 2e-4
    atol: float = 1e-5
    check_speed: bool = True
    timing_rounds: int = 40  # rounds of the screen that picks the fastest of several candidates
    timing_budget_s: float = 8.0  # the longest the sequential keep/discard test times (it stops when decided)
    screen_budget_s: float = 1.5
    reuse_timing_budget_s: float = 0.0  # re-timing of a kept plan at a new input shape (0: the plan's decision holds)
    speed_margin: float = 0.01  # kept only when faster than the original by more than this, with confidence
    decision_cache: bool = True  # persist decisions per (program, signature, device); reuse them
    lowering: str = "auto"  # "auto" | "xla" | "pallas"
    iterations: int = 8
    max_enodes: int = 20_000
    candidate_models: tuple[str, ...] = ("roofline", "measured", "merge")  # extract under each, time the distinct
    max_signatures: int = 32  # per-signature results kept (least recently used dropped; seen again: re-optimized)


def make_options(rules: object = None, extractor: str = "ilp", cost_model: str | Sequence[str] | None = None,
                 time_limit: float = 5.0, static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (), rtol: float = 2e-4, check_speed: bool = True,
                 lowering: str = "auto", max_signatures: int = 32, donate_argnums: int | Sequence[int] = (),
                 donate_argnames: str | Sequence[str] = (), timing_budget: float = 8.0,
                 decision_cache: bool = True) -> Options:
    """`optimize`'s keyword arguments as `Options`; a typo (an unknown lowering, extractor, cost
    model or rule file) fails here, at decoration, with the choices."""
    if lowering not in ("auto", "xla", "pallas"):
        raise EqsatError(f"optimize: lowering must be 'auto', 'xla' or 'pallas', got {lowering!r}")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise EqsatError(f"optimize: time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    if not (isinstance(rtol, (int, float)) and math.isfinite(rtol) and rtol >= 0):
        raise EqsatError(f"optimize: rtol must be a finite number >= 0, got {rtol!r}")
    if not (isinstance(timing_budget, (int, float)) and math.isfinite(timing_budget) and timing_budget > 0):
        raise EqsatError(f"optimize: timing_budget must be a finite number of seconds > 0, got {timing_budget!r}")
    if isinstance(max_signatures, bool) or not (isinstance(max_signatures, int) and max_signatures >= 1):
        raise EqsatError(f"optimize: max_signatures must be a whole number >= 1, got {max_signatures!r}")
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    donate_nums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    donate_names = (donate_argnames,) if isinstance(donate_argnames, str) else tuple(donate_argnames)
    models = Options.candidate_models if cost_model is None else \
        ((cost_model,) if isinstance(cost_model, str) else tuple(cost_model))
    if not models:
        raise EqsatError("optimize: cost_model must name at least one cost model")
    candidates.check_names(extractor, models)
    return Options(candidates.rule_source(rules), extractor, models[0], float(time_limit), nums, names, rtol=rtol,
                   check_speed=check_speed, lowering=lowering, candidate_models=models, max_signatures=max_signatures,
                   donate_argnums=donate_nums, donate_argnames=donate_names, timing_budget_s=float(timing_budget),
                   decision_cache=bool(decision_cache))


def cost_device_for(platform: str, device_kind: str) -> tuple[str, str]:
    """The cost-model device (a name of `eqsat.cost`'s registry) for a JAX device's platform and
    kind ("gpu", "NVIDIA H100 80GB HBM3" → "h100"), and a warning when there is none of its own:
    another GPU or accelerator is predicted as an H100 (the closest numbers the registry has)."""
    from eqsat.cost import DEVICES

    if platform == "cpu":
        return "cpu", ""
    kind = device_kind.lower().replace(" ", "")
    for name in sorted(DEVICES, key=len, reverse=True):
        if name in kind:
            return name, ""
    known = ", ".join(sorted([*DEVICES, "cpu"]))
    return "h100", (f"eqsat.optimize: no cost-model device for {platform} device {device_kind!r} (known: {known}); "
                    "candidates are extracted with H100 numbers ('h100'), then timed on this device as always")


def cost_device() -> tuple[str, str]:
    """`cost_device_for` the first JAX device (the one the decorator's checks and timings run on)."""
    dev = jax.devices()[0]
    return cost_device_for(dev.platform, str(getattr(dev, "device_kind", dev.platform)))


# --- what building one signature ends in ---------------------------------------------------------------

@dataclass
class Entry:
    """One signature's cached result (mutable: a version that fails to trace is switched off)."""

    fn: Callable[..., Any] | None  # flat optimized function, None: run the original
    out_tree: Any
    report: SignatureReport
    warning: str = ""  # why the original runs, for the caller to warn about (empty: no warning)
    pending: Callable[[Callable[..., Sequence[Any]]], str | None] | None = None
    """A check the wrapper runs once its program for this signature is compiled (given that program,
    flat in and out): None if equal, else why not (`build_signature(defer_check=True)`)."""


@dataclass(frozen=True)
class Outcome:
    """What every report of one signature shares; builds the entry for each way it can end."""

    signature: str
    out_tree: Any
    start: float
    mode: str
    facts: Mapping[str, Any] = field(default_factory=dict)  # SignatureReport fields known so far

    def with_facts(self, **facts: Any) -> Outcome:
        return dataclasses.replace(self, facts={**self.facts, **facts})

    def _report(self, used: str, reason: str, segments: Sequence[SegmentReport], fields: Mapping[str, Any]
                ) -> SignatureReport:
        return SignatureReport(self.signature, used, reason, tuple(segments),
                               optimize_s=time.perf_counter() - self.start, lowering=self.mode,
                               **{**self.facts, **fields})

    def original(self, reason: str, segments: Sequence[SegmentReport] = (), warn: bool = True, **fields: Any) -> Entry:
        """The original runs (`warn`: tell the user, once, why)."""
        return Entry(None, self.out_tree, self._report("original", reason, segments, fields),
                     f"eqsat.optimize: running the original function: {reason}" if warn else "")

    def optimized(self, fn: Callable[..., Any], reason: str, segments: Sequence[SegmentReport],
                  **fields: Any) -> Entry:
        return Entry(fn, self.out_tree, self._report("optimized", reason, segments, fields))

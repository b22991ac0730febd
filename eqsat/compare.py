"""The one output check: whether computed outputs agree with reference outputs.

Used by `eqsat optimize` (numpy float64 reference against JAX float32), the `@eqsat.optimize`
decorator (candidate against the original, both JAX), the parallel plan checks and every bench, so
"checked equal" means one thing everywhere. numpy only (anything `np.asarray` takes: JAX arrays
convert). The policy, per output pair:

- **count and shape**: the same number of outputs, and each pair of exactly the same shape, checked
  before any arithmetic (a (3,) output never broadcasts against a (3, 1) one).
- **dtype**: not compared unless `same_dtype` (the decorator: a replacement must return what the
  original returns). Where the reference is bool or integer, the values must be equal exactly.
  Otherwise both are promoted to float64 (complex128 where either is complex); bfloat16 and the
  other `ml_dtypes` floats promote like float16.
- **non-finite values**: NaN matches only NaN at the same position, +inf only +inf and -inf only
  -inf; a NaN never matches a number.
- **low precision**: a bfloat16 / float16 reference raises rtol to `LOW_PRECISION_ULPS` of its epsilon.
- **finite values**: relative to the output's magnitude m (its largest finite |reference|), not
  element by element: the output agrees when max |got - reference| over the finite elements is
  within max(rtol * m, atol, allowed_abs[i]). So outputs around 200 computed in float32 pass while
  an O(1) relative change, even in one element, does not; `atol` is the floor for outputs near zero
  and `allowed_abs` a per-output allowance (e.g. a few times the original's own float32 error
  where it is ill-conditioned).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Agreement", "outputs_agree"]


@dataclass(frozen=True)
class Agreement:
    """The verdict of `outputs_agree`, with the figures a report needs."""

    ok: bool
    max_abs_diff: float  # largest |got - reference| over all finite elements (inf: not comparable)
    max_rel_err: float  # largest |got - reference| / magnitude of that output
    reason: str = ""  # why not ok, in words (the first output that fails)
    abs_diffs: tuple[float, ...] = ()  # max |got - reference| per output (inf where not comparable)

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class _Output:
    """One output pair's figures; `problem` is empty when it agrees."""

    abs_diff: float
    rel_err: float
    problem: str = ""


_FAIL = math.inf


LOW_PRECISION_ULPS = 4
"""Where the reference is a float narrower than float32 (bfloat16, float16), a candidate computed
by rules that hold over the reals differs from it by rounding alone at about the dtype's epsilon
per operation; `rtol` is raised to `LOW_PRECISION_ULPS` epsilons of that dtype (bfloat16: 3.1e-2,
float16: 3.9e-3), relative to the output's magnitude (the rule policy: `eqsat.rulesets`)."""


def _rounding_rtol(dtype: np.dtype[Any]) -> float:
    if dtype.kind not in "fV" or dtype.itemsize >= 4:
        return 0.0
    try:
        import ml_dtypes

        return LOW_PRECISION_ULPS * float(ml_dtypes.finfo(dtype).eps)
    except (ImportError, ValueError, TypeError):
        return 0.0


def _exact(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "biu"


def _compare_one(i: int, reference: Any, got: Any, rtol: float, atol: float, allowed_abs: float,
                 same_dtype: bool) -> _Output:
    r, g = np.asarray(reference), np.asarray(got)
    if r.shape != g.shape:
        return _Output(_FAIL, _FAIL, f"output {i} has shape {g.shape}, expected {r.shape}")
    if same_dtype and r.dtype != g.dtype:
        return _Output(_FAIL, _FAIL, f"output {i} has dtype {g.dtype}, expected {r.dtype}")
    if _exact(r.dtype):
        if _exact(g.dtype) or g.dtype.kind in "fc":
            equal = bool(np.array_equal(r, g))
        else:  # e.g. bfloat16: no direct comparison with integers in numpy
            equal = bool(np.array_equal(r.astype(np.float64), g.astype(np.float64)))
        return _Output(0.0, 0.0) if equal else _Output(_FAIL, _FAIL, f"output {i} differs from its exact "
                                                                     f"({r.dtype}) reference")
    wide = np.complex128 if "c" in (r.dtype.kind, g.dtype.kind) else np.float64
    try:
        r64, g64 = r.astype(wide), g.astype(wide)
    except (TypeError, ValueError):
        return _Output(_FAIL, _FAIL, f"output {i}: cannot compare dtypes {g.dtype} and {r.dtype}")
    finite = np.isfinite(r64)
    if not np.array_equal(finite, np.isfinite(g64)) or not np.array_equal(r64[~finite], g64[~finite], equal_nan=True):
        return _Output(_FAIL, _FAIL, f"output {i} is not finite where the reference is (or vice versa)")
    if not finite.any():
        return _Output(0.0, 0.0)
    magnitude = float(np.max(np.abs(r64[finite])))
    diff = float(np.max(np.abs(r64[finite] - g64[finite])))
    rel = diff / magnitude if magnitude > 0 else (0.0 if diff == 0 else math.inf)
    allowed = max(max(rtol, _rounding_rtol(r.dtype)) * magnitude, atol, allowed_abs)
    if not diff <= allowed:
        return _Output(diff, rel, f"output {i} differs by {diff:.3g} (magnitude {magnitude:.3g}; allowed {allowed:.3g})")
    return _Output(diff, rel)


def outputs_agree(reference: Sequence[Any], got: Sequence[Any], rtol: float, atol: float = 0.0,
                  allowed_abs: Sequence[float] = (), same_dtype: bool = False) -> Agreement:
    """THE output comparison (policy in the module docstring): whether `got` computes `reference`
    (best computed in float64). Every output is measured; `reason` names the first that fails."""
    if len(reference) != len(got):
        return Agreement(False, math.inf, math.inf, f"{len(got)} outputs, expected {len(reference)}")
    results = [_compare_one(i, r, g, rtol, atol, allowed_abs[i] if i < len(allowed_abs) else 0.0, same_dtype)
               for i, (r, g) in enumerate(zip(reference, got))]
    problems = [o.problem for o in results if o.problem]
    return Agreement(not problems, max((o.abs_diff for o in results), default=0.0),
                     max((o.rel_err for o in results), default=0.0), problems[0] if problems else "",
                     tuple(o.abs_diff for o in results))

"""`eqsat.compare.outputs_agree`, the one output check: its NaN / inf, shape, dtype and tolerance policy."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eqsat.compare import Agreement, outputs_agree


def _agree(ref: Any, got: Any, rtol: float = 1e-4, **kw: Any) -> Agreement:
    return outputs_agree([ref], [got], rtol, **kw)


def test_nan_matches_nan_only_at_the_same_positions() -> None:
    ref = np.array([1.0, np.nan, 3.0])
    assert _agree(ref, ref.copy()).ok
    moved = _agree(ref, np.array([np.nan, 2.0, 3.0]))
    assert not moved.ok and "not finite" in moved.reason
    assert not _agree(ref, np.array([1.0, 2.0, 3.0])).ok  # a number never matches a NaN
    assert not _agree(np.array([1.0, 2.0]), np.array([1.0, np.nan])).ok


def test_infinities_must_match_in_sign_and_position() -> None:
    ref = np.array([1.0, np.inf, -np.inf])
    assert _agree(ref, ref.copy()).ok
    assert not _agree(ref, np.array([1.0, -np.inf, -np.inf])).ok
    assert not _agree(ref, np.array([1.0, np.inf, np.nan])).ok
    assert not _agree(ref, np.array([1.0, np.inf, -1e300])).ok


def test_shapes_must_match_exactly_without_broadcasting() -> None:
    ref = np.array([1.0, 2.0, 3.0])
    column = ref.reshape(3, 1)  # ref - column broadcasts to (3, 3); the check must not get that far
    verdict = _agree(ref, column)
    assert not verdict.ok and "shape (3, 1), expected (3,)" in verdict.reason
    assert verdict.max_abs_diff == math.inf
    assert not _agree(np.ones((2, 3)), np.ones((3, 2))).ok
    assert not _agree(np.float64(1.0), np.ones((1,))).ok  # a scalar is not a one-element vector


def test_output_count_must_match() -> None:
    a = np.ones(3)
    assert not outputs_agree([a], [a, a], 1e-4).ok
    assert outputs_agree([], [], 1e-4).ok


def test_integers_and_bools_are_compared_exactly() -> None:
    big = np.array([2 ** 60, 3], np.int64)  # float64 cannot tell 2**60 from 2**60 + 1
    assert _agree(big, big.copy(), rtol=1.0).ok
    assert not _agree(big, big + np.array([1, 0]), rtol=1.0).ok
    assert not _agree(np.array([True, False]), np.array([True, True]), rtol=1.0).ok
    assert _agree(np.array([True, False]), np.array([True, False])).ok
    assert not _agree(np.arange(4), np.arange(4) + 0.5, rtol=1.0).ok  # an integer reference: exact values
    assert _agree(np.arange(4), np.arange(4).astype(np.float32)).ok


def test_bfloat16_outputs_are_compared_as_floats() -> None:
    ref = np.linspace(-3, 3, 7) + 0.1  # not representable in bfloat16
    got = np.asarray(jnp.asarray(ref, jnp.bfloat16))  # 8 mantissa bits: ~4e-3 relative error
    assert not _agree(ref, got, rtol=1e-4).ok
    verdict = _agree(ref, got, rtol=1e-2)
    assert verdict.ok and 0 < verdict.max_rel_err < 1e-2
    nan16 = np.asarray(jnp.asarray([1.0, jnp.nan], jnp.bfloat16))
    assert _agree(nan16, nan16.copy()).ok
    assert not _agree(nan16, np.asarray(jnp.asarray([1.0, 2.0], jnp.bfloat16))).ok
    assert _agree(jnp.arange(3, dtype=jnp.int32), jnp.arange(3, dtype=jnp.bfloat16)).ok  # jax arrays convert


def test_dtypes_are_compared_only_when_asked() -> None:
    ref = np.ones(3, np.float32)
    assert _agree(ref, ref.astype(np.float64)).ok
    verdict = _agree(ref, ref.astype(np.float64), same_dtype=True)
    assert not verdict.ok and "dtype" in verdict.reason


def test_error_is_relative_to_the_output_magnitude() -> None:
    ref = np.array([200.0, 1e-3])
    # 1e-2 off on the small element is 5e-5 of the output's magnitude 200: within rtol 1e-4
    assert _agree(ref, ref + np.array([0.0, 1e-2])).ok
    assert not _agree(ref, ref + np.array([0.0, 3e-2])).ok  # 1.5e-4 of the magnitude
    verdict = _agree(ref, ref + np.array([0.0, 1e-2]))
    assert verdict.max_abs_diff == pytest.approx(1e-2) and verdict.max_rel_err == pytest.approx(5e-5)


def test_atol_is_the_floor_near_zero_and_allowed_abs_is_per_output() -> None:
    zero = np.zeros(3)
    assert not _agree(zero, zero + 1e-9).ok  # rtol times magnitude 0: only exact zeros pass
    assert _agree(zero, zero + 1e-9, atol=1e-8).ok
    ref = [np.ones(2), np.ones(2)]
    got = [np.ones(2) + 1e-3, np.ones(2) + 1e-3]
    assert not outputs_agree(ref, got, 1e-4).ok
    assert not outputs_agree(ref, got, 1e-4, allowed_abs=[2e-3]).ok  # output 1 has no allowance
    assert outputs_agree(ref, got, 1e-4, allowed_abs=[2e-3, 2e-3]).ok


def test_every_output_is_measured_and_the_first_failure_named() -> None:
    ref = [np.ones(2), np.ones(2), np.ones(3)]
    verdict = outputs_agree(ref, [np.ones(2) + 1.0, np.ones(2) + 0.5, np.ones(2)], 1e-4)
    assert not verdict.ok and verdict.reason.startswith("output 0 differs")
    assert verdict.abs_diffs == (pytest.approx(1.0), pytest.approx(0.5), math.inf)


_floats = hnp.arrays(np.float64, hnp.array_shapes(max_dims=3, max_side=5),
                     elements=st.floats(-1e6, 1e6) | st.sampled_from([math.nan, math.inf, -math.inf]))


@settings(max_examples=200, deadline=None)
@given(_floats)
def test_an_array_agrees_with_itself(ref: np.ndarray) -> None:
    assert _agree(ref, ref.copy(), rtol=0.0).ok


@settings(max_examples=200, deadline=None)
@given(_floats, st.data())
def test_one_changed_element_is_caught_exactly_when_past_the_tolerance(ref: np.ndarray, data: st.DataObject) -> None:
    rtol = 1e-3
    finite = np.isfinite(ref)
    if not finite.any():
        return
    index = data.draw(st.sampled_from([tuple(i) for i in np.argwhere(finite)]))
    magnitude = float(np.max(np.abs(ref[finite])))
    factor = data.draw(st.sampled_from([0.0, 0.5, 2.0, 10.0]))
    delta = factor * max(rtol * magnitude, 1.0)
    got = ref.copy()
    got[index] += delta
    diff = abs(float(got[index]) - float(ref[index]))  # after float64 rounding
    verdict = _agree(ref, got, rtol=rtol, atol=1.0)
    assert verdict.ok == (diff <= max(rtol * magnitude, 1.0))
    assert verdict.max_abs_diff == pytest.approx(diff)


@settings(max_examples=100, deadline=None)
@given(_floats, st.data())
def test_a_nan_or_inf_put_anywhere_else_is_caught(ref: np.ndarray, data: st.DataObject) -> None:
    finite = np.isfinite(ref)
    if not finite.any():
        return
    index = data.draw(st.sampled_from([tuple(i) for i in np.argwhere(finite)]))
    got = ref.copy()
    got[index] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    assert not _agree(ref, got, rtol=1.0, atol=math.inf).ok

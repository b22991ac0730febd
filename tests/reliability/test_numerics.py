"""The output comparison: scale-aware (no false alarm on large float32 outputs), still sound, and
a failed check never ends in a result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eqsat import cli
from eqsat.commands import optimize
from eqsat.compare import outputs_agree
from jax_backend.checks import Judgement, PlanCheck


def _float32_noise(reference: np.ndarray, seed: int = 0) -> np.ndarray:
    """What a float32 computation of `reference` plausibly returns: relative noise of a few eps
    of the output's magnitude (cancellation makes small elements relatively worse)."""
    rng = np.random.default_rng(seed)
    return (reference + rng.standard_normal(reference.shape) * 3e-7 * np.max(np.abs(reference))).astype(np.float32)


def test_large_outputs_in_float32_agree() -> None:
    # bts: outputs around 200, float32 error ~3e-4 per element; a per-element rtol=1e-4 with
    # atol=1e-5 failed on the elements near zero.
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 64)) * 200
    ref[0, 0] = 1e-3
    got = _float32_noise(ref)
    assert not np.allclose(ref, got, rtol=1e-4, atol=1e-5)  # the old check: a false alarm
    verdict = outputs_agree([ref], [got], rtol=1e-4, atol=1e-5)
    assert verdict.ok, verdict.reason
    assert verdict.max_rel_err < 1e-5


@pytest.mark.parametrize("scale", [1e-6, 1.0, 200.0, 1e8])
def test_a_wrong_element_is_caught_at_any_scale(scale: float) -> None:
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((32, 32)) * scale
    wrong = ref.copy()
    wrong[3, 5] += 0.01 * np.max(np.abs(ref))  # 1% of the output's magnitude, one element
    assert not outputs_agree([ref], [wrong], rtol=1e-4).ok
    assert outputs_agree([ref], [_float32_noise(ref)], rtol=1e-4).ok


def test_nan_shape_and_count_mismatches_fail() -> None:
    ref = np.ones((2, 3))
    assert not outputs_agree([ref], [np.full((2, 3), np.nan)], rtol=1e-4).ok
    assert not outputs_agree([ref], [np.ones((3, 2))], rtol=1e-4).ok
    assert not outputs_agree([ref], [ref, ref], rtol=1e-4).ok
    inf_ref = np.array([1.0, np.inf])
    assert outputs_agree([inf_ref], [inf_ref.copy()], rtol=1e-4).ok
    assert not outputs_agree([inf_ref], [np.array([1.0, -np.inf])], rtol=1e-4).ok


def test_ill_conditioned_original_widens_the_tolerance_by_its_own_error_only() -> None:
    ref = np.array([1.0, 2.0])
    got = np.array([1.0 + 1e-3, 2.0])
    assert not outputs_agree([ref], [got], rtol=1e-4).ok
    assert outputs_agree([ref], [got], rtol=1e-4, allowed_abs=[4e-3]).ok


def test_failed_jax_check_exits_2_without_a_result(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def disagree(*args: object, **kwargs: object) -> Judgement:
        check = PlanCheck("ilp/roofline", False, 1.0, "output 0 differs by 1 (magnitude 2; allowed 0.0002)")
        return Judgement((check,), None, None, "original", 1e-3, 0.0)

    monkeypatch.setattr(optimize, "judge_plans", disagree)
    code = cli.main(["optimize", "nasrnn-small", "--json", "--repeats", "5", "--iterations", "2",
                     "--time-limit", "5", "--device", "cpu-nominal", "--candidates"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith("eqsat optimize: error:") and "differs" in last
    assert "Traceback" not in err

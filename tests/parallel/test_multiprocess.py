"""The GPT block's plan as 2 processes x 4 CPU devices (jax.distributed on 127.0.0.1, gloo) equals
the single-device program."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8", "2x4"])
def test_gpt_block_plan_on_two_processes(mesh: str) -> None:
    from experiments.parallel_multiprocess import run

    result = run("gpt-block", mesh, timeout=300.0)
    assert result["numerics_ok"], result

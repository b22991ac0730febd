"""The GPT block's plan as 2 processes x 4 CPU devices (jax.distributed on 127.0.0.1, gloo) equals
the single-device program; a user program's whole training step (loss, grad, Adam) on 2 processes
equals one process's."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8", "2x4"])
def test_gpt_block_plan_on_two_processes(mesh: str) -> None:
    from experiments.parallel_multiprocess import run

    result = run("gpt-block", mesh, timeout=300.0)
    assert result["numerics_ok"], result


@pytest.mark.slow
def test_training_step_on_two_processes_equals_one_process() -> None:
    """3 Adam steps of the MLP classifier through the plan's shardings on 2 x 4 devices: the losses
    equal the single-device run's and the one-process planned run's (rtol 1e-4), the parameters
    within 2 lr steps of both, and the plan splits something (else the test would prove little)."""
    from experiments.parallel_multiprocess import run

    row = run("mlp", "2x4", timeout=600.0)
    assert row["same_as_one_process"], row
    assert row["strategy"] == "eqsat" and any(spec != "P()" for spec in row["leaf_specs"].values())
    assert row["loss_rel_diff_vs_single"] <= 1e-4 and len(row["losses"]) == 3

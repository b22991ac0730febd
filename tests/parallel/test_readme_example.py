"""The README's "Parallelize your training step" example runs as written and its loss goes down."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    section = README.read_text(encoding="utf-8").split("## Parallelize your training step", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the section has no python example"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_parallel_example_runs_and_trains() -> None:
    import jax

    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    scope: dict[str, Any] = {}
    exec(compile(_example(), str(README), "exec"), scope)  # the README's own code
    losses = [float(scope["loss"])]  # after the example's three steps; three more must keep lowering it
    for _ in range(3):
        scope["params"], scope["opt_state"], loss = scope["step"](scope["params"], scope["opt_state"], scope["batch"])
        losses.append(float(loss))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert scope["plan"].in_shardings is not None

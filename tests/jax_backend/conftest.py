"""Every test here sees an empty, private decision cache: a keep/discard decision persisted by an
earlier run (or another test) must not decide for this one."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_decision_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import jax_backend.decisions as decisions

    root = tmp_path / "decisions"
    monkeypatch.setattr(decisions, "decisions_dir", lambda: root)
    return root

"""Every test here gets its own verification cache, so no test reads results another run wrote."""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_verification_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("eqsat-cache")
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(root))
    return root

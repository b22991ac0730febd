"""The tests about the verification cache itself get a private cache directory per test.

Every other test shares the session's fresh directory (`tests/conftest.py`): most of them verify
the same library, and checking it once per session instead of once per test saves minutes.
"""

from pathlib import Path

import pytest

PRIVATE_CACHE_MODULES = {"test_verify_cache", "test_guarded"}


@pytest.fixture(autouse=True)
def _private_cache_for_cache_tests(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                                   _session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if request.module.__name__.rsplit(".", 1)[-1] not in PRIVATE_CACHE_MODULES:
        return _session_cache
    root = tmp_path_factory.mktemp("eqsat-cache")
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(root))
    return root

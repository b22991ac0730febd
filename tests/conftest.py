"""One fresh cache directory per test session.

No test reads verification results, calibrations or measured costs that an earlier run or the
user's own work left in `~/.cache`; within the session the tests share the directory, as one user's
runs would. Tests about the cache itself point `EQSAT_CACHE_DIR` elsewhere (see
`tests/rewrites/conftest.py`).
"""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eqsat-cache-session")


@pytest.fixture(autouse=True)
def _session_cache(session_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(session_cache_dir))
    return session_cache_dir

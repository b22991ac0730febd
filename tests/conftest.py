"""One fresh cache directory per test session, shared by its worker processes.

No test reads verification results, calibrations or measured costs that an earlier run or the
user's own work left in `~/.cache`; within the session the tests share the directory, as one user's
runs would. Under pytest-xdist the workers share it too (the run's own temporary folder, above
each worker's): a rule library one worker verifies is read by the other, and two workers verifying
one library at once split the proofs between them (`eqsat.rewrites.verify_cache.prove_missing`).
Tests about the cache itself point `EQSAT_CACHE_DIR` elsewhere (see `tests/rewrites/conftest.py`).
"""

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp("eqsat-cache-session")
    shared = tmp_path_factory.getbasetemp().parent / "eqsat-cache-session"  # the run's folder, above popen-gwN
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(autouse=True)
def _session_cache(session_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(session_cache_dir))
    return session_cache_dir

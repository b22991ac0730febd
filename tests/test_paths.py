"""One environment-variable policy for data and caches (README: "Where eqsat looks")."""

from __future__ import annotations

from pathlib import Path

import pytest

from eqsat import paths


def test_data_dir_is_eqsat_data_else_beside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EQSAT_DATA", raising=False)
    repo = Path(paths.__file__).resolve().parents[1]
    assert paths.data_dir() == repo.parent / "shared" / "data"
    monkeypatch.setenv("EQSAT_DATA", str(tmp_path))
    assert paths.data_dir() == tmp_path
    assert paths.tensat_rule_files() == (tmp_path / "tensat" / "rules" / "converted.txt",
                                         tmp_path / "tensat" / "rules" / "converted_multi.txt")
    assert paths.tensat_models_dir() == tmp_path / "tensat" / "models"
    assert paths.egraphs_dir() == tmp_path / "egraphs"


def test_cache_dir_is_eqsat_cache_dir_else_xdg_else_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EQSAT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir("verify") == tmp_path / "home" / ".cache" / "eqsat" / "verify"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "eqsat"
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path / "mine"))
    assert paths.cache_dir("measured") == tmp_path / "mine" / "measured"


def test_every_cache_lives_under_the_one_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from eqsat.rewrites.verify_cache import VerificationCache

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    assert VerificationCache.default().root == tmp_path / "verify"

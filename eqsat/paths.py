"""Where eqsat reads shared data and keeps its caches: one environment-variable policy.

- Shared data (Tensat's rules and models, the benchmark e-graphs): `$EQSAT_DATA`, else
  `../shared/data` beside the repository.
- Caches (CPU calibration, verification results, measured op costs): `$EQSAT_CACHE_DIR`, else
  `$XDG_CACHE_HOME/eqsat`, else `~/.cache/eqsat`; each kind of cache in its own subfolder.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPOSITORY = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The shared data directory: `$EQSAT_DATA`, else `../shared/data` beside the repository."""
    explicit = os.environ.get("EQSAT_DATA")
    return Path(explicit) if explicit else _REPOSITORY.parent / "shared" / "data"


def tensat_rules_dir() -> Path:
    return data_dir() / "tensat" / "rules"


def tensat_rule_files() -> tuple[Path, Path]:
    """Tensat's single- and two-output rule files."""
    base = tensat_rules_dir()
    return (base / "converted.txt", base / "converted_multi.txt")


def tensat_models_dir() -> Path:
    return data_dir() / "tensat" / "models"


def egraphs_dir() -> Path:
    return data_dir() / "egraphs"


def cache_dir(kind: str = "") -> Path:
    """The cache folder for one `kind` of cache ("" is the root): `$EQSAT_CACHE_DIR`, else
    `$XDG_CACHE_HOME/eqsat`, else `~/.cache/eqsat`. Not created here: writers create it, and an
    unwritable cache only costs computing again."""
    explicit = os.environ.get("EQSAT_CACHE_DIR")
    if explicit:
        root = Path(explicit)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eqsat"
    return root / kind if kind else root


__all__ = ["data_dir", "tensat_rules_dir", "tensat_rule_files", "tensat_models_dir", "egraphs_dir", "cache_dir"]

"""Check where a command will write before it does any work, so a bad `--out` / `--save-graphs`
target is one clear error at the start, not a traceback after minutes of saturation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from eqsat.errors import EqsatError


class OutputTargetError(EqsatError):
    """A path a command was told to write to that cannot be written."""


def writable_dir(path: str | Path, what: str) -> Path:
    """`path` as a directory that exists (created if needed) and accepts new files."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputTargetError(f"{what} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise OutputTargetError(f"{what} {path}: cannot write there: {exc.strerror or exc}") from None
    return path


def writable_file(path: str | Path, what: str) -> Path:
    """`path` as a file that can be created or replaced (its directory is created if needed)."""
    path = Path(path)
    if path.is_dir():
        raise OutputTargetError(f"{what} {path} is a directory; give a file name")
    writable_dir(path.parent if str(path.parent) else Path("."), what)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputTargetError(f"{what} {path}: the file is not writable")
    return path

"""The one way eqsat writes a cache file: atomically, through an unpredictable temporary name.

A temporary name like `<name>.<pid>.tmp` can be guessed, and another user of a shared cache folder
could plant a symlink there so that our write lands on their chosen target. `tempfile.mkstemp`
creates a fresh random name with O_CREAT | O_EXCL (it never opens an existing file or follows a
symlink), in the target's own folder so that `os.replace` is an atomic rename on one file system:
readers see the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_text"]


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = False) -> None:
    """Write `text` (UTF-8) to `path` atomically; `fsync` forces the data to disk before the rename
    (for caches whose loss after a crash would cost real work). Creates the parent folder. Raises
    OSError like `open` does; the temporary file is removed on any failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""The one reader of a cached calibration file (the xla model's, `eqsat.xla_cost`, and a mesh's,
`eqsat.parallel.calibration`): a cache is only a file, so one that is missing, damaged or measured
somewhere else is refused with the caller's error, and the caller measures again; it is never trusted."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from eqsat.errors import EqsatError

__all__ = ["read_cached_calibration"]

T = TypeVar("T")


def read_cached_calibration(path: Path, error: type[EqsatError], parse: Callable[[Any], T], origin: Callable[[T], Sequence[str]],
                            here: Sequence[str], *, label: str, missing: str, where: str) -> T:
    """The calibration `parse` makes of the JSON at `path` when its `origin` (machine, device, ...)
    is `here`; otherwise `error`: `missing` when there is no file, "<label> <path> is damaged" when
    it is not JSON (`parse` raises `error` itself for JSON of the wrong shape), "<label> <path> was
    measured on another <where>" when it comes from elsewhere."""
    if not path.exists():
        raise error(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise error(f"{label} {path} is damaged ({type(exc).__name__})") from None
    cal = parse(data)
    found = tuple(origin(cal))
    if found != tuple(here):
        raise error(f"{label} {path} was measured on another {where} ({'/'.join(found)}, here {'/'.join(here)})")
    return cal

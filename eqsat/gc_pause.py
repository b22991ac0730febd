"""Pause Python's cyclic garbage collector while eqsat builds large acyclic structures.

Saturation (its cycle guard), serialization and extraction parse e-graph JSON into hundreds of
thousands of dicts and lists, none of them in a reference cycle; each burst of allocations starts
collections that walk every live object (the whole heap: the model, the e-graph, JAX if loaded),
which took ~10% of BERT's optimizer time (0.2 s of 2.1 s). Reference counting still frees all that
is not in a cycle; the collector resumes, if it was on, when the block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (nested blocks leave it as they found it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["gc_paused"]

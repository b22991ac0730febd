"""The decorator's default rules: the shipped library's groups that pay under XLA, proved ones only.

Verifying the library takes seconds (z3, the all-shapes derivation), too long to repeat on every
first call, so which rules were proved is cached on disk, keyed by the rule texts and the
verifier's own source: a changed rule or verifier is verified again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from eqsat.rewrites.rule import Rule

__all__ = ["DEFAULT_GROUPS", "proved_library_rules", "library_available"]

DEFAULT_GROUPS: tuple[str, ...] = ("fusion", "merges")
"""Merges (Q/K/V-style matmuls and parallel convs on one input) and activation fusion; TASO's
general properties (associativity, commutativity) only grow the e-graph for these programs."""


def library_available() -> bool:
    try:
        from eqsat.rewrites import library_rules  # noqa: F401
        from eqsat.rewrites.verify import verify_rules  # noqa: F401
    except ImportError:
        return False
    return True


def _cache_file(rules: Sequence[Rule]) -> Path:
    import eqsat.rewrites.verify as verify

    digest = hashlib.sha256()
    for module_file in sorted(Path(verify.__file__).parent.glob("*.py")):
        digest.update(module_file.read_bytes())
    for r in rules:
        digest.update(f"{r.name}\t{r.text()}\t{r.conditions}\n".encode())
    root = os.environ.get("EQSAT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "eqsat")
    return Path(root) / "verified" / f"{digest.hexdigest()[:24]}.json"


def proved_library_rules(groups: Sequence[str] = DEFAULT_GROUPS) -> list[Rule]:
    """The library rules of `groups` that the verifier proves (cached on disk)."""
    from eqsat.rewrites import library_rules
    from eqsat.rewrites.verify import verify_rules

    rules = library_rules(groups)
    cache = _cache_file(rules)
    try:
        proved = set(json.loads(cache.read_text())["proved"])
    except (OSError, ValueError, KeyError):
        results = verify_rules(rules)
        proved = {r.name for r, res in zip(rules, results) if res.proved}
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"proved": sorted(proved),
                                       "statuses": {r.name: res.status for r, res in zip(rules, results)}}))
            tmp.replace(cache)
        except OSError:
            pass  # an unwritable cache only costs verifying again
    return [r for r in rules if r.name in proved]

"""On-disk cache of verification results, so a pipeline can verify its rule set on every run.

One small JSON file per (rule, options) under `$EQSAT_CACHE_DIR/verify/` (default
`~/.cache/eqsat/verify/`). The key hashes the rule's canonical text (as the printer writes it, with
its side conditions), the verifier options, `VERIFIER_VERSION`, and the source of everything the
answer depends on (the rewrites package's verifier modules, the axiom file, the op registry), so an
edited verifier, axiom or op never serves a stale answer. The rule's name and source are not in the
key: they are restored from the rule asked about. An unreadable or unwritable cache only costs
verifying again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from eqsat.rewrites.rule import Rule

_DEPENDENCIES = ("semantics.py", "shapes.py", "verify.py", "derive.py", "rule.py", "parser.py",
                 "library/axioms.rules", "../ops.py")


def cache_root() -> Path:
    root = os.environ.get("EQSAT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "eqsat")
    return Path(root) / "verify"


def _code_digest() -> str:
    from eqsat.rewrites.verify import VERIFIER_VERSION

    h = hashlib.sha256(f"verifier v{VERIFIER_VERSION}\n".encode())
    here = Path(__file__).parent
    for name in _DEPENDENCIES:
        try:
            h.update((here / name).read_bytes())
        except OSError:
            h.update(f"missing {name}".encode())
    return h.hexdigest()


def canonical_text(rule: Rule) -> str:
    """The rule as the printer writes it, without its name (two names, one rule, one entry)."""
    from eqsat.rewrites.printer import rule_text

    return rule_text(dataclasses.replace(rule, name="r"))


_STATUSES = ("proved", "refuted", "unknown")


def well_formed(data: object) -> bool:
    """Whether a cache entry has every field a `VerificationResult` needs, of the right type and
    range; anything else (hand-edited, truncated to `null`, another version's layout) is a miss."""
    if not isinstance(data, dict):
        return False
    texts = ("name", "method", "scope", "source", "guarded_method", "guarded_scope")
    if data.get("status") not in _STATUSES or data.get("guarded_status", "") not in ("", *_STATUSES):
        return False
    if not all(isinstance(data.get(k, ""), str) for k in texts) or not isinstance(data.get("name"), str):
        return False
    if not all(data.get(k) is None or isinstance(data.get(k), dict) for k in ("counterexample", "guarded_counterexample")):
        return False
    seconds = data.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        return False
    shapes = data.get("shapes", [])
    return isinstance(shapes, list) and all(
        isinstance(env, dict) and all(
            isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)
            for v in env.values())
        for env in shapes)


@dataclass(frozen=True)
class VerificationCache:
    root: Path
    code: str  # digest of the verifier's code and version

    @staticmethod
    def default() -> VerificationCache:
        return VerificationCache(cache_root(), _code_digest())

    def path(self, rule: Rule, options: object, all_shapes: bool) -> Path:
        key = f"{self.code}\n{options!r}\nall_shapes={all_shapes}\n{canonical_text(rule)}"
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.root / digest[:2] / f"{digest[2:32]}.json"

    def get(self, rule: Rule, options: object, all_shapes: bool):  # -> VerificationResult | None
        from eqsat.rewrites.verify import VerificationResult

        try:
            data = json.loads(self.path(rule, options, all_shapes).read_text(encoding="utf-8"))
            if not well_formed(data):
                return None  # valid JSON with wrong values (zeros, [], null): verify again
            result = VerificationResult.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None
        return dataclasses.replace(result, name=rule.name, source=rule.source)

    def put(self, rule: Rule, options: object, all_shapes: bool, result: object) -> None:
        path = self.path(rule, options, all_shapes)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(result.to_json()))  # type: ignore[attr-defined]
            tmp.replace(path)
        except OSError:
            pass


__all__ = ["VerificationCache", "cache_root", "canonical_text", "well_formed"]

"""On-disk cache of verification results, so a pipeline can verify its rule set on every run.

One small JSON file per (rule, options) under the `verify` cache folder
(`eqsat.paths.cache_dir`). The key hashes the rule's canonical text (as the printer writes it, with
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

from eqsat.paths import cache_dir
from eqsat.rewrites.concrete import VERIFIER_VERSION, VerificationResult
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import Rule

_DEPENDENCIES = ("semantics.py", "shapes.py", "concrete.py", "verify.py", "derive.py", "rule.py", "parser.py",
                 "library/axioms.rules", "../ops.py")


def _code_digest() -> str:
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
    return rule_text(dataclasses.replace(rule, name="r"))


@dataclass(frozen=True)
class VerificationCache:
    root: Path
    code: str  # digest of the verifier's code and version

    @staticmethod
    def default() -> VerificationCache:
        return VerificationCache(cache_dir("verify"), _code_digest())

    def path(self, rule: Rule, options: object, all_shapes: bool) -> Path:
        key = f"{self.code}\n{options!r}\nall_shapes={all_shapes}\n{canonical_text(rule)}"
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.root / digest[:2] / f"{digest[2:32]}.json"

    def get(self, rule: Rule, options: object, all_shapes: bool) -> VerificationResult | None:
        try:
            data = json.loads(self.path(rule, options, all_shapes).read_text())
            result = VerificationResult.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return dataclasses.replace(result, name=rule.name, source=rule.source)

    def put(self, rule: Rule, options: object, all_shapes: bool, result: VerificationResult) -> None:
        path = self.path(rule, options, all_shapes)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(result.to_json()))
            tmp.replace(path)
        except OSError:
            pass


__all__ = ["VerificationCache", "canonical_text"]

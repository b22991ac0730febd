"""On-disk cache of verification results, so a pipeline can verify its rule set on every run.

One small JSON file per (rule, options) under the `verify` cache folder
(`eqsat.paths.cache_dir`). The key hashes the rule's canonical text (as the printer writes it, with
its side conditions), the verifier options, `VERIFIER_VERSION`, and the source of everything the
answer depends on (the rewrites package's verifier modules, the axiom file, the op registry), so an
edited verifier, axiom or op never serves a stale answer. The rule's name and source are not in the
key: they are restored from the rule asked about. An unreadable or unwritable cache only costs
verifying again.

A cached verdict is never trusted blindly (a cache may be stale, shared or damaged): entries are
written atomically (a unique temporary file, then a rename), carry their key and a checksum of key
and result (a damaged, truncated or moved file reads as a miss), and a cached "proved" is re-checked
by the cheap randomized test (the prime-field test with fresh random values, a seed the verifier
did not use, on the shapes the proof names or on freshly sampled ones) before it is used: a
"proved" that test refutes reads as a miss, so the rule is verified again.

Processes that share a cache folder share the work of a cold cache (`prove_missing`): each missing
entry is claimed by one process (a `.claim` file created exclusively beside it) that proves it,
while the others prove the entries they claimed and then read its result. A claim whose process is
gone, or older than `CLAIM_SECONDS`, is taken over, so a crashed prover only costs proving again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqsat.atomic_write import atomic_write_text
from eqsat.paths import cache_dir
from eqsat.rewrites.concrete import PROVED, VERIFIER_VERSION, VerificationResult, field_differs
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import Rule
from eqsat.rewrites.shapes import sample_assignments

_DEPENDENCIES = ("semantics.py", "shapes.py", "concrete.py", "verify.py", "derive.py", "symbolic.py", "rule.py", "parser.py",
                 "z3budget.py", "library/axioms.rules", "../ops.py", "../distribution.py")


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
        return VerificationCache(cache_dir("verify"), _code_digest())

    def _key(self, rule: Rule, options: object, all_shapes: bool) -> str:
        key = f"{self.code}\n{options!r}\nall_shapes={all_shapes}\n{canonical_text(rule)}"
        return hashlib.sha256(key.encode()).hexdigest()

    def path(self, rule: Rule, options: object, all_shapes: bool) -> Path:
        return self._path(self._key(rule, options, all_shapes))

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key[2:32]}.json"

    def get(self, rule: Rule, options: object, all_shapes: bool) -> VerificationResult | None:
        """The cached result, or None when there is none, it is damaged, or its "proved" does not
        survive the randomized re-check."""
        key = self._key(rule, options, all_shapes)
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))  # (the key printed once: most of a hit's time)
            if entry.get("key") != key or entry.get("checksum") != _checksum(key, entry["result"]):
                return None
            if not well_formed(entry["result"]):
                return None  # valid JSON with wrong values (zeros, [], null): verify again
            result = VerificationResult.from_json(entry["result"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None
        if not _survives_recheck(rule, result, options):
            return None
        return dataclasses.replace(result, name=rule.name, source=rule.source)

    def put(self, rule: Rule, options: object, all_shapes: bool, result: VerificationResult) -> None:
        """Store `result`, unless a z3 check hit its wall-clock cap on the way (`result.capped`): that
        verdict depends on machine load, so the next run decides again (under the rlimit alone)."""
        if getattr(result, "capped", False):
            return
        key = self._key(rule, options, all_shapes)
        path = self._path(key)
        data = result.to_json()
        entry = {"key": key, "checksum": _checksum(key, data), "result": data}
        try:
            atomic_write_text(path, json.dumps(entry), fsync=True)
        except OSError:
            pass  # an unwritable cache only costs verifying again

    def claim(self, rule: Rule, options: object, all_shapes: bool) -> bool:
        """Claim the entry for proving: True unless another live process holds a claim on it (a
        folder where no claim can be made counts as claimed by us: we prove it ourselves)."""
        claim = self.path(rule, options, all_shapes).with_suffix(".claim")
        for _ in range(2):
            try:
                claim.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                if not _abandoned(claim):
                    return False
                try:
                    claim.unlink(missing_ok=True)  # its prover is gone: take it over
                except OSError:
                    return True
                continue
            except OSError:
                return True
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(f"{socket.gethostname()} {os.getpid()}")
            return True
        return False

    def release(self, rule: Rule, options: object, all_shapes: bool) -> None:
        try:
            self.path(rule, options, all_shapes).with_suffix(".claim").unlink(missing_ok=True)
        except OSError:
            pass  # left behind, it is taken over once its process is gone


CLAIM_SECONDS = 300.0  # a claim older than this is presumed abandoned (one rule takes seconds to prove)
_POLL_SECONDS = 0.05


def _abandoned(claim: Path) -> bool:
    """Whether a claim's process is gone (same host, no such pid) or the claim is older than
    `CLAIM_SECONDS`."""
    try:
        age = time.time() - claim.stat().st_mtime
    except OSError:
        return True  # released meanwhile
    if age > CLAIM_SECONDS:
        return True
    try:
        host, pid = claim.read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return False  # being written or released right now: ask again later
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


def prove_missing(store: VerificationCache | None, rules: Sequence[Rule], options: object, all_shapes: bool,
                  out: list[VerificationResult | None], prove: Callable[[Rule], VerificationResult],
                  done: Callable[[], None] = lambda: None) -> None:
    """Fill the gaps (None) of `out` with `prove(rules[i])`, storing each result. With a store, the
    work is shared with the other processes proving the same rules into the same folder: a rule
    another process has claimed is read from the cache once it is proved there (see the module
    doc); `done` is called once per gap filled."""
    def proved_here(i: int) -> None:
        out[i] = prove(rules[i])
        if store is not None:
            store.put(rules[i], options, all_shapes, out[i])  # type: ignore[arg-type]

    waiting: list[int] = []
    for i in [i for i, res in enumerate(out) if res is None]:
        if store is None:
            proved_here(i)
        elif store.claim(rules[i], options, all_shapes):
            try:
                out[i] = store.get(rules[i], options, all_shapes)  # proved meanwhile by another
                if out[i] is None:
                    proved_here(i)
            finally:
                store.release(rules[i], options, all_shapes)
        else:
            waiting.append(i)
            continue
        done()
    while waiting and store is not None:
        time.sleep(_POLL_SECONDS)
        still = []
        for i in waiting:
            out[i] = store.get(rules[i], options, all_shapes)
            if out[i] is None and store.claim(rules[i], options, all_shapes):  # released unproved, or abandoned
                try:
                    out[i] = store.get(rules[i], options, all_shapes)
                    if out[i] is None:
                        proved_here(i)
                finally:
                    store.release(rules[i], options, all_shapes)
            if out[i] is None:
                still.append(i)
            else:
                done()
        waiting = still


def _checksum(key: str, result: object) -> str:
    """Digest of an entry's key and result (canonical JSON): a changed verdict no longer matches."""
    text = json.dumps(result, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{key}\n{text}".encode()).hexdigest()


_RECHECK_SAMPLES = 1  # shape assignments the re-check of a cached "proved" tests (one exact random test
# modulo a prime already tells the sides of a wrong rule apart with high probability)
_RECHECK_SEED = 7_777  # a seed the verifier's own sampling does not use


def _survives_recheck(rule: Rule, result: VerificationResult, options: object) -> bool:
    """False when the cheap randomized test tells the sides of a cached "proved" rule apart (strictly,
    or under the applier's guard for a guarded "proved"); other verdicts need no re-check: a wrong
    "refuted" or "unknown" only keeps a rule out. A pure function of what it reads, so it runs once
    per process for one rule, verdict and set of shapes (a library is looked up by many callers)."""
    status, guarded_status = getattr(result, "status", ""), getattr(result, "guarded_status", "")
    try:
        shapes = tuple(tuple(env.items()) for env in getattr(result, "shapes", ()))  # in order: it seeds the draws
        return _recheck(rule, status, guarded_status, shapes, options)
    except TypeError:  # an unhashable part: check without the memo
        return _recheck.__wrapped__(rule, status, guarded_status, tuple(getattr(result, "shapes", ())), options)


@functools.lru_cache(maxsize=1 << 16)
def _recheck(rule: Rule, status: str, guarded_status: str, shapes: tuple[Any, ...], options: object) -> bool:
    checks = [guarded for guarded, verdict in ((False, status), (True, guarded_status)) if verdict == PROVED]
    seed = getattr(options, "seed", 0) + _RECHECK_SEED
    proved_on = [dict(env) for env in shapes][:_RECHECK_SAMPLES]
    try:
        for guarded in checks[:1]:  # a strict "proved" implies the guarded one
            # the shapes the proof names (sampling anew costs ~10 ms a rule), else sampled ones
            envs = proved_on if proved_on and not guarded else \
                sample_assignments(rule, _RECHECK_SAMPLES, seed=seed, guarded=guarded)
            if not envs or any(field_differs(rule, env, seed, trials=1) for env in envs):
                return False
    except Exception:  # noqa: BLE001 - a rule the re-check cannot evaluate is verified again
        return False
    return True


__all__ = ["VerificationCache", "canonical_text", "well_formed", "prove_missing", "CLAIM_SECONDS"]

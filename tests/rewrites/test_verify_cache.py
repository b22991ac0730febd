"""A verification cache can never admit a wrong rule: damaged, edited or moved entries read as
misses, and a cached "proved" is re-checked by the randomized test before use."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import VerifyOptions, verify_rules
from eqsat.rewrites.concrete import VerificationResult
from eqsat.rewrites.verify_cache import CLAIM_SECONDS, VerificationCache, _checksum, prove_missing

WRONG = parse_rule_text("wrong: (ewadd ?a ?b) => (ewmul ?a ?b)")[0]
RIGHT = parse_rule_text("right: (ewadd ?a ?b) => (ewadd ?b ?a)")[0]
OPTIONS = VerifyOptions()


def _entry(rule) -> Path:
    return VerificationCache.default().path(rule, OPTIONS, False)


def _edit(path: Path, forge_checksum: bool) -> None:
    entry = json.loads(path.read_text())
    entry["result"].update(status="proved", method="edited", counterexample=None, scope="listed shapes",
                           guarded_status="proved")
    if forge_checksum:
        entry["checksum"] = _checksum(entry["key"], entry["result"])
    path.write_text(json.dumps(entry))


def test_an_edited_refuted_entry_is_not_believed() -> None:
    assert verify_rules([WRONG], OPTIONS, all_shapes=False)[0].status == "refuted"
    for forge in (False, True):  # a naive edit fails the checksum; a forged one fails the re-check
        _edit(_entry(WRONG), forge)
        assert verify_rules([WRONG], OPTIONS, all_shapes=False)[0].status == "refuted"


def test_damaged_or_moved_entries_are_misses_and_rewritten() -> None:
    verify_rules([WRONG, RIGHT], OPTIONS, all_shapes=False)
    wrong, right = _entry(WRONG), _entry(RIGHT)
    right.write_text(wrong.read_text())  # another rule's (valid) entry under this rule's name
    assert verify_rules([RIGHT], OPTIONS, all_shapes=False)[0].status == "proved"
    wrong.write_text(wrong.read_text()[:40])  # truncated
    assert verify_rules([WRONG], OPTIONS, all_shapes=False)[0].status == "refuted"
    assert json.loads(wrong.read_text())["result"]["status"] == "refuted"  # written again, whole
    assert not list(wrong.parent.glob("*.tmp"))  # no temporary files left behind


def test_a_cached_proved_rule_is_still_served_from_the_cache() -> None:
    cold = verify_rules([RIGHT], OPTIONS, all_shapes=False)[0]
    cache = VerificationCache.default()
    warm = cache.get(RIGHT, OPTIONS, False)
    assert warm is not None and warm.status == cold.status == "proved"


# --- processes sharing a cold cache split the proofs (claims) ------------------------------------

def _rules(n: int) -> list:
    return [parse_rule_text(f"r{i}: (ewadd ?a (ewmul ?b ?c{i})) => (ewadd (ewmul ?b ?c{i}) ?a)")[0] for i in range(n)]


def _refuted(rule) -> VerificationResult:
    return VerificationResult(rule.name, "refuted", f"by {threading.current_thread().name}")  # no re-check needed


def test_two_provers_sharing_a_cache_prove_each_rule_once_and_agree() -> None:
    rules, cache = _rules(12), VerificationCache.default()
    proved_by: dict[str, list[str]] = {}
    outs: dict[str, list] = {}

    def prove(rule) -> VerificationResult:
        proved_by.setdefault(rule.name, []).append(threading.current_thread().name)
        time.sleep(0.05)
        return _refuted(rule)

    def run() -> None:
        out: list = [None] * len(rules)
        prove_missing(cache, rules, OPTIONS, False, out, prove)
        outs[threading.current_thread().name] = out

    threads = [threading.Thread(target=run, name=f"prover{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(proved_by) == sorted(r.name for r in rules)
    assert all(len(who) == 1 for who in proved_by.values())  # each rule proved by one of them only
    assert {who[0] for who in proved_by.values()} == {"prover0", "prover1"}  # and both took a share
    assert [r.method for r in outs["prover0"]] == [r.method for r in outs["prover1"]]  # one answer each
    assert not list(cache.root.rglob("*.claim"))  # every claim released


def test_a_rule_claimed_by_a_live_prover_is_read_once_it_is_stored() -> None:
    rule, cache = _rules(1)[0], VerificationCache.default()
    assert cache.claim(rule, OPTIONS, False)  # held by this (live) process
    assert not cache.claim(rule, OPTIONS, False)

    def finish() -> None:
        time.sleep(0.3)
        cache.put(rule, OPTIONS, False, VerificationResult(rule.name, "refuted", "by the claimant"))
        cache.release(rule, OPTIONS, False)

    threading.Thread(target=finish).start()
    out: list = [None]
    prove_missing(cache, [rule], OPTIONS, False, out, lambda r: VerificationResult(r.name, "refuted", "again"))
    assert out[0].method == "by the claimant"


def test_a_claim_released_without_a_result_is_proved_by_a_waiter() -> None:
    rule, cache = _rules(1)[0], VerificationCache.default()
    assert cache.claim(rule, OPTIONS, False)
    threading.Timer(0.2, cache.release, (rule, OPTIONS, False)).start()  # its prover failed to store
    out: list = [None]
    prove_missing(cache, [rule], OPTIONS, False, out, lambda r: VerificationResult(r.name, "refuted", "here"))
    assert out[0].method == "here"


def test_abandoned_claims_are_taken_over() -> None:
    rules, cache = _rules(2), VerificationCache.default()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    gone, old = (cache.path(r, OPTIONS, False).with_suffix(".claim") for r in rules)
    for claim, pid in ((gone, dead), (old, str(os.getpid()))):
        claim.parent.mkdir(parents=True, exist_ok=True)
        claim.write_text(f"{socket.gethostname()} {pid}")
    stale = time.time() - CLAIM_SECONDS - 5
    os.utime(old, (stale, stale))  # a live process's claim, but far older than any proof takes
    out: list = [None, None]
    prove_missing(cache, rules, OPTIONS, False, out, lambda r: VerificationResult(r.name, "refuted", "taken over"))
    assert [r.method for r in out] == ["taken over", "taken over"]
    assert not gone.exists() and not old.exists()


def test_an_unwritable_cache_folder_still_proves_everything(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    cache = VerificationCache(blocked / "verify", "code")  # no entry, no claim can be made under a file
    rules = _rules(3)
    out: list = [None] * 3
    prove_missing(cache, rules, OPTIONS, False, out, lambda r: VerificationResult(r.name, "refuted", "here"))
    assert [r.method for r in out] == ["here"] * 3

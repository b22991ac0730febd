"""A verification cache can never admit a wrong rule: damaged, edited or moved entries read as
misses, and a cached "proved" is re-checked by the randomized test before use."""

from __future__ import annotations

import json
from pathlib import Path

from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import VerifyOptions, verify_rules
from eqsat.rewrites.verify_cache import VerificationCache, _checksum

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

"""The batch through a patch cut (issue 26: the Equinox ViT's patchify, (B, H, W, C) -> reshape
(B, g, p, g, p, C) -> transpose [0 1 3 2 4 5] -> reshape (B, g*g, p*p*C)): `reshape-partition-wide-K`,
`-5`, `-6` and `partition-transpose-batch` carry a split of the leading dim through reshapes and
transposes with a rank-5/6 side, whose split values have rank 6/7 (`egglog_schema.MAX_RANK`).
Each instance is proved for every shape (under the guard for the reshapes) and trusted by the
planner's policy; wrong variants are refuted (typed where two dims are equal, so the variant is no
vacuous proof)."""

from __future__ import annotations

import itertools

import pytest

from eqsat.egglog_schema import MAX_RANK
from eqsat.parallel.rules import BATCH_PERM_RANKS, _items, batch_permutations, instantiate
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted

from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

RESHAPES = (*(f"reshape-partition-wide-{k}" for k in range(1, 7)), "reshape-partition-5", "reshape-partition-6")
VIT = ("reshape-partition-wide-3[EW=-6]@0", "partition-transpose-batch[BPERM=0.1.3.2.4.5]@0",
       "reshape-partition-6[E=-4]@0")


def test_the_split_patch_value_fits_the_schema() -> None:
    assert 1 + max(BATCH_PERM_RANKS) <= MAX_RANK


def test_every_batch_permutation_is_expanded_once() -> None:
    expected = sum(len(list(itertools.permutations(range(r - 1)))) - 1 for r in BATCH_PERM_RANKS)
    assert len(batch_permutations()) == len(set(batch_permutations())) == expected == 23 + 119
    rules = instantiate(1, 4, names=("partition-transpose-batch",))
    assert len(rules) == expected and all(r.name.endswith("@1") for r in rules)
    rule = next(r for r in rules if "[BPERM=0.1.3.2.4.5]" in r.name)
    assert str(rule.rhs[0].attrs) == str((("perm", (0, 1, 2, 4, 3, 5, 6)),))
    assert dict(rule.rhs[0].args[0].attrs)["dim"] == -6
    assert len(instantiate(0, 2, names=RESHAPES)) == 6 * 2 + 2 * 4


@pytest.mark.parametrize("parts", [2, 4])
def test_the_vits_patch_cut_is_proved_and_trusted(parts: int) -> None:
    rules = [r for r in instantiate(0, parts, names=("partition-transpose-batch", *RESHAPES)) if r.name in VIT]
    assert sorted(r.name for r in rules) == sorted(VIT)
    assert_proved_for_all_shapes(rules)
    for rule, result in zip(rules, verify_rules(rules), strict=True):
        assert is_trusted(result), (rule.name, result.status, result.guarded_status)


@pytest.mark.parametrize("parts", [2, 4])
def test_every_wide_reshape_instance_is_proved_for_all_shapes(parts: int) -> None:
    assert_proved_for_all_shapes(instantiate(0, parts, names=RESHAPES))


@pytest.mark.slow  # 2 x 142 instances, each a z3 proof over rank-6/7 index maps
def test_every_batch_transpose_instance_is_proved_and_trusted() -> None:
    rules = [r for n in (2, 4) for r in instantiate(0, n, names=("partition-transpose-batch",))]
    assert_proved_for_all_shapes(rules)
    assert all(is_trusted(res) for res in verify_rules(rules))


@pytest.mark.parametrize("text", [
    # the permutation not shifted behind the device axis (typed where the swapped dims are equal)
    "(partition -6 0 2 (transpose [0 1 3 2 4 5] ?x)) => (transpose [0 1 3 2 4 5 6] (partition -6 0 2 ?x))",
    # the inverse permutation where the perm is no involution
    "(partition -5 0 2 (transpose [0 2 3 1 4] ?x)) => (transpose [0 1 4 2 3 5] (partition -5 0 2 ?x))",
    # the split read from the second dim, not the batch, and the two swapped (typed where both are equal)
    "(partition -6 0 2 (transpose [0 1 3 2 4 5] ?x)) => (transpose [0 2 1 4 3 5 6] (partition -5 0 2 ?x))",
    # (B, g*g, P) from (B, g, p, g, p, C) by a plain reshape: the split of g*g read from p (a strided piece)
    "(partition -2 0 2 (reshape ?S ?y)) => (reshape (items 4 (partition -2 0 2 (reshape ?S ?y))) (partition -4 0 2 ?y))"
    " if (= (rank ?S) 3) (= (rank ?y) 6)",
    # (B, g, p, g, p, C) from (B, H, W, C): the batch split read from H
    "(partition -6 0 2 (reshape ?S ?y)) => (reshape (items 7 (partition -6 0 2 (reshape ?S ?y))) (partition -3 0 2 ?y))"
    " if (= (rank ?S) 6) (= (rank ?y) 4)",
])
def test_wrong_patch_splits_are_refuted(text: str) -> None:
    assert_refuted(parse_rule_text(_items(text))[0])

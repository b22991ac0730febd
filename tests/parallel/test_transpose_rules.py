"""A split dim follows any transpose (issue 26): `partition-transpose`, one line expanded over every
non-identity permutation of ranks 2-4 and each dim of its result. Equinox's `Linear` under `vmap`
captures as `W @ X` with the batch moved to a middle or the last dim (`[2 0 1]`, `[1 2 0]`, and
the attention's `[0 2 3 1]`). Every instance is proved for every shape; the planner's trust policy
accepts the ViT's; variants whose split lands on the wrong dim are refuted. (A variant typed by no shape, say one
whose split piece has another size, is no test: z3 proves it under its vacuous guard, and the
concrete verifier finds no shape to check, so the variants here are typed where two dims are equal.)"""

from __future__ import annotations

import itertools

import pytest

from eqsat.parallel.rules import PERM_RANKS, _items, instantiate, permuted_dims
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted

from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

VIT_PERMS = ("PERM=2.0.1,", "PERM=1.2.0,", "PERM=0.2.3.1,", "PERM=1.0,")


def test_every_permutation_and_dim_is_expanded_once() -> None:
    expected = sum((len(list(itertools.permutations(range(r)))) - 1) * r for r in PERM_RANKS)
    assert len(permuted_dims()) == len(set(permuted_dims())) == expected
    rules = instantiate(1, 4, names=("partition-transpose",))
    assert len(rules) == expected and all(r.name.endswith("@1") for r in rules)
    # [2 0 1] of (B, T, d) is (d, B, T): its dim -2 (the batch) reads the input's dim -3
    rule = next(r for r in rules if "[PERM=2.0.1,D=-2]" in r.name)
    assert str(rule.rhs[0].attrs) == str((("perm", (0, 3, 1, 2)),))
    assert dict(rule.rhs[0].args[0].attrs)["dim"] == -3


@pytest.mark.parametrize("parts", [2, 4])
def test_every_partition_transpose_instance_is_proved_for_all_shapes(parts: int) -> None:
    assert_proved_for_all_shapes(instantiate(0, parts, names=("partition-transpose",)))


@pytest.mark.parametrize("parts", [2, 4])
def test_the_vits_transposes_are_trusted_by_the_planners_policy(parts: int) -> None:
    rules = [r for r in instantiate(0, parts, names=("partition-transpose",)) if any(p in r.name for p in VIT_PERMS)]
    assert len(rules) == 3 + 3 + 4 + 2
    for rule, result in zip(rules, verify_rules(rules), strict=True):
        assert is_trusted(result), (rule.name, result.status, result.guarded_status)


@pytest.mark.slow  # the verifier's concrete checks of all 2 x 109 instances (~10 s)
def test_every_partition_transpose_instance_is_trusted() -> None:
    rules = [r for n in (2, 4) for r in instantiate(0, n, names=("partition-transpose",))]
    assert all(is_trusted(res) for res in verify_rules(rules))


@pytest.mark.parametrize("text", [
    # (B, T, d) -> (d, B, T): the split read from T, not B (typed where B = T)
    "(partition -2 0 2 (transpose [2 0 1] ?x)) => (transpose [0 3 2 1] (partition -2 0 2 ?x))",
    # the permutation not shifted behind the device axis
    "(partition -3 0 2 (transpose [1 2 0] ?x)) => (transpose [1 2 0 3] (partition -2 0 2 ?x))",
    # the inverse permutation where the perm is no involution
    "(partition -2 0 2 (transpose [2 0 1] ?x)) => (transpose [0 2 3 1] (partition -3 0 2 ?x))",
    # (B, T, H, dh) -> (B, H, dh, T): the head split read from dh, not H (typed where H = dh)
    "(partition -3 0 2 (transpose [0 2 3 1] ?x)) => (transpose [0 1 4 3 2] (partition -1 0 2 ?x))",
    # rank 2: the transpose dropped, the rows split (typed where the matrix is square)
    "(partition -2 0 2 (transpose [1 0] ?x)) => (partition -2 0 2 ?x)",
])
def test_wrong_transpose_splits_are_refuted(text: str) -> None:
    assert_refuted(parse_rule_text(_items(text))[0])


def test_partition_transpose_is_in_every_strategy() -> None:
    from eqsat.parallel.planner import STRATEGY_RULES, _strategy_names

    for strategy in STRATEGY_RULES:
        names = _strategy_names(strategy)
        assert names is None or "partition-transpose" in names, strategy

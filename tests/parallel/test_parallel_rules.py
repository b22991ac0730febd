"""The parallelization rules go through the project's verifier: every instance is accepted (proved,
or proved wherever its right side is well-typed), and wrong parallel rules are refuted."""

from __future__ import annotations

import pytest

from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import verified_parallel_rules
from eqsat.parallel.rules import instantiate, mesh_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import PROVED, REFUTED, verified_rules, verify_rule, verify_rules


@pytest.mark.parametrize("parts", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_instance_is_accepted(parts: int) -> None:
    unknown = []
    rules = instantiate(0, parts)  # verified as the planner verifies them (the session's cache: proved once)
    for rule, result in zip(rules, verify_rules(rules), strict=True):
        accepted = result.status == PROVED or (result.status == REFUTED and result.guarded_status == PROVED)
        if not accepted:
            unknown.append((rule.name, result.status, result.guarded_status))
    # only the all-to-alls between dims the verifier's rank grid cannot make distinct stay unknown
    assert all(name.startswith("all-to-all") and status == "unknown" for name, status, _ in unknown), unknown


@pytest.mark.parametrize("text", [
    "(relu (reduce 0 ?x)) => (reduce 0 (relu ?x))",  # relu does not commute with the sum
    "(reduce 0 (replicate 0 2 ?x)) => ?x",  # summing copies doubles
    "(matmul 0 ?x ?w) => (reduce 0 (matmul 0 (partition -1 0 2 ?x) (partition -1 0 2 ?w)))",  # wrong weight dim
    "(matmul 0 ?x ?w) => (combine -2 0 (matmul 0 (partition -2 0 2 ?x) (partition -2 0 2 ?w)))",  # weight split, not copied
    "(conv2d 1 1 0 2 ?x ?w) => (reduce 0 (conv2d 1 1 0 2 (partition -3 0 2 ?x) (partition -3 0 2 ?w)))",  # relu of a partial sum
    "(reduce_max [2] ?s) => (reduce_max [3] (partition -3 0 2 ?s))",  # partition over heads, never combined
    "(reduce_max [2] ?s) => (reduce 0 (reduce_max [3] (partition -1 0 2 ?s)))",  # a max is no sum of partial maxes
])
def test_wrong_parallel_rules_are_refuted(text: str) -> None:
    (rule,) = parse_rule_text(text)
    result = verify_rule(rule)
    assert result.status == REFUTED and result.guarded_status != PROVED
    assert verified_rules([rule], allow_guarded=True) == []


@pytest.mark.slow  # ~30 s; test_every_instance_is_accepted covers the instances in the default suite
def test_mesh_instances_cover_every_axis() -> None:
    mesh = parse_mesh("2x4")
    names = {r.name.rsplit("@", 1)[1] for r in mesh_rules(mesh)}
    assert names == {"0", "1"}
    kept = verified_parallel_rules(mesh)
    assert {r.name.split("@")[0] for r in kept} >= {"dp-matmul[ACT=0]", "col-matmul[ACT=2]", "row-matmul", "all-reduce"}

"""What `eqsat.parallel.plan` shares to plan faster must not change what it plans: a strategy's
rules taken from the mesh's `RuleBook` (parsed and verified once) are the ones verified on their
own, and the baselines' predictions (searched with the book, without a numpy check) are those of a
search of their own."""

from __future__ import annotations

import pytest

from eqsat.models.parallel_cases import unity_mlp
from eqsat.parallel.blocks import plan_hash, plan_repeated
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import STRATEGY_RULES, PlanError, RuleBook, strategy_rules
from eqsat.rewrites.rule import Rule


def _names(rules: list[Rule]) -> list[str]:
    return [r.name for r in rules]


@pytest.mark.parametrize("strategy", ["data-parallel", "fsdp", "algebra-first"])
def test_the_book_gives_a_strategy_the_rules_it_verifies_alone(strategy: str) -> None:
    mesh = parse_mesh("2x4")
    book = RuleBook.of(mesh)
    alone = strategy_rules(mesh, strategy)
    assert strategy_rules(mesh, strategy, book=book) == alone
    assert len(alone) < len(book.rules)  # a filter that filters: the strategy's rules only


@pytest.mark.slow
def test_the_book_gives_every_strategy_its_rules_in_order() -> None:
    mesh = parse_mesh("2x4")
    book = RuleBook.of(mesh)
    for strategy in STRATEGY_RULES:
        assert _names(strategy_rules(mesh, strategy, book=book)) == _names(strategy_rules(mesh, strategy)), strategy


def test_a_book_of_another_mesh_is_refused() -> None:
    with pytest.raises(PlanError, match="rule book"):
        strategy_rules(parse_mesh("8"), "data-parallel", book=RuleBook(parse_mesh("2x4"), ()))
    with pytest.raises(PlanError, match="unknown strategy"):
        strategy_rules(parse_mesh("8"), "nope", book=RuleBook(parse_mesh("8"), ()))


@pytest.mark.parametrize("strategy", ["data-parallel", "fsdp", pytest.param("joint", marks=pytest.mark.slow)])
def test_a_search_with_the_book_and_no_check_finds_the_plan_of_its_own_search(strategy: str) -> None:
    """`plan`'s baseline predictions (book, check=False) and its joint plan (book) against a search
    that verifies its own rules and checks its plan: the same plan graph and predicted step."""
    graph = unity_mlp(32, 128, 512, 128)
    mesh = parse_mesh("2x4")
    own = plan_repeated(graph, mesh, strategy)
    shared = plan_repeated(graph, mesh, strategy, book=RuleBook.of(mesh), check=strategy == "joint")
    assert own.numerics_ok
    assert plan_hash(shared.plan) == plan_hash(own.plan)
    assert shared.report.step_s == own.report.step_s

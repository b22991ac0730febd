"""`eqsat rules discover` and the rules it found: each new rule is proved (trusted), a perturbed
copy is refuted, both sides of an instance are timed with an interval, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eqsat.ir import GraphBuilder
from eqsat.rewrites import library_rules, parse_rule_text
from eqsat.rewrites.verify import verify_concrete
from eqsat.rulesets import XLA_GROUPS, trusted_rules

NEW_RULES = ("poolavg-separable-5x5-s1-same", "poolavg-separable-5x5-s2-same", "poolavg-separable-7x7-s1-same")

# Each new rule with one thing changed: the second pass's window, its stride, the first's window.
PERTURBED = (
    "(poolavg ?x 5 5 1 1 0 0) => (poolavg (poolavg ?x 1 5 1 1 0 0) 3 1 1 1 0 0)",
    "(poolavg ?x 5 5 2 2 0 0) => (poolavg (poolavg ?x 1 5 1 1 0 0) 5 1 2 2 0 0)",
    "(poolavg ?x 7 7 1 1 0 0) => (poolavg (poolavg ?x 1 5 1 1 0 0) 7 1 1 1 0 0)",
)


def _library(name: str):  # type: ignore[no-untyped-def]
    return next(r for r in library_rules(["decompositions"]) if r.name == name)


@pytest.mark.parametrize("name", NEW_RULES)
def test_each_new_rule_is_proved_for_all_shapes(name: str) -> None:
    from eqsat.rewrites.symbolic import prove_symbolic

    assert prove_symbolic(_library(name)) is not None


@pytest.mark.slow
def test_the_new_rules_are_in_the_default_groups_and_trusted() -> None:
    """The whole policy (concrete tests on the grid, then the proof): about a minute cold."""
    rules = [_library(name) for name in NEW_RULES]
    assert [r.name for r in trusted_rules(rules)] == list(NEW_RULES)
    assert all(r in library_rules(XLA_GROUPS) for r in rules)


@pytest.mark.parametrize("text", PERTURBED)
def test_a_perturbed_new_rule_is_refuted(text: str) -> None:
    rule = parse_rule_text(text, "test")[0]
    result = verify_concrete(rule)
    assert result.status == "refuted" and result.method != "shapes"


def _pool_graph(kernel: int = 5, size: int = 12):  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    x = b.input("x", (1, 4, size, size))
    return b.build([b.relu(b.poolavg(x, (kernel, kernel), (1, 1)))])


def test_instances_are_found_in_a_graph_with_their_shapes() -> None:
    from jax_backend.rule_discovery import graph_instances

    found = graph_instances(library_rules(["decompositions"]), _pool_graph(), "g")
    assert [(i.rule.name, i.describe(), i.where) for i in found] == [
        ("poolavg-separable-5x5-s1-same", "x=1x4x12x12", "g")]


def test_both_sides_are_timed_with_an_interval_and_checked_equal() -> None:
    from jax_backend.rule_discovery import graph_instances, time_instance

    (inst,) = graph_instances([_library("poolavg-separable-5x5-s1-same")], _pool_graph(), "g")
    timing = time_instance(inst, budget_s=0.2, rounds=10)
    row = timing.to_json()
    assert row["agree"] is True and row["verdict"] in ("paid", "even", "lost")
    assert row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"]
    assert row["rounds"] >= 8 and row["lhs_ms"] > 0 and row["rhs_ms"] > 0


def test_a_wrong_rule_is_reported_wrong_not_paid() -> None:
    from jax_backend.rule_discovery import graph_instances, time_instance

    wrong = parse_rule_text(PERTURBED[0], "test")[0]
    (inst,) = graph_instances([wrong], _pool_graph(), "g")
    assert time_instance(inst, budget_s=0.1, rounds=8).verdict == "wrong"


def test_the_command_reports_per_rule_fields_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eqsat.cli import main

    graph = tmp_path / "g.json"
    _pool_graph().save(graph)
    out = tmp_path / "report.json"
    code = main(["rules", "discover", "--json", "--groups", "decompositions", "--program", str(graph), "--no-probe",
                 "--budget", "0.2", "--max-instances", "1", "--no-model", "--out", str(out)])
    assert code == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["rule"] == "poolavg-separable-5x5-s1-same" and row["instances"] == 1 and row["wrong"] == 0
    assert {"paid", "lost", "geomean_speedup", "best_speedup", "best_ci_low", "best_ci_high", "best_at",
            "paid_at", "instances_timed"} <= set(row)
    report = json.loads(out.read_text())
    assert report["rules"][0]["instances_timed"][0]["shapes"] == "x=1x4x12x12"


@pytest.mark.parametrize("argv", [["--budget", "0"], ["--max-instances", "0"], ["--program", "no-such-program"],
                                  ["--groups", "no-such-group"], ["--groups", "decompositions", "x.rules"]])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from eqsat.cli import main

    assert main(["rules", "discover", "--no-probe", "--no-model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eqsat rules: error:") and "\n" not in err


@pytest.mark.slow
def test_the_decorator_fires_the_new_rules_on_a_pyramid_pool_and_stays_equal() -> None:
    """End to end (experiments/rule_discovery_e2e.py times it): the 5x5 and 7x7 average pools of a
    user's block are split by the default rules, and the result equals jax.jit's."""
    import jax
    import numpy as np

    import eqsat
    from experiments.rule_discovery_e2e import arguments, pyramid_pool

    args = arguments(0)
    fast = eqsat.optimize(pyramid_pool, check_speed=False, decision_cache=False)
    np.testing.assert_allclose(np.asarray(fast(*args)), np.asarray(jax.jit(pyramid_pool)(*args)), rtol=2e-4, atol=2e-4)
    fired = " ".join(name for seg in fast.report(*args).segments for name in seg.rules_fired)
    assert "poolavg-separable-5x5-s1-same" in fired and "poolavg-separable-7x7-s1-same" in fired


def test_a_two_output_merge_is_matched_on_a_pair_and_timed_with_its_split() -> None:
    from jax_backend.rule_discovery import graph_instances, time_instance

    b = GraphBuilder()
    a = b.input("a", (8, 16))
    g = b.build([b.matmul(a, b.weight("q", (16, 8))), b.matmul(a, b.weight("k", (16, 8)))])
    merge = [r for r in library_rules(["merges"]) if r.name == "matmul-merge-right"]
    (inst,) = graph_instances(merge, g, "qk")
    assert inst.describe() == "a=8x16 b=16x8 c=16x8"
    assert time_instance(inst, budget_s=0.1, rounds=8).agree


def test_instances_keep_their_dtype_and_computing_rules_skip_integers() -> None:
    from jax_backend.rule_discovery import graph_instances, time_instance

    rules = [_library("poolavg-separable-5x5-s1-same")]
    b = GraphBuilder()
    x = b.input("x", (1, 4, 12, 12), dtype="bfloat16")
    (inst,) = graph_instances(rules, b.build([b.poolavg(x, (5, 5), (1, 1))]), "bf16")
    assert inst.describe() == "x=1x4x12x12:bfloat16"
    assert time_instance(inst, budget_s=0.1, rounds=8).agree
    b = GraphBuilder()
    x = b.input("x", (1, 4, 12, 12), dtype="int32")
    g = b.build([b.transpose(b.transpose(x, (0, 2, 3, 1)), (0, 3, 1, 2))])
    moves = parse_rule_text("(transpose [0 3 1 2] (transpose [0 2 3 1] ?x)) => ?x", "t")  # any dtype
    computes = parse_rule_text("(transpose [0 3 1 2] (transpose [0 2 3 1] ?x)) => (relu ?x)", "t")  # floats only
    (inst,) = graph_instances(moves, g, "int")
    assert inst.describe() == "x=1x4x12x12:int32" and time_instance(inst, budget_s=0.1, rounds=8).agree
    assert graph_instances(computes, g, "int") == []

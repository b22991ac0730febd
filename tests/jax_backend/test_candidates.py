"""Region candidates: one per cost model, checked, and never lost to merges that add work."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from eqsat import candidates
from eqsat.ir import Graph, GraphBuilder
from eqsat.rulesets import select_rules
from eqsat.saturate import Limits


@dataclass(frozen=True)
class CallsAndWindows:
    """A deterministic model: every conv call costs 1 plus a little per output channel, a pool
    costs its window size; merged convs are cheap (one call) and so is a separable pool (3 + 3 < 9).
    The channel term makes a merge that computes one weight's products twice (the two-way merges
    merged again) dearer than the three-way merge: with calls alone the two tie, and which optimum
    the MIP returns then differs between HiGHS versions."""

    name: str = "calls"
    device: str = "cpu"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        if op == "conv2d":
            return 1.0 + 1e-3 * input_shapes[1][0]
        if op == "poolmax":
            return float(attrs["kernel_h"] * attrs["kernel_w"])
        return 0.0 if op in ("input", "weight", "concat", "slice", "split") else 0.01


def _convs_and_pool() -> Graph:
    b = GraphBuilder()
    x = b.input("x", (1, 6, 8, 8))
    convs = [b.relu(b.conv2d(x, b.weight(f"w{i}", (4, 6, 1, 1)))) for i in range(3)]
    pooled = b.poolmax(x, (3, 3), (1, 1))
    return b.build([*convs, pooled])


def test_merges_and_the_separable_pool_are_found() -> None:
    graph = _convs_and_pool()
    rules = list(select_rules(None, {n.op for n in graph.nodes}, trust_tested=True).trusted)  # merges, pools: tested
    found = candidates.region_candidates(graph, rules, Limits(iterations=6, multi_rounds=2), {"calls": CallsAndWindows()},
                                         time_limit=30)
    after = found.get("calls")
    assert sum(n.op == "conv2d" for n in after.nodes) < 3
    assert sorted((n.attr["kernel_h"], n.attr["kernel_w"]) for n in after.nodes if n.op == "poolmax") == [(1, 3), (3, 1)]


def test_an_extraction_that_adds_work_falls_back_to_the_single_output_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the merged extraction computes some products twice, the model's candidate comes from
    the e-graph of the single-output rules: the separable pool survives, the merges do not."""
    graph = _convs_and_pool()
    rules = list(select_rules(None, {n.op for n in graph.nodes}, trust_tested=True).trusted)  # merges, pools: tested
    from eqsat import pipeline

    real = pipeline.does_extra_work
    monkeypatch.setattr(pipeline, "does_extra_work",
                        lambda before, after, slack=1.01: real(before, after) or any(n.op == "concat" for n in after.nodes))
    found = candidates.region_candidates(graph, rules, Limits(iterations=6, multi_rounds=2), {"calls": CallsAndWindows()},
                                         time_limit=30)
    after = found.get("calls")
    assert after is not graph and not any(n.op == "concat" for n in after.nodes)
    assert sum(n.op == "conv2d" for n in after.nodes) == 3
    assert sorted((n.attr["kernel_h"], n.attr["kernel_w"]) for n in after.nodes if n.op == "poolmax") == [(1, 3), (3, 1)]

"""TASO's grouped-conv merge (`merge_gconv`, the `merge-gconv*` rules of `conv_merges`): the kernel
merge keeps a conv's values for any group count and join count, the rules verify (and the unguarded
one is refuted), a small ResNeXt block's grouped convs merge down to one group where a cost model
prices groups, and the h100 roofline, which counts the doubled flops, keeps the groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from eqsat import ops
from eqsat.cost import CostModel, cost_model
from eqsat.ir import Graph
from eqsat.pipeline import optimize_graph
from eqsat.rewrites import LIBRARY_DIR, library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted
from eqsat.saturate import Limits
from eqsat.models.tensat import resnext50
from merge_rules import bench_rules

MERGE_RULES = ("merge-gconv", "merge-gconv-relu", "merge-gconv-s2", "merge-gconv-relu-s2")


@pytest.mark.parametrize("groups, count, stride", [(2, 2, 1), (4, 2, 2), (8, 2, 1), (6, 3, 1), (8, 4, 2), (4, 1, 1)])
def test_merged_kernel_gives_the_same_conv(groups: int, count: int, stride: int) -> None:
    rng = np.random.default_rng(groups * 10 + count)
    cg, per_group = 2, 3
    x = rng.standard_normal((2, groups * cg, 7, 6)).astype(np.float32)
    w = rng.standard_normal((groups * per_group, cg, 3, 3)).astype(np.float32)
    conv = {"stride_h": stride, "stride_w": stride, "pad": 0, "act": 2}
    (merged,) = ops.evaluate("merge_gconv", [w], {"input_shape": x.shape, "count": count})
    assert merged.shape == (w.shape[0], cg * count, 3, 3)
    assert x.shape[1] // merged.shape[1] == groups // count
    (want,) = ops.evaluate("conv2d", [x, w], conv)
    (got,) = ops.evaluate("conv2d", [x, merged], conv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_merge_rules_verify_and_wrong_ones_are_refuted() -> None:
    rules = [r for r in library_rules(["conv_merges"]) if r.name in MERGE_RULES]
    assert sorted(r.name for r in rules) == sorted(MERGE_RULES)
    results = verify_rules(rules, all_shapes=False)
    assert all(is_trusted(res, trust_tested=True) for res in results), [(r.name, r.status, r.guarded_status) for r in results]
    # four groups joined in pairs: the merged conv keeps two groups, so which block each output
    # channel's kernel lands in matters (TASO's merge kernel places it by output-channel half)
    (four,) = parse_rule_text(next(line for line in _library_lines() if line.startswith("merge-gconv-relu:"))
                              + " (= (dim ?x 1) (* 4 (dim ?w 1)))", "test")
    (result,) = verify_rules([four], all_shapes=False)
    assert is_trusted(result, trust_tested=True) and all(s["x"][1] == 4 * s["w"][1] for s in result.shapes)
    wrong = [
        *parse_rule_text("no-guard: (conv2d 1 1 0 0 ?x ?w) => (conv2d 1 1 0 0 ?x (merge_gconv (shape ?x) 2 ?w))",
                         "test"),
        *parse_rule_text("act-changed: (conv2d 1 1 0 0 ?x ?w) => (conv2d 1 1 0 2 ?x (merge_gconv (shape ?x) 2 ?w)) "
                         "if (= (% (dim ?x 1) (* 2 (dim ?w 1))) 0)", "test"),
    ]
    results = verify_rules(wrong, all_shapes=False)
    assert [res.status for res in results] == ["refuted", "refuted"]
    assert results[1].guarded_status == "refuted"


def _library_lines() -> list[str]:
    return (LIBRARY_DIR / "conv_merges.rules").read_text().splitlines()


def _small_resnext(groups: int = 4) -> Graph:
    return resnext50(image=16, groups=groups, stages=((1, 8), (1, 16)))


def _groups_of_convs(graph: Graph) -> list[int]:
    live = graph.live()
    return sorted(live.shape(n.inputs[0])[1] // live.shape(n.inputs[1])[1]
                  for n in live.nodes if n.op == "conv2d")


class _GroupPenalty:
    """The h100 roofline plus a cost per group of a conv: a device whose grouped kernels run slowly
    (TASO measured cuDNN's on a V100), which the roofline does not see."""

    def __init__(self) -> None:
        self.base: CostModel = cost_model("roofline", device="h100")

    @property
    def name(self) -> str:
        return "roofline-group-penalty"

    @property
    def device(self) -> str:
        return "h100"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        extra = 1e-6 * (input_shapes[0][1] // input_shapes[1][1] - 1) if op == "conv2d" else 0.0
        return self.base.op_cost(op, attrs, input_shapes) + extra


@pytest.mark.slow  # ~40 s: verifies the conv merges cold, then saturates and extracts a ResNeXt block
def test_small_resnext_block_merges_its_grouped_convs_where_groups_cost() -> None:
    graph = _small_resnext()
    assert _groups_of_convs(graph).count(4) == 2  # one grouped 3x3 conv per block
    rules = bench_rules(graph)
    # its only stride-2 convs have a ReLU and no rule builds one without: merge-gconv-s2 can never match
    assert {r.name for r in rules} & set(MERGE_RULES) == set(MERGE_RULES) - {"merge-gconv-s2"}
    limits = Limits(nodes=20_000, seconds=60, multi_rounds=1)
    result = optimize_graph(graph, rules, limits, _GroupPenalty(), extractor="ilp", time_limit=30)
    fired = result.saturation.total_matches
    assert fired.get("merge-gconv-relu", 0) >= 1 and fired.get("merge-gconv-relu-s2", 0) >= 1
    assert result.numerics_ok and result.cost_after < result.cost_before
    assert _groups_of_convs(result.optimized) == [1] * len(_groups_of_convs(result.optimized))
    merges = [n for n in result.optimized.live().nodes if n.op == "merge_gconv"]
    assert len(merges) == 4 and all(n.attr["count"] == 2 for n in merges)  # 4 groups -> 2 -> 1, two blocks


@pytest.mark.slow  # ~17 s
def test_h100_roofline_keeps_the_groups() -> None:
    graph = _small_resnext()
    result = optimize_graph(graph, bench_rules(graph), Limits(nodes=20_000, seconds=60, multi_rounds=1),
                            cost_model("roofline", device="h100"), extractor="ilp", time_limit=30)
    assert result.saturation.total_matches.get("merge-gconv-relu", 0) >= 1
    assert not any(n.op == "merge_gconv" for n in result.optimized.live().nodes)
    assert result.cost_after <= result.cost_before

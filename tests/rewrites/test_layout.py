"""The layout group (`library/layout.rules`): every rule is proved for all shapes (the conv rules under
the applier's guard, as rank-4 convs), wrong permutations are rejected, and a conv-relu-conv chain
extracted under a cost model where NHWC convs are cheaper runs NHWC with one transpose at each end."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from eqsat import ops
from eqsat.ir import GraphBuilder
from eqsat.pipeline import optimize_graph
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted, named_rules
from eqsat.saturate import Limits


def test_every_layout_rule_is_proved_for_all_shapes() -> None:
    rules = library_rules(["layout"])
    results = verify_rules(rules, all_shapes=True)
    assert len(rules) >= 16
    for rule, res in zip(rules, results):
        assert is_trusted(res), (rule.name, res.verdict, res.guarded_verdict)
        proved = res.verdict == "proved" or res.guarded_verdict == "proved"
        assert proved and "all shapes" in (res.scope + res.guarded_scope), (rule.name, res.scope, res.guarded_scope)
    assert {r.name for r in rules} <= {r.name for r in named_rules("layout")}
    assert not {r.name for r in rules} & {r.name for r in named_rules("default")}


def test_wrong_permutations_are_rejected() -> None:
    wrong = [r for line in (
        "not-inverse: (transpose [0 2 3 1] (transpose [0 2 3 1] ?x)) => ?x",
        "kernel-as-HWOI: (conv2d 1 1 0 0 ?x ?w) => (transpose [0 3 1 2] "
        "(conv2d_nhwc 1 1 0 0 (transpose [0 2 3 1] ?x) (transpose [2 3 0 1] ?w)))",
        "output-not-back: (conv2d 1 1 0 0 ?x ?w) => (transpose [0 2 3 1] "
        "(conv2d_nhwc 1 1 0 0 (transpose [0 2 3 1] ?x) (transpose [2 3 1 0] ?w)))",
        "concat-wrong-axis: (transpose [0 2 3 1] (concat 1 4 ?a ?b)) => "
        "(concat 2 4 (transpose [0 2 3 1] ?a) (transpose [0 2 3 1] ?b))") for r in parse_rule_text(line, "test")]
    results = verify_rules(wrong, all_shapes=True)
    assert not any(is_trusted(res, trust_tested=True) for res in results), \
        [(r.name, r.status, r.guarded_status) for r in results]
    assert all("refuted" in (r.status, r.guarded_status) for r in results)


class _NhwcCheaper:
    """A device where an NHWC conv costs a tenth of an NCHW one and a transpose costs as much as the
    NHWC conv: moving one chain of convs to NHWC pays, a transpose per conv would not."""

    @property
    def name(self) -> str:
        return "nhwc-cheaper"

    @property
    def device(self) -> str:
        return "cpu"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        spec = ops.op_spec(op)
        if spec.is_leaf or spec.is_view:
            return 0.0
        return {"conv2d": 10.0, "conv2d_nhwc": 1.0, "transpose": 1.0}.get(op, 0.1)


def test_conv_chain_runs_nhwc_with_one_transpose_at_each_end() -> None:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.relu(b.conv2d(x, b.weight("w1", (6, 4, 3, 3))))
    y = b.conv2d(y, b.weight("w2", (6, 3, 3, 3)), act=ops.Activation.RELU)  # two groups
    y = b.conv2d(b.relu(y), b.weight("w3", (5, 6, 1, 1)), stride=(2, 2))
    graph = b.build([y])
    result = optimize_graph(graph, library_rules(["layout"]), Limits(nodes=5_000, seconds=30), _NhwcCheaper(),
                            extractor="ilp", time_limit=30)
    assert result.numerics_ok and result.cost_after < result.cost_before
    live = result.optimized.live()
    assert [n.op for n in live.nodes].count("conv2d_nhwc") == 3 and "conv2d" not in live.op_counts()
    moved = [n.attr["perm"] for n in live.nodes if n.op == "transpose"
             and live.nodes[n.inputs[0].node].op != "weight"]  # kernels are transposed once, at load time
    assert sorted(moved) == sorted([ops.NHWC_IN, ops.NHWC_OUT])


def _conv_chain() -> Any:
    b = GraphBuilder()
    x = b.input("x", (1, 8, 16, 16))
    y = b.relu(b.conv2d(x, b.weight("w1", (16, 8, 3, 3))))
    y = b.conv2d(y, b.weight("w2", (16, 16, 3, 3)), act=ops.Activation.RELU)
    y = b.conv2d(b.relu(y), b.weight("w3", (8, 16, 1, 1)), stride=(2, 2))
    return b.build([y])


def test_an_nchw_conv_is_priced_as_its_nhwc_form_and_two_transposes() -> None:
    from eqsat.cost import cost_model
    from eqsat.layout_phase import NchwPaysTransposes

    base = cost_model("roofline", device="h100")
    model = NchwPaysTransposes(base)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 1, "act": 0}
    x, w = (1, 8, 16, 16), (16, 8, 3, 3)
    nhwc = base.op_cost("conv2d_nhwc", attrs, [(1, 16, 16, 8), (3, 3, 8, 16)])
    t_in = base.op_cost("transpose", {"perm": list(ops.NHWC_IN)}, [x])
    (out,) = ops.infer_shapes("conv2d_nhwc", [(1, 16, 16, 8), (3, 3, 8, 16)], attrs)
    t_out = base.op_cost("transpose", {"perm": list(ops.NHWC_OUT)}, [out])
    assert t_in > 0 and t_out > 0
    assert model.op_cost("conv2d", attrs, [x, w]) == pytest.approx(nhwc + t_in + t_out, rel=1e-12)
    assert model.op_cost("relu", {}, [x]) == base.op_cost("relu", {}, [x])  # other ops as the base prices them
    assert model.name == "roofline+nchw-transposes" and model.device == "h100"


def test_the_late_layout_phase_runs_a_conv_chain_nhwc_with_one_transpose_at_each_end() -> None:
    from eqsat.compare import outputs_agree
    from eqsat.layout_phase import nhwc_plan

    graph = _conv_chain()
    plan, seconds = nhwc_plan(graph, "cpu")
    assert plan is not None and seconds > 0
    live = plan.live()
    assert live.op_counts().get("conv2d_nhwc") == 3 and "conv2d" not in live.op_counts()
    moved = [n.attr["perm"] for n in live.nodes if n.op == "transpose" and live.nodes[n.inputs[0].node].op != "weight"]
    assert sorted(moved) == sorted([ops.NHWC_IN, ops.NHWC_OUT])
    inputs = graph.random_inputs(0)
    assert outputs_agree(graph.evaluate(inputs, widen=True), plan.evaluate(inputs), rtol=1e-4, atol=1e-5).ok


def test_the_late_layout_phase_has_nothing_to_say_without_convs() -> None:
    from eqsat.layout_phase import nhwc_plan

    b = GraphBuilder()
    x = b.input("x", (4, 8))
    plan, _ = nhwc_plan(b.build([b.relu(b.matmul(x, b.weight("w", (8, 8))))]), "cpu")
    assert plan is None


def test_eqsat_optimize_times_the_layout_plan_beside_the_extractors_answer() -> None:
    from eqsat.commands.optimize import LAYOUT, OptimizeOptions, check_candidates, optimize_and_judge
    from eqsat.cost import cost_model

    assert LAYOUT in OptimizeOptions().candidates and check_candidates([LAYOUT]) == (LAYOUT,)
    graph = _conv_chain()
    costs = cost_model("roofline", device="cpu")
    judged = optimize_and_judge(graph, [], Limits(nodes=1_000, seconds=10), costs, candidates=(LAYOUT,), rounds=5,
                                budget_s=0.0)
    names = [name for name, _ in judged.plans]
    assert names[1:] == [LAYOUT] and 0 < judged.layout_s <= judged.candidates_s
    assert all(c.numerics_ok for c in judged.judgement.checks)  # run through JAX against the original
    assert dict(judged.plans)[LAYOUT].live().op_counts().get("conv2d_nhwc") == 3
    assert judged.fields(costs)["layout_s"] == judged.layout_s  # reported by `eqsat optimize --json`


def test_the_layout_phase_also_runs_on_the_original_when_the_extractor_changed_it() -> None:
    from eqsat.commands.optimize import LAYOUT, LAYOUT_ORIGINAL, optimize_and_judge
    from eqsat.candidates import program_key
    from eqsat.cost import cost_model
    from eqsat.rulesets import XLA_GROUPS

    b = GraphBuilder()  # the conv chain, and two products of one input the extractor merges
    x, v = b.input("x", (1, 8, 16, 16)), b.input("v", (64, 64))
    y = b.relu(b.conv2d(x, b.weight("w1", (16, 8, 3, 3))))
    y = b.conv2d(b.relu(b.conv2d(y, b.weight("w2", (16, 16, 3, 3)))), b.weight("w3", (8, 16, 1, 1)))
    graph = b.build([y, b.matmul(v, b.weight("u1", (64, 64))), b.matmul(v, b.weight("u2", (64, 64)))])
    rules = [r for r in library_rules(XLA_GROUPS) if r.name == "matmul-merge-right"]
    judged = optimize_and_judge(graph, rules, Limits(nodes=1_000, seconds=10), cost_model("roofline", device="cpu"),
                                candidates=(LAYOUT,), rounds=5, budget_s=0.0)
    plans = dict(judged.plans)
    assert [name for name, _ in judged.plans][1:] == [LAYOUT, LAYOUT_ORIGINAL]
    assert program_key(judged.result.optimized) != program_key(graph)  # the products were merged
    assert plans[LAYOUT].live().op_counts()["matmul"] == 1 and plans[LAYOUT_ORIGINAL].live().op_counts()["matmul"] == 2
    assert all(p.live().op_counts().get("conv2d_nhwc") == 3 for p in (plans[LAYOUT], plans[LAYOUT_ORIGINAL]))
    assert all(c.numerics_ok for c in judged.judgement.checks)


def test_the_search_skips_its_numpy_check_only_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """`check=False` (the late layout phase, whose plans `judge_plans` checks through JAX): no numpy check."""
    import eqsat.pipeline
    from eqsat.cost import cost_model

    calls: list[int] = []

    def counting(a: Any, b: Any, seed: int = 0) -> tuple[bool, float]:
        calls.append(seed)
        return True, 0.0

    monkeypatch.setattr(eqsat.pipeline, "numerics_match", counting)
    graph, rules = _conv_chain(), library_rules(["layout"])
    for check in (False, True):
        eqsat.pipeline.optimize_graph(graph, rules, Limits(nodes=1_000, seconds=10), cost_model("roofline", device="cpu"),
                                      extractor="greedy-dag", check=check)
        assert bool(calls) == check


def test_the_layout_phase_extracts_under_the_xla_model_itself() -> None:
    """One pricing of a transpose: under the xla model the late layout phase prices an NCHW conv as the
    search did (its NHWC form, its weight's and its input's transposes), not under the roofline's
    stand-in; under any other model it uses `NchwPaysTransposes`."""
    from eqsat.cost import cost_model
    from eqsat.layout_phase import NchwPaysTransposes, layout_costs, nhwc_plan
    from eqsat.xla_cost import Calibration, Curve, XlaModel

    cal = Calibration("m", "cpu-test", launch_s=5e-6, bandwidth=10e9, loop_flops=5e9,
                      matmul=Curve((1e3, 1e9), (1e-5, 2e-2)), conv=Curve((1e3, 1e9), (2e-5, 3e-2)),
                      copy_s=1e-6, transpose_bandwidth=1e8)  # dear transposes: the NHWC chain pays
    xla = XlaModel(cal)
    assert layout_costs("cpu", xla) is xla
    assert isinstance(layout_costs("cpu", cost_model("roofline", device="cpu")), NchwPaysTransposes)
    assert isinstance(layout_costs("cpu"), NchwPaysTransposes)
    plan, _ = nhwc_plan(_conv_chain(), "cpu", costs=xla)
    assert plan is not None
    assert plan.live().op_counts().get("conv2d_nhwc") == 3 and "conv2d" not in plan.live().op_counts()
    assert xla.price_graph(plan) < xla.price_graph(_conv_chain())

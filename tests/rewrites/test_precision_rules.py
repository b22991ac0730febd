"""The precision rules (a bfloat16 matmul as the float32 product of converted operands, and the
elementwise lifts): the rule language's dtype literals and `(dtype ?x NAME)` condition, the verifier's conversions
(the identity between float dtypes, nothing for integer targets), the e-graph firing only on the
named dtype, and a dtype-aware cost model extracting the rewrite, checked equal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from eqsat import ops
from eqsat.cost import graph_cost, typed_op_cost
from eqsat.egraph import TensorEGraph
from eqsat.errors import RuleParseError
from eqsat.ir import Graph, GraphBuilder
from eqsat.pipeline import numerics_match, search
from eqsat.rewrites import library_rules
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import DTYPE_CONDITION
from eqsat.rewrites.to_egglog import to_egglog
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import XLA_GROUPS, dtype_scope, trusted_rules
from eqsat.saturate import Limits, saturate

BF16_RULE = ("m: (matmul 0 ?a ?b) => (convert_element_type bfloat16 (matmul 0 (convert_element_type float32 ?a) "
             "(convert_element_type float32 ?b))) if (dtype ?a bfloat16)")


def _matmul_graph(dtype: str, m: int = 8, k: int = 16, n: int = 4) -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (m, k), dtype), b.weight("w", (k, n), dtype)
    return b.build([b.relu(b.matmul(x, w))])


def _fires(graph: Graph, text: str = BF16_RULE) -> tuple[int, TensorEGraph]:
    egraph = TensorEGraph.from_graph(graph)
    report = saturate(egraph, parse_rule_text(text), Limits(iterations=6, seconds=30))
    return sum(report.total_matches.values()), egraph


# --- the rule language ----------------------------------------------------------------------------

def test_dtype_literals_and_the_dtype_condition_parse_and_print_back() -> None:
    rule = parse_rule_text(BF16_RULE)[0]
    assert rule.conditions[0].op == DTYPE_CONDITION and rule.conditions[0].attr == {"dtype": "bfloat16"}
    assert parse_rule_text(rule_text(rule))[0] == rule
    assert '(= (dtype v_a) "bfloat16")' in to_egglog(rule, "rs")[0].text
    assert dtype_scope(rule) == "float"


@pytest.mark.parametrize("text", [
    "m: (matmul 0 ?a ?b) => (convert_element_type bf17 (matmul 0 ?a ?b))",  # not a dtype
    "m: (matmul 0 ?a ?b) => (convert_element_type ?d (matmul 0 ?a ?b))",  # no dtype variables
    "m: (matmul 0 ?a ?b) => (matmul 0 ?a ?b) if (dtype ?z bfloat16)",  # ?z not bound on the left
    "m: (matmul 0 ?a ?b) => (matmul 0 ?a ?b) if (dtype ?a)",  # no dtype
    "m: (matmul 0 ?a ?b) => (matmul 0 ?a ?b) if (dtype ?a float8)",  # not an IR dtype
    "m: (matmul 0 ?a ?b) => (matmul 0 ?a ?b) if (= (dtype ?a bfloat16) 1)",  # only at the top level
])
def test_bad_dtype_spellings_are_one_parse_error(text: str) -> None:
    with pytest.raises(RuleParseError):
        parse_rule_text(text)


# --- the verifier ---------------------------------------------------------------------------------

def test_the_library_precision_rules_are_proved_for_every_shape() -> None:
    rules = library_rules(["precision"])
    assert {r.name for r in rules} == {"matmul-bf16-via-f32", "ewadd-bf16-via-f32",
                                       "ewmul-bf16-via-f32", "tanh-bf16-via-f32", "f32-bf16-round-trip"}
    results = verify_rules(rules, all_shapes=True)
    assert all(r.verdict == "proved" and r.scope == "all shapes" for r in results), results
    assert all("z3 over symbolic dims" in r.method for r in results)  # a proof, not a test on shapes
    assert trusted_rules(rules) == rules
    assert "precision" in XLA_GROUPS  # the decorator's default groups


def test_a_wrong_rule_through_float32_is_refuted() -> None:
    wrong = parse_rule_text("w: (ewadd ?a ?b) => (convert_element_type bfloat16 (ewmul (convert_element_type float32 ?a) "
                            "(convert_element_type float32 ?b))) if (dtype ?a bfloat16)")
    assert verify_rules(wrong, all_shapes=True)[0].verdict == "refuted"


def test_a_conversion_to_an_integer_is_never_the_identity() -> None:
    rounding = parse_rule_text("r: (relu ?x) => (convert_element_type float32 (convert_element_type int32 (relu ?x)))")
    result = verify_rules(rounding, all_shapes=True)[0]
    assert result.verdict != "proved"
    assert trusted_rules(rounding) == []


# --- the e-graph ----------------------------------------------------------------------------------

def test_lifted_elementwise_chains_run_in_float32_and_round_once() -> None:
    b = GraphBuilder()
    x, y = b.input("x", (8, 16), "bfloat16"), b.input("y", (8, 16), "bfloat16")
    graph = b.build([b.apply("tanh", [b.ewadd(b.ewmul(x, y), y)])[0]])
    rules = library_rules(["precision"])
    found = search(graph, rules, Limits(iterations=8, seconds=30), {"m": _SlowLowPrecision(elementwise=True)},
                   "greedy-dag", 10)
    out = found.by_model["m"].graph
    assert out.op_counts().get("convert_element_type") == 3, out.op_counts()  # x, y up; the result down
    assert {out.dtype(v) for n in out.nodes if n.op in ("ewadd", "ewmul", "tanh") for v in n.inputs} == {"float32"}
    assert found.by_model["m"].numerics_ok


def test_the_rule_fires_on_bfloat16_only_and_saturates() -> None:
    fired, egraph = _fires(_matmul_graph("bfloat16"))
    assert fired == 1  # the float32 product it builds does not match again
    assert _fires(_matmul_graph("float32"))[0] == 0
    assert _fires(_matmul_graph("float16"))[0] == 0
    assert _fires(_matmul_graph("float16"), BF16_RULE.replace("bfloat16", "float16"))[0] == 1


@dataclass(frozen=True)
class _SlowLowPrecision:
    """Flops, with a bfloat16 / float16 matmul three times dearer (as XLA:CPU runs it) and
    conversions nearly free (fused)."""

    name: str = "slow-bf16"
    device: str = "cpu"
    elementwise: bool = False  # elementwise ops in bfloat16 dearer too

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        return 1e-9 + ops.flops(op, [tuple(s) for s in input_shapes], attrs) * 1e-9

    def op_cost_typed(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]],
                      input_dtypes: Sequence[str]) -> float:
        base = self.op_cost(op, attrs, input_shapes)
        if op == "convert_element_type":
            return 1e-12
        low = input_dtypes[0] in ("bfloat16", "float16")
        return 3 * base if low and (op == "matmul" or self.elementwise) else base


def test_typed_costs_go_to_models_that_take_dtypes() -> None:
    model = _SlowLowPrecision()
    shapes = [(8, 16), (16, 4)]
    assert typed_op_cost(model, "matmul", {"act": 0}, shapes, ["bfloat16"] * 2) == pytest.approx(
        3 * model.op_cost("matmul", {"act": 0}, shapes))
    assert typed_op_cost(model, "matmul", {"act": 0}, shapes, ["float32"] * 2) == model.op_cost("matmul", {"act": 0}, shapes)
    bf16 = _matmul_graph("bfloat16", 64, 64, 64)
    assert graph_cost(bf16, model, fold_weights=False) > graph_cost(_matmul_graph("float32", 64, 64, 64), model,
                                                                   fold_weights=False)


def test_a_dtype_aware_model_extracts_the_float32_product_and_it_checks_equal() -> None:
    graph = _matmul_graph("bfloat16", 64, 64, 64)
    found = search(graph, parse_rule_text(BF16_RULE), Limits(iterations=4, seconds=30), {"m": _SlowLowPrecision()},
                   "greedy-dag", 10)
    extraction = found.by_model["m"]
    counts = extraction.graph.op_counts()
    assert counts.get("convert_element_type") == 3 and counts["matmul"] == 1, counts
    assert extraction.numerics_ok
    assert [extraction.graph.dtype(v) for v in extraction.graph.outputs] == ["bfloat16"]
    assert numerics_match(graph, extraction.graph)[0]
    # the check widens conversions away (the reals), yet still tells a wrong product apart
    b = GraphBuilder()
    x, w = b.input("x", (64, 64), "bfloat16"), b.weight("w", (64, 64), "bfloat16")
    up = [b.apply("convert_element_type", [t], {"dtype": "float32"})[0] for t in (x, w)]
    swapped = b.build([b.relu(b.apply("convert_element_type", [b.matmul(up[1], up[0])], {"dtype": "bfloat16"})[0])])
    assert not numerics_match(graph, swapped)[0]


def test_without_widening_the_interpreter_rounds_to_the_target_dtype() -> None:
    b = GraphBuilder()
    x = b.input("x", (4,), "float32")
    g = b.build([b.apply("convert_element_type", [x], {"dtype": "bfloat16"})[0]])
    value = np.array([1.0 + 2 ** -12] * 4)
    assert g.evaluate({"x": value})[0].dtype == ops.numpy_dtype("bfloat16")
    assert g.evaluate({"x": value}, widen=True)[0][0] == value[0]

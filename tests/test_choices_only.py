"""A cost model that times each op (`times_ops`: the measured model) is asked, in the decorator's
search (`price_choices_only`), only for the ops an extraction's choice depends on: an op every
extraction contains is never priced, and the extracted graph is the one full pricing gives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eqsat.candidates import structure_key
from eqsat.cost import cost_model
from eqsat.ir import Graph, GraphBuilder
from eqsat.pipeline import fixed_op_keys, op_key, search
from eqsat.rulesets import XLA_GROUPS, library_rules
from eqsat.saturate import Limits
from eqsat.egraph import TensorEGraph
from eqsat.rewrites.to_egglog import rule_ops

RULES = [r for r in library_rules(XLA_GROUPS) if r.name == "matmul-merge-right"]


@dataclass
class Counting:
    """The roofline's prices, each op asked for recorded; `times_ops` as the measured model."""

    times_ops: bool = True
    asked: list[str] = field(default_factory=list)
    name: str = "counting"
    device: str = "cpu-nominal"

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[tuple[int, ...]]) -> float:
        self.asked.append(op)
        return cost_model("roofline", "cpu-nominal").op_cost(op, attrs, input_shapes)


def _two_projections() -> Graph:
    """x @ w1 and x @ w2 (merged into one matmul by the rule), each through its own tanh and relu."""
    b = GraphBuilder()
    x = b.input("x", (64, 32))
    w1, w2 = b.weight("w1", (32, 48)), b.weight("w2", (32, 48))
    return b.build([b.relu(b.tanh(b.matmul(x, w1))), b.relu(b.tanh(b.matmul(x, w2)))])


def _limits() -> Limits:
    return Limits(iterations=4, nodes=5000, seconds=20)


def test_ops_common_to_every_choice_are_not_priced_and_the_choice_is_the_same() -> None:
    graph = _two_projections()
    full, choices = Counting(), Counting()
    everything = search(graph, RULES, _limits(), {"m": full}, "ilp", 30)
    only = search(graph, RULES, _limits(), {"m": choices}, "ilp", 30, price_choices_only=True)
    assert {"tanh", "relu", "matmul"} <= set(full.asked)
    assert "tanh" not in choices.asked and "relu" not in choices.asked  # in every extraction: cancels out
    assert "matmul" in choices.asked  # two matmuls or one merged: the choice depends on it
    assert structure_key(only.by_model["m"].graph) == structure_key(everything.by_model["m"].graph)
    assert only.by_model["m"].numerics_ok


def test_a_model_that_does_not_time_ops_is_priced_in_full() -> None:
    graph = _two_projections()
    model = Counting(times_ops=False)
    search(graph, RULES, _limits(), {"m": model}, "ilp", 30, price_choices_only=True)
    assert "tanh" in model.asked and "relu" in model.asked


def test_fixed_keys_leave_out_an_op_shape_that_also_has_alternatives() -> None:
    """An op shape priced 0 must be fixed everywhere it occurs: one occurrence among
    alternatives keeps it priced."""
    egraph = TensorEGraph.from_graph(_two_projections(), rule_ops(RULES))
    from eqsat.pipeline import _Free  # the structure-only serialization

    fixed = fixed_op_keys(egraph.serialize(_Free()))
    assert op_key("tanh", {}, [(64, 48)]) in fixed and op_key("relu", {}, [(64, 48)]) in fixed
    assert any(k[0] == "matmul" for k in fixed)  # no rule ran: nothing has an alternative
    from eqsat.saturate import saturate

    saturate(egraph, RULES, _limits())
    fixed = fixed_op_keys(egraph.serialize(_Free()))
    assert not any(k[0] == "matmul" for k in fixed)

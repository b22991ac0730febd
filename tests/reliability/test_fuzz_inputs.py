"""Fuzzing the three input languages (E-graph JSON, Graph JSON / TASO .model, rule files): every
input ends in a result or one EqsatError; never another exception, never a hang, never a wrong
answer (extractions are checked against brute force, graphs and rules round-trip).

Bounded and derandomized, so the default suite stays fast and reproducible; set
EQSAT_FUZZ_EXAMPLES (default 40) to run many more examples of the same properties.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqsat import ops
from eqsat.errors import EqsatError, ExtractionError
from eqsat.extract import EGraphData, check_selection, load_egraph
from eqsat.extract.registry import EXTRACTORS, extract
from eqsat.extract.selection import Status
from eqsat.ir import Graph
from eqsat.rewrites.parser import parse_rule_text, parse_rules
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import variables
from eqsat.taso import load_taso_model

EXAMPLES = int(os.environ.get("EQSAT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


def _mutate(data: Any, draw: st.DrawFn) -> Any:
    """Replace one value somewhere inside `data` (a JSON tree) by an arbitrary JSON value."""
    if not isinstance(data, (dict, list)) or not data or draw(st.integers(0, 3)) == 0:
        return draw(json_values)
    keys = list(data) if isinstance(data, dict) else list(range(len(data)))
    key = draw(st.sampled_from(keys))
    out = dict(data) if isinstance(data, dict) else list(data)
    out[key] = _mutate(data[key], draw)  # type: ignore[index]
    return out


# --- E-graph JSON --------------------------------------------------------------------------------

@st.composite
def egraph_dicts(draw: st.DrawFn, costs: st.SearchStrategy[float] = st.integers(0, 9) | st.floats(0, 10, allow_nan=False)
                 ) -> dict[str, Any]:
    """Small random e-graphs (cycles included) with node costs drawn from `costs`."""
    n_classes = draw(st.integers(1, 5))
    nodes: dict[str, Any] = {}
    for c in range(n_classes):
        for i in range(draw(st.integers(1, 3))):
            kids = draw(st.lists(st.integers(0, n_classes - 1), max_size=3))
            cost = draw(costs)
            nodes[f"{c}.{i}"] = {"op": f"f{i}", "cost": cost, "eclass": str(c),
                                 "children": [f"{k}.0" for k in kids]}
    roots = draw(st.lists(st.integers(0, n_classes - 1), min_size=1, max_size=2))
    return {"nodes": nodes, "root_eclasses": [str(r) for r in roots]}


def _brute_force(eg: EGraphData) -> float | None:
    best: float | None = None
    for combo in itertools.product(*(eg.nodes_of(c).tolist() for c in range(eg.n_classes))):
        choice = np.asarray(combo)
        if check_selection(eg, choice):
            continue
        seen, stack = set(), eg.roots.tolist()
        while stack:
            c = stack.pop()
            if c not in seen:
                seen.add(c)
                stack.extend(eg.unique_children[choice[c]])
        cost = float(sum(eg.cost[choice[c]] for c in seen))
        best = cost if best is None or cost < best else best
    return best


@FUZZ
@given(egraph_dicts())
def test_every_extractor_on_random_egraphs_is_valid_and_never_beats_the_optimum(data: dict[str, Any]) -> None:
    eg = load_egraph(data)
    best = _brute_force(eg)
    for name in EXTRACTORS:
        check_against_optimum(eg, name, best)


def check_against_optimum(eg: EGraphData, name: str, best: float | None) -> None:
    """Strategy `name` on `eg`: nothing only where nothing is possible, else a valid selection
    never cheaper than the brute-force optimum `best`, equal to it when reported optimal, and a
    lower bound (if any) no higher."""
    try:
        sel = extract(eg, name, 5.0)
    except ExtractionError:
        assert best is None, f"{name} found nothing, but {best} is possible"
        return
    assert best is not None
    assert not check_selection(eg, sel)
    assert sel.dag_cost >= best - 1e-9
    if sel.status == Status.OPTIMAL:
        assert math.isclose(sel.dag_cost, best, rel_tol=1e-6, abs_tol=1e-9), (name, sel.dag_cost, best)
    if sel.lower_bound is not None:
        assert sel.lower_bound <= best + 1e-6


@FUZZ
@given(st.data())
def test_mutated_egraph_json_loads_or_is_one_error(data: st.DataObject) -> None:
    doc = _mutate(data.draw(egraph_dicts()), data.draw)
    try:
        eg = load_egraph(json.dumps(doc))
    except EqsatError:
        return
    try:
        sel = extract(eg, "greedy-dag", 5.0)
    except ExtractionError:
        return
    assert not check_selection(eg, sel)


@FUZZ
@given(json_values)
def test_arbitrary_json_as_an_egraph_is_one_error(doc: Any) -> None:
    with pytest.raises(EqsatError):
        load_egraph(json.dumps(doc) if isinstance(doc, (dict, list)) else {"nodes": doc})


# --- Graph JSON and TASO .model ----------------------------------------------------------------

_OPS = sorted(n for n, s in ops.OPS.items() if not s.is_leaf)
_attr_values = st.integers(-2, 4) | st.lists(st.integers(-1, 4), max_size=4) | st.floats(-2, 2) | st.text(max_size=3)


@st.composite
def graph_dicts(draw: st.DrawFn) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        nodes.append({"op": "input", "attrs": {"name": f"x{i}", "shape": draw(st.lists(st.integers(1, 4), min_size=1,
                                                                                         max_size=3))}})
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(_OPS))
        spec = ops.OPS[op]
        attrs = {a.name: draw(_attr_values) for a in spec.attrs if a.default is None or draw(st.booleans())}
        arity = spec.arity if spec.arity is not None else draw(st.integers(1, 3))
        inputs = [[draw(st.integers(0, len(nodes) - 1)), 0] for _ in range(arity)]
        nodes.append({"op": op, "attrs": attrs, "inputs": inputs})
    return {"nodes": nodes, "outputs": [[len(nodes) - 1, 0]]}


def _check_graph(graph: Graph) -> None:
    assert Graph.from_json(json.loads(json.dumps(graph.to_json()))) == graph
    inputs = graph.random_inputs(0, dtype=np.float64)
    with np.errstate(all="ignore"):
        outputs = graph.evaluate(inputs)
    assert [o.shape for o in outputs] == [graph.shape(v) for v in graph.outputs]


@FUZZ
@given(graph_dicts())
def test_random_graph_json_is_a_checked_graph_or_one_error(doc: dict[str, Any]) -> None:
    try:
        graph = Graph.from_json(doc)
    except EqsatError:
        return
    _check_graph(graph)


@FUZZ
@given(st.data())
def test_mutated_graph_json_is_a_checked_graph_or_one_error(data: st.DataObject) -> None:
    doc = _mutate(data.draw(graph_dicts()), data.draw)
    try:
        graph = Graph.from_json(doc) if isinstance(doc, dict) else Graph.from_json({"nodes": doc})
    except EqsatError:
        return
    _check_graph(graph)


BTS = Path(os.environ.get("EQSAT_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data") / "tensat" / "models" / "bts.model"
_taso_lines = st.lists(st.integers(-2, 1100).map(str), min_size=0, max_size=4).map(",".join) | st.text(
    alphabet="0123456789,:- \t", max_size=12)


@FUZZ
@given(st.lists(_taso_lines, max_size=16))
def test_random_taso_text_is_a_graph_or_one_error(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    path = tmp_path_factory.mktemp("taso") / "random.model"
    path.write_text("\n".join(lines) + "\n")
    try:
        graph = load_taso_model(path)
    except EqsatError:
        return
    _check_graph(graph)


@pytest.mark.skipif(not BTS.exists(), reason="shared TASO models not found (set EQSAT_DATA)")
@FUZZ
@given(st.data())
def test_edited_taso_model_is_a_graph_or_one_error(tmp_path_factory: pytest.TempPathFactory,
                                                   data: st.DataObject) -> None:
    lines = BTS.read_text().splitlines()[:80]  # the first twenty ops
    for _ in range(data.draw(st.integers(1, 3))):
        lines[data.draw(st.integers(0, len(lines) - 1))] = data.draw(_taso_lines)
    path = tmp_path_factory.mktemp("taso") / "edited.model"
    path.write_text("\n".join(lines) + "\n")
    try:
        graph = load_taso_model(path)
    except EqsatError:
        return
    assert graph.nodes


# --- rule files --------------------------------------------------------------------------------

_RULE_TOKENS = ["(", ")", "(", ")", "[", "]", "?x", "?y", "?z", "?S", "0", "1", "2", "-1", "ewadd", "ewmul",
                "matmul", "relu", "transpose", "concat", "split", "split_0", "(split", "=>", "<=>", ";", "if",
                "(=", "(dim", "(rank", "(<", "(+", "(shape", "r:", ":", "#", "é", "\t"]


@FUZZ
@given(st.lists(st.lists(st.sampled_from(_RULE_TOKENS), max_size=24).map(" ".join), max_size=4), st.booleans())
def test_token_soup_rule_files_parse_or_are_one_error(lines: list[str], multi: bool) -> None:
    try:
        rules = parse_rules(lines, "fuzz.rules", multi=multi)
    except EqsatError:
        return
    _check_rules(rules)


_well_formed_rules = st.sampled_from([
    "(ewadd ?x ?y) => (ewadd ?y ?x)",
    "(matmul 0 ?x ?y) => (transpose [1 0] (matmul 0 (transpose [1 0] ?y) (transpose [1 0] ?x)))",
    "(relu (relu ?x)) <=> (relu ?x)",
    "(ewmul ?x ?y) => (ewmul ?y ?x) if (= (dim ?x 0) (dim ?y 0))",
    "(concat 1 2 ?x ?y) => (concat 1 2 ?x ?y) if (<= (rank ?x) 2) (= (dim ?x 0) (dim ?y 0))",
])


@FUZZ
@given(_well_formed_rules, st.data())
def test_edited_rules_parse_completely_or_are_one_error(line: str, data: st.DataObject) -> None:
    """Deleting or inserting a few characters (a truncated condition, a stray paren) never loses
    part of a rule silently."""
    text = line
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        if data.draw(st.booleans()) and i < len(text):
            text = text[:i] + text[i + 1:]
        else:
            text = text[:i] + data.draw(st.sampled_from(list("()[] ?x01;="))) + text[i:]
    try:
        rules = parse_rule_text(text)
    except EqsatError:
        return
    _check_rules(rules)
    if " if " in text:
        assert all(r.conditions for r in rules), f"{text!r} lost its conditions"


def _check_rules(rules: list[Any]) -> None:
    for rule in rules:
        bound = {v for p in rule.lhs for v in variables(p)}
        assert {v for c in rule.conditions for v in variables(c)} <= bound, rule
        (again,) = parse_rule_text(rule_text(rule))
        assert (again.lhs, again.rhs, again.conditions) == (rule.lhs, rule.rhs, rule.conditions)

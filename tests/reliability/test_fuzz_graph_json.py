"""Fuzzing the Graph JSON checks of the second probe round and extraction under negative costs:
a node reference is a pair of integers or the file is refused; no integer or tensor past
`eqsat.ir.MAX_ELEMENTS` gets through to egglog; an unknown format version is refused; the exact
ILPs match brute force on e-graphs with negative costs, and the other strategies refuse them.

Bounded and derandomized like tests/reliability/test_fuzz_inputs.py: EQSAT_FUZZ_EXAMPLES (default
40) sets the examples per property; the issue's target is

    EQSAT_FUZZ_EXAMPLES=400 python -m pytest -q tests/reliability/test_fuzz_graph_json.py
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqsat.errors import EqsatError, ExtractionError, GraphFormatError
from eqsat.extract import load_egraph
from eqsat.extract.registry import EXTRACTORS, extract
from eqsat.ir import GRAPH_FORMAT, MAX_ELEMENTS, Graph
from .test_fuzz_inputs import _brute_force, check_against_optimum, egraph_dicts

EXAMPLES = int(os.environ.get("EQSAT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _base() -> dict[str, Any]:
    """x (4x8) and w (8x8); matmul(x, w); relu; ewadd(matmul, relu)."""
    return {"format": GRAPH_FORMAT, "nodes": [
        {"op": "input", "attrs": {"name": "x", "shape": [4, 8]}},
        {"op": "weight", "attrs": {"name": "w", "shape": [8, 8]}},
        {"op": "matmul", "attrs": {"act": 0}, "inputs": [[0, 0], [1, 0]]},
        {"op": "relu", "attrs": {}, "inputs": [[2, 0]]},
        {"op": "ewadd", "attrs": {}, "inputs": [[2, 0], [3, 0]]},
    ], "outputs": [[4, 0]]}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_ref_parts = (st.integers(-2, 5) | st.floats(-1, 5) | st.just(math.nan) | st.booleans() | st.text(max_size=2)
              | st.none())
_refs = st.lists(_ref_parts, min_size=0, max_size=3) | _ref_parts


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([(2, 0), (2, 1), (3, 0), (4, 0), (4, 1)]), _refs), min_size=1, max_size=3))
def test_node_references_are_integer_pairs_or_the_file_is_refused(edits: list[tuple[tuple[int, int], Any]]) -> None:
    doc = _base()
    for (node, slot), ref in edits:
        doc["nodes"][node]["inputs"][slot] = ref
    all_pairs = all(isinstance(ref, list) and len(ref) == 2 and all(_is_int(x) for x in ref) for _, ref in edits)
    try:
        graph = Graph.from_json(doc)
    except GraphFormatError as exc:
        if len(edits) == 1 and not all_pairs:
            assert "node reference" in str(exc)  # refused for the reference, not for what it happened to read
        return
    assert all_pairs, f"{edits} loaded"
    assert graph.nodes[-1].op == "ewadd"


_dims = st.integers(1, 8) | st.integers(-(2**70), 2**70) | st.sampled_from([2**40, 2**40 + 1, 2**20, 2**21, 0, -1])


@FUZZ
@given(st.lists(_dims, min_size=1, max_size=4), st.lists(_dims, min_size=1, max_size=3))
def test_no_integer_or_tensor_past_the_bound_gets_through(x_shape: list[int], y_shape: list[int]) -> None:
    doc = {"nodes": [{"op": "input", "attrs": {"name": "x", "shape": x_shape}},
                     {"op": "input", "attrs": {"name": "y", "shape": y_shape}},
                     {"op": "relu", "inputs": [[0, 0]]},
                     {"op": "reshape", "attrs": {"shape": y_shape}, "inputs": [[0, 0]]}],
           "outputs": [[2, 0], [3, 0]]}
    try:
        graph = Graph.from_json(doc)
    except EqsatError:
        return
    for node in graph.nodes:
        for shape in node.shapes:
            assert all(0 <= d <= MAX_ELEMENTS for d in shape)
            assert math.prod(shape) <= MAX_ELEMENTS


_versions = st.just(GRAPH_FORMAT) | st.text(max_size=16) | st.integers() | st.none() | st.lists(st.text(max_size=3),
                                                                                                 max_size=2)


@FUZZ
@given(_versions)
def test_a_format_other_than_the_current_one_is_refused(version: Any) -> None:
    doc = _base()
    doc["format"] = version
    if version == GRAPH_FORMAT:
        assert Graph.from_json(doc).nodes
    else:
        with pytest.raises(GraphFormatError, match="unknown graph format"):
            Graph.from_json(doc)


@FUZZ
@given(st.data())
def test_loaded_graphs_round_trip_through_the_file_format(data: st.DataObject) -> None:
    doc = _base()
    shape = data.draw(st.lists(st.integers(1, 6), min_size=2, max_size=2))
    doc["nodes"][0]["attrs"]["shape"] = [shape[0], 8]
    graph = Graph.from_json(doc)
    assert Graph.from_json(json.loads(json.dumps(graph.to_json()))) == graph


# --- negative costs --------------------------------------------------------------------------

@FUZZ
@given(egraph_dicts(st.integers(-5, 9)))
def test_exact_ilps_match_brute_force_under_negative_costs_and_the_rest_refuse(data: dict[str, Any]) -> None:
    eg = load_egraph(data)
    best = _brute_force(eg)
    for name, strategy in EXTRACTORS.items():
        if eg.has_negative_costs and not strategy.accepts_negative_costs:
            with pytest.raises(ExtractionError, match="assumes non-negative costs"):
                extract(eg, name, 5.0)
            continue
        check_against_optimum(eg, name, best)

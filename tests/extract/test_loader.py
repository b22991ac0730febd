import json
import math
from pathlib import Path

import numpy as np
import pytest

from eqsat.errors import EGraphFormatError
from eqsat.extract import load_egraph

GOOD = {
    "nodes": {
        "a": {"op": "x", "cost": 1.0, "eclass": "A", "children": []},
        "b": {"op": "f", "cost": 2.0, "eclass": "B", "children": ["a", "a"]},
        "b2": {"op": "g", "cost": 0.0, "eclass": "B", "children": []},
    },
    "root_eclasses": ["B"],
}


def test_arrays_and_ids() -> None:
    eg = load_egraph(GOOD)
    assert eg.node_ids == ("a", "b", "b2")
    assert eg.class_ids == ("A", "B")
    assert eg.ops == ("x", "f", "g")
    assert eg.node_class.tolist() == [0, 1, 1]
    assert eg.children(1).tolist() == [0, 0]
    assert eg.unique_children[1] == (0,)
    assert eg.nodes_of(1).tolist() == [1, 2]
    assert eg.roots.tolist() == [1]
    with pytest.raises(ValueError):
        eg.cost[0] = 5.0  # arrays are read-only


def test_file_and_string(tmp_path: Path) -> None:
    p = tmp_path / "g.json"
    p.write_text(json.dumps(GOOD))
    assert load_egraph(p).n_nodes == 3
    assert load_egraph(str(p)).n_classes == 2
    assert load_egraph(json.dumps(GOOD)).n_nodes == 3


def _bad(**changes: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if key == "cost":
            data["nodes"]["b"]["cost"] = value
        elif key == "child":
            data["nodes"]["b"]["children"] = [value]
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_bad(child="nope"), "names no node"),
        (_bad(root_eclasses=["Z"]), "names no e-class"),
        (_bad(root_eclasses=[]), "no root"),
        ({"nodes": GOOD["nodes"]}, "no root"),
        (_bad(cost=math.nan), "must be finite"),
        (_bad(cost=-math.inf), "must be finite"),
        (_bad(cost=math.inf), "must be finite"),
        (_bad(cost="3"), "non-numeric"),
        ({"root_eclasses": ["A"]}, "'nodes'"),
        ([1, 2], "top level"),
    ],
)
def test_bad_input(data: object, message: str) -> None:
    with pytest.raises(EGraphFormatError, match=message):
        load_egraph(data if isinstance(data, dict) else json.dumps(data))


def test_not_json(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(EGraphFormatError, match="not JSON"):
        load_egraph(p)
    with pytest.raises(EGraphFormatError, match="cannot read"):
        load_egraph(tmp_path / "missing.json")


def test_nan_in_file_text(tmp_path: Path) -> None:
    p = tmp_path / "nan.json"
    p.write_text(json.dumps(GOOD).replace("2.0", "NaN"))
    with pytest.raises(EGraphFormatError, match="finite"):
        load_egraph(p)


def test_class_data_ignored() -> None:
    data = dict(GOOD, class_data={"A": {"type": "T"}})
    assert np.array_equal(load_egraph(data).cost, load_egraph(GOOD).cost)

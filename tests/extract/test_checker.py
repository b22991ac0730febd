import numpy as np
import pytest

from eqsat.errors import ExtractionError
from eqsat.extract import check_selection, make_selection, Status

from .helpers import egraph


def test_checker_finds_problems() -> None:
    eg = egraph({"A": [(1, ["B"]), (5, [])], "B": [(1, ["A"]), (1, [])]}, ["A"])
    assert check_selection(eg, np.array([0, 3])) == []
    assert "cycle" in check_selection(eg, np.array([0, 2]))[0]
    assert "not in this class" in check_selection(eg, np.array([2, 3]))[0]
    assert "not chosen" in check_selection(eg, np.array([0, -1]))[0]
    assert "root" in check_selection(eg, np.array([-1, 3]))[0]


def test_make_selection_recomputes_and_trims() -> None:
    eg = egraph({"A": [(1, ["B", "B"]), (5, [])], "B": [(2, [])], "C": [(7, [])]}, ["A"])
    sel = make_selection(eg, np.array([0, 2, 3]), status=Status.FEASIBLE, extractor="t", seconds=0.0)
    assert sel.choice.tolist() == [0, 2, -1]  # C is not needed
    assert sel.dag_cost == 3 and sel.tree_cost == 5
    with pytest.raises(ExtractionError, match="invalid"):
        eg2 = egraph({"A": [(1, ["B"])], "B": [(1, ["A"]), (1, [])]}, ["A"])
        make_selection(eg2, np.array([0, 1]), status=Status.FEASIBLE, extractor="t", seconds=0.0)

"""The ILP's targets on Tensat's e-graphs (slow: run with -m slow)."""

from __future__ import annotations


import pytest

from eqsat.extract import check_selection, extract, load_egraph
from eqsat.paths import egraphs_dir

DATA = egraphs_dir() / "tensat"
BEST = {"resnet50": 4.386, "bert": 0.705, "nasneta": 11.199, "nasrnn": 0.950, "vgg": 4.851}


@pytest.mark.slow
@pytest.mark.skipif(not DATA.exists(), reason="shared data not present")
@pytest.mark.parametrize("name", sorted(BEST))
def test_ilp_reaches_best_known(name: str) -> None:
    eg = load_egraph(DATA / f"{name}.json")
    sel = extract(eg, "ilp", 60)
    assert check_selection(eg, sel) == []
    assert sel.dag_cost <= BEST[name] * 1.001
    assert sel.lower_bound is not None and sel.lower_bound <= sel.dag_cost


@pytest.mark.slow
@pytest.mark.skipif(not DATA.exists(), reason="shared data not present")
@pytest.mark.parametrize("name", ["bert", "nasneta", "nasrnn", "resnet50", "vgg"])
def test_every_strategy_valid(name: str) -> None:
    eg = load_egraph(DATA / f"{name}.json")
    for extractor in ("bottom-up", "greedy-dag"):
        assert check_selection(eg, extract(eg, extractor)) == []

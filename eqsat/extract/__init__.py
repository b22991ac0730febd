"""E-graph extraction: E-graph JSON → arrays → a validated choice of one node per needed class.

    egraph = load_egraph("model.json")
    sel = extract(egraph, "ilp", time_limit=60)
    sel.as_ids(egraph)   # class id → node id
"""

from eqsat.extract.egraph_data import EGraphData, load_egraph
from eqsat.extract.registry import EXTRACTORS, ExtractRequest, Extractor, extract
from eqsat.extract.selection import Selection, Status, check_selection, dag_cost, make_selection

__all__ = [
    "EXTRACTORS",
    "EGraphData",
    "ExtractRequest",
    "Extractor",
    "Selection",
    "Status",
    "check_selection",
    "dag_cost",
    "extract",
    "load_egraph",
    "make_selection",
]

"""Every extraction strategy behind one interface: (egraph, time_limit) → Selection."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.greedy_dag import greedy_dag
from eqsat.extract.ilp import ilp
from eqsat.extract.reduced_ilp import reduced_ilp
from eqsat.extract.selection import Selection
from eqsat.extract.tensat_ilp import tensat_ilp


@dataclass(frozen=True)
class Extractor:
    """A named strategy; `why` says what it is in the comparison for."""

    name: str
    run: Callable[[EGraphData, float], Selection]
    why: str

    def __call__(self, egraph: EGraphData, time_limit: float = 60.0) -> Selection:
        return self.run(egraph, time_limit)


def _registry() -> Mapping[str, Extractor]:
    entries = [
        Extractor("bottom-up", bottom_up, "optimal for tree cost; the classic egg extractor"),
        Extractor("greedy-dag", greedy_dag, "counts shared sub-graphs once; fast baseline and ILP start"),
        Extractor("ilp", ilp, "exact DAG cost with HiGHS, pruning and lazy cycle cuts; "
                              "neighbourhood search first on big cyclic regions (default)"),
        Extractor("tensat-ilp", tensat_ilp, "Tensat's topological-order formulation, to compare encodings"),
        Extractor(
            "ilp-reduced",
            reduced_ilp,
            "e-boost-style MIP over the LP support + greedy: fast good answers on hard files, no proof",
        ),
    ]
    return MappingProxyType({e.name: e for e in entries})


EXTRACTORS: Mapping[str, Extractor] = _registry()


def extract(egraph: EGraphData, extractor: str = "ilp", time_limit: float = 60.0) -> Selection:
    """Run one named strategy; every result has been validated and its costs recomputed."""
    try:
        strategy = EXTRACTORS[extractor]
    except KeyError:
        raise ExtractionError(f"unknown extractor {extractor!r}; choose from {', '.join(EXTRACTORS)}") from None
    return strategy(egraph, time_limit)

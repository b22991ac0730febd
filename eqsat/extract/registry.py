"""Every extraction strategy behind one interface: (egraph, time_limit) → Selection."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up
from eqsat.extract.egraph_data import EGraphData, refuse_negative_costs
from eqsat.extract.greedy_dag import greedy_dag
from eqsat.extract.ilp import ilp
from eqsat.extract.reduced_ilp import reduced_ilp
from eqsat.extract.selection import Selection, Status
from eqsat.extract.tensat_ilp import tensat_ilp


@dataclass(frozen=True)
class Extractor:
    """A named strategy; `why` says what it is in the comparison for."""

    name: str
    run: Callable[[EGraphData, float], Selection]
    why: str
    # Measured peak bytes per e-node + child edge (`eqsat bench scaling`), for the memory check.
    bytes_per_item: float = 2_000.0
    # Set-up seconds per e-node + child edge (pruning, greedy start, model; measured ~1.7e-5 on
    # nasrnn and on chains) before a solver can run. Under twice that (setup, then at least as
    # long for the solver and the checks) the quick answer is returned instead: nasrnn ~7 s.
    setup_s_per_item: float = 0.0
    # Exact with negative costs (extraction-gym's maxsat suite); the others refuse such e-graphs.
    accepts_negative_costs: bool = False

    def estimated_bytes(self, egraph: EGraphData) -> float:
        return self.bytes_per_item * _items(egraph)

    def __call__(self, egraph: EGraphData, time_limit: float = 60.0) -> Selection:
        if not self.accepts_negative_costs:
            refuse_negative_costs(egraph, self.name)
        if time_limit < 2 * self.setup_s_per_item * _items(egraph):
            return _quick_answer(egraph, self.name, time_limit)
        return self.run(egraph, time_limit)


def _items(egraph: EGraphData) -> int:
    return egraph.n_nodes + len(egraph.child_class)


def _quick_answer(egraph: EGraphData, name: str, time_limit: float) -> Selection:
    """The greedy DAG answer (which keeps the time limit itself), labelled as a time-out of
    strategy `name`."""
    sel = greedy_dag(egraph, time_limit)
    info = {"quick": f"time limit {time_limit:g} s is too short for {name}'s set-up; greedy-dag answer"}
    return replace(sel, status=Status.TIMED_OUT, extractor=name, info=info)


def _registry() -> Mapping[str, Extractor]:
    entries = [
        Extractor("bottom-up", bottom_up, "optimal for tree cost; the classic egg extractor", 700.0),
        Extractor("greedy-dag", greedy_dag, "counts shared sub-graphs once; fast baseline and ILP start", 700.0),
        Extractor("ilp", ilp, "exact DAG cost with HiGHS, pruning and lazy cycle cuts; "
                              "neighbourhood search first on big cyclic regions (default)", 1_500.0, 2e-5, True),
        Extractor("tensat-ilp", tensat_ilp, "Tensat's topological-order formulation, to compare encodings", 2_000.0, 2e-5,
                  True),
        Extractor(
            "ilp-reduced",
            reduced_ilp,
            "e-boost-style MIP over the LP support + greedy: fast good answers on hard files, no proof",
            2_000.0,
            2e-5,
        ),
    ]
    return MappingProxyType({e.name: e for e in entries})


EXTRACTORS: Mapping[str, Extractor] = _registry()


def extract(
    egraph: EGraphData, extractor: str = "ilp", time_limit: float = 60.0, memory_limit: int | None = None
) -> Selection:
    """Run one named strategy; every result has been validated and its costs recomputed.

    With `memory_limit` (bytes), a strategy whose estimated peak (`Extractor.bytes_per_item`)
    exceeds it is refused up front, and running out of memory anyway (the CLI also caps the
    address space) is one ExtractionError, not a crash."""
    try:
        strategy = EXTRACTORS[extractor]
    except KeyError:
        raise ExtractionError(f"unknown extractor {extractor!r}; choose from {', '.join(EXTRACTORS)}") from None
    if not time_limit >= 0:  # also NaN
        raise ExtractionError(f"time limit must be a non-negative number of seconds, not {time_limit!r}")
    if memory_limit is not None:
        need = strategy.estimated_bytes(egraph)
        if need > memory_limit:
            raise ExtractionError(
                f"{egraph.name}: {extractor} would need about {need / 2**30:.1f} GiB for {egraph.n_nodes} nodes, "
                f"over the memory limit of {memory_limit / 2**30:.1f} GiB; try bottom-up or greedy-dag"
            )
    try:
        return strategy(egraph, time_limit)
    except MemoryError:
        raise ExtractionError(
            f"{egraph.name}: {extractor} ran out of memory"
            + (f" (limit {memory_limit / 2**30:.1f} GiB)" if memory_limit is not None else "")
        ) from None

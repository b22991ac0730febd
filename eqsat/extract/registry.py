"""Every extraction strategy behind one interface: (egraph, time_limit, request) → Selection.

A request (`ExtractRequest`) carries what an extraction must honour besides the node costs:
knapsack rows (e.g. memory per device, bytes moved) and starts (known answers; the result is never
worse than a valid one). A strategy that cannot honour rows refuses them: it never ignores them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.bottom_up import bottom_up
from eqsat.extract.egraph_data import EGraphData, refuse_negative_costs
from eqsat.extract.greedy_dag import greedy_dag
from eqsat.extract.ilp import ilp
from eqsat.extract.lazy import IlpOptions, NodeBudget
from eqsat.extract.reduced_ilp import reduced_ilp
from eqsat.extract.selection import Selection, Status, dag_cost, is_valid_choice, make_selection, reachable_choice
from eqsat.extract.tensat_ilp import tensat_ilp

__all__ = ["EXTRACTORS", "ExtractRequest", "Extractor", "extract"]


@dataclass(frozen=True)
class ExtractRequest:
    """What an extraction honours besides node costs. `rows`: knapsack rows (the chosen nodes'
    weights stay within each limit); `starts`: full choices known from elsewhere (loader
    numbering), the answer is never worse than a valid one within the rows; `seed`: for strategies
    with random phases (the ILP's neighbourhood search)."""

    rows: tuple[NodeBudget, ...] = ()
    starts: tuple[np.ndarray, ...] = field(default=(), compare=False)
    seed: int = 0


def _plain(run: Callable[[EGraphData, float], Selection]) -> Callable[[EGraphData, float, ExtractRequest], Selection]:
    """A strategy that knows no request: rows were refused before; starts are kept where cheaper."""
    return lambda egraph, time_limit, request: _better_start(egraph, run(egraph, time_limit), request.starts)


def _ilp(egraph: EGraphData, time_limit: float, request: ExtractRequest) -> Selection:
    return ilp(egraph, time_limit, IlpOptions(budgets=request.rows, lns_seed=request.seed), request.starts)


def _better_start(egraph: EGraphData, sel: Selection, starts: Sequence[np.ndarray]) -> Selection:
    """`sel`, or the cheapest valid start where it is cheaper (labelled as `sel`'s strategy)."""
    best = sel
    for choice in starts:
        if is_valid_choice(egraph, choice) and dag_cost(egraph, reachable_choice(egraph, choice)) < best.dag_cost:
            best = make_selection(egraph, choice, status=sel.status, extractor=sel.extractor, seconds=sel.seconds,
                                  info={**sel.info, "from_start": True})
    return best


@dataclass(frozen=True)
class Extractor:
    """A named strategy; `why` says what it is in the comparison for; `rows`: whether it honours
    knapsack rows (one that does not refuses a request with rows)."""

    name: str
    run: Callable[[EGraphData, float, ExtractRequest], Selection]
    why: str
    # Measured peak bytes per e-node + child edge (`eqsat bench scaling`), for the memory check.
    bytes_per_item: float = 2_000.0
    # Set-up seconds per e-node + child edge (pruning, greedy start, model; measured ~1.7e-5 on
    # nasrnn and on chains) before a solver can run. Under twice that (setup, then at least as
    # long for the solver and the checks) the quick answer is returned instead: nasrnn ~7 s.
    setup_s_per_item: float = 0.0
    rows: bool = False  # honours knapsack rows (ExtractRequest.rows)
    # Exact with negative costs (extraction-gym's maxsat suite); the others refuse such e-graphs.
    accepts_negative_costs: bool = False

    def estimated_bytes(self, egraph: EGraphData) -> float:
        return self.bytes_per_item * _items(egraph)

    def __call__(self, egraph: EGraphData, time_limit: float = 60.0, request: ExtractRequest = ExtractRequest()) -> Selection:
        if not self.accepts_negative_costs:
            refuse_negative_costs(egraph, self.name)
        if request.rows and not self.rows:
            raise ExtractionError(f"{self.name} cannot honour knapsack rows (memory, bytes moved); use ilp")
        if time_limit < 2 * self.setup_s_per_item * _items(egraph) and not request.rows:  # greedy ignores rows
            return _better_start(egraph, _quick_answer(egraph, self.name, time_limit), request.starts)
        return self.run(egraph, time_limit, request)


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
        Extractor("bottom-up", _plain(bottom_up), "optimal for tree cost; the classic egg extractor", 700.0),
        Extractor("greedy-dag", _plain(greedy_dag), "counts shared sub-graphs once; fast baseline and ILP start", 700.0),
        Extractor("ilp", _ilp, "exact DAG cost with HiGHS, pruning and lazy cycle cuts; neighbourhood search first "
                               "on big cyclic regions (default); honours knapsack rows and starts", 1_500.0, 2e-5,
                  rows=True, accepts_negative_costs=True),
        Extractor("tensat-ilp", _plain(tensat_ilp), "Tensat's topological-order formulation, to compare encodings",
                  2_000.0, 2e-5, accepts_negative_costs=True),
        Extractor("tensat-ilp-int", _plain(partial(tensat_ilp, order_vars="int")),
                  "tensat-ilp with integer order variables (Tensat's --order_var_int), for the paper's real-vs-int "
                  "comparison", 2_000.0, 2e-5, accepts_negative_costs=True),
        Extractor(
            "ilp-reduced",
            _plain(reduced_ilp),
            "e-boost-style MIP over the LP support + greedy: fast good answers on hard files, no proof",
            2_000.0,
            2e-5,
        ),
    ]
    return MappingProxyType({e.name: e for e in entries})


EXTRACTORS: Mapping[str, Extractor] = _registry()


def extract(
    egraph: EGraphData, extractor: str = "ilp", time_limit: float = 60.0, memory_limit: int | None = None,
    request: ExtractRequest = ExtractRequest(),
) -> Selection:
    """Run one named strategy on `request` (rows, starts); every result has been validated and its
    costs recomputed.

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
        return strategy(egraph, time_limit, request)
    except MemoryError:
        raise ExtractionError(
            f"{egraph.name}: {extractor} ran out of memory"
            + (f" (limit {memory_limit / 2**30:.1f} GiB)" if memory_limit is not None else "")
        ) from None


"""The one result type of every extractor, and the one checker that validates it.

Costs are always recomputed here from the chosen nodes; a solver's objective value is never
trusted (it may count classes that the choice does not reach, or be off by the MIP tolerance).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eqsat.errors import ExtractionError
from eqsat.extract.egraph_data import EGraphData


class Status(enum.StrEnum):
    """How much an extractor's answer is worth."""

    OPTIMAL = "optimal"  # proven optimal for the extractor's objective (DAG cost for the ILPs)
    FEASIBLE = "feasible"  # valid, no optimality claim (heuristics)
    TIMED_OUT = "timed-out-with-best"  # the time limit stopped the search; best valid answer found
    FALLBACK = "fallback"  # the strategy itself failed; this is the greedy answer instead


@dataclass(frozen=True, eq=False)
class Selection:
    """A chosen node per needed class (choice[c] = node index, -1 where c is not needed)."""

    choice: np.ndarray
    dag_cost: float
    tree_cost: float
    lower_bound: float | None
    status: Status
    seconds: float
    extractor: str
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap (cost - bound) / cost, or None without a bound."""
        if self.lower_bound is None:
            return None
        if self.dag_cost == 0:  # with non-negative costs a zero cost is optimal
            return 0.0 if self.lower_bound >= -1e-6 else float("inf")
        return max(0.0, (self.dag_cost - self.lower_bound) / abs(self.dag_cost))

    def chosen(self) -> dict[int, int]:
        """class index → node index, for the needed classes only."""
        return {int(c): int(n) for c, n in enumerate(self.choice.tolist()) if n >= 0}

    def as_ids(self, egraph: EGraphData) -> dict[str, str]:
        """class id → node id, as strings from the JSON: what a decoder needs."""
        return {egraph.class_ids[c]: egraph.node_ids[n] for c, n in self.chosen().items()}

    def nodes(self) -> np.ndarray:
        return self.choice[self.choice >= 0]


def reachable_choice(egraph: EGraphData, choice: Sequence[int] | np.ndarray) -> np.ndarray:
    """Keep only the classes the roots reach through the choice; -1 elsewhere.

    Raises ExtractionError if a needed class has no choice.
    """
    full = np.asarray(choice, dtype=np.int64)
    out = np.full(egraph.n_classes, -1, dtype=np.int32)
    uc = egraph.unique_children
    stack = [int(r) for r in egraph.roots]
    while stack:
        c = stack.pop()
        if out[c] >= 0:
            continue
        n = int(full[c])
        if n < 0:
            raise ExtractionError(f"{egraph.name}: e-class {egraph.class_ids[c]!r} is needed but has no chosen node")
        out[c] = n
        stack.extend(k for k in uc[n] if out[k] < 0)
    return out


def check_selection(egraph: EGraphData, selection: Selection | np.ndarray) -> list[str]:
    """Every problem with a selection (empty list = valid): needed classes chosen, chosen nodes in
    their class, no cycle, and (for a Selection) costs that match a recomputation."""
    choice = selection.choice if isinstance(selection, Selection) else np.asarray(selection)
    problems: list[str] = []
    if choice.shape != (egraph.n_classes,):
        return [f"choice has shape {choice.shape}, expected ({egraph.n_classes},)"]
    for c, n in enumerate(choice.tolist()):
        if n >= 0 and (n >= egraph.n_nodes or egraph.node_class[n] != c):
            problems.append(f"class {egraph.class_ids[c]!r}: chosen node {n} is not in this class")
    if problems:
        return problems
    # Iterative DFS from the roots: colour 1 = on the stack, 2 = done.
    uc = egraph.unique_children
    colour = np.zeros(egraph.n_classes, dtype=np.int8)
    for r in egraph.roots.tolist():
        if choice[r] < 0:
            problems.append(f"root class {egraph.class_ids[r]!r} has no chosen node")
            continue
        if colour[r]:
            continue
        colour[r] = 1
        stack: list[tuple[int, int]] = [(r, 0)]
        while stack:
            c, i = stack[-1]
            kids = uc[int(choice[c])]
            if i == len(kids):
                colour[c] = 2
                stack.pop()
                continue
            stack[-1] = (c, i + 1)
            k = kids[i]
            if choice[k] < 0:
                problems.append(f"class {egraph.class_ids[k]!r} is needed (child of {egraph.node_ids[choice[c]]!r}) but not chosen")
                colour[k] = 2
            elif colour[k] == 1:
                problems.append(f"cycle through class {egraph.class_ids[k]!r}")
                return problems
            elif colour[k] == 0:
                colour[k] = 1
                stack.append((k, 0))
    if not problems and isinstance(selection, Selection):
        dag, _ = _costs(egraph, reachable_choice(egraph, choice))
        if not math.isclose(dag, selection.dag_cost, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"dag_cost {selection.dag_cost} differs from the recomputed {dag}")
    return problems


def is_valid_choice(egraph: EGraphData, choice: np.ndarray) -> bool:
    """Whether the roots' needed classes are all chosen and acyclic (no messages, just yes/no)."""
    try:
        reach = reachable_choice(egraph, choice)
    except ExtractionError:
        return False
    return not check_selection(egraph, reach)


def _costs(egraph: EGraphData, choice: np.ndarray) -> tuple[float, float]:
    """(DAG cost, tree cost) of a reachable, acyclic choice."""
    chosen = choice[choice >= 0]
    dag = float(egraph.cost[chosen].sum())
    # Tree cost: children before parents (post-order of the DFS), with repeated arguments counted.
    tree: dict[int, float] = {}
    for c in postorder(egraph, choice):
        n = int(choice[c])
        kids = egraph.children(n).tolist()
        tree[c] = float(egraph.cost[n]) + sum(tree[k] for k in kids)
    total = sum(tree[int(r)] for r in egraph.roots)
    return dag, total


def postorder(egraph: EGraphData, choice: np.ndarray) -> list[int]:
    uc = egraph.unique_children
    seen = np.zeros(egraph.n_classes, dtype=bool)
    order: list[int] = []
    for r in egraph.roots.tolist():
        if seen[r]:
            continue
        seen[r] = True
        stack: list[tuple[int, int]] = [(r, 0)]
        while stack:
            c, i = stack[-1]
            kids = uc[int(choice[c])]
            if i == len(kids):
                order.append(c)
                stack.pop()
                continue
            stack[-1] = (c, i + 1)
            k = kids[i]
            if not seen[k]:
                seen[k] = True
                stack.append((k, 0))
    return order


def dag_cost(egraph: EGraphData, choice: Sequence[int] | np.ndarray) -> float:
    """DAG cost of a choice (only what the roots reach counts); assumes it is acyclic."""
    reach = reachable_choice(egraph, choice)
    return float(egraph.cost[reach[reach >= 0]].sum())


def make_selection(
    egraph: EGraphData,
    choice: Sequence[int] | np.ndarray,
    *,
    status: Status,
    extractor: str,
    seconds: float,
    lower_bound: float | None = None,
    info: Mapping[str, Any] | None = None,
) -> Selection:
    """Trim a choice to what the roots need, recompute its costs, and validate it (raises
    ExtractionError if invalid): the only way extractors build their result."""
    reach = reachable_choice(egraph, choice)
    reach.flags.writeable = False
    problems = check_selection(egraph, reach)
    if problems:
        raise ExtractionError(f"{egraph.name}: {extractor} produced an invalid selection: {problems[0]}")
    dag, tree = _costs(egraph, reach)
    if lower_bound is not None:
        lower_bound = min(float(lower_bound), dag)
    return Selection(
        choice=reach,
        dag_cost=dag,
        tree_cost=tree,
        lower_bound=lower_bound,
        status=status,
        seconds=seconds,
        extractor=extractor,
        info=dict(info or {}),
    )

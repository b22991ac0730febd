"""Shared pieces of the MIP extractors: the pruned problem as column/row arrays, HiGHS set-up,
reading a choice back from a solution, and finding the cycles a solution contains."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

import highspy
import numpy as np

from eqsat.extract.bottom_up import bottom_up_tree_costs, parents_of_classes
from eqsat.extract.egraph_data import EGraphData
from eqsat.extract.graphs import strongly_connected
from eqsat.extract.greedy_dag import greedy_dag_choice
from eqsat.extract.prune import Pruned, prune
from eqsat.extract.repair import repair_choice
from eqsat.extract.selection import dag_cost, reachable_choice


@dataclass(frozen=True, eq=False)
class Problem:
    """The pruned problem: column j < len(nodes) is x of nodes[j]; column len(nodes)+i is y of
    classes[i]."""

    egraph: EGraphData
    pruned: Pruned
    nodes: np.ndarray  # original node index per x column
    classes: np.ndarray  # original class index per y column
    node_col: dict[int, int]
    class_col: dict[int, int]
    parents: list[list[int]] = field(repr=False)
    repair_key: np.ndarray = field(repr=False)  # per node: bottom-up tree cost of its class

    @property
    def n_cols(self) -> int:
        return len(self.nodes) + len(self.classes)

    @property
    def cost_scale(self) -> float:
        """Factor from node costs to the MIP's objective: the largest kept cost becomes 1. HiGHS's
        tolerances are absolute (1e-7 and up): with costs in seconds (1e-6 for a small op) it took
        a choice 5e-9 s dearer as optimal (a roofline's merged resnext50 kernel), so divide a HiGHS
        objective or bound by this to get a cost."""
        kept = np.abs(self.egraph.cost[self.nodes])
        top = float(np.max(kept)) if len(kept) else 0.0
        return 1.0 / top if np.isfinite(top) and top > 0 else 1.0

    @cached_property
    def edges(self) -> dict[tuple[int, int], list[int]]:
        """See `class_edges`."""
        uc = self.egraph.unique_children
        node_class = self.egraph.node_class.tolist()
        edges: dict[tuple[int, int], list[int]] = {}
        for j, n in enumerate(self.nodes.tolist()):
            c = node_class[n]
            for k in uc[n]:
                edges.setdefault((c, k), []).append(j)
        return edges

    @cached_property
    def sccs(self) -> list[int]:
        """See `class_sccs`."""
        adj: list[list[int]] = [[] for _ in range(self.egraph.n_classes)]
        for c, k in self.edges:
            adj[c].append(k)
        comp = strongly_connected(adj)
        mask = self.pruned.class_mask.tolist()
        return [comp[c] if mask[c] else -1 for c in range(self.egraph.n_classes)]

    @classmethod
    def over(cls, egraph: EGraphData, pruned: Pruned, parents: list[list[int]], repair_key: np.ndarray) -> Problem:
        """The problem over the nodes and classes `pruned` keeps, with the column layout above."""
        nodes = np.flatnonzero(pruned.node_mask)
        classes = np.flatnonzero(pruned.class_mask)
        k = len(nodes)
        return cls(
            egraph=egraph,
            pruned=pruned,
            nodes=nodes,
            classes=classes,
            node_col={int(n): j for j, n in enumerate(nodes.tolist())},
            class_col={int(c): k + i for i, c in enumerate(classes.tolist())},
            parents=parents,
            repair_key=repair_key,
        )


def make_problem(egraph: EGraphData, pruned: Pruned | None = None, deadline: float | None = None) -> Problem:
    pruned = pruned if pruned is not None else prune(egraph, deadline=deadline)
    return Problem.over(egraph, pruned, parents_of_classes(egraph),
                        bottom_up_tree_costs(egraph, pruned.node_mask)[0][egraph.node_class])


@dataclass
class Rows:
    """Rows in CSR form, gathered in Python lists and handed to HiGHS in one call."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self, cols: list[int], vals: list[float], lo: float, hi: float) -> None:
        self.starts.append(len(self.index))
        self.index.extend(cols)
        self.value.extend(vals)
        self.lower.append(lo)
        self.upper.append(hi)

    def __len__(self) -> int:
        return len(self.lower)

    def pass_to(self, h: highspy.Highs) -> None:
        if not self.lower:
            return
        h.addRows(
            len(self.lower),
            np.asarray(self.lower, dtype=np.float64),
            np.asarray(self.upper, dtype=np.float64),
            len(self.index),
            np.asarray(self.starts, dtype=np.int32),
            np.asarray(self.index, dtype=np.int32),
            np.asarray(self.value, dtype=np.float64),
        )


def new_highs(time_limit: float, threads: int = 1, gap: float = 1e-6) -> highspy.Highs:
    """A silent HiGHS instance. HiGHS keeps one task scheduler per process, sized by the first
    solve: a later solve asking for another thread count fails at once (HiGHS returns no answer),
    so the scheduler is reset first (~0.1 ms; it is rebuilt at the next solve)."""
    highspy.Highs.resetGlobalScheduler(True)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", threads)
    h.setOptionValue("time_limit", max(0.01, time_limit))
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("random_seed", 0)
    return h


def add_columns(h: highspy.Highs, costs: np.ndarray, lower: np.ndarray, upper: np.ndarray, integer: bool) -> None:
    n = len(costs)
    h.addCols(
        n,
        np.asarray(costs, dtype=np.float64),
        np.asarray(lower, dtype=np.float64),
        np.asarray(upper, dtype=np.float64),
        0,
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=np.float64),
    )
    if integer:
        first = h.getNumCol() - n
        h.changeColsIntegrality(
            n, np.arange(first, first + n, dtype=np.int32), np.ones(n, dtype=np.uint8)
        )


def base_model(problem: Problem, h: highspy.Highs) -> None:
    """x, y binaries; class rows sum(x in c) = y_c; edge rows x_n <= y_k; roots y = 1; costs
    times `problem.cost_scale`. With negative costs also need rows: a non-root class is chosen only
    if a chosen node has it as a child (y_c <= sum of those x), since otherwise the solver would
    choose every negative node, needed or not; with no cycle among the chosen nodes (cuts, or the
    order model) everything chosen is then reachable and the objective is the DAG cost."""
    eg = problem.egraph
    k, m = len(problem.nodes), len(problem.classes)
    roots = set(eg.roots.tolist())
    y_lower = np.array([1.0 if c in roots else 0.0 for c in problem.classes.tolist()])
    add_columns(h, eg.cost[problem.nodes] * problem.cost_scale, np.zeros(k), np.ones(k), True)
    add_columns(h, np.zeros(m), y_lower, np.ones(m), True)
    rows = Rows()
    mask = problem.pruned.node_mask
    for c in problem.classes.tolist():
        cols = [problem.node_col[n] for n in eg.nodes_of(c).tolist() if mask[n]]
        rows.add(cols + [problem.class_col[c]], [1.0] * len(cols) + [-1.0], 0.0, 0.0)
    uc = eg.unique_children
    users: dict[int, list[int]] = {}
    for j, n in enumerate(problem.nodes.tolist()):
        for ch in uc[n]:
            rows.add([j, problem.class_col[ch]], [1.0, -1.0], -np.inf, 0.0)
            users.setdefault(ch, []).append(j)
    if eg.has_negative_costs:
        for c in problem.classes.tolist():
            if c not in roots:
                cols = users.get(c, [])
                rows.add([problem.class_col[c]] + cols, [1.0] + [-1.0] * len(cols), -np.inf, 0.0)
    rows.pass_to(h)


def choice_from_solution(problem: Problem, values: np.ndarray) -> np.ndarray:
    """Full-size choice array from the x values (a class with no x > 0.5 stays -1)."""
    choice = np.full(problem.egraph.n_classes, -1, dtype=np.int64)
    xs = values[: len(problem.nodes)]
    picked = problem.nodes[xs > 0.5]
    choice[problem.egraph.node_class[picked]] = picked
    return choice


def solution_vector(problem: Problem, choice: np.ndarray, n_cols: int | None = None) -> np.ndarray:
    """The 0/1 column vector of a (reachable) choice: x and y; extra columns left 0."""
    v = np.zeros(n_cols or problem.n_cols)
    for c, n in enumerate(choice.tolist()):
        if n >= 0:
            v[problem.node_col[n]] = 1.0
            v[problem.class_col[c]] = 1.0
    return v


def needed_cycles(problem: Problem, choice: np.ndarray, per_component: int = 8) -> list[list[int]]:
    """Short class cycles in the part of a (possibly cyclic) choice that the roots reach; with
    negative costs in the whole choice (a chosen cycle the roots do not reach lowers the objective
    below the DAG cost, so it must be cut too)."""
    eg = problem.egraph
    uc = eg.unique_children
    reach: list[int] = []
    seen = np.zeros(eg.n_classes, dtype=bool)
    stack = [int(r) for r in eg.roots]
    if eg.has_negative_costs:
        stack = np.flatnonzero(choice >= 0).tolist()
    for r in stack:
        seen[r] = True
    while stack:
        c = stack.pop()
        reach.append(c)
        n = int(choice[c])
        if n < 0:
            continue
        for k in uc[n]:
            if not seen[k]:
                seen[k] = True
                stack.append(k)
    local = {c: i for i, c in enumerate(reach)}
    adj = [[local[k] for k in uc[int(choice[c])]] if choice[c] >= 0 else [] for c in reach]
    comp = strongly_connected(adj)
    members: dict[int, list[int]] = {}
    for v, cid in enumerate(comp):
        members.setdefault(cid, []).append(v)
    cycles: list[list[int]] = []
    seen_cycles: set[tuple[int, ...]] = set()
    for vs in members.values():
        if len(vs) == 1 and vs[0] not in adj[vs[0]]:
            continue
        inside = set(vs)
        for start in vs[:per_component]:
            cyc = _shortest_cycle(adj, start, inside)
            if cyc is None:
                continue
            key = tuple(sorted(cyc))
            if key not in seen_cycles:
                seen_cycles.add(key)
                cycles.append([reach[v] for v in cyc])
    return cycles


def _shortest_cycle(adj: list[list[int]], start: int, inside: set[int]) -> list[int] | None:
    prev: dict[int, int] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in adj[v]:
            if w not in inside:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def cycle_cut(problem: Problem, cycle: list[int], rows: Rows) -> None:
    """Class-based cycle cut: of the nodes that would close the cycle c1→c2→…→c1, at most
    len-1 may be chosen."""
    eg = problem.egraph
    uc = eg.unique_children
    mask = problem.pruned.node_mask
    cols: list[int] = []
    for i, c in enumerate(cycle):
        nxt = cycle[(i + 1) % len(cycle)]
        cols.extend(problem.node_col[n] for n in eg.nodes_of(c).tolist() if mask[n] and nxt in uc[n])
    rows.add(cols, [1.0] * len(cols), -np.inf, float(len(cycle) - 1))


@dataclass
class Incumbent:
    """The best valid choice so far (full-size, trimmed to what the roots reach)."""

    choice: np.ndarray
    cost: float
    source: str


def start_incumbent(
    problem: Problem, start: Incumbent | None = None, deadline: float | None = None
) -> tuple[Incumbent, Incumbent]:
    """(the start answer, greedy by default (hurried past `deadline`); a valid warm start that
    uses only kept nodes)."""
    eg = problem.egraph
    if start is None:
        greedy = reachable_choice(eg, greedy_dag_choice(eg, deadline=deadline))
        start = Incumbent(greedy, dag_cost(eg, greedy), "greedy")
    if all(problem.pruned.node_mask[n] for n in start.choice[start.choice >= 0].tolist()):
        return start, start
    warm = reachable_choice(
        eg, repair_choice(eg, start.choice, problem.repair_key, problem.parents, problem.pruned.node_mask)
    )
    return start, Incumbent(warm, dag_cost(eg, warm), start.source + "-repaired")


def repair_incumbent(problem: Problem, choice: np.ndarray) -> Incumbent:
    """A valid choice close to a cyclic solver answer (used as the next warm start)."""
    eg = problem.egraph
    fixed = reachable_choice(
        eg, repair_choice(eg, choice, problem.repair_key, problem.parents, problem.pruned.node_mask)
    )
    return Incumbent(fixed, dag_cost(eg, fixed), "repaired")


class Clock:
    """Seconds left of a time limit started at construction."""

    def __init__(self, limit: float) -> None:
        self.start = time.perf_counter()
        self.limit = limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.limit - self.elapsed()

    def deadline(self, share: float = 1.0) -> float:
        """The `time.perf_counter()` value at which `share` of the limit is used."""
        return self.start + share * max(self.limit, 0.0)


def class_edges(problem: Problem) -> dict[tuple[int, int], list[int]]:
    """(class, child class) → x columns of the kept nodes that make that edge (computed once per
    problem: the cyclic-region check, the short cycles and the order model all read it; do not modify)."""
    return problem.edges


def class_sccs(problem: Problem) -> list[int]:
    """Component id per original class in the graph of kept edges (-1 for dropped classes; computed
    once per problem, do not modify)."""
    return problem.sccs


def order_model(
    problem: Problem, h: highspy.Highs, only_cyclic: bool = True, integer: bool = False
) -> int:
    """Topological-order acyclicity: a continuous t_c per class (integer with `integer`, Tensat's
    `--order_var_int`) and, per class edge c→k made by nodes X, t_c - t_k - S·sum(X) >= 1 - S
    (S = size of the component, so t ∈ [0, S-1]).
    With only_cyclic, just the classes and edges inside non-trivial strongly connected
    components (no other edge can be on a cycle). Returns the number of rows added."""
    edges = class_edges(problem)
    if only_cyclic:
        comp = class_sccs(problem)
        size: dict[int, int] = {}
        for c in problem.classes.tolist():
            size[comp[c]] = size.get(comp[c], 0) + 1
        inside = [(c, k) for (c, k) in edges if comp[c] == comp[k] and (c != k) and size[comp[c]] > 1]
        span = {c: size[comp[c]] for c in problem.classes.tolist()}
    else:
        inside = [(c, k) for (c, k) in edges if c != k]
        span = {c: len(problem.classes) for c in problem.classes.tolist()}
    ordered = sorted({c for e in inside for c in e})
    first = h.getNumCol()
    t_col = {c: first + i for i, c in enumerate(ordered)}
    if not ordered:
        return 0
    add_columns(
        h, np.zeros(len(ordered)), np.zeros(len(ordered)), np.array([span[c] - 1.0 for c in ordered]), integer
    )
    rows = Rows()
    for c, k in inside:
        s = float(span[c])
        xs = edges[(c, k)]
        rows.add([t_col[c], t_col[k]] + xs, [1.0, -1.0] + [-s] * len(xs), 1.0 - s, np.inf)
    rows.pass_to(h)
    return len(rows)


def short_cycles(
    problem: Problem, max_len: int = 3, cap: int = 20_000, deadline: float | None = None
) -> list[list[int]]:
    """Every class cycle of length 2..max_len (at most `cap`), inside strongly connected
    components of the kept class graph: added as cuts before the first solve, since the LP would
    otherwise exploit them first (Tensat's split/concat rewrites make many 3-cycles)."""
    comp = class_sccs(problem)
    adj: dict[int, list[int]] = {}
    for c, k in class_edges(problem):
        if c != k and comp[c] == comp[k]:
            adj.setdefault(c, []).append(k)
    out: list[list[int]] = []
    for a in sorted(adj):
        if deadline is not None and time.perf_counter() > deadline:
            break  # fewer up-front cuts: the lazy loop adds what is needed
        # Cycles are listed once, from their smallest class.
        stack: list[list[int]] = [[a]]
        while stack:
            path = stack.pop()
            for k in adj.get(path[-1], ()):
                if k == a and len(path) >= 2:
                    out.append(path)
                    if len(out) >= cap:
                        return out
                elif k > a and k not in path and len(path) < max_len:
                    stack.append(path + [k])
    return out

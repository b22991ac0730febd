"""E-graph JSON (egraph-serialize format) → compact integer arrays.

Every extractor reads e-graphs through `load_egraph`, so they all see the same numbering and the
same validation: bad input fails here with a message naming the file and the offending id, not
deep inside a solver.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.errors import EGraphFormatError, ExtractionError


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class EGraphData:
    """An e-graph as arrays: nodes and classes are numbered 0..n-1 in file order.

    Costs must be finite (the loader rejects anything else). They may be negative (extraction-gym's
    `maxsat` suite: a clause node costs -1), but then DAG cost is no longer monotone in the set of
    chosen nodes, which the pruning's dominance and the heuristics rely on: only the strategies
    with `Extractor.accepts_negative_costs` (the exact ILPs) take such an e-graph.
    """

    name: str
    node_ids: tuple[str, ...]
    class_ids: tuple[str, ...]
    ops: tuple[str, ...]
    node_class: np.ndarray  # int32 [N]: class of each node
    cost: np.ndarray  # float64 [N]
    child_ptr: np.ndarray  # int64 [N+1]: CSR offsets into child_class
    child_class: np.ndarray  # int32 [E]: class of each child, in argument order (duplicates kept)
    class_ptr: np.ndarray  # int64 [C+1]: CSR offsets into class_nodes
    class_nodes: np.ndarray  # int32 [N]: nodes of each class, in file order
    roots: np.ndarray  # int32 [R]: root classes, distinct, in file order

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_classes(self) -> int:
        return len(self.class_ids)

    def children(self, node: int) -> np.ndarray:
        """Child classes of `node` in argument order (with repeats)."""
        return self.child_class[self.child_ptr[node] : self.child_ptr[node + 1]]

    def nodes_of(self, cls: int) -> np.ndarray:
        return self.class_nodes[self.class_ptr[cls] : self.class_ptr[cls + 1]]

    @cached_property
    def unique_children(self) -> tuple[tuple[int, ...], ...]:
        """Distinct child classes per node (sorted): what the DAG cost and the ILPs depend on."""
        ptr = self.child_ptr.tolist()
        cc = self.child_class.tolist()
        return tuple(tuple(sorted(set(cc[ptr[n] : ptr[n + 1]]))) for n in range(self.n_nodes))

    @cached_property
    def has_negative_costs(self) -> bool:
        return bool(self.cost.min(initial=0.0) < 0)

    @cached_property
    def class_index(self) -> Mapping[str, int]:
        return {c: i for i, c in enumerate(self.class_ids)}

    @cached_property
    def node_index(self) -> Mapping[str, int]:
        return {n: i for i, n in enumerate(self.node_ids)}


def refuse_negative_costs(egraph: EGraphData, strategy: str) -> None:
    """One-line refusal of a strategy whose reasoning assumes that a node only adds to the cost."""
    if egraph.has_negative_costs:
        n = int(np.argmin(egraph.cost))
        raise ExtractionError(
            f"{egraph.name}: {strategy} assumes non-negative costs (a node can only add to a term's cost), but node "
            f"{egraph.node_ids[n]!r} costs {egraph.cost[n]:g}; use --extractor ilp or tensat-ilp, which stay exact")


def load_egraph(source: str | Path | Mapping[str, Any]) -> EGraphData:
    """Read an e-graph from a JSON file path, a JSON string, or an already parsed dict."""
    if isinstance(source, Mapping):
        return _from_dict(source, "<dict>")
    if isinstance(source, str) and source.lstrip()[:1] in ("{", "["):
        return _from_dict(_parse(source, "<string>"), "<string>")
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EGraphFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise EGraphFormatError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    return _from_dict(_parse(text, str(path)), str(path))


def _parse(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EGraphFormatError(f"{name}: not JSON: {exc}") from exc
    except RecursionError:
        raise EGraphFormatError(f"{name}: JSON nested too deeply") from None


def _from_dict(data: Any, name: str) -> EGraphData:
    if not isinstance(data, Mapping):
        raise EGraphFormatError(f"{name}: top level must be a JSON object with 'nodes' and 'root_eclasses'")
    nodes = data.get("nodes")
    if not isinstance(nodes, Mapping) or not nodes:
        raise EGraphFormatError(f"{name}: 'nodes' must be a non-empty object of node id → node")
    node_ids = tuple(str(k) for k in nodes)
    node_index = {nid: i for i, nid in enumerate(node_ids)}
    class_index: dict[str, int] = {}
    node_class = np.empty(len(node_ids), dtype=np.int32)
    cost = np.empty(len(node_ids), dtype=np.float64)
    ops: list[str] = []
    raw_children: list[Any] = []
    for i, (nid, node) in enumerate(nodes.items()):
        if not isinstance(node, Mapping):
            raise EGraphFormatError(f"{name}: node {nid!r} must be an object")
        eclass = node.get("eclass")
        if eclass is None:
            raise EGraphFormatError(f"{name}: node {nid!r} has no 'eclass'")
        node_class[i] = class_index.setdefault(str(eclass), len(class_index))
        c = node.get("cost", 1.0)
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise EGraphFormatError(f"{name}: node {nid!r} has a non-numeric cost {c!r}")
        try:
            c = float(c)
        except OverflowError:
            raise EGraphFormatError(f"{name}: node {nid!r} has a cost too large for a float ({len(str(c))} digits)") from None
        if not math.isfinite(c):
            raise EGraphFormatError(f"{name}: node {nid!r} has cost {c!r}; costs must be finite")
        cost[i] = c
        ops.append(str(node.get("op", "")))
        children = node.get("children", [])
        if not isinstance(children, list):
            raise EGraphFormatError(f"{name}: node {nid!r}: 'children' must be a list of node ids")
        raw_children.append(children)

    child_ptr = np.zeros(len(node_ids) + 1, dtype=np.int64)
    flat: list[int] = []
    for i, children in enumerate(raw_children):
        for ch in children:
            j = node_index.get(str(ch))
            if j is None:
                raise EGraphFormatError(f"{name}: node {node_ids[i]!r} has child {ch!r}, which names no node")
            flat.append(int(node_class[j]))
        child_ptr[i + 1] = len(flat)
    child_class = np.asarray(flat, dtype=np.int32)

    roots_raw = data.get("root_eclasses")
    if not isinstance(roots_raw, list) or not roots_raw:
        raise EGraphFormatError(f"{name}: no root: 'root_eclasses' must be a non-empty list of class ids")
    roots: list[int] = []
    for r in roots_raw:
        k = class_index.get(str(r))
        if k is None:
            raise EGraphFormatError(f"{name}: root {r!r} names no e-class that has a node")
        if k not in roots:
            roots.append(k)

    order = np.argsort(node_class, kind="stable").astype(np.int32)
    counts = np.bincount(node_class, minlength=len(class_index))
    class_ptr = np.zeros(len(class_index) + 1, dtype=np.int64)
    np.cumsum(counts, out=class_ptr[1:])
    return EGraphData(
        name=name,
        node_ids=node_ids,
        class_ids=tuple(class_index),
        ops=tuple(ops),
        node_class=_frozen(node_class),
        cost=_frozen(cost),
        child_ptr=_frozen(child_ptr),
        child_class=_frozen(child_class),
        class_ptr=_frozen(class_ptr),
        class_nodes=_frozen(order),
        roots=_frozen(np.asarray(roots, dtype=np.int32)),
    )

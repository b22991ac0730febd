"""Search results reused across input shapes of one `@eqsat.optimize` program.

A new batch size or sequence length makes a new signature, and the IR's regions carry shapes, so
without this every new shape paid a full e-graph search (0.4–20 s). But the rewrites a search
picks rarely depend on the sizes: a region at a new shape has the same ops, attributes and ranks
(`shape_free_key`), and the candidate found at the old shape, re-built at the new one
(`reshape_like`: leaf shapes and the size-carrying attributes mapped from the old region to the new,
every other shape re-inferred by the op registry), is the same rewrite. Such a region is seeded
into the signature's `RegionSearch` and not searched again; a candidate that no longer fits is
dropped (its region is searched). Every reused candidate is still checked against the original
on the new shape's inputs (`decorator_checks`), so reuse never changes what is correct.

The keep/discard decision is remembered per program too (`Plan`), looked up right after capture
(`program_key`, before any region is split or searched): a program discarded at one shape (or
with no rewrite) is not searched, built or timed again at another; one kept has only its kept
candidate re-built, checked equal against the original on the new shape's inputs (by the wrapper
on the program the call compiles anyway, `Entry.pending`; else both compiled as one program), and
keeps the decision timed at the other shape (not re-timed unless `Options.reuse_timing_budget_s`
> 0). The memory is per wrapper (no global state).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eqsat import ops
from eqsat.candidates import RegionCandidates, RegionSearch, computed_nodes
from eqsat.ir import Graph, Node
from jax_backend.timing import Decision

__all__ = ["Plan", "ShapeMemory", "plan_of", "program_key", "record_plan", "remember", "reshape_like", "seed_search",
           "shape_free_key"]

_SIZE_ATTRS = frozenset({"shape", "input_shape"})
"""Attributes that hold sizes (a leaf's or reshape's / broadcast's / iota's target shape): erased
from the key, mapped from the old region to the new when a candidate is re-built."""


def shape_free_key(graph: Graph) -> Hashable:
    """Equal for graphs that differ only in sizes: ops, wiring, outputs, ranks and every attribute
    except sizes (`_SIZE_ATTRS` kept as their rank)."""
    def attrs(n: Node) -> tuple[tuple[str, Any], ...]:
        return tuple((k, len(v) if k in _SIZE_ATTRS and isinstance(v, tuple) else v) for k, v in n.attrs)

    return (tuple((n.op, attrs(n), n.inputs, tuple(len(s) for s in n.shapes)) for n in graph.nodes), graph.outputs)


def reshape_like(candidate: Graph, old: Graph, new: Graph) -> Graph | None:
    """`candidate` (a rewrite of `old`, over its leaves) re-built for `new` (`old` at other sizes,
    `shape_free_key` equal): a node whose attributes are those of a node of `old` takes the new
    node's attributes, other shapes are re-inferred. None where that is ambiguous or does not fit
    (the outputs' shapes must be `new`'s)."""
    mapping: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[tuple[str, Any], ...]] = {}
    for a, b in zip(old.nodes, new.nodes):
        if a.attrs != b.attrs and mapping.setdefault((a.op, a.attrs), b.attrs) != b.attrs:
            return None  # one old attribute set became two new ones: not a plain resize
    nodes: list[Node] = []
    try:
        for n in candidate.nodes:
            attrs = mapping.get((n.op, n.attrs), n.attrs)
            shapes = ops.infer_shapes(n.op, [nodes[v.node].shapes[v.index] for v in n.inputs], dict(attrs))
            nodes.append(Node(n.op, attrs, n.inputs, tuple(shapes)))
    except (ops.ShapeError, ValueError, KeyError, IndexError):
        return None
    graph = Graph(tuple(nodes), candidate.outputs)
    if [graph.shape(v) for v in graph.outputs] != [new.shape(v) for v in new.outputs]:
        return None
    return graph


@dataclass(frozen=True)
class Plan:
    """The keep/discard decision one signature of a program reached: `label` the candidate kept
    (None: the original was kept, for `reason`), the timed `decision` it rests on (None: not
    timed), and how many distinct regions the program has (a reuse reports them as reused)."""

    signature: str
    label: str | None
    reason: str
    decision: Decision | None = None
    regions: int = 0

    @property
    def where(self) -> str:
        """The signature, shortened for a report's reason (a model's has dozens of leaves)."""
        return self.signature if len(self.signature) <= 80 else self.signature[:77] + "..."


@dataclass
class ShapeMemory:
    """One wrapper's memory across signatures: each searched region's candidates by
    `shape_free_key` (with the region they were found for), the search set-up (rules, cost models)
    by device and ops, and each program's `Plan` by `program_key`. `searched` counts regions
    searched in the wrapper's life (a new shape of a seen program adds none)."""

    regions: dict[Hashable, tuple[Graph, RegionCandidates]] = field(default_factory=dict)
    setups: dict[tuple[str, frozenset[str]], RegionSearch] = field(default_factory=dict)
    plans: dict[Hashable, Plan] = field(default_factory=dict)
    searched: int = 0

    def setup(self, device: str, graphs: Sequence[Graph]) -> RegionSearch | None:
        """A fresh `RegionSearch` with the rules and models of a seen one for `device` whose ops
        cover `graphs`' (selecting and verifying rules again would only find the same ones)."""
        wanted = frozenset(n.op for g in graphs for n in g.nodes)
        for (dev, seen_ops), search in self.setups.items():
            if dev == device and wanted <= seen_ops:
                return RegionSearch(search.rules, search.models, search.extractor, search.iterations,
                                    search.max_enodes)
        return None


def program_key(steps: Sequence[Any]) -> Hashable:
    """Equal for captures of one program at different sizes: each graph step by `shape_free_key`
    (leaves renamed by position), each opaque step by its primitive."""
    from eqsat.structure import canonicalize

    return tuple(shape_free_key(canonicalize(s.graph).graph) if hasattr(s, "graph") else str(s.eqn.primitive)
                 for s in steps)


def _regions(graphs: Sequence[Graph]) -> list[Graph]:
    from eqsat.regions import split
    from eqsat.structure import canonicalize

    return [canonicalize(r.graph).graph for g in graphs if computed_nodes(g) >= 2
            for r in split(g).regions if computed_nodes(r.graph) >= 2]


def seed_search(search: RegionSearch, graphs: Sequence[Graph], memory: ShapeMemory) -> int:
    """Put into `search` every region of `graphs` a signature seen before searched at other sizes,
    its candidates re-built for these sizes (a candidate that does not fit is left out: its region
    keeps the others); returns how many regions were seeded."""
    seeded = 0
    for canon in _regions(graphs):
        if canon in search.candidates or canon in search.failed:
            continue
        seen = memory.regions.get(shape_free_key(canon))
        if seen is None:
            continue
        old, found = seen
        by_label: dict[str, Graph] = {}
        rebuilt: dict[int, Graph | None] = {}  # labels sharing one graph share its rebuild
        for label, g in found.by_label.items():
            if id(g) not in rebuilt:
                rebuilt[id(g)] = g if old == canon else reshape_like(g, old, canon)
            if (r := rebuilt[id(g)]) is not None:
                by_label[label] = r
        if found.by_label and not by_label:
            continue  # nothing fits at these sizes: search this region
        search.candidates[canon] = RegionCandidates(canon, by_label, found.enodes, found.eclasses, found.matches,
                                                    "reused from another input shape", found.errors, 0.0)
        seeded += 1
    return seeded


def remember(search: RegionSearch, device: str, graphs: Sequence[Graph], memory: ShapeMemory,
             seeded: int) -> int:
    """Keep `search`'s regions and set-up for later signatures; returns how many regions it searched."""
    for canon, found in search.candidates.items():
        memory.regions.setdefault(shape_free_key(canon), (canon, found))
    memory.setups.setdefault((device, frozenset(n.op for g in graphs for n in g.nodes)), search)
    searched = len(search.candidates) + len(search.failed) - seeded
    memory.searched += searched
    return searched


def plan_of(memory: ShapeMemory | None, key: Hashable) -> Plan | None:
    """The plan another signature of the same program (`program_key`) reached, if any."""
    return memory.plans.get(key) if memory is not None else None


def record_plan(memory: ShapeMemory | None, key: Hashable, plan: Plan) -> None:
    if memory is not None:
        memory.plans[key] = plan

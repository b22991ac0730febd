"""The parallelization rules (`eqsat/rewrites/library/parallel.rules`), instantiated per mesh axis.

The file is written for one generic axis with placeholders: `A` (the mesh axis index), `N` (its
size), `ACT` (an activation code), `D` and `E` (dims -1..-4, counted from the end), `ST` and `PAD` (a conv's
square stride, 1 or 2, and its padding code), `R` and `K` (a slice's or concat's rank, 2..5, and axis
from the front; `R1`, `K1` are one more), `PERM` (a transpose's permutation, every one but the
identity of ranks 2..4, with `D` each dim of its result, `DX` the input dim it reads and `PERM1`
the permutation behind one more leading device axis), `EW` (the first dim of a rank-5/6 value,
-5 or -6) and `BPERM` / `BPERM1` (a rank-5/6 permutation that keeps dim 0, `D` its first dim, and
the same behind the device axis: a patch cut's split batch, `batch_permutations`). Rule lines can bind float, list and integer attributes
(`?eps`, `?S`, a slice's `?a`) but do no arithmetic on them, so each line is expanded over the
placeholders' values; every
instance is named `rule[D=-1]@axis`. Rules are verified by the project's verifier
(`eqsat.rewrites.verify`) at N = 2 and N = 4 (its shape grid reaches 4, so a larger N cannot be
sampled); the rules are uniform in N. The file lives with the rule library but is no library group
(`library_rules`): its lines are templates, not rules, until instantiated here.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from eqsat.egglog_schema import ENCODED_AS
from eqsat.ir import Graph
from eqsat.ops import OPS, Activation, Padding
from eqsat.parallel.mesh import Mesh
from eqsat.rewrites import LIBRARY_DIR
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule, Term, subterms

RULE_FILE = LIBRARY_DIR / "parallel.rules"
_PLACEHOLDER = re.compile(r"(?<![\w?-])(A|N|ACT|D|EW|E|ST|PAD|R1|R|K1|K|BPERM1|BPERM|PERM1|PERM|DX)(?![\w-])")
DIMS: tuple[int, ...] = (-1, -2, -3, -4)  # -4: the batch of NCHW (verified on rank-5 stacks, shapes.WIDER_RANKS)
WIDE_DIMS: tuple[int, ...] = (-5, -6)  # the first dim of a rank-5/6 value (a patch cut); its split has rank 6/7
EXPANSIONS: Mapping[str, tuple[int, ...]] = MappingProxyType({
    "ACT": tuple(int(a) for a in Activation), "D": DIMS, "E": DIMS, "EW": WIDE_DIMS,
    "ST": (1, 2), "PAD": tuple(int(p) for p in Padding),  # conv strides (square) and paddings
    "R": (2, 3, 4, 5), "K": (0, 1, 2, 3, 4),  # a slice's / concat's rank and axis (counted from the front)
})
DERIVED: Mapping[str, tuple[str, int]] = MappingProxyType({"K1": ("K", 1), "R1": ("R", 1)})
"""Placeholders one more than another: the axis and rank of a slice or concat behind one more
(leading) device axis."""
PERM_RANKS: tuple[int, ...] = (2, 3, 4)
BATCH_PERM_RANKS: tuple[int, ...] = (5, 6)


def _perm_text(perm: Sequence[int]) -> str:
    return "[" + " ".join(map(str, perm)) + "]"


def permuted_dims() -> list[tuple[tuple[int, ...], int]]:
    """(permutation, dim D of its result, from the end) for every non-identity permutation of the
    ranks `PERM_RANKS` and every dim: a `PERM` line's expansion. Result dim `r + D` is input dim
    `perm[r + D]`, so a split of it is a split of input dim `perm[r + D] - r` (`DX`)."""
    return [(perm, d) for r in PERM_RANKS for perm in itertools.permutations(range(r))
            if perm != tuple(range(r)) for d in range(-r, 0)]


def batch_permutations() -> list[tuple[int, ...]]:
    """Every non-identity permutation of the ranks `BATCH_PERM_RANKS` that keeps dim 0 (a batch) in
    place: a `BPERM` line's expansion, with `D` its first dim. Every permutation and dim of these
    ranks (`permuted_dims`) would be 4,300 instances per axis; a patch cut moves only the dims
    behind the batch."""
    return [perm for r in BATCH_PERM_RANKS for perm in itertools.permutations(range(r))
            if perm[0] == 0 and perm != tuple(range(r))]


def _perm_env(perm: tuple[int, ...], dim: int) -> dict[str, int | str]:
    r = len(perm)
    return {"PERM": _perm_text(perm), "PERM1": _perm_text((0, *(p + 1 for p in perm))), "D": dim, "DX": perm[r + dim] - r}


def rule_lines(path: Path = RULE_FILE) -> list[str]:
    return _lines(path.read_text())


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _fill(line: str, env: Mapping[str, int | str]) -> str:
    def value(m: re.Match[str]) -> str:
        return str(env[m.group(1)])

    return _items(_PLACEHOLDER.sub(value, line))


def _items(line: str) -> str:
    """`(items K P)` → `[(dim P 0) ... (dim P K-1)]`: a shape written item by item, so the rewrite's
    shape case is known by its length (egglog's guard needs it; `(shape P)` has no literal length)."""
    start = line.find("(items ")
    if start < 0:
        return line
    count_end = line.index(" ", start + 7)
    count, depth, i = int(line[start + 7:count_end]), 0, count_end + 1
    while depth >= 0:  # to the `)` that closes `(items`
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        i += 1
    i -= 1
    pattern = line[count_end + 1:i].strip()
    listed = "[" + " ".join(f"(dim {pattern} {k})" for k in range(count)) + "]"
    return line[:start] + listed + _items(line[i + 1:])


def _expand(line: str, axis: int, parts: int) -> list[tuple[str, str]]:
    """(suffix, text) per assignment of the line's expanded placeholders."""
    used = {m.group(1) for m in _PLACEHOLDER.finditer(line)}
    if "BPERM" in used:  # the leading dim's split through a wide transpose (`batch_permutations`)
        return [(f"[BPERM={'.'.join(map(str, perm))}]",
                 _fill(line, {"A": axis, "N": parts, "D": -len(perm), "BPERM": _perm_text(perm),
                              "BPERM1": _perm_text((0, *(p + 1 for p in perm)))}))
                for perm in batch_permutations()]
    if "PERM" in used:  # the permutation and the dim are expanded together (`permuted_dims`)
        return [(f"[PERM={'.'.join(map(str, perm))},D={d}]", _fill(line, {"A": axis, "N": parts, **_perm_env(perm, d)}))
                for perm, d in permuted_dims()]
    names = sorted((used | {DERIVED[u][0] for u in used & set(DERIVED)}) & set(EXPANSIONS))
    out = []
    for values in itertools.product(*(EXPANSIONS[n] for n in names)):
        env = {"A": axis, "N": parts, **dict(zip(names, values))}
        if "D" in env and "E" in env and env["D"] == env["E"]:
            continue  # an all-to-all that moves nothing
        if "R" in env and not _fits_rank(env):
            continue
        env |= {d: env[base] + inc for d, (base, inc) in DERIVED.items() if base in env}
        suffix = "[" + ",".join(f"{n}={v}" for n, v in zip(names, values)) + "]" if names else ""
        out.append((suffix, _fill(line, dict(env))))
    return out


def _fits_rank(env: Mapping[str, int]) -> bool:
    """A slice's / concat's axis K within its rank R, and a partition's dim D (from the end) within
    the rank and not the sliced axis (a split along the sliced axis is no slice of a split)."""
    rank, axis, dim = env["R"], env.get("K", 0), env.get("D", -1)
    return axis < rank and -dim <= rank and dim != axis - rank


def instantiate(axis: int, parts: int, names: Sequence[str] | None = None, path: Path = RULE_FILE) -> list[Rule]:
    """The rules for one mesh axis of size `parts` (optionally only the base names in `names`)."""
    return [rule for base, rule in _instances(path.read_text(), str(path), axis, parts) if names is None or base in names]


@functools.lru_cache(maxsize=32)
def _instances(text: str, source: str, axis: int, parts: int) -> tuple[tuple[str, Rule], ...]:
    """(base name, instance) of every rule of the file `text` on one axis. Memoized on the file's
    text: parsing the expanded lines is most of the time a plan spends on its rule set, and a test
    run plans hundreds of graphs."""
    out: list[tuple[str, Rule]] = []
    for line in _lines(text):
        for suffix, filled in _expand(line, axis, parts):
            out.extend((rule.name, replace(rule, name=f"{rule.name}{suffix}@{axis}")) for rule in parse_rule_text(filled, source))
    return tuple(out)


def mesh_rules(mesh: Mesh, names: Sequence[str] | None = None) -> list[Rule]:
    """Every axis's instance of the rules."""
    return [r for i, ax in enumerate(mesh.axes) for r in instantiate(i, ax.size, names=names)]


Held = tuple[object, ...]
"""What a graph (or a rule's right side) can hold: `(op,)` some instance; for an op with a
`rank_attr`, `(op, "value", v)` one with that attribute, `(op, "rank", r)` one of rank r,
`(op, "rank?", r)` one of rank r whose value is not known, `(op, "wild",)` one of any rank."""


def _attr_key(t: Term) -> tuple[int, ...] | int | None:
    """A term's literal `rank_attr` (a tuple), or its rank when the list's items are not literals
    (an int), or None when nothing is known (`?S`, `(shape P)`, an op without a `rank_attr`)."""
    spec = OPS.get(t.op)
    if spec is None or spec.rank_attr is None:
        return None
    value = t.attr.get(spec.rank_attr)
    if not isinstance(value, tuple):
        return None
    return value if all(isinstance(v, int) for v in value) else len(value)


def _made(t: Term) -> set[Held]:
    """What building the right side's term `t` adds to a graph."""
    spec = OPS.get(t.op)
    key = _attr_key(t)
    if isinstance(key, tuple):
        return {(t.op,), (t.op, "value", key), (t.op, "rank", len(key))}
    if isinstance(key, int):
        return {(t.op,), (t.op, "rank", key), (t.op, "rank?", key)}
    return {(t.op,), (t.op, "wild")} if spec is not None and spec.rank_attr is not None else {(t.op,)}


def _needed(t: Term) -> frozenset[Held]:
    """What matching the left side's term `t` needs a graph to hold: any one of these."""
    key = _attr_key(t)
    if isinstance(key, tuple):
        return frozenset({(t.op, "value", key), (t.op, "rank?", len(key)), (t.op, "wild")})
    if isinstance(key, int):
        return frozenset({(t.op, "rank", key), (t.op, "wild")})
    return frozenset({(t.op,)})


def held_by(graph: Graph) -> set[Held]:
    """What `graph`'s nodes hold, as rule sides see it (`Held`); a split is held as slices."""
    out: set[Held] = set()
    for n in graph.nodes:
        op = ENCODED_AS.get(n.op, n.op)
        spec = OPS.get(op)
        value = n.attr.get(spec.rank_attr) if spec is not None and spec.rank_attr is not None else None
        if value is None:
            out.add((op,))
        else:
            value = tuple(value)
            out |= {(op,), (op, "value", value), (op, "rank", len(value))}
    return out


def applicable(rules: Sequence[Rule], graph: Graph, before: Sequence[Rule] = ()) -> list[Rule]:
    """The rules that can ever fire on `graph`: each term of a left side must be held by the graph
    or built by the right side of a rule that can fire (a fixpoint), at its rank and, for a literal
    `rank_attr` (a transpose's permutation), that value. Conv rules never fire on a transformer,
    nor a rank-5 transpose's rules on rank-3 values; leaving them out keeps saturation and the ILP
    to what can matter. Exact: a left side's term matches only an e-node the graph held or a right
    side built, with the same op and attribute. `before`: rules that ran earlier on the same e-graph
    (a strategy's earlier stages); what they can build is held too."""
    every = [*before, *rules]
    needs = [[_needed(t) for p in r.lhs for t in subterms(p)] for r in every]
    makes = [{h for p in r.rhs for t in subterms(p) for h in _made(t)} for r in every]
    have = held_by(graph)
    live = [False] * len(every)
    changed = True
    while changed:
        changed = False
        for i, need in enumerate(needs):
            if not live[i] and all(alt & have for alt in need):
                live[i] = True
                if not makes[i] <= have:
                    have |= makes[i]
                    changed = True
    return [r for r, ok in zip(rules, live[len(before):]) if ok]

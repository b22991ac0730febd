"""Synthesize rules, TASO's way: enumerate small graphs, fingerprint, pair, verify, prune.

Graphs (terms) are built up to `max_ops` operators over a few input variables of one small shape.
Each is fingerprinted by its exact values modulo a prime on random inputs (activations are
consistent pseudo-random functions). Terms with equal shape and fingerprint become candidate rules
(both directions). As in TASO, only the first term of each fingerprint class is used to build
bigger terms: any bigger term built from another member is equal to one built from the first by a
rule that is already a candidate. Candidates go smallest first; one derivable in a small e-graph
from the rules kept so far is dropped, otherwise it is verified and kept if proved.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eqsat.errors import EqsatError, ShapeError
from eqsat.ops import Shape
from eqsat.paths import tensat_rule_files
from eqsat.rewrites.derive import derivable
from eqsat.rewrites.printer import rule_text
from eqsat.rewrites.rule import Pattern, Rule, Term, Var, ops_used, subterms, variables
from eqsat.rewrites.semantics import FieldAlgebra, evaluate_pattern, term_shape
from eqsat.rewrites.verify import VerifyOptions, verify_rule

SYNTH_OPS: tuple[str, ...] = ("ewadd", "ewmul", "matmul", "transpose", "relu", "concat", "split")


@dataclass(frozen=True)
class SynthOptions:
    max_ops: int = 2
    time_limit: float = 300.0
    ops: tuple[str, ...] = SYNTH_OPS
    # (input shape, number of input variables) per enumeration: matmuls and rank-2 concats, then
    # Tensat's rank-4 concats; a fourth variable where rules need one (concat of two sums)
    worlds: tuple[tuple[Shape, int], ...] = (((2, 2), 4), ((2, 2, 1, 2), 3))
    trials: int = 2
    seed: int = 0
    tensat_rules: str | None = field(default_factory=lambda: str(tensat_rule_files()[0]))


def _builders(ops: Sequence[str], shape: Shape) -> tuple[list[Any], list[Any]]:
    """Unary and binary term constructors for the op set (concat carries Tensat's rank guard)."""
    rank = len(shape)
    unary: list[Any] = []
    binary: list[Any] = []
    if "relu" in ops:
        unary.append(lambda x: Term("relu", (), (x,)))
    if "transpose" in ops:
        unary.append(lambda x: Term("transpose", (("perm", tuple(reversed(range(rank)))),), (x,)))
    if "split" in ops:  # halves of a split, as slices: only shape-specific equalities come out of these
        for axis in range(rank):
            half = shape[axis] // 2
            if half:
                unary.append(lambda x, a=axis, h=half: Term("slice", (("axis", a), ("start", 0), ("stop", h)), (x,)))
    for op in ("ewadd", "ewmul"):
        if op in ops:
            binary.append(lambda x, y, o=op: Term(o, (), (x, y)))
    if "matmul" in ops:
        binary.append(lambda x, y: Term("matmul", (("act", 0),), (x, y)))
    if "concat" in ops:
        for axis in range(min(rank, 2)):
            binary.append(lambda x, y, a=axis: Term("concat", (("axis", a),), (x, y), (("ndim", rank),)))
    return unary, binary


@dataclass
class _Entry:
    term: Pattern
    shape: Shape
    values: list[np.ndarray]
    ops: int


def enumerate_classes(options: SynthOptions, shape: Shape, names: Sequence[str],
                      deadline: float) -> tuple[list[_Entry], list[tuple[Pattern, Pattern]]]:
    """Representatives of every fingerprint class, and (term, representative) pairs of equal terms."""
    alg = [FieldAlgebra(salt=options.seed + t) for t in range(options.trials)]
    rng = np.random.default_rng(options.seed)
    inputs = [{v: a.random(shape, rng) for v in names} for a in alg]
    unary, binary = _builders(options.ops, shape)
    reps: dict[tuple[Shape, bytes], _Entry] = {}
    by_size: list[list[_Entry]] = [[]]
    pairs: list[tuple[Pattern, Pattern]] = []

    def offer(term: Term, args: Sequence[_Entry], size: int) -> None:
        try:
            shape = term_shape(term, [a.shape for a in args], None)
        except ShapeError:
            return
        values = [_apply(term, [a.values[t] for a in args], alg[t]) for t in range(len(alg))]
        key = (shape, b"".join(v.tobytes() for v in values))
        if key in reps:
            pairs.append((term, reps[key].term))
            return
        entry = _Entry(term, shape, values, size)
        reps[key] = entry
        by_size[size].append(entry)

    for v in names:
        e = _Entry(Var(v), shape, [inp[v] for inp in inputs], 0)
        reps[(shape, b"".join(x.tobytes() for x in e.values))] = e
        by_size[0].append(e)
    for size in range(1, options.max_ops + 1):
        by_size.append([])
        for x in list(by_size[size - 1]):
            for make in unary:
                offer(make(x.term), [x], size)
        for left_size in range(size):
            for x in list(by_size[left_size]):
                if time.perf_counter() > deadline:
                    return list(reps.values()), pairs
                for y in list(by_size[size - 1 - left_size]):
                    for make in binary:
                        offer(make(x.term, y.term), [x, y], size)
    return list(reps.values()), pairs


def _arg_names(n: int) -> list[str]:
    return [f"_{i}" for i in range(n)]


def _apply(term: Term, args: Sequence[np.ndarray], alg: FieldAlgebra) -> np.ndarray:
    shallow = Term(term.op, term.attrs, tuple(Var(n) for n in _arg_names(len(args))), term.guards)
    return evaluate_pattern(shallow, dict(zip(_arg_names(len(args)), args)), alg)


def _rename(lhs: Pattern, rhs: Pattern) -> tuple[Pattern, Pattern]:
    """Variables renamed in order of first occurrence, so renamed copies of a rule coincide."""
    names: dict[str, str] = {}
    for v in [*variables(lhs), *variables(rhs)]:
        names.setdefault(v, "xyzuvw"[len(names)] if len(names) < 6 else f"v{len(names)}")

    def go(p: Pattern) -> Pattern:
        return Var(names[p.name]) if isinstance(p, Var) else Term(p.op, p.attrs, tuple(map(go, p.args)), p.guards)

    return go(lhs), go(rhs)


def _size(p: Pattern) -> int:
    return sum(1 for _ in subterms(p))


def candidate_rules(pairs: Sequence[tuple[Pattern, Pattern]]) -> list[Rule]:
    """Both directions of every pair whose right side uses only left-side variables, deduplicated."""
    seen: set[tuple[Pattern, Pattern]] = set()
    out: list[Rule] = []
    for t, rep in pairs:
        for lhs, rhs in ((t, rep), (rep, t)):
            if isinstance(lhs, Var) or not set(variables(rhs)) <= set(variables(lhs)):
                continue
            key = _rename(lhs, rhs)
            if key not in seen:
                seen.add(key)
                out.append(Rule("", (key[0],), (key[1],)))
    out.sort(key=lambda r: (_size(r.lhs[0]) + _size(r.rhs[0]), _size(r.lhs[0])))
    return [Rule(f"synth-{i}", r.lhs, r.rhs, "synth") for i, r in enumerate(out)]


def tensat_coverage(kept: Sequence[Rule], tensat_file: str | None, ops: Sequence[str]) -> dict[str, Any]:
    """How many of Tensat's single-pattern rules over `ops` follow from the kept rules."""
    from eqsat.rewrites.parser import load_rules

    if not tensat_file or not Path(tensat_file).exists():
        return {"tensat_rules": None, "tensat_rederived": None}  # data not present
    allowed = {("split_part" if o == "split" else o) for o in ops}
    target = [r for r in load_rules(tensat_file)
              if all(ops_used(p) <= allowed for p in r.lhs + r.rhs)
              and all(t.attr.get("act", 0) == 0 for p in r.lhs + r.rhs for t in subterms(p))]
    hit = [r for r in target if derivable(r, kept, iterations=8, max_nodes=6000) is not None]
    true = [r for r in target if verify_rule(r, VerifyOptions(), axioms=()).proved]
    true_hit = [r for r in true if r in hit]
    return {"tensat_rules": len(target), "tensat_rederived": len(hit), "tensat_rules_proved": len(true),
            "tensat_rederived_of_proved": len(true_hit),
            "tensat_rederived_fraction_of_proved": round(len(true_hit) / max(len(true), 1), 4),
            "tensat_missed_proved": [r.name for r in true if r not in hit]}


def synthesize(options: SynthOptions = SynthOptions(), out: str | Path | None = None,
               progress: bool = False) -> dict[str, Any]:
    """Run the synthesizer; writes the kept rules to `out` and returns the report."""
    start = time.perf_counter()
    deadline = start + options.time_limit
    unknown_ops = set(options.ops) - set(SYNTH_OPS)
    if unknown_ops:
        raise EqsatError(f"rules synth: cannot enumerate op(s) {sorted(unknown_ops)}; supported: {list(SYNTH_OPS)}")
    classes, pairs = 0, []
    for shape, count in options.worlds:
        reps, found = enumerate_classes(options, shape, "abcdef"[:count], deadline)
        classes += len(reps)
        pairs += found
    candidates = candidate_rules(pairs)
    enumerate_s = time.perf_counter() - start
    kept: list[Rule] = []
    stats = {"derivable": 0, "verified": 0, "refuted": 0, "unknown": 0, "unprocessed": 0}
    vopts = VerifyOptions(samples=12, proof_shapes=2, seed=options.seed)
    for rule in _progress(candidates, progress):
        if time.perf_counter() > deadline:
            stats["unprocessed"] += 1
            continue
        if kept and derivable(rule, kept, iterations=4, max_nodes=1500) is not None:
            stats["derivable"] += 1
            continue
        result = verify_rule(rule, vopts, axioms=())
        if result.proved:
            stats["verified"] += 1
            kept.append(rule)
        else:
            stats[result.status] += 1
    coverage = tensat_coverage(kept, options.tensat_rules, options.ops)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(f"# eqsat rules synth --max-ops {options.max_ops}: {len(kept)} rules over "
                             f"{', '.join(options.ops)}\n" + "".join(rule_text(r) + "\n" for r in kept))
    return {"candidates": len(candidates), "verified": stats["verified"], "kept": len(kept),
            "seconds": round(time.perf_counter() - start, 3), "classes": classes, "enumerate_s": round(enumerate_s, 3),
            **{k: v for k, v in stats.items() if k != "verified"}, **coverage, "out": str(out) if out else None}


def _progress(items: Sequence[Rule], show: bool) -> Iterator[Rule]:
    if not show:
        yield from items
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("checking candidates", total=len(items))
        for item in items:
            yield item
            bar.advance(task)

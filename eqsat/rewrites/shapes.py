"""Concrete shape assignments for a rule's variables that make its left side well-typed.

Variables get ranks first (an exhaustive search with pruning: ranks are few), then dims from a small
grid by a randomized depth-first search that checks every left-side subterm as soon as its
variables are bound, with the registry's shape inference. Candidate shapes are drawn first from the
shapes already seen in the pattern (a sibling's shape, a transpose), which finds the equalities
that ops demand without enumerating the whole grid. Side conditions (`if (= (dim ?x 1) 3)`) prune
the same way. A list attribute matched as a variable (`?S`) is sampled like a shape; a float one
(`?eps`) is fixed (see `semantics.bind_attrs`).

In guarded mode (`guarded=True`) an assignment must also make the right sides well-typed with the
left sides' shapes: the region where an applier that checks its right side's type fires the rule.

`adversarial_assignments` draws the shapes where tensor rewrites go wrong instead of the likely
ones: dims from the rule's own attributes (a stride s gives s + 1, 2s + 1, ...: clipped SAME
padding, windows that do not tile), size-1 and prime dims, every variable's shape changed away from
its siblings' first (unequal kernels under `enlarge`, uneven concat / split pieces, non-square
transposes), so a rule true only where the likely shapes coincide is caught.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eqsat.errors import ShapeError
from eqsat.ops import Shape
from eqsat.rewrites.rule import (CLASS_CONDITIONS, AttrVar, Pattern, Rule, Term, Var, attr_variables, referenced_variables, subterms,
                                 term_attr_refs)
from eqsat.rewrites.semantics import FLOAT_ATTR_VALUE, bind_attrs, pattern_shape, rule_split_sizes, term_shape

DIMS: tuple[int, ...] = (1, 2, 3, 4)
RANKS: tuple[int, ...] = (1, 2, 3, 4)
WIDER_RANKS: tuple[int, ...] = (1, 2, 3, 4, 5)  # tried only when RANKS type no left side (distributed 4-D values)
WIDEST_RANKS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)  # tried only when WIDER_RANKS type none (a distributed patch cut)

Env = dict[str, Shape]


@dataclass(frozen=True)
class ShapeChecker:
    """Checks partial assignments against a rule's left sides and conditions."""

    rule: Rule
    guarded: bool = False

    @property
    def order(self) -> list[str]:
        """Variables in first-occurrence order over a post-order walk: siblings stay adjacent."""
        seen: list[str] = []
        for p in self.rule.lhs:
            for v in _sampled_vars(p):
                if v not in seen:
                    seen.append(v)
        return seen

    @property
    def fixed(self) -> dict[str, float]:
        """Float attribute variables and the value they are verified at."""
        return {a.name: FLOAT_ATTR_VALUE for p in self.rule.lhs for a in attr_variables(p) if a.kind == "float"}

    def lhs_shapes(self, env: Mapping[str, Shape]) -> list[Shape] | None:
        """Shapes of the left sides, or None when ill-typed (or a condition fails) under `env`."""
        try:
            memo: dict[int, Shape] = {}
            shapes = [_shape(p, env, memo) for p in self.rule.lhs]
        except (ShapeError, _Unbound):
            return None
        if not all(condition_holds(c, env) for c in self.rule.conditions):
            return None
        if self.guarded and rhs_shapes(self.rule, env) != shapes:
            return None
        return shapes

    def partial_ok(self, env: Mapping[str, Shape], memo: dict[int, Shape | None]) -> bool:
        """False as soon as some fully bound left-side subterm is ill-typed or a condition fails."""
        for p in self.rule.lhs + (self.rule.rhs if self.guarded else ()):
            if _partial(p, env, memo) is False:
                return False
        for c in self.rule.conditions:
            try:
                if not condition_holds(c, env):
                    return False
            except _Unbound:
                pass
        return True


class _Unbound(Exception):
    pass


def _sampled_vars(p: Pattern) -> list[str]:
    """Tensor variables and list-attribute variables, post-order (a term's attributes after its args)."""
    if isinstance(p, Var):
        return [p.name]
    out = [v for a in p.args for v in _sampled_vars(a)]
    return out + [r.name for r in term_attr_refs(p) if isinstance(r, AttrVar) and r.kind in ("int", "ints")]


def _needed(t: Term) -> set[str]:
    """Every variable `t`'s shape depends on (its tensors', its attributes')."""
    return set(_sampled_vars(t)) | {v for s in subterms(t) for v in referenced_variables(s)}


def rhs_shapes(rule: Rule, env: Mapping[str, Shape]) -> list[Shape] | None:
    """Shapes of the right sides under a complete `env` (split sizes from the left sides), or None."""
    try:
        sizes = rule_split_sizes(rule, env)
        return [pattern_shape(p, env, sizes) for p in rule.rhs]
    except ShapeError:
        return None


def _shape(p: Pattern, env: Mapping[str, Shape], memo: dict[int, Shape]) -> Shape:
    if isinstance(p, Var):
        if p.name not in env:
            raise _Unbound(p.name)
        return env[p.name]
    if id(p) not in memo:
        if not referenced_variables(p) <= set(env):
            raise _Unbound(p.op)
        memo[id(p)] = term_shape(bind_attrs(p, env), [_shape(a, env, memo) for a in p.args], None)
    return memo[id(p)]


def _partial(p: Pattern, env: Mapping[str, Shape], memo: dict[int, Shape | None]) -> Shape | None | bool:
    """A shape when bound and well-typed, None when not all bound, False when ill-typed."""
    if isinstance(p, Var):
        return env.get(p.name)
    if id(p) in memo:
        return memo[id(p)] if memo[id(p)] is not None else False
    args = [_partial(a, env, memo) for a in p.args]
    if any(a is False for a in args):
        return False
    if any(a is None for a in args) or p.op == "split_part" or not referenced_variables(p) <= set(env):
        return None  # unbound, or a split piece (sizes come from the complete left sides)
    try:
        out: Shape | None = term_shape(bind_attrs(p, env), args, None)  # type: ignore[arg-type]
    except ShapeError:
        out = None
    memo[id(p)] = out
    return out if out is not None else False


def condition_holds(c: Term | Var, env: Mapping[str, Shape]) -> bool:
    return bool(_cond_value(c, env))


def _cond_value(c: Any, env: Mapping[str, Shape]) -> Any:
    if isinstance(c, Var):
        if c.name not in env:
            raise _Unbound(c.name)
        return env[c.name]
    if c.op == "const":
        return c.attr["value"]
    if c.op in CLASS_CONDITIONS:  # a condition on e-classes, not on shapes: holds for some application
        return True
    args = [_cond_value(a, env) for a in c.args]
    if c.op == "dim":
        shape, i = args
        return shape[i] if 0 <= i < len(shape) else -1
    if c.op == "rank":
        return len(args[0])
    fns = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
           "<=": lambda a, b: a <= b, "+": lambda a, b: a + b, "-": lambda a, b: a - b,
           "*": lambda a, b: a * b, "%": lambda a, b: a % b if b else -1}
    return fns[c.op](*args)


def rank_choices(rule: Rule, limit: int = 64, guarded: bool = False,
                 ranks: Sequence[int] = RANKS, only: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, int]]:
    """Every rank assignment (over `ranks`; over `only[v]` for a variable whose other ranks are
    ill-typed anyway) under which the left sides (and in guarded mode the right
    sides) can be well-typed with all dims equal to one grid value (2 and 1 first; larger ones for
    ops that need room, e.g. a 3x3 VALID pool)."""
    checker = ShapeChecker(rule, guarded)
    order = checker.order
    pinned = pinned_ranks(rule)
    if order and set(order) <= set(pinned):  # a reshape between ranks: never typed with equal dims
        return [{v: pinned[v] for v in order}]
    found: list[dict[str, int]] = []
    # integer attribute variables (a slice's ?start, ?stop) are one dim (`semantics.int_attr_value`)
    # and left unbound here: equal to the dims, a slice's start and stop would be equal
    ints = {a.name for p in rule.lhs for a in attr_variables(p) if a.kind == "int"}
    only = {**(only or {}), **{v: (1,) for v in ints}}

    def ok(chosen: Mapping[str, int]) -> bool:
        complete = guarded and len(chosen) == len(order) and not ints  # split pieces are checked only when complete
        for fill in (2, 1, *(d for d in DIMS if d > 2)):
            env: dict[str, Any] = {v: (fill,) * r for v, r in chosen.items() if v not in ints} | checker.fixed
            if checker.partial_ok(env, {}) and not (complete and checker.lhs_shapes(env) is None):
                return True
        return False

    def dfs(i: int, chosen: dict[str, int]) -> None:
        if len(found) >= limit:
            return
        if i == len(order):
            found.append(dict(chosen))
            return
        for r in only.get(order[i], ranks):
            chosen[order[i]] = r
            if ok(chosen):
                dfs(i + 1, chosen)
            del chosen[order[i]]

    dfs(0, {})
    return found


def pinned_ranks(rule: Rule) -> dict[str, int]:
    """Ranks the conditions fix, `(= (rank ?v) k)` or `(= (+ (rank ?v) k) m)` (a rank written from a
    negative dim placeholder): the only ranks at which the rule can apply."""
    out: dict[str, int] = {}
    for c in rule.conditions:
        if not (isinstance(c, Term) and c.op == "=" and len(c.args) == 2):
            continue
        for a, b in (c.args, c.args[::-1]):
            if not (isinstance(b, Term) and b.op == "const"):
                continue
            offset, head = 0, a
            if isinstance(head, Term) and head.op == "+":
                inc = head.args[1]
                if isinstance(inc, Term) and inc.op == "const":
                    head, offset = head.args[0], int(inc.attr["value"])
            if isinstance(head, Term) and head.op == "rank" and isinstance(head.args[0], Var):
                out[head.args[0].name] = int(b.attr["value"]) - offset
    return out


def _reshape_inputs(rule: Rule) -> dict[str, Pattern]:
    """List-attribute variables that are a reshape's target shape on a left side → its input."""
    out: dict[str, Pattern] = {}
    for p in rule.lhs:
        for t in subterms(p):
            shape = dict(t.attrs).get("shape") if t.op == "reshape" else None
            if isinstance(shape, AttrVar):
                out.setdefault(shape.name, t.args[0])
    return out


def _factorizations(total: int, rank: int) -> list[Shape]:
    if rank == 1:
        return [(total,)]
    return [(d, *rest) for d in range(1, total + 1) if total % d == 0 for rest in _factorizations(total // d, rank - 1)]


_MISSING = object()


class _Sampler:
    """Randomized depth-first search for well-typed assignments, checking each subterm once bound."""

    def __init__(self, rule: Rule, seed: int, dims: Sequence[int], guarded: bool = False,
                 adversarial: bool = False) -> None:
        self.rule, self.dims, self.adversarial = rule, tuple(dims), adversarial
        self.checker = ShapeChecker(rule, guarded)
        self.order = self.checker.order
        self.reshaped = _reshape_inputs(rule)  # a reshape's ?S: drawn from the factorizations of its input's size
        self.rng = np.random.default_rng(seed)
        self.cache: dict[tuple[Any, ...], Shape | None] = {}
        # per subterm (by id), what its own attributes reference: the sorted variable names that key
        # its cached shape, and whether it has references to bind at all (asked once, not per draw)
        self.refs: dict[int, tuple[str, ...]] = {}
        self.binds: dict[int, bool] = {}
        for p in rule.lhs + rule.rhs:
            for t in _post_order(p):
                self.note(t)
        position = {v: i for i, v in enumerate(self.order)}
        # subterms that become fully bound when order[i] is bound, children first
        self.ready: list[list[Term]] = [[] for _ in self.order]
        self.cond_ready: list[list[Term]] = [[] for _ in self.order]
        for p in rule.lhs + (rule.rhs if guarded else ()):
            for t in _post_order(p):
                vs = {v for v in _needed(t) if v in position}
                if vs and not any(s.op == "split_part" for s in _post_order(t)):
                    self.ready[max(position[v] for v in vs)].append(t)
        for c in rule.conditions:
            names = [v.name for v in _cond_vars(c)]
            self.cond_ready[max((position.get(v, 0) for v in names), default=0)].append(c)

    def note(self, t: Term) -> None:
        """Record what `t`'s own attributes reference (asked once per subterm, not per draw)."""
        self.refs[id(t)] = tuple(sorted(referenced_variables(t)))
        self.binds[id(t)] = bool(term_attr_refs(t))

    def shape_of(self, p: Pattern, env: Mapping[str, Shape]) -> Shape | None:
        if isinstance(p, Var):
            return env[p.name]
        if id(p) not in self.refs:  # not a subterm of the rule's sides
            self.note(p)
        return self._shape_of(p, env)

    def _shape_of(self, p: Term, env: Mapping[str, Shape]) -> Shape | None:
        args = tuple(self.shape_of(a, env) for a in p.args)
        if any(a is None for a in args):
            return None
        key = (id(p), args, tuple(env[v] for v in self.refs[id(p)]))
        found = self.cache.get(key, _MISSING)
        if found is _MISSING:
            try:
                found = term_shape(bind_attrs(p, env) if self.binds[id(p)] else p, args, None)  # type: ignore[arg-type]
            except ShapeError:
                found = None
            self.cache[key] = found
        return found  # type: ignore[return-value]

    def bound_ok(self, i: int, env: Mapping[str, Shape], seen: list[Shape]) -> bool:
        for t in self.ready[i]:
            s = self.shape_of(t, env)
            if s is None:
                return False
            seen.append(s)
        if not all(condition_holds(c, env) for c in self.cond_ready[i]):
            return False
        return not (self.checker.guarded and i == len(self.order) - 1 and self.checker.lhs_shapes(env) is None)

    def candidates(self, rank: int, seen: Sequence[Shape]) -> list[Shape]:
        """Shapes to try for a variable: shapes seen nearby, then one-dim changes of them, then random
        ones, interleaved by random priorities so that samples differ."""
        same = [s for s in seen if len(s) == rank]
        hints = list(dict.fromkeys(same + [tuple(reversed(s)) for s in same]))
        nudged = [s[:i] + (d,) + s[i + 1:] for s in hints for i in range(rank) for d in self.dims if d != s[i]]
        grid = np.asarray(self.dims)[self.rng.integers(0, len(self.dims), size=(min(4 ** rank, 24), rank))]
        randoms = [tuple(row) for row in grid.tolist()]
        pool = hints + nudged + randoms
        # adversarial: shapes unlike the siblings' first (the likely equal shapes last)
        bias = ([0.7] * len(hints) + [0.0] * len(nudged) + [0.2] * len(randoms) if self.adversarial
                else [0.0] * len(hints) + [0.35] * len(nudged) + [0.7] * len(randoms))
        ranked: dict[Shape, float] = {}
        for shape, b, r in zip(pool, bias, self.rng.random(len(pool)).tolist()):
            ranked[shape] = min(ranked.get(shape, 9.0), b + r)
        return sorted(ranked, key=ranked.__getitem__)

    def attempt(self, ranks: Mapping[str, int], budget: int) -> Env | None:
        env: Env = dict(self.checker.fixed)  # type: ignore[arg-type]
        steps = 0

        def dfs(i: int, seen: list[Shape]) -> bool:
            nonlocal steps
            if i == len(self.order):
                return True
            v = self.order[i]
            source = self.reshaped.get(v)
            size = self.shape_of(source, env) if source is not None else None
            pool = ([tuple(int(d) for d in row) for row in self.rng.permutation(np.asarray(_factorizations(int(np.prod(size)), ranks[v])))]
                    if size is not None and ranks[v] >= 1 else self.candidates(ranks[v], seen))
            for shape in pool:
                steps += 1
                if steps > budget:
                    return False
                env[v] = shape
                more = list(seen) + [shape]
                if self.bound_ok(i, env, more) and dfs(i + 1, more):
                    return True
                del env[v]
            return False

        return dict(env) if dfs(0, []) else None


def _post_order(p: Pattern) -> list[Term]:
    out: list[Term] = []
    if isinstance(p, Term):
        for a in p.args:
            out.extend(_post_order(a))
        out.append(p)
    return out


def _cond_vars(c: Any) -> list[Var]:
    if isinstance(c, Var):
        return [c]
    return [v for a in c.args for v in _cond_vars(a)]


def sampled_ranks(rule: Rule, guarded: bool = False) -> list[dict[str, int]]:
    """The rank assignments the samplers draw dims for: `rank_choices` over `RANKS`, else over
    `WIDER_RANKS`, else `WIDEST_RANKS`, else those that type the left side alone (see
    `sample_assignments`). Memoized per rule (a pure function of it): the likely and the
    adversarial sampler, strict and guarded, ask it."""
    try:
        found = _sampled_ranks(rule, guarded)
    except TypeError:  # an unhashable attribute value: no memo
        found = _sampled_ranks.__wrapped__(rule, guarded)
    return [dict(r) for r in found]


@functools.lru_cache(maxsize=4096)
def _sampled_ranks(rule: Rule, guarded: bool) -> tuple[tuple[tuple[str, int], ...], ...]:
    found = (rank_choices(rule, guarded=guarded) or rank_choices(rule, guarded=guarded, ranks=WIDER_RANKS)
             or rank_choices(rule, guarded=guarded, ranks=WIDEST_RANKS) or rank_choices(replace(rule, conditions=())))
    return tuple(tuple(r.items()) for r in found)


def sample_assignments(rule: Rule, count: int, seed: int = 0, max_steps: int = 6000,
                       dims: Sequence[int] = DIMS, guarded: bool = False) -> list[Env]:
    """Up to `count` distinct well-typed assignments, diverse by randomization; [] if none found.
    `guarded`: the right sides must be well-typed with the left sides' shapes too. Ranks come from
    `RANKS`, or `WIDER_RANKS` when no variable ranks up to 4 type the rule (a distributed NCHW value),
    or `WIDEST_RANKS` when none up to 5 do (a distributed patch cut), or, when no all-equal dims
    meet the conditions and the right side (an even group count: input channels twice a multiple
    of the kernel's), the ranks that type the left side alone; the sampler still checks both on
    every assignment."""
    ranks_list = sampled_ranks(rule, guarded)
    if not ranks_list:
        return []
    sampler = _Sampler(rule, seed, dims, guarded)
    found: dict[tuple[Shape, ...], Env] = {}
    used = 0
    for attempt in range(count * 3):
        if len(found) >= count or used >= max_steps:
            break
        ranks = ranks_list[attempt % len(ranks_list)]
        env = sampler.attempt(ranks, 400)
        used += 400 if env is None else 40
        if env is not None and sampler.checker.lhs_shapes(env) is not None:
            found.setdefault(tuple(env[v] for v in sampler.order), env)
    return list(found.values())


ADVERSARIAL_DIMS: tuple[int, ...] = (1, 2, 3, 5, 7)  # size-1, even and prime dims
MAX_ADVERSARIAL_DIM = 9


def attribute_dims(rule: Rule) -> tuple[int, ...]:
    """Dims that stress the rule's own attributes: for each stride or window size n in it, every
    residue modulo n in n..2n+1 and 3n (inputs the window does not tile: clipped, asymmetric SAME
    padding), with `ADVERSARIAL_DIMS`, capped at `MAX_ADVERSARIAL_DIM`."""
    found: set[int] = set(ADVERSARIAL_DIMS)
    for p in rule.lhs + rule.rhs:
        for t in _post_order(p):
            for key, value in t.attrs:
                if key.startswith(("stride", "kernel")) and isinstance(value, int) and value > 1:
                    found |= {*range(value, 2 * value + 2), 3 * value}
    return tuple(sorted(d for d in found if d <= MAX_ADVERSARIAL_DIM))


def adversarial_assignments(rule: Rule, count: int, seed: int = 0, max_steps: int = 8000,
                            guarded: bool = False, max_elements: int = 1500,
                            bases: Sequence[Env] = ()) -> list[Env]:
    """Up to `count` well-typed assignments chosen to break a wrong rule (see the module doc): a
    third drawn with dims from `attribute_dims`, each variable's shape away from its siblings'
    first; `bases` and those with each op's corner written over them (`op_corners`: a 1-wide
    kernel under a stride on an even input, `enlarge` of a 1-wide kernel, uneven concat pieces);
    the rest random walks from those (`perturbations`). At most `max_elements` input elements each (so the field
    test stays cheap)."""
    ranks_list = sampled_ranks(rule, guarded)
    if not ranks_list:
        return []
    dims = attribute_dims(rule)
    sampler = _Sampler(rule, seed + 104_729, dims, guarded, adversarial=True)
    found: dict[tuple[Shape, ...], Env] = {}
    used = 0
    for attempt in range(count):
        if len(found) >= (count + 3) // 4 or used >= max_steps:
            break
        env = sampler.attempt(ranks_list[attempt % len(ranks_list)], 400)
        used += 400 if env is None else 40
        if env is not None and total_elements(env) <= max_elements and sampler.checker.lhs_shapes(env) is not None:
            found.setdefault(tuple(env[v] for v in sampler.order), env)
    drawn = list(found.values())
    cornered = corner_assignments(sampler.checker, [*bases[:6], *drawn[:6]], max_elements,
                                  exclude=set(found) | {tuple(b[v] for v in sampler.order) for b in bases})
    cornered = cornered[:max(count // 3, count - len(drawn) - count // 3)]
    found.update((tuple(e[v] for v in sampler.order), e) for e in cornered)
    return [*drawn, *cornered] + perturbations(sampler.checker, [*cornered[:6], *bases[:3], *drawn[:3]], dims,
                                               count - len(drawn) - len(cornered), sampler.rng, max_elements,
                                               exclude=list(found))


Corner = dict[str, dict[int, int]]  # variable -> {axis (negative: from the end): dim}


def op_corners(rule: Rule) -> list[Corner]:
    """The shapes where each op of the rule is at its edge, as dims for its variable arguments: a
    conv or pool input a multiple of twice its stride under a 1-wide kernel (clipped, asymmetric
    SAME padding), `enlarge` of a 1-wide kernel to a 3-wide one, concat pieces of 1 and 3 along the
    axis (both ways round)."""
    out: list[Corner] = []
    for p in rule.lhs + rule.rhs:
        for t in _post_order(p):
            a, args = t.attr, t.args
            var = [x.name if isinstance(x, Var) else None for x in args]
            if t.op == "conv2d" and len(args) == 2:
                sh, sw = a.get("stride_h", 1), a.get("stride_w", 1)
                if isinstance(sh, int) and isinstance(sw, int):
                    c: Corner = {}
                    if var[0]:
                        c[var[0]] = {-2: 2 * sh, -1: 2 * sw}
                    if var[1]:
                        c[var[1]] = {-2: 1, -1: 1}
                    out.append(c)
            elif t.op in ("poolmax", "poolavg") and var and var[0]:
                kh, kw, sh, sw = (a.get(k, 1) for k in ("kernel_h", "kernel_w", "stride_h", "stride_w"))
                if all(isinstance(v, int) for v in (kh, kw, sh, sw)):
                    out.append({var[0]: {-2: 2 * sh + kh - 1, -1: 2 * sw + kw - 1}})
                    out.append({var[0]: {-2: 2 * sh, -1: 2 * sw}})
            elif t.op == "enlarge" and len(args) == 2:
                out.append({n: {-2: d, -1: d} for n, d in zip(var, (1, 3)) if n})
            elif t.op == "concat" and len(args) == 2 and isinstance(a.get("axis"), int):
                ax = a["axis"]
                for sizes in ((1, 3), (3, 1)):
                    out.append({n: {ax: d} for n, d in zip(var, sizes) if n})
    out = [c for c in out if c]
    if len(out) > 1:
        merged: Corner = {}
        for c in out:
            for n, axes in c.items():
                merged.setdefault(n, {}).update(axes)
        out.insert(0, merged)
    return out


def corner_assignments(checker: ShapeChecker, bases: Sequence[Env], max_elements: int,
                       exclude: set[tuple[Shape, ...]] = frozenset()) -> list[Env]:  # type: ignore[assignment]
    """`bases` with each of `op_corners` (all at once first) written over them, where well-typed."""
    corners = op_corners(checker.rule)
    seen = set(exclude)
    out: list[Env] = []
    for corner in corners:
        for base in bases:
            env = dict(base)
            for n, axes in corner.items():
                shape = env.get(n)
                if isinstance(shape, tuple):
                    dims = list(shape)
                    for ax, d in axes.items():
                        if -len(dims) <= ax < len(dims):
                            dims[ax] = d
                    env[n] = tuple(dims)
            key = tuple(env.get(v) for v in checker.order)
            if key in seen or total_elements(env) > max_elements:
                continue
            seen.add(key)  # type: ignore[arg-type]
            if checker.lhs_shapes(env) is not None:
                out.append(env)
    return out


def perturbations(checker: ShapeChecker, bases: Sequence[Env], dims: Sequence[int], count: int,
                  rng: np.random.Generator, max_elements: int, exclude: Sequence[tuple[Shape, ...]] = (),
                  steps: int = 3, tries: int = 6) -> list[Env]:
    """Up to `count` well-typed assignments found by random walks from `bases`: each step redraws
    about half the axes of one variable from `dims` (up to `tries` draws for a well-typed one), so
    that after a few steps several dims differ from the likely ones at once (a 1-wide kernel beside
    a 3-wide one on an even input)."""
    order = [v for v in checker.order if bases and isinstance(bases[0].get(v), tuple)]
    seen = set(exclude) | {tuple(b.get(v) for v in checker.order) for b in bases}
    out: list[Env] = []
    if not order or not bases:
        return out
    for walk in range(count * 2):
        if len(out) >= count:
            break
        env = dict(bases[walk % len(bases)])
        for _ in range(steps):
            for _ in range(tries):  # redraw about half the axes of one variable
                v = order[int(rng.integers(len(order)))]
                shape = env[v]
                redraw = rng.random(len(shape)) < 0.5
                drawn = rng.choice(np.asarray((1, *dims)), size=len(shape)).tolist()  # size 1 twice as likely
                trial = {**env, v: tuple(int(d) if r else s for s, d, r in zip(shape, drawn, redraw))}
                if trial[v] != shape and total_elements(trial) <= max_elements and checker.lhs_shapes(trial) is not None:
                    env = trial
                    break
            key = tuple(env.get(v) for v in checker.order)
            if key not in seen:
                seen.add(key)
                out.append(dict(env))
    return out[:count]


def total_elements(env: Mapping[str, Shape]) -> int:
    return sum(math.prod(s) for s in env.values() if isinstance(s, tuple))


def describe(env: Mapping[str, Shape]) -> str:
    return ", ".join(f"?{v}:{list(s)}" for v, s in env.items())


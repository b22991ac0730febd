"""Decide a rule on concrete shapes: proved on the tested shapes (scope "tested on N shapes", a
test, not a proof for every shape), refuted (with a counterexample), or unknown (with the reason).

Per rule: sample well-typed left sides on a small grid of shapes, and adversarial ones drawn from
the rule's attributes (`shapes.adversarial_assignments`: strides that do not tile, unequal kernels,
size-1 and prime dims, uneven pieces); a right side that is then ill-typed or differently shaped
refutes the rule. A prime-field evaluation on every sampled shape is
the fast filter; a disagreement is confirmed with the registry's numpy semantics on small integers.
The proof on a few small shapes compares both sides as exact polynomials with activations as opaque
atoms (equal polynomials are equal for every activation); only where they differ and relu / max is
involved does z3 decide with relu's exact meaning.

`status` is strict (a well-typed left side must give a well-typed, equal right side of the same
shape). A rule refuted only on shapes is decided again under the applier's guard, sampling only
shapes where both sides are well-typed with one shape: `guarded_status`.

The bottom layer of the verifier: `verify_cache` stores its results, `derive` builds the axiom base
from it, and `verify` combines them (imports run in that one direction).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import z3

from eqsat.errors import EqsatError, ShapeError
from eqsat.ops import Shape
from eqsat.rewrites.rule import Rule, ops_used
from eqsat.rewrites.semantics import (OP_IMPLS, FieldAlgebra, Poly, PolyAlgebra, evaluate_numpy, evaluate_pattern,
                                      instantiate, pattern_shape, rule_split_sizes)
from eqsat.rewrites.shapes import Env, ShapeChecker, adversarial_assignments, describe, sample_assignments, total_elements
from eqsat.rewrites.z3budget import Budget, WallClockCapped, check

PROVED, REFUTED, UNKNOWN = "proved", "refuted", "unknown"
TESTED = "tested"  # a verdict: proved on the tested shapes only (status "proved", scope "tested on N shapes")
ALL_SHAPES = "all shapes"  # the scope of a proof for every shape the rule (or its guard) admits
VERIFIER_VERSION = 3  # bump when a change alters results in a way the cache key cannot see


@dataclass(frozen=True)
class VerifyOptions:
    samples: int = 24  # shape assignments tested (shape check and prime-field filter)
    adversarial: int = 16  # and assignments drawn to break wrong rules (`shapes.adversarial_assignments`)
    proof_shapes: int = 3  # of them, how many are proved exactly
    max_proof_elements: int = 400  # total input elements of a shape assignment proved exactly
    z3_rlimit: int = 10_000_000  # z3's resource budget per query (`z3budget`: load cannot change the answer);
    # the library's largest successful query used ~83k, and this ends an unprovable one in ~3 s quietly
    z3_wall_ms: int = 120_000  # a hang guard only (well above a spent rlimit's time under load); an answer it cuts off is not cached
    seed: int = 0


@dataclass(frozen=True)
class VerificationResult:
    name: str
    status: str  # proved | refuted | unknown
    method: str
    counterexample: dict[str, Any] | None = None
    scope: str = ""  # proved: "all shapes" (ALL_SHAPES) or "tested on N shapes" (`tested_scope`)
    shapes: tuple[dict[str, Shape], ...] = ()  # proved on these concrete shapes
    source: str = ""
    seconds: float = 0.0
    # The same question where the rewrite is only applied when its right side is well-typed with the
    # left side's shape (the applier's guard, and Tensat's `ndim` concats): a rule refuted only on
    # shapes may hold there. Never "proved" for a rule refuted on values.
    guarded_status: str = ""
    guarded_method: str = ""
    guarded_scope: str = ""
    guarded_counterexample: dict[str, Any] | None = None
    # a z3 check hit its wall-clock cap (not its rlimit): the verdict depends on machine load, so the
    # verification cache does not store it (never serialized)
    capped: bool = field(default=False, compare=False)

    @property
    def proved(self) -> bool:
        """Proved, on the tested shapes or for all shapes (see `verdict` for which)."""
        return self.status == PROVED

    @property
    def verdict(self) -> str:
        """proved (for all shapes) | tested (proved on the tested shapes only) | refuted | unknown."""
        return _verdict(self.status, self.scope)

    @property
    def guarded_verdict(self) -> str:
        """`verdict` of the question under the applier's guard ("" when not asked)."""
        return _verdict(self.guarded_status, self.guarded_scope)

    def admits(self, allow_unproved: bool = False, allow_guarded: bool = False, allow_tested: bool = False) -> bool:
        """Whether the rule may be used: proved for all shapes; with `allow_guarded` also refuted only
        on shapes and proved for all shapes under the guard; with `allow_tested` a proof on the
        tested shapes counts; with `allow_unproved` unknown (and tested) counts too. Never when
        refuted on values. (`eqsat.rulesets` fixes the flags into the project's one policy.)"""
        keep = {PROVED, *((TESTED,) if allow_tested or allow_unproved else ()), *((UNKNOWN,) if allow_unproved else ())}
        if self.verdict in keep:
            return True
        # under the guard: refuted only on shapes, or proved strictly on the tested shapes only (a rank
        # the left side admits where the right side is ill-typed) and proved for all shapes under the guard
        return allow_guarded and (self.status == REFUTED or self.guarded_verdict == PROVED) and self.guarded_verdict in keep

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "method": self.method,
                "counterexample": self.counterexample, "scope": self.scope,
                "shapes": [{k: list(v) if isinstance(v, tuple) else v for k, v in s.items()} for s in self.shapes],
                "guarded_status": self.guarded_status, "guarded_method": self.guarded_method,
                "guarded_scope": self.guarded_scope, "guarded_counterexample": self.guarded_counterexample,
                "source": self.source, "seconds": round(self.seconds, 4)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> VerificationResult:
        return VerificationResult(
            data["name"], data["status"], data["method"], data.get("counterexample"), data.get("scope", ""),
            tuple({k: tuple(v) if isinstance(v, list) else v for k, v in s.items()} for s in data.get("shapes", ())),
            data.get("source", ""),
            float(data.get("seconds", 0.0)), data.get("guarded_status", ""), data.get("guarded_method", ""),
            data.get("guarded_scope", ""), data.get("guarded_counterexample"))


def _verdict(status: str, scope: str) -> str:
    return TESTED if status == PROVED and scope != ALL_SHAPES else status


def tested_scope(count: int) -> str:
    """The scope of a proof on `count` tested shapes (not a proof for every shape)."""
    return f"tested on {count} shape{'s' if count != 1 else ''}"


class _Refuted(Exception):
    def __init__(self, method: str, counterexample: dict[str, Any]) -> None:
        super().__init__(method)
        self.method, self.counterexample = method, counterexample


class _Unknown(Exception):
    def __init__(self, reason: str, capped: bool = False) -> None:
        super().__init__(reason)
        self.capped = capped


def _freeze(env: Env) -> tuple[tuple[str, Shape], ...]:
    return tuple(env.items())


def _shapes_json(env: Mapping[str, Shape]) -> dict[str, list[int]]:
    return {k: list(v) for k, v in env.items()}


def check_shapes(rule: Rule, env: Env) -> None:
    """Raise _Refuted if the right sides are ill-typed or shaped differently under a good `env`."""
    rule, env = instantiate(rule, env)
    lhs = ShapeChecker(rule).lhs_shapes(env)
    assert lhs is not None
    try:
        sizes = rule_split_sizes(rule, env)
        rhs = [pattern_shape(p, env, sizes) for p in rule.rhs]
    except ShapeError as exc:
        raise _Refuted("shapes", {"shapes": _shapes_json(env), "reason": f"right side ill-typed: {exc}"}) from None
    for i, (a, b) in enumerate(zip(lhs, rhs)):
        if a != b:
            raise _Refuted("shapes", {"shapes": _shapes_json(env),
                                      "reason": f"side {i}: left shape {list(a)} but right shape {list(b)}"})


def field_differs(rule: Rule, env: Env, seed: int, trials: int = 2) -> bool:
    """Randomized exact test modulo a prime (activations: consistent pseudo-random functions)."""
    rule, env = instantiate(rule, env)
    sizes = rule_split_sizes(rule, env)
    for trial in range(trials):
        alg = FieldAlgebra(salt=seed + trial)
        rng = np.random.default_rng(seed * 7919 + trial)
        values = {v: alg.random(s, rng) for v, s in env.items()}
        memo: dict[Any, np.ndarray] = {}
        for lhs, rhs in zip(rule.lhs, rule.rhs):
            if not np.array_equal(evaluate_pattern(lhs, values, alg, sizes, memo),
                                  evaluate_pattern(rhs, values, alg, sizes, memo)):
                return True
    return False


def numeric_counterexample(rule: Rule, env: Env, seed: int, trials: int = 16) -> dict[str, Any] | None:
    """Small integer inputs where the registry's numpy semantics tell the sides apart (inputs where a
    side is not finite, e.g. a division by zero, are skipped)."""
    rule, env = instantiate(rule, env)
    sizes = rule_split_sizes(rule, env)
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        values = {v: rng.integers(-3, 4, size=s).astype(np.float64) for v, s in env.items()}
        for i, (lhs, rhs) in enumerate(zip(rule.lhs, rule.rhs)):
            with np.errstate(all="ignore"):
                a, b = evaluate_numpy(lhs, values, sizes), evaluate_numpy(rhs, values, sizes)
            if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
                continue
            if not np.allclose(a, b, rtol=1e-9, atol=1e-9):
                return {"shapes": _shapes_json(env), "inputs": {k: v.tolist() for k, v in values.items()},
                        "side": i, "lhs": a.tolist(), "rhs": b.tolist()}
    return None


def _to_z3(p: Poly, alg: PolyAlgebra, cache: dict[int, z3.ArithRef]) -> z3.ArithRef:
    def atom(a: int) -> z3.ArithRef:
        if a not in cache:
            kind, arg = alg.atoms[a]
            if kind == "input":
                cache[a] = z3.Real(f"{arg[0]}{list(arg[1])}")
            elif kind == "relu":
                x = _to_z3(arg, alg, cache)
                cache[a] = z3.If(x > 0, x, z3.RealVal(0))
            elif kind == "max":
                operands = [_to_z3(q, alg, cache) for q in sorted(arg, key=repr)]
                acc = operands[0]
                for y in operands[1:]:
                    acc = z3.If(acc >= y, acc, y)
                cache[a] = acc
            else:
                cache[a] = z3.Function(kind, z3.RealSort(), z3.RealSort())(_to_z3(arg, alg, cache))
        return cache[a]

    terms = []
    for m, c in p.terms.items():
        prod: z3.ArithRef = z3.RealVal(str(c))
        for a in m:
            prod = prod * atom(a)
        terms.append(prod)
    return z3.Sum(terms) if terms else z3.RealVal(0)


def _needs_z3(p: Poly, alg: PolyAlgebra) -> bool:
    """True when the polynomial mentions relu or max (atoms with a known meaning), at any depth."""
    stack = [p]
    while stack:
        for a in stack.pop().atoms():
            kind, arg = alg.atoms[a]
            if kind in ("relu", "max"):
                return True
            if kind != "input":
                stack.append(arg)
    return False


def prove_on(rule: Rule, env: Env, options: VerifyOptions) -> str:
    """Prove lhs == rhs for one shape assignment; returns how, or raises _Refuted / _Unknown."""
    rule, env = instantiate(rule, env)
    alg = PolyAlgebra()
    sizes = rule_split_sizes(rule, env)
    values = {v: alg.symbols(v, s) for v, s in env.items()}
    memo: dict[Any, np.ndarray] = {}
    differing: list[tuple[Poly, Poly]] = []
    for lhs, rhs in zip(rule.lhs, rule.rhs):
        a = evaluate_pattern(lhs, values, alg, sizes, memo)
        b = evaluate_pattern(rhs, values, alg, sizes, memo)
        differing += [(x, y) for x, y in zip(a.flat, b.flat) if x != y]
    if not differing:
        return "polynomial identity"
    if not any(_needs_z3(x - y, alg) for x, y in differing):
        found = numeric_counterexample(rule, env, options.seed, trials=32)
        if found is not None:
            raise _Refuted("polynomial difference, confirmed numerically", found)
        raise _Unknown(f"the sides differ as polynomials in uninterpreted activations on {describe(env)}, "
                       "but no numeric counterexample was found")
    cache: dict[int, z3.ArithRef] = {}
    solver = z3.Solver()
    solver.add(z3.Or([_to_z3(x, alg, cache) != _to_z3(y, alg, cache) for x, y in differing]))
    try:
        answer = check(solver, Budget(options.z3_rlimit, options.z3_wall_ms))
    except WallClockCapped as exc:
        raise _Unknown(f"{exc} on {describe(env)}", capped=True) from None
    if answer == z3.unsat:
        return "z3"
    if answer == z3.sat:
        model = solver.model()
        inputs: dict[str, np.ndarray] = {v: np.zeros(s) for v, s in env.items()}
        for atom, (kind, arg) in enumerate(alg.atoms):
            if kind == "input" and atom in cache:
                val = model.eval(cache[atom], model_completion=True)
                inputs[arg[0]][arg[1]] = float(val.as_fraction()) if z3.is_rational_value(val) else 0.0
        raise _Refuted("z3", {"shapes": _shapes_json(env), "inputs": {k: v.tolist() for k, v in inputs.items()}})
    raise _Unknown(f"z3 gave no answer within an rlimit of {options.z3_rlimit} on {describe(env)}: "
                   f"{solver.reason_unknown()}")


def _pick_proof_envs(envs: Sequence[Env], options: VerifyOptions) -> list[Env]:
    small = sorted((e for e in envs if total_elements(e) <= options.max_proof_elements), key=total_elements)
    if not small:
        small = sorted(envs, key=total_elements)[:1]
    picked = small[:1]
    def dims(e: Env) -> list[int]:
        return [d for s in e.values() if isinstance(s, tuple) for d in s]

    generic = [e for e in small if all(d >= 2 for d in dims(e))]
    distinct = sorted(small, key=lambda e: (-len(set(dims(e))), total_elements(e)))
    for pool in (generic, distinct, small[1:]):
        for e in pool:
            if len(picked) >= options.proof_shapes:
                return picked
            if e not in picked:
                picked.append(e)
                break
    return picked[:options.proof_shapes]


@dataclass(frozen=True)
class _Decision:
    status: str
    method: str
    counterexample: dict[str, Any] | None = None
    scope: str = ""
    shapes: tuple[dict[str, Shape], ...] = ()
    capped: bool = False  # an unknown cut off by z3's wall-clock cap (see `VerificationResult.capped`)


def _decide(rule: Rule, options: VerifyOptions, guarded: bool) -> _Decision:
    """Sample shapes (guarded: both sides well-typed, same shape), filter, prove or refute."""
    missing = sorted(o for p in rule.lhs + rule.rhs for o in ops_used(p) if o not in OP_IMPLS and o != "split_part")
    if missing:
        return _Decision(UNKNOWN, "none", {"reason": f"no symbolic semantics for {', '.join(missing)}"})
    envs = sample_assignments(rule, options.samples, seed=options.seed, guarded=guarded)
    adversarial: list[Env] = []
    if envs and options.adversarial > 0:
        seen = set(map(_freeze, envs))
        adversarial = [e for e in adversarial_assignments(rule, options.adversarial, seed=options.seed,
                                                          guarded=guarded, bases=envs) if _freeze(e) not in seen]
    if not envs:
        where = "both sides well-typed with one shape" if guarded else "a well-typed left side"
        return _Decision(UNKNOWN, "none", {"reason": f"no shape assignment on the grid gives {where}"})
    try:
        for env in envs + adversarial:
            check_shapes(rule, env)
        # one field trial on an adversarial shape (a wrong rule differs there on most inputs)
        suspicious = ([e for e in envs if field_differs(rule, e, options.seed)]
                      + [e for e in adversarial if field_differs(rule, e, options.seed, trials=1)])
        for env in suspicious[:2]:
            found = numeric_counterexample(rule, env, options.seed)
            if found is not None:
                raise _Refuted("prime-field filter, confirmed numerically", found)
        proof_envs = list(dict.fromkeys(map(_freeze, suspicious[:1] + _pick_proof_envs(envs, options))))
        hows = {prove_on(rule, dict(e), options) for e in proof_envs}
    except _Refuted as exc:
        return _Decision(REFUTED, exc.method, exc.counterexample)
    except _Unknown as exc:
        return _Decision(UNKNOWN, "none", {"reason": str(exc)}, capped=exc.capped)
    except EqsatError as exc:
        return _Decision(UNKNOWN, "none", {"reason": str(exc)})
    method = (f"concrete shapes: {' + '.join(sorted(hows))} on {len(proof_envs)} shape(s), "
              f"prime-field test on {len(envs)} sampled and {len(adversarial)} adversarial")
    return _Decision(PROVED, method, None, tested_scope(len(envs) + len(adversarial)),
                     tuple(dict(e) for e in proof_envs))


def verify_concrete(rule: Rule, options: VerifyOptions = VerifyOptions()) -> VerificationResult:
    """Decide `rule` on concrete shapes (proved on the tested shapes / refuted / unknown), strictly
    and under the applier's guard (see `VerificationResult.guarded_status`)."""
    start = time.perf_counter()
    strict = _decide(rule, options, guarded=False)
    if strict.status == REFUTED and strict.method == "shapes":
        guarded = _decide(rule, options, guarded=True)
        if guarded.status == PROVED:
            guarded = replace(guarded, method="guarded " + guarded.method)
    elif strict.status == PROVED:
        guarded = replace(strict, method="implied: holds without the guard", shapes=())
    else:  # refuted on values (on shapes where both sides are well-typed), or unknown
        guarded = replace(strict, shapes=())
    return VerificationResult(rule.name, strict.status, strict.method, strict.counterexample, strict.scope,
                              strict.shapes, rule.source, time.perf_counter() - start, guarded.status,
                              guarded.method, guarded.scope, guarded.counterexample, strict.capped or guarded.capped)


__all__ = ["VerificationResult", "VerifyOptions", "verify_concrete", "tested_scope", "PROVED", "REFUTED", "UNKNOWN",
           "TESTED", "ALL_SHAPES", "VERIFIER_VERSION"]

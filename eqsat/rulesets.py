"""Which rewrite rules an optimization uses: loaded, kept if they can match, and trusted.

One policy for every caller (`eqsat optimize`, `eqsat rules verify`, the `@eqsat.optimize`
decorator): a rule is trusted when the verifier proves it for every shape its guard admits, or when
it is refuted only on shapes and proved for all shapes under the applier's guard (eqsat's egglog
translation builds a right side only when its shape facts hold, so the guard always holds where
eqsat applies a rule). A rule proved only on the tested shapes is `tested`: a test, not a proof (a
rule wrong only at a stride, padding or size the sampler missed would pass), so it is trusted only
with the explicit opt-in `trust_tested`, which warns naming the rules. Rules refuted on values are
never trusted; unknown ones only with `allow_unproved` (which implies `trust_tested`). Results come
from the on-disk verification cache, so selecting again costs milliseconds.

Dtypes (`dtype_scope`): the verifier proves identities over the reals, so a rule that computes
(uses a float op: matmul, ewadd, exp, ...) rewrites float values only, in every float dtype; one
that only moves data (transpose, reshape, concat, slice, broadcast) holds exactly in every dtype,
integer and boolean included; one that names an integer or boolean op (iadd, lt, select_n, ...) is
never trusted: the verifier does not model wrap-around or booleans. The e-graph enforces the first
two (float ops refuse integer operands, and `to_egglog.dtype_guards` keeps a right side from
mixing dtypes). In bfloat16 / float16 a rule holds up to rounding, as in float32 but with a larger
epsilon: it is used, and the result is checked against the original with a tolerance of a few of
that dtype's epsilons (`eqsat.compare.LOW_PRECISION_ULPS`); the original is kept where it fails.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from eqsat.errors import EqsatError
from eqsat.paths import tensat_rule_files
from eqsat.rewrites import library_rules
from eqsat.rewrites.concrete import VerificationResult
from eqsat.rewrites.parser import load_rules
from eqsat.rewrites.rule import Rule, Signature, rules_that_can_match

XLA_GROUPS: tuple[str, ...] = ("fusion", "merges", "folding", "decompositions", "precision")
"""The library groups that pay under XLA (the decorator's default): merges (Q/K/V-style matmuls and
parallel convs on one input), activation fusion, folding of batchnorms and per-channel scales into
weights, decompositions (separable max and average pools), and precision (low-precision matmuls
through float32, which XLA:CPU multiplies faster); TASO's general properties
(associativity, commutativity) only grow the e-graph for these programs."""

TENSAT = "tensat"


def tensat_rules() -> list[Rule]:
    """Tensat's single- and two-output rule files, as written (unverified)."""
    rules: list[Rule] = []
    for path in tensat_rule_files():
        if not path.exists():
            raise EqsatError(f"rule file {path} not found; set EQSAT_DATA to the shared data directory")
        rules.extend(load_rules(path))
    return rules


def candidate_rules() -> list[Rule]:
    """Tensat's rules (unverified, as written) plus the library's `conv_merges` group: Tensat's conv
    merges are refuted for grouped convs, and without their guarded versions (and the `enlarge`
    merges) Inception's parallel convs could never merge. `eqsat optimize` and `eqsat bench tensat`
    choose from these."""
    return tensat_rules() + library_rules(["conv_merges", "nary_merges"])


RULE_SETS: Mapping[str, str] = MappingProxyType({
    "default": "Tensat's rule files plus the library's conv_merges and nary_merges (candidate_rules)",
    "tensat-only": "Tensat's rule files alone: no nary_merges, no extra conv merges (to attribute gains)",
    "layout": "default plus the library's layout group (convs as NHWC conv2d_nhwc between transposes that cancel)",
})
"""The rule sets `eqsat optimize --rules` and `bench tensat` choose from, by name."""


class UnknownRuleSetError(EqsatError):
    """A `--rules` name that `RULE_SETS` does not define."""


def named_rules(name: str) -> list[Rule]:
    """The rules of a named set (`RULE_SETS`), unverified; an unknown name is one error line."""
    if name == "default":
        return candidate_rules()
    if name == "tensat-only":
        return tensat_rules()
    if name == "layout":
        return candidate_rules() + library_rules(["layout"])
    raise UnknownRuleSetError(f"unknown rule set {name!r}; known rule sets: {', '.join(RULE_SETS)}")


def given_rules(source: Any) -> list[Rule]:
    """The rules `source` names, unverified: None (the library's `XLA_GROUPS`), "tensat" (Tensat's
    rule files), or a rule file path, a Rule, or an iterable of those."""
    if source is None:
        return library_rules(XLA_GROUPS)
    if isinstance(source, str) and source == TENSAT:
        return tensat_rules()
    items = [source] if isinstance(source, (str, Path, Rule)) else source
    if not isinstance(items, Iterable):
        raise EqsatError(f"rules must be None, 'tensat', rule file paths or Rule values, got {source!r}")
    rules: list[Rule] = []
    for item in items:
        if isinstance(item, Rule):
            rules.append(item)
        elif isinstance(item, (str, Path)):
            rules.extend(load_rules(Path(item)))
        else:
            raise EqsatError(f"rules must be None, 'tensat', rule file paths or Rule values; got {item!r}")
    return rules


def is_trusted(result: VerificationResult, allow_unproved: bool = False, trust_tested: bool = False) -> bool:
    """The policy: proved for all shapes, or refuted only on shapes and proved for all shapes under
    the guard (a proof on the tested shapes counts with `trust_tested`; unknown counts as proved
    with `allow_unproved`; refuted on values never does)."""
    return result.admits(allow_unproved, allow_guarded=True, allow_tested=trust_tested)


def scope(result: VerificationResult) -> str:
    """Where the rule holds as the policy sees it: "all shapes", "tested on N shapes" (strictly or
    under the guard), or "" when it is neither proved nor tested."""
    pairs = ((result.verdict, result.scope), (result.guarded_verdict, result.guarded_scope))
    for wanted in ("proved", "tested"):  # a proof for all shapes under the guard beats a strict test
        for verdict, where in pairs:
            if verdict == wanted:
                return where
    return ""


def dtype_scope(rule: Rule) -> str:
    """The dtypes a rule may rewrite (the policy in the module docstring): "any" when it only moves
    data, "float" when it computes, "" when it names an integer or boolean op (never trusted)."""
    from eqsat import ops
    from eqsat.rewrites.rule import subterms

    names = {t.op for side in (*rule.lhs, *rule.rhs) for t in subterms(side)} & set(ops.OPS)
    kinds = [ops.OPS[op].operand_kinds for op in names]
    if any("float" not in k for k in kinds) or any(ops.OPS[op].result_dtype in ("bool", "select") for op in names):
        return ""
    return "any" if all(k == ops.ANY_KIND for k in kinds) else "float"


def trusted_rules(rules: Sequence[Rule], allow_unproved: bool = False, trust_tested: bool = False) -> list[Rule]:
    """The rules of `rules` that the policy trusts, in their order. With `trust_tested`, a warning
    names the rules trusted only because they were tested."""
    from eqsat.rewrites.verify import verify_rules

    rules = [r for r in rules if dtype_scope(r)]
    results = verify_rules(rules, all_shapes=True)
    keep = [(r, res) for r, res in zip(rules, results) if is_trusted(res, allow_unproved, trust_tested)]
    warn_tested([r.name for r, res in keep if not is_trusted(res)])
    return [r for r, _ in keep]


def warn_tested(names: Sequence[str]) -> None:
    """The opt-in's warning: which rules are trusted only because they were tested."""
    if names:
        warnings.warn(f"trusting {len(names)} rule(s) proved only on tested shapes, not for all shapes "
                      f"(--trust-tested / trust_tested=True): {', '.join(names)}", UserWarning, stacklevel=3)


@dataclass(frozen=True)
class RuleSet:
    """The rules named (`given`), those that can match the graph's ops (`can_match`), and those of
    them the policy trusts (`trusted`: what saturation uses)."""

    given: tuple[Rule, ...]
    can_match: tuple[Rule, ...]
    trusted: tuple[Rule, ...]

    def counts(self) -> dict[str, int]:
        return {"rules_given": len(self.given), "rules_can_match": len(self.can_match),
                "rules_used": len(self.trusted)}


def select_rules(source: Any = TENSAT, ops: Iterable[str | Signature] | None = None, allow_unproved: bool = False,
                 trust_tested: bool = False) -> RuleSet:
    """Load the rules `source` names (see `given_rules`), keep those that can match a graph of `ops`
    (op names, or signatures with attributes: `eqsat.egraph.encoded_signatures`)
    (all when None; the others are never verified), and trust them by the one policy."""
    given = given_rules(source)
    can_match = given if ops is None else rules_that_can_match(given, ops)
    return RuleSet(tuple(given), tuple(can_match), tuple(trusted_rules(can_match, allow_unproved, trust_tested)))


__all__ = ["XLA_GROUPS", "TENSAT", "RuleSet", "candidate_rules", "select_rules", "given_rules", "tensat_rules",
           "trusted_rules", "is_trusted", "scope", "warn_tested", "dtype_scope"]

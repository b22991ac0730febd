"""The parallelization rules are proved for every shape (the symbolic prover models partition,
combine, replicate, reduce and the collectives), wrong ones are not, and the planner uses only
rules proved for all shapes unless told to trust tested ones."""

from __future__ import annotations

import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import verified_parallel_rules
from eqsat.parallel.rules import instantiate, rule_lines
from eqsat.rewrites.concrete import REFUTED, VerifyOptions, verify_concrete
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.rule import Rule, Term, subterms
from eqsat.rewrites.symbolic import device_bound, prove_symbolic
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted


def _one(name: str, parts: int = 2) -> Rule:
    return next(r for r in instantiate(0, parts) if r.name == name)


@pytest.mark.parametrize(("name", "guarded"), [
    ("combine-partition[D=-2]@0", False),  # the pieces concatenated back: any shape, any rank
    ("partition-combine[D=-1]@0", False),
    ("all-to-all[D=-1,E=-3]@0", False),  # the collective is partition . combine
    ("ewadd-combine[D=-1]@0", False),  # a symbolic device count: quotient and remainder by the piece
    ("head-sum@0", False),  # a sum over a combined axis is a sum over devices of sums over pieces
    ("heads-max@0", False),
    ("dp-matmul[ACT=2]@0", True),  # right side typed only where N divides the rows: under the guard
    ("row-matmul@0", True),  # the inner sum split into N partial sums
    ("row-conv[PAD=1,ST=2]@0", True),
    ("fsdp-gather@0", True),  # an upper bound on a rank survives flattening: proved at every rank it admits
    ("fsdp-gather-rows@0", True),
    ("erf-combine[D=-2]@0", False),  # unary atoms and selects of the norm / activation rules
    ("ewmax-combine[D=-1]@0", False),
])
def test_distribution_rules_are_proved_for_all_shapes(name: str, guarded: bool) -> None:
    how = prove_symbolic(_one(name), guarded=guarded)
    assert how is not None and "symbolic dims" in how


@pytest.mark.parametrize("text", [
    "(partition -2 0 2 (reduce_sum [2] ?s)) => (reduce_sum [2] (partition -3 0 2 ?s)) if (= (rank ?s) 3)",  # wrong axis
    "(partition -3 0 2 (transpose [0 2 1] ?k)) => (transpose [0 2 1 3] (partition -3 0 2 ?k))",  # wrong axes moved
    "(reduce 0 (replicate 0 4 ?x)) => (ewadd ?x ?x)",  # four copies summed, not two: wrong shard count
    "(relu (reduce 0 ?x)) => (reduce 0 (relu ?x))",  # relu of a partial sum
    "(ewmul (reduce 0 ?x) (reduce 0 ?y)) => (reduce 0 (ewmul ?x ?y)) if (= (dim ?x 0) (dim ?y 0))",
    "(exp (combine -1 0 ?x)) => (combine -1 0 (tanh ?x))",
    "(erf (combine -1 0 ?x)) => (combine -1 0 (log ?x))",  # another atom
    "(ewmax (combine -1 0 ?x) (combine -1 0 ?y)) => (combine -1 0 (ewmin ?x ?y))",
    "(replicate 0 2 ?w) => (all_gather -2 0 (partition -1 0 2 ?w)) if (<= (rank ?w) 3)",  # gathered on the wrong dim
    "(partition -1 0 2 ?x) => (partition -2 0 2 ?x)",  # wrong dim (never typed alike: not proved strictly)
])
def test_wrong_distribution_rules_are_not_proved(text: str) -> None:
    (rule,) = parse_rule_text(text)
    assert prove_symbolic(rule) is None
    assert not is_trusted(verify_rules([rule])[0])


def _perturbed(rule: Rule) -> list[Rule]:
    """The rule with one distribution op's dim, or one partition's count, changed (a generator of
    near misses: wrong axis, wrong shard count)."""
    out = []
    for side in ("lhs", "rhs"):
        for k, top in enumerate(getattr(rule, side)):
            for t in subterms(top):
                if not isinstance(t, Term) or t.op not in ("partition", "combine"):
                    continue
                changes = [("dim", d) for d in (-1, -2, -3) if d != t.attr["dim"]]
                changes += [("parts", 4)] if t.op == "partition" else []
                for key, value in changes:
                    new = replace(t, attrs=tuple((n, value if n == key else v) for n, v in t.attrs))
                    swapped = _swap(top, t, new)
                    sides = list(getattr(rule, side))
                    sides[k] = swapped
                    out.append(replace(rule, name=f"{rule.name}/{t.op}.{key}={value}", **{side: tuple(sides)}))
    return out


def _swap(p: object, old: Term, new: Term) -> object:
    if p is old:
        return new
    if isinstance(p, Term):
        return replace(p, args=tuple(_swap(a, old, new) for a in p.args))  # type: ignore[misc]
    return p


@pytest.mark.parametrize("name", ["combine-partition[D=-1]@0", "row-matmul@0", "heads-sum@0", "all-gather[D=-2]@0"])
def test_perturbed_rules_proved_only_where_they_hold(name: str) -> None:
    """No near miss is proved where the concrete checker finds values that differ."""
    options = VerifyOptions(samples=8, adversarial=8, proof_shapes=1)
    checked = 0
    for rule in _perturbed(_one(name)):
        strict, guarded = prove_symbolic(rule), prove_symbolic(rule, guarded=True)
        if strict is None and guarded is None:
            continue
        concrete = verify_concrete(rule, options)
        # refuted on values: strictly with no question under the guard, or under the guard too
        values_differ = concrete.status == REFUTED and concrete.guarded_status in ("", REFUTED)
        assert not (strict and concrete.status == REFUTED), (rule.name, concrete.method)
        assert not (guarded and values_differ), (rule.name, concrete.method, concrete.guarded_method)
        checked += 1
    assert _perturbed(_one(name))


def test_device_bound_needs_every_op_to_pass_middle_axes_through() -> None:
    assert device_bound(_one("relu-combine[D=-2]@0")) == 4  # device axis, one middle axis, two named from the end
    assert device_bound(_one("bcast-partition@0")) == 7  # the broadcast's shape: three front axes
    assert device_bound(_one("heads-bcast@0")) is None  # a right side of literal rank: strictly, no bound
    assert device_bound(_one("heads-bcast@0"), guarded=True) == 6  # under the guard, above it the ranks differ
    (stacked,) = parse_rule_text("(combine -1 0 (relu ?x)) => (combine -1 0 ?x)")
    assert device_bound(stacked) == 3
    (front,) = parse_rule_text("(reduce_sum [0] (combine -1 0 ?x)) => ?x")  # reads an axis from the front
    assert device_bound(front) is None


OLD_HEADS_BCAST = ("heads-bcast: (partition -3 A N (broadcast ?S [0 1] ?m)) => (broadcast (shape (partition -3 A N "
                   "(broadcast ?S [0 1] ?m))) [0 1 2] (partition -2 A N ?m)) if (= (rank ?m) 2)")
"""heads-bcast as it was: true for a rank-3 broadcast only. At rank 6 (m of shape (2, 1), S = (2, 1,
1, 2, 1, 1)) both sides are typed alike and device 0 reads m[1] on the left, m[0] on the right; the
concrete checker's shapes never reach it (tested), the symbolic prover finds no proof."""


def test_the_old_heads_bcast_is_not_proved_and_the_new_one_is(tmp_path: Path) -> None:
    (tmp_path / "old.rules").write_text(OLD_HEADS_BCAST + "\n")
    (old,) = instantiate(0, 2, path=tmp_path / "old.rules")
    assert prove_symbolic(old) is None and prove_symbolic(old, guarded=True) is None
    assert prove_symbolic(_one("heads-bcast@0"), guarded=True) is not None  # its right side has rank 4: rank 3 only
    assert prove_symbolic(_one("bcast-partition@0"), guarded=True) is not None


def test_planner_default_trusts_only_rules_proved_for_all_shapes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.parallel import planner

    path = tmp_path / "parallel.rules"
    path.write_text("\n".join([*(ln for ln in rule_lines() if ln.startswith(("combine-partition", "row-matmul"))),
                               OLD_HEADS_BCAST]) + "\n")
    monkeypatch.setattr(planner, "instantiate", partial(instantiate, path=path))
    monkeypatch.setattr(planner, "mesh_rules", lambda mesh, names=None: [
        r for i, ax in enumerate(mesh.axes) for r in instantiate(i, ax.size, names=names, path=path)])
    mesh = parse_mesh("2")
    rules = instantiate(0, 2, path=path)
    results = {r.name: res for r, res in zip(rules, verify_rules(rules))}
    assert not is_trusted(results["heads-bcast@0"]) and is_trusted(results["heads-bcast@0"], trust_tested=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default never warns: it trusts nothing tested
        default = verified_parallel_rules(mesh)
    assert default and all(is_trusted(results[r.name]) for r in default)
    assert "heads-bcast@0" not in {r.name for r in default}
    with pytest.warns(UserWarning, match="heads-bcast"):
        opted = verified_parallel_rules(mesh, trust_tested=True)
    assert {r.name for r in opted} == {r.name for r in default} | {"heads-bcast@0"}


@pytest.mark.slow  # ~50 s cold (all 588 instances); the cache makes later runs fast
def test_every_shipped_instance_is_trusted() -> None:
    """All 588 instances (N = 2 and 4) are proved for all shapes, strictly or under the guard."""
    family = [r for n in (2, 4) for r in instantiate(0, n)]
    assert all(map(is_trusted, verify_rules(family)))


def test_parallel_command_has_the_opt_in() -> None:
    from eqsat.cli import build_parser

    assert build_parser().parse_args(["parallel", "unity-mlp", "--trust-tested"]).trust_tested
    assert not build_parser().parse_args(["parallel", "unity-mlp"]).trust_tested

"""A new input shape of a program `@eqsat.optimize` has seen reuses the search results found at the
other shape (no e-graph search runs) and the keep/discard plan, and still equals `jax.jit`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pathlib import Path

import eqsat.candidates as candidates
import jax_backend.decorator_checks as checks
from eqsat.compare import outputs_agree
from eqsat.ir import GraphBuilder
from eqsat.rulesets import XLA_GROUPS, library_rules
from jax_backend.decorator import optimize
from jax_backend.shape_reuse import reshape_like, shape_free_key
from jax_backend.timing import Choice, Decision


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[-1]), jnp.float32)


W = [_rand(32, 32, seed=k) for k in range(3)]
RULES = [r for r in library_rules(XLA_GROUPS) if r.name == "matmul-merge-right"]  # one rule: a short verification


def _qkv(x: jax.Array) -> jax.Array:
    """Three projections of one input (a merge the rules find), then a softmax attention."""
    q, k, v = x @ W[0], x @ W[1], x @ W[2]
    return jax.nn.softmax(q @ k.T, axis=-1) @ v


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls: list[int] = []
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _agrees(got: Any, want: Any) -> bool:
    return outputs_agree([want], [got], 2e-4, 1e-5).ok


def test_a_new_shape_reuses_the_search_and_equals_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    searches = _counting(monkeypatch, candidates, "region_candidates")
    opt = optimize(_qkv, check_speed=False, time_limit=1.0, cost_model="roofline", rules=RULES)
    x16, x24 = _rand(16, 32, seed=7), _rand(24, 32, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _agrees(opt(x16), jax.jit(_qkv)(x16))
        first = len(searches)
        assert first >= 1 and opt.report(x16).searched_regions == first
        assert _agrees(opt(x24), jax.jit(_qkv)(x24))
    assert len(searches) == first  # no e-graph search for the new shape
    report, seen = opt.report(x24), opt.report(x16)
    assert report.searched_regions == 0 and report.shape_reused_regions >= 1
    assert report.used == seen.used  # the rewrite found at 16 rows, re-built for 24 rows
    if seen.used == "optimized":
        assert any(s.after != s.before for s in report.segments)


def test_a_new_shape_reuses_a_discard_without_building_or_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    decisions: list[int] = []

    def discard(base: Any, cands: Any, args: Any, *a: Any, **k: Any) -> Choice:
        decisions.append(1)
        d = Decision("slower", 0.9, 0.85, 0.95, 1.01, 8, 1e-3, 1.1e-3, 0.99, 0.1, 1)
        return Choice(0, d, (d.as_paired(),))

    monkeypatch.setattr(checks, "choose_faster", discard)
    built = _counting(monkeypatch, checks, "_build_candidates")
    opt = optimize(_qkv, time_limit=1.0, cost_model="roofline", rules=RULES)
    x16, x24 = _rand(16, 32, seed=7), _rand(24, 32, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _agrees(opt(x16), jax.jit(_qkv)(x16))
        if opt.report(x16).used != "original" or not decisions:
            pytest.skip("no candidate reached the timing at this shape")
        n_built = len(built)
        assert _agrees(opt(x24), jax.jit(_qkv)(x24))
    report = opt.report(x24)
    assert len(decisions) == 1 and len(built) == n_built  # neither built nor timed again
    assert report.used == "original" and "plan of signature" in report.reason


def test_a_changed_program_is_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reuse is per program structure: a static argument that changes the ops is a new search."""
    searches = _counting(monkeypatch, candidates, "region_candidates")

    def layer(x: jax.Array, act: str) -> jax.Array:
        return getattr(jnp, act)(x @ W[0]) @ W[1] + x @ W[2]

    opt = optimize(layer, static_argnums=1, check_speed=False, time_limit=1.0, cost_model="roofline", rules=RULES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt(_rand(8, 32), "tanh")
        before = len(searches)
        got = opt(_rand(12, 32, seed=2), "sin")
    assert _agrees(got, jax.jit(layer, static_argnums=1)(_rand(12, 32, seed=2), "sin"))
    assert len(searches) > before and opt.report(_rand(12, 32, seed=2), "sin").searched_regions >= 1


def _reshape_graph(rows: int, cols: int = 8, act: str = "relu") -> Any:
    g = GraphBuilder()
    x, w = g.input("L0", (rows, cols)), g.weight("L1", (cols, cols))
    return g.build([g.reshape(getattr(g, act)(g.matmul(x, w)), (rows, 2, cols // 2))])


def test_reshape_like_maps_sizes_and_refuses_what_does_not_fit() -> None:
    old, new = _reshape_graph(2), _reshape_graph(3)
    assert shape_free_key(old) == shape_free_key(new) != shape_free_key(_reshape_graph(2, act="tanh"))
    rebuilt = reshape_like(old, old, new)
    assert rebuilt == new  # sizes, reshape target included, mapped to the new region's
    x, w = np.ones((3, 8), np.float32), np.ones((8, 8), np.float32)
    np.testing.assert_allclose(rebuilt.evaluate({"L0": x, "L1": w})[0], new.evaluate({"L0": x, "L1": w})[0])
    assert reshape_like(old, old, _reshape_graph(3, 16)) is not None  # both leaves resized consistently
    other = GraphBuilder()
    a = other.input("L0", (2, 8))
    assert reshape_like(other.build([other.relu(a)]), old, new) is None  # its output shape is not the region's


def test_a_reused_shape_measures_no_op_costs_for_its_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """At a new shape whose search is reused, the measured model's predicted costs are not timed
    (left unknown in the report); the first shape's are."""
    from jax_backend.measured_cost import MeasuredModel

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))  # op costs another test measured are not in it

    measured = _counting(monkeypatch, MeasuredModel, "_measure")
    opt = optimize(_qkv, check_speed=False, time_limit=1.0, cost_model="measured", rules=RULES)
    x16, x24 = _rand(16, 32, seed=7), _rand(24, 32, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt(x16)
        first = len(measured)
        out = opt(x24)
    report = opt.report(x24)
    assert first > 0 and len(measured) == first
    assert report.searched_regions == 0 and report.shape_reused_regions > 0
    assert all(s.cost_before is None for s in report.segments if s.cost_model == "measured")
    assert _agrees(out, jax.jit(_qkv)(x24))


def _keep(decisions: list[int]) -> Callable[..., Choice]:
    def keep(base: Any, cands: Any, args: Any, *a: Any, **k: Any) -> Choice:
        decisions.append(1)
        d = Decision("faster", 1.2, 1.1, 1.3, 1.01, 8, 1.2e-3, 1e-3, 0.99, 0.1, 1)
        return Choice(0, d, (d.as_paired(),))
    return keep


def test_a_new_shape_keeps_a_kept_plan_checked_equal_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan kept at one shape is re-built and checked equal at the new one (the original compiled
    in the same program), and keeps the decision it was timed on: nothing is timed again."""
    decisions: list[int] = []
    monkeypatch.setattr(checks, "choose_faster", _keep(decisions))
    monkeypatch.setattr(checks, "load_decision", lambda key: None)  # nothing persisted by another test
    compares = _counting(monkeypatch, checks, "_compare")
    opt = optimize(_qkv, time_limit=1.0, cost_model="roofline", rules=RULES)
    x16, x24 = _rand(16, 32, seed=7), _rand(24, 32, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _agrees(opt(x16), jax.jit(_qkv)(x16))
        if opt.report(x16).used != "optimized":
            pytest.skip("no candidate at this shape")
        checked = len(compares)
        assert _agrees(opt(x24), jax.jit(_qkv)(x24))
    report = opt.report(x24)
    assert len(decisions) == 1 and len(compares) == checked + 1  # checked at the new shape, not timed
    assert report.used == "optimized" and report.numerics_ok and "not re-timed" in report.reason
    assert report.decision is not None and report.decision.speedup == pytest.approx(1.2)


def test_a_kept_plan_that_disagrees_at_a_new_shape_runs_the_original(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan is kept at a new shape only if checked equal there."""
    decisions: list[int] = []
    monkeypatch.setattr(checks, "choose_faster", _keep(decisions))
    monkeypatch.setattr(checks, "load_decision", lambda key: None)
    real = checks._compare
    rows: list[int] = []

    def compare(ref: Any, got: Any, rtol: float, atol: float) -> tuple[bool, float]:
        rows.append(1)
        ok, err = real(ref, got, rtol, atol)
        return (ok, err) if len(rows) == 1 else (False, 0.5)  # wrong at every later shape

    monkeypatch.setattr(checks, "_compare", compare)
    opt = optimize(_qkv, time_limit=1.0, cost_model="roofline", rules=RULES)
    x16, x24, x32 = _rand(16, 32, seed=7), _rand(24, 32, seed=8), _rand(32, 32, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt(x16)
        if opt.report(x16).used != "optimized":
            pytest.skip("no candidate at this shape")
        assert _agrees(opt(x24), jax.jit(_qkv)(x24))
        assert _agrees(opt(x32), jax.jit(_qkv)(x32))
    assert opt.report(x24).used == "original" and opt.report(x24).numerics_ok is False
    assert opt.report(x32).used == "original" and "plan of signature" in opt.report(x32).reason
    assert len(rows) == 2 and len(decisions) == 1  # the third shape reuses the discard: not built


def test_a_program_no_rewrite_changes_is_not_searched_at_a_new_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    splits = _counting(monkeypatch, candidates, "collect_candidates")

    def plain(x: jax.Array) -> jax.Array:
        return jnp.tanh(x) * 2.0 + 1.0

    opt = optimize(plain, time_limit=1.0, cost_model="roofline", rules=RULES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt(_rand(8, 32))
        before = len(splits)
        got = opt(_rand(12, 32, seed=3))
    assert _agrees(got, jax.jit(plain)(_rand(12, 32, seed=3)))
    report = opt.report(_rand(12, 32, seed=3))
    assert opt.report(_rand(8, 32)).reason == "no rewrite changed the program"
    assert len(splits) == before and report.used == "original" and "plan of signature" in report.reason


@pytest.mark.parametrize("outer_jit", [False, True])
def test_a_kept_plan_wrong_at_a_new_shape_is_never_used(monkeypatch: pytest.MonkeyPatch, outer_jit: bool) -> None:
    """The new shape's candidate (negated here, at 24 rows only) is traced into the wrapper's
    program unchecked and checked before the call returns, called directly or inside `jax.jit`:
    the call's outputs and every later call are the original's."""
    decisions: list[int] = []
    monkeypatch.setattr(checks, "choose_faster", _keep(decisions))
    monkeypatch.setattr(checks, "load_decision", lambda key: None)
    real = candidates.apply_label

    def wrong_at_24(graph: Any, label: str, search: Any) -> Any:
        g, key = real(graph, label, search)
        if not key or graph.nodes[0].shapes[0][0] != 24 and graph.nodes[1].shapes[0][0] != 24:
            return g, key
        b = GraphBuilder()
        t: dict[tuple[int, int], Any] = {}
        for i, n in enumerate(g.nodes):
            outs = b.apply(n.op, [t[(v.node, v.index)] for v in n.inputs], n.attr)
            t.update({(i, k): o for k, o in enumerate(outs)})
        return b.build([b.apply("neg", [t[(v.node, v.index)]])[0] for v in g.outputs]), key

    monkeypatch.setattr(candidates, "apply_label", wrong_at_24)
    opt = optimize(_qkv, time_limit=1.0, cost_model="roofline", rules=RULES)
    x16, x24 = _rand(16, 32, seed=7), _rand(24, 32, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _agrees(opt(x16), jax.jit(_qkv)(x16))
        if opt.report(x16).used != "optimized":
            pytest.skip("no candidate at this shape")
        call = jax.jit(lambda x: opt(x)) if outer_jit else opt
        assert _agrees(call(x24), jax.jit(_qkv)(x24))
        assert _agrees(opt(x24), jax.jit(_qkv)(x24))
    report = opt.report(x24)
    assert report.used == "original" and report.numerics_ok is False and "differ" in report.reason

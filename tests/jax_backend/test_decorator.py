"""@eqsat.optimize never changes results: outputs, gradients and vmap equal the original, and any
failure falls back to the original with a warning."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from jax_backend.decorator import EqsatFallbackWarning, optimize


def _rand(*shape: int, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def qkv(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    return jax.nn.softmax(q @ k.T / 4.0) @ v + jnp.cumsum(x, axis=1)


ARGS = (_rand(16, 8), _rand(8, 8, seed=1), _rand(8, 8, seed=2), _rand(8, 8, seed=3))


@pytest.mark.parametrize("lowering", ["xla", pytest.param("pallas", marks=pytest.mark.slow)])
def test_outputs_grads_vmap_equal(lowering: str) -> None:
    opt = optimize(qkv, check_speed=False, time_limit=20.0, lowering=lowering)  # ample: the search ends when saturated
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)  # nothing may fail on the way
        np.testing.assert_allclose(jax.jit(opt)(*ARGS), qkv(*ARGS), rtol=2e-4, atol=1e-5)
        loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
        for g, r in zip(jax.grad(loss(opt), argnums=(0, 1, 2, 3))(*ARGS), jax.grad(loss(qkv), argnums=(0, 1, 2, 3))(*ARGS)):
            np.testing.assert_allclose(g, r, rtol=2e-4, atol=1e-4)
        xs = jnp.stack([ARGS[0], _rand(16, 8, seed=9)])
        np.testing.assert_allclose(jax.vmap(opt, in_axes=(0, None, None, None))(xs, *ARGS[1:]),
                                   jax.vmap(qkv, in_axes=(0, None, None, None))(xs, *ARGS[1:]), rtol=2e-4, atol=1e-5)
    report = opt.report(*ARGS)
    assert report.used == "optimized", report.reason  # the three projections of x merge into one matmul
    assert report.reason.endswith("checked equal (speed not checked)") and report.numerics_ok
    assert report.cost_device == "cpu" and "cumsum" in report.opaque
    assert report.segments and report.segments[0].regions.startswith("1 region")


def test_optimizes_once_per_signature_and_static_args() -> None:
    calls = []

    def f(x, n):
        calls.append(n)
        return jnp.tanh(x) * n

    opt = eqsat.optimize(static_argnums=1, check_speed=False, time_limit=1.0)(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)
        for _ in range(3):
            np.testing.assert_allclose(opt(ARGS[0], 2), np.tanh(np.asarray(ARGS[0])) * 2, rtol=1e-6)
        opt(ARGS[0], 3)
    assert len(opt.reports) == 2
    assert {r.used for r in opt.reports} == {"original"}  # the second reuses the first's plan (same structure)
    assert all(r.reason.endswith("no rewrite changed the program") for r in opt.reports)


def test_broken_optimizer_falls_back_with_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import eqsat.candidates as dec

    def wrong(graph, label, search):  # pretend eqsat returned a wrong graph: negate every output
        from eqsat.ir import GraphBuilder
        b = GraphBuilder()
        t = {}
        for i, n in enumerate(graph.nodes):
            outs = b.apply(n.op, [t[(v.node, v.index)] for v in n.inputs], n.attr)
            t.update({(i, k): o for k, o in enumerate(outs)})
        bad = b.build([b.apply("neg", [t[(v.node, v.index)]])[0] for v in graph.outputs])
        return bad, ("negated",)

    monkeypatch.setattr(dec, "apply_label", wrong)
    f = lambda x: jnp.tanh(x) + 1.0  # noqa: E731
    opt = optimize(f, check_speed=False)
    with pytest.warns(EqsatFallbackWarning, match="differ"):
        out = opt(ARGS[0])
    np.testing.assert_array_equal(out, jax.jit(f)(ARGS[0]))  # the original runs compiled, as jax.jit runs it
    assert opt.report(ARGS[0]).used == "original"


@pytest.mark.parametrize(("options", "message"), [
    ({"lowering": "cuda"}, "lowering"),
    ({"time_limit": 0}, "time_limit"),
    ({"extractor": "simplex"}, "unknown extractor 'simplex'; choose from .*ilp"),
    ({"cost_model": "rooflien"}, "unknown cost model 'rooflien'; known cost models: measured, merge, (parallel[-a-z]*, )*roofline"),
    ({"cost_model": ["roofline", "nope"]}, "unknown cost model 'nope'"),
    ({"rules": "/no/such/file.rules"}, "cannot read rule file"),
    ({"rules": 3}, "rules must be"),
    ({"rules": ["fine.rules", 3.5]}, "rules must be|cannot read"),
])
def test_bad_options_are_rejected_at_decoration(options, message) -> None:
    """A typo in an option is the user's error: it fails at once with the choices, never silently
    leaves the function unoptimized."""
    with pytest.raises(eqsat.errors.EqsatError, match=message):
        optimize(qkv, **options)


def test_malformed_rule_file_is_rejected_at_decoration(tmp_path) -> None:
    path = tmp_path / "bad.rules"
    path.write_text("broken: (ewadd ?a => ?a\n")
    with pytest.raises(eqsat.errors.EqsatError, match="bad.rules"):
        optimize(rules=path)(qkv)


def test_explain_writes_pictures(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)
        text = eqsat.explain(optimize(qkv, check_speed=False, time_limit=20.0), *ARGS, out=tmp_path)
    assert text.report.used == "optimized", text.report.reason
    assert "graph 0" in str(text) and text.pictures and "e-graph regions: 1 region" in str(text)
    seg = text.report.segments[0]
    assert seg.cost_before is not None and seg.cost_after is not None and seg.cost_before > 0
    assert ("relative units" in str(text) or "µs per call" in str(text)) and "unknown" not in str(text)
    assert all(p.stat().st_size > 1000 for p in text.pictures)


def test_max_pool_is_split_into_row_and_column_passes() -> None:
    """A 3x3 max pool is rewritten into a 1x3 and a 3x1 pass (the measured model's choice: on a map
    this size XLA's 3x3 reduce_window takes several times the two passes) with outputs and
    gradients unchanged."""
    from jax import lax

    def pool_then_scale(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME") * 2.0

    x = _rand(4, 96, 28, 28)
    opt = optimize(pool_then_scale, cost_model="measured", check_speed=False)
    np.testing.assert_array_equal(opt(x), pool_then_scale(x))
    np.testing.assert_allclose(jax.grad(lambda v: opt(v).sum())(x), jax.grad(lambda v: pool_then_scale(v).sum())(x))
    report = opt.report(x)
    assert report.used == "optimized"
    (seg,) = report.segments
    assert any(f.startswith("poolmax-separable-3x3-s1-same") for f in seg.rules_fired)
    kernels = sorted((n.attr["kernel_h"], n.attr["kernel_w"]) for n in seg.after.nodes if n.op == "poolmax")
    assert kernels == [(1, 3), (3, 1)]


@pytest.mark.parametrize(("platform", "kind", "device", "warns"), [
    ("cpu", "cpu", "cpu", False),
    ("gpu", "NVIDIA H100 80GB HBM3", "h100", False),
    ("gpu", "NVIDIA H200", "h200", False),
    ("gpu", "NVIDIA A100-SXM4-40GB", "h100", True),
    ("tpu", "TPU v5 lite", "h100", True),
])
def test_the_cost_device_is_read_from_the_jax_device(platform: str, kind: str, device: str, warns: bool) -> None:
    """Costs are predicted for the device the program runs on; a device the cost registry has no
    numbers for gets a stand-in, said out loud."""
    from jax_backend.decorator_options import cost_device_for

    name, warning = cost_device_for(platform, kind)
    assert name == device and bool(warning) == warns
    if warns:
        assert kind in warning and "h100" in warning


def test_a_pallas_kernel_the_backend_cannot_compile_falls_back_to_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, Triton refuses some Pallas kernels (shared memory, scalar operands): the candidate
    is then lowered through XLA and can still be kept, instead of being dropped."""
    import jax_backend.pallas as pallas

    def refuse(*_: object, **__: object) -> None:
        raise ValueError("The Pallas Triton lowering currently requires that all operations have array arguments")

    monkeypatch.setattr(pallas, "to_jax_pallas", refuse)
    opt = optimize(qkv, check_speed=False, time_limit=20.0, lowering="pallas")
    np.testing.assert_allclose(opt(*ARGS), qkv(*ARGS), rtol=2e-4, atol=1e-5)
    report = opt.report(*ARGS)
    assert report.used == "optimized", report.reason  # the merged projections, through XLA

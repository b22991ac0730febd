"""Real Flax (nnx, linen) and Equinox models under `@eqsat.optimize`: outputs and gradients (with
respect to parameters and data) equal `jax.jit`'s, vmap too; the version kept is the one known."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")

from experiments.jax_models import MODEL_BUILDERS
from jax_backend.decorator import EqsatFallbackWarning, optimize


def _close(a: object, b: object, rtol: float = 2e-4) -> None:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        scale = max(1.0, float(np.max(np.abs(np.asarray(y)), initial=0.0)))
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=rtol * scale)


_SLOW = {"nnx_transformer_block", "linen_rnn_scan", "linen_cnn"}  # 10-15 s each on two cores
_GAINS = {"nnx_transformer_block"}  # saturated, the merge model joins its Q/K/V projections


@pytest.mark.parametrize("build", [pytest.param(b, marks=pytest.mark.slow) if b.__name__ in _SLOW else b
                                   for b in MODEL_BUILDERS], ids=lambda b: b.__name__)
def test_model_outputs_gradients_vmap_equal(build) -> None:
    prog = build()
    params, x = prog.make_args(0)
    gains = build.__name__ in _GAINS
    opt = optimize(prog.fn, check_speed=False, time_limit=30.0 if gains else 2.0)  # 30: time to saturate
    with warnings.catch_warnings():
        warnings.simplefilter("error", EqsatFallbackWarning)  # nothing may fail on the way
        _close(opt(params, x), jax.jit(prog.fn)(params, x))
        loss = lambda f: lambda p, v: jnp.sum(f(p, v) ** 2)  # noqa: E731
        want = jax.jit(jax.grad(loss(prog.fn), argnums=(0, 1)))(params, x)
        _close(jax.grad(loss(opt), argnums=(0, 1))(params, x), want, rtol=1e-3)
        xs = jnp.stack([x, prog.make_args(1)[1]])
        _close(jax.vmap(opt, in_axes=(None, 0))(params, xs), jax.vmap(prog.fn, in_axes=(None, 0))(params, xs))
    report = opt.report(params, x)
    checked_equal = report.used == "optimized" and report.reason.endswith("checked equal (speed not checked)")
    if gains:
        assert checked_equal, report.reason
    else:  # within its 2 s a rewrite (e.g. of a pool) may or may not be found: either way nothing failed
        assert checked_equal or (report.used, report.reason) == ("original", "no rewrite changed the program"), \
            report.reason

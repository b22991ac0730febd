"""`eqsat bench ceiling`: what hand-written rewrites of the JAX targets gain over `jax.jit` here.

For each target program, hand-written rewrites of it (the best versions an equality-saturation
optimizer could reach, whether or not eqsat's rules reach them: merged matmuls and convs, folded
batchnorm and scales, a separable max pool, other layouts, convs as matmuls, softmax normalized
after the value matmul, the loop unrolled...) are checked equal to the original (rtol 2e-4) and timed against `jax.jit` of
it, all in the same paired, interleaved rounds. The fastest is timed again on fresh rounds, so the
winner of many noisy screens is not taken at its luckiest. The geomean of those best speedups over
the six targets bounds what `eqsat bench jax`'s GEOMEAN can reach through these rewrites: when it
is below the goal, extracting better among them cannot meet the goal here.

Beside it, each original's achieved GFLOP/s (XLA's FLOP count over its time) as a fraction of a
large square matmul's: how much room is left for anything that does the same arithmetic.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqsat.models.jax_programs import PROGRAMS, JaxProgram
from eqsat.timer import best_of

__all__ = ["VARIANTS", "run_bench", "plot_ceiling"]

RTOL = 2e-4
HEADS = 8
relu = jax.nn.relu


# --- attention (x; wq, wk, wv, wo) -------------------------------------------------------------

def _attend(q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    s, d = q.shape
    split = lambda t: t.reshape(s, HEADS, d // HEADS).transpose(1, 0, 2)  # noqa: E731
    scores = jnp.einsum("hqd,hkd->hqk", split(q), split(k)) * scale
    out = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), split(v))
    return out.transpose(1, 0, 2).reshape(s, d)


def attention_qkv_merged(x, wq, wk, wv, wo):
    d = x.shape[1]
    qkv = x @ jnp.concatenate([wq, wk, wv], axis=1)
    return x + _attend(qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:], 1 / np.sqrt(d // HEADS)) @ wo


def attention_scale_folded(x, wq, wk, wv, wo):
    d = x.shape[1]
    return x + _attend(x @ (wq / np.sqrt(d // HEADS)), x @ wk, x @ wv, 1.0) @ wo


def attention_head_major(x, wq, wk, wv, wo):
    """Projections straight into (head, seq, dim) and out of it: no transposes of activations."""
    d, e = x.shape[1], x.shape[1] // HEADS
    heads = lambda w: jnp.einsum("sd,dhe->hse", x, w.reshape(d, HEADS, e))  # noqa: E731
    scores = jnp.einsum("hqe,hke->hqk", heads(wq / np.sqrt(e)), heads(wk))
    out = jnp.einsum("hqk,hke->hqe", jax.nn.softmax(scores, axis=-1), heads(wv))
    return x + jnp.einsum("hqe,hed->qd", out, wo.reshape(HEADS, e, d))


def attention_late_normalization(x, wq, wk, wv, wo):
    """softmax(S) V = (exp(S - max) V) / rowsum(exp(S - max)): divide (h, q, e) instead of (h, q, k)."""
    s, d = x.shape
    split = lambda t: t.reshape(s, HEADS, d // HEADS).transpose(1, 0, 2)  # noqa: E731
    scores = jnp.einsum("hqd,hkd->hqk", split(x @ (wq / np.sqrt(d // HEADS))), split(x @ wk))
    p = jnp.exp(scores - lax.stop_gradient(scores.max(axis=-1, keepdims=True)))
    out = jnp.einsum("hqk,hkd->hqd", p, split(x @ wv)) / p.sum(axis=-1, keepdims=True)
    return x + out.transpose(1, 0, 2).reshape(s, d) @ wo


# --- NasRNN (x, h; wx, wh) -------------------------------------------------------------------------

def _nasrnn_combine(pre: Sequence[jax.Array]) -> jax.Array:
    gates = [jnp.tanh(p) if i % 2 else jax.nn.sigmoid(p) for i, p in enumerate(pre)]
    a = gates[0] * gates[1] + gates[2] * gates[3]
    b = relu(gates[4] + gates[5]) * jnp.tanh(gates[6] + gates[7])
    return jnp.tanh(a + b)


def _gate_columns(w: jax.Array) -> jax.Array:
    """(8, d, d) → (d, 8d): gate i's weight in columns [i d, (i + 1) d)."""
    return jnp.concatenate(list(w), axis=1)


def nasrnn_gates_merged(x, h, wx, wh):
    """All sixteen matmuls as one: [x h] · [Wx; Wh] with every gate's columns side by side."""
    d = x.shape[1]
    pre = jnp.concatenate([x, h], axis=1) @ jnp.concatenate([_gate_columns(wx), _gate_columns(wh)], axis=0)
    return _nasrnn_combine([pre[:, i * d:(i + 1) * d] for i in range(8)])


def nasrnn_two_matmuls(x, h, wx, wh):
    d = x.shape[1]
    pre = x @ _gate_columns(wx) + h @ _gate_columns(wh)
    return _nasrnn_combine([pre[:, i * d:(i + 1) * d] for i in range(8)])


def nasrnn_pairs_merged(x, h, wx, wh):
    """Each gate's two matmuls as one (x·W + h·U = [x h]·[W; U]), the gates kept apart."""
    xh = jnp.concatenate([x, h], axis=1)
    return _nasrnn_combine([xh @ jnp.concatenate([wx[i], wh[i]], axis=0) for i in range(8)])


# --- inception (x; w1, r3, w3, r5, w5, wp) -------------------------------------------------------

def _conv(x: jax.Array, w: jax.Array, layout: str = "NCHW") -> jax.Array:
    dims = ("NCHW", "OIHW", "NCHW") if layout == "NCHW" else ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims)


def _pool(x: jax.Array, layout: str = "NCHW") -> jax.Array:
    window = (1, 1, 3, 3) if layout == "NCHW" else (1, 3, 3, 1)
    return lax.reduce_window(x, -jnp.inf, lax.max, window, (1, 1, 1, 1), "SAME")


def inception_1x1_merged(x, w1, r3, w3, r5, w5, wp):
    """The three 1x1 convs that read x as one conv, its output sliced (relu before the slices)."""
    a, b = w1.shape[0], w1.shape[0] + r3.shape[0]
    y = relu(_conv(x, jnp.concatenate([w1, r3, r5], axis=0)))
    branches = [y[:, :a], relu(_conv(y[:, a:b], w3)), relu(_conv(y[:, b:], w5)), relu(_conv(_pool(x), wp))]
    return jnp.concatenate(branches, axis=1)


def _separable_pool(x: jax.Array) -> jax.Array:
    rows = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 1, 3), (1, 1, 1, 1), "SAME")
    return lax.reduce_window(rows, -jnp.inf, lax.max, (1, 1, 3, 1), (1, 1, 1, 1), "SAME")


def inception_separable_pool(x, w1, r3, w3, r5, w5, wp):
    """The 3x3 max pool as a 1x3 then a 3x1 pass (eqsat's decompositions rules)."""
    branches = [relu(_conv(x, w1)), relu(_conv(relu(_conv(x, r3)), w3)), relu(_conv(relu(_conv(x, r5)), w5)),
                relu(_conv(_separable_pool(x), wp))]
    return jnp.concatenate(branches, axis=1)


def _conv1x1_as_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])


def inception_1x1_as_matmul(x, w1, r3, w3, r5, w5, wp):
    m = _conv1x1_as_matmul
    branches = [relu(m(x, w1)), relu(_conv(relu(m(x, r3)), w3)), relu(_conv(relu(m(x, r5)), w5)), relu(m(_pool(x), wp))]
    return jnp.concatenate(branches, axis=1)


def inception_nhwc(x, w1, r3, w3, r5, w5, wp):
    """The block in NHWC/HWIO (the layout XLA's CPU convolutions use), transposed at its borders."""
    t = x.transpose(0, 2, 3, 1)
    c = lambda inp, w: _conv(inp, w.transpose(2, 3, 1, 0), "NHWC")  # noqa: E731
    branches = [relu(c(t, w1)), relu(c(relu(c(t, r3)), w3)), relu(c(relu(c(t, r5)), w5)), relu(c(_pool(t, "NHWC"), wp))]
    return jnp.concatenate(branches, axis=3).transpose(0, 3, 1, 2)


# --- MLP (x; w1, b1, w2, b2, w3) ---------------------------------------------------------------------

def mlp_bias_in_matmul(x, w1, b1, w2, b2, w3):
    """x·W + b = [x 1]·[W; b]: the bias adds ride inside the matmuls."""
    ones = jnp.ones((x.shape[0], 1), x.dtype)
    h = relu(jnp.concatenate([x, ones], axis=1) @ jnp.concatenate([w1, b1[None]], axis=0))
    h = jnp.tanh(jnp.concatenate([h, ones], axis=1) @ jnp.concatenate([w2, b2[None]], axis=0))
    return h @ w3


def mlp_transposed(x, w1, b1, w2, b2, w3):
    """The chain computed on x^T (feature-major activations), transposed once at the end."""
    h = relu(w1.T @ x.T + b1[:, None])
    h = jnp.tanh(w2.T @ h + b2[:, None])
    return (w3.T @ h).T


# --- conv + batchnorm (x; w, scale, bias, mean, var) -----------------------------------------------

def _bn_folded(w: jax.Array, scale: jax.Array, bias: jax.Array, mean: jax.Array,
               var: jax.Array) -> tuple[jax.Array, jax.Array]:
    inv = scale / jnp.sqrt(var + 1e-5)
    return w * inv[:, None, None, None], bias - mean * inv


def conv_bn_folded(x, w, scale, bias, mean, var):
    wf, bf = _bn_folded(w, scale, bias, mean, var)
    return relu(_conv(x, wf) + bf[None, :, None, None])


def conv_bn_folded_nhwc(x, w, scale, bias, mean, var):
    wf, bf = _bn_folded(w, scale, bias, mean, var)
    return relu(_conv(x.transpose(0, 2, 3, 1), wf.transpose(2, 3, 1, 0), "NHWC") + bf).transpose(0, 3, 1, 2)


def conv_bn_folded_im2col(x, w, scale, bias, mean, var):
    wf, bf = _bn_folded(w, scale, bias, mean, var)
    o, i, kh, kw = wf.shape
    patches = lax.conv_general_dilated_patches(x, (kh, kw), (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return relu(jnp.einsum("nphw,op->nohw", patches, wf.reshape(o, i * kh * kw)) + bf[None, :, None, None])


# --- cumsum / sort / fori_loop (x, w) -------------------------------------------------------------

def mixed_loop_unrolled(x, w):
    h = jnp.tanh(x @ w)
    t = jnp.sort(jnp.cumsum(h, axis=1), axis=1)
    for _ in range(3):
        t = jnp.tanh(t @ w)
    return relu(t @ w + h)


def mixed_cumsum_as_matmul(x, w):
    """cumsum along rows = h · U with U upper-triangular ones (a matmul instead of a scan)."""
    h = jnp.tanh(x @ w)
    n = h.shape[1]
    t = jnp.sort(h @ jnp.triu(jnp.ones((n, n), h.dtype)), axis=1)
    t = lax.fori_loop(0, 3, lambda i, s: jnp.tanh(s @ w), t)
    return relu(t @ w + h)


VARIANTS: dict[str, tuple[Callable[..., Any], ...]] = {
    "attention": (attention_qkv_merged, attention_scale_folded, attention_head_major, attention_late_normalization),
    "nasrnn": (nasrnn_gates_merged, nasrnn_two_matmuls, nasrnn_pairs_merged),
    "inception": (inception_separable_pool, inception_1x1_merged, inception_1x1_as_matmul, inception_nhwc),
    "mlp": (mlp_bias_in_matmul, mlp_transposed),
    "conv_bn": (conv_bn_folded, conv_bn_folded_nhwc, conv_bn_folded_im2col),
    "mixed_cumsum_sort_loop": (mixed_loop_unrolled, mixed_cumsum_as_matmul),
}
"""Each target program's hand-written rewrites (same signature as the unbound program)."""


def _close(a: Any, b: Any) -> tuple[bool, float]:
    """`eqsat.compare.outputs_agree` of `a` against the reference `b` (within RTOL of its magnitude,
    at least 1): (agrees, error relative to the magnitude)."""
    from eqsat.compare import outputs_agree

    verdict = outputs_agree([b], [a], RTOL, atol=RTOL)
    return verdict.ok, verdict.max_rel_err


def _xla_flops(fn: Callable[..., Any], args: Sequence[Any]) -> float | None:
    """Floating-point operations XLA counts in the compiled `fn` (None where it gives none)."""
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    flops = (analysis or {}).get("flops")
    return float(flops) if flops else None


def matmul_peak_gflops(n: int = 1024, repeats: int = 30) -> float:
    """GFLOP/s of jax.jit's square n x n matmul here (best of `repeats`: noise only slows it): the
    machine's practical peak, against which each program's achieved rate shows how close to it XLA
    already runs."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    square = jax.jit(lambda m: m @ m)
    square(a).block_until_ready()
    best = best_of(lambda: square(a).block_until_ready(), repeats)
    return 2 * n ** 3 / best / 1e9


def bench_ceiling(prog: JaxProgram, rounds: int, budget_s: float, peak_gflops: float | None = None) -> list[dict[str, Any]]:
    """Rows for each variant of `prog` (screened together), one for the best (timed again), and
    one for the original: its FLOPs and achieved GFLOP/s (as a fraction of `peak_gflops`)."""
    from jax_backend.timing import choose_faster

    args = prog.make_args(0)
    original = jax.jit(prog.fn)
    ref = original(*args)
    rows: list[dict[str, Any]] = []
    usable: list[tuple[str, Callable[..., Any]]] = []
    for variant in VARIANTS[prog.name]:
        fn = jax.jit(prog.bound(variant))
        ok, err = _close(fn(*args), ref)
        row = {"program": prog.name, "variant": variant.__name__, "equal": ok, "max_rel_error": err,
               "doc": (variant.__doc__ or "").strip()}
        rows.append(row)
        if ok:
            usable.append((variant.__name__, fn))
    if not usable:
        return rows
    choice = choose_faster(original, [fn for _, fn in usable], args, rounds, budget_s)
    by_name = {r["variant"]: r for r in rows}
    for (name, _), screen in zip(usable, choice.screens):
        by_name[name].update(screen.to_json())
    best, timing = choice.best, choice.timing
    rows.append({"program": prog.name, "variant": "BEST", "best": usable[best][0], **timing.as_paired().to_json(),
                 "verdict": timing.verdict})
    flops = _xla_flops(prog.fn, args)
    if flops is not None:
        rate = flops / timing.base_s / 1e9
        rows.append({"program": prog.name, "variant": "ORIGINAL", "flops": flops, "ms": timing.base_s * 1e3,
                     "gflops_per_s": rate, "fraction_of_matmul_peak": rate / peak_gflops if peak_gflops else None})
    return rows


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def plot_ceiling(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Every variant's screened speedup per program, and the re-timed best with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["program"] for r in rows if "speedup" in r and r["variant"] not in ("BEST", "ORIGINAL")))
    floor = 0.7  # far slower variants (im2col convs) are drawn at the floor, labelled with their value
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 4.2))
    for i, name in enumerate(names):
        screened = [r["speedup"] for r in rows if r["program"] == name and r["variant"] != "BEST" and "speedup" in r]
        rate = next((r for r in rows if r["program"] == name and r["variant"] == "ORIGINAL"), None)
        if rate is not None and rate["fraction_of_matmul_peak"]:
            ax.annotate(f"{rate['gflops_per_s']:.0f} GFLOP/s\n({rate['fraction_of_matmul_peak']:.0%} of peak)",
                        (i, 1.14), ha="center", va="top", fontsize=7)
        ax.scatter([i - 0.15] * len(screened), [max(v, floor) for v in screened], color="tab:gray", s=14,
                   label="screened variants" if i == 0 else None)
        for v in screened:
            if v < floor:
                ax.annotate(f"{v:.2f}", (i - 0.15, floor), textcoords="offset points", xytext=(4, 2), fontsize=7)
        best = next((r for r in rows if r["program"] == name and r["variant"] == "BEST"), None)
        if best is not None:
            ax.errorbar([i + 0.15], [best["speedup"]], color="tab:blue", fmt="o", capsize=4,
                        yerr=[[best["speedup"] - best["speedup_ci_low"]], [best["speedup_ci_high"] - best["speedup"]]],
                        label="best, re-timed (95% CI)" if i == 0 else None)
    ax.set_ylim(floor - 0.02, 1.15)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.0345, color="tab:red", linestyle="--", linewidth=0.8, label="Enzyme-JAX EqSat (+3.45%)")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("speedup over jax.jit")
    ax.set_title(f"Hand-written rewrites on {jax.devices()[0].platform.upper()}: the ceiling")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_bench(out_dir: Path | None = None, rounds: int = 40, budget_s: float = 8.0,
              programs: Sequence[str] | None = None) -> Iterable[dict[str, Any]]:
    """Rows for every variant of every chosen target, then the CEILING_GEOMEAN of the bests."""
    from rich.console import Console
    from rich.progress import Progress

    warnings.simplefilter("ignore")
    chosen = [p for p in PROGRAMS if p.name in VARIANTS and (programs is None or p.name in programs)]
    rows: list[dict[str, Any]] = []
    peak = matmul_peak_gflops()
    rows.append({"program": "MATMUL_PEAK", "variant": "1024x1024x1024, best of 30", "gflops_per_s": peak})
    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("bench ceiling", total=len(chosen))
        for prog in chosen:
            bar.update(task, description=prog.name)
            rows.extend(bench_ceiling(prog, rounds, budget_s, peak))
            bar.advance(task)
    best = [r for r in rows if r["variant"] == "BEST"]
    if best:
        rows.append({"program": "CEILING_GEOMEAN", "variant": "BEST", "programs": [r["program"] for r in best],
                     "speedup": _geomean([r["speedup"] for r in best]),
                     "speedup_ci_low": _geomean([r["speedup_ci_low"] for r in best]),
                     "speedup_ci_high": _geomean([r["speedup_ci_high"] for r in best]),
                     "note": "geomean of each program's best re-timed speedup; CI bounds are geomeans of bounds"})
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench_ceiling.json").write_text(json.dumps(rows, indent=1, default=str))
        plot_ceiling(rows, out_dir / "bench_ceiling.png")
    return rows

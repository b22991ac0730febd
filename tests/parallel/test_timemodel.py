"""The checked time model: ring factors, ring / tree latency, per-axis links, fitting alpha and beta
from timings, overlap, and the mesh calibration's cache (damaged or foreign caches are refused)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from eqsat import cli
from eqsat.cost import DeviceSpec
from eqsat.parallel import timemodel as tm
from eqsat.parallel.calibration import (
    PRODUCT_KINDS,
    AxisCalibration,
    MeshCalibration,
    MeshCalibrationError,
    ProductFit,
    TimedProduct,
    calibrated_model,
    read_mesh_calibration,
    write_mesh_calibration,
)
from eqsat.parallel.mesh import PRESETS, Mesh, MeshAxis


def test_ring_factors_are_the_bytes_each_device_sends() -> None:
    assert tm.wire_factor("all-reduce", 8) == pytest.approx(2 * 7 / 8)
    for kind in ("all-gather", "reduce-scatter", "all-to-all"):
        assert tm.wire_factor(kind, 4) == pytest.approx(3 / 4)
    assert tm.wire_factor("all-reduce", 2) == pytest.approx(1.0)  # Unity's two-device figure: S per device
    assert tm.wire_bytes("all-gather", 1, 1e6) == 0.0
    with pytest.raises(tm.TimeModelError, match="unknown collective kind"):
        tm.wire_factor("broadcast", 4)


def test_latency_steps_by_algorithm_and_kind() -> None:
    assert tm.latency_steps("all-reduce", 8, "ring") == 14  # reduce-scatter + all-gather, 7 steps each
    assert tm.latency_steps("all-gather", 8, "ring") == 7
    assert tm.latency_steps("all-reduce", 8, "tree") == 6  # 2 log2 8
    assert tm.latency_steps("reduce-scatter", 5, "tree") == 3  # ceil(log2 5)
    assert tm.latency_steps("all-to-all", 8, "once") == 1
    assert tm.latency_steps("all-reduce", 1, "ring") == 0
    with pytest.raises(tm.TimeModelError, match="latency algorithm"):
        tm.latency_steps("all-reduce", 4, "butterfly")


def test_collective_seconds_per_axis_link() -> None:
    mesh = Mesh("m", (MeshAxis("slow", 2, 1e9, 50e-6, "ring"), MeshAxis("fast", 4, 100e9, 2e-6, "tree")))
    s = 4e6
    assert mesh.collective_seconds("all-reduce", 0, s) == pytest.approx(2 * 50e-6 + 1.0 * s / 1e9)
    assert mesh.collective_seconds("all-gather", 1, s) == pytest.approx(2 * 2e-6 + 0.75 * s / 100e9)
    assert mesh.wire_bytes("all-reduce", 1, s) == pytest.approx(1.5 * s)
    # the presets keep their convention: alpha once per collective
    nv = PRESETS["h100x8"]
    assert nv.collective_seconds("all-reduce", 0, s) == pytest.approx(5e-6 + 2 * 7 / 8 * s / 450e9)


def _samples(alpha: float, beta: float, n: int, noise: float = 0.0) -> list[tm.LinkSample]:
    rng = np.random.default_rng(0)
    out = []
    for kind in ("all-reduce", "all-gather"):
        for size in (16e3, 256e3, 2e6, 8e6):
            t = tm.collective_seconds(kind, n, size, alpha, beta, "ring")
            out.append(tm.LinkSample(kind, n, size, t * (1 + noise * rng.standard_normal())))
    return out


def test_fit_recovers_known_alpha_beta() -> None:
    fit = tm.fit_link(_samples(20e-6, 5e9, 4))
    assert fit.alpha == pytest.approx(20e-6, rel=1e-6) and fit.beta == pytest.approx(5e9, rel=1e-6)
    assert fit.rms_rel_error < 1e-9 and fit.samples == 8
    noisy = tm.fit_link(_samples(20e-6, 5e9, 8, noise=0.03))
    assert noisy.alpha == pytest.approx(20e-6, rel=0.15) and noisy.beta == pytest.approx(5e9, rel=0.15)


def test_fit_keeps_alpha_and_beta_physical() -> None:
    """Timings with no latency term fit alpha 0, not a negative number."""
    samples = [tm.LinkSample("all-gather", 4, s, 0.75 * s / 1e9 * f) for s, f in ((1e3, 0.5), (1e6, 1.0), (4e6, 1.0))]
    fit = tm.fit_link(samples)
    assert fit.alpha >= 0 and fit.beta > 0


def test_fit_refuses_what_cannot_fit() -> None:
    with pytest.raises(tm.TimeModelError, match="two timed"):
        tm.fit_link([tm.LinkSample("all-reduce", 4, 1e6, 1e-3)])
    with pytest.raises(tm.TimeModelError, match="two sizes"):
        tm.fit_link([tm.LinkSample("all-reduce", 4, 1e6, 1e-3)] * 2)
    with pytest.raises(tm.TimeModelError, match="non-positive"):
        tm.fit_link([tm.LinkSample("all-reduce", 4, 1e6, 0.0), tm.LinkSample("all-reduce", 4, 1e3, 1e-4)])


def test_overlap_hides_comm_behind_independent_compute_only() -> None:
    # 0, 1 leaves; 2 = f(0) with a collective; 3 = g(1), independent of 2; 4 = h(2, 3)
    inputs = [[], [], [0], [1], [2, 3]]
    compute = [0.0, 0.0, 1.0, 3.0, 1.0]
    comm = [0.0, 0.0, 2.0, 0.0, 0.0]
    assert tm.overlapped_step(compute, comm, inputs) == pytest.approx(5.0)  # 2 s hidden behind node 3
    chain = [[], [0], [1]]  # everything depends on everything: nothing hides
    assert tm.overlapped_step([1.0, 1.0, 1.0], [0.0, 2.0, 0.0], chain) == pytest.approx(5.0)
    # never below the longer of all compute and all communication
    assert tm.overlapped_step([0.0, 0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 2.0, 2.0, 0.0], inputs) >= 4.0


# --- the calibration's cache ---------------------------------------------------------------------

def _calibration(machine: str = "m1", device: str = "cpu-test",
                 in_program: tuple[float, float] = (0.0, 0.0),
                 products: tuple[TimedProduct, ...] | None = None,
                 all_to_all: tuple[float, float] | None = None, fresh: tuple[tuple[float, float], ...] = (),
                 drift: tuple[tuple[float, float], ...] = ()) -> MeshCalibration:
    """A hand-made calibration; `in_program`: each axis's measured seconds of a 64 B all-reduce
    between compute pieces (0: not measured, no sync term); `all_to_all`: (alpha, beta) of an
    all-to-all link of its own on every axis."""
    products = _conv_samples(RATES) if products is None else products
    own = () if all_to_all is None else (("all-to-all", tm.LinkFit(all_to_all[0], all_to_all[1], 0.1, 3)),)
    axes = tuple(AxisCalibration(n, tm.fit_link(_samples(a, b, n)), tuple(_samples(a, b, n)), t, 64.0 if t else 0.0, own)
                 for (n, a, b), t in zip(((2, 30e-6, 1e9), (4, 10e-6, 2e9)), in_program))
    return MeshCalibration(machine, device, (2, 4), axes, DeviceSpec("cpu-calibrated", 5e9, 5e9, 8e9, 1e-6, "test"), 1.0,
                           ((1e7, 1e-3), (1e8, 2e-2)), products, 1e9, fresh, drift)





def test_calibration_round_trips_and_prices_per_axis(tmp_path: Path) -> None:
    cal = _calibration()
    path = tmp_path / "cal.json"
    write_mesh_calibration(path, cal)
    back = read_mesh_calibration(path, "m1", "cpu-test", (2, 4))
    assert back == cal
    model = calibrated_model(back)
    assert model.mesh.axes[0].algorithm == "ring" and model.mesh.axes[0].latency == pytest.approx(30e-6)
    assert model.mesh.collective_seconds("all-reduce", 1, 1e6) == pytest.approx(6 * 10e-6 + 1.5e6 / 2e9)
    # a product costs what the measured curve says for its flops (1e8 flops: 2e-2 s), plus a kernel
    assert model.compute.op_cost("matmul", {"act": 0}, [(100, 500), (500, 1000)]) == pytest.approx(2e-2 + 1e-6)
    assert model.compute.op_cost("ewadd", {}, [(1000,), (1000,)]) == pytest.approx(12e3 / 8e9 + 1e-6)


@pytest.mark.parametrize("damage", ["not json {", "[]", "null", "zero-rate", "negative-alpha", "wrong-shape", "bool",
                                    "one-matmul", "negative-in-program", "no-in-program", "format-2", "format-3",
                                    "one-conv", "negative-kind-link", "no-kind-links", "format-5", "negative-fresh",
                                    "format-7", "one-fresh-total", "descending-fresh",
                                    "format-6", "conv-without-shapes", "negative-conv",
                                    "product-of-no-kind", "no-drift", "descending-drift", "negative-drift"])
def test_damaged_cache_is_refused(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "cal.json"
    data = _calibration(all_to_all=(20e-6, 3e8), fresh=((4e6, 5e-10), (64e6, 1.6e-9)),
                        drift=((1e-5, 0.0), (1e-3, 2e-4))).to_json()
    if damage == "zero-rate":
        data["compute"]["bandwidth"] = 0
    elif damage == "negative-alpha":
        data["axes"][0]["link"]["alpha"] = -1.0
    elif damage == "wrong-shape":
        data["shape"] = [8]
    elif damage == "bool":
        data["axes"][1]["size"] = True
    elif damage == "one-matmul":
        data["matmul"] = data["matmul"][:1]
    elif damage == "negative-in-program":
        data["axes"][1]["in_program"]["seconds"] = -1e-4
    elif damage == "no-in-program":
        del data["axes"][0]["in_program"]
    elif damage == "format-2":  # a cache from before the in-program term: measured again, never half-read
        data["format"] = 2
        for a in data["axes"]:
            del a["in_program"]
    elif damage == "format-3":  # a cache from before the conv curve
        data["format"] = 3
        del data["products"]
    elif damage == "one-conv":
        data["products"] = data["products"][:1]
    elif damage == "negative-kind-link":
        data["axes"][0]["kind_links"]["all-to-all"]["alpha"] = -1e-6
    elif damage == "no-kind-links":
        del data["axes"][1]["kind_links"]
    elif damage == "format-5":  # a cache from before the fresh-bytes rate
        data["format"] = 5
        del data["fresh"]
    elif damage == "negative-fresh":
        data["fresh"][0][1] = -1e-10
    elif damage == "format-7":  # a cache from before the rate by size: one rate, at one size
        data["format"] = 7
        data["fresh_rate"] = 5e-10
        del data["fresh"]
    elif damage == "one-fresh-total":
        data["fresh"] = data["fresh"][:1]
    elif damage == "descending-fresh":
        data["fresh"] = data["fresh"][::-1]
    elif damage == "format-6":  # a cache from before the products by shape: a conv curve of (flops, seconds)
        data["format"] = 6
        del data["products"]
        data["conv"] = [[1e6, 4e-4], [1e7, 2e-3]]
    elif damage == "conv-without-shapes":
        del data["products"][0]["shapes"]
    elif damage == "negative-conv":
        data["products"][2]["seconds"] = -1e-3
    elif damage == "product-of-no-kind":  # a 2-D matmul is on the matmul curve, not fitted
        data["products"][-1]["shapes"] = [[16, 16], [16, 16]]
    elif damage == "no-drift":
        del data["drift"]
    elif damage == "descending-drift":
        data["drift"] = [[1e-3, 2e-4], [1e-5, 0.0]]
    elif damage == "negative-drift":
        data["drift"][1][1] = -1e-4
    path.write_text(damage if damage in ("not json {", "[]", "null") else json.dumps(data))
    with pytest.raises(MeshCalibrationError, match="damaged"):
        read_mesh_calibration(path, "m1", "cpu-test", (2, 4))


def test_small_products_are_priced_at_the_smallest_probes_rate() -> None:
    """Below the smallest timed matmul (1e7 flops in 1e-3 s) a product scales with its flops: a
    flat floor priced a 1 MFLOP and a 10 kFLOP product alike (moe's plans all within 15%)."""
    model = calibrated_model(_calibration())
    launch = 1e-6
    # (10, 50) @ (50, 1000): 1e6 flops -> a tenth of the smallest probe's time
    assert model.compute.op_cost("matmul", {"act": 0}, [(10, 50), (50, 1000)]) == pytest.approx(1e-4 + launch)
    small = model.compute.op_cost("matmul", {"act": 0}, [(10, 50), (50, 10)])  # 1e4 flops
    assert small == pytest.approx(1e-6 + launch)
    # at and above the smallest probe the measured curve as before
    assert model.compute.op_cost("matmul", {"act": 0}, [(10, 500), (500, 1000)]) == pytest.approx(1e-3 + launch)


# seconds per input, output, patch and weight byte and per flop: a conv fit with one rate at zero
RATES = (2e-9, 5e-9, 1e-9, 6e-9, 0.0)
CONV_SHAPES = ((4, 8, 8, 8, 1), (4, 8, 64, 16, 1), (4, 64, 8, 8, 2), (4, 64, 64, 16, 2), (16, 8, 8, 16, 1),
               (16, 8, 64, 8, 2), (16, 64, 8, 16, 2), (16, 64, 64, 8, 1))


def _timed(op: str, shapes: tuple[tuple[int, ...], ...], attrs: tuple[tuple[str, int], ...],
           rates: tuple[float, ...]) -> TimedProduct:
    """A product timed exactly as `rates` price it."""
    kind = next(k for k in PRODUCT_KINDS.values() if k.covers(op, shapes))
    return TimedProduct(op, shapes, attrs, sum(r * t for r, t in zip(rates, kind.terms(shapes, dict(attrs), 4))))


def _conv_samples(rates: tuple[float, ...]) -> tuple[TimedProduct, ...]:
    return tuple(_timed("conv2d", ((b, c_in, hw, hw), (c_out, c_in, 3, 3)),
                        (("stride_h", s), ("stride_w", s), ("pad", 0), ("act", 0)), rates)
                 for b, c_in, c_out, hw, s in CONV_SHAPES)


def test_a_product_fit_finds_the_rates_that_timed_its_products_and_none_is_negative() -> None:
    """Convs timed by known rates give back those rates (the zero one included); convs timed by
    rates with a negative one (nothing can run faster for moving more) get a fit with every rate
    non-negative that is at least as close as any with one rate fewer."""
    assert ProductFit.fit("conv", _conv_samples(RATES)).rates == pytest.approx(RATES, rel=1e-6, abs=1e-15)
    bent = _conv_samples((2e-9, 5e-9, -0.5e-9, 6e-9, 1e-12))
    fit = ProductFit.fit("conv", bent)
    n = len(PRODUCT_KINDS["conv"].term_names)
    assert len(fit.rates) == n and all(r >= 0 for r in fit.rates) and any(r > 0 for r in fit.rates)
    terms = [PRODUCT_KINDS["conv"].terms(s.shapes, dict(s.attrs), 4) for s in bent]

    def error(rates: tuple[float, ...]) -> float:
        return sum((sum(r * t for r, t in zip(rates, ts)) / s.seconds - 1) ** 2 for ts, s in zip(terms, bent))
    for dropped in range(n):  # the fit is the best non-negative one: no worse than one on fewer terms
        keep = [i for i in range(n) if i != dropped]
        design = np.array([[ts[i] / s.seconds for i in keep] for ts, s in zip(terms, bent)])
        coef, *_ = np.linalg.lstsq(design, np.ones(len(bent)), rcond=None)
        if np.all(coef >= 0):
            rates = [0.0] * n
            for i, c in zip(keep, coef):
                rates[i] = float(c)
            assert error(fit.rates) <= error(tuple(rates)) + 1e-12
    with pytest.raises(ValueError, match="or more timed conv"):
        ProductFit.fit("conv", _conv_samples(RATES)[:4])
    matmuls = tuple(TimedProduct("matmul", ((4, 16, 16), (4, 16, 16)), (("act", 0),), 1e-4) for _ in range(8))
    with pytest.raises(ValueError, match="or more timed conv"):  # a matmul is not a conv
        ProductFit.fit("conv", (*_conv_samples(RATES), *matmuls))


def test_convs_are_priced_by_the_buffers_they_move() -> None:
    """A conv2d costs a third of its fitted forward and backward (the step prices 1 + 2 forwards):
    two convs of the same flops, one with 16 output channels over four times the pixels, one with 64
    over a quarter, are priced apart by their bytes, as XLA's CPU convs run them; a calibration without
    timed products prices convs as matmuls, and conv samples leave 2-D matmuls alone."""
    launch = 1e-6
    compute = calibrated_model(_calibration()).compute
    same = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    narrow = ((4, 32, 16, 16), (16, 32, 3, 3))
    wide = ((4, 32, 8, 8), (64, 32, 3, 3))
    conv = PRODUCT_KINDS["conv"]
    assert compute.op_cost("conv2d", same, narrow) == pytest.approx(
        sum(r * t for r, t in zip(RATES, conv.terms(narrow, same, 4))) / 3 + launch)
    assert conv.terms(narrow, same, 4)[4] == conv.terms(wide, same, 4)[4]  # the same flops
    assert compute.op_cost("conv2d", same, narrow) > 1.2 * compute.op_cost("conv2d", same, wide)
    small = [(1, 10, 10, 10), (50, 10, 3, 3)]  # 9e5 flops: below the smallest matmul probe, at its rate
    assert calibrated_model(_calibration(products=())).compute.op_cost("conv2d", same, small) == pytest.approx(1e-3 * 0.09 + launch)
    mm = [(10, 500), (500, 1000)]
    assert compute.op_cost("matmul", {"act": 0}, mm) == pytest.approx(
        calibrated_model(_calibration(products=())).compute.op_cost("matmul", {"act": 0}, mm))


def test_all_to_all_runs_on_its_own_link() -> None:
    """A calibrated all-to-all is priced on the link fitted to all-to-alls on its axis (alone or over
    several axes: the slowest of theirs); the other kinds keep the axis's link."""
    cal = _calibration(all_to_all=(20e-6, 3e8))
    assert MeshCalibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    mesh, plain = calibrated_model(cal).mesh, calibrated_model(_calibration()).mesh
    assert mesh.axes[1].link("all-to-all") == (20e-6, 3e8) and mesh.axes[1].link("all-gather") == plain.axes[1].link("all-gather")
    assert mesh.collective_seconds("all-to-all", 1, 1e6) == pytest.approx(3 * 20e-6 + 0.75e6 / 3e8)
    assert mesh.collective_seconds("all-gather", 1, 1e6) == pytest.approx(plain.collective_seconds("all-gather", 1, 1e6))
    assert mesh.collective_seconds("all-to-all", 1, 1e6) > 2 * plain.collective_seconds("all-to-all", 1, 1e6)
    assert mesh.collective_seconds_over("all-to-all", (0, 1), 1e6) == pytest.approx(7 * 20e-6 + 7 / 8 * 1e6 / 3e8)


def test_the_fresh_rate_is_the_median_of_its_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    """One slow timing of the fresh-bytes probe (a load spike) does not set the rate: it is the
    median of `FRESH_REPEATS` timings."""
    from jax_backend import parallel_calibrate as pc

    timings = iter([2e-3, 1e-3, 9e-3])
    monkeypatch.setattr(pc, "_mesh_program", lambda *a, **k: (lambda: None))
    monkeypatch.setattr(pc, "_extra_seconds", lambda *a, **k: next(timings))
    assert pc.FRESH_REPEATS == 3
    total = 64 * 2**20
    assert pc._fresh_rate(None, 1.0, total) == pytest.approx(2e-3 / total)


def test_a_marginal_is_timed_on_a_chain_long_enough_to_see() -> None:
    """An operation far below a millisecond is timed on a longer chain (its extra operations last
    about `MIN_EXTRA_S`), and one more of it costs what it does."""
    import time

    from jax_backend import parallel_calibrate as pc

    built: list[int] = []

    def build(k: int) -> object:
        built.append(k)
        return lambda: time.sleep(k * 2e-4)

    seconds = pc._marginal(build, 0.2)
    assert max(built) - 1 >= pc.MIN_EXTRA_S / 2e-4 - 1 and max(built) - 1 <= pc.MAX_EXTRA
    assert seconds == pytest.approx(2e-4, rel=0.3)


def test_in_program_sync_prices_each_collective_on_its_axis() -> None:
    """The measured in-program cost of a collective beyond alpha-beta (`sync_s`) is added once per
    collective, on its own axis: a plan with more collectives is priced higher by exactly that."""
    from eqsat.models import build_parallel_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.planner import plan_report

    cal = _calibration(in_program=(400e-6, 300e-6))
    a0, a1 = cal.axes
    link1 = tm.collective_seconds("all-reduce", 4, 64.0, a1.link.alpha, a1.link.beta, "ring")
    assert a1.sync_s == pytest.approx(300e-6 - link1) and a0.sync_s > a1.sync_s > 0
    assert _calibration(in_program=(1e-9, 1e-9)).axes[0].sync_s == 0.0  # never negative
    with_sync, without = calibrated_model(cal, overlap=False), calibrated_model(cal, overlap=False, sync=False)
    assert with_sync.mesh.collective_seconds("all-gather", 1, 1e6) == pytest.approx(
        without.mesh.collective_seconds("all-gather", 1, 1e6) + a1.sync_s)
    assert with_sync.mesh.collective_seconds("all-gather", 1, 0.0) == 0.0  # no collective, no rendezvous
    # a gradient sync over both axes is one all-reduce: one (the larger) sync, not two
    assert with_sync.mesh.collective_seconds_over("all-reduce", (0, 1), 1e6) == pytest.approx(
        without.mesh.collective_seconds_over("all-reduce", (0, 1), 1e6) + a0.sync_s)
    graph = build_parallel_model("mlp16")
    plan = megatron_by_hand("mlp16", graph, with_sync.mesh)
    priced, plain = plan_report(plan, with_sync), plan_report(plan, without)
    assert priced.collectives and priced.compute_s == pytest.approx(plain.compute_s)
    extra = sum((a0, a1)[c.axis].sync_s for _, c in plain.collectives if c.bytes > 0)
    assert extra > 0 and priced.step_s - plain.step_s == pytest.approx(extra)
    # and the cache keeps the measurement
    assert MeshCalibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


def test_a_collective_waits_longer_after_a_longer_piece_of_compute() -> None:
    """The drift curve: no wait after no compute, the measured waits at the measured pieces, log
    interpolation between them, the last wait past the last piece; a bad curve is refused."""
    drift = tm.DriftCurve((1e-5, 1e-3, 1e-2), (0.0, 2e-4, 4e-4))
    assert drift.wait(0.0) == 0.0 and drift.wait(1e-3) == pytest.approx(2e-4) and drift.wait(1.0) == pytest.approx(4e-4)
    assert drift.wait(math.sqrt(1e-3 * 1e-2)) == pytest.approx(3e-4)  # halfway on the log scale
    with pytest.raises(tm.TimeModelError):
        tm.DriftCurve((1e-3, 1e-5), (0.0, 1e-4))
    with pytest.raises(tm.TimeModelError):
        tm.DriftCurve((1e-5, 1e-3), (0.0, -1e-4))


def test_each_collective_waits_for_the_compute_since_the_one_before_it() -> None:
    """The forward runs the nodes in order, the backward in reverse: a collective's piece is the
    compute since the collective before it in that order, so two collectives back to back wait
    once for the compute and once for none."""
    drift = tm.DriftCurve((1e-6, 1.0), (0.0, 1.0))  # wait = log(piece / 1 us) / log(1e6)

    def w(piece: float) -> float:
        return drift.wait(piece)
    nodes = [(1e-3, 2e-3, []), (1e-3, 2e-3, ["forward", "forward"]), (4e-3, 8e-3, ["backward"]), (1e-3, 2e-3, ["grad-sync"])]
    # forward: 2 ms then a collective, then one after nothing; the forward's last 5 ms and the
    # backward's first 2 ms before the grad-sync, 8 ms before the backward collective; the rest waits
    # for no collective
    expected = w(2e-3) + w(0.0) + w(7e-3) + w(8e-3)
    assert tm.scheduled_waits(nodes, drift) == pytest.approx(expected)
    assert tm.scheduled_waits([(1e-3, 1e-3, [])], drift) == 0.0


def test_a_plans_report_prices_the_drift_on_its_order_of_nodes() -> None:
    """A calibrated model with a drift curve adds each collective's wait to the plan's step (not to
    its communication), tied to `sync`; a plan with no collectives waits for nothing; the cache keeps
    the curve, and a damaged one is refused."""
    from eqsat.models import build_parallel_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.planner import plan_report

    cal = _calibration(drift=((1e-5, 0.0), (1e-3, 3e-4), (1e-2, 6e-4)))
    model, plain = calibrated_model(cal, overlap=False), calibrated_model(_calibration(), overlap=False)
    assert model.drift == cal.drift_curve() and calibrated_model(cal, sync=False).drift is None
    graph = build_parallel_model("mlp16")
    plan = megatron_by_hand("mlp16", graph, model.mesh)
    priced, before = plan_report(plan, model), plan_report(plan, plain)
    assert priced.collectives and priced.wait_s > 0 and priced.comm_s == pytest.approx(before.comm_s)
    assert priced.step_s == pytest.approx(before.step_s + priced.wait_s)
    assert priced.wait_s <= len(priced.collectives) * 6e-4
    assert plan_report(graph, model).wait_s == 0.0  # unsplit: no collectives
    assert MeshCalibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


def _node(op: str, attrs: dict[str, int], shape: tuple[int, ...], in_axes: tuple[int, ...], out_axes: tuple[int, ...],
          grad: bool = True, leaf: str | None = None) -> object:
    from eqsat.context import NodeInContext, ValueContext

    return NodeInContext(op, attrs, (shape,), (ValueContext(in_axes, leaf, False, grad),), ValueContext(out_axes, None, False, grad))


def test_layout_copies_are_priced_per_op_at_the_copy_rate() -> None:
    """A gather along a per-device dimension that is not the major one is a transposing copy of the
    gathered buffer forward and of its gradient backward, priced at the calibrated copy rate; along
    the major dimension none; an all-to-all always; the backward of a `partition` fills a zero
    buffer of its input (an elementwise pass); `copies=False` prices none, and no copy moves the
    plan's bytes or memory."""
    model, plain = calibrated_model(_calibration(), overlap=False), calibrated_model(_calibration(), overlap=False, copies=False)
    minor = _node("combine", {"axis": 1, "dim": -1}, (4, 128, 16), (1,), ())  # gathers (128, 64) along dim -1
    major = _node("combine", {"axis": 1, "dim": -2}, (4, 32, 64), (1,), ())
    gathered = 128 * 64 * 4
    c = model.node_cost(minor)
    assert c.copy_bytes == pytest.approx(2 * gathered) and c.copy_s == pytest.approx(2 * gathered / 1e9)
    assert model.node_cost(major).copy_bytes == 0.0 and plain.node_cost(minor).copy_s == 0.0
    assert c.seconds - plain.node_cost(minor).seconds == pytest.approx(c.copy_s)
    assert model.node_cost(_node("combine", {"axis": 1, "dim": -1}, (4, 128, 16), (1,), (), grad=False)).copy_bytes == gathered
    # a leading dimension of one element is still the major one
    assert model.node_cost(_node("combine", {"axis": 1, "dim": -2}, (4, 1, 32, 64), (1,), ())).copy_bytes == 0.0
    a2a = model.node_cost(_node("all_to_all", {"axis": 1, "split_dim": -2, "concat_dim": -1}, (4, 128, 16), (1,), (1,)))
    assert a2a.copy_bytes == pytest.approx(2.5 * 128 * 16 * 4)
    part = model.node_cost(_node("partition", {"axis": 1, "dim": -1, "parts": 4}, (128, 64), (), (1,)))
    fill = model.compute.op_cost("relu", {}, [(128 * 64,)])
    assert part.copy_bytes == gathered and part.copy_s == pytest.approx(fill)
    # data has no gradient, so no zero-padded one
    assert model.node_cost(_node("partition", {"axis": 1, "dim": -1, "parts": 4}, (128, 64), (), (1,), grad=False)).copy_bytes == 0
    assert [x.bytes for x in c.collectives] == [x.bytes for x in plain.node_cost(minor).collectives]
    assert (c.mem_bytes, c.mem_bound_bytes) == (plain.node_cost(minor).mem_bytes, plain.node_cost(minor).mem_bound_bytes)
    # a preset has no measured rate: a copy streams at its device's bandwidth (assumed)
    from eqsat.parallel.cost import parallel_model

    nominal = parallel_model("cpu-nominal", "2x4")
    assert nominal.copy_rate is None
    assert nominal.node_cost(minor).copy_s == pytest.approx(nominal.compute.op_cost("relu", {}, [(2 * 128 * 64,)]))


def test_an_all_to_alls_copies_are_in_its_own_measured_link() -> None:
    """`eqsat parallel calibrate` times an all-to-all as XLA compiles it, its chunk copies in and out
    included, and fits a link of its own to that: on such an axis the copies cost nothing more (their
    bytes are still reported); on an axis without one they are priced at the copy rate."""
    own = calibrated_model(_calibration(all_to_all=(20e-6, 3e8)), overlap=False)
    ring = calibrated_model(_calibration(), overlap=False)
    node = _node("all_to_all", {"axis": 1, "split_dim": -2, "concat_dim": -1}, (4, 128, 16), (1,), (1,))
    mine, other = own.node_cost(node), ring.node_cost(node)
    assert mine.copy_bytes == other.copy_bytes == pytest.approx(2.5 * 128 * 16 * 4)
    assert mine.copy_s == 0.0 and other.copy_s == pytest.approx(other.copy_bytes / 1e9)
    # a gather's transposing copies are not part of any collective's link
    minor = _node("combine", {"axis": 1, "dim": -1}, (4, 128, 16), (1,), ())
    assert ring.node_cost(minor).copy_s > 0
    assert own.node_cost(minor).copy_s == pytest.approx(ring.node_cost(minor).copy_s)


def test_a_plans_report_prices_its_copies_and_keeps_its_bytes() -> None:
    """`plan_report` adds each node's copies to the step (as compute: the cores copy) and reports
    their bytes; the predicted collective bytes and memory do not move."""
    from eqsat.models import build_parallel_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.planner import plan_report

    cal = _calibration()
    model, plain = calibrated_model(cal, overlap=False), calibrated_model(cal, overlap=False, copies=False)
    graph = build_parallel_model("mlp16")
    plan = megatron_by_hand("mlp16", graph, model.mesh)
    priced, base = plan_report(plan, model), plan_report(plan, plain)
    assert base.copy_bytes == 0.0 and priced.step_s - base.step_s == pytest.approx(priced.copy_s)
    assert priced.compute_s - base.compute_s == pytest.approx(priced.copy_s)
    assert (priced.comm_bytes(None), priced.mem_bytes, priced.mem_row_bytes) == (base.comm_bytes(None), base.mem_bytes,
                                                                                  base.mem_row_bytes)
    assert priced.to_json(plan.live())["predicted_copy_bytes"] == priced.copy_bytes


def test_the_buffers_a_step_allocates_are_priced_at_the_fresh_rate_and_its_arguments_are_not() -> None:
    """Each node's buffers (forward output, residuals, cotangents) cost the calibrated fresh rate per
    byte, in the ILP's seconds and in the plan's report (as compute: the cores write them); the
    step's arguments (weights, data) are not allocated by it; nothing else moves."""
    from eqsat.models import build_parallel_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.planner import plan_report

    rate = 5e-10
    model = calibrated_model(_calibration(fresh=((1e6, rate), (1e9, rate))), overlap=False)
    plain = calibrated_model(_calibration(), overlap=False)
    from eqsat.context import NodeInContext, ValueContext

    x, w = ValueContext((), "input", False, False), ValueContext((), "weight", False, True)
    product = NodeInContext("matmul", {"act": 0}, ((64, 128), (128, 256)), (x, w), ValueContext((), None, False, True))
    c, base = model.node_cost(product), plain.node_cost(product)
    # its output and the weight's gradient, not its arguments x and w
    assert c.fresh_bytes == pytest.approx(4 * (64 * 256 + 128 * 256))
    assert c.mem_bound_bytes == pytest.approx(c.fresh_bytes + 4 * (64 * 128 + 128 * 256))
    assert c.seconds - base.seconds == pytest.approx(c.fresh_bytes * rate) and base.fresh_s == 0.0
    graph = build_parallel_model("mlp16")
    plan = megatron_by_hand("mlp16", graph, model.mesh)
    priced, unpriced = plan_report(plan, model), plan_report(plan, plain)
    assert priced.fresh_bytes > 0 and priced.fresh_s == pytest.approx(priced.fresh_bytes * rate)
    assert priced.step_s - unpriced.step_s == pytest.approx(priced.fresh_s)
    assert (priced.comm_bytes(None), priced.mem_bytes, priced.mem_bound_bytes) == (
        unpriced.comm_bytes(None), unpriced.mem_bytes, unpriced.mem_bound_bytes)


def test_the_fresh_rate_jumps_once_and_is_flat_on_either_side() -> None:
    """The curve splits its points at their largest rise: each side is priced at its median (so the
    probe's noise on a plateau is no slope), the cut lies halfway on a log scale between the two
    points around the rise; a curve that never rises is one level."""
    mib = 2**20
    curve = tm.FreshCurve(tuple(m * mib for m in (4.0, 16.0, 32.0, 64.0, 128.0)), (0.55e-9, 0.50e-9, 0.66e-9, 1.6e-9, 1.7e-9))
    assert curve.cut == pytest.approx(math.sqrt(32 * 64) * mib)
    assert curve.below == pytest.approx(0.55e-9)
    for allocated, rate in ((1.0, 0.55e-9), (10 * mib, 0.55e-9), (40 * mib, 0.55e-9), (46 * mib, 1.65e-9),
                            (1e12, 1.65e-9)):
        assert curve.rate(allocated) == pytest.approx(rate)
    flat = tm.FreshCurve((4.0 * mib, 64.0 * mib), (0.6e-9, 0.5e-9))
    assert flat.cut == math.inf and flat.rate(1e12) == flat.below == pytest.approx(0.55e-9)
    for totals, rates in (((4.0,), (1e-9,)), ((4.0, 4.0), (1e-9, 1e-9)), ((0.0, 4.0), (1e-9, 1e-9)),
                          ((1.0, 4.0), (1e-9, -1e-9))):
        with pytest.raises(tm.TimeModelError):
            tm.FreshCurve(totals, rates)


def test_a_step_pays_the_fresh_rate_of_what_it_allocates_in_all() -> None:
    """A plan's report prices all the buffers its step allocates at the curve's rate for their
    total; the ILP's node-local price, which cannot know the total, is the lower level."""
    from eqsat.models import build_parallel_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.planner import plan_report

    low, high = 5e-10, 2e-9
    graph = build_parallel_model("mlp16")
    flat = calibrated_model(_calibration(fresh=((1.0, low), (1e12, low))), overlap=False)
    plan = megatron_by_hand("mlp16", graph, flat.mesh)
    allocated = plan_report(plan, flat).fresh_bytes
    assert allocated > 0
    for cut_below_it, rate in ((True, high), (False, low)):
        total = allocated / 4 if cut_below_it else allocated * 4  # the rise sits around it, then above it
        model = calibrated_model(_calibration(fresh=((total / 2, low), (total * 2, high))), overlap=False)
        report = plan_report(plan, model)
        assert report.fresh_bytes == pytest.approx(allocated)
        assert report.fresh_s == pytest.approx(allocated * rate)
        assert report.step_s - plan_report(plan, flat).step_s == pytest.approx(allocated * (rate - low))
        assert model.fresh_rate == pytest.approx(low)  # the ILP's price


def test_foreign_cache_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    write_mesh_calibration(path, _calibration(machine="elsewhere"))
    with pytest.raises(MeshCalibrationError, match="another machine"):
        read_mesh_calibration(path, "m1", "cpu-test", (2, 4))
    write_mesh_calibration(path, _calibration())
    with pytest.raises(MeshCalibrationError, match="another machine, device or mesh"):
        read_mesh_calibration(path, "m1", "cpu-test", (4, 2))


def test_damaged_cache_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged cache is re-measured (one warning line) and replaced by a valid one; the next load reads it."""
    from eqsat.cost import _machine_key
    from jax_backend import parallel_calibrate as pc
    from jax_backend.measured_cost import device_key

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    measured: list[int] = []

    def fake(mesh: Mesh, budget_s: float = 1.0, say: object = None) -> MeshCalibration:
        measured.append(1)
        return MeshCalibration(_machine_key(), device_key(), mesh.shape, _calibration().axes, _calibration().compute, 0.1,
                               _calibration().matmul)

    monkeypatch.setattr(pc, "calibrate_mesh", fake)
    path = pc.calibration_file(device_key(), (2, 4))
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "machine": ')
    cal, status = pc.load_mesh_calibration("2x4")
    assert status.startswith("re-measured") and measured == [1]
    assert "damaged" in capsys.readouterr().err
    assert pc.load_mesh_calibration("2x4") == (cal, "cached") and measured == [1]
    model = pc.parallel_calibrated(mesh="2x4")
    assert model.name == "parallel-calibrated" and model.overlap


def test_calibrated_model_needs_a_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat.cost import cost_model

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    import jax_backend  # noqa: F401 - registers the model

    with pytest.raises(MeshCalibrationError, match="eqsat parallel calibrate --mesh 2x4"):
        cost_model("parallel-calibrated", "cpu", mesh="2x4")


def test_report_gives_wire_bytes_beside_buffer_sizes() -> None:
    from eqsat.models import build_parallel_model
    from eqsat.parallel.cost import ParallelCostModel
    from eqsat.cost import cost_model
    from eqsat.models.parallel_hand import megatron_by_hand
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_report

    mesh = parse_mesh("2x4")
    graph = build_parallel_model("mlp16")
    plan = megatron_by_hand("mlp16", graph, mesh)
    report = plan_report(plan, ParallelCostModel(mesh, cost_model("roofline", mesh.device)))
    assert report.collectives
    for _, c in report.collectives:
        assert c.wire_bytes == pytest.approx(tm.wire_factor(c.kind, mesh.shape[c.axis]) * c.bytes)
    js = report.to_json(plan.live())
    assert js["predicted_step_wire_bytes"] == pytest.approx(sum(c["wire_bytes"] for c in js["collectives"]))
    overlapped = plan_report(plan, ParallelCostModel(mesh, cost_model("roofline", mesh.device), overlap=True))
    assert max(report.compute_s, report.comm_s) - 1e-15 <= overlapped.step_s <= report.step_s + 1e-15


@pytest.mark.parametrize("argv, says", [
    (["parallel", "calibrate", "--mesh", "3x3"], "needs 9 devices"),
    (["parallel", "calibrate", "--mesh", "h100x8"], "on-paper preset"),
    (["parallel", "calibrate", "--graph", "g.json"], "takes no --graph"),
    (["parallel", "mlp16", "--force", "--no-measure"], "--force belongs"),
    (["parallel", "calibrate", "--mesh", "2xq"], "neither a preset"),
])
def test_cli_bad_input_is_one_line_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_spearman_ranks_with_ties() -> None:
    from experiments.bench_parallel import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # scipy.stats.spearmanr
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def _fake_measuring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    from eqsat.cost import _machine_key
    from jax_backend import parallel_calibrate as pc
    from jax_backend.measured_cost import device_key

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    measured: list[int] = []

    def fake(mesh: Mesh, budget_s: float = 1.0, say: object = None) -> MeshCalibration:
        measured.append(1)
        base = _calibration()
        return MeshCalibration(_machine_key(), device_key(), mesh.shape, base.axes[-len(mesh.shape):], base.compute,
                               0.1, base.matmul)

    monkeypatch.setattr(pc, "calibrate_mesh", fake)
    return measured


def test_cli_calibrate_reports_links_per_axis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    measured = _fake_measuring(monkeypatch, tmp_path)
    assert cli.main(["parallel", "calibrate", "--mesh", "2x4", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["status"] == "measured" and row["mesh"] == "2x4"
    assert row["a0_alpha_us"] == pytest.approx(30.0) and row["a1_beta_gbs"] == pytest.approx(2.0)
    assert cli.main(["parallel", "calibrate", "--mesh", "2x4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cached" and measured == [1]
    assert cli.main(["parallel", "calibrate", "--mesh", "2x4", "--force", "--json"]) == 0
    assert measured == [1, 1]


@pytest.mark.slow
def test_calibrated_planning_prices_with_the_measured_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _fake_measuring(monkeypatch, tmp_path)
    assert cli.main(["parallel", "unity-mlp", "--mesh", "2x4", "--calibrated", "--no-measure", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["mesh"] == "2x4" and row["collectives"]
    for c in row["collectives"]:  # ring latency, the fitted link of the collective's own axis
        n, alpha, beta = ((2, 30e-6, 1e9), (4, 10e-6, 2e9))[c["axis"]]
        assert c["seconds"] == pytest.approx(tm.collective_seconds(c["kind"], n, c["bytes"], alpha, beta, "ring"))


@pytest.mark.slow
def test_spearman_case_runs_plans_on_the_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the devices: a real (short) calibration, random plans timed, a rank correlation."""
    from experiments.bench_parallel import spearman_case

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    row = spearman_case("unity-mlp", "2", plans=3, budget_s=1.0)
    assert row["plans"] + row["plans_not_lowered"] >= 2
    assert all(m > 0 for m in row["measured_ms"] if math.isfinite(m))
    assert -1.0 <= row["spearman_calibrated"] <= 1.0 or math.isnan(row["spearman_calibrated"])
    assert -1.0 <= row["spearman_measured_halves"] <= 1.0 or math.isnan(row["spearman_measured_halves"])
    ran = [i for i, m in enumerate(row["measured_ms"]) if math.isfinite(m)]
    # what each compiled step runs: collectives exactly where the plan has some
    assert all((row["compiled_rendezvous"][i] > 0) == (row["collectives"][i] > 0) for i in ran)
    assert all(row["compiled_copy_bytes"][i] >= 0 for i in ran)
    # the plans are kept (Graph JSON) and price again as the run priced them (`experiments/spearman_reprice.py`)
    from eqsat.ir import Graph
    from eqsat.parallel.calibration import calibrated_model
    from eqsat.parallel.mesh import parse_mesh
    from eqsat.parallel.planner import plan_report
    from jax_backend.parallel_calibrate import load_mesh_calibration

    model = calibrated_model(load_mesh_calibration(parse_mesh("2"))[0], overlap=False)
    again = [plan_report(Graph.from_json(g), model).step_s * 1e3 for g in row["plan_graphs"]]
    assert again == pytest.approx(row["predicted_calibrated_ms"])


def test_step_times_are_against_each_rounds_level_with_an_interval() -> None:
    """A plan's time is taken against its round's level (a load that doubles a whole round cancels);
    the precision stop waits until every plan's 95% interval is narrow, and never before its time."""
    import time

    from jax_backend.parallel_calibrate import StepTiming, _narrow, _relative_times, step_timing

    rng = np.random.default_rng(0)
    load = np.where(np.arange(30) % 3 == 0, 2.0, 1.0)  # every third round on a busier machine
    base = np.array([1.0, 2.0, 4.0])
    times = [list(b * 3 * load * rng.uniform(0.995, 1.005, 30)) for b in base]  # 3 calls a sample
    relative, level = _relative_times(times, [3, 3, 3])
    assert relative.shape == (3, 30) and level == pytest.approx(2.0, rel=0.02)
    assert np.median(relative, axis=1) * level == pytest.approx(base, rel=0.02)
    assert _narrow([3, 3, 3], 0.05, after=0.0)(times)
    noisy = [list(b * rng.lognormal(0.0, 0.5, 30)) for b in base]
    assert not _narrow([1, 1, 1], 0.05, after=0.0)(noisy)
    assert not _narrow([3, 3, 3], 0.05, after=time.perf_counter() + 60)(times)  # the budget runs first
    assert StepTiming(2.0, 1.9, 2.1, 30).rel_width == pytest.approx(0.1)
    # odd and even rounds are two measurements of the same plans in one run (`spearman_measured_halves`)
    timed = [step_timing(r, level) for r in relative]
    assert [t.halves == pytest.approx((t.seconds, t.seconds), rel=0.02) for t in timed] == [True] * 3
    drifting = np.concatenate([np.full(15, 1.0), np.full(15, 1.2)]).reshape(2, 15).T.ravel()  # odd 1.0, even 1.2
    assert step_timing(drifting, 2.0).halves == pytest.approx((2.0, 2.4))
    assert all(math.isnan(h) for h in step_timing(np.array([1.0]), 2.0).halves)

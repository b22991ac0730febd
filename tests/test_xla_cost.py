"""The xla cost model's JAX-free half (eqsat/xla_cost.py): the calibration file, fusion pricing in
context, and the conventions and named rule sets it is compared under."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eqsat import ops
from eqsat.cost import CONVENTIONS, UnknownConventionsError, conventions, cost_model, graph_cost
from eqsat.egraph import TensorEGraph
from eqsat.ir import Graph, GraphBuilder
from eqsat.rulesets import RULE_SETS, UnknownRuleSetError, named_rules
from eqsat.cost import predicted_speedup
from eqsat.xla_cost import (CALIBRATION_FORMAT, GEMV_K, Calibration, CalibrationError, Curve, Surface, XlaModel, fit_chain, fit_taps,
                            fusion_context,
                            graph_enodes, read_calibration, write_calibration)

CAL = Calibration("machine-a", "cpu-test", launch_s=5e-6, bandwidth=10e9, loop_flops=5e9,
                  matmul=Curve((1e3, 1e6, 1e9), (1e-5, 5e-5, 2e-2)), conv=Curve((1e3, 1e9), (2e-5, 3e-2)))


NO_TRANSPOSES: dict[str, Any] = {"copy_s": 1e-18, "transpose_bandwidth": 1e30, "transpose_2d": None, "transpose_kxk": None}
"""A calibration whose layout transposes cost nothing: an NCHW conv priced as its NHWC form alone."""


def _chain(fused_act: bool = False, tail: int = 3) -> Graph:
    """x @ w followed by an elementwise chain of `tail` ops (relu first, or fused into the matmul)."""
    b = GraphBuilder()
    x, w, c = b.input("x", (64, 256)), b.weight("w", (256, 256)), b.input("c", (64, 256))
    y = b.matmul(x, w, act=2) if fused_act else b.relu(b.matmul(x, w))
    for op in ("tanh", "sigmoid", "ewadd")[:tail]:
        y = b.ewadd(y, c) if op == "ewadd" else getattr(b, op)(y)
    return b.build([y])


def test_curve_interpolates_in_log_log_and_extrapolates_at_the_last_rate() -> None:
    curve = Curve((1e3, 1e9), (1e-5, 1e-2))
    assert curve.seconds_for(1e6) == pytest.approx(10 ** -3.5)
    assert curve.seconds_for(10.0) == 1e-5  # a call costs at least the smallest measured one
    assert curve.seconds_for(2e9) == pytest.approx(2e-2)
    fitted = Curve.fit([(1e6, 3e-3), (1e3, 1e-5), (1e9, 1e-3), (1e3, 2e-5)])
    assert fitted.flops == (1e3, 1e6, 1e9) and list(fitted.seconds) == sorted(fitted.seconds)
    with pytest.raises(CalibrationError):
        Curve((1e3,), (1e-5,))


def test_calibration_cache_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "xla" / "cal.json"
    write_calibration(path, CAL)
    assert read_calibration(path, "machine-a", "cpu-test") == CAL


@pytest.mark.parametrize("damage", [
    lambda d: "{not json",
    lambda d: json.dumps({**d, "launch_s": 0}),
    lambda d: json.dumps({**d, "bandwidth": None}),
    lambda d: json.dumps({**d, "matmul": {"flops": [1, 2], "seconds": [1e-3]}}),
    lambda d: json.dumps({**d, "conv": {"flops": [2, 1], "seconds": [1e-3, 1e-3]}}),
    lambda d: json.dumps({**d, "format": "something-else"}),
    lambda d: json.dumps([1, 2]),
    lambda d: json.dumps({k: v for k, v in d.items() if k != "matmul"}),
])
def test_a_damaged_calibration_is_refused(tmp_path: Path, damage: object) -> None:
    path = tmp_path / "cal.json"
    path.write_text(damage(CAL.to_json()))  # type: ignore[operator]
    with pytest.raises(CalibrationError):
        read_calibration(path, "machine-a", "cpu-test")


def test_a_calibration_from_another_machine_or_device_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    write_calibration(path, CAL)
    with pytest.raises(CalibrationError, match="another machine"):
        read_calibration(path, "machine-b", "cpu-test")
    with pytest.raises(CalibrationError, match="another machine"):
        read_calibration(path, "machine-a", "gpu-test")
    with pytest.raises(CalibrationError, match="eqsat calibrate"):
        read_calibration(tmp_path / "missing.json", "machine-a", "cpu-test")


def test_fusion_facts_are_on_the_op_registry() -> None:
    assert ops.op_spec("relu").fusion == "loop" and ops.op_spec("batchnorm").fusion == "loop"
    assert ops.op_spec("matmul").fusion == "library" and ops.op_spec("conv2d").fusion == "library"
    assert ops.op_spec("concat").fusion == "copy" and ops.op_spec("transpose").fusion == "copy"
    assert ops.op_spec("reshape").fusion == "view" and ops.op_spec("weight").fusion == "leaf"
    assert ops.op_spec("poolmax").fusion == "kernel"


def test_an_elementwise_chain_after_a_matmul_costs_one_loop() -> None:
    model = XlaModel(replace(CAL, loop_flops=1e15))  # elementwise bound by memory, as on real devices
    graph = _chain()
    fused = graph_cost(graph, model)
    unfused = sum(model.op_cost(n.op, n.attr, [graph.shape(v) for v in n.inputs]) for n in graph.nodes)
    # four elementwise ops: one loop kernel (relu's) and its write, not four: each joined op saves
    # at least the write and read of its input
    io = 2 * 64 * 256 * 4 / CAL.bandwidth
    assert unfused - fused >= 3 * io - 1e-9  # (less the joined ops' arithmetic)
    # a longer chain adds arithmetic and the extra operand's read, never another kernel
    alone = model.op_cost("ewadd", {}, [(64, 256), (64, 256)])
    added = graph_cost(_chain(tail=3), model) - graph_cost(_chain(tail=2), model)
    assert 0 < added <= alone - io + 1e-9
    # the activation inside the matmul is the head of the same loop: same kernels, same price
    assert graph_cost(_chain(fused_act=True), model) == pytest.approx(fused)


def _concat_of_activated(relu_after: bool, activated: int = 2) -> Graph:
    """Two matmuls of one input joined by a concat: the first `activated` relu'd before the concat,
    or the concat relu'd after it (`relu_after`)."""
    b = GraphBuilder()
    x, w1, w2 = b.input("x", (64, 256)), b.weight("w1", (256, 256)), b.weight("w2", (256, 256))
    parts = [b.matmul(x, w1), b.matmul(x, w2)]
    if relu_after:
        return b.build([b.relu(b.concat(1, *parts))])
    return b.build([b.concat(1, *[b.relu(p) if i < activated else p for i, p in enumerate(parts)])])


def test_a_concat_is_written_by_the_loop_of_its_elementwise_operands_and_consumers() -> None:
    """XLA:CPU fuses relu(a), relu(b) and their concat into one loop (its optimized HLO), and a relu
    after a concat into the concat's loop: the concat moves only the bytes no loop wrote."""
    model = XlaModel(replace(CAL, loop_flops=1e15, launch_s=1e-9))
    dots = 2 * model.op_cost("matmul", {}, [(64, 256), (256, 256)])
    one_loop = 2 * (2 * 64 * 256 * 4) / CAL.bandwidth  # read both products, write the concat
    assert graph_cost(_concat_of_activated(relu_after=False), model) - dots == pytest.approx(one_loop)
    assert graph_cost(_concat_of_activated(relu_after=True), model) - dots == pytest.approx(one_loop, rel=1e-4)  # + arithmetic
    # one operand that no loop wrote is copied by the concat: its read and write on top
    half = graph_cost(_concat_of_activated(relu_after=False, activated=1), model) - dots
    assert half == pytest.approx(one_loop / 2 + 2 * 64 * 256 * 4 / CAL.bandwidth)
    assert ops.op_spec("concat").joins_loops and not ops.op_spec("transpose").joins_loops


def test_the_egraph_prices_a_graph_as_graph_cost_does() -> None:
    from eqsat.pipeline import Priced, Objective

    model = XlaModel(CAL)
    graph = _chain()
    priced = Priced.of(TensorEGraph.from_graph(graph), Objective(model, context=model.context_analysis))
    assert sum(float(c) for c in priced.data.cost) == pytest.approx(graph_cost(graph, model))


def test_a_class_is_fused_only_when_every_node_of_it_ends_in_a_loop() -> None:
    from eqsat.context import ENode, ENodes
    from eqsat.xla_cost import fusion_context

    shapes = {c: (4, 4) for c in ("x", "w", "mm", "r", "y")}
    nodes = {"x": ENode("input", {"name": "x", "shape": [4, 4]}, "x", ()),
             "w": ENode("weight", {"name": "w", "shape": [4, 4]}, "w", ()),
             "mm": ENode("matmul", {"act": 0}, "mm", ("x", "w")),
             "r1": ENode("relu", {}, "r", ("mm",)), "r2": ENode("matmul", {"act": 2}, "r", ("x", "w")),
             "y1": ENode("tanh", {}, "y", ("r",)), "y2": ENode("matmul", {"act": 0}, "y", ("r", "w"))}
    facts = fusion_context(ENodes(nodes, shapes))
    assert facts.classes["r"].fused_loop  # relu(x @ w) and matmul-with-relu: both end in a loop
    assert not facts.classes["y"].fused_loop  # one member is a plain dot
    assert not facts.classes["mm"].fused_loop and not facts.classes["x"].fused_loop


def test_tensat_conventions_charge_a_weight_only_matmul_and_free_transposes() -> None:
    b = GraphBuilder()
    x, w1, w2 = b.input("x", (64, 256)), b.weight("w1", (256, 256)), b.weight("w2", (256, 256))
    y = b.matmul(x, b.matmul(w1, w2))
    t = b.transpose(y, perm=(1, 0))
    graph = b.build([t])
    ours, tensat = conventions("ours"), conventions("tensat")
    for model in (cost_model("roofline", "cpu-nominal"), XlaModel(CAL)):
        base = graph_cost(graph, ours.apply(model), ours.fold_weights)
        charged = graph_cost(graph, tensat.apply(model), tensat.fold_weights)
        weight_only = model.op_cost("matmul", {"act": 0}, [(256, 256), (256, 256)])
        transpose = model.op_cost("transpose", {"perm": (1, 0)}, [(64, 256)])
        assert transpose > 0 and weight_only > 0
        assert charged == pytest.approx(base + weight_only - transpose)
    assert set(CONVENTIONS) == {"ours", "tensat"}
    with pytest.raises(UnknownConventionsError, match="known conventions: ours, tensat"):
        conventions("taso")


def test_tensat_only_rules_have_no_library_merges() -> None:
    from eqsat.rewrites import library_rules

    tensat_only = {r.name for r in named_rules("tensat-only")}
    default = {r.name for r in named_rules("default")}
    library = {r.name for r in library_rules(["conv_merges", "nary_merges"])}
    assert library and default == tensat_only | library and not tensat_only & library
    assert set(RULE_SETS) == {"default", "tensat-only", "layout"}
    assert {r.name for r in named_rules("layout")} == default | {r.name for r in library_rules(["layout"])}
    with pytest.raises(UnknownRuleSetError, match="known rule sets"):
        named_rules("everything")


def test_a_chain_fit_reads_the_floor_where_the_device_is_the_bottleneck() -> None:
    # each call to completion: 50 us a call, 3 us a kernel
    def seconds(n: int) -> float:
        return 50e-6 + 3e-6 * n
    points = [(n, seconds(n) * (1 + 0.01 * k)) for n in (1, 64, 128, 256) for k in (-1, 0, 1)]
    fit = fit_chain(points + [(128, 10 * seconds(128))])  # one wild sample: the medians ignore it
    assert fit.floor_s == pytest.approx(3e-6, rel=0.05) and fit.call_s == pytest.approx(50e-6, rel=0.02)
    # a short chain hidden behind dispatch (slope about 0) would give a wrong floor: only the longest count
    hidden = fit_chain([(1, 50e-6), (16, 50e-6), (64, 197e-6), (128, 389e-6)], device_bound=2)
    assert hidden.floor_s == pytest.approx(3e-6) and hidden.call_s == pytest.approx(47e-6)
    for bad in ([(1, 1e-5)], [(0, 1e-5), (4, 2e-5)], [(1, -1.0), (4, 2e-5)]):
        with pytest.raises(CalibrationError):
            fit_chain(bad)


def test_a_kernel_costs_the_larger_of_its_floor_and_its_work() -> None:
    cal = Calibration("m", "d", launch_s=3e-6, bandwidth=1e12, loop_flops=1e12, matmul=CAL.matmul, conv=CAL.conv,
                      copy_s=4e-6, kernel_s=5e-6, dot_s=2e-4, conv_s=3e-4, call_s=50e-6)
    model = XlaModel(cal)
    small, big = [(1, 512)], [(4096, 4096)]
    assert model.op_cost("tanh", {}, small) == pytest.approx(3e-6)  # the floor, not floor + work
    roofline = max(ops.flops("tanh", big, {}) / cal.loop_flops, 2 * 4 * 4096 * 4096 / cal.bandwidth)
    assert model.op_cost("tanh", {}, big) == pytest.approx(roofline)  # the work, not floor + work
    assert model.op_cost("transpose", {"perm": (1, 0)}, small) == pytest.approx(4e-6)
    assert model.op_cost("reduce_sum", {"axes": (1,)}, small) == pytest.approx(5e-6)
    assert model.op_cost("matmul", {"act": 0}, [(1, 8), (8, 8)]) == pytest.approx(2e-4)  # above the curve's 1e-5
    # a call costs `call_s` beyond its kernels; a plan's predicted speedup counts it on both sides
    b = GraphBuilder()
    x = b.input("x", (1, 512))
    (summed,) = b.apply("reduce_sum", [b.tanh(x)], {"axes": (1,)})
    one, two = b.build([b.tanh(x)]), b.build([b.relu(summed)])
    assert model.program_seconds(one) == pytest.approx(53e-6)
    assert predicted_speedup(two, one, model) == pytest.approx((50 + 3 + 5 + 3) / (50 + 3))
    assert predicted_speedup(two, one, XlaModel(replace(cal, call_s=0.0))) == pytest.approx((3 + 5 + 3) / 3)


def test_a_grouped_conv_is_priced_on_its_own_curve() -> None:
    slow = Curve((1e6, 1e9), (2e-4, 2e-1))
    model = XlaModel(replace(CAL, gconv=slow, **NO_TRANSPOSES))
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    grouped = [(1, 512, 14, 14), (512, 16, 3, 3)]
    work = ops.flops("conv2d", grouped, attrs)
    assert model.op_cost("conv2d", attrs, grouped) == pytest.approx(slow.seconds_for(work))
    # depthwise, dense, and two merged convs (2 groups of 128 channels: wider than the probes measure)
    for shapes in ([(1, 512, 14, 14), (512, 1, 3, 3)], [(1, 64, 14, 14), (64, 64, 3, 3)],
                   [(1, 256, 14, 14), (256, 128, 1, 1)]):
        assert model.op_cost("conv2d", attrs, shapes) == XlaModel(replace(CAL, **NO_TRANSPOSES)).op_cost(
            "conv2d", attrs, shapes)
    assert XlaModel(replace(CAL, **NO_TRANSPOSES)).op_cost("conv2d", attrs, grouped) < model.op_cost(
        "conv2d", attrs, grouped)
    path_cal = replace(CAL, gconv=slow)
    assert Calibration.from_json(json.loads(json.dumps(path_cal.to_json()))) == path_cal


def test_an_older_calibration_format_is_refused_as_such(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    old = {k: v for k, v in CAL.to_json().items() if k not in ("copy_s", "kernel_s", "dot_s", "conv_s", "call_s")}
    path.write_text(json.dumps({**old, "format": "eqsat-xla-calibration-2"}))
    with pytest.raises(CalibrationError, match="older eqsat"):
        read_calibration(path, "machine-a", "cpu-test")
    with pytest.raises(CalibrationError):
        Calibration.from_json({**CAL.to_json(), "call_s": -1.0})


def test_a_newer_calibration_format_is_refused_as_newer_and_a_foreign_file_as_no_calibration() -> None:
    mine = int(CALIBRATION_FORMAT.rsplit("-", 1)[1])
    with pytest.raises(CalibrationError, match="from a newer eqsat"):
        Calibration.from_json({**CAL.to_json(), "format": f"eqsat-xla-calibration-{mine + 1}"})
    for foreign in ("eqsat-xla-calibration-x", "something-else", None):
        with pytest.raises(CalibrationError, match="not a eqsat-xla-calibration"):
            Calibration.from_json({**CAL.to_json(), "format": foreign})


def test_a_strided_slice_read_by_a_dot_is_copied_first_and_a_contiguous_one_is_not() -> None:
    model = XlaModel(replace(CAL, copy_s=1e-9))

    def graph(axis: int) -> Graph:
        b = GraphBuilder()
        x, w, v = b.input("x", (64, 512)), b.weight("w", (512, 1024)), b.weight("v", (256, 256))
        y = b.matmul(x, w)  # (64, 1024)
        (part,) = b.apply("slice", [y], {"axis": axis, "start": 0, "stop": 256 if axis == 1 else 16})
        if axis == 0:
            part = b.apply("reshape", [part], {"shape": (64, 256)})[0]
        return b.build([b.matmul(part, v)])

    strided, contiguous = graph(1), graph(0)  # columns of a (64, 1024) value; its first rows
    dots = (model.op_cost("matmul", {"act": 0}, [(64, 512), (512, 1024)])
            + model.op_cost("matmul", {"act": 0}, [(64, 256), (256, 256)]))
    assert graph_cost(contiguous, model) == pytest.approx(dots)
    copy = max(CAL.launch_s, 2 * 4 * 64 * 256 / CAL.bandwidth)
    assert graph_cost(strided, model) == pytest.approx(dots + copy)
    # a transpose is a free layout change of a dense value, a loop kernel of a strided one; a concat a loop kernel
    assert model.op_cost("transpose", {"perm": (1, 0)}, [(8, 8)]) == pytest.approx(2 * 4 * 64 / CAL.bandwidth)
    assert model.op_cost("concat", {"axis": 0}, [(8, 8), (8, 8)]) == pytest.approx(CAL.launch_s)
    b = GraphBuilder()
    (cols,) = b.apply("slice", [b.input("x", (64, 1024))], {"axis": 1, "start": 0, "stop": 256})
    moved = b.build([b.transpose(cols, perm=(1, 0))])
    assert graph_cost(moved, model) == pytest.approx(max(CAL.launch_s, 2 * 4 * 64 * 256 / CAL.bandwidth))


def test_a_channel_slice_of_an_nchw_convs_output_is_strided_as_xla_cpu_holds_it() -> None:
    """XLA:CPU holds an NCHW conv's output NHWC, where a slice of its channels is not one contiguous block
    (a conv reading it copies it first); the same slice of an NCHW input of batch 1 is contiguous."""
    def graph(after_conv: bool) -> Graph:
        b = GraphBuilder()
        x = b.input("x", (1, 64, 28, 28))
        y = b.conv2d(x, b.weight("w", (128, 64, 1, 1))) if after_conv else b.input("y", (1, 128, 28, 28))
        (part,) = b.apply("slice", [y], {"axis": 1, "start": 0, "stop": 64})
        return b.build([b.conv2d(part, b.weight("v", (32, 64, 1, 1)))])

    def sliced(graph: Graph) -> bool:
        facts = fusion_context(graph_enodes(graph))
        return any(v.strided_view for v in facts.classes.values())

    assert sliced(graph(after_conv=True)) and not sliced(graph(after_conv=False))


def test_a_channel_slice_of_an_nchw_convs_output_is_priced_as_a_transpose_an_add_of_two_convs_is_not() -> None:
    """ResNeXt-50's merged 1x1 convs, sliced back into the block's shortcut and its grouped conv, ran
    2-3% slower than the two convs: XLA:CPU slices the channels in NCHW, so each fusion reading a slice
    transposes (its optimized HLO), where the add of two conv outputs runs NHWC with no transpose."""
    cal = replace(CAL, transpose_act=None, transpose_2d=None, transpose_kxk=None, transpose_bandwidth=1e9)
    model = XlaModel(cal)

    def block(merged: bool) -> Graph:
        b = GraphBuilder()
        x = b.input("x", (1, 64, 56, 56))
        if merged:
            y = b.conv2d(x, b.weight("w", (384, 64, 1, 1)), act=2)
            shortcut, branch = b.slice(y, 1, 128, 384), b.slice(y, 1, 0, 128)
        else:
            shortcut = b.conv2d(x, b.weight("ws", (256, 64, 1, 1)), act=2)
            branch = b.conv2d(x, b.weight("wb", (128, 64, 1, 1)), act=2)
        return b.build([b.relu(b.ewadd(shortcut, b.conv2d(branch, b.weight("we", (256, 128, 1, 1)))))])

    facts = fusion_context(graph_enodes(block(merged=True)))
    internal = {c for c, v in facts.classes.items() if v.conv_internal}
    slices = {n.eclass for n in graph_enodes(block(merged=True)).nodes.values() if n.op == "slice"}
    assert slices and not slices & internal
    transposed = 4 * 384 * 56 * 56 / 1e9  # one NCHW <-> NHWC of the merged conv's output, per slice
    extra = graph_cost(block(merged=True), model) - graph_cost(block(merged=False), model)
    assert extra > 2 * transposed


def test_the_grouped_curve_covers_the_groups_its_probes_measure() -> None:
    from jax_backend.calibrate import GCONV_SHAPES

    from eqsat.xla_cost import GROUPED_CURVE_MAX_PER_GROUP

    assert max(width for _, _, width in GCONV_SHAPES) == GROUPED_CURVE_MAX_PER_GROUP


def _nasrnn_step(merged: bool, pairs: int = 8, hidden: int = 512) -> Graph:
    """x @ w_k for `pairs` weights, separately or as one mat-vec against the concatenated weights
    (folded at load) sliced back: NasRNN's step with and without the merge."""
    b = GraphBuilder()
    x = b.input("x", (1, hidden))
    ws = [b.weight(f"w{k}", (hidden, hidden)) for k in range(pairs)]
    if merged:
        (w,) = b.apply("concat", ws, {"axis": 1})
        y = b.matmul(x, w)
        parts = [b.apply("slice", [y], {"axis": 1, "start": k * hidden, "stop": (k + 1) * hidden})[0]
                 for k in range(pairs)]
    else:
        parts = [b.matmul(x, w) for w in ws]
    out = parts[0]
    for p in parts[1:]:
        out = b.ewadd(out, p)
    return b.build([out])


def test_a_wide_matrix_vector_product_streams_faster_per_byte_than_a_narrow_one() -> None:
    # a CPU's gemv curve: (1, 512) x (512, n) at 2.4 GB/s for n = 512, at 3.4 GB/s for n = 4096
    def probe(n: float) -> float:
        return 4.0 * (GEMV_K + GEMV_K * n + n)

    gemv = Curve((512.0, 4096.0), (probe(512) / 2.4e9, probe(4096) / 3.4e9))
    fast = replace(CAL, gemv=gemv, dot_s=1e-6, launch_s=1e-7)
    separate, merged = _nasrnn_step(False), _nasrnn_step(True)
    assert predicted_speedup(separate, merged, XlaModel(fast)) == pytest.approx(3.4 / 2.4, rel=0.05)
    # as long a reduction but no wider (x·w + h·u as one (1, 1024) x (1024, 512) product): no faster
    b = GraphBuilder()
    x, h = b.input("x", (1, 512)), b.input("h", (1, 512))
    w, u = b.weight("w", (512, 512)), b.weight("u", (512, 512))
    pair = b.build([b.ewadd(b.matmul(x, w), b.matmul(h, u))])
    (xh,) = b.apply("concat", [x, h], {"axis": 1})
    (wu,) = b.apply("concat", [w, u], {"axis": 0})
    stacked = b.build([b.matmul(xh, wu)])
    assert predicted_speedup(pair, stacked, XlaModel(fast)) == pytest.approx(1.0, abs=0.05)
    one = [(1, 512), (512, 512)]
    assert XlaModel(fast).op_cost("matmul", {"act": 0}, one) == pytest.approx(gemv.seconds[0])
    tiny = 4.0 * (8 + 64 + 8)  # narrower than the probes: at the narrowest one's rate (the floor above it)
    assert XlaModel(replace(fast, matmul=Curve((1.0, 1e9), (1e-9, 1e-1)))).op_cost(
        "matmul", {"act": 0}, [(1, 8), (8, 8)]) == pytest.approx(max(1e-6, gemv.seconds[0] * tiny / probe(512)))
    # without a gemv curve every mat-vec streams at the one bandwidth: merging gains only kernel floors
    assert predicted_speedup(separate, merged, XlaModel(replace(fast, gemv=None))) == pytest.approx(1.0, abs=0.02)
    assert Calibration.from_json(json.loads(json.dumps(fast.to_json()))) == fast


def _merged_matvecs(k_parts: int, n_parts: int) -> Graph:
    """Four (1, 512) x (512, 512) products summed in pairs, merged `k_parts` along the reduction
    (x·w + h·u as one (1, 1024) x (1024, 512)) and `n_parts` along the width (x·w, x·v as one
    (1, 512) x (512, 1024)): the same weight bytes whichever way."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (1, 512)) for i in range(2)]
    ws = [[b.weight(f"w{i}{j}", (512, 512)) for j in range(2)] for i in range(2)]  # ws[input][output]
    outs = []
    if k_parts == 1 and n_parts == 1:
        outs = [b.ewadd(b.matmul(xs[0], ws[0][j]), b.matmul(xs[1], ws[1][j])) for j in range(2)]
    elif k_parts == 2 and n_parts == 1:  # (1, 1024) x (1024, 512), twice
        (xx,) = b.apply("concat", xs, {"axis": 1})
        outs = [b.matmul(xx, b.apply("concat", [ws[0][j], ws[1][j]], {"axis": 0})[0]) for j in range(2)]
    elif k_parts == 1 and n_parts == 2:  # (1, 512) x (512, 1024), twice, then the halves summed
        wide = [b.matmul(xs[i], b.apply("concat", ws[i], {"axis": 1})[0]) for i in range(2)]
        outs = [b.ewadd(b.slice(wide[0], 1, 512 * j, 512 * (j + 1)), b.slice(wide[1], 1, 512 * j, 512 * (j + 1)))
                for j in range(2)]
    else:  # (1, 1024) x (1024, 1024), once
        (xx,) = b.apply("concat", xs, {"axis": 1})
        cols = [b.apply("concat", [ws[0][j], ws[1][j]], {"axis": 0})[0] for j in range(2)]
        y = b.matmul(xx, b.apply("concat", cols, {"axis": 1})[0])
        outs = [b.slice(y, 1, 0, 512), b.slice(y, 1, 512, 1024)]
    return b.build(outs)


def test_matrix_vector_products_are_priced_by_reduction_length_and_width() -> None:
    # this CPU's mat-vec rates (GB/s) by k (rows) and n (columns): widening 512 -> 1024 gains 1.5x at
    # k = 512, little at k = 1024; lengthening k gains 1.2x at n = 512 (probes at load 8, 2026-11-26)
    rates = {(512, 512): 3.4, (512, 1024): 5.1, (1024, 512): 4.1, (1024, 1024): 4.4}

    def probe(k: float, n: float) -> float:
        return 4.0 * (k + k * n + n)

    grid = Surface((512.0, 1024.0), (512.0, 1024.0), tuple(probe(k, n) / (rates[k, n] * 1e9)
                                                          for k in (512, 1024) for n in (512, 1024)))
    gemv = Curve((512.0, 1024.0), (probe(512, 512) / 3.4e9, probe(512, 1024) / 5.1e9))
    cal = replace(CAL, gemv=gemv, gemv_kn=grid, dot_s=1e-6, launch_s=1e-7, copy_s=1e-7)
    original, along_k, along_n, both = (_merged_matvecs(k, n) for k, n in ((1, 1), (2, 1), (1, 2), (2, 2)))
    speedups = {name: predicted_speedup(original, g, XlaModel(cal))
                for name, g in (("k", along_k), ("n", along_n), ("both", both))}
    # the ordering the probes give: widening alone > both ways (wide, but a long reduction) > lengthening alone
    assert speedups["n"] > speedups["both"] > speedups["k"] > 1.0
    assert speedups["n"] == pytest.approx(5.1 / 3.4, rel=0.05)
    assert speedups["both"] == pytest.approx(4.4 / 3.4, rel=0.05)
    # by width alone (the format-5 model) the long reduction is missed: both ways ties widening, and
    # lengthening gains nothing
    by_width = XlaModel(replace(cal, gemv_kn=None))
    assert predicted_speedup(original, both, by_width) == pytest.approx(predicted_speedup(original, along_n, by_width),
                                                                        rel=0.02)
    assert predicted_speedup(original, along_k, by_width) == pytest.approx(1.0, abs=0.02)
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


def test_the_gemv_probes_share_the_models_reduction_length() -> None:
    from jax_backend.calibrate import GEMV_GRID_K, GEMV_SHAPES

    assert {k for k, _ in GEMV_SHAPES} == {GEMV_K} and len(GEMV_SHAPES) >= 2
    assert GEMV_K in GEMV_GRID_K and list(GEMV_GRID_K) == sorted(set(GEMV_GRID_K)) and len(GEMV_GRID_K) >= 2


def _conv_block(nhwc: bool) -> Graph:
    """relu(conv(x)) in NCHW, or the same with the conv in NHWC between the layout's transposes."""
    b = GraphBuilder()
    x, w = b.input("x", (1, 64, 28, 28)), b.weight("w", (64, 64, 3, 3))
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    if nhwc:
        (xt,) = b.apply("transpose", [x], {"perm": (0, 2, 3, 1)})
        (wt,) = b.apply("transpose", [w], {"perm": (2, 3, 1, 0)})
        (y,) = b.apply("conv2d_nhwc", [xt, wt], attrs)
        (y,) = b.apply("transpose", [y], {"perm": (0, 3, 1, 2)})
    else:
        (y,) = b.apply("conv2d", [x, w], attrs)
    return b.build([b.relu(y)])


def test_an_nchw_conv_is_priced_as_its_nhwc_form_and_the_transposes_xla_runs_around_it() -> None:
    # XLA:CPU runs an NCHW conv as the NHWC one between transposes: the NCHW curve no longer prices it
    nhwc = Curve((1e6, 1e9), (1e-4, 1e-1))
    cal = replace(CAL, conv=Curve((1e6, 1e9), (9e-4, 9e-1)), conv_nhwc=nhwc, copy_s=1e-9, transpose_bandwidth=1e9)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    x, w = (1, 64, 28, 28), (64, 64, 3, 3)
    work = ops.flops("conv2d", [x, w], attrs)
    transposes = 2 * 4 * (ops.numel(x) + ops.numel(w)) / 1e9  # its input and its weight, read and written
    assert XlaModel(cal).op_cost("conv2d", attrs, [x, w]) == pytest.approx(nhwc.seconds_for(work) + transposes)
    assert XlaModel(replace(cal, conv=Curve((1e6, 1e9), (1e-5, 1e-2)))).op_cost("conv2d", attrs, [x, w]) == \
        pytest.approx(nhwc.seconds_for(work) + transposes)  # whatever the NCHW probe measured
    # the original pays its weight's transpose on every call; the layout plan's is folded (a weight's)
    plain, layout = _conv_block(False), _conv_block(True)
    model = XlaModel(cal)
    out = 2 * 4 * 64 * 28 * 28 / 1e9  # pad 0: SAME
    assert model.price_graph(plain) - model.price_graph(layout) == pytest.approx(2 * 4 * ops.numel(w) / 1e9 - out)
    # a slower transpose makes every NCHW conv dearer, and the NHWC plan (one transpose each end) relatively cheaper
    slow = XlaModel(replace(cal, transpose_bandwidth=1e8))
    assert predicted_speedup(_conv_chain(False), _conv_chain(True), slow) > predicted_speedup(
        _conv_chain(False), _conv_chain(True), model) > 1.0
    # a grouped NHWC conv: its own curve, else the grouped NCHW one
    grouped = [(1, 14, 14, 512), (3, 3, 16, 512)]
    work = ops.flops("conv2d_nhwc", grouped, attrs)
    slow_curve, quick = Curve((1e6, 1e9), (3e-4, 3e-1)), Curve((1e6, 1e9), (1e-5, 1e-2))
    assert XlaModel(replace(cal, gconv=slow_curve)).op_cost("conv2d_nhwc", attrs, grouped) == pytest.approx(
        slow_curve.seconds_for(work))
    with_own = replace(cal, gconv=slow_curve, gconv_nhwc=quick)
    assert XlaModel(with_own).op_cost("conv2d_nhwc", attrs, grouped) == pytest.approx(quick.seconds_for(work))
    assert Calibration.from_json(json.loads(json.dumps(with_own.to_json()))) == with_own


def _conv_chain(nhwc: bool, convs: int = 4) -> Graph:
    """`convs` 3x3 convs with relus between them, then a max pool: NCHW, or NHWC between one transpose at
    each end (and the weights' transposes, which fold)."""
    b = GraphBuilder()
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    y = b.input("x", (1, 64, 28, 28))
    if nhwc:
        (y,) = b.apply("transpose", [y], {"perm": (0, 2, 3, 1)})
    for i in range(convs):
        w = b.weight(f"w{i}", (64, 64, 3, 3))
        if nhwc:
            (w,) = b.apply("transpose", [w], {"perm": (2, 3, 1, 0)})
        (y,) = b.apply("conv2d_nhwc" if nhwc else "conv2d", [y, w], attrs)
        y = b.relu(y)
    if nhwc:
        (y,) = b.apply("transpose", [y], {"perm": (0, 3, 1, 2)})
    (y,) = b.apply("poolmax", [y], {"kernel_h": 2, "kernel_w": 2, "stride_h": 2, "stride_w": 2, "pad": 0})
    return b.build([y])


def test_xla_keeps_an_nchw_convs_nhwc_output_through_elementwise_ops_and_a_pool_transposes_it_back() -> None:
    # in a chain only the first conv's input is transposed (XLA's layout assignment keeps NHWC
    # between convs); the pool, which does not carry the layout, pays a transpose of its input
    cal = replace(CAL, conv_nhwc=Curve((1e6, 1e9), (1e-4, 1e-1)), copy_s=1e-9, transpose_bandwidth=1e9)
    model, chain = XlaModel(cal), _conv_chain(False)
    enodes = graph_enodes(chain)
    facts = fusion_context(enodes)
    internal = {enodes.nodes[n].op for n in enodes.nodes if facts.classes[enodes.nodes[n].eclass].conv_internal}
    assert internal == {"conv2d", "relu"}
    act, weight = 4 * 64 * 28 * 28, 4 * 64 * 64 * 9
    conv = cal.conv_nhwc.seconds_for(ops.flops("conv2d", [(1, 64, 28, 28), (64, 64, 3, 3)],  # type: ignore[union-attr]
                                                {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}))
    relu = model.op_cost("relu", {}, [(1, 64, 28, 28)])
    pool = model.op_cost("poolmax", {"kernel_h": 2, "kernel_w": 2, "stride_h": 2, "stride_w": 2, "pad": 0},
                         [(1, 64, 28, 28)])
    expected = 4 * (conv + relu) + (act + 4 * weight) * 2 / 1e9 + pool + 2 * act / 1e9
    assert model.price_graph(chain) == pytest.approx(expected)


def test_a_format_3_calibration_is_refused_as_older(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    old = {k: v for k, v in CAL.to_json().items() if k not in ("gemv", "conv_nhwc", "gconv_nhwc")}
    path.write_text(json.dumps({**old, "format": "eqsat-xla-calibration-3"}))
    with pytest.raises(CalibrationError, match="older eqsat"):
        read_calibration(path, "machine-a", "cpu-test")


def _one_by_one_convs(parts: tuple[int, ...], nhwc: bool = False) -> Graph:
    """One image through dense 1x1 convs of `parts` output channels each (a merged conv: one part)."""
    b = GraphBuilder()
    x = b.input("x", (1, 17, 17, 768) if nhwc else (1, 768, 17, 17))
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    outs = []
    for i, cout in enumerate(parts):
        w = b.weight(f"w{i}", (1, 1, 768, cout) if nhwc else (cout, 768, 1, 1))
        (y,) = b.apply("conv2d_nhwc" if nhwc else "conv2d", [x, w], attrs)
        outs.append(y)
    return b.build(outs)


# seconds per flop doubling from the smallest weight to the largest, the same at every row count
SLOWER_WHEN_WIDE = Surface((64.0, 1225.0), (6.5e4, 1.6e6), tuple(2 * r * w * spf for r in (64.0, 1225.0)
                                                                   for w, spf in ((6.5e4, 1e-11), (1.6e6, 2e-11))))


def test_a_merged_1x1_conv_is_priced_by_its_gemm_shape() -> None:
    # the conv curve by flops alone runs a 4x larger conv at a higher rate: merging looks like a gain
    conv = Curve((1e6, 1e8, 1e9), (1e-4, 2e-3, 1e-2))
    separate, merged = _one_by_one_convs((192,) * 4), _one_by_one_convs((768,))
    flops_only = replace(CAL, conv=conv, conv_s=1e-7, **NO_TRANSPOSES)
    assert predicted_speedup(separate, merged, XlaModel(flops_only)) > 1.2
    # on the 1x1 surface a 768 x 768 weight runs at a lower rate than a 768 x 192 one: no gain
    by_shape = replace(flops_only, conv1x1=SLOWER_WHEN_WIDE)
    assert predicted_speedup(separate, merged, XlaModel(by_shape)) < 1.0
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    shapes = [(1, 768, 17, 17), (192, 768, 1, 1)]
    assert XlaModel(by_shape).op_cost("conv2d", attrs, shapes) == pytest.approx(
        SLOWER_WHEN_WIDE.seconds_for(17 * 17, 768 * 192))
    # a 3x3 conv and a conv of 2 wide groups are GEMMs too: rows x (cin / groups * 3 * 3 or 1) x cout
    for other, weights in (([(1, 768, 17, 17), (192, 768, 3, 3)], 192 * 768 * 9),
                           ([(1, 768, 17, 17), (192, 384, 1, 1)], 192 * 384)):
        work = ops.flops("conv2d", other, attrs)
        rate = SLOWER_WHEN_WIDE.seconds_for(17 * 17, weights) / (2 * 17 * 17 * weights)
        assert XlaModel(by_shape).op_cost("conv2d", attrs, other) == pytest.approx(work * rate)
    # a narrow grouped conv (16 channels a group) and a depthwise one (no curve of its own) stay on the curve by flops
    for other in ([(1, 512, 14, 14), (512, 16, 3, 3)], [(1, 512, 14, 14), (512, 1, 3, 3)]):
        work = ops.flops("conv2d", other, attrs)
        assert XlaModel(by_shape).op_cost("conv2d", attrs, other) == pytest.approx(conv.seconds_for(work))


def test_a_surface_interpolates_the_rate_in_log_space_and_clamps_it() -> None:
    s = SLOWER_WHEN_WIDE
    assert s.seconds_for(64, 6.5e4) == pytest.approx(2 * 64 * 6.5e4 * 1e-11)
    assert s.seconds_for(1225, 1.6e6) == pytest.approx(2 * 1225 * 1.6e6 * 2e-11)
    mid = math.sqrt(6.5e4 * 1.6e6)  # halfway in log: the geometric mean of the rates
    assert s.seconds_for(300, mid) == pytest.approx(2 * 300 * mid * math.sqrt(2) * 1e-11)
    assert s.seconds_for(10, 1e3) == pytest.approx(2 * 10 * 1e3 * 1e-11)  # below the grid: the edge's rate
    assert s.seconds_for(1e5, 1e8) == pytest.approx(2 * 1e5 * 1e8 * 2e-11)
    with pytest.raises(CalibrationError, match="2 x 2"):
        Surface((1.0, 2.0), (1.0, 2.0), (1.0, 1.0, 1.0))
    with pytest.raises(CalibrationError, match="increasing"):
        Surface((2.0, 1.0), (1.0, 2.0), (1.0,) * 4)
    cal = replace(CAL, conv1x1=s, conv1x1_nhwc=s)
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


def test_the_op_registrys_conv_layout_picks_the_conv_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ops.op_spec("conv2d").conv_layout == "NCHW" and ops.op_spec("conv2d_nhwc").conv_layout == "NHWC"
    assert all(spec.fusion == "library" for spec in ops.OPS.values() if spec.conv_layout is not None)
    assert ops.op_spec("matmul").conv_layout is None
    quick = Surface((64.0, 1225.0), (6.5e4, 1.6e6), (1e-3,) * 4)
    cal = replace(CAL, conv1x1=SLOWER_WHEN_WIDE, conv1x1_nhwc=quick, conv_s=1e-9)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    nhwc_shapes = [(1, 17, 17, 768), (1, 1, 768, 192)]
    assert XlaModel(cal).op_cost("conv2d_nhwc", attrs, nhwc_shapes) == pytest.approx(1e-3)
    # the field, not the op's name, says which layout's surface (and which axes) a conv is priced on
    spec = ops.OPS["conv2d_nhwc"]
    monkeypatch.setitem(ops.OPS, "conv2d_nhwc", replace(spec, conv_layout="NCHW"))  # type: ignore[index]
    assert XlaModel(cal).op_cost("conv2d_nhwc", attrs, nhwc_shapes) != pytest.approx(1e-3)
    monkeypatch.setitem(ops.OPS, "conv2d_nhwc", replace(spec, conv_layout=None))  # type: ignore[index]
    assert XlaModel(cal).op_cost("conv2d_nhwc", attrs, nhwc_shapes) == pytest.approx(
        max(cal.dot_s, cal.matmul.seconds_for(ops.flops("conv2d_nhwc", nhwc_shapes, attrs)),
            4 * (17 * 17 * 768 + 768 * 192 + 17 * 17 * 192) / cal.weight_bandwidth))


def test_a_fitted_surface_never_runs_a_larger_weight_at_a_higher_rate() -> None:
    rows, weights = (64.0, 1225.0), (1e4, 1e5, 1e6)
    spf = (1e-11, 0.5e-11, 4e-11, 1e-11, 2e-11, 3e-11)  # at 64 rows the middle weight ran fast (noise)
    s = Surface.fit(rows, weights, [2 * r * w * spf[i * 3 + j] for i, r in enumerate(rows) for j, w in enumerate(weights)])
    pooled = math.sqrt(1e-11 * 0.5e-11)  # the violators pooled in log space
    assert s.seconds_for(64, 1e4) == pytest.approx(2 * 64 * 1e4 * pooled)
    assert s.seconds_for(64, 1e5) == pytest.approx(2 * 64 * 1e5 * pooled)
    assert s.seconds_for(1225, 1e5) == pytest.approx(2 * 1225 * 1e5 * 2e-11)  # already ordered: as measured


def test_a_large_transpose_costs_more_per_byte_on_its_curve_and_a_kxk_weight_uses_its_own() -> None:
    # XLA:CPU transposes a large 1x1 weight at a fraction of a small one's rate per byte
    flat = Curve((1e4, 1e7), (1e-6, 1e-2))  # 10 GB/s at 10 KB, 1 GB/s at 10 MB (read once, write once: 2x)
    window = Curve((1e4, 1e7), (2e-6, 4e-3))
    cal = replace(CAL, conv_nhwc=Curve((1e6, 1e9), (1e-4, 1e-1)), copy_s=1e-9, transpose_2d=flat, transpose_kxk=window)
    model, attrs = XlaModel(cal), {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}

    def transposes(x: tuple[int, ...], w: tuple[int, ...]) -> float:
        nhwc = XlaModel(replace(cal, **NO_TRANSPOSES)).op_cost("conv2d", attrs, [x, w])
        return model.op_cost("conv2d", attrs, [x, w]) - nhwc

    small, large = (64, 64, 1, 1), (2048, 1024, 1, 1)
    x_small, x_large = (1, 64, 8, 8), (1, 1024, 8, 8)
    per_byte_small = (transposes(x_small, small) - flat.seconds_for(4 * 64 * 64)) / (4 * 64 * 64)
    per_byte_large = (transposes(x_large, large) - flat.seconds_for(4 * 1024 * 64)) / (4 * 2048 * 1024)
    assert per_byte_large > 3 * per_byte_small
    kxk = (256, 256, 3, 3)
    assert transposes((1, 256, 8, 8), kxk) == pytest.approx(window.seconds_for(4 * 256 * 256 * 9)
                                                             + flat.seconds_for(4 * 256 * 64))
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


def test_an_activations_layout_transpose_is_priced_on_its_own_curve() -> None:
    """An NCHW conv's input, an NHWC value transposed back before a pool, and an explicit transpose of
    any rank are values the program has just written (a curve of their own, probed in cache); a weight
    stays on its own (probed from memory)."""
    flat, window = Curve((1e4, 1e7), (1e-6, 1e-2)), Curve((1e4, 1e7), (2e-6, 4e-3))
    act = Curve((1e4, 1e7), (5e-7, 1e-3))
    cal = replace(CAL, conv_nhwc=Curve((1e6, 1e9), (1e-4, 1e-1)), copy_s=1e-9, transpose_2d=flat, transpose_kxk=window)
    with_act = replace(cal, transpose_act=act)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    x, w = (1, 64, 56, 56), (64, 64, 1, 1)
    diff = XlaModel(cal).op_cost("conv2d", attrs, [x, w]) - XlaModel(with_act).op_cost("conv2d", attrs, [x, w])
    assert diff == pytest.approx(flat.seconds_for(4 * ops.numel(x)) - act.seconds_for(4 * ops.numel(x)))
    perm = {"perm": list(ops.NHWC_IN)}
    assert XlaModel(with_act).op_cost("transpose", perm, [x]) == pytest.approx(act.seconds_for(4 * ops.numel(x)))
    assert XlaModel(with_act).op_cost("transpose", {"perm": [1, 0]}, [(512, 256)]) == pytest.approx(
        act.seconds_for(4 * 512 * 256))
    assert XlaModel(with_act).op_cost("conv2d", attrs, [x, w]) - XlaModel(with_act).op_cost(
        "conv2d_nhwc", attrs, [(1, 56, 56, 64), (1, 1, 64, 64)]) == pytest.approx(
        flat.seconds_for(4 * ops.numel(w)) + act.seconds_for(4 * ops.numel(x)))
    assert XlaModel(cal).op_cost("transpose", perm, [x]) == pytest.approx(flat.seconds_for(4 * ops.numel(x)))
    assert Calibration.from_json(json.loads(json.dumps(with_act.to_json()))) == with_act


def _conv_then_pool(relu: bool, concat: bool) -> Graph:
    """An NCHW conv (NHWC inside XLA:CPU), relu'd or not, joined to itself by a concat or not, then a pool."""
    b = GraphBuilder()
    y = b.conv2d(b.input("x", (1, 64, 56, 56)), b.weight("w", (64, 64, 1, 1)))
    y = b.relu(y) if relu else y
    y = b.concat(1, y, y) if concat else y
    return b.build([b.poolmax(y, (2, 2), (2, 2))])


def test_a_pool_reading_a_convs_nhwc_value_pays_its_transpose_unless_a_concat_wrote_it() -> None:
    """XLA:CPU transposes an NCHW conv's NHWC value back to NCHW before a pool; a concat writes the layout
    its reader wants (its NHWC operands cost nothing over NCHW ones, measured), so neither it nor its
    reader pays a transpose."""
    act = Curve((1e4, 1e7), (5e-7, 1e-3))
    cal = replace(CAL, conv_nhwc=Curve((1e6, 1e9), (1e-4, 1e-1)), copy_s=1e-9, transpose_act=act)
    dear_act = Curve((1e4, 1e7), (1e-3, 1.0))
    cheap, dear = XlaModel(cal), XlaModel(replace(cal, transpose_act=dear_act))
    nbytes = 4 * 64 * 56 * 56
    # the conv's NCHW input and the pool's operand: two activation transposes
    direct = graph_cost(_conv_then_pool(relu=True, concat=False), dear) - graph_cost(
        _conv_then_pool(relu=True, concat=False), cheap)
    assert direct == pytest.approx(2 * (dear_act.seconds_for(nbytes) - act.seconds_for(nbytes)))
    # through a concat, only the conv's own input transpose is left
    facts = fusion_context(graph_enodes(_conv_then_pool(relu=True, concat=True)))
    assert any(v.any_layout and v.conv_internal for v in facts.classes.values())
    through_concat = graph_cost(_conv_then_pool(relu=True, concat=True), dear) - graph_cost(
        _conv_then_pool(relu=True, concat=True), cheap)
    assert through_concat == pytest.approx(dear_act.seconds_for(nbytes) - act.seconds_for(nbytes))


def test_a_depthwise_conv_is_priced_on_its_own_curve_and_a_grouped_one_is_not() -> None:
    # XLA:CPU runs a depthwise conv far below a dense conv of the same flops: on the dense curve it
    # would be priced as nearly free
    slow = Curve((1e6, 1e8), (2e-3, 2e-1))
    cal = replace(CAL, dwconv=slow, **NO_TRANSPOSES)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    nchw = [(1, 128, 56, 56), (128, 1, 3, 3)]
    nhwc = [(1, 56, 56, 128), (3, 3, 1, 128)]
    work = ops.flops("conv2d", nchw, attrs)
    for op, shapes in (("conv2d", nchw), ("conv2d_nhwc", nhwc)):
        assert XlaModel(cal).op_cost(op, attrs, shapes) == pytest.approx(slow.seconds_for(work))
        assert XlaModel(replace(CAL, **NO_TRANSPOSES)).op_cost(op, attrs, shapes) < XlaModel(cal).op_cost(
            op, attrs, shapes) / 5
    # a grouped conv of 16 channels a group and a dense one keep their curves
    for shapes in ([(1, 512, 14, 14), (512, 16, 3, 3)], [(1, 64, 14, 14), (64, 64, 3, 3)]):
        assert XlaModel(cal).op_cost("conv2d", attrs, shapes) == XlaModel(
            replace(CAL, **NO_TRANSPOSES)).op_cost("conv2d", attrs, shapes)


def test_merged_depthwise_convs_of_two_or_three_channels_a_group_are_priced_as_depthwise() -> None:
    """NasNet-A's `merge_gconv` joins depthwise convs into convs of 2 channels a group, which XLA:CPU runs
    as slowly as depthwise ones; on the grouped curve (probed on 4 to 64 a group) the ILP merged them for a
    predicted 1.41x that measured 0.99x. Four a group and more stay on the grouped curve."""
    slow = Curve((1e6, 1e8), (2e-3, 2e-1))
    cal = replace(CAL, dwconv=slow, **NO_TRANSPOSES)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    for per_group in (2, 3):
        shapes = [(1, 6 * 64, 28, 28), (6 * 64, per_group, 3, 3)]
        nhwc = [(1, 28, 28, 6 * 64), (3, 3, per_group, 6 * 64)]
        work = ops.flops("conv2d", shapes, attrs)
        assert XlaModel(cal).op_cost("conv2d", attrs, shapes) == pytest.approx(slow.seconds_for(work))
        assert XlaModel(cal).op_cost("conv2d_nhwc", attrs, nhwc) == pytest.approx(slow.seconds_for(work))
    for shapes in ([(1, 256, 28, 28), (256, 4, 3, 3)], [(1, 2, 28, 28), (2, 2, 3, 3)]):  # 4 a group; a dense conv
        assert XlaModel(cal).op_cost("conv2d", attrs, shapes) == XlaModel(
            replace(CAL, **NO_TRANSPOSES)).op_cost("conv2d", attrs, shapes)


def test_a_grouped_conv_runs_at_its_group_widths_rate_not_at_its_flops() -> None:
    """Probes of 4, 16 and 64 channels a group: a conv is priced at its group width's rate (log rate
    linear in log width between probes, the end probe's outside), so 4 a group at 2x the flops of a 16 a
    group probe costs its flops over 4 a group's rate, not the 16 a group probe's time as a curve by flops
    pooled it (wider than 64 a group is a dense conv); the rates survive the JSON."""
    rates = ((16.0, 4e10), (4.0, 1e10), (64.0, 2e10))
    cal = replace(CAL, gconv_rates=rates, **NO_TRANSPOSES)
    attrs = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    for per_group, rate in ((4, 1e10), (8, 2e10), (16, 4e10), (32, math.sqrt(8e20)), (64, 2e10)):
        channels = 16 * per_group
        shapes = [(1, channels, 28, 28), (channels, per_group, 3, 3)]
        nhwc = [(1, 28, 28, channels), (3, 3, per_group, channels)]
        work = ops.flops("conv2d", shapes, attrs)
        assert XlaModel(cal).op_cost("conv2d_nhwc", attrs, nhwc) == pytest.approx(max(work / rate, cal.conv_s))
        assert XlaModel(cal).op_cost("conv2d", attrs, shapes) == pytest.approx(max(work / rate, cal.conv_s))
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    with pytest.raises(CalibrationError):
        replace(CAL, gconv_rates=((4.0, -1.0),))


def test_a_depthwise_conv_is_priced_per_output_and_tap_when_calibrated_so() -> None:
    """XLA:CPU runs a 3x3 depthwise conv at about half a 7x7 one's FLOP/s (a fixed cost per output beside
    the window's multiply-adds), so with `dwconv_taps` a depthwise conv costs its outputs times (per
    output + per tap x window); a stride-2 one has a quarter of the outputs; merged ones of 2-3 channels a
    group count each group input's taps; the fit recovers both terms from exact probes."""
    per_output, per_tap = 6e-9, 6e-10
    cal = replace(CAL, dwconv=Curve((1e6, 1e8), (2e-3, 2e-1)), dwconv_taps=(per_output, per_tap), **NO_TRANSPOSES)
    one = {"stride_h": 1, "stride_w": 1, "pad": 0, "act": 0}
    two = {**one, "stride_h": 2, "stride_w": 2}
    for k in (3, 5, 7):
        outputs = 128 * 56 * 56
        expected = max(outputs * (per_output + per_tap * k * k), cal.conv_s)
        assert XlaModel(cal).op_cost("conv2d", one, [(1, 128, 56, 56), (128, 1, k, k)]) == pytest.approx(expected)
        assert XlaModel(cal).op_cost("conv2d_nhwc", one, [(1, 56, 56, 128), (k, k, 1, 128)]) == pytest.approx(expected)
        assert XlaModel(cal).op_cost("conv2d", two, [(1, 128, 56, 56), (128, 1, k, k)]) == pytest.approx(
            max(outputs / 4 * (per_output + per_tap * k * k), cal.conv_s))
    seconds_3x3 = XlaModel(cal).op_cost("conv2d", one, [(1, 128, 56, 56), (128, 1, 3, 3)])
    seconds_7x7 = XlaModel(cal).op_cost("conv2d", one, [(1, 128, 56, 56), (128, 1, 7, 7)])
    assert seconds_7x7 / seconds_3x3 < 49 / 9  # fewer FLOP/s for the smaller window
    merged = [(1, 384, 28, 28), (384, 2, 3, 3)]
    assert XlaModel(cal).op_cost("conv2d", one, merged) == pytest.approx(384 * 28 * 28 * (per_output + per_tap * 18))
    assert XlaModel(cal).op_cost("conv2d", one, [(1, 256, 28, 28), (256, 16, 3, 3)]) == XlaModel(
        replace(cal, dwconv_taps=None)).op_cost("conv2d", one, [(1, 256, 28, 28), (256, 16, 3, 3)])  # grouped: its rate
    probes = [(n, t, n * (per_output + per_tap * t)) for n, t in ((5e4, 9), (4e5, 9), (2e5, 25), (2e5, 49))]
    assert fit_taps(probes) == pytest.approx((per_output, per_tap))
    assert fit_taps([(1e5, 9, 1e-3), (1e5, 49, 1e-3)]) == pytest.approx((1e-8, 0.0))  # no gain per tap: none
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    with pytest.raises(CalibrationError):
        replace(CAL, dwconv_taps=(-1e-9, 1e-9))


def test_a_format_8_calibration_is_refused_as_older(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    old = {k: v for k, v in CAL.to_json().items() if k != "dwconv"}
    path.write_text(json.dumps({**old, "format": "eqsat-xla-calibration-8"}))
    with pytest.raises(CalibrationError, match="older eqsat"):
        read_calibration(path, "machine-a", "cpu-test")
    slow = Curve((1e6, 1e8), (2e-3, 2e-1))
    assert Calibration.from_json(replace(CAL, dwconv=slow).to_json()).dwconv == slow


def test_a_curve_without_economy_never_runs_a_larger_call_at_a_higher_rate() -> None:
    # probes of 1, 8 and 20 MFLOP at 1.0, 0.5 and 0.8 GFLOP/s: the last would make a merge look like a gain
    curve = Curve.fit_monotone_rate([(1e6, 1e-3), (8e6, 16e-3), (2e7, 25e-3)])
    rates = [f / s for f, s in zip(curve.flops, curve.seconds)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(rates, rates[1:]))
    assert curve.seconds[0] == pytest.approx(1e-3)  # a point that breaks nothing stays where it was measured
    assert 2 * curve.seconds_for(8e6) <= curve.seconds_for(1.6e7) * (1 + 1e-9)  # two calls merged never gain


def test_a_gpu_like_surface_keeps_its_rising_rate_so_a_merge_of_small_convs_gains() -> None:
    # a GPU's 1x1 convs: the larger weight runs at a higher rate while the call cannot fill the device;
    # pooled toward a falling rate the grid would price every conv at its smallest probe's rate
    rows, weights = (64.0, 1225.0), (6.5e4, 5.9e5, 1.6e6)
    us = (22.0, 44.0, 56.0, 89.0, 145.0, 258.0)
    s = Surface.fit(rows, weights, [t * 1e-6 for t in us], rate_falls=False)
    assert s.seconds_for(64, 1.6e6) == pytest.approx(56e-6)  # as measured
    assert s.seconds_for(1225, 6.5e4) == pytest.approx(89e-6)
    merged = s.seconds_for(1225, 2 * 6.5e4)  # two convs of one input, merged along cout
    assert merged < 2 * s.seconds_for(1225, 6.5e4)


def test_a_gpu_like_depthwise_curve_keeps_its_rising_rate() -> None:
    # the H200's depthwise probes: 9 us at 0.9, 7.2, 10 MFLOP (the launch), 15 us at 20 MFLOP
    points = [(0.87e6, 9e-6), (7.2e6, 9e-6), (10.3e6, 9e-6), (20e6, 15e-6)]
    curve = Curve.fit_monotone_rate(points, rate_falls=False)
    assert curve.seconds == pytest.approx(tuple(t for _, t in points))
    assert curve.seconds_for(2 * 7.2e6) < 2 * curve.seconds_for(7.2e6)  # two calls merged gain the launch


def test_a_cpu_surface_still_pools_toward_a_falling_rate() -> None:
    # the same rising probes fitted as a CPU's: every weight at or below the smallest one's rate
    rows, weights = (64.0, 1225.0), (6.5e4, 5.9e5, 1.6e6)
    s = Surface.fit(rows, weights, [t * 1e-6 for t in (22.0, 44.0, 56.0, 89.0, 145.0, 258.0)])
    rate = [[2 * r * w / s.seconds_for(r, w) for w in weights] for r in rows]
    assert all(b <= a * (1 + 1e-9) for row in rate for a, b in zip(row, row[1:]))

"""`eqsat.explain` a user can read: leaves by the user's argument names and pytree paths, predicted
costs in µs only under a model calibrated to the device (else relative units, the measured time
beside), and a layered drawing whose edges never run under a box."""

from __future__ import annotations

import functools
import random
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqsat
from eqsat.candidates import SegmentReport
from eqsat.ir import GraphBuilder
from jax_backend.capture import capture, graph_leaf_name
from jax_backend.decorator import _is_array_leaf
from jax_backend.decorator_options import EqsatFallbackWarning, SignatureReport
from jax_backend.explain import draw_graph, predicted_text
from jax_backend.layered import layered_layout, segment_hits_box
from jax_backend.leaf_names import argument_names, traced_leaf_names, value_names

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.standard_normal(shape), jnp.float32)


PARAMS = {"Dense_0": {"kernel": _rand(32, 64), "bias": _rand(64)}, "Dense_1": {"kernel": _rand(32, 64), "bias": _rand(64)}}
X = _rand(16, 32)


def two_dense(params, x):
    a = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
    b = x @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]
    return jnp.tanh(a) * b


# --- names ------------------------------------------------------------------------------------------

def test_leaf_names_follow_arguments_and_key_paths() -> None:
    def f(params, x, *rest, scale, mode="a"):
        return x

    args = (PARAMS, X, (X, X), X)
    names = traced_leaf_names(f, args, {"scale": X, "mode": "fast"}, set(), _is_array_leaf)
    assert names == ("params['Dense_0']['bias']", "params['Dense_0']['kernel']", "params['Dense_1']['bias']",
                     "params['Dense_1']['kernel']", "x", "rest[0][0]", "rest[0][1]", "rest[1]", "scale")
    assert len(names) == len([leaf for leaf in jax.tree_util.tree_leaves((args, {"scale": X})) if _is_array_leaf(leaf)])
    # a static argument (by position) and a non-array leaf have no traced leaves; the others keep their names
    assert traced_leaf_names(f, (PARAMS, X, "fast", 3), {}, {0}, _is_array_leaf) == ("x", "rest[1]")
    assert argument_names(lambda *a: a, 2) == ["a[0]", "a[1]"]
    assert argument_names(lambda a: a, 2) == ["a", "arg1"] and argument_names(len, 1) == ["obj"]


def test_a_method_names_its_module_fields_through_self() -> None:
    import dataclasses

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "b"], meta_fields=[])
    @dataclasses.dataclass
    class Layer:
        w: jax.Array
        b: jax.Array

        def __call__(self, x):
            return x @ self.w + self.b

    layer = Layer(_rand(32, 4), _rand(4))
    names = traced_leaf_names(Layer.__call__, (layer, X), {}, set(), _is_array_leaf)
    assert names == ("self.w", "self.b", "x")


def test_value_names_for_inputs_constants_and_opaque_outputs() -> None:
    def f(x, w):
        h = jnp.cumsum(x @ w, axis=1)  # cumsum stays opaque: the graph after it reads its output
        return jnp.tanh(h) * 2.0

    program, _ = capture(f, jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))
    names = dict(value_names(program, ("x", "w")))
    assert names[graph_leaf_name(0)] == "x" and names[graph_leaf_name(1)] == "w"
    assert any(label.startswith("cumsum#") for label in names.values()), names
    assert not any(label.startswith("v") for label in names.values()), names
    # names that do not match the inputs are not used (the old ids stay)
    assert dict(value_names(program, ("x",)))[graph_leaf_name(0)] == graph_leaf_name(0)


def test_explain_names_leaves_by_pytree_path_and_labels_units(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EqsatFallbackWarning)
        e = eqsat.explain(eqsat.optimize(two_dense, cost_model="roofline", extractor="greedy-dag",
                                         check_speed=False, time_limit=2.0),
                          PARAMS, X, out=tmp_path)
    text = e.text()
    assert "params['Dense_0']['kernel']" in text and "params['Dense_1']['bias']" in text
    assert " x " in text and "v0" not in text
    assert "relative units (roofline model, not calibrated to this device" in text
    assert "µs per call" not in text
    assert e.pictures and all(p.stat().st_size > 1000 for p in e.pictures)


# --- units ------------------------------------------------------------------------------------------

def _segment(model: str) -> SegmentReport:
    g = GraphBuilder()
    x = g.apply("input", [], {"name": "v0", "shape": (2, 2), "dtype": "float32"})[0]
    graph = g.build([g.apply("tanh", [x], {})[0]])
    return SegmentReport(graph, graph, cost_before=6039.1e-6, cost_after=5000e-6, cost_model=model)


def test_predicted_costs_are_microseconds_only_under_a_calibrated_model() -> None:
    timed = SignatureReport("f32[2,2]", "original", "r", time_original_s=108e-6, time_optimized_s=110e-6)
    for model in ("roofline", "merge"):
        text = predicted_text(_segment(model), timed)
        assert "6039.1 → 5000.0 relative units" in text and f"({model} model, not calibrated" in text
        assert "µs per call" not in text and "measured 108.0 → 110.0 µs (whole program)" in text
    for model in ("measured", "xla"):
        text = predicted_text(_segment(model), timed)
        assert f"6039.1 → 5000.0 µs per call ({model} model, calibrated on this device)" in text
    untimed = predicted_text(_segment("roofline"), SignatureReport("s", "original", "r"))
    assert "measured" not in untimed


# --- the layered drawing ----------------------------------------------------------------------------

def _random_dag(rng: random.Random, n: int) -> list[tuple[int, int]]:
    edges = []
    for v in range(1, n):
        for u in rng.sample(range(v), k=min(v, rng.randint(0, 3))):
            edges.append((u, v))
    return edges


def test_layered_layout_is_layered_and_no_edge_runs_under_a_box() -> None:
    rng = random.Random(7)
    for trial in range(60):
        n = rng.randint(2, 16)
        edges = _random_dag(rng, n)
        widths = {v: rng.uniform(0.8, 2.5) for v in range(n)}
        layout = layered_layout(list(range(n)), edges, widths)
        for u, v in edges:
            assert layout.layers[u] < layout.layers[v], (trial, u, v)
            assert layout.boxes[u].y > layout.boxes[v].y
            route = layout.routes[(u, v)]
            bu, bv = layout.boxes[u], layout.boxes[v]
            assert route[0][1] == pytest.approx(bu.y - bu.h / 2) and abs(route[0][0] - bu.x) <= bu.w / 2
            assert route[-1][1] == pytest.approx(bv.y + bv.h / 2) and abs(route[-1][0] - bv.x) <= bv.w / 2
            for a, b in zip(route, route[1:]):
                for k, box in layout.boxes.items():
                    assert not segment_hits_box(a, b, box), (trial, (u, v), k)
        boxes = list(layout.boxes.values())
        for i, p in enumerate(boxes):  # and boxes never overlap
            for q in boxes[i + 1:]:
                assert abs(p.x - q.x) >= (p.w + q.w) / 2 or abs(p.y - q.y) >= (p.h + q.h) / 2


def test_segment_hits_box_sees_crossings() -> None:
    from jax_backend.layered import Box

    box = Box(0.0, 0.0, 1.0, 1.0)
    assert segment_hits_box((-2, 0), (2, 0), box) and segment_hits_box((-1, -1), (1, 1), box)
    assert not segment_hits_box((-2, 0.6), (2, 0.6), box) and not segment_hits_box((0.5, 2), (0.5, -2), box)


def test_draw_graph_without_graphviz_uses_the_layered_drawing(tmp_path: Path) -> None:
    program, _ = capture(two_dense, PARAMS, X)
    graph = program.graphs[0].graph
    names = dict(value_names(program, ("b0", "k0", "b1", "k1", "x")))
    path = draw_graph(graph, tmp_path / "g.png", "g", names, engine="layered")
    assert path.stat().st_size > 1000
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            draw_graph(graph, tmp_path / "dot.png", engine="graphviz")
        assert draw_graph(graph, tmp_path / "auto.png", engine="auto").stat().st_size > 1000
    else:
        assert draw_graph(graph, tmp_path / "dot.png", engine="graphviz").stat().st_size > 1000

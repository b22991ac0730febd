"""Model registry: NasRNN has Tensat's structure, every model builds, and names are checked."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from eqsat.cost import cost_model, graph_cost
from eqsat.paths import tensat_models_dir
from eqsat.models import FAMILIES, MODELS, UnknownModelError, build_model, lookup, nasrnn
from jax_backend.lower import to_jax


def test_nasrnn_has_tensats_shape() -> None:
    g = nasrnn()
    counts = g.op_counts()
    assert counts["matmul"] == 5 * 16  # eight x·W + h·U pairs per step
    assert counts["input"] == 6 and counts["weight"] == 5 * 16
    assert counts["tanh"] == 5 * 8 and counts["sigmoid"] == 5 * 5 and counts["relu"] == 5 * 2
    assert [g.shape(v) for v in g.outputs] == [(1, 512)]
    assert all(g.shape(n.inputs[1]) == (512, 512) for n in g.nodes if n.op == "matmul")


def test_nasrnn_small_lowers_and_matches_numpy() -> None:
    g = build_model("nasrnn-small")
    inputs = g.random_inputs(3)
    (want,) = g.evaluate(inputs)
    (got,) = jax.jit(to_jax(g))(inputs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(want) < 1)  # a tanh output


@pytest.mark.skipif(not tensat_models_dir().exists(), reason="shared data not present")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_registered_model_builds_and_has_a_cost(name: str) -> None:
    g = build_model(name)
    assert len(g.outputs) >= 1
    assert graph_cost(g, cost_model(device="h100")) > 0


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'resnet9000'; known models: nasrnn"):
        build_model("resnet9000")


@pytest.mark.parametrize("family", FAMILIES)
def test_one_lookup_and_one_error_for_every_family(family: str) -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'resnet9000'; known models: "):
        lookup("resnet9000", family)
    with pytest.raises(UnknownModelError, match="unknown model family"):
        lookup("nasrnn", "no-such-family")


def test_every_family_builds_by_name() -> None:
    from eqsat.ir import Graph
    from eqsat.models.jax_programs import JaxProgram

    assert isinstance(lookup("nasrnn-small").build(), Graph)
    assert isinstance(lookup("unity-mlp", "parallel").build(), Graph)
    program = lookup("attention", "jax").build()
    assert isinstance(program, JaxProgram) and program.name == "attention"


def test_a_graph_json_path_is_a_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = build_model("nasrnn-small")
    g.save(tmp_path / "g.json")
    assert build_model(str(tmp_path / "g.json")) == g


def test_fold_weights_precomputes_weight_only_values() -> None:
    from eqsat.ir import GraphBuilder
    from jax_backend.lower import fold_weights

    b = GraphBuilder()
    x = b.input("x", (2, 4))
    w1, w2 = b.weight("w1", (4, 3)), b.weight("w2", (4, 5))
    both = b.matmul(x, b.concat(1, w1, w2))
    g = b.build(b.split(both, 1, (3, 5)) + (b.relu(b.matmul(x, w1)),))
    values = g.random_inputs(1)
    folded, folded_values = fold_weights(g, values)
    assert folded.op_counts().get("concat", 0) == 0
    assert sorted(folded_values) == sorted(n.attr["name"] for _, n in folded.leaves())
    for want, got in zip(g.evaluate(values), jax.jit(to_jax(folded))(folded_values)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    m = cost_model(device="h100")
    assert graph_cost(g, m) == pytest.approx(graph_cost(folded, m))
    assert graph_cost(g, m, fold_weights=False) > graph_cost(g, m)


@pytest.mark.parametrize("name", ["bert-small", "resnext-small", "nasneta-small"])
def test_tensat_models_run_alike_in_numpy_and_jax(name: str) -> None:
    g = build_model(name)
    inputs = g.random_inputs(1)
    want = g.evaluate(inputs)
    got = jax.jit(to_jax(g))(inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(b))))


def test_tensat_models_have_tensats_structure() -> None:
    bert = build_model("bert").op_counts()
    assert bert["matmul"] == 8 * 6 and bert["weight"] == 8 * 4  # q, k, v, two batched products, the linear map
    resnext = build_model("resnext50")
    grouped = [n for n in resnext.nodes if n.op == "conv2d" and resnext.shape(n.inputs[0])[1] // resnext.shape(n.inputs[1])[1] == 32]
    assert len(grouped) == 16 and resnext.shape(resnext.outputs[0]) == (1, 2048, 7, 7)
    nas = build_model("nasneta")
    assert nas.op_counts()["concat"] == 3 * 6 and nas.shape(nas.outputs[0]) == (1, 5 * 1024, 7, 7)

"""TASO .model files: all five benchmark models load with the right structure, and malformed or
unsupported files fail with errors that name the file, line and op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eqsat.errors import GraphFormatError, UnknownOpError
from eqsat.ir import Graph
from eqsat.taso import load_taso_model, parse_blocks
from eqsat.paths import tensat_models_dir

MODELS_DIR = tensat_models_dir()

# (file, output shapes, op counts that identify the architecture)
EXPECTED = {
    "bts.model": ([(64, 1024)] * 9, {"matmul": 48, "transpose": 32, "reshape": 32, "relu": 1, "weight": 32}),
    "inceptionv3.model": ([(1, 2048, 1, 1)], {"conv2d": 94, "concat": 30, "poolmax": 5, "poolavg": 9}),
    "mobilenetv2.model": ([(1, 1000)], {"conv2d": 54, "batchnorm": 53, "relu": 36, "ewadd": 10, "poolavg": 1}),
    "squeezenet.model": ([(1, 1000)], {"conv2d": 26, "relu": 26, "concat": 8, "poolmax": 3, "poolavg": 1}),
    "vgg.model": ([(1, 1000)], {"conv2d": 16, "matmul": 3, "poolmax": 5, "relu": 18, "transpose": 3}),
}

needs_data = pytest.mark.skipif(not MODELS_DIR.exists(), reason=f"{MODELS_DIR} not present")


@needs_data
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_all_five_models_load(name: str) -> None:
    graph = load_taso_model(MODELS_DIR / name)
    outputs, counts = EXPECTED[name]
    assert [graph.shape(v) for v in graph.outputs] == outputs
    for op, n in counts.items():
        assert graph.op_counts().get(op, 0) == n, op
    assert "pool" not in "".join(n.attr["name"] for _, n in graph.leaves())
    # every leaf is read by something (pools' dummy weights are dropped)
    read = {v.node for n in graph.nodes for v in n.inputs}
    assert all(i in read for i, _ in graph.leaves())
    # and the graph survives a Graph JSON round trip unchanged
    assert Graph.from_json(graph.to_json()) == graph


@needs_data
def test_squeezenet_runs_in_the_interpreter() -> None:
    graph = load_taso_model(MODELS_DIR / "squeezenet.model")
    (out,) = graph.evaluate(graph.random_inputs(0))
    assert out.shape == (1, 1000) and np.all(np.isfinite(out))


@needs_data
def test_vgg_transposes_weights_for_the_classifier() -> None:
    graph = load_taso_model(MODELS_DIR / "vgg.model")
    transposes = [n for n in graph.nodes if n.op == "transpose"]
    assert {n.attr["perm"] for n in transposes} == {(1, 0)}
    assert transposes[0].shapes == ((25088, 4096),)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.model"
    path.write_text(text)
    return path


GOOD = "100\n0\n10:0\n2,4\n101\n1\n11:0\n4,3\n102\n18\n100:0,101:0\n0,2\n"


def test_a_small_file_loads(tmp_path: Path) -> None:
    graph = load_taso_model(_write(tmp_path, GOOD))
    assert graph.op_counts() == {"input": 1, "weight": 1, "matmul": 1}
    assert graph.shape(graph.outputs[0]) == (2, 3)
    assert [b.guid for b in parse_blocks(GOOD)] == [100, 101, 102]


def test_elementwise_ops_beyond_the_five_files(tmp_path: Path) -> None:
    text = GOOD + "103\n28\n102:0,102:0\n2,3\n104\n49\n103:0\n2,3\n105\n4\n104:0\n2,3\n"
    graph = load_taso_model(_write(tmp_path, text))
    assert graph.op_counts() == {"input": 1, "weight": 1, "matmul": 1, "ewsub": 1, "exp": 1}
    (out,) = graph.evaluate(graph.random_inputs(0))
    np.testing.assert_allclose(out, np.ones((2, 3)))  # exp(y - y), through a dropout


def test_blocks_out_of_order_are_sorted(tmp_path: Path) -> None:
    lines = GOOD.strip().split("\n")
    text = "\n".join(lines[8:] + lines[:8]) + "\n"
    assert load_taso_model(_write(tmp_path, text)).op_counts()["matmul"] == 1


def test_unsupported_op_names_op_and_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + "103\n38\n102:0\n2\n")
    with pytest.raises(UnknownOpError, match=r"m\.model:13: TASO op ReduceMean \(guid 103\) is not supported"):
        load_taso_model(path)


@pytest.mark.parametrize("text, message", [
    (GOOD + "103\n", "do not form four-line blocks"),
    (GOOD.replace("0,2", "0,3"), "output rank is 3 in the file but 2"),
    (GOOD.replace("100:0,101:0", "100:0,999:0"), "reads guid 999"),
    (GOOD.replace("4,3", "5,3"), "inner dimensions differ"),
    (GOOD.replace("2,4", "2,x"), "comma-separated integers"),
    (GOOD + "103\n8\n102:0\n2,4\n", "output dims are [2, 4] in the file but [2, 3]"),
    (GOOD + "102\n8\n101:0\n4,3\n", "guid 102 appears twice"),
    ("", "holds no ops"),
])
def test_malformed_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(GraphFormatError) as info:
        load_taso_model(_write(tmp_path, text))
    assert message in str(info.value) and "m.model" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GraphFormatError, match="cannot read TASO model"):
        load_taso_model(tmp_path / "nope.model")

"""Every input file a user can hand over, and every cache file on disk, fails with one clear error
or is recomputed: never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eqsat.errors import EGraphFormatError, EqsatError, GraphFormatError
from eqsat.extract import load_egraph
from eqsat.ir import Graph
from eqsat.taso import load_taso_model

GRAPH = {"nodes": [{"op": "input", "attrs": {"name": "x", "shape": [2, 3]}}, {"op": "relu", "inputs": [[0, 0]]}],
         "outputs": [[1, 0]]}


@pytest.mark.parametrize("loader", [load_egraph, Graph.load, load_taso_model])
@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"{\"nodes\": \"\xe9\"}", b"[" * 100_000 + b"]" * 100_000])
def test_bad_bytes_are_one_error(tmp_path: Path, loader: object, content: bytes) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(content)
    with pytest.raises(EqsatError):
        loader(path)  # type: ignore[operator]


@pytest.mark.parametrize("cost", ["1" + "0" * 400, "1e400", "-1e400", "NaN"])
def test_unrepresentable_costs_are_one_error(cost: str) -> None:
    text = '{"nodes": {"a": {"op": "x", "cost": COST, "eclass": "c", "children": []}}, "root_eclasses": ["c"]}'
    text = text.replace("COST", cost)
    with pytest.raises(EGraphFormatError, match="cost"):
        load_egraph(text)


@pytest.mark.parametrize("shape", [[2.5, 3], [True, 3], ["3", 2], [float("nan"), 2], "23", [float("inf"), 1]])
def test_non_integer_dimensions_are_rejected(shape: object) -> None:
    data = json.loads(json.dumps(GRAPH))
    data["nodes"][0]["attrs"]["shape"] = shape
    with pytest.raises(GraphFormatError, match="shape"):
        Graph.from_json(data)


def test_integral_float_dimensions_still_load() -> None:
    data = json.loads(json.dumps(GRAPH))
    data["nodes"][0]["attrs"]["shape"] = [2.0, 3]
    assert Graph.from_json(data).nodes[0].shapes == ((2, 3),)


WRONG_VALUES = ["0", "[]", "null", '"x"', '{"a": null}']


@pytest.mark.parametrize("content", WRONG_VALUES + [
    json.dumps({"name": "r", "status": None, "method": None}),
    json.dumps({"name": "r", "status": "proved", "method": "m", "shapes": [0]}),
    json.dumps({"name": "r", "status": "proved", "method": "m", "shapes": [{"x": [0]}]}),
    json.dumps({"name": "r", "status": "refuted", "method": "m", "counterexample": 3}),
    json.dumps({"name": "r", "status": "proved", "method": "m", "seconds": None}),
])
def test_verification_cache_with_wrong_values_is_a_miss(tmp_path: Path, content: str) -> None:
    from eqsat.rewrites.parser import parse_rule_text
    from eqsat.rewrites.verify_cache import VerificationCache

    cache = VerificationCache(tmp_path, "code")
    (rule,) = parse_rule_text("(ewadd ?x ?y) => (ewadd ?y ?x)")
    path = cache.path(rule, "options", False)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert cache.get(rule, "options", False) is None


@pytest.mark.parametrize("content", WRONG_VALUES + [
    json.dumps({"name": "cpu", "peak_flops_fp32": 0, "peak_flops_bf16": 0, "bandwidth": 0, "launch_s": 0}),
    json.dumps({"name": "cpu", "peak_flops_fp32": None, "peak_flops_bf16": 1, "bandwidth": 1, "launch_s": 1}),
    json.dumps({"name": "cpu", "peak_flops_fp32": -1, "peak_flops_bf16": 1, "bandwidth": 1, "launch_s": 1}),
])
def test_cpu_spec_cache_with_wrong_values_is_remeasured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        content: str) -> None:
    from eqsat import cost

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    (tmp_path / f"cpu-{cost._machine_key()}.json").write_text(content)
    spec = cost.calibrate_cpu()
    assert spec.peak_flops_fp32 > 0 and spec.bandwidth > 0 and spec.launch_s > 0


@pytest.mark.parametrize("content", WRONG_VALUES + ['{"k": 0, "j": -1, "i": [], "h": 2.5}'])
def test_measured_timing_cache_keeps_only_positive_seconds(tmp_path: Path, content: str) -> None:
    from jax_backend.measured_cost import _cached_timings

    path = tmp_path / "t.json"
    path.write_text(content)
    assert _cached_timings(path) == ({"h": 2.5} if '"h"' in content else {})

"""Regression tests for the second round of hostile probes (issue 27, part 2): cache writes through
planted symlinks, measured costs under a device label they were not taken on, Graph JSON that
egglog or numpy would choke on, a split rule error without file:line, numpy warnings on all-NaN
outputs, and extraction-gym's maxsat suite (negative costs)."""

from __future__ import annotations

import itertools
import json
import os
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from eqsat import cli
from eqsat.atomic_write import atomic_write_text
from eqsat.errors import EqsatError, ExtractionError, GraphFormatError, RuleParseError
from eqsat.extract import check_selection, load_egraph
from eqsat.extract.registry import EXTRACTORS, extract
from eqsat.extract.selection import Status
from eqsat.ir import Graph, GraphBuilder
from eqsat.paths import egraphs_dir
from eqsat.rewrites.parser import parse_rules

# --- cache writes ------------------------------------------------------------------------------


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return victim


def _plant(path: Path, victim: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim)


def test_atomic_write_replaces_a_symlink_at_the_target_and_never_follows_it(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    target = tmp_path / "cache" / "entry.json"
    _plant(target, victim)
    atomic_write_text(target, "{}")
    assert victim.read_text() == "precious"
    assert not target.is_symlink() and target.read_text() == "{}"
    assert sorted(p.name for p in target.parent.iterdir()) == ["entry.json"]  # no temporary file left


def test_atomic_write_leaves_no_temporary_file_when_the_rename_fails(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: object) -> None:
        raise OSError("no")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "entry.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_cpu_calibration_write_ignores_symlinks_at_predictable_names(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from eqsat import cost

    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path / "cache"))
    spec = cost.DEVICES["cpu-nominal"]
    monkeypatch.setattr(cost, "_measure_cpu", lambda: spec)
    victim = _victim(tmp_path)
    path = tmp_path / "cache" / f"cpu-{cost._machine_key()}.json"
    for name in (path.with_suffix(f".{os.getpid()}.tmp"), path.with_suffix(f".tmp{os.getpid()}"),
                 path.with_name(f".{path.name}.tmp")):
        _plant(name, victim)
    assert cost.calibrate_cpu(force=True) == spec
    assert victim.read_text() == "precious"
    assert json.loads(path.read_text())["name"] == spec.name


def test_measured_cost_write_ignores_symlinks_at_predictable_names(tmp_path: Path) -> None:
    from jax_backend.measured_cost import MeasuredModel

    model = MeasuredModel(cache_dir=tmp_path / "measured")
    victim = _victim(tmp_path)
    for name in (model.cache_file.with_suffix(f".tmp{os.getpid()}"),
                 model.cache_file.with_suffix(f".{os.getpid()}.tmp")):
        _plant(name, victim)
    model._table["relu|x"] = 1e-6
    model._dirty = 1
    model.save()
    assert victim.read_text() == "precious"
    assert json.loads(model.cache_file.read_text()) == {"relu|x": 1e-6}


# --- measured costs under a device label -------------------------------------------------------

_ON_CPU = jax.default_backend() == "cpu"


@pytest.mark.skipif(not _ON_CPU, reason="the refusal is of a GPU label on a CPU host")
@pytest.mark.parametrize("device", ["h100", "h200"])
def test_measured_refuses_a_gpu_label_on_a_cpu_host(device: str) -> None:
    import jax_backend  # noqa: F401 - registers "measured"
    from eqsat.cost import cost_model

    with pytest.raises(EqsatError, match=f"measured/{device}") as err:
        cost_model("measured", device)
    assert "\n" not in str(err.value)
    assert cost_model("measured", "cpu").device == "cpu"  # the device it times on is fine
    assert cost_model("roofline", device).device == device  # a roofline prices from the datasheet


def test_measured_check_accepts_the_device_it_times_on() -> None:
    from jax_backend.measured_cost import check_measuring_device

    check_measuring_device("current")
    dev = jax.devices()[0]
    kind = str(getattr(dev, "device_kind", "")).lower()
    for gpu in ("h100", "h200"):
        if dev.platform != "cpu" and gpu in kind.replace(" ", ""):
            check_measuring_device(gpu)
        elif dev.platform == "cpu" or any(g in kind.replace(" ", "") for g in ("h100", "h200")):
            with pytest.raises(EqsatError):
                check_measuring_device(gpu)


def _small_graph() -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (4, 8)), b.weight("w", (8, 8))
    return b.build([b.ewadd(b.matmul(x, w), b.matmul(x, w))])


@pytest.mark.skipif(not _ON_CPU, reason="the refusal is of a GPU label on a CPU host")
def test_optimize_with_measured_h100_on_a_cpu_host_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.json"
    _small_graph().save(path)
    assert cli.main(["optimize", str(path), "--cost-model", "measured", "--device", "h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "measured/h100" in err[0] and "Traceback" not in err[0]


# --- Graph JSON --------------------------------------------------------------------------------

def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = _small_graph().to_json()
    return doc


def test_graph_json_round_trips_and_a_missing_format_is_the_current_one() -> None:
    doc = _doc()
    assert Graph.from_json(doc) == _small_graph()
    del doc["format"]
    assert Graph.from_json(doc) == _small_graph()


@pytest.mark.parametrize("version", ["eqsat-graph-2", "eqsat-graph-0", 1, None, ["eqsat-graph-1"]])
def test_graph_json_with_an_unknown_format_version_is_refused(version: object) -> None:
    doc = _doc()
    doc["format"] = version
    with pytest.raises(GraphFormatError, match="unknown graph format"):
        Graph.from_json(doc)


@pytest.mark.parametrize("ref", [[0.7, 0], [0, 0.0], [True, 0], [0, False], ["0", 0], [0], [0, 0, 0], 0])
def test_graph_json_node_references_must_be_integer_pairs(ref: object) -> None:
    doc = _doc()
    doc["nodes"][2]["inputs"][0] = ref
    with pytest.raises(GraphFormatError, match="node reference"):
        Graph.from_json(doc)
    doc = _doc()
    doc["outputs"] = [ref]
    with pytest.raises(GraphFormatError, match="node reference"):
        Graph.from_json(doc)


@pytest.mark.parametrize("shape", [[2**40, 8], [2**41], [2**20, 2**20, 2], [-(2**62), 1]])
def test_graph_json_with_huge_dims_is_refused_up_front(shape: list[int]) -> None:
    doc = _doc()
    doc["nodes"][0]["attrs"]["shape"] = shape
    doc["nodes"][0]["shapes"] = [shape]
    with pytest.raises(GraphFormatError):
        Graph.from_json(doc)


def test_optimize_refuses_huge_dims_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc()
    for node in doc["nodes"]:
        node.pop("shapes")
    doc["nodes"][0]["attrs"]["shape"] = [2**40, 8]
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["optimize", str(path)]) == 2
    err = capsys.readouterr().err
    assert "2**40" in err and "panic" not in err.lower()


# --- rule files --------------------------------------------------------------------------------

def test_split_parts_in_a_one_output_rule_name_file_and_line() -> None:
    lines = ["# a comment", "(ewadd ?x ?y) => (ewadd ?y ?x)", "(ewadd ?x ?y) => (split_0 (split 0 (ewadd ?y ?x)))"]
    with pytest.raises(RuleParseError, match=r"^mine\.rules:3: split_0/split_1 may only appear in a two-output"):
        parse_rules(lines, "mine.rules")
    with pytest.raises(RuleParseError, match=r"^mine\.rules:1: split_0/split_1"):
        parse_rules(["(split_1 (split 1 ?x)) => ?x"], "mine.rules")


def test_split_parts_in_two_output_rules_still_parse() -> None:
    rule = ("(matmul 0 ?x ?w) ; (matmul 0 ?x ?v) => (split_0 (split 1 (matmul 0 ?x (concat 1 2 ?w ?v)))) ; "
            "(split_1 (split 1 (matmul 0 ?x (concat 1 2 ?w ?v))))")
    assert len(parse_rules([rule], "two.rules")) == 1
    pair = ["(matmul 0 ?x ?w) => (split_0 (split 1 (matmul 0 ?x (concat 1 2 ?w ?v))))",
            "(matmul 0 ?x ?v) => (split_1 (split 1 (matmul 0 ?x (concat 1 2 ?w ?v))))"]
    assert len(parse_rules(pair, "two_multi.rules", multi=True)) == 1


# --- numerics ----------------------------------------------------------------------------------

def _all_nan_graph() -> Graph:
    b = GraphBuilder()
    x, w = b.input("x", (4, 8)), b.weight("w", (8, 8))
    y = b.apply("log", [b.apply("neg", [x], {})[0]], {})[0]  # log of a negative number: NaN everywhere
    return b.build([b.ewadd(b.matmul(y, w), b.matmul(y, w))])


def test_all_nan_outputs_compare_without_numpy_warnings() -> None:
    from eqsat.pipeline import numerics_match

    graph = _all_nan_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ok, _ = numerics_match(graph, graph)
    assert ok


def test_optimize_with_all_nan_outputs_warns_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    _all_nan_graph().save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert cli.main(["optimize", str(path), "--repeats", "1"]) in (0, 2)


def test_decorator_on_an_all_nan_function_warns_nothing() -> None:
    import jax.numpy as jnp

    import eqsat

    def f(x: jax.Array, w: jax.Array, v: jax.Array) -> jax.Array:
        y = jnp.log(-jnp.abs(x) - 1.0)
        return y @ w + y @ v  # two matmuls of y: a merge candidate whose outputs are compared

    x = np.ones((4, 8), np.float32)
    w = np.ones((8, 8), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = eqsat.optimize(check_speed=False)(f)(x, w, w)
    assert np.isnan(np.asarray(out)).all()
    leaked = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) or "Warning" in str(w.message)]
    assert leaked == []


# --- negative costs: extraction-gym's maxsat suite -------------------------------------------

def maxsat_egraph(n_vars: int, clauses: list[list[int]]) -> dict[str, Any]:
    """extraction-gym's MaxSAT encoding: the root needs every variable's class; a variable is
    chosen true (var_p) or false (var_n), and each literal's node points at the clauses it
    satisfies, each a class with one node of cost -1. The DAG cost is minus the number of
    satisfied clauses."""
    nodes: dict[str, Any] = {"0.0": {"op": "root", "cost": 0.0, "eclass": "0",
                                     "children": [f"{v}.0" for v in range(1, n_vars + 1)]}}
    base = n_vars + 1
    for v in range(1, n_vars + 1):
        for sign, idx in ((1, 0), (-1, 1)):
            kids = [f"{base + j}.0" for j, cl in enumerate(clauses) if sign * v in cl]
            nodes[f"{v}.{idx}"] = {"op": f"var_{'p' if sign > 0 else 'n'}{v}", "cost": 0.0, "eclass": str(v),
                                   "children": kids}
    for j in range(len(clauses)):
        nodes[f"{base + j}.0"] = {"op": f"clause_{j}", "cost": -1.0, "eclass": str(base + j), "children": []}
    return {"nodes": nodes, "root_eclasses": ["0"]}


def best_maxsat(n_vars: int, clauses: list[list[int]]) -> int:
    """Most clauses any assignment satisfies (brute force)."""
    return max(sum(any((lit > 0) == bits[abs(lit) - 1] for lit in cl) for cl in clauses)
               for bits in itertools.product([False, True], repeat=n_vars))


def _random_cnf(seed: int, n_vars: int, n_clauses: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(v) * int(rng.choice([-1, 1])) for v in rng.choice(np.arange(1, n_vars + 1), 3, replace=False)]
            for _ in range(n_clauses)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("extractor", ["ilp", "tensat-ilp"])
def test_the_ilps_solve_small_maxsat_egraphs_exactly(seed: int, extractor: str) -> None:
    n_vars, clauses = 8, _random_cnf(seed, 8, 40)
    eg = load_egraph(maxsat_egraph(n_vars, clauses))
    sel = extract(eg, extractor, 30.0)
    assert not check_selection(eg, sel)
    assert sel.status == Status.OPTIMAL
    assert sel.dag_cost == -best_maxsat(n_vars, clauses)
    assert sel.gap == 0.0


def test_dominance_is_off_under_negative_costs() -> None:
    """var_n1 has no children and var_p1 satisfies the only clause: with dominance var_n1 (cost 0,
    no children) would be kept instead of var_p1, and the answer would be 0, not -1."""
    eg = load_egraph(maxsat_egraph(1, [[1]]))
    for name in ("ilp", "tensat-ilp"):
        assert extract(eg, name, 10.0).dag_cost == -1.0


@pytest.mark.parametrize("name", sorted(n for n, e in EXTRACTORS.items() if not e.accepts_negative_costs))
def test_strategies_that_assume_non_negative_costs_refuse_in_one_line(name: str) -> None:
    eg = load_egraph(maxsat_egraph(3, [[1, 2], [-1, 3]]))
    with pytest.raises(ExtractionError, match="assumes non-negative costs") as err:
        extract(eg, name, 5.0)
    assert "\n" not in str(err.value) and "ilp" in str(err.value)


def test_eqsat_extract_ilp_json_on_a_maxsat_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n_vars, clauses = 7, _random_cnf(11, 7, 30)
    path = tmp_path / "small.json"
    path.write_text(json.dumps(maxsat_egraph(n_vars, clauses)))
    assert cli.main(["extract", str(path), "--extractor", "ilp", "--json", "--time-limit", "20"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["valid"] and row["status"] == "optimal"
    assert row["cost"] == -best_maxsat(n_vars, clauses)
    assert cli.main(["extract", str(path), "--extractor", "bottom-up"]) == 2
    assert "assumes non-negative costs" in capsys.readouterr().err


def _satisfied(data: dict[str, Any], chosen: dict[str, str]) -> int:
    """Clauses satisfied by the assignment the selection's var_p / var_n nodes spell."""
    nodes = data["nodes"]
    ops = [nodes[n]["op"] for n in chosen.values()]
    true = {int(op[5:]) for op in ops if op.startswith("var_p")}
    lits: dict[str, list[int]] = {}
    for node in nodes.values():
        op = node["op"]
        if op.startswith("var_"):
            v = int(op[5:])
            for kid in node["children"]:
                lits.setdefault(nodes[kid]["eclass"], []).append(v if op[4] == "p" else -v)
    return sum(any((lit > 0) == (abs(lit) in true) for lit in ls) for ls in lits.values())


MAXSAT = sorted((egraphs_dir() / "maxsat").glob("*.json"))


@pytest.mark.skipif(not MAXSAT, reason="extraction-gym's maxsat suite is not in the shared data (egraphs/maxsat)")
def test_real_maxsat_file_gives_a_valid_selection_whose_cost_counts_satisfied_clauses() -> None:
    path = min(MAXSAT, key=lambda p: p.stat().st_size)
    data = json.loads(path.read_text())
    eg = load_egraph(data)
    sel = extract(eg, "ilp", 5.0)
    assert not check_selection(eg, sel)
    assert sel.dag_cost == -_satisfied(data, sel.as_ids(eg))
    assert sel.lower_bound is None or sel.lower_bound <= sel.dag_cost + 1e-6

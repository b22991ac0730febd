"""Graph ↔ egglog terms, and the e-graph → E-graph JSON serializer.

`TensorEGraph.from_graph` puts a `Graph` in a fresh egglog e-graph (one constructor per IR op,
attributes as the egglog sorts of `egglog_schema.ATTR_SORTS`, splits as slices, variadic concats as
nested binary ones) and computes every e-class's shape inside egglog, leaves' included. `serialize` writes the egraph-serialize JSON that
every extractor reads, keeping tensor terms only, with a cost per node from a cost model and the
shape of every class in `class_data`; `decode` turns a selection on that JSON back into a `Graph`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from egglog import bindings

from eqsat import ops
from eqsat.context import ContextAnalysis, ENode, ENodes, InContextCostModel
from eqsat.cost import CostModel, typed_op_cost
from eqsat.egglog_schema import (
    BINARY_ONLY,
    DTYPE_FUNCTION,
    ENCODED_AS,
    INPUT_ORDER_FUNCTION,
    NEXT_SIBLING_RELATION,
    SHAPE_RULESET,
    TERM_SORT,
    attr_literal,
    attr_names,
    check_encodable,
    constructor,
    declarations,
    shape_rules,
    term_ops,
)
from eqsat.errors import EGraphFormatError, EqsatError, RuleError, ShapeError
from eqsat.ir import Graph, GraphBuilder, Node, Tensor, Value
from eqsat.rewrites.rule import Signature, signature

__all__ = ["TensorEGraph", "carry_selection", "congruence_closed", "decode", "EGRAPH_FORMAT"]

EGRAPH_FORMAT = "eqsat-egraph-1"


class TensorEGraph:
    """An egglog e-graph holding one tensor program; owns the egglog state (so it is not frozen).

    `program` records every command run so far, so a failed run can be replayed to find its cause.
    """

    def __init__(self, graph: Graph, outputs: tuple[str, ...], program: list[str], egraph: bindings.EGraph,
                 shape_ops: frozenset[str] = frozenset(term_ops())) -> None:
        self.graph = graph
        self.program = program
        self.output_globals = outputs
        self.egglog = egraph
        self.installed_rulesets: dict[str, tuple[str, ...]] = {}
        self.shape_ops = shape_ops  # the ops whose shape rules are declared

    # --- encoding ----------------------------------------------------------------------------

    @staticmethod
    def encoding_program(graph: Graph) -> tuple[list[str], tuple[str, ...], dict[str, Value]]:
        """egglog commands that build the graph's terms; returns them, the output globals, and the
        IR value each global stands for (to name the node whose shape egglog cannot infer)."""
        lines: list[str] = []
        names: dict[Value, str] = {}
        value_of: dict[str, Value] = {}
        counter = 0

        def fresh(expr: str, value: Value | None) -> str:
            nonlocal counter
            g = f"$g{counter}"
            lines.append(f"(let {g} {expr})")
            lines.append(f"(set (uid {g}) {counter})")
            lines.append(f"(set ({INPUT_ORDER_FUNCTION} {g}) {counter})")
            if value is not None:
                value_of[g] = value
            counter += 1
            return g

        for i, node in enumerate(graph.nodes):
            check_encodable(node.op, f"graph node {i}")
            attrs = node.attr
            if node.op == "split":
                start = 0
                for k, size in enumerate(attrs["sizes"]):
                    expr = f"({constructor('slice')} {attrs['axis']} {start} {start + size} {names[node.inputs[0]]})"
                    names[Value(i, k)] = fresh(expr, Value(i, k))
                    start += size
                continue
            head = [attr_literal(node.op, a, attrs[a]) for a in attr_names(node.op)]
            args = [names[v] for v in node.inputs]
            if node.op in BINARY_ONLY:
                acc = args[0]
                for k, arg in enumerate(args[1:], start=2):
                    last = Value(i, 0) if k == len(args) else None
                    acc = fresh(f"({constructor(node.op)} {' '.join(head)} {acc} {arg})", last)
                names[Value(i, 0)] = acc
                continue
            names[Value(i, 0)] = fresh(f"({constructor(node.op)} {' '.join([*head, *args])})", Value(i, 0))
        lines += [f"({NEXT_SIBLING_RELATION} {names[a]} {names[b]})" for a, b in next_siblings(graph)]
        lines.append(f"(run-schedule (saturate {SHAPE_RULESET}))")
        return lines, tuple(names[v] for v in graph.outputs), value_of

    @classmethod
    def from_graph(cls, graph: Graph, rule_ops: Collection[str] | None = None) -> TensorEGraph:
        """The e-graph of `graph`. `rule_ops`: the ops the rules to be run use (`to_egglog.rule_ops`);
        only those and the graph's own get shape rules (more are declared when rules need them, see
        `declare_ops`). None declares every op's."""
        body, outputs, value_of = cls.encoding_program(graph)
        shape_ops = frozenset(term_ops()) if rule_ops is None else frozenset(
            {ENCODED_AS.get(n.op, n.op) for n in graph.nodes} | set(rule_ops))
        egraph = bindings.EGraph()
        program = [declarations(shape_ops), *body]
        try:
            egraph.run_program(*egraph.parse_program("\n".join(program)))
        except bindings.EggSmolError as exc:
            raise ShapeError(f"encoding the graph in egglog failed: {exc}") from None
        tensor = cls(graph, outputs, program, egraph, shape_ops)
        tensor.check_shapes_match(graph, value_of)
        return tensor

    def declare_ops(self, ops: Collection[str]) -> None:
        """Declare the shape rules of those of `ops` that lack them (before rules using them run)."""
        missing = frozenset(ops) - self.shape_ops
        if missing:
            self.run(shape_rules(missing), record=True)
            self.shape_ops |= missing

    def check_shapes_match(self, graph: Graph, value_of: Mapping[str, Value]) -> None:
        """egglog's shape analysis must give every encoded value the IR's shape (else a table bug,
        or a rank beyond `MAX_RANK`); the error names the graph node. All shapes are read in one
        egglog call (one per value took ~0.05 s on NasNet-A), one by one only if that fails."""
        names = list(value_of)
        try:
            outs = self.run("\n".join(f"(extract (shape {g}))" for g in names))
        except bindings.EggSmolError:
            outs = []
        read = [_shape_from_text(str(o)) for o in outs] if len(outs) == len(names) else None
        for i, (g, value) in enumerate(value_of.items()):
            got = read[i] if read is not None else self.shape_of(g)
            if got != graph.shape(value):
                node = graph.nodes[value.node]
                found = "no shape" if got is None else f"shape {got}"
                raise ShapeError(f"egglog infers {found} for graph node {value.node} ({node.op}, output {value.index}), "
                                 f"the IR {graph.shape(value)}")

    def shape_of(self, global_name: str) -> tuple[int, ...] | None:
        try:
            out = self.run(f"(extract (shape {global_name}))")
        except bindings.EggSmolError:
            return None
        return _shape_from_text(str(out[-1]) if out else "")

    # --- running --------------------------------------------------------------------------------

    def run(self, text: str, record: bool = False) -> list[Any]:
        """Run egglog program text on this e-graph (`record`: keep it in `program` for replays)."""
        out = list(self.egglog.run_program(*self.egglog.parse_program(text)))
        if record:
            self.program.append(text)
        return out

    def rewind(self, length: int) -> None:
        """Rebuild the e-graph from the first `length` recorded commands (egglog is deterministic):
        undoes what followed without the cost of saving a copy before it (egglog `push`)."""
        fresh = bindings.EGraph()
        fresh.run_program(*fresh.parse_program("\n".join(self.program[:length])))
        self.egglog = fresh
        del self.program[length:]

    def function_sizes(self) -> dict[str, int]:
        out = self.run("(print-size)")
        sizes = out[0].sizes if out and isinstance(out[0], bindings.PrintAllFunctionsSize) else []
        return {str(name): int(n) for name, n in sizes}

    def num_enodes(self) -> int:
        """Tensor-term e-nodes (constructor rows), not analysis rows."""
        return tensor_enodes(self.function_sizes())

    def num_eclasses(self) -> int:
        """E-classes with a known shape: every tensor class has exactly one `shape` row."""
        return self.function_sizes().get("shape", 0)

    # --- serialization ----------------------------------------------------------------------------

    def serialize(self, cost_model: CostModel, fold_weights: bool = True, context: ContextAnalysis | None = None,
                  scale: float = 1.0) -> dict[str, Any]:
        """E-graph JSON: tensor nodes only, roots filled, per-node cost, class shapes in class_data.

        `fold_weights` applies TASO/Tensat's convention that an op whose inputs are all weights
        (or computed from weights only) is precomputed once and costs nothing per run.
        With `context` (see eqsat.context) the nodes it leaves out are not serialized, the others
        are priced in context by `cost_model` (an `InContextCostModel`), with their row terms
        (`rows`); `scale`: cost units per second.

        Extra keys (`format`, `outputs`, node `attrs`, class `shape`) let `decode` rebuild a Graph
        from the JSON alone; extractors ignore them.
        """
        roots: list[bindings.Lit | bindings.Var | bindings.Call] = [
            bindings.Var(bindings.PanicSpan(), g) for g in self.output_globals]
        try:
            raw = json.loads(self.egglog.serialize(roots).to_json())
        except bindings.EggSmolError as exc:
            raise EqsatError(f"egglog could not serialize the e-graph: {exc}") from None
        return convert_serialized(raw, cost_model, self.graph, fold_weights, context, scale)


def tensor_enodes(function_sizes: Mapping[str, int]) -> int:
    """Tensor-term e-nodes in egglog's rows per function (`print-size`): constructor rows only."""
    tensor_ctors = {constructor(op) for op in ops.OPS}
    return sum(n for name, n in function_sizes.items() if name in tensor_ctors)


def _shape_from_text(text: str) -> tuple[int, ...] | None:
    """The shape in egglog's printed `(vec-of ...)` / `(vec-empty)` (None if it is not one)."""
    if "vec-of" not in text and "vec-empty" not in text:
        return None
    inner = text[text.index("(") + 1: text.rindex(")")].replace("vec-of", "").replace("vec-empty", "")
    return tuple(int(tok) for tok in inner.split() if tok.lstrip("-").isdigit())


def encoded_signatures(graph: Graph) -> set[Signature]:
    """The signatures of the e-nodes `from_graph` puts in (splits become slices), for
    `rules_that_can_match`; leaves are left out (no rule matches one)."""
    out: set[Signature] = set()
    for node in graph.nodes:
        if ops.OPS[node.op].is_leaf:
            continue
        if node.op == "split":
            out.add(signature("slice", {"axis": node.attr["axis"]}, ("start", "stop")))
        else:
            out.add(signature(node.op, node.attr))
    return out


def next_siblings(graph: Graph) -> list[tuple[Value, Value]]:
    """(a, b) where two ops of `graph` are alike but for the operand at one position (same op,
    attributes and other operands: q, k and v's matmuls on one x), a there and b in the next such op.

    The `(next ?a ?b)` rule condition reads these, so n-ary merges extend runs of siblings only:
    n - k + 1 k-way merges of n siblings instead of all C(n, k) subsets (on NasRNN, eight gates on one
    input made 126 three- and four-way merges per input, none of which paid). Ops with one operand,
    n-ary concats and splits have no siblings."""
    groups: dict[tuple[Any, ...], list[Value]] = {}
    for node in graph.nodes:
        if len(node.inputs) < 2 or node.op in BINARY_ONLY or node.op == "split":
            continue
        for p, value in enumerate(node.inputs):
            key = (node.op, node.attrs, p, node.inputs[:p], node.inputs[p + 1:])
            groups.setdefault(key, []).append(value)
    return [(a, b) for run in groups.values() for a, b in zip(run, run[1:]) if a != b]


def _primitive_value(node: Mapping[str, Any], nodes: Mapping[str, Any]) -> Any:
    op = node["op"]
    if op.startswith('"'):
        return json.loads(op)
    if op in ("vec-of", "vec-empty"):
        return [_primitive_value(nodes[c], nodes) for c in node["children"]]
    try:
        return int(op)
    except ValueError:
        return float(op)  # an f64 (egglog prints the shortest text that reads back exactly)


def constant_classes(nodes: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Classes computable from weights alone: a weight, or any node whose children all are
    (`ops.weight_derived`, as `eqsat.cost.weight_only_nodes` for a graph)."""
    return set(ops.weight_derived((n["eclass"], n["op"], [nodes[c]["eclass"] for c in n["children"]])
                                  for n in nodes.values()))


def congruence_closed(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """egglog's serialize output with congruent nodes' classes merged.

    egglog 14 can leave a function row whose child id went stale (a union its rebuild did not
    revisit): serialized, that node sits in a class of its own, congruent to another class's node,
    and shape rules (which look the stale id up) never give it a shape. Equal nodes are equal terms,
    so merging their classes is sound; it is done here to a fixpoint (a union merges parents too).
    Returns `raw` itself when nothing is congruent."""
    nodes: Mapping[str, Any] = raw["nodes"]
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        root = c
        while parent.get(root, root) != root:
            root = parent[root]
        while c != root:
            parent[c], c = root, parent[c]
        return root

    eclass = {nid: node["eclass"] for nid, node in nodes.items()}
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    for node in nodes.values():  # the first pass, before any merge: no `find` needed
        key = (node["op"], tuple([eclass[c] for c in node["children"]]))
        here = node["eclass"]
        there = seen.setdefault(key, here)
        if here != there:
            a, b = find(here), find(there)
            if a != b:
                parent[max(a, b)] = min(a, b)
    if not parent:
        return raw
    changed = True
    while changed:
        changed = False
        seen = {}
        for node in nodes.values():
            key = (node["op"], tuple(find(nodes[c]["eclass"]) for c in node["children"]))
            here, there = find(node["eclass"]), seen.setdefault(key, find(node["eclass"]))
            if here != there:
                parent[max(here, there)] = min(here, there)
                changed = True
    merged = {nid: {**node, "eclass": find(node["eclass"])} for nid, node in nodes.items()}
    return {**raw, "nodes": merged, "root_eclasses": [find(c) for c in raw["root_eclasses"]]}


def convert_serialized(raw: Mapping[str, Any], cost_model: CostModel, graph: Graph, fold_weights: bool = True,
                       context: ContextAnalysis | None = None, scale: float = 1.0) -> dict[str, Any]:
    """egglog's serialize output → our E-graph JSON (see `TensorEGraph.serialize`)."""
    raw = congruence_closed(raw)
    nodes: Mapping[str, Any] = raw["nodes"]
    class_type = {cid: data.get("type") for cid, data in raw.get("class_data", {}).items()}
    tensor_ctors = {constructor(op): op for op in ops.OPS}
    vec_value: dict[str, tuple[int, ...]] = {}
    for node in nodes.values():
        if node["op"] in ("vec-of", "vec-empty") and node["eclass"] not in vec_value:
            vec_value[node["eclass"]] = tuple(_primitive_value(node, nodes))
    class_shape: dict[str, tuple[int, ...]] = {}  # tensor class → its shape
    for node in nodes.values():
        if node["op"] == "shape":
            cid, shape = nodes[node["children"][0]]["eclass"], vec_value[node["eclass"]]
            if class_shape.setdefault(cid, shape) != shape:  # only after `congruence_closed` merged two classes
                raise RuleError(f"e-class {cid} has two shapes, {class_shape[cid]} and {shape}: a rule equated "
                                "terms of different shapes")

    strings = {n["eclass"]: json.loads(n["op"]) for n in nodes.values() if n["op"].startswith('"')}
    class_dtype = {nodes[n["children"][0]]["eclass"]: strings[n["eclass"]]  # tensor class → its dtype (analysis)
                   for n in nodes.values() if n["op"] == DTYPE_FUNCTION and n["eclass"] in strings}
    out_nodes: dict[str, dict[str, Any]] = {}
    costs: dict[tuple[Any, ...], float] = {}  # many nodes share op, attributes and shapes (BERT: 10k nodes, ~100 kinds)
    names = {op: attr_names(op) for op in tensor_ctors.values()}
    prim: dict[str, Any] = {}  # child node → its value, hashable (nodes share a few literals)
    for nid, node in nodes.items():
        op = tensor_ctors.get(node["op"])
        cls = node["eclass"]
        if op is None or class_type.get(cls) != TERM_SORT:
            continue
        tensor_kids, values = [], []
        for c in node["children"]:
            if class_type.get(nodes[c]["eclass"]) == TERM_SORT:
                tensor_kids.append(c)
            else:
                value = prim.get(c)
                if value is None:
                    value = _primitive_value(nodes[c], nodes)
                    value = prim[c] = tuple(value) if isinstance(value, list) else value
                values.append(value)
        if cls not in class_shape:
            raise RuleError(f"e-class {cls} (node {nid}, {op}) has no shape: a rule built an ill-typed term")
        in_shapes = [class_shape[nodes[c]["eclass"]] for c in tensor_kids]
        in_dtypes = tuple(class_dtype.get(nodes[c]["eclass"], ops.DEFAULT_DTYPE) for c in tensor_kids)
        key = (op, tuple(values), tuple(in_shapes), in_dtypes)
        attrs: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in zip(names[op], values)}
        cost = costs.get(key) if context is None else 0.0  # in context: priced below
        if cost is None:
            cost = costs[key] = 0.0 if ops.OPS[op].is_leaf else scale * typed_op_cost(cost_model, op, attrs, in_shapes,
                                                                                       in_dtypes)
        out_nodes[nid] = {"op": op, "children": tensor_kids, "eclass": cls, "cost": cost, "attrs": attrs}
    left_out: dict[str, int] = {}
    if context is not None:
        out_nodes, left_out = _in_context(out_nodes, class_shape, cost_model, context, scale)
    if fold_weights:
        constant = constant_classes(out_nodes)
        for node in out_nodes.values():
            if all(out_nodes[c]["eclass"] in constant for c in node["children"]):
                node["cost"] = 0.0
    used = {n["eclass"] for n in out_nodes.values()}
    outputs = list(raw["root_eclasses"])
    class_data = {c: {"type": TERM_SORT, "shape": list(class_shape[c])} for c in used}
    return {
        "format": EGRAPH_FORMAT,
        "nodes": out_nodes,
        "root_eclasses": list(dict.fromkeys(outputs)),
        "outputs": outputs,
        "class_data": class_data,
        "leaves": {name: list(shape) for name, shape in graph.leaf_shapes().items()},
        **({"leaf_dtypes": dtypes} if (dtypes := {name: d for name, d in graph.leaf_dtypes().items()
                                                   if d != ops.DEFAULT_DTYPE}) else {}),
        **({"left_out": left_out} if context is not None else {}),
    }


def _in_context(nodes: dict[str, dict[str, Any]], class_shape: Mapping[str, tuple[int, ...]], model: CostModel,
                context: ContextAnalysis, scale: float) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The nodes `context` keeps, priced by `model` in context (cost and `rows`), children pointed at
    a kept node of the same class; and how many nodes and classes were left out."""
    if not isinstance(model, InContextCostModel):
        raise EqsatError(f"cost model {model.name!r} cannot price nodes in context (it has no `price`)")
    enodes = ENodes({nid: ENode(n["op"], n["attrs"], n["eclass"], tuple(nodes[c]["eclass"] for c in n["children"]))
                     for nid, n in nodes.items()}, class_shape)
    facts = context(enodes)
    keep = {nid: dict(n) for nid, n in nodes.items() if nid in facts.kept}
    member = {n["eclass"]: nid for nid, n in keep.items()}
    for nid, n in keep.items():
        if any(nodes[c]["eclass"] not in member for c in n["children"]):
            raise EqsatError(f"the context analysis kept node {nid} ({n['op']}) but left out all of an input's class")
        price = model.price(facts.node(enodes, nid))
        n["cost"] = price.seconds * scale
        n["rows"] = dict(price.rows)
        n["children"] = [c if c in keep else member[nodes[c]["eclass"]] for c in n["children"]]
    classes = {n["eclass"] for n in nodes.values()}
    return keep, {"nodes": len(nodes) - len(keep), "classes": len(classes) - len(member)}


def decode(egraph_json: Mapping[str, Any], selection: Mapping[str, str] | Any) -> Graph:
    """Rebuild the selected program as a Graph; shapes are re-inferred and checked against the e-graph.

    `selection` maps class id → node id (strings, as in the JSON) or is an extractor `Selection`
    (then the JSON is loaded to map its indices back to ids). Leaves keep their names; every leaf
    of the original graph stays an input of the result, so the signature does not change.
    """
    if not isinstance(selection, Mapping):
        from eqsat.extract.egraph_data import load_egraph

        selection = selection.as_ids(load_egraph(egraph_json))
    nodes: Mapping[str, Any] = egraph_json["nodes"]
    class_data: Mapping[str, Any] = egraph_json.get("class_data", {})
    builder = GraphBuilder()
    built: dict[str, Tensor] = {}
    leaf_op = {n["attrs"]["name"]: n["op"] for n in nodes.values() if ops.OPS[n["op"]].is_leaf}
    leaf_dtype: Mapping[str, str] = egraph_json.get("leaf_dtypes", {})  # absent: float32
    leaf_tensor: dict[str, Tensor] = {
        name: builder.apply(leaf_op.get(name, "input"), [], {"name": name, "shape": tuple(shape),
                                                             "dtype": leaf_dtype.get(name, ops.DEFAULT_DTYPE)})[0]
        for name, shape in egraph_json.get("leaves", {}).items()
    }

    def choose(cid: str) -> Mapping[str, Any]:
        nid = selection.get(cid)
        if nid is None:
            raise EGraphFormatError(f"decode: class {cid} is needed but the selection chooses no node for it")
        node = nodes.get(nid)
        if node is None or node["eclass"] != cid:
            raise EGraphFormatError(f"decode: the selection picks node {nid!r} for class {cid}, which is not in it")
        return node

    def child_class(nid: str) -> str:
        return str(nodes[nid]["eclass"])

    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for root in egraph_json["outputs"]:
        stack = [(str(root), False)]
        while stack:
            cid, expanded = stack.pop()
            if state.get(cid) == 2:
                continue
            node = choose(cid)
            if not expanded:
                if state.get(cid) == 1:
                    raise EGraphFormatError(f"decode: the selection has a cycle through class {cid}")
                state[cid] = 1
                stack.append((cid, True))
                for ch in reversed(node["children"]):
                    c = child_class(ch)
                    if state.get(c) == 1:
                        raise EGraphFormatError(f"decode: the selection has a cycle through class {c}")
                    if state.get(c) != 2:
                        stack.append((c, False))
                continue
            op, attrs = node["op"], dict(node.get("attrs", {}))
            if ops.OPS[op].is_leaf:
                tensor = leaf_tensor.get(attrs["name"])
                if tensor is None:
                    tensor = builder.apply(op, [], {"name": attrs["name"], "shape": tuple(attrs["shape"]),
                                                    "dtype": attrs.get("dtype", ops.DEFAULT_DTYPE)})[0]
                    leaf_tensor[attrs["name"]] = tensor
            else:
                args = [built[child_class(ch)] for ch in node["children"]]
                try:
                    tensor = builder.apply(op, args, attrs)[0]
                except ShapeError as exc:
                    raise EGraphFormatError(f"decode: class {cid} ({op}) does not type-check: {exc}") from None
            want = class_data.get(cid, {}).get("shape")
            if want is not None and tuple(want) != tensor.shape:
                raise EGraphFormatError(f"decode: class {cid} ({op}) has shape {tensor.shape}, the e-graph says {tuple(want)}")
            built[cid] = tensor
            state[cid] = 2
    return flatten_concats(builder.build([built[str(c)] for c in egraph_json["outputs"]]))


def carry_selection(old: Mapping[str, Any], selection: Mapping[str, str], new: Mapping[str, Any]) -> dict[str, str] | None:
    """A selection of the e-graph `old` as one of `new`, an e-graph grown from it by rewriting
    (which only adds nodes and merges classes): each chosen node is found in `new` by its op, attrs
    and its children's classes. None when one is missing (e.g. `new` left it out); the result may
    still be cyclic where `old` classes were merged, so check it before use."""
    old_nodes: Mapping[str, Any] = old["nodes"]
    new_nodes: Mapping[str, Any] = new["nodes"]

    def key(node: Mapping[str, Any], kids: tuple[str, ...]) -> tuple[str, str, tuple[str, ...]]:
        return node["op"], json.dumps(node.get("attrs", {}), sort_keys=True), kids

    index = {key(n, tuple(str(new_nodes[c]["eclass"]) for c in n["children"])): nid for nid, n in new_nodes.items()}
    moved: dict[str, str] = {}  # old class -> new class
    carried: dict[str, str] = {}
    entered: set[str] = set()
    for root in old["outputs"]:
        stack = [(str(root), False)]
        while stack:
            cid, expanded = stack.pop()
            if cid in moved:
                continue
            nid = selection.get(cid)
            if nid is None or nid not in old_nodes:
                return None
            kids = [str(old_nodes[c]["eclass"]) for c in old_nodes[nid]["children"]]
            if not expanded:
                if cid in entered or any(k in entered and k not in moved for k in kids):
                    return None  # a cycle in the old selection
                entered.add(cid)
                stack.append((cid, True))
                stack.extend((k, False) for k in kids if k not in moved)
                continue
            found = index.get(key(old_nodes[nid], tuple(moved[k] for k in kids)))
            if found is None:
                return None
            moved[cid] = str(new_nodes[found]["eclass"])
            carried.setdefault(moved[cid], found)
    return carried


def flatten_concats(graph: Graph) -> Graph:
    """Undo the encoder's nesting of variadic concats (`BINARY_ONLY`): a concat reading a concat on
    the same axis that nothing else reads takes that concat's inputs instead, so the decoded graph
    writes an n-ary concat once, as the IR did, and is not charged for the intermediate ones."""
    uses = Counter(v for n in graph.nodes for v in n.inputs) + Counter(graph.outputs)
    nodes = list(graph.nodes)
    for i, node in enumerate(nodes):
        if node.op not in BINARY_ONLY:
            continue
        flat: list[Value] = []
        for v in node.inputs:
            inner = nodes[v.node]
            if inner.op == node.op and inner.attrs == node.attrs and uses[v] == 1:
                flat.extend(inner.inputs)
            else:
                flat.append(v)
        if len(flat) != len(node.inputs):
            nodes[i] = Node(node.op, node.attrs, tuple(flat), node.shapes)
    return Graph(tuple(nodes), graph.outputs).live()


"""gpt12/gpt-block: per plan node, compiled copy bytes (op_name scope op.i) against the model's predicted copies."""
import json, re, sys
from collections import defaultdict
from dataclasses import replace
import numpy as np
from eqsat.ir import Graph
from eqsat import ops
from eqsat.models import build_parallel_model
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.calibration import calibrated_model, MeshCalibration
from eqsat.parallel.planner import graph_axes, replicated_weights
from eqsat.context import NodeInContext, ValueContext
from jax_backend.checks import _scaled_inputs
from jax_backend.shard import shard_plan, step_program, _shape_bytes

case, timing = sys.argv[1], sys.argv[2]
S = "/work/main/docs/data/parallel_spearman/s19"
cal = MeshCalibration.from_json(json.load(open(f"{S}/cal_N.json")))
model = calibrated_model(cal, overlap=False)
mesh = parse_mesh("2x4")
graph = build_parallel_model(case)
weights = [n.attr["name"] for _, n in graph.leaves("weight")]
plans = [Graph.from_json(p) for p in json.load(open(f"{S}/{timing}/{case}/parallel_spearman_plans_{case}.json"))]
COPY = re.compile(r"^\s*%?(\S+)\s*=\s*(\S+)\s+copy\((\S+)")
out = []
for k, plan in enumerate(plans):
    g = plan.live(); axes = graph_axes(g)
    moved = ops.weight_derived(((i, n.op, [v.node for v in n.inputs]) for i, n in enumerate(g.nodes)), moved_only=True)
    replicated = replicated_weights((i, n.op, [v.node for v in n.inputs]) for i, n in enumerate(g.nodes))
    grad, facts, pred = [], [], {}
    for i, n in enumerate(g.nodes):
        grad.append(n.op == "weight" or any(grad[v.node] for v in n.inputs))
        facts.append(ValueContext(axes[i], n.op if ops.OPS[n.op].is_leaf else None, i in moved, grad[i], weight_replicated=i in replicated))
        c = model.node_cost(NodeInContext(n.op, n.attr, tuple(g.shape(v) for v in n.inputs), tuple(facts[v.node] for v in n.inputs), facts[i]))
        pred[i] = c.copy_bytes
    program = shard_plan(plan, mesh)
    text = step_program(program, weights).lower(*program.place(_scaled_inputs(graph, 0))).compile().as_text()
    comp = defaultdict(float); noname = 0.0; kinds = defaultdict(float)
    for line in text.splitlines():
        m = COPY.search(line)
        if not m or " copy(" not in line: continue
        mm = re.search(r'op_name="([^"]*)"', line)
        name = mm.group(1) if mm else ""
        node = re.findall(r"/(\w+)\.(\d+)(?=/|$)", name)
        b = _shape_bytes(m.group(2))
        if node: comp[int(node[-1][1])] += b
        else: noname += b
    nodes = [{"i": i, "op": n.op, "attr": {a: v for a, v in n.attr.items() if a != "value"}, "shape": list(n.shapes[0]),
              "axes": list(axes[i]), "inputs": [v.node for v in n.inputs], "pred": pred[i], "comp": comp.get(i, 0.0)} for i, n in enumerate(g.nodes)]
    out.append({"plan": k, "nodes": nodes, "noname": noname})
    print(case, k, "pred MB", round(sum(pred.values())/1e6, 2), "comp MB", round(sum(comp.values())/1e6, 2), "noname", round(noname/1e6, 2), flush=True)
json.dump(out, open(f"/work/wt/s20/diag/{case}_{timing}.json", "w"))

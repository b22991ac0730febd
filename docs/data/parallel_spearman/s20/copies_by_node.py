"""Each compiled `copy` of a timing's plans, attributed to the plan node whose `op.i` scope made it, beside the
node's predicted copies (stop 47). Run from the repository root:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python docs/data/parallel_spearman/s20/copies_by_node.py \\
        gpt12 docs/data/parallel_spearman/s19/N docs/data/parallel_spearman/s19/cal_N.json OUT.json
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from eqsat import ops
from eqsat.context import NodeInContext, ValueContext
from eqsat.ir import Graph
from eqsat.models import build_parallel_model
from eqsat.parallel.calibration import MeshCalibration, calibrated_model
from eqsat.parallel.mesh import parse_mesh
from eqsat.parallel.planner import graph_axes, replicated_weights
from jax_backend.checks import _scaled_inputs
from jax_backend.shard import _shape_bytes, shard_plan, step_program

COPY = re.compile(r"^\s*%?(\S+)\s*=\s*(\S+)\s+copy\((\S+)")
SCOPE = re.compile(r"/(\w+)\.(\d+)(?=/|$)")


def predicted_copies(plan: Graph, model: object) -> dict[int, float]:
    """The model's copy bytes per node of the live plan, in the context `plan_report` prices it in."""
    g = plan.live()
    axes = graph_axes(g)
    edges = [(i, n.op, [v.node for v in n.inputs]) for i, n in enumerate(g.nodes)]
    moved = ops.weight_derived(edges, moved_only=True)
    replicated = replicated_weights(edges)
    grad: list[bool] = []
    facts: list[ValueContext] = []
    out = {}
    for i, n in enumerate(g.nodes):
        grad.append(n.op == "weight" or any(grad[v.node] for v in n.inputs))
        leaf = n.op if ops.OPS[n.op].is_leaf else None
        facts.append(ValueContext(axes[i], leaf, i in moved, grad[i], weight_replicated=i in replicated))
        node = NodeInContext(n.op, n.attr, tuple(g.shape(v) for v in n.inputs), tuple(facts[v.node] for v in n.inputs), facts[i])
        out[i] = model.node_cost(node).copy_bytes  # type: ignore[attr-defined]
    return out


def main(case: str, timing: str, calibration: str, out_path: str) -> None:
    model = calibrated_model(MeshCalibration.from_json(json.loads(Path(calibration).read_text())), overlap=False)
    mesh = parse_mesh("2x4")
    graph = build_parallel_model(case)
    weights = [n.attr["name"] for _, n in graph.leaves("weight")]
    plans = [Graph.from_json(p) for p in json.loads(Path(f"{timing}/{case}/parallel_spearman_plans_{case}.json").read_text())]
    out = []
    for k, plan in enumerate(plans):
        g = plan.live()
        axes = graph_axes(g)
        pred = predicted_copies(plan, model)
        program = shard_plan(plan, mesh)
        text = step_program(program, weights).lower(*program.place(_scaled_inputs(graph, 0))).compile().as_text()
        compiled: dict[int, float] = defaultdict(float)
        unscoped = 0.0
        for line in text.splitlines():
            m = COPY.search(line)
            if not m or " copy(" not in line:
                continue
            name = re.search(r'op_name="([^"]*)"', line)
            scope = SCOPE.findall(name.group(1)) if name else []
            if scope:
                compiled[int(scope[-1][1])] += _shape_bytes(m.group(2))
            else:
                unscoped += _shape_bytes(m.group(2))
        nodes = [
            {
                "i": i,
                "op": n.op,
                "attr": {a: v for a, v in n.attr.items() if a != "value"},
                "shape": list(n.shapes[0]),
                "axes": list(axes[i]),
                "inputs": [v.node for v in n.inputs],
                "pred": pred[i],
                "comp": compiled.get(i, 0.0),
            }
            for i, n in enumerate(g.nodes)
        ]
        out.append({"plan": k, "nodes": nodes, "noname": unscoped})
        print(
            case,
            k,
            "predicted MB",
            round(sum(pred.values()) / 1e6, 2),
            "compiled MB",
            round(sum(compiled.values()) / 1e6, 2),
            "unscoped MB",
            round(unscoped / 1e6, 2),
            flush=True,
        )
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""Plan Tensat's models on this host under an xla calibration measured on another device (issue 24).

A lent GPU has JAX but not the search's engines (egglog, z3, highspy), and `cost_model("xla")`
refuses a device other than the one JAX runs on. So the GPU's own calibration (the cache file that
`eqsat calibrate --device h200` wrote there) is brought back, the search runs here under an
`XlaModel` built from it, and the ILP's answer is saved as a candidate that `eqsat judge` runs on
that GPU beside the others. Nothing is timed here: the plans are judged where they run.

    python -m experiments.plan_for_device CALIBRATION.json OUT_DIR --device h200 --models squeezenet bert
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eqsat.cost import conventions
from eqsat.egraph import encoded_signatures
from eqsat.models import MODELS, build_model
from eqsat.pipeline import optimize_graph
from eqsat.rulesets import named_rules, select_rules
from eqsat.saturate import Limits
from eqsat.xla_cost import Calibration, XlaModel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibration", type=Path, help="an xla calibration file measured on the target device")
    parser.add_argument("out", type=Path, help="folder for MODEL.before.json and MODEL.candidate.ilp-xla-DEVICE.json")
    parser.add_argument("--device", required=True, help="the device the calibration was measured on (h100, h200)")
    parser.add_argument("--models", nargs="+", default=sorted(MODELS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="extraction seconds per model")
    args = parser.parse_args(argv)
    try:
        cal = Calibration.from_json(json.loads(args.calibration.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"plan_for_device: error: {args.calibration}: not an xla calibration ({exc})", file=sys.stderr)
        return 2
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        print(f"plan_for_device: error: unknown model {unknown[0]}", file=sys.stderr)
        return 2
    convention = conventions("ours")
    model = convention.apply(XlaModel(cal, device=args.device))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        graph = build_model(name)
        rules = select_rules(named_rules("default"), encoded_signatures(graph)).trusted
        result = optimize_graph(graph, rules, Limits(), model, time_limit=args.time_limit,
                                fold_weights=convention.fold_weights)
        graph.save(args.out / f"{name}.before.json")
        result.optimized.save(args.out / f"{name}.candidate.ilp-xla-{args.device}.json")
        print(json.dumps({"model": name, "device": args.device, "cost_before": result.cost_before,
                          "cost_after": result.cost_after, "status": result.selection_status, "enodes": result.enodes,
                          "predicted_speedup": result.cost_before / result.cost_after if result.cost_after else None}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

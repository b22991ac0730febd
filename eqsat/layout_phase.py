"""The late layout phase: a plan's convolutions as NHWC `conv2d_nhwc` where the transposes cancel.

The `layout` rule group (`library/layout.rules`) in the main saturation costs more than it gives:
its transposes and their inverses put short cycles into every conv chain's e-classes, and the ILP
then runs to its time limit on every conv model (SqueezeNet 0.6 s -> 56 s under the default
roofline, docs/tensat.md), for the same plan, since a cost model that prices an NHWC conv as
its NCHW form never chooses them. So the group is applied late instead: to the plan the extractor
chose, alone (a small e-graph: the plan and its NHWC forms, which the ILP solves to optimality in
0.3-1.6 s on SqueezeNet, ResNeXt-50 and Inception-v3; greedy-dag misses the chains that run through
merged convs), extracted under the run's own cost model when that prices an NCHW conv as what XLA
runs for it (`prices_conv_layout`: the xla model, whose NCHW conv is its NHWC form, its weight's
transpose and its input's where the HLO has one: one pricing of a transpose for the search and this
phase), else under `NchwPaysTransposes` over the roofline (an NCHW conv costs its NHWC form and a
transpose on each side), and the result is one more candidate plan that `eqsat optimize` runs beside
the others and keeps only if it is measured faster.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eqsat import ops
from eqsat.cost import CostModel, Shape, cost_model
from eqsat.ir import Graph

__all__ = ["NchwPaysTransposes", "layout_costs", "nhwc_plan"]


@dataclass(frozen=True)
class NchwPaysTransposes:
    """`base` with each rank-4 `conv2d` (NCHW) priced as XLA:CPU runs it: the transpose of its input
    to NHWC, the NHWC conv, and the transpose of its output back. Under it a chain of convs pays to
    run NHWC with one transpose at each end; one conv between pools does not."""

    base: CostModel

    @property
    def name(self) -> str:
        return f"{self.base.name}+nchw-transposes"

    @property
    def device(self) -> str:
        return self.base.device

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        if op != "conv2d" or len(input_shapes) != 2 or len(input_shapes[0]) != 4:
            return self.base.op_cost(op, attrs, input_shapes)
        x, w = tuple(input_shapes[0]), tuple(input_shapes[1])
        x_nhwc = tuple(x[p] for p in ops.NHWC_IN)
        w_hwio = tuple(w[p] for p in ops.HWIO_FROM_OIHW)
        (out,) = ops.infer_shapes("conv2d_nhwc", [x_nhwc, w_hwio], attrs)
        return (self.base.op_cost("transpose", {"perm": list(ops.NHWC_IN)}, [x])
                + self.base.op_cost("conv2d_nhwc", attrs, [x_nhwc, w_hwio])
                + self.base.op_cost("transpose", {"perm": list(ops.NHWC_OUT)}, [out]))


def layout_costs(device: str, costs: CostModel | None = None) -> CostModel:
    """What the layout phase extracts under: `costs` itself when it prices an NCHW conv as what XLA
    runs for it (its `prices_conv_layout`), else `NchwPaysTransposes` over the roofline of `device`."""
    if costs is not None and getattr(costs, "prices_conv_layout", False):
        return costs
    return NchwPaysTransposes(cost_model("roofline", device=device))


def nhwc_plan(plan: Graph, device: str, *, costs: CostModel | None = None, fold_weights: bool = True,
              seconds: float = 20.0) -> tuple[Graph | None, float]:
    """`plan` with its convs NHWC where that saves transposes (the layout group on `plan` alone,
    the ILP under `layout_costs(device, costs)`, within `seconds` for saturation and again for
    extraction), and the seconds it took; None when `plan` has no conv the group can
    rewrite, or the result is not new. Not checked here: the caller runs it against the float64
    reference (`judge_plans` drops a plan that disagrees; the rules are proved for all shapes)."""
    from eqsat.egraph import encoded_signatures
    from eqsat.pipeline import optimize_graph
    from eqsat.rewrites import library_rules
    from eqsat.rulesets import select_rules
    from eqsat.saturate import Limits

    t0 = time.perf_counter()
    if "conv2d" not in plan.live().op_counts():
        return None, time.perf_counter() - t0
    rules = select_rules(library_rules(["layout"]), encoded_signatures(plan)).trusted
    if not any(r.name.startswith("conv-nhwc") for r in rules):
        return None, time.perf_counter() - t0
    result = optimize_graph(plan, rules, Limits(nodes=20_000, seconds=seconds), layout_costs(device, costs), extractor="ilp",
                            time_limit=seconds, fold_weights=fold_weights, check=False)  # judge_plans checks it
    found = result.optimized.live()
    new = "conv2d_nhwc" in found.op_counts() and found != plan.live()
    return (result.optimized if new else None), time.perf_counter() - t0

"""Parallel plans inside the e-graph: device meshes, the distribution ops' rules, the
communication / memory cost of a plan (`mesh`, `rules`, `cost`, `memory`) and the planner that
extracts algebra and plan together (`planner`).

The distribution ops themselves (partition, combine, collectives) are core vocabulary
(`eqsat.distribution`, registered in `eqsat.ops` with their facts); the planner's modules only
import downward.

The public API for a user's own training step, `eqsat.parallel.plan(step, *args, mesh=...)`,
`parallelize` and `Plan`, lives in `eqsat.parallel.api` (on top of the planner and the JAX
backend) and is loaded on first use, so importing the planner never imports JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eqsat.parallel.api import ApiError, Plan, PlanSummary, parallelize, plan

__all__ = ["ApiError", "Plan", "PlanSummary", "parallelize", "plan"]


def __getattr__(name: str) -> Any:
    """`plan`, `parallelize`, `Plan`, ...: from `eqsat.parallel.api`, imported on first use."""
    if name in __all__:
        return getattr(importlib.import_module("eqsat.parallel.api"), name)
    raise AttributeError(f"module 'eqsat.parallel' has no attribute '{name}'")

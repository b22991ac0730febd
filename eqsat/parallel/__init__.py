"""Parallel plans inside the e-graph: device meshes, the distribution ops' rules,
the communication / memory cost of a plan and the planner that extracts algebra and plan together.

The distribution ops themselves (partition, combine, collectives) are core vocabulary
(`eqsat.distribution`, registered in `eqsat.ops` with their facts); the planner's modules only
import downward. Submodules are imported by name (`eqsat.parallel.mesh`, `eqsat.parallel.plan`, ...).

The public API for a user's own training step, `eqsat.parallel.plan(step, *args, mesh=...)`,
`parallelize` and `Plan`, is `eqsat.parallel.api` (on top of the planner and the JAX backend),
loaded on first use. `plan` is also the planner's submodule: the package makes that module
callable (calling it is `eqsat.parallel.api.plan`), so `eqsat.parallel.plan(...)` plans a step and
`from eqsat.parallel.plan import plan_graph` keeps working.
"""
import importlib
import sys
import types
from typing import Any

_API = ("parallelize", "Plan", "PlanSummary", "ApiError")


class _CallablePlanModule(types.ModuleType):
    """`eqsat.parallel.plan`, the planner module, callable as the public `plan` API."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("eqsat.parallel.api").plan(*args, **kwargs)


class _Package(types.ModuleType):
    """This package: its `plan` attribute is the planner module made callable, whenever it is set."""

    @property
    def plan(self) -> Any:
        module = sys.modules.get(f"{__name__}.plan") or importlib.import_module("eqsat.parallel.plan")
        if not isinstance(module, _CallablePlanModule):
            module.__class__ = _CallablePlanModule
        return module

    @plan.setter
    def plan(self, module: Any) -> None:  # the import system attaches the submodule here
        if isinstance(module, types.ModuleType) and not isinstance(module, _CallablePlanModule):
            module.__class__ = _CallablePlanModule


def __getattr__(name: str) -> Any:
    """`parallelize`, `Plan`, ...: from `eqsat.parallel.api`, imported on first use."""
    if name in _API:
        return getattr(importlib.import_module("eqsat.parallel.api"), name)
    raise AttributeError(f"module 'eqsat.parallel' has no attribute '{name}'")


sys.modules[__name__].__class__ = _Package

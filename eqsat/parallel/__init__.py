"""Parallel plans inside the e-graph: device meshes, the distribution ops' semantics, their rules,
the communication / memory cost of a plan and the planner that extracts algebra and plan together.

Submodules are imported by name (`eqsat.parallel.mesh`, `eqsat.parallel.plan`, ...); this package
imports nothing so that `eqsat.ops` can read `eqsat.parallel.ops` without an import cycle.
"""

"""Parallel plans inside the e-graph: device meshes, the distribution ops' rules,
the communication / memory cost of a plan and the planner that extracts algebra and plan together.

The distribution ops themselves (partition, combine, collectives) are core vocabulary
(`eqsat.distribution`, registered in `eqsat.ops` with their facts); this package only imports
downward. Submodules are imported by name (`eqsat.parallel.mesh`, `eqsat.parallel.plan`, ...).
"""

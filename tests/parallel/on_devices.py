"""One check for the rule tests: a plan lowered to `shard_map` on this process's JAX devices equals
the program (skipped where fewer devices than the mesh has)."""

from __future__ import annotations

import pytest

from eqsat.ir import Graph
from eqsat.parallel.mesh import Mesh


def assert_plan_runs_on_devices(program: Graph, plan: Graph, mesh: Mesh) -> None:
    jax = pytest.importorskip("jax")
    if jax.device_count() < mesh.n_devices:
        pytest.skip(f"needs {mesh.n_devices} JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from jax_backend.checks import check_on_devices

    got = check_on_devices(program, plan, mesh)
    assert got["numerics_ok"], got

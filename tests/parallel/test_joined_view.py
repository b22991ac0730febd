"""A multi-axis mesh searched as one joined axis (`Mesh.joined`, `step_planner.plan_views`)."""

from __future__ import annotations

import pytest

from eqsat.parallel import step_planner
from eqsat.parallel.mesh import PRESETS, MeshAxis, Mesh


def test_a_joined_axis_prices_a_collective_as_one_over_every_axis() -> None:
    mesh = PRESETS["h100x32"]  # 4 nodes over InfiniBand x 8 GPUs over NVLink
    joined = mesh.joined("node+gpu")
    assert joined.shape == (32,) and joined.axis_names == ("node+gpu",)
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        assert joined.collective_seconds(kind, 0, 1e6) == pytest.approx(mesh.collective_seconds_over(kind, (0, 1), 1e6))
        assert joined.wire_bytes(kind, 0, 1e6) == pytest.approx(mesh.wire_bytes_over(kind, (0, 1), 1e6))
    # the slowest link: a joined collective costs more than one over the fast axis alone, of the same devices' count
    assert joined.collective_seconds("all-reduce", 0, 1e6) > mesh.collective_seconds("all-reduce", 1, 1e6)


def test_a_joined_axis_keeps_the_slowest_link_of_each_collective_kind() -> None:
    fast = MeshAxis("a", 2, 100e9, 1e-6, kind_links=(("all-to-all", 5e-6, 10e9),))
    slow = MeshAxis("b", 4, 50e9, 2e-6)
    joined = Mesh("m", (fast, slow)).joined("a+b")
    assert joined.axes[0].link("all-to-all") == (5e-6, 10e9)
    assert joined.axes[0].link("all-reduce") == (2e-6, 50e9)


def test_a_joined_views_plan_is_split_over_the_tuple_of_the_axes() -> None:
    planned = step_planner.Planned([("data+model", None), None, (None, "data+model"), ()], (), None, 0, "", None,
                           batch=((8, "data+model"),), constraints=(("v", ("data+model",)),))
    out = step_planner.renamed(planned, "data+model", ("data", "model"))
    assert out.specs == [(("data", "model"), None), None, (None, ("data", "model")), ()]
    assert out.batch == ((8, ("data", "model")),) and out.constraints == (("v", (("data", "model"),)),)
    assert out.axis_names == ("data+model",)

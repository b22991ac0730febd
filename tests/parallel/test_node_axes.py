"""A distribution op's `dim` must name a data dimension, not one of the value's device axes."""

from __future__ import annotations

from eqsat.parallel.planner import node_axes


def test_partition_of_a_data_dim_is_spmd() -> None:
    # x: (8, 16) → partition(axis 1, dim -2) → (2, 4, 16) with device axes (1,)
    assert node_axes("partition", {"dim": -2, "axis": 1, "parts": 2}, [()], 2) == (1,)
    assert node_axes("partition", {"dim": -1, "axis": 0, "parts": 4}, [(1,)], 3) == (0, 1)
    assert node_axes("partition", {"dim": -2, "axis": 0, "parts": 2}, [(1,)], 3) == (0, 1)


def test_partition_naming_a_device_axis_is_refused() -> None:
    # dim -3 of the (2, 4, 16) value is its device axis: no per-device program expresses it
    assert node_axes("partition", {"dim": -3, "axis": 0, "parts": 2}, [(1,)], 3) is None


def test_combine_naming_a_device_axis_is_refused() -> None:
    # y: (2, 2, 4, 16) with device axes (0, 1): the piece's data dims are -1 and -2 only
    assert node_axes("combine", {"dim": -2, "axis": 0}, [(0, 1)], 4) == (1,)
    assert node_axes("combine", {"dim": -3, "axis": 0}, [(0, 1)], 4) is None

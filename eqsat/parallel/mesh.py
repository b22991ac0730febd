"""Device meshes: named axes, each with a size and an alpha-beta link model.

A collective over one axis of size n moving S bytes per device costs steps * alpha + factor(n) * S / beta
(factor 2(n-1)/n for an all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all: the
bandwidth-optimal ring / pairwise algorithms; steps by the axis's latency algorithm,
`eqsat.parallel.timemodel`: the presets pay alpha once per collective, a calibrated mesh
(`eqsat parallel calibrate`) (n-1) per ring phase). Presets and where their numbers come from:

- `h100x8`: one DGX H100 node, NVLink 4 through NVSwitch: 450 GB/s per direction per GPU
  (NVIDIA H100 SXM datasheet: 900 GB/s bidirectional); latency 5 us assumed (NCCL small-message).
- `h100x32`: 4 such nodes over InfiniBand NDR, 8 x 400 Gb/s NICs per node = 50 GB/s per GPU;
  latency 10 us assumed. Axis `node` (4) over IB, axis `gpu` (8) over NVLink.
- `cpu8`: the 8 emulated XLA CPU devices of this machine (one process, memcpy collectives);
  numbers are nominal (10 GB/s, 20 us), good for ranking plans, not for wall time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from eqsat.errors import EqsatError
from eqsat.parallel import timemodel


class MeshError(EqsatError):
    """A mesh spec that does not name a preset or a valid shape."""


@dataclass(frozen=True)
class MeshAxis:
    """One named mesh axis: its size and the link its collectives run over."""

    name: str
    size: int
    bandwidth: float  # bytes/s per device per direction
    latency: float  # seconds per collective step (alpha)
    algorithm: str = "once"  # latency steps per collective: ring, tree or once (`timemodel.latency_steps`)
    sync: float = 0.0  # seconds a collective costs inside a program beyond alpha-beta (measured: `eqsat parallel calibrate`)
    # (kind, latency, bandwidth): a collective kind with a link of its own on this axis (a calibrated
    # all-to-all: XLA's CPU backend runs it as one chunk per peer, slower than the ring kinds' link)
    kind_links: tuple[tuple[str, float, float], ...] = ()

    def has_own_link(self, kind: str) -> bool:
        """Whether collectives of `kind` run on a link of their own here (measured as XLA compiles them)."""
        return any(k == kind for k, _, _ in self.kind_links)

    def link(self, kind: str) -> tuple[float, float]:
        """(latency, bandwidth) a collective of `kind` runs at on this axis."""
        for k, latency, bandwidth in self.kind_links:
            if k == kind:
                return latency, bandwidth
        return self.latency, self.bandwidth


# Collective kind -> factor of S (bytes per device) each device sends, on an axis of size n.
COLLECTIVE_FACTORS: Mapping[str, float] = MappingProxyType({
    "all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0,
})


@dataclass(frozen=True)
class Mesh:
    """Devices arranged on named axes (row-major, as `jax.sharding.Mesh`)."""

    name: str
    axes: tuple[MeshAxis, ...]
    device: str = "cpu-nominal"  # the compute cost model's device (eqsat.cost.DEVICES or cpu)
    memory_bytes: float = math.inf  # per-device memory

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def n_devices(self) -> int:
        return math.prod(self.shape)

    def axis(self, index: int) -> MeshAxis:
        if not 0 <= index < len(self.axes):
            raise MeshError(f"mesh {self.name} has no axis {index} (axes: {', '.join(self.axis_names)})")
        return self.axes[index]

    def collective_seconds(self, kind: str, axis: int, bytes_per_device: float) -> float:
        """alpha-beta time of one collective over `axis`, S = bytes per device (see module doc)."""
        ax = self.axis(axis)
        latency, bandwidth = ax.link(kind)
        return timemodel.collective_seconds(kind, ax.size, bytes_per_device, latency, bandwidth, ax.algorithm, ax.sync)

    def collective_seconds_over(self, kind: str, axes: Sequence[int], bytes_per_device: float) -> float:
        """One collective over several axes at once (a weight's gradient sync over a 2-D mesh is one
        all-reduce over both, as XLA runs it): their product of devices, on the slowest of their links
        (largest latency and sync, smallest bandwidth; ring latency if their algorithms differ). One axis: as
        `collective_seconds`."""
        over = [self.axis(a) for a in axes]
        if not over:
            return 0.0
        algorithms = {ax.algorithm for ax in over}
        algorithm = over[0].algorithm if len(algorithms) == 1 else "ring"
        links = [ax.link(kind) for ax in over]
        return timemodel.collective_seconds(kind, math.prod(ax.size for ax in over), bytes_per_device,
                                            max(lat for lat, _ in links), min(bw for _, bw in links), algorithm,
                                            max(ax.sync for ax in over))

    def wire_bytes_over(self, kind: str, axes: Sequence[int], bytes_per_device: float) -> float:
        """Bytes one device sends for one collective over several axes (their product of devices)."""
        return timemodel.wire_bytes(kind, math.prod(self.axis(a).size for a in axes), bytes_per_device) if axes else 0.0

    def wire_bytes(self, kind: str, axis: int, bytes_per_device: float) -> float:
        """Bytes one device sends for the collective (ring factors), beside its buffer size S."""
        return timemodel.wire_bytes(kind, self.axis(axis).size, bytes_per_device)

    def joined(self, name: str) -> Mesh:
        """All the axes as one axis of all the devices, named `name` (a logical view, as Alpa plans a
        device mesh under several shapes): a collective over it spans every axis, so it runs at the
        slowest axis's link and pays the largest latency (as `collective_seconds_over` prices one
        over several axes)."""
        over = self.axes

        def slowest(kind: str) -> tuple[float, float]:  # (latency, bandwidth) of a collective of `kind`
            links = [ax.link(kind) for ax in over]
            return max(lat for lat, _ in links), min(bw for _, bw in links)

        kinds = sorted({k for ax in over for k, _, _ in ax.kind_links})  # kinds some axis links apart
        algorithms = {ax.algorithm for ax in over}
        axis = MeshAxis(name, self.n_devices, min(ax.bandwidth for ax in over), max(ax.latency for ax in over),
                        over[0].algorithm if len(algorithms) == 1 else "ring", max(ax.sync for ax in over),
                        tuple((k, *slowest(k)) for k in kinds))
        return Mesh(f"{self.name}[{name}]", (axis,), self.device, self.memory_bytes)

    def reshaped(self, shape: Sequence[int]) -> Mesh:
        """The same kind of devices and links on another shape, using the first prod(shape) of them
        (axes named a0, a1, ...; the link of a multi-axis shape is this mesh's slowest)."""
        if any(s < 1 for s in shape):
            raise MeshError(f"mesh shape {'x'.join(map(str, shape))}: every axis size must be a positive whole number")
        if math.prod(shape) > self.n_devices:
            raise MeshError(f"mesh shape {'x'.join(map(str, shape))} needs {math.prod(shape)} devices, "
                            f"more than the {self.n_devices} of {self.name}")
        bw = min(a.bandwidth for a in self.axes)
        lat = max(a.latency for a in self.axes)
        axes = tuple(MeshAxis(f"a{i}", s, bw, lat, self.axes[0].algorithm, max(a.sync for a in self.axes))
                     for i, s in enumerate(shape))
        return Mesh(f"{self.name}[{'x'.join(map(str, shape))}]", axes, self.device, self.memory_bytes)


NVLINK = (450e9, 5e-6)
INFINIBAND = (50e9, 10e-6)
CPU_LINK = (10e9, 20e-6)

PRESETS: Mapping[str, Mesh] = MappingProxyType({
    "h100x8": Mesh("h100x8", (MeshAxis("gpu", 8, *NVLINK),), "h100", 80e9),
    "h100x32": Mesh("h100x32", (MeshAxis("node", 4, *INFINIBAND), MeshAxis("gpu", 8, *NVLINK)), "h100", 80e9),
    "cpu8": Mesh("cpu8", (MeshAxis("a0", 8, *CPU_LINK),), "cpu-nominal"),
})


def normalized_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` without its size-1 axes (`8x1` is `8`): a size-1 axis splits nothing and moves
    nothing, and a plan or baseline sharded over it would only pretend to. A shape that needs one
    device in all is refused: on one device every plan is the replicated program, with no
    communication to plan (that is `eqsat optimize`'s job), and a search would spend a minute to say so."""
    if any(s < 1 for s in shape):
        raise MeshError(f"mesh shape {'x'.join(map(str, shape))}: every axis size must be a positive whole number")
    kept = tuple(s for s in shape if s > 1)
    if not kept:
        raise MeshError(f"mesh shape {'x'.join(map(str, shape))} has one device: there is nothing to parallelize "
                        "(use eqsat optimize for a single device)")
    return kept


def parse_mesh(spec: str, base: str = "cpu8") -> Mesh:
    """`8`, `2x4`, `4x2` (the `base` preset's devices on that shape; size-1 axes dropped,
    `normalized_shape`) or a preset name."""
    if spec in PRESETS:
        return PRESETS[spec]
    try:
        shape = normalized_shape(tuple(int(s) for s in spec.lower().split("x")))
    except ValueError:
        raise MeshError(f"mesh {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a shape like 8 or 2x4") from None
    if base not in PRESETS:
        raise MeshError(f"unknown mesh preset {base!r}; known: {', '.join(PRESETS)}")
    mesh = PRESETS[base]
    if mesh.shape == shape:
        return mesh
    return mesh.reshaped(shape)

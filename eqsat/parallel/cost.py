"""What one e-node of a parallel plan costs in a training step: per-device compute (from the
project's cost models, on the per-device shapes), the collectives it causes forward and backward
(alpha-beta on the mesh axis they run over) and the per-device bytes it keeps alive.

Device state of a value (the leading device axes of its stacked shape, `eqsat.distribution`): a
value with no device axes is replicated on every device (SPMD: every device computes it), so
`partition` is a local slice and `replicate` moves nothing. Collectives, forward / backward:

| op | forward | backward (the transpose) |
|---|---|---|
| partition | slice, nothing | all-reduce of the zero-padded gradient, as JAX transposes a slice of a replicated value (none for a leaf: data needs none, a weight keeps its shard) |
| replicate | nothing | all-reduce of the gradient; of a weight leaf this is the gradient sync (over several axes one all-reduce: `_joined_sync`) |
| combine / all_gather | all-gather | slice / reduce-scatter |
| reduce, all_reduce | all-reduce | nothing / all-reduce |
| reduce_scatter | reduce-scatter | all-gather |
| all_to_all | all-to-all | all-to-all |

Backward compute is taken as twice the forward (two products per matmul; the usual estimate).
With an optimizer (`ParallelCostModel.state_copies`), a weight's update and state are priced on
the piece of it each device keeps: replicated (data parallel: every device updates all of it) or
partitioned (ZeRO / FSDP, the `fsdp-gather` rule: all-gathered before use, gradient reduce-scattered).
Memory per device: `mem_bytes` is the node's term of the ILP's memory row
(`eqsat.parallel.memory.node_kept`, what it keeps through the step) and `mem_bound_bytes` every
buffer it uses (`node_bound`, summed over a plan an upper bound of the simulated peak); the
prediction itself is the liveness simulation of the whole plan's training step
(`eqsat.parallel.memory.step_memory`), which no per-node sum can express.
S, the bytes of a collective, is the per-device buffer: the gathered result of an all-gather, the
input of a reduce-scatter / all-to-all, the value of an all-reduce (what `compile().as_text()`
shows as the collective's operand or result shape); `wire_bytes` beside it is what a device sends
(the ring factors of `eqsat.parallel.timemodel`). The seconds are the mesh axis's alpha-beta time
(`Mesh.collective_seconds`); the `parallel-calibrated` model (`eqsat.parallel.calibration`) prices
with links and compute rates measured on the devices at hand.

Beside its collectives and products, a compiled step copies buffers that no plan op names: XLA's
collectives work along a buffer's major dimension, so a gather or scatter along another one, and
every all-to-all, is a transposing copy in and out; a `transpose` materialises; the backward of a
`partition` fills a zero buffer of its input's size to pad the gradient into. `LAYOUT_COPIES` says,
per op, how many buffers of which size (read from the compiled steps of random plans, see
docs/parallel.md); a transposing copy is priced at `ParallelCostModel.copy_rate`, a zero fill as an
elementwise pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eqsat import cost as cost_models
from eqsat import ops
from eqsat.context import NodeInContext, NodePrice
from eqsat.distribution import local_attrs
from eqsat.parallel.memory import node_allocated, node_bound, node_kept, per_device_bytes, recompute_bytes
from eqsat.parallel.mesh import Mesh, parse_mesh
from eqsat.parallel.timemodel import DriftCurve, FreshCurve

Shape = tuple[int, ...]
BACKWARD_FACTOR = 2.0

# op → (forward collective, backward collective, which shape S is measured on: "in" or "out")
COLLECTIVES: Mapping[str, tuple[str | None, str | None, str]] = {
    name: (spec.collectives.forward, spec.collectives.backward, spec.collectives.measured_on)
    for name, spec in ops.OPS.items() if spec.collectives is not None
}


@dataclass(frozen=True)
class LayoutCopies:
    """The copies a compiled training step makes around one plan op, in buffers of the op's
    per-device input or output (`buffer`): `forward` of them, and `backward` more when a gradient
    flows back through it (for a distribution op: when it has a backward collective). `minor_only`:
    only when the op gathers or scatters along a dimension that is not the major one of the
    per-device value (XLA's collectives stack pieces along the major dimension; another one is
    transposed into place and back). `fill`: a zero-filled buffer (an elementwise pass), not a
    transposing copy. `timed_with`: the collective kind whose own link on a calibrated axis
    (`MeshAxis.kind_links`) was timed as XLA compiles it, these copies included, so on such an axis
    they are in the collective's seconds already and cost nothing more (their bytes are still reported)."""

    forward: float
    backward: float
    buffer: str  # "in" | "out"
    minor_only: bool = False
    fill: bool = False
    timed_with: str | None = None


# What the compiled steps of cnn's, dlrm's, moe's and gpt12's random plans copy per plan op (the
# copies' op names, docs/parallel.md "Which plan ops make the compiled step copy").
LAYOUT_COPIES: Mapping[str, LayoutCopies] = {
    # split into per-peer chunks and laid out again: what `eqsat parallel calibrate`'s all-to-all probe
    # compiles to as well (its chunk slices in, a concatenate out)
    "all_to_all": LayoutCopies(1.25, 1.25, "in", timed_with="all-to-all"),
    "combine": LayoutCopies(1.0, 1.0, "out", minor_only=True),
    "all_gather": LayoutCopies(1.0, 1.0, "out", minor_only=True),
    "reduce_scatter": LayoutCopies(1.0, 1.0, "in", minor_only=True),
    "transpose": LayoutCopies(1.0, 1.0, "out"),
    "partition": LayoutCopies(0.0, 1.0, "in", fill=True),  # the zero-padded gradient its all-reduce sums
}


@dataclass(frozen=True)
class Collective:
    """One collective a plan runs: where it comes from and what it moves (bytes per device)."""

    kind: str
    axis: int
    bytes: float
    seconds: float
    phase: str  # forward | backward | grad-sync
    op: str
    why: str
    wire_bytes: float = 0.0  # what one device sends: `bytes` times the ring factor (`timemodel.wire_factor`)


@dataclass(frozen=True)
class NodeCost:
    compute_s: float  # forward + backward per device
    forward_s: float
    collectives: tuple[Collective, ...]
    mem_bytes: float  # per device: this node's term of the ILP memory row (`memory.node_kept`)
    mem_bound_bytes: float = 0.0  # every buffer it allocates in the step (`memory.node_bound`)
    # activation checkpointing: recomputing this product in the backward adds recompute_s (its
    # forward again) and takes recompute_bytes off its memory-row term (`memory.recompute_bytes`)
    recompute_s: float = 0.0
    recompute_bytes: float = 0.0
    # buffers the compiled step copies for this node (`LAYOUT_COPIES`), per device, and their seconds
    copy_bytes: float = 0.0
    copy_s: float = 0.0
    # buffers the step allocates for this node (`memory.node_allocated`: its bound less the step's
    # arguments), per device, and what writing them fresh costs (`ParallelCostModel.fresh_rate`)
    fresh_bytes: float = 0.0
    fresh_s: float = 0.0

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s + self.copy_s + self.fresh_s


@dataclass(frozen=True)
class ParallelCostModel:
    """Training-step cost of an op on a mesh, in context (an `InContextCostModel`); `compute`
    prices the per-device op."""

    mesh: Mesh
    compute: cost_models.CostModel
    name: str = "parallel"
    overlap: bool = False  # a plan's report lets collectives hide behind independent compute (`timemodel.overlapped_step`)
    # The step's optimizer: None when it ends at the gradients (the built-in cases); else the
    # optimizer state per weight in copies of it (Adam: 2, SGD: 0). Then each weight's state is
    # held as the weight is passed (so a sharded weight has sharded state: ZeRO / FSDP) and its
    # update, which reads the weight, gradient and state and writes weight and state, is priced on
    # the device's piece (`_update_s`).
    state_copies: float | None = None
    # bytes per second one device writes in a transposing copy with every device busy (`eqsat
    # parallel calibrate` measures it); None: assumed to stream at the device's bandwidth, as an
    # elementwise pass over the buffer is priced
    copy_rate: float | None = None
    # seconds per byte a step allocates, beyond the passes that write it, with every device busy:
    # fresh memory each call (XLA:CPU allocates a step's temporaries per execution, and the host
    # maps large ones anew) and out of cache. `eqsat parallel calibrate` measures it; 0: not priced
    fresh_rate: float = 0.0
    # the same by how many bytes the step allocates per device (`timemodel.FreshCurve`; `eqsat
    # parallel calibrate` measures it): a plan's report prices its step's buffers at the rate of
    # their total; the ILP's node-local prices, which cannot know the total, use `fresh_rate`
    # (the curve's lower level). None: `fresh_rate` throughout
    fresh_curve: FreshCurve | None = None
    layout_copies: bool = True  # price `LAYOUT_COPIES` (off: the model before them, for comparison)
    # what a collective waits for the slowest device after a piece of compute (`timemodel.DriftCurve`;
    # `eqsat parallel calibrate` measures it). A plan's report prices it on the step's order of nodes
    # (`timemodel.scheduled_waits`); the ILP's additive objective does not. None: not priced
    drift: DriftCurve | None = None

    @property
    def device(self) -> str:
        return self.compute.device

    def op_cost(self, op: str, attrs: Mapping[str, Any], input_shapes: Sequence[Shape]) -> float:
        """The `CostModel` protocol: an op on values with no device axes (replicated)."""
        return self.node_cost(NodeInContext.plain(op, attrs, input_shapes)).seconds

    def price(self, node: NodeInContext) -> NodePrice:
        """The `InContextCostModel` protocol: the step's seconds; rows `mem` (per-device bytes kept
        through the step), `comm` (per-device bytes its collectives move in a step) and `wire` (what
        each device sends for them, `Collective.wire_bytes`)."""
        c = self.node_cost(node)
        return NodePrice(c.seconds, {"mem": c.mem_bytes, "comm": float(sum(col.bytes for col in c.collectives)),
                                     "wire": float(sum(col.wire_bytes for col in c.collectives)),
                                     **({"recompute_s": c.recompute_s, "recompute_mem": c.recompute_bytes}
                                        if c.recompute_bytes else {})})

    def node_cost(self, node: NodeInContext) -> NodeCost:
        """A node's step cost in context: its inputs' and output's device axes (`axes`), which
        input is a leaf (`leaf`), is a weight moved by distribution ops only (`weight_derived`: its
        backward buffer lives until the gradient sync) or depends on a weight (`needs_grad`; a
        distribution op on a value no weight reaches has no backward collective)."""
        op, attrs, input_shapes = node.op, node.attrs, node.input_shapes
        spec = ops.op_spec(op)
        if spec.is_leaf:
            return NodeCost(0.0, 0.0, (), 0.0)
        input_depths = [len(v.axes) for v in node.inputs]
        depth = len(node.output.axes)
        leaf_children = [v.leaf for v in node.inputs]
        out_shape = ops.infer_shapes(op, input_shapes, attrs)[0]
        in_bytes = [per_device_bytes(s, d) for s, d in zip(input_shapes, input_depths)]
        out_bytes = per_device_bytes(out_shape, depth)
        derived = [v.weight_derived for v in node.inputs]
        grad = [v.needs_grad for v in node.inputs]
        copies = self.state_copies or 0.0
        kept = node_kept(op, attrs, in_bytes, out_bytes, leaf_children, derived, grad, copies)
        fresh = node_allocated(op, attrs, in_bytes, out_bytes, leaf_children, derived, grad)
        bound = node_bound(op, attrs, in_bytes, out_bytes, leaf_children, derived, grad, copies)
        fresh_s = fresh * self.fresh_rate
        local = [tuple(s[d:]) for s, d in zip(input_shapes, input_depths)]
        update = self._update_s(op, local, tuple(out_shape[depth:]), leaf_children)
        if op in COLLECTIVES:
            first = node.inputs[0]
            found = self._distribution(op, attrs, input_shapes[0], input_depths[0], out_shape, depth, leaf_children[0],
                                       not grad[0], first.axes if first.weight_replicated else ())
            backward = any(c.phase == "backward" for c in found) or (op in ("combine", "all_gather") and grad[0])
            copied, copy_s = self._copies(op, attrs, local[0], in_bytes[0], out_bytes, backward)
            # a collective's sums are priced in its alpha-beta time
            return NodeCost(update, 0.0, found, kept, bound, copy_bytes=copied, copy_s=copy_s, fresh_bytes=fresh,
                            fresh_s=fresh_s)
        forward = self.compute.op_cost(op, local_attrs(op, attrs, depth), local)
        freed = recompute_bytes(op, attrs, out_bytes, grad, derived)
        copied, copy_s = self._copies(op, attrs, local[0] if local else (), in_bytes[0] if in_bytes else 0.0, out_bytes,
                                      any(grad))
        return NodeCost(forward * (1 + BACKWARD_FACTOR) + update, forward, (), kept, bound, forward if freed else 0.0, freed,
                        copied, copy_s, fresh, fresh_s)

    def _copies(self, op: str, attrs: Mapping[str, Any], local_in: Shape, in_bytes: float, out_bytes: float,
                backward: bool) -> tuple[float, float]:
        """The bytes the compiled step copies for this node (`LAYOUT_COPIES`; `local_in` the
        per-device input shape, `backward` whether it runs a backward) and their seconds."""
        rule = LAYOUT_COPIES.get(op) if self.layout_copies else None
        if rule is None or (rule.minor_only and _major_dim(local_in, attrs.get("dim"))):
            return 0.0, 0.0
        size = in_bytes if rule.buffer == "in" else out_bytes
        copied = size * (rule.forward + (rule.backward if backward else 0.0))
        if copied <= 0:
            return 0.0, 0.0
        if rule.timed_with is not None and self.mesh.axes[int(attrs["axis"])].has_own_link(rule.timed_with):
            return copied, 0.0
        if rule.fill or self.copy_rate is None:  # an elementwise pass over the buffers (a zero fill writes one)
            return copied, self.compute.op_cost("relu", {}, [(max(int(copied // 4), 1),)])
        return copied, copied / self.copy_rate

    def _update_s(self, op: str, local_in: Sequence[Shape], local_out: Shape, leaves: Sequence[str | None]) -> float:
        """The optimizer update of the weights this node reads, on the piece each device holds (a
        `partition`'s output, else the whole weight): an elementwise pass over 3 + 2 x state_copies
        buffers of that size (read w, g and the state, write w and the state), priced as `ewadd`
        (which moves 3) is."""
        if self.state_copies is None:
            return 0.0
        total = 0.0
        for shape, leaf in zip(local_in, leaves):
            if leaf == "weight":
                piece = local_out if op == "partition" else shape
                total += self.compute.op_cost("ewadd", {}, [piece, piece]) * (3 + 2 * self.state_copies) / 3
        return total

    def _distribution(self, op: str, attrs: Mapping[str, Any], in_shape: Shape, in_depth: int, out_shape: Shape,
                      depth: int, leaf: str | None, grad_free: bool = False,
                      joined: tuple[int, ...] = ()) -> tuple[Collective, ...]:
        """`grad_free`: no weight reaches the input, so no gradient flows back through this op and
        it has no backward collective (JAX transposes only what carries a cotangent). `joined`: the
        input is a weight replicated over these axes (`ValueContext.weight_replicated`), so a
        `replicate`'s gradient sync joins theirs (`_joined_sync`)."""
        fwd, bwd, measured_on = COLLECTIVES[op]
        axis = int(attrs["axis"])
        size = per_device_bytes(in_shape, in_depth) if measured_on == "in" else per_device_bytes(out_shape, depth)
        found: list[Collective] = []
        if fwd is not None:
            found.append(self._collective(fwd, axis, size, "forward", op, f"{op} over axis {axis}"))
        if bwd is not None:
            if grad_free or (ops.OPS[op].distribution == "enter" and leaf == "input"):
                pass  # no gradient flows into data, nor into values computed from data alone
            elif op == "partition" and leaf == "weight":
                pass  # a sharded weight keeps a sharded gradient
            elif op == "replicate" and joined:
                found.append(self._joined_sync(axis, joined, size, op))
            elif op == "replicate" and leaf == "weight":
                found.append(self._collective(bwd, axis, size, "grad-sync", op, f"gradient of a weight replicated over axis {axis}"))
            else:
                found.append(self._collective(bwd, axis, size, "backward", op, f"transpose of {op} over axis {axis}"))
        return tuple(found)

    def _joined_sync(self, axis: int, joined: tuple[int, ...], size: float, op: str) -> Collective:
        """The gradient sync of a weight replicated over `joined` and then over `axis`: XLA runs one
        all-reduce over all of them, not one per axis. The replicate nearest the weight prices its
        axis's all-reduce with the buffer's bytes (its `grad-sync`); each replicate on top adds what
        one all-reduce over its axis and those below takes beyond theirs, and no bytes, so a chain
        sums to one all-reduce of the buffer over all its axes (a weight replicated over both axes of
        2x4 is one 8-device all-reduce, where two per-axis all-reduces moved twice the bytes)."""
        over = (*joined, axis)
        seconds = (self.mesh.collective_seconds_over("all-reduce", over, size)
                   - self.mesh.collective_seconds_over("all-reduce", joined, size))
        wire = (self.mesh.wire_bytes_over("all-reduce", over, size)
                - self.mesh.wire_bytes_over("all-reduce", joined, size))
        return Collective("all-reduce", axis, 0.0, max(seconds, 0.0), "grad-sync", op,
                          f"gradient of a weight replicated over axes {', '.join(map(str, over))}: joins the all-reduce "
                          f"over axis {joined[0]} into one over all of them (its bytes counted there)", max(wire, 0.0))

    def _collective(self, kind: str, axis: int, size: float, phase: str, op: str, why: str) -> Collective:
        return Collective(kind, axis, size, self.mesh.collective_seconds(kind, axis, size), phase, op, why,
                          self.mesh.wire_bytes(kind, axis, size))


def _major_dim(local: Shape, dim: Any) -> bool:
    """Whether `dim` (negative, of the per-device shape `local`) is its major dimension: every
    dimension before it has one element, so pieces stacked along it need no transpose."""
    if dim is None or not local:
        return True
    index = len(local) + int(dim) if int(dim) < 0 else int(dim)
    return all(d == 1 for d in local[:index])


def parallel_model(device: str, mesh: str | Mesh = "cpu8", compute: str = "roofline", **options: Any) -> ParallelCostModel:
    """Factory registered as `parallel` in `eqsat.cost.COST_MODEL_FACTORIES`."""
    m = mesh if isinstance(mesh, Mesh) else parse_mesh(mesh)
    return ParallelCostModel(m, cost_models.cost_model(compute, device, **options))


cost_models.register_cost_model("parallel", parallel_model)

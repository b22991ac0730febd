"""Per-device memory of a plan's training step, predicted by a liveness simulation.

What `memory_analysis()` of the compiled step (`jax.grad` of the plan's `shard_map`) counts is
arguments + outputs + temporaries. Arguments and outputs follow from the plan: every leaf as it
is passed (its shard when every use is the same partition, `sharded_leaves`), and every weight's
gradient shaped as its argument. The temporaries are no sum: XLA's buffer assignment reuses memory
(the output buffers too) for values whose lifetimes do not overlap. So the step is simulated in the
order JAX emits it, every buffer with its lifetime, and the buffers laid out as XLA lays them out:

- at the start of the step, what XLA's scheduler computes from arguments alone: the zeros each
  `partition`'s transpose pads its cotangent into (in place, so that buffer becomes the cotangent)
  and the relaid copies of moved weights a convolution reads;
- forward, in plan order: each node's output is a buffer (`replicate` and `reduce` alias their
  input, so do `partition`s of a leaf passed sharded and the `is_view` ops); it is freed after its
  last forward use unless the backward needs it (`RESIDUALS`: a matmul keeps the operand the other
  one's gradient needs, tanh / sigmoid / exp their output, a relu its input, a max its input
  and output (its cotangent goes where they are equal); a relu fused into a matmul keeps the
  product under it, a buffer next to the output; a convolution runs channels-last on XLA's CPU
  backend, so it reads relaid copies of w and of x, and keeps them for dx and dw), then it lives
  until that node's backward;
- backward, in reverse plan order: each node turns its output's cotangent into its inputs'
  (one buffer per input that needs a gradient; `reduce` aliases; a `partition` writes its pad),
  contributions of several uses are summed in place, and the cotangent is freed after its node;
- the gradient sync: the all-reduces that sum a weight's gradient over the devices that share it
  (transposes of `replicate` / `partition` of a weight moved by distribution ops only) are
  independent of the rest of the backward, and XLA combines them into one all-reduce at the end
  of the step, so their unreduced inputs live until then, next to their results.

The layout (`_Heap.packed_temp`): a value sits in a weight's gradient buffer when it fits and dies
before the gradient is written; the rest share one temporary allocation at fixed offsets, placed
by best fit largest first (or longest-lived first, whichever is smaller), as XLA's heap simulator
does, so the temporaries are the peak of live bytes plus what that packing leaves unused.

`StepMemory.peak` is the prediction (`predicted_mem_bytes`). A peak is no sum over nodes, so the
ILP sees two linear stand-ins per e-node: `node_bound`, every buffer the simulation allocates for
the node (summed over a plan, `StepMemory.allocated`: an upper bound of the peak, about 2x it), and
`node_kept`, what stays live through the step (arguments, gradients, the outputs of matmuls and of
data-moving collectives, the buffers a node's forward makes for its backward, a weight's unreduced
gradient): close to the peak, and the ILP's memory row. The planner checks the extracted plan's
simulated peak against the budget and solves again with a tighter row when it is over
(`eqsat.parallel.planner.plan_graph`).

Activation checkpointing (`recompute`): a product (matmul, conv) in `recompute` and its tail (what
is computed from it without another product: bias add, activation) are not kept for the backward.
Their buffers are freed after their last forward use and no node holds them; the backward makes a
value again (its recomputed inputs first) just before the first node, in reverse order, that
reads it, and frees it after its own backward (a value only the recompute reads, once what reads
it is made). `recompute_bytes` is what a product's recompute takes off its term of the memory row
(the row's stand-in for the product's activation: its output and the product under a fused relu).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from eqsat import ops
from eqsat.ir import Graph

Axes = tuple[int, ...]
ITEMSIZE = 4
ELEMENTWISE_SAVE_OUTPUT = ops.ops_where(lambda s: s.grad_reads == "output")  # tanh, sigmoid, exp: f'(x) from f(x)
ELEMENTWISE_SAVE_INPUT = ops.ops_where(lambda s: s.grad_reads == "input")  # jax.nn.relu masks by the input's sign
GRADIENT_SYNC = ops.with_role("enter")  # replicate, partition: their transpose is an all-reduce over the axis
ALIASES = ops.ops_where(lambda s: s.aliases)  # replicate, reduce: forward, no buffer of their own
RECOMPUTABLE = ops.ops_where(lambda s: s.contraction)  # matmul, conv2d: what activation checkpointing may recompute


OUT = -1  # a `Saved` index naming the node's output
Saved = tuple[str, int]  # ("hold", k): the backward reads input k's buffer (OUT: the output's);
# ("new", k): the forward makes a buffer as big as input k (OUT: the output) that the backward reads;
# ("scratch", k): the forward makes a buffer as big as input k that only the forward reads


def _activation_saved(attrs: Mapping[str, object]) -> tuple[Saved, ...]:
    """A sigmoid's or tanh's derivative reads the output; jax.nn.relu's masks by the sign of the
    product under it, which XLA keeps as a buffer of its own next to the output."""
    act = int(attrs.get("act", 0) or 0)  # type: ignore[call-overload]
    if not act:
        return ()
    return (("new", OUT),) if act == ops.Activation.RELU else (("hold", OUT),)


def _matmul_residuals(attrs: Mapping[str, object], needs_grad: Sequence[bool]) -> tuple[Saved, ...]:
    """y = act(a @ b): da needs b, db needs a."""
    kept: list[Saved] = []
    if needs_grad[0]:
        kept.append(("hold", 1))
    if needs_grad[1]:
        kept.append(("hold", 0))
    return (*kept, *_activation_saved(attrs))


def _conv_residuals(attrs: Mapping[str, object], needs_grad: Sequence[bool]) -> tuple[Saved, ...]:
    """y = act(conv(x, w)) as XLA's CPU backend runs it: in channels-last layouts, so dx's
    transposed convolution reads a relaid copy of w and dw's reads a relaid copy of x, both made
    in the forward and kept to the backward (x itself is free after its forward uses)."""
    kept: list[Saved] = [("scratch", 1), ("scratch", 0)]  # the forward's relaid w, and x (unless `_channels_last`)
    if needs_grad[0]:
        kept.append(("new", 1))
    if needs_grad[1]:
        kept.append(("new", 0))
    return (*kept, *_activation_saved(attrs))


def _channels_last(graph: Graph) -> list[bool]:
    """Values XLA's CPU backend already lays out as a convolution reads them: a conv's output, and
    what elementwise ops and `replicate` make of such values (they keep their operand's layout)."""
    out: list[bool] = []
    for n in graph.nodes:
        keeps = ops.OPS[n.op].elementwise or n.op == "replicate"
        out.append(n.op == "conv2d" or (keeps and bool(n.inputs) and all(out[v.node] for v in n.inputs)))
    return out


# op → (attrs, which inputs need a gradient) → what its backward reads (`Saved`).
RESIDUALS: Mapping[str, Callable[[Mapping[str, object], Sequence[bool]], tuple[Saved, ...]]] = MappingProxyType({
    "matmul": _matmul_residuals,
    "conv2d": _conv_residuals,
    "ewmul": lambda attrs, g: tuple(("hold", i) for i, need in ((1, g[0]), (0, g[1])) if need),
    # JAX's rule for max: the cotangent goes where the input equals the max, so both are read
    "reduce_max": lambda attrs, g: (("hold", 0), ("hold", OUT)),
    **{op: (lambda attrs, g: (("hold", OUT),)) for op in ELEMENTWISE_SAVE_OUTPUT},
    **{op: (lambda attrs, g: (("hold", 0),)) for op in ELEMENTWISE_SAVE_INPUT},
})


def per_device_bytes(shape: Sequence[int], depth: int) -> float:
    return float(ITEMSIZE * math.prod(shape[depth:]))


def sharded_leaves(graph: Graph) -> dict[int, tuple[int, int]]:
    """Leaf node → (dim from the front, mesh axis) for leaves whose every use is the same partition:
    such a leaf is passed to the program already sharded."""
    uses: dict[int, set[tuple[str, tuple[tuple[str, object], ...]]]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            uses.setdefault(v.node, set()).add((n.op, n.attrs))
    out: dict[int, tuple[int, int]] = {}
    for i, n in enumerate(graph.nodes):
        if ops.OPS[n.op].is_leaf and len(uses.get(i, ())) == 1:
            ((op, attrs),) = uses[i]
            if op == "partition":
                a = dict(attrs)
                out[i] = (len(n.shapes[0]) + int(a["dim"]), int(a["axis"]))  # type: ignore[call-overload]
    return out


@dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one training step."""

    arguments: float
    outputs: float  # the weights' gradients
    peak: float  # arguments + the most bytes live at once (outputs included)
    allocated: float  # arguments + every buffer the simulation creates (an upper bound of peak)
    node_bytes: tuple[float, ...]  # per plan node: the buffers allocated for it (sums to allocated - arguments)

    @property
    def temp(self) -> float:
        return self.peak - self.arguments - self.outputs


class _Heap:
    """Buffers with their lifetimes (a buffer is freed when its last holder lets go), and the
    bytes of temporaries XLA's buffer assignment needs for them (`packed_temp`)."""

    def __init__(self, output_slots: Sequence[float]) -> None:
        self.size: dict[int, float] = {}
        self.refs: dict[int, int] = {}
        self.birth: dict[int, int] = {}
        self.death: dict[int, int] = {}
        self.output_slot: dict[int, float] = {}  # buffer → the output buffer it is
        self.slots = list(output_slots)
        self.allocated = 0.0
        self.clock = 0

    def new(self, size: float) -> int:
        b = len(self.size)
        self.size[b], self.refs[b], self.birth[b] = size, 1, self.clock
        self.clock += 1
        self.allocated += size
        return b

    def hold(self, b: int) -> int:
        self.refs[b] += 1
        return b

    def drop(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.death[b] = self.clock
            self.clock += 1

    def mark_output(self, b: int, slot: float) -> None:
        """Buffer b is a weight's gradient: it lives in that weight's output buffer."""
        if b not in self.output_slot:
            self.output_slot[b] = slot

    def packed_temp(self) -> float:
        """The temporaries as XLA's buffer assignment lays them out: a value goes into an output
        buffer when it is no larger and lives wholly before that output is written, one value at a
        time, the smallest such buffer first (values taken largest first); the rest share one temp
        allocation, placed at fixed offsets by best fit in decreasing order of size (or of
        lifetime, whichever packs tighter), so its size is the peak live bytes plus fragmentation."""
        end = self.clock + 1
        span = {b: (self.birth[b], self.death.get(b, end)) for b in self.size}
        slots: list[tuple[float, list[tuple[int, int]]]] = []  # (size, lifetimes in it)
        free = list(self.slots)
        for b, slot in self.output_slot.items():
            if slot in free:
                free.remove(slot)
                slots.append((slot, [(self.birth[b], end)]))
        slots += [(slot, []) for slot in free]
        slots.sort(key=lambda s: s[0])
        temps = sorted((b for b in self.size if b not in self.output_slot), key=lambda b: (-self.size[b], b))
        heap: list[int] = []
        for b in temps:
            lo, hi = span[b]
            for slot, held in slots:
                if slot >= self.size[b] and all(until <= lo or hi <= since for since, until in held):
                    held.append((lo, hi))
                    break
            else:
                heap.append(b)
        by_size = sorted(heap, key=lambda b: (-self.size[b], -(span[b][1] - span[b][0]), b))
        by_life = sorted(heap, key=lambda b: (-(span[b][1] - span[b][0]), -self.size[b], b))
        return min(_best_fit(by_size, self.size, span), _best_fit(by_life, self.size, span))


def _best_fit(order: Sequence[int], size: Mapping[int, float], span: Mapping[int, tuple[int, int]]) -> float:
    """Heap size when each buffer, in `order`, takes the smallest gap that holds it among the
    buffers placed before it that are live at the same time (the top of the heap if none)."""
    placed: list[tuple[int, int, float, float]] = []  # (birth, death, offset, size)
    top = 0.0
    for b in order:
        lo, hi = span[b]
        busy = sorted((off, off + sz) for since, until, off, sz in placed if since < hi and lo < until)
        best: tuple[float, float] | None = None  # (gap, offset)
        at = 0.0
        for start, stop in busy:
            gap = start - at
            if gap >= size[b] and (best is None or gap < best[0]):
                best = (gap, at)
            at = max(at, stop)
        offset = best[1] if best is not None else at
        placed.append((lo, hi, offset, size[b]))
        top = max(top, offset + size[b])
    return top


def step_memory(graph: Graph, axes: Sequence[Axes], state_copies: float = 0.0,
                recompute: Collection[int] = ()) -> StepMemory:
    """Simulate the training step of `graph` (device axes per node, `plan.graph_axes`); see the
    module docstring for what is live when. `state_copies`: optimizer state per weight, in copies
    of it (Adam: 2), held as the weight is passed (sharded with it: ZeRO / FSDP). `recompute`: the
    products (node indices) the backward makes again instead of keeping (activation checkpointing)."""
    g = graph
    n_nodes = len(g.nodes)
    size = [per_device_bytes(n.shapes[0], len(axes[i])) for i, n in enumerate(g.nodes)]
    leaf = [ops.OPS[n.op].is_leaf for n in g.nodes]
    sharded = sharded_leaves(g)
    for j, n in enumerate(g.nodes):  # a leaf passed sharded is as big as its partition
        if n.op == "partition" and n.inputs[0].node in sharded:
            size[n.inputs[0].node] = size[j]
    arguments = sum(size[i] * (1 + state_copies if g.nodes[i].op == "weight" else 1) for i in range(n_nodes) if leaf[i])
    needs_grad: list[bool] = []
    for n in g.nodes:
        needs_grad.append(n.op == "weight" or any(needs_grad[v.node] for v in n.inputs))
    moved = ops.weight_derived(((i, n.op, [v.node for v in n.inputs]) for i, n in enumerate(g.nodes)), moved_only=True)
    derived = [i in moved for i in range(n_nodes)]
    channels_last = _channels_last(g)
    alias_of_input = [n.op in ALIASES or ops.OPS[n.op].is_view
                      or (n.op == "partition" and n.inputs[0].node in sharded) for n in g.nodes]
    node_bytes = [0.0] * n_nodes
    heap = _Heap([size[i] for i in range(n_nodes) if g.nodes[i].op == "weight"])

    def new(i: int, nbytes: float) -> int:
        node_bytes[i] += nbytes
        return heap.new(nbytes)

    # what the backward reads, per node; a buffer made from arguments alone (a pad of zeros, a
    # relaid copy of a moved weight) XLA's scheduler makes at the start of the step
    saved = {i: RESIDUALS[n.op](n.attr, [needs_grad[v.node] for v in n.inputs])
             for i, n in enumerate(g.nodes) if n.op in RESIDUALS and needs_grad[i]}
    early: dict[tuple[int, int], int] = {}
    for i, kept in saved.items():
        for j, (how, k) in enumerate(kept):
            src = g.nodes[i].inputs[k].node if k != OUT else i
            if how in ("new", "scratch") and (leaf[src] or derived[src]):
                early[(i, j)] = new(i, size[src])
    pads = {i: new(i, size[n.inputs[0].node]) for i, n in enumerate(g.nodes)
            if n.op == "partition" and needs_grad[n.inputs[0].node] and not alias_of_input[i]}

    # forward: last forward use and residual holders
    last_use = [-1] * n_nodes
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last_use[v.node] = i
    for v in g.outputs:
        last_use[v.node] = n_nodes  # the loss reads the outputs
    buf: dict[int, int] = {}  # forward value → buffer (absent for arguments)
    residual_of: dict[int, list[int]] = {}  # node → buffers its backward reads
    # checkpointed products and their tails: what is computed from one without another product
    # (its bias add, activation, a replicate of it), all made again in the backward
    again = _recomputed_tail(g, recompute)
    extra = {i: [size[i] for how, k in saved.get(i, ()) if how == "new" and k == OUT] for i in again}
    remade_at: dict[int, set[int]] = {}  # node → recomputed values its backward reads (made again first)
    for r, more in extra.items():
        if more:  # its own backward reads the product under its relu
            remade_at.setdefault(r, set()).add(r)
    for i, n in enumerate(g.nodes):
        if leaf[i]:
            continue
        if alias_of_input[i]:
            src = n.inputs[0].node
            if src in buf:
                buf[i] = heap.hold(buf[src])
        else:
            buf[i] = heap.new(size[i])
            node_bytes[i] += size[i]
        if i in saved:
            kept = saved[i]
            of = [i if k == OUT else n.inputs[k].node for _, k in kept]
            residual_of[i] = [early.pop((i, j)) if (i, j) in early else new(i, size[h])
                              for j, ((how, k), h) in enumerate(zip(kept, of))
                              if how == "new" and not (k == OUT and i in again)]
            residual_of[i] += [heap.hold(buf[h]) for (how, _), h in zip(kept, of)
                               if how == "hold" and h in buf and h not in again]
            for (how, _), h in zip(kept, of):
                if how == "hold" and h in again:
                    remade_at.setdefault(i, set()).add(h)
            for j, ((how, _), h) in enumerate(zip(kept, of)):
                if how == "scratch" and not (n.op == "conv2d" and h != i and channels_last[h]):
                    heap.drop(early.pop((i, j)) if (i, j) in early else new(i, size[h]))
        for j in {v.node for v in n.inputs}:
            if last_use[j] == i and j in buf:
                heap.drop(buf[j])
    for i in {v.node for v in g.outputs}:
        if i in buf:
            heap.drop(buf[i])

    # backward: cotangents in reverse plan order; the gradient sync waits for the end
    cot: dict[int, int] = {}
    for v in g.outputs:  # d(sum(out**2)/2) = out: one buffer per output
        if needs_grad[v.node] and v.node not in cot:
            cot[v.node] = heap.new(size[v.node])
            node_bytes[v.node] += size[v.node]
    deferred: list[int] = []  # nodes whose all-reduce of a weight's gradient waits for the end

    def contribute(target: int, b: int) -> None:
        if target in cot:  # summed in place into the first contribution
            heap.drop(b)
        else:
            cot[target] = b
            if g.nodes[target].op == "weight":
                heap.mark_output(b, size[target])

    def backward(i: int, sync_now: bool) -> None:
        n = g.nodes[i]
        c = cot.pop(i)
        for v in n.inputs:
            src = v.node
            if not needs_grad[src]:
                continue
            if n.op in GRADIENT_SYNC and derived[src] and not sync_now and not (n.op == "partition" and src in sharded):
                cot[i] = heap.hold(c) if n.op == "replicate" else pads.pop(i)  # a partition pads
                deferred.append(i)
            elif alias_of_input[i] and not (n.op == "replicate" and derived[src]):
                contribute(src, heap.hold(c))
            else:
                contribute(src, pads.pop(i) if i in pads else new(i, size[src]))
        heap.drop(c)

    remade: set[int] = set()
    read_again = {h for hs in remade_at.values() for h in hs}  # recomputed values a backward reads

    def remake(r: int) -> list[int]:
        """The backward's recompute of r (its recomputed inputs first): its output (unless it
        aliases its input) and the product under its relu; live until r's own backward when a
        backward reads it, else only until what reads it in the recompute is made (returned)."""
        if r in remade:
            return []
        remade.add(r)
        feeding = [b for v in g.nodes[r].inputs if v.node in again for b in remake(v.node)]
        made = [new(r, b) for b in ([] if alias_of_input[r] else [size[r]]) + extra[r]]
        for b in feeding:
            heap.drop(b)
        if r in read_again:
            residual_of.setdefault(r, []).extend(made)
            return []
        return made

    for i in range(n_nodes - 1, -1, -1):
        for r in sorted(remade_at.get(i, ()), reverse=True):
            for b in remake(r):
                heap.drop(b)
        if not leaf[i] and i in cot and needs_grad[i]:
            backward(i, sync_now=False)
        for b in residual_of.pop(i, []):
            heap.drop(b)
    # the combined gradient all-reduce: every unreduced buffer and every result live at once,
    # then what the results feed (a weight's partition under a replicate) in reverse order
    held = [heap.hold(cot[i]) for i in deferred]
    for i in deferred:
        backward(i, sync_now=True)
    for b in held:
        heap.drop(b)
    for i in range(n_nodes - 1, -1, -1):
        if not leaf[i] and i in cot and needs_grad[i]:
            backward(i, sync_now=True)
    outputs = sum(size[i] for i in range(n_nodes) if g.nodes[i].op == "weight")
    return StepMemory(arguments, outputs, arguments + outputs + heap.packed_temp(), arguments + heap.allocated,
                      tuple(node_bytes))


def saved_bytes(op: str, attrs: Mapping[str, object], in_bytes: Sequence[float], out_bytes: float,
                grad_children: Sequence[bool], kinds: frozenset[str]) -> float:
    """Bytes of the buffers of the given `Saved` kinds that a node's forward makes for the backward."""
    if op not in RESIDUALS or not any(grad_children):
        return 0.0
    return sum(out_bytes if k == OUT else in_bytes[k] for how, k in RESIDUALS[op](attrs, grad_children) if how in kinds)


def _recomputed_tail(graph: Graph, recompute: Collection[int]) -> set[int]:
    """The values the backward makes again when the products `recompute` are checkpointed: each
    product and what is computed from it without another product, as the lowering recomputes
    (`eqsat.parallel.remat`)."""
    out: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if n.op in RECOMPUTABLE:
            if i in recompute:
                out.add(i)
        elif not ops.OPS[n.op].is_leaf and any(v.node in out for v in n.inputs):
            out.add(i)
    return out


def recompute_bytes(op: str, attrs: Mapping[str, object], out_bytes: float, grad_children: Sequence[bool],
                    derived_children: Sequence[bool]) -> float:
    """Bytes one product's recompute in the backward takes off its term of the memory row
    (`node_kept`): its output and, under a fused relu, the product kept beside it. Offered for
    the products that read a weight moved by distribution ops only (`derived_children`) and
    carry a gradient: the lowering finds such a product in the user's step by its weight."""
    if op not in RECOMPUTABLE or not any(grad_children) or not any(derived_children):
        return 0.0
    return out_bytes * (1 + sum(1 for how, k in _activation_saved(attrs) if how == "new" and k == OUT))


def node_bound(op: str, attrs: Mapping[str, object], in_bytes: Sequence[float], out_bytes: float,
               leaf_children: Sequence[str | None], derived_children: Sequence[bool],
               grad_children: Sequence[bool], state_copies: float = 0.0) -> float:
    """Bytes per device that one plan node adds to `StepMemory.allocated` at most: the linear term
    of the ILP's memory row. A leaf argument is counted where it is used: its shard under a
    `partition`, else whole (`argument_bytes`); then the buffers the step allocates for the node
    (`node_allocated`). Sound when each leaf is passed as its plan uses it: a leaf both partitioned
    and used otherwise is passed whole and sliced, which this undercounts by the slice and its
    padded gradient."""
    return (argument_bytes(op, in_bytes, out_bytes, leaf_children, state_copies)
            + node_allocated(op, attrs, in_bytes, out_bytes, leaf_children, derived_children, grad_children))


def argument_bytes(op: str, in_bytes: Sequence[float], out_bytes: float, leaf_children: Sequence[str | None],
                   state_copies: float = 0.0) -> float:
    """The step's arguments a node reads, per device, counted where used: a leaf's shard under a
    `partition`, else the whole leaf; a weight with its optimizer state."""
    return sum((out_bytes if op == "partition" else size) * (1 + state_copies if leaf == "weight" else 1)
               for size, leaf in zip(in_bytes, leaf_children) if leaf is not None)


def node_allocated(op: str, attrs: Mapping[str, object], in_bytes: Sequence[float], out_bytes: float,
                   leaf_children: Sequence[str | None], derived_children: Sequence[bool],
                   grad_children: Sequence[bool]) -> float:
    """Bytes per device of the buffers the step allocates for one plan node, at most: its forward
    buffer, the buffers its forward makes besides (`RESIDUALS`: a relu's product, a conv's relaid
    operands), and the cotangent it makes for each input that needs a gradient (`grad_children`; a
    weight's is its gradient output): none where the transpose aliases (`replicate`, `reduce`, the
    partition of a leaf passed sharded), the all-reduced result where a `replicate` syncs a weight's
    gradient, the zero-padded buffer and the result where a `partition` does."""
    total = 0.0
    partition_of_leaf = op == "partition" and leaf_children[0] is not None
    if op not in ALIASES and not ops.OPS[op].is_view and not partition_of_leaf:
        total += out_bytes
    total += saved_bytes(op, attrs, in_bytes, out_bytes, grad_children, frozenset({"new", "scratch"}))
    for size, derived, grad in zip(in_bytes, derived_children, grad_children):
        if not grad or op == "reduce" or partition_of_leaf:
            continue
        if op == "replicate":
            total += size if derived else 0.0
        elif op == "partition" and derived:
            total += 2 * size
        else:
            total += size
    return total


# matmul, conv2d, and the collectives that move data forward into a buffer of their own
KEPT_OUTPUTS = ops.ops_where(lambda s: s.contraction or (s.collectives is not None and s.collectives.forward is not None
                                                         and not s.aliases))


def node_kept(op: str, attrs: Mapping[str, object], in_bytes: Sequence[float], out_bytes: float,
              leaf_children: Sequence[str | None], derived_children: Sequence[bool],
              grad_children: Sequence[bool], state_copies: float = 0.0) -> float:
    """Bytes per device one plan node keeps through the step, the ILP's memory row: the leaf
    arguments it uses (a shard under a `partition`) and a weight's gradient and optimizer state
    (`state_copies` copies of it), its output if it is a
    matmul's or a data-moving collective's (what the backward reads), the buffers its forward
    makes for its backward (a relu's product, a conv's relaid operands), and a weight's unreduced
    gradient under a `replicate` / `partition` (it waits for the combined all-reduce)."""
    total = 0.0
    for size, leaf in zip(in_bytes, leaf_children):
        if leaf is not None:
            total += (out_bytes if op == "partition" else size) * (2 + state_copies if leaf == "weight" else 1)
    if op in KEPT_OUTPUTS:
        total += out_bytes
    total += saved_bytes(op, attrs, in_bytes, out_bytes, grad_children, frozenset({"new"}))
    if op in GRADIENT_SYNC and leaf_children[0] is None and derived_children[0]:
        total += in_bytes[0]
    return total

"""Run a parallel plan (a Graph with eqsat.parallel's distribution ops) on a JAX device mesh.

The plan becomes one `shard_map` over a `jax.sharding.Mesh` whose axes are the plan mesh's axes:
each device holds, for every value, its own piece (a value's leading device axes are dropped,
`eqsat.parallel.planner.graph_axes`), runs each compute op on its piece (lowered by the ordinary
lowering table with per-device attributes) and the distribution ops as explicit collectives:

| plan op | per device |
|---|---|
| partition | the device's block (dynamic slice at `axis_index`; its transpose is an all-reduce of the zero-padded gradient); for a leaf only ever partitioned the same way, the argument is passed sharded instead |
| replicate | `lax.pcast(to="varying")` (no data moves; its transpose is the gradient's all-reduce; a weight replicated over several axes is one pcast over all of them, so one all-reduce) |
| combine | JAX's invariant all-gather (its transpose is a local slice) |
| all_gather | `lax.all_gather(tiled=True)` (its transpose is a reduce-scatter) |
| reduce / all_reduce | `lax.psum` / and `pcast(to="varying")` |
| reduce_scatter | `lax.psum_scatter(tiled=True)` |
| all_to_all | `lax.all_to_all(tiled=True)` |

Values are typed by JAX's varying-manual-axes check (`check_vma`), so the transposes JAX derives
for the training step are the ones `eqsat.parallel.cost` prices. The invariant all-gather is
JAX's own (`lax.all_gather_invariant` where public, else `jax._src.lax.parallel`'s, as in JAX 0.12;
without either a combine is refused with a clear error rather than run another way). So the
program states the plan exactly and XLA adds no resharding of its own; `compiled_report`
reads back what the compiled program communicates (kind, replica groups, bytes per device, from
`compile().as_text()`) and its memory (`memory_analysis()`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from eqsat import ops
from eqsat.distribution import local_attrs
from eqsat.errors import EqsatError
from eqsat.ir import Graph
from eqsat.parallel.memory import sharded_leaves
from eqsat.parallel.mesh import Mesh
from eqsat.parallel.planner import graph_axes, replicated_weights
from eqsat.parallel.timemodel import wire_bytes
from jax_backend.lower import lower_node

Array = Any


class ShardError(EqsatError):
    """A plan that cannot run on the available devices."""


def _invariant_all_gather() -> Any:
    """JAX's all-gather whose result is invariant over the axis (transpose: a local slice)."""
    public = getattr(lax, "all_gather_invariant", None)
    if public is not None:
        return public
    try:
        from jax._src.lax.parallel import _all_gather_invariant
    except ImportError:
        raise ShardError(f"this JAX ({jax.__version__}) has no invariant all-gather, which `combine` lowers to; "
                         "JAX 0.8.2 to 0.12 have it") from None
    return _all_gather_invariant


def jax_mesh(mesh: Mesh, devices: Sequence[Any] | None = None) -> JaxMesh:
    devs = list(devices if devices is not None else jax.devices())
    if len(devs) < mesh.n_devices:
        raise ShardError(f"mesh {mesh.name} needs {mesh.n_devices} devices, JAX has {len(devs)} "
                         f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={mesh.n_devices})")
    return JaxMesh(np.asarray(devs[: mesh.n_devices]).reshape(mesh.shape), mesh.axis_names)


def _collective(op: str, x: Array, a: Mapping[str, Any], name: str, parts: int) -> Array:
    nd = x.ndim
    if op == "partition":
        size = x.shape[nd + a["dim"]] // parts
        return lax.dynamic_slice_in_dim(x, lax.axis_index(name) * size, size, axis=nd + a["dim"])
    if op == "replicate":  # each device's copy may now diverge: the transpose sums the copies
        return lax.pcast(x, (name,), to="varying")
    if op == "combine":  # the result is one value again: the gather's transpose is a local slice
        return _invariant_all_gather()(x, name, axis=nd + a["dim"], tiled=True)
    if op == "all_gather":
        return lax.all_gather(x, name, axis=nd + a["dim"], tiled=True)
    if op == "reduce":
        return lax.psum(x, name)
    if op == "all_reduce":
        return lax.pcast(lax.psum(x, name), (name,), to="varying")
    if op == "reduce_scatter":
        return lax.psum_scatter(x, name, scatter_dimension=nd + a["dim"], tiled=True)
    if op == "all_to_all":
        return lax.all_to_all(x, name, nd + a["split_dim"], nd + a["concat_dim"], tiled=True)
    raise ShardError(f"no collective for {op}")


DISTRIBUTION_OPS = ops.DISTRIBUTION_OPS


@dataclass(frozen=True)
class ShardedProgram:
    """`fn(*arrays)` in `names` order: the plan on `mesh`; `in_shardings` place the arguments."""

    fn: Any  # the jitted function: fn(*arrays) -> list of outputs; also fn.lower(...)
    names: tuple[str, ...]
    mesh: JaxMesh
    in_shardings: tuple[NamedSharding, ...]

    def place(self, values: Mapping[str, np.ndarray]) -> list[Array]:
        return [jax.device_put(jnp.asarray(values[n]), s) for n, s in zip(self.names, self.in_shardings)]


def shard_plan(plan: Graph, mesh: Mesh, devices: Sequence[Any] | None = None) -> ShardedProgram:
    """The plan as one jitted shard_map over `mesh` (see the module docstring)."""
    g = plan.live()
    axes = graph_axes(g)
    jm = jax_mesh(mesh, devices)
    names_of_axes = mesh.axis_names
    sharded = sharded_leaves(g)
    leaves = [(i, n) for i, n in enumerate(g.nodes) if ops.OPS[n.op].is_leaf]
    specs = []
    for i, n in leaves:
        spec: list[str | None] = [None] * len(n.shapes[0])
        if i in sharded:
            dim, ax = sharded[i]
            spec[dim] = names_of_axes[ax]
        specs.append(P(*spec))

    joined = {j for j in replicated_weights((k, m.op, [v.node for v in m.inputs]) for k, m in enumerate(g.nodes))
              if g.nodes[j].op == "replicate"}

    def body(*arrays: Array) -> list[Array]:
        vals: dict[int, Array] = {}
        for (i, _), arr in zip(leaves, arrays):
            vals[i] = arr
        for i, n in enumerate(g.nodes):
            if i in vals:
                continue
            with jax.named_scope(f"{n.op}.{i}"):  # the compiled step's op names say which plan node ran
                xs = [vals[v.node] for v in n.inputs]
                a = n.attr
                if n.op in DISTRIBUTION_OPS:
                    ax = int(a["axis"])
                    if n.op == "replicate" and n.inputs[0].node in joined:
                        # a weight replicated over several axes: one pcast over all of them, so its
                        # gradient sync is one all-reduce over them (as `eqsat.parallel.cost` prices it)
                        root, over = _replicate_chain(g, i, names_of_axes)
                        vals[i] = lax.pcast(vals[root], over, to="varying")
                    elif n.op == "partition" and n.inputs[0].node in sharded:
                        vals[i] = xs[0]  # passed in sharded
                    else:
                        vals[i] = _collective(n.op, xs[0], a, names_of_axes[ax], mesh.axes[ax].size)
                else:
                    vals[i] = lower_node(n.op, xs, local_attrs(n.op, a, len(axes[i])))[0]
        return [vals[v.node] for v in g.outputs]

    fn = jax.shard_map(body, mesh=jm, in_specs=tuple(specs), out_specs=[P()] * len(g.outputs), check_vma=True)
    return ShardedProgram(jax.jit(fn), tuple(n.attr["name"] for _, n in leaves), jm,
                          tuple(NamedSharding(jm, s) for s in specs))


def _replicate_chain(g: Graph, i: int, names: Sequence[str]) -> tuple[int, tuple[str, ...]]:
    """The weight under a chain of `replicate`s ending at node `i`, and the chain's axis names
    (innermost first)."""
    over: list[str] = []
    while g.nodes[i].op == "replicate":
        over.append(names[int(g.nodes[i].attr["axis"])])
        i = g.nodes[i].inputs[0].node
    return i, tuple(reversed(over))


# --- what the compiled program does ----------------------------------------------------------------

_DTYPE_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}
_COLLECTIVE_LINE = re.compile(
    r"=\s*(?P<result>.*?)\s+(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")
_SHAPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_CONTRACTION_LINE = re.compile(r"=\s*\S+\s+(?:dot|convolution)\(")
_GROUPS = re.compile(r"replica_groups=(mesh\[[^\]]*\] \{[^}]*\}|\{[^=]*?\}\}|\[[^\]]*\]<=\[[^\]]*\][^,]*)")


@dataclass(frozen=True)
class CompiledCollective:
    kind: str
    bytes: float  # per device, measured as in eqsat.parallel.cost (reduce-scatter: its input)
    groups: str
    # an all-reduce whose every use keeps one device's 1/n slice of it (`sliced_all_reduces`): the
    # reduce-scatter XLA's CPU backend leaves as all-reduce + dynamic-slice
    sliced: bool = False

    @property
    def group_size(self) -> int:
        """Devices in one replica group (a collective-permute's pairs: 2)."""
        return 2 if self.kind == "collective-permute" else _group_size(self.groups)

    @property
    def wire_bytes(self) -> float:
        """Bytes one device sends for it (`timemodel.wire_bytes`, ring algorithms); a sliced
        all-reduce counts as the reduce-scatter it is."""
        return wire_bytes("reduce-scatter" if self.sliced else self.kind, self.group_size, self.bytes)


def _shape_bytes(text: str) -> float:
    total = 0.0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n * _DTYPE_BYTES.get(dtype, 4)
    return total


def _group_size(groups: str) -> int:
    if groups.startswith("mesh["):  # mesh['a0'=2,'a1'=4] {'a0'}: the listed axes' sizes
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", groups)}
        listed = re.findall(r"'([^']+)'", groups.split("]", 1)[1])
        n = 1
        for name in listed:
            n *= sizes.get(name, 1)
        return n
    first = re.search(r"\{([0-9,]+)\}", groups)
    if first:
        return len(first.group(1).split(","))
    iota = re.search(r"\[(\d+),(\d+)\]<=", groups)
    return int(iota.group(2)) if iota else 1


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<result>.*?)\s+(?P<op>[a-z][\w\-]*)\((?P<args>.*)$")
_INDEX = re.compile(r"\bindex=(\d+)")
_PARAMETER = re.compile(r"parameter\((\d+)\)")
_CALLED = re.compile(r"\bcalls=%?([\w.\-]+)")


@dataclass(frozen=True)
class _Instruction:
    op: str
    result: str
    operands: tuple[str, ...]
    line: str


def _computations(hlo_text: str) -> dict[str, dict[str, _Instruction]]:
    """Per computation of an HLO module, its instructions by name (in the text's order)."""
    out: dict[str, dict[str, _Instruction]] = {}
    body: dict[str, _Instruction] = {}
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            body = out.setdefault(head.group(1), {})
            continue
        m = _INSTRUCTION.match(line)
        if m:
            operands = tuple(re.findall(r"%([\w.\-]+)", m.group("args").split(")", 1)[0]))
            body[m.group("name")] = _Instruction(m.group("op"), m.group("result"), operands, line)
    return out


def _keeps_slice(comps: Mapping[str, Mapping[str, _Instruction]], body: Mapping[str, _Instruction], value: str,
                 size: float, n: int, ranked: set[str]) -> bool:
    """Whether every use of `value` (`size` bytes) in `body` is a dynamic-slice of 1/n of it at an
    offset made from the device's partition id (`ranked`), directly or as the only use of the
    matching parameter of a fusion the use calls."""
    users = [i for i in body.values() if value in i.operands]
    if not users:
        return False
    for use in users:
        if use.op == "dynamic-slice":
            if use.operands[0] != value or _shape_bytes(use.result) * n != size or not ranked & set(use.operands[1:]):
                return False
        elif use.op == "fusion":
            called = _CALLED.search(use.line)
            inner = comps.get(called.group(1), {}) if called else {}
            if not ranked & set(use.operands) or use.operands.count(value) != 1:
                return False
            k = use.operands.index(value)
            params = [name for name, i in inner.items() if i.op == "parameter" and _PARAMETER.search(i.line)
                      and int(_PARAMETER.search(i.line).group(1)) == k]  # type: ignore[union-attr]
            inner_ranked = {name for name, i in inner.items() if i.op == "parameter" and _PARAMETER.search(i.line)
                            and use.operands[int(_PARAMETER.search(i.line).group(1))] in ranked}  # type: ignore[union-attr]
            if len(params) != 1 or not _keeps_slice(comps, inner, params[0], size, n, _derived(inner, inner_ranked)):
                return False
        else:
            return False
    return True


def _derived(body: Mapping[str, _Instruction], seeds: set[str]) -> set[str]:
    """The instructions of `body` computed from the device's partition id (or from `seeds`)."""
    out = set(seeds)
    for name, i in body.items():
        if i.op in ("partition-id", "replica-id") or out & set(i.operands):
            out.add(name)
    return out


def sliced_all_reduces(hlo_text: str) -> set[tuple[str, int]]:
    """(all-reduce name, tuple element) of each all-reduce element whose every use keeps one
    device's 1/n slice of it: a dynamic-slice at an offset made from the partition id, directly or
    inside a fusion. That is a reduce-scatter: GSPMD writes one as all-reduce + dynamic-slice and
    XLA's GPU pipeline rewrites the pair into a reduce-scatter (its reduce-scatter creator); the
    CPU backend runs the all-reduce. An element's use through a `get-tuple-element` counts."""
    comps = _computations(hlo_text)
    found: set[tuple[str, int]] = set()
    for body in comps.values():
        ranked: set[str] | None = None
        for name, ins in body.items():
            if ins.op != "all-reduce":
                continue
            g = _GROUPS.search(ins.line)
            n = _group_size(g.group(1)) if g else 1
            if n <= 1:
                continue
            ranked = _derived(body, set()) if ranked is None else ranked
            sizes = [_shape_bytes(e.group(0)) for e in _SHAPE.finditer(ins.result)]
            if not ins.result.lstrip().startswith("("):
                if _keeps_slice(comps, body, name, sizes[0], n, ranked):
                    found.add((name, 0))
                continue
            elements: dict[int, list[str]] = {}
            for other, j in body.items():
                if j.op == "get-tuple-element" and j.operands == (name,):
                    idx = _INDEX.search(j.line)
                    if idx:
                        elements.setdefault(int(idx.group(1)), []).append(other)
            if any(u.op != "get-tuple-element" for u in body.values() if name in u.operands):
                continue
            found.update((name, k) for k, names in elements.items() if k < len(sizes)
                         and all(_keeps_slice(comps, body, e, sizes[k], n, ranked) for e in names))
    return found


def compiled_collectives(hlo_text: str) -> list[CompiledCollective]:
    """Every collective a step of a compiled HLO module runs; one XLA combined into a tuple counts
    once per element (XLA's combiner merges independent all-reduces; each element is one of the
    plan's), except a tuple all-to-all (no `dimensions=`): XLA's CPU backend splits one array
    all-to-all into a tuple with one chunk per peer, so each group-size run of elements is one
    all-to-all. One inside a while loop's body counts once per trip (`loop_runs`: a layer stack
    under `lax.scan` all-reduces each layer's gradient in the loop), as the planner counts a loop
    body's collectives once per layer (`eqsat.parallel.step_planner.loop_trips`). An all-reduce element
    every use of which keeps one device's slice is marked `sliced` (`sliced_all_reduces`)."""
    found: list[CompiledCollective] = []
    runs = loop_runs(hlo_text)
    sliced = sliced_all_reduces(hlo_text)
    computation = ""
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            computation = head.group(1)
            continue
        m = _COLLECTIVE_LINE.search(line)
        if not m or "-done" in line:
            continue
        kind = m.group("kind")
        g = _GROUPS.search(line)
        groups = g.group(1) if g else ""
        sizes = [_shape_bytes(e.group(0)) for e in _SHAPE.finditer(m.group("result"))]
        if kind == "reduce-scatter":
            sizes = [s * _group_size(groups) for s in sizes]
        per = _group_size(groups) if kind == "all-to-all" and "dimensions=" not in line and len(sizes) > 1 else 1
        named = _INSTRUCTION.match(line)
        name = named.group("name") if named else ""
        found.extend(CompiledCollective(kind, sum(sizes[i:i + per]), groups, kind == "all-reduce" and (name, i) in sliced)
                     for _ in range(runs.get(computation, 1)) for i in range(0, len(sizes), per))
    return found


def compiled_rendezvous(hlo_text: str) -> int:
    """How many collective operations a step of a compiled HLO module runs: every device waits at
    each, so a tuple XLA's combiner made of several of the plan's all-reduces counts once (where
    `compiled_collectives` counts its elements); one inside a loop once per trip (`loop_runs`)."""
    runs = loop_runs(hlo_text)
    computation, found = "", 0
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            computation = head.group(1)
        elif _COLLECTIVE_LINE.search(line) and "-done" not in line:
            found += runs.get(computation, 1)
    return found


_COPY_LINE = re.compile(r"=\s*(?P<result>\S+)\s+copy\(")


def compiled_copy_bytes(hlo_text: str) -> float:
    """Bytes the `copy` instructions of a compiled HLO module write, fused computations included
    (a layout change of a weight or activation, a zero buffer a sliced gradient is padded into):
    work the plan's collectives and products do not name."""
    return sum(_shape_bytes(m.group("result")) for m in map(_COPY_LINE.search, hlo_text.splitlines()) if m)


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"\b(body|condition|calls|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def loop_runs(hlo_text: str) -> dict[str, int]:
    """Per computation of an HLO module, how many times one run of its entry runs it: a while
    loop's body runs its known trip count (`known_trip_count`, as XLA writes it for a `lax.scan`)
    times per run of the computation holding the loop (1 where XLA does not know it); other called
    computations once per call site's run. Computations no call reaches (or an HLO text with no
    computation headers) are absent: callers count them once."""
    calls: dict[str, list[tuple[str, int]]] = {}
    entry, computation = "", ""
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            computation = head.group(1)
            entry = computation if line.startswith("ENTRY") else entry
            continue
        if not computation:
            continue
        trips = _TRIPS.search(line)
        for kind, target in _CALLS.findall(line):
            for callee in re.findall(r"%?([\w.\-]+)", target):
                calls.setdefault(computation, []).append((callee, int(trips.group(1)) if kind == "body" and trips else 1))
    runs: dict[str, int] = {}

    def visit(name: str, times: int, path: frozenset[str]) -> None:
        if name in path:  # no recursion in HLO; guard against a malformed text
            return
        runs[name] = runs.get(name, 0) + times
        for callee, k in calls.get(name, ()):
            visit(callee, times * k, path | {name})

    if entry:
        visit(entry, 1, frozenset())
    return runs


@dataclass(frozen=True)
class CompiledReport:
    collectives: tuple[CompiledCollective, ...]
    mem_bytes: float  # arguments + outputs + temporaries, per device
    memory: dict[str, float]

    @property
    def comm_bytes(self) -> float:
        return float(sum(c.bytes for c in self.collectives))

    def kinds(self) -> list[str]:
        return sorted(c.kind for c in self.collectives)


def compiled_contractions(hlo_text: str) -> int:
    """Products (dot, convolution) in a compiled HLO module, fused computations included: a
    training step of a plan with none recomputed has the forward's plus one per operand that takes
    a gradient (`eqsat.parallel.planner.PlanReport.contractions`)."""
    return sum(1 for line in hlo_text.splitlines() if _CONTRACTION_LINE.search(line))


def compiled_report(program: ShardedProgram, args: Sequence[Array]) -> CompiledReport:
    compiled = program.fn.lower(*args).compile()
    text = compiled.as_text()
    mem = compiled.memory_analysis()
    fields = {k: float(getattr(mem, k, 0) or 0) for k in
              ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes")}
    total = fields["argument_size_in_bytes"] + fields["output_size_in_bytes"] + fields["temp_size_in_bytes"] - fields["alias_size_in_bytes"]
    return CompiledReport(tuple(compiled_collectives(text)), total, fields)


def step_program(program: ShardedProgram, weights: Sequence[str]) -> Any:
    """A jitted training step of the plan: gradients of sum(out**2)/2 with respect to the weights."""
    def loss(*arrays: Array) -> Array:
        return sum(jnp.sum(o.astype(jnp.float32) ** 2) / 2 for o in program.fn(*arrays))

    argnums = tuple(i for i, n in enumerate(program.names) if n in weights)
    return jax.jit(jax.grad(loss, argnums=argnums))

"""Read TASO-serialized `.model` graphs (the files Tensat's benchmarks use) into a `Graph`.

A file is a sequence of four-line blocks: op guid, op type code (TASO's `op_table.txt`), the
inputs as `guid:index` separated by commas, and one line of comma-separated integers whose meaning
depends on the op. The layouts below were read off the five files of Tensat's benchmark set:

| TASO op | code | parameter line |
|---|---|---|
| Input, Weight | 0, 1 | dims (the input line names a placeholder and is ignored) |
| Conv | 3 | input dims (4), weight dims (4), stride h, stride w, padding, activation, pad h, pad w |
| MaxPool, AveragePool | 6, 7 | input dims (4), op code, kernel h, kernel w, stride h, stride w, padding, activation, pad h, pad w |
| Dropout, Relu, BatchNormalization, Add | 4, 8, 11, 16 | output dims |
| Sigmoid, Tanh, Mul, Sub, Div, Max, Exp, Log, Sqrt | 9, 10, 17, 28, 29, 33, 49, 51, 53 | output dims (assumed: not in the five files) |
| Concat | 12 | axis |
| Reshape | 14 | output dims |
| Transpose | 15 | perm then the shuffle flag; VGG's 2-D transposes write the rank first |
| Matmul | 18 | activation, output rank |

Padding (0 SAME, 1 VALID) and activation (0 none, 1 sigmoid, 2 relu, 3 tanh) codes are the IR's.
Pools take a second, dummy weight input in TASO; it is dropped (so is any leaf nothing reads).
Dropout is the identity at inference. Ops outside this table raise `UnknownOpError` naming the op
and the file. Every op's stored dims are checked against the IR's shape inference.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from eqsat.errors import GraphFormatError, ShapeError, UnknownOpError
from eqsat.ir import Graph, GraphBuilder, Tensor

__all__ = ["TASO_OP_NAMES", "TasoBlock", "parse_blocks", "load_taso_model", "SUPPORTED_TASO_OPS"]

TASO_OP_NAMES: Mapping[int, str] = MappingProxyType({
    0: "Input", 1: "Weight", 3: "Conv", 4: "Dropout", 6: "MaxPool", 7: "AveragePool", 8: "Relu",
    9: "Sigmoid", 10: "Tanh", 11: "BatchNormalization", 12: "Concat", 13: "Split", 14: "Reshape",
    15: "Transpose", 16: "Add", 17: "Mul", 18: "Matmul", 20: "Enlarge", 21: "MergeGConv", 26: "Squeeze",
    27: "Unsqueeze", 28: "Sub", 29: "Div", 30: "Equal", 31: "Greater", 32: "Less", 33: "Max", 34: "Min",
    35: "ArgMax", 36: "ArgMin", 37: "ReduceMax", 38: "ReduceMean", 39: "ReduceMin", 40: "ReduceProd",
    41: "ReduceSum", 42: "Pad", 43: "Shape", 44: "Size", 45: "TopK", 46: "Where", 47: "Ceil", 48: "Cast",
    49: "Exp", 50: "Round", 51: "Log", 52: "Not", 53: "Sqrt", 55: "Slice", 56: "Resize",
})
"""TASO's op type codes (from `op_table.txt`)."""


@dataclass(frozen=True)
class TasoBlock:
    """One op of a `.model` file, as written."""

    guid: int
    code: int
    inputs: tuple[tuple[int, int], ...]
    params: tuple[int, ...]
    line: int  # 1-based line of the guid, for messages


@dataclass(frozen=True)
class _Context:
    source: str
    block: TasoBlock

    def fail(self, why: str) -> GraphFormatError:
        name = TASO_OP_NAMES.get(self.block.code, f"op code {self.block.code}")
        return GraphFormatError(f"{self.source}:{self.block.line}: {name} (guid {self.block.guid}): {why}")

    def expect_dims(self, got: Sequence[int], want: Sequence[int], what: str) -> None:
        if tuple(got) != tuple(want):
            raise self.fail(f"{what} are {list(want)} in the file but {list(got)} in the graph")


Converter = Callable[[GraphBuilder, Sequence[Tensor], _Context], Tensor]


def _params(ctx: _Context, count: int) -> tuple[int, ...]:
    if len(ctx.block.params) != count:
        raise ctx.fail(f"expected {count} parameters, found {len(ctx.block.params)}")
    return ctx.block.params


def _n_inputs(ctx: _Context, xs: Sequence[Tensor], count: int) -> None:
    if len(xs) < count:
        raise ctx.fail(f"expected {count} input(s), found {len(xs)}")


def _checked(ctx: _Context, out: Tensor) -> Tensor:
    """Outputs whose parameter line is the output dims."""
    ctx.expect_dims(out.shape, ctx.block.params, "output dims")
    return out


def _conv(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 2)
    p = _params(ctx, 14)
    ctx.expect_dims(xs[0].shape, p[0:4], "input dims")
    ctx.expect_dims(xs[1].shape, p[4:8], "weight dims")
    return b.conv2d(xs[0], xs[1], stride=(p[8], p[9]), pad=p[10], act=p[11])


def _pool(op: str) -> Converter:
    def convert(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
        _n_inputs(ctx, xs[:1], 1)
        p = _params(ctx, 13)
        ctx.expect_dims(xs[0].shape, p[0:4], "input dims")
        if p[4] != ctx.block.code:
            raise ctx.fail(f"parameter line names op code {p[4]}, the block {ctx.block.code}")
        return b.apply(op, [xs[0]], dict(kernel_h=p[5], kernel_w=p[6], stride_h=p[7], stride_w=p[8],
                                         pad=p[9], act=p[10]))[0]

    return convert


def _unary(op: str) -> Converter:
    def convert(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
        _n_inputs(ctx, xs, 1)
        return _checked(ctx, b.apply(op, [xs[0]], {})[0])

    return convert


def _binary(op: str) -> Converter:
    def convert(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
        _n_inputs(ctx, xs, 2)
        return _checked(ctx, b.apply(op, list(xs[:2]), {})[0])

    return convert


def _dropout(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 1)
    return _checked(ctx, xs[0])


def _batchnorm(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 5)
    return _checked(ctx, b.batchnorm(xs[0], xs[1], xs[2], xs[3], xs[4]))


def _concat(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 1)
    (axis,) = _params(ctx, 1)
    return b.concat(axis, *xs)


def _reshape(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 1)
    return b.reshape(xs[0], ctx.block.params)


def _transpose(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 1)
    p, rank = ctx.block.params, len(xs[0].shape)
    if len(p) == rank + 1:
        perm = p[:rank]
    elif len(p) == rank + 2 and p[0] == rank:
        perm = p[1:rank + 1]
    else:
        raise ctx.fail(f"cannot read a permutation of rank {rank} from parameters {list(p)}")
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"{list(perm)} is not a permutation of 0..{rank - 1}")
    return b.transpose(xs[0], perm)


def _matmul(b: GraphBuilder, xs: Sequence[Tensor], ctx: _Context) -> Tensor:
    _n_inputs(ctx, xs, 2)
    act, rank = _params(ctx, 2)
    out = b.matmul(xs[0], xs[1], act=act)
    if len(out.shape) != rank:
        raise ctx.fail(f"output rank is {rank} in the file but {len(out.shape)} in the graph")
    return out


_CONVERTERS: Mapping[int, Converter] = MappingProxyType({
    3: _conv, 4: _dropout, 6: _pool("poolmax"), 7: _pool("poolavg"), 8: _unary("relu"), 9: _unary("sigmoid"),
    10: _unary("tanh"), 11: _batchnorm, 12: _concat, 14: _reshape, 15: _transpose, 16: _binary("ewadd"),
    17: _binary("ewmul"), 18: _matmul,
    # elementwise ops none of the five files use: assumed to write output dims like Add / Relu (checked)
    28: _binary("ewsub"), 29: _binary("ewdiv"), 33: _binary("ewmax"), 49: _unary("exp"), 51: _unary("log"),
    53: _unary("sqrt"),
})
_LEAVES: Mapping[int, str] = MappingProxyType({0: "input", 1: "weight"})
_DUMMY_WEIGHT_OPS = frozenset({6, 7})  # TASO pools read a weight they never use

SUPPORTED_TASO_OPS: tuple[str, ...] = tuple(TASO_OP_NAMES[c] for c in sorted({*_CONVERTERS, *_LEAVES}))


def _ints(text: str, where: str) -> tuple[int, ...]:
    text = text.strip()
    if not text:
        return ()
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise GraphFormatError(f"{where}: expected comma-separated integers, found {text!r}") from None


def _refs(text: str, where: str) -> tuple[tuple[int, int], ...]:
    text = text.strip()
    if not text:
        return ()
    refs = []
    for item in text.split(","):
        guid, sep, index = item.partition(":")
        try:
            refs.append((int(guid), int(index) if sep else 0))
        except ValueError:
            raise GraphFormatError(f"{where}: expected inputs as guid:index, found {item!r}") from None
    return tuple(refs)


def parse_blocks(text: str, source: str = "<model>") -> list[TasoBlock]:
    """The file's blocks in order; a trailing partial block or a repeated guid is an error."""
    lines = text.rstrip("\n").split("\n") if text.strip() else []
    if len(lines) % 4:
        raise GraphFormatError(f"{source}: {len(lines)} lines do not form four-line blocks "
                               "(guid, op type, inputs, parameters)")
    blocks: list[TasoBlock] = []
    seen: set[int] = set()
    for start in range(0, len(lines), 4):
        where = f"{source}:{start + 1}"
        guid_text, code_text, inputs_text, params_text = lines[start:start + 4]
        head = _ints(guid_text, where) + _ints(code_text, f"{source}:{start + 2}")
        if len(head) != 2:
            raise GraphFormatError(f"{where}: expected a guid line and an op type line")
        guid, code = head
        if guid in seen:
            raise GraphFormatError(f"{where}: guid {guid} appears twice")
        seen.add(guid)
        blocks.append(TasoBlock(guid, code, _refs(inputs_text, f"{source}:{start + 3}"),
                                _ints(params_text, f"{source}:{start + 4}"), start + 1))
    return blocks


def _order(blocks: Sequence[TasoBlock], source: str) -> list[TasoBlock]:
    by_guid = {b.guid: b for b in blocks}
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for b in blocks:
        if b.code in _LEAVES:
            sorter.add(b.guid)
            continue
        for guid, _ in b.inputs:
            if guid not in by_guid:
                raise GraphFormatError(f"{source}:{b.line}: guid {b.guid} reads guid {guid}, which the file never defines")
        sorter.add(b.guid, *(g for g, _ in b.inputs))
    try:
        return [by_guid[g] for g in sorter.static_order()]
    except graphlib.CycleError as exc:
        raise GraphFormatError(f"{source}: the graph has a cycle through guids {exc.args[1]}") from None


def load_taso_model(path: str | Path) -> Graph:
    """The graph of a TASO `.model` file; outputs are the ops nothing else reads, in file order."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GraphFormatError(f"{source}: cannot read TASO model: {exc}") from None
    except UnicodeDecodeError as exc:
        raise GraphFormatError(f"{source}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    blocks = parse_blocks(text, source)
    if not blocks:
        raise GraphFormatError(f"{source}: the file holds no ops")
    for b in blocks:
        if b.code not in _CONVERTERS and b.code not in _LEAVES:
            name = TASO_OP_NAMES.get(b.code, f"unknown op code {b.code}")
            raise UnknownOpError(f"{source}:{b.line}: TASO op {name} (guid {b.guid}) is not supported; "
                                 f"supported: {', '.join(SUPPORTED_TASO_OPS)}")

    builder = GraphBuilder()
    by_guid = {b.guid: b for b in blocks}
    built: dict[int, tuple[Tensor, ...]] = {}

    def value(guid: int, index: int, reader: TasoBlock) -> Tensor:
        if guid not in built:  # leaves are made on first use, so pools' dummy weights vanish
            leaf = by_guid[guid]
            kind = _LEAVES[leaf.code]
            built[guid] = (builder.apply(kind, [], {"name": f"{kind}{guid}", "shape": leaf.params})[0],)
        outs = built[guid]
        if not 0 <= index < len(outs):
            raise GraphFormatError(f"{source}:{reader.line}: guid {reader.guid} reads output {index} "
                                   f"of guid {guid}, which has {len(outs)}")
        return outs[index]

    consumed: set[int] = set()
    try:
        for b in _order(blocks, source):
            if b.code in _LEAVES:
                continue
            ctx = _Context(source, b)
            convert = _CONVERTERS[b.code]
            refs = b.inputs[:1] if b.code in _DUMMY_WEIGHT_OPS else b.inputs
            inputs = [value(g, i, b) for g, i in refs]
            consumed.update(g for g, _ in refs)
            try:
                built[b.guid] = (convert(builder, inputs, ctx),)
            except ShapeError as exc:
                raise ctx.fail(str(exc)) from None
    except ShapeError as exc:  # a leaf with bad dims
        raise GraphFormatError(f"{source}: {exc}") from None
    outputs = [built[b.guid][0] for b in blocks if b.code not in _LEAVES and b.guid not in consumed]
    if not outputs:
        raise GraphFormatError(f"{source}: no op is left unread, so the graph has no output")
    return builder.build(outputs)

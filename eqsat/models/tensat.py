"""Tensat's three benchmark models that TASO's `.model` files do not cover, built with `GraphBuilder`.

Sizes and structure follow Tensat's model definitions (uwplse/tensat `src/bert.rs`,
`src/resnext50.rs`, `src/nasneta.rs`, themselves from TASO's examples); the builders are ours.

- BERT: sequence 64, hidden 1024, 8 attention layers of 16 heads. As in Tensat, each layer's
  attention output is a graph output and the next layer reads a linear map of the layer's input;
  attention has no softmax (TASO has no softmax op).
- ResNeXt-50: 224x224 input, 7x7 stem and max pool, then 3 / 4 / 6 / 3 bottleneck blocks of width
  128 / 256 / 512 / 1024 whose 3x3 conv has 32 groups; a projection shortcut (1x1 conv with ReLU)
  where the stride or width changes.
- NasNet-A: 224x224 input, stem as ResNeXt's, then three stacks of five normal cells and one
  reduction cell (128, 256, 512 channels); a separable conv is a grouped conv (one group per output
  channel) followed by a 1x1 conv.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eqsat.errors import ShapeError
from eqsat.ir import Activation, Graph, GraphBuilder, Padding, Tensor

__all__ = ["bert", "nasneta", "resnext50"]


@dataclass
class _Weights:
    """Hands out uniquely named weights (`w0`, `w1`, ...) on one builder."""

    builder: GraphBuilder
    count: int = field(default=0)

    def __call__(self, shape: Sequence[int]) -> Tensor:
        self.count += 1
        return self.builder.weight(f"w{self.count - 1}", shape)


# --- BERT ------------------------------------------------------------------------------------------

def _attention(b: GraphBuilder, w: _Weights, x: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """One attention layer: (the next layer's input, this layer's attention output)."""
    seq, d_model = x.shape
    d_k = d_model // heads
    per_head = []
    for _ in range(3):
        projected = b.matmul(x, w((d_model, d_model)))
        per_head.append(b.transpose(b.reshape(projected, (seq, heads, d_k)), (1, 0, 2)))
    q, k, v = per_head
    out = b.matmul(b.matmul(q, k), v)
    out = b.reshape(b.transpose(out, (1, 0, 2)), (seq, d_model))
    return b.matmul(x, w((d_model, d_model))), out


def bert(seq: int = 64, hidden: int = 1024, layers: int = 8, heads: int = 16) -> Graph:
    """Tensat's BERT: `layers` attention layers; outputs every attention output and the last input."""
    if hidden % heads or hidden // heads != seq:
        raise ShapeError(f"Tensat's attention multiplies (heads, seq, d_k) by itself: needs hidden / heads "
                         f"== seq, got hidden {hidden}, heads {heads}, seq {seq}")
    b = GraphBuilder()
    w = _Weights(b)
    x = b.relu(b.input("x", (seq, hidden)))
    outputs = []
    for _ in range(layers):
        x, out = _attention(b, w, x, heads)
        outputs.append(out)
    return b.build([*outputs, x])


# --- ResNeXt-50 ------------------------------------------------------------------------------------

def _stem(b: GraphBuilder, w: _Weights, image: int) -> Tensor:
    x = b.input("x", (1, 3, image, image))
    x = b.conv2d(x, w((64, 3, 7, 7)), stride=(2, 2), pad=Padding.SAME, act=Activation.RELU)
    return b.poolmax(x, (3, 3), (2, 2), Padding.SAME)


def _resnext_block(b: GraphBuilder, w: _Weights, x: Tensor, stride: int, width: int, groups: int) -> Tensor:
    c_in = x.shape[1]
    t = b.conv2d(x, w((width, c_in, 1, 1)), act=Activation.RELU)
    t = b.conv2d(t, w((width, width // groups, 3, 3)), stride=(stride, stride), act=Activation.RELU)
    t = b.conv2d(t, w((2 * width, width, 1, 1)))
    shortcut = x
    if stride > 1 or c_in != 2 * width:
        shortcut = b.conv2d(x, w((2 * width, c_in, 1, 1)), stride=(stride, stride), act=Activation.RELU)
    return b.relu(shortcut + t)


def resnext50(image: int = 224, groups: int = 32, stages: Sequence[tuple[int, int]] = ((3, 128), (4, 256), (6, 512), (3, 1024))) -> Graph:
    """Tensat's ResNeXt-50 (32 groups); `image` and `stages` (blocks, width) shrink it for tests."""
    b = GraphBuilder()
    w = _Weights(b)
    x = _stem(b, w, image)
    for stage, (blocks, width) in enumerate(stages):
        for block in range(blocks):
            x = _resnext_block(b, w, x, 2 if stage > 0 and block == 0 else 1, width, groups)
    return b.build([x])


# --- NasNet-A --------------------------------------------------------------------------------------

def _squeeze(b: GraphBuilder, w: _Weights, x: Tensor, channels: int) -> Tensor:
    return b.conv2d(x, w((channels, x.shape[1], 1, 1)), act=Activation.RELU)


def _fit(b: GraphBuilder, w: _Weights, current: Tensor, x: Tensor) -> Tensor:
    """`x` brought to `current`'s channels (and, with a strided 3x3 conv, its size)."""
    if x.shape[2] == current.shape[2]:
        return _squeeze(b, w, x, current.shape[1])
    return b.conv2d(x, w((current.shape[1], x.shape[1], 3, 3)), stride=(2, 2), act=Activation.RELU)


def _separable(b: GraphBuilder, w: _Weights, x: Tensor, channels: int, kernel: int, stride: int) -> Tensor:
    """A grouped conv (one group per output channel), then a 1x1 conv."""
    t = b.conv2d(x, w((channels, x.shape[1] // channels, kernel, kernel)), stride=(stride, stride))
    return b.conv2d(t, w((channels, channels, 1, 1)))


def _normal_cell(b: GraphBuilder, w: _Weights, prev: Tensor, cur: Tensor, channels: int) -> Tensor:
    cur = _squeeze(b, w, cur, channels)
    prev = _fit(b, w, cur, prev)

    def sep(x: Tensor) -> Tensor:
        return _separable(b, w, x, channels, 3, 1)

    def avg(x: Tensor) -> Tensor:
        return b.poolavg(x, (3, 3), (1, 1))

    pairs = [(sep(cur), cur), (sep(prev), sep(cur)), (avg(cur), prev), (avg(prev), avg(prev)), (sep(prev), sep(prev))]
    return b.concat(1, *(p + q for p, q in pairs))


def _reduction_cell(b: GraphBuilder, w: _Weights, prev: Tensor, cur: Tensor, channels: int) -> Tensor:
    cur = _squeeze(b, w, cur, channels)
    prev = _fit(b, w, cur, prev)
    o0 = _separable(b, w, prev, channels, 7, 2) + _separable(b, w, cur, channels, 5, 2)
    o1 = b.poolmax(cur, (3, 3), (2, 2)) + _separable(b, w, prev, channels, 7, 2)
    o2 = b.poolavg(cur, (3, 3), (2, 2)) + _separable(b, w, prev, channels, 5, 2)
    o3 = b.poolmax(cur, (3, 3), (2, 2)) + _separable(b, w, o0, channels, 3, 1)
    o4 = b.poolavg(o0, (3, 3), (1, 1)) + o1
    return b.concat(1, o0, o1, o2, o3, o4)


def nasneta(image: int = 224, stacks: int = 3, normal_cells: int = 5, channels: int = 128) -> Graph:
    """Tensat's NasNet-A; `image`, `stacks`, `normal_cells` and `channels` shrink it for tests."""
    b = GraphBuilder()
    w = _Weights(b)
    x = _stem(b, w, image)
    for _ in range(stacks):
        prev = cur = x
        for _ in range(normal_cells):
            prev, cur = cur, _normal_cell(b, w, prev, cur, channels)
        channels *= 2
        x = _reduction_cell(b, w, prev, cur, channels)
    return b.build([x])

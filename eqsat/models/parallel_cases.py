"""The programs `eqsat parallel` plans: Unity's 2-layer MLP, a 16-layer MLP, a GPT block and a
12-block stack, a DLRM-like model, a small CNN and a mixture of experts, built with `GraphBuilder`
(float32, batch-major).

The GPT block: x is (B, T, d) (batch 8 by default, so a batch split over 8 devices, or over one
axis of 2x4 beside a model split over the other, is possible), built as JAX computes `jnp` code
and `jax_backend.capture` records it: `x @ w` as a 2-D product between reshapes ((B, T, d) ->
(B*T, d) -> (B, T, e)), q / k / v split into heads as reshape and transpose to (B, H, T, dh), the
attention products batched over the merged (B*H) dims (1/sqrt(dh) folded into wq, as the IR has no
constants), the causal mask an additive (T, T) input broadcast over batch and heads, softmax over
the keys written as JAX computes it (max, exp of the difference, sum, divide), heads merged back
to (B, T, d) for the output projection, and a 4x MLP with relu, each with its residual. Layer norm
is left out: it needs the constants 1/d and eps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from eqsat.ir import Graph, GraphBuilder, Tensor


def mlp(layers: int, batch: int, hidden: int) -> Graph:
    """`layers` square matmuls with relu between them."""
    b = GraphBuilder()
    h = b.input("x", (batch, hidden))
    for i in range(layers):
        h = b.matmul(h, b.weight(f"w{i}", (hidden, hidden)), act=2 if i < layers - 1 else 0)
    return b.build([h])


def unity_mlp(batch: int = 128, d_in: int = 784, hidden: int = 1024, d_out: int = 10) -> Graph:
    """Unity's 2-layer MLP (OSDI'22): y = relu(x W1) W2 at the sizes its communication figures
    imply: 813,056 = (784 + 10) * 1024 weights (what data parallelism's gradient all-reduce moves)
    and 131,072 = 128 * 1024 (one batch of hidden activations), so x is 128 x 784, W1 784 x 1024,
    W2 1024 x 10 (an MNIST-sized MLP, batch 128)."""
    b = GraphBuilder()
    x = b.input("x", (batch, d_in))
    h = b.matmul(x, b.weight("w1", (d_in, hidden)), act=2)
    return b.build([b.matmul(h, b.weight("w2", (hidden, d_out)))])


def mlp_bottleneck(batch: int = 2048, d: int = 256, hidden: int = 8192, narrow: int = 3) -> Graph:
    """`narrow` d x d layers, a wide pair d -> hidden -> d, `narrow` d x d layers, relu fused on all
    but the last: data parallelism suits the narrow layers (small weights, large batch), Megatron's
    column / row pair the wide ones, and the row split needs its relu unfused (an algebraic rewrite
    that changes the best sharding). Weights n*, w1, w2, m*."""
    b = GraphBuilder()
    h = b.input("x", (batch, d))
    shapes = [(f"n{i}", (d, d)) for i in range(narrow)] + [("w1", (d, hidden)), ("w2", (hidden, d))]
    shapes += [(f"m{i}", (d, d)) for i in range(narrow)]
    for k, (name, shape) in enumerate(shapes):
        h = b.matmul(h, b.weight(name, shape), act=2 if k < len(shapes) - 1 else 0)
    return b.build([h])


def softmax_last(b: GraphBuilder, s: Tensor) -> Tensor:
    """softmax over the last axis of a rank-3 tensor, written as JAX's jax.nn.softmax computes it:
    exp(s - max) / sum(exp(s - max)), the max and the sum broadcast back over the last axis."""
    shape = s.shape
    dims = tuple(range(len(shape) - 1))
    last = (len(shape) - 1,)
    m = b.apply("broadcast", [b.apply("reduce_max", [s], {"axes": last})[0]], {"shape": shape, "dims": dims})[0]
    e = b.apply("exp", [b.apply("ewsub", [s, m])[0]])[0]
    z = b.apply("broadcast", [b.apply("reduce_sum", [e], {"axes": last})[0]], {"shape": shape, "dims": dims})[0]
    return b.apply("ewdiv", [e, z])[0]


def _linear(b: GraphBuilder, x: Tensor, w: Tensor, act: int = 0) -> Tensor:
    """`x @ w` on a (B, T, d) value as JAX's dot_general is captured (`jax_backend.capture`): the
    rows flattened, a 2-D product, the rows unflattened."""
    *lead, d = x.shape
    rows = 1
    for n in lead:
        rows *= n
    y = b.matmul(b.reshape(x, (rows, d)), w, act=act)
    return b.reshape(y, (*lead, w.shape[-1]))


def _batched(b: GraphBuilder, x: Tensor, y: Tensor) -> Tensor:
    """`x @ y` on (B, H, ., .) values as JAX captures it: the batch dims merged into one (B*H), a
    batched 3-D product, the batch dims split again."""
    bsz, heads, m, k = x.shape
    out = b.matmul(b.reshape(x, (bsz * heads, m, k)), b.reshape(y, (bsz * heads, k, y.shape[-1])))
    return b.reshape(out, (bsz, heads, m, y.shape[-1]))


def gpt_block(b: GraphBuilder, x: Tensor, mask: Tensor, i: int, d: int, heads: int, seq: int) -> Tensor:
    """One block on x (B, T, d), written as `jnp` code is and captured as JAX computes it: q, k, v
    as `x @ w` split into heads ((B, T, H, dh) -> (B, H, T, dh)), the scores `q @ k^T` (1/sqrt(dh)
    folded into wq, as the IR has no constants) plus the (T, T) mask broadcast over batch and heads,
    softmax over the keys, `p @ v` merged back to (B, T, d), `@ wo`, and a 4x relu MLP, each with
    its residual."""
    bsz, dh = x.shape[0], d // heads

    def split_heads(z: Tensor) -> Tensor:
        return b.transpose(b.reshape(z, (bsz, seq, heads, dh)), (0, 2, 1, 3))

    q = split_heads(_linear(b, x, b.weight(f"b{i}.wq", (d, d))))
    k = split_heads(_linear(b, x, b.weight(f"b{i}.wk", (d, d))))
    v = split_heads(_linear(b, x, b.weight(f"b{i}.wv", (d, d))))
    scores = _batched(b, q, b.transpose(k, (0, 1, 3, 2)))  # (B, H, T, T)
    full = (bsz, heads, seq, seq)
    masked = b.ewadd(scores, b.apply("broadcast", [mask], {"shape": full, "dims": (2, 3)})[0])
    ctx = _batched(b, softmax_last(b, masked), v)  # (B, H, T, dh)
    merged = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (bsz, seq, d))
    h = b.ewadd(x, _linear(b, merged, b.weight(f"b{i}.wo", (d, d))))
    up = _linear(b, h, b.weight(f"b{i}.w1", (d, 4 * d)), act=2)
    return b.ewadd(h, _linear(b, up, b.weight(f"b{i}.w2", (4 * d, d))))


def gpt(blocks: int, d: int = 256, heads: int = 8, seq: int = 32, batch: int = 8) -> Graph:
    """`blocks` GPT blocks on x (batch, seq, d) with a causal (seq, seq) additive mask."""
    b = GraphBuilder()
    h = b.input("x", (batch, seq, d))
    mask = b.input("mask", (seq, seq))
    for i in range(blocks):
        h = gpt_block(b, h, mask, i, d, heads, seq)
    return b.build([h])


def _per_head_block(b: GraphBuilder, x: Tensor, mask: Tensor, i: int, d: int, heads: int, seq: int) -> Tensor:
    dh = d // heads
    xb = b.apply("broadcast", [x], {"shape": (heads, seq, d), "dims": (1, 2)})[0]
    q = b.matmul(xb, b.weight(f"b{i}.wq", (heads, d, dh)))  # 1/sqrt(dh) folded into wq (the IR has no constants)
    k = b.matmul(xb, b.weight(f"b{i}.wk", (heads, d, dh)))
    v = b.matmul(xb, b.weight(f"b{i}.wv", (heads, d, dh)))
    scores = b.matmul(q, b.transpose(k, (0, 2, 1)))  # (H, T, T)
    masked = b.ewadd(scores, b.apply("broadcast", [mask], {"shape": (heads, seq, seq), "dims": (1, 2)})[0])
    ctx = b.matmul(softmax_last(b, masked), v)  # (H, T, dh)
    proj = b.matmul(ctx, b.weight(f"b{i}.wo", (heads, dh, d)))  # (H, T, d)
    attn = b.apply("reduce_sum", [proj], {"axes": (0,)})[0]
    h = b.ewadd(x, attn)
    up = b.matmul(h, b.weight(f"b{i}.w1", (d, 4 * d)), act=2)
    return b.ewadd(h, b.matmul(up, b.weight(f"b{i}.w2", (4 * d, d))))


def gpt_per_head(blocks: int, d: int = 256, heads: int = 8, seq: int = 128) -> Graph:
    """The GPT cases as they were before the batch dim: x (T, d) broadcast over heads, per-head
    weights (H, d, dh) in head-batched products and the sum over heads, a form the head rules
    (`bcast-partition`, `heads-*`) split by head and the captured one (`gpt`) is not (no rule moves
    a head split through the reshape into heads). The deep benches (`experiments/parallel_deep.py`)
    plan it, so the 13B pricing keeps Megatron's attention within its memory budget."""
    b = GraphBuilder()
    h = b.input("x", (seq, d))
    mask = b.input("mask", (seq, seq))
    for i in range(blocks):
        h = _per_head_block(b, h, mask, i, d, heads, seq)
    return b.build([h])


def dlrm(tables: int = 8, batch: int = 128, rows: int = 1000, dim: int = 64) -> Graph:
    """8 embedding lookups as one-hot x table products, concatenated, then a 3-layer MLP."""
    b = GraphBuilder()
    feats = [b.matmul(b.input(f"onehot{i}", (batch, rows)), b.weight(f"emb{i}", (rows, dim))) for i in range(tables)]
    h = b.concat(1, *feats)
    h = b.matmul(h, b.weight("top0", (tables * dim, 512)), act=2)
    h = b.matmul(h, b.weight("top1", (512, 256)), act=2)
    return b.build([b.matmul(h, b.weight("top2", (256, 64)))])


def cnn(batch: int = 16, channels: int = 8, size: int = 16, classes: int = 16) -> Graph:
    """A small all-convolutional net: three 3x3 convs with relu (the last two with stride 2) and a
    dense head over the flattened features, written as a VALID conv whose kernel covers the whole
    feature map (the same product as a matmul of the flattened map; the IR's reshape does not move
    through partitions, so a flatten would pin the plan)."""
    b = GraphBuilder()
    h = b.input("x", (batch, channels, size, size))
    for i, (out, stride) in enumerate(((32, 1), (64, 2), (64, 2))):
        h = b.conv2d(h, b.weight(f"c{i}", (out, h.shape[1], 3, 3)), stride=(stride, stride), act=2)
    head = b.weight("head", (classes, h.shape[1], h.shape[2], h.shape[3]))
    return b.build([b.conv2d(h, head, pad=1)])


def moe(tokens: int = 128, d: int = 64, hidden: int = 256, experts: int = 8, capacity: int = 16) -> Graph:
    """A mixture-of-experts layer, 8 experts, top-1 (Switch-style), with a residual. Routing is an
    input: `dispatch` (E, C, T) is the one-hot map of token t to slot c of its expert e, which top-1
    selection (an argmax, a running count per expert, a one-hot) computes and the op set cannot (no
    argmax / cumsum / one-hot op; routing has no gradient anyway). Everything else is in the graph:
    the router's softmax over experts, the gathering of each expert's tokens (dispatch x tokens), the
    experts as one batched two-layer MLP over the experts dim (weights (E, d, f), (E, f, d)), and the
    scatter back weighted by the router's probability (dispatch transposed, times the probabilities)."""
    b = GraphBuilder()
    x = b.input("x", (tokens, d))
    dispatch = b.input("dispatch", (experts, capacity, tokens))
    probs = softmax_last(b, b.matmul(x, b.weight("router", (d, experts))))  # (T, E)
    per_expert = b.apply("broadcast", [b.transpose(probs, (1, 0))], {"shape": (experts, tokens, capacity), "dims": (0, 1)})[0]
    gather_back = b.ewmul(b.transpose(dispatch, (0, 2, 1)), per_expert)  # (E, T, C)
    xb = b.apply("broadcast", [x], {"shape": (experts, tokens, d), "dims": (1, 2)})[0]
    routed = b.matmul(dispatch, xb)  # (E, C, d): each expert's tokens
    h = b.matmul(routed, b.weight("w1", (experts, d, hidden)), act=2)
    out = b.matmul(h, b.weight("w2", (experts, hidden, d)))  # (E, C, d)
    back = b.apply("reduce_sum", [b.matmul(gather_back, out)], {"axes": (0,)})[0]  # (T, d)
    return b.build([b.ewadd(x, back)])


PARALLEL_MODELS: Mapping[str, Callable[[], Graph]] = MappingProxyType({
    "unity-mlp": unity_mlp,
    "mlp16": lambda: mlp(16, 256, 1024),
    "gpt-block": lambda: gpt(1),
    "gpt12": lambda: gpt(12),
    "dlrm": dlrm,
    "mlp-bottleneck": mlp_bottleneck,
    "cnn": cnn,
    "moe": moe,
})

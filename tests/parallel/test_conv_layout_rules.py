"""A batch split through a Flax CNN as captured (issue 26): NHWC convs become NCHW `conv2d`s between
transposes, biases are added through a broadcast, pooling and the spatial mean sit between the convs.

`nchw-batch-transpose` / `nhwc-batch-transpose` (and `-kept`, behind one device axis of another mesh
axis) move a batch split through the layout transposes with the permutation shifted by the device
axis; `batch-bias-bcast4` (and the `-kept` scalar broadcasts) split the broadcasts feeding the bias adds
and the scalar ops; `batch-pool*` pool each device's piece (pooling now runs on values with leading device
axes, as conv2d does); `batch-spatial-sum` and `partition-ewdiv2` carry the split through the mean
into the dense head (`-kept`: the same behind a device axis of another mesh axis). Each instance is proved for every shape the guard admits; wrong variants are
refuted, and every instance is accepted by the verifier the planner trusts (`verify_rules`).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from eqsat import ops
from eqsat.parallel.rules import _items, instantiate
from eqsat.rewrites.concrete import REFUTED, VerifyOptions, verify_concrete
from eqsat.rewrites.parser import parse_rule_text
from eqsat.rewrites.verify import verify_rules
from eqsat.rulesets import is_trusted
from jax_backend.lower import lower_node

from .rule_proofs import assert_proved_for_all_shapes, assert_refuted

CNN_RULES = ("nchw-batch-transpose", "nhwc-batch-transpose", "nchw-batch-transpose-kept", "nhwc-batch-transpose-kept",
             "batch-bias-bcast4", "partition-relu4", "batch-poolavg2",
             "batch-poolmax2", "batch-poolavg3", "batch-poolmax3", "batch-spatial-sum", "partition-ewdiv2",
             "batch-bias-bcast4-kept", "batch-scalar-bcast4-kept", "batch-scalar-bcast2-kept", "batch-spatial-sum-kept")
POOL_INSTANCES = 4  # each pool line: strides 1, 2 x paddings SAME, VALID


@pytest.mark.parametrize("parts", [2, 4])
def test_every_cnn_rule_instance_is_proved_for_all_shapes(parts: int) -> None:
    rules = instantiate(0, parts, names=CNN_RULES)
    assert len(rules) == len(CNN_RULES) + 4 * (POOL_INSTANCES - 1)
    assert_proved_for_all_shapes(rules)
    for rule, result in zip(rules, verify_rules(rules), strict=True):  # what the planner's trust policy reads
        assert is_trusted(result), (rule.name, result.status, result.guarded_status)


@pytest.mark.parametrize("text", [
    # the NHWC -> NCHW transpose with the permutation shifted wrongly (H and W swapped)
    "(partition -4 0 2 (transpose [0 3 1 2] ?x)) => (transpose [0 1 4 3 2] (partition -4 0 2 ?x))",
    # the NCHW -> NHWC transpose with the input's permutation, not the inverse one's, shifted
    "(partition -4 0 2 (transpose [0 2 3 1] ?x)) => (transpose [0 1 4 2 3] (partition -4 0 2 ?x))",
    # the spatial mean summed over the wrong axes (W and C) of the stacked value
    "(partition -2 0 2 (reduce_sum [1 2] ?x)) => (reduce_sum [3 4] (partition -4 0 2 ?x)) if (= (rank ?x) 4)",
    # max pooling turned into average pooling
    "(partition -4 0 2 (poolmax ?x 2 2 2 2 0 0)) => (poolavg (partition -4 0 2 ?x) 2 2 2 2 0 0)",
    # the bias split as if it had the batch
    "(partition -4 0 2 (broadcast ?S [3] ?b)) => (broadcast (items 5 (partition -4 0 2 (broadcast ?S [3] ?b)))"
    " [0 4] (partition -1 0 2 ?b)) if (= (rank ?S) 4)",
])
def test_wrong_cnn_rules_are_refuted(text: str) -> None:
    rule = parse_rule_text(_items(text))[0]
    assert_refuted(rule)


@pytest.mark.parametrize("op", ["poolavg", "poolmax"])
def test_pooling_a_device_stack_pools_each_piece(op: str) -> None:
    """Pooling with leading device axes (a stacked value) pools each device's piece, in numpy and JAX."""
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6, 6)).astype(np.float32)
    attrs = {"kernel_h": 2, "kernel_w": 2, "stride_h": 2, "stride_w": 2, "pad": 0, "act": 0}
    want = np.stack([ops.evaluate(op, [xi], attrs)[0] for xi in x])
    assert ops.infer_shapes(op, [x.shape], attrs) == (want.shape,) == ((2, 3, 4, 3, 3),)
    np.testing.assert_allclose(ops.evaluate(op, [x], attrs)[0], want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lower_node(op, [jax.numpy.asarray(x)], attrs)[0]), want, rtol=1e-5, atol=1e-6)
    assert ops.op_spec(op).on_devices is not None


def test_pool_rules_hold_on_sampled_stacks() -> None:
    """The concrete verifier (exact semantics on stacked values) finds no counterexample either."""
    for rule in instantiate(0, 2, names=("batch-poolavg2", "batch-poolmax3")):
        got = verify_concrete(rule, VerifyOptions(samples=8))
        assert REFUTED not in {got.status, got.guarded_status}, rule.name

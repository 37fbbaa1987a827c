"""A synchronized step is the same bits every run, whatever order the towers' ops finish in.

An AddN of three or more adds into the first input whose buffer no other op still holds, so the
order of its sum follows the scheduler whenever another op reads its inputs too: one ulp between
two runs of the same step (the cause of test_recompute's one flaky failure, there in the test's own
sum of the towers' gradients). graphsync's cross-tower sums (the statistics' gather, the gradients'
gathered sums, a parameter server's local sums) add in tower order instead
(fast_ops.FastOps.sum_in_order, views.gathered_sum).

The test makes the scheduler's choice itself: fetching the first tower's contribution to each of
graphsync's sums with the step keeps its buffer, which turns an AddN's order around. The step's
variables must be the same bits with those fetches and without, and equal one device.
"""
import numpy as np
import pytest
import tensorflow as tf

import graphsync
import models
import towerlib as tl
from graphsync.graph import marks

tf1 = tf.compat.v1
INPUT_SHAPE = (6, 6, 3)
SIZES = [2, 3, 3, 2]


def _sums(graph) -> list:
    """graphsync's sums over three or more towers."""
    return [op for op in graph.get_operations() if marks.made_by_graphsync(op) and op.type in ("AddN", "AddV2")
            and (op.type == "AddV2" or len(op.inputs) >= 3)]


def _variables(built, x, t, held) -> list:
    splits = np.cumsum(SIZES)[:-1]
    feed = dict(zip(built.inputs, np.split(x, splits)))
    feed.update(zip(built.targets, np.split(t, splits)))
    with tf1.Session(graph=built.graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(3):
            sess.run([built.train_op] + held, feed)
        return sess.run(built.variables + built.moving)


@pytest.mark.parametrize("gradients", ["after", "before"])
def test_a_step_is_the_same_bits_whatever_holds_the_towers_contributions(gradients):
    model = models.layers_bn(depth=2)
    x, t = tl.data(SIZES, INPUT_SHAPE, (5,))
    built = tl.build(model, SIZES, gradients=gradients, rewrite=graphsync.rewrite_towers)
    sums = _sums(built.graph)
    assert sums and not [op.name for op in sums if op.type == "AddN"], "graphsync sums 3+ towers with an AddN"
    held = [op.inputs[0] for op in sums]   # an AddN then starts from another tower's buffer
    plain, holding = _variables(built, x, t, []), _variables(built, x, t, held)
    for a, b in zip(plain, holding):
        np.testing.assert_array_equal(a, b)

    reference = tl.reference_step(model, SIZES, x, t)
    one = tl.run_step(built, x, t, SIZES)
    noise = max(tl.max_rel_error(tl.reordered_reference_step(model, SIZES, x, t)[k], reference[k]) for k in reference)
    tolerance = tl.tolerance(tf.float32, noise, sum(SIZES) * INPUT_SHAPE[0] * INPUT_SHAPE[1])
    assert max(tl.max_rel_error(one[k], reference[k]) for k in reference) <= tolerance

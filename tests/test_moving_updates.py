"""Moving averages that several towers update in the same step (UPDATE_OPS gathered without a
scope): one warning naming the layer; the step itself is left as the user built it, and the
warning's claim holds numerically — after one step each moving mean has moved k times one device's
step (1 − ρ)·(μ − m₀) towards the global batch mean μ of the concatenated batch, with k between
(1 − ρ^T)/(1 − ρ) (T updates one after the other) and T (updates that read m₀ concurrently)."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import graphsync
import towerlib as tl

tf1 = tf.compat.v1
MOMENTUM = 0.9


def _towers(batch_sizes, scoped):
    graph = tf.Graph()
    with graph.as_default():
        inputs, losses = [], []
        for i in range(len(batch_sizes)):
            with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                    tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
                x = tf1.placeholder(tf.float32, (None, 4, 4, 3), name="x")
                h = tf1.layers.conv2d(x, 4, 3, padding="same", name="conv")
                h = tf1.layers.batch_normalization(h, training=True, momentum=MOMENTUM, fused=True, name="bn")
                inputs.append(x)
                losses.append(tf.reduce_sum(tf.square(h)))
        variables = tf1.trainable_variables()
        grads = [tf.add_n(list(g)) for g in zip(*[tf.gradients(l, variables) for l in losses])]
        updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, scope="tower_0" if scoped else None)
        with tf.control_dependencies(updates):
            train = tf1.train.GradientDescentOptimizer(0.0).apply_gradients(zip(grads, variables))
        moving = [v for v in tf1.global_variables() if "moving_mean" in v.name][0]
    return graph, inputs, train, moving


@pytest.mark.parametrize("batch_sizes", [[3, 5], [2, 3, 4]])
def test_every_towers_update_in_one_step_is_said_and_moves_t_times(batch_sizes):
    graph, inputs, train, moving = _towers(batch_sizes, scoped=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = graphsync.rewrite_towers(graph)
    said = [str(w.message) for w in caught if issubclass(w.category, graphsync.GraphsyncWarning)]
    t = len(batch_sizes)
    assert said == [f"the moving averages of layer '{report.layers[0].name}' are updated by {t} towers in the same step, each with the "
                    f"same synchronized statistics: they move up to {t}× as far per step as on one device; run one tower's update "
                    "ops (tf.compat.v1.get_collection(UPDATE_OPS, scope=<first tower>))"], said

    x = np.random.RandomState(0).randn(sum(batch_sizes), 4, 4, 3).astype(np.float32) * 2 + 1
    feed = dict(zip(inputs, np.split(x, np.cumsum(batch_sizes)[:-1])))
    with graph.as_default():
        conv = [op for op in graph.get_operations() if op.type == "Conv2D" and op.name.startswith("tower_0/")][0]
        kernel_read = conv.inputs[1]
        bias = [v for v in tf1.trainable_variables() if "conv/bias" in v.name][0]
    with tf1.Session(graph=graph, config=tl.CONFIG) as sess:
        sess.run(tf1.global_variables_initializer())
        kernel, b = sess.run([kernel_read, bias])
        before = sess.run(moving)
        sess.run(train, feed)
        after = sess.run(moving)
    h = tf.nn.conv2d(x, kernel, 1, "SAME").numpy() if tf.executing_eagerly() else None
    if h is None:
        with tf.Graph().as_default(), tf1.Session() as s:
            h = s.run(tf.nn.conv2d(x, kernel, 1, "SAME"))
    mean = (h.astype(np.float64) + b).mean(axis=(0, 1, 2))
    k = (after - before) / ((1 - MOMENTUM) * (mean - before))
    assert np.all(k > (1 - MOMENTUM ** t) / (1 - MOMENTUM) - 1e-3) and np.all(k < t + 1e-3), k


def test_one_towers_updates_are_not_said():
    graph, *_ = _towers([3, 5], scoped=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphsync.rewrite_towers(graph)
    assert not [w for w in caught if "moving averages" in str(w.message)]

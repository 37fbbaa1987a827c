"""The model of the unchanged training scripts in this directory (they import it the way a
training script imports its own model module, from sys.path[0]).

The CIFAR10 multi-GPU pattern: one name scope per tower, shared variables, each tower's gradients
from its own loss, summed, and only tower 0's batch-norm updates run with the train op. The
towers may be uneven; each tower's loss is its examples' share of the whole batch's mean loss, so
the summed gradients are those of one device on the concatenated batch.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

CONFIG = tf1.ConfigProto(device_count={"CPU": 4}, inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
IMAGE = (8, 8, 3)
CLASSES = 5


def data(total, seed=0):
    """Images whose mean drifts along the batch (so each tower's statistics differ), and labels."""
    rng = np.random.RandomState(seed)
    images = rng.randn(total, *IMAGE).astype(np.float32) + np.linspace(-2, 2, total, dtype=np.float32)[:, None, None, None]
    return images, rng.randint(0, CLASSES, total).astype(np.int32)


def tower_loss(images, labels, total):
    """conv → fused batch norm → relu → conv → moments batch norm → relu → dense."""
    h = tf1.layers.conv2d(images, 4, 3, padding="same", use_bias=False, name="conv1",
                          kernel_initializer=tf1.glorot_uniform_initializer(seed=1))
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, name="bn1"))
    h = tf1.layers.conv2d(h, 6, 3, padding="same", use_bias=False, name="conv2",
                          kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, fused=False, name="bn2",
                                                  gamma_initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=3)))
    logits = tf1.layers.dense(tf.reduce_mean(h, [1, 2]), CLASSES, name="logits",
                              kernel_initializer=tf1.glorot_uniform_initializer(seed=4))
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(per_example) / total


def build(sizes, learning_rate=0.5, after_tower=None):
    """Towers of the given batch sizes in the default graph: (train_op, {placeholder: value}).
    after_tower(i, loss, feed), when given, is called once tower i is built (feed: its inputs)."""
    images, labels = data(sum(sizes))
    optimizer = tf1.train.GradientDescentOptimizer(learning_rate)
    tower_grads, feed, start = [], {}, 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"tower_{i}"), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=i > 0):
            x = tf1.placeholder(tf.float32, (None,) + IMAGE, name="images")
            y = tf1.placeholder(tf.int32, [None], name="labels")
            feed[x], feed[y] = images[start:start + size], labels[start:start + size]
            start += size
            loss = tower_loss(x, y, sum(sizes))
            tower_grads.append(optimizer.compute_gradients(loss))
        if after_tower is not None:
            after_tower(i, loss, {x: feed[x], y: feed[y]})
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "tower_0")):
        train_op = optimizer.apply_gradients(summed, global_step=tf1.train.get_or_create_global_step())
    return train_op, feed


def model_variables():
    """Every variable but the global step, by name."""
    return {v.op.name: v for v in tf1.global_variables() if "global_step" not in v.op.name}


def one_device_variables(total=8):
    """Every model variable after one step on one device with the concatenated batch: the
    reference the scripts built on this model are compared with."""
    with tf.Graph().as_default():
        train_op, feed = build([total])
        variables = model_variables()
        with tf1.Session(config=CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, feed)
            return sess.run(variables)

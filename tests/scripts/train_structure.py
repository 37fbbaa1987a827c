"""Unchanged training scripts whose scopes are not graphsync's known tower names (tests/test_tower_structure.py
runs them under `graphsync run`):

    python train_structure.py OUT gpu       # the CIFAR10 multi-GPU pattern with towers gpu_0/, gpu_1/ (3 + 5 examples)
    python train_structure.py OUT blocks    # one device: block_0 … block_3, identical, each feeding the next
    python train_structure.py OUT siamese   # one network on two inputs in scopes left/ and right/

One training step, then every variable saved to OUT (.npz).
"""
import sys

import numpy as np

from tower_model import CONFIG, data, model_variables, tf, tf1, tower_loss


def gpu_towers(sizes=(3, 5)):
    images, labels = data(sum(sizes))
    optimizer = tf1.train.GradientDescentOptimizer(0.5)
    tower_grads, feed, start = [], {}, 0
    for i, size in enumerate(sizes):
        with tf.device(f"/cpu:{i}"), tf1.name_scope(f"gpu_{i}"), tf1.variable_scope(tf1.get_variable_scope(), reuse=i > 0):
            x = tf1.placeholder(tf.float32, (None, 8, 8, 3), name="images")
            y = tf1.placeholder(tf.int32, [None], name="labels")
            feed[x], feed[y] = images[start:start + size], labels[start:start + size]
            start += size
            tower_grads.append(optimizer.compute_gradients(tower_loss(x, y, sum(sizes))))
    summed = [(tf.add_n([g for g, _ in gv]), gv[0][1]) for gv in zip(*tower_grads)]
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS, "gpu_0")):
        return optimizer.apply_gradients(summed, global_step=tf1.train.get_or_create_global_step()), feed


def blocks():
    images, _ = data(6)
    h = tf1.placeholder(tf.float32, (None, 8, 8, 3), name="images")
    feed = {h: images}
    for i in range(4):
        with tf1.variable_scope(f"block_{i}"):
            h = tf1.layers.conv2d(h, 3, 3, padding="same", use_bias=False, name="conv")
            h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True, name="bn"))
    loss = tf.reduce_mean(tf.square(h))
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
        return tf1.train.GradientDescentOptimizer(0.1).minimize(loss), feed


def siamese():
    images, _ = data(8)
    outputs, feed = [], {}
    for side, part in (("left", images[:4]), ("right", images[4:])):
        with tf1.name_scope(side), tf1.variable_scope("net", reuse=tf1.AUTO_REUSE):
            x = tf1.placeholder(tf.float32, (None, 8, 8, 3), name="images")
            feed[x] = part
            h = tf1.layers.conv2d(x, 3, 3, padding="same", use_bias=False, name="conv")
            outputs.append(tf.reduce_mean(tf1.layers.batch_normalization(h, training=True, name="bn"), [1, 2, 3]))
    loss = tf.reduce_mean(tf.square(outputs[0] - outputs[1]))
    return tf1.train.GradientDescentOptimizer(0.1).minimize(loss), feed


def main():
    out, kind = sys.argv[1], sys.argv[2]
    with tf.Graph().as_default():
        train_op, feed = {"gpu": gpu_towers, "blocks": blocks, "siamese": siamese}[kind]()
        variables = model_variables()
        with tf1.Session(config=CONFIG) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(train_op, feed)
            np.savez(out, **sess.run(variables))
    print(f"trained {kind}")


if __name__ == "__main__":
    main()
